"""How fast the simulator runs: wall time, scheduler steps/s and simulated seconds per wall second.

Three scenarios (see README.md in this folder):
  (a) replay of the `pressure` scheduler-conformance scenario, against vLLM's own scheduler;
  (b) Llama-3.1-8B on one A100-80GB, 1,000 random requests (configs/llama8b_a100.yaml), against
      Vidur on the same scenario;
  (c) 10,000 requests of the Mooncake trace on four H100 replicas
      (configs/mooncake_10k_h100_dp4.yaml), no reference.

Each scenario is timed twice: as a whole process (the `dse` command in a fresh subprocess,
interpreter start and imports included) and in this process (the replay or `simulate()` call
alone, its inputs already loaded). Figures are printed, never asserted: timings depend on the
machine. Usage: python benchmarks/engine_speed.py [--repeats N] [--only abc] [--vllm-env DIR]
(DIR: an environment built by scripts/vllm_conformance/setup.sh, to time vLLM's own scheduler on
(a) with the recorder beside it).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PRESSURE_SCENARIO = ROOT / "simcore/data/conformance/scenarios/pressure.json.gz"
QUICKSTART_CONFIG = HERE / "configs/llama8b_a100.yaml"
MOONCAKE_CONFIG = HERE / "configs/mooncake_10k_h100_dp4.yaml"
VLLM_RECORDER = ROOT / "simcore/engine/vllm_recorder.py"

# Fixed reference figures, quoted for this machine class (2 CPU cores), not measured here.
VLLM_REPLAY_REF_S = 3.0
"""vLLM 0.33's own V1 scheduler replaying `pressure` (imports excluded), seconds."""
VIDUR_WHOLE_REF_S = 8.0
"""Vidur simulating scenario (b) as a whole process, seconds."""
VIDUR_SIM_REF_S = 1.0
"""Vidur's simulation loop alone on scenario (b), seconds."""

# Targets, printed beside the figures (met or not), never asserted.
REPLAY_WHOLE_TARGET_S = VLLM_REPLAY_REF_S / 3
"""(a) as a whole process: under a third of vLLM's replay."""
SIMULATE_WHOLE_TARGET_S = 1.5
"""(b) as a whole process (`dse simulate`)."""
SIMULATE_TARGET_S = VIDUR_SIM_REF_S / 3
"""(b) simulating alone: at least 3x faster than Vidur's simulation loop."""

VLLM_TIMER = """
import sys, time
sys.path.insert(0, sys.argv[1])
import vllm_recorder as record
record.load_vllm()
t = time.perf_counter()
record.main(sys.argv[2], sys.argv[3])
print(time.perf_counter() - t)
"""


def dse_command() -> list[str]:
    """The `dse` console script of this interpreter's environment, else `python -m dse.cli`."""
    script = Path(sys.executable).parent / "dse"
    if script.exists():
        return [str(script)]
    found = shutil.which("dse")
    return [found] if found else [sys.executable, "-m", "dse.cli"]


def time_process(cmd: list[str], repeats: int) -> list[float]:
    """Wall seconds of `cmd` run `repeats` times, each in a fresh process."""
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
        times.append(time.perf_counter() - t)
    return times


def fmt_times(times: list[float]) -> str:
    if len(times) == 1:
        return f"{times[0]:7.3f} s"
    return f"{min(times):7.3f} s  (median {statistics.median(times):.3f} s)"


def ratio(ours: float, ref: float) -> str:
    return f"{ours / ref:.2f}x its time ({ref / ours:.1f}x faster)"


def target(value: float, limit: float) -> str:
    return f"target < {limit:.3g} s: {'met' if value < limit else 'NOT met'}"


def row(label: str, value: str, note: str = "") -> None:
    print(f"  {label:<34}{value:<34}{note}")


def measure_import(repeats: int) -> None:
    times = time_process([sys.executable, "-c", "import dse.cli, simcore.simulate"], repeats)
    bare = time_process([sys.executable, "-c", "pass"], repeats)
    print(f"interpreter start: {min(bare):.3f} s; + import dse.cli, simcore.simulate: "
          f"{min(times):.3f} s (whole process, best of {repeats})")


def measure_vllm(tmp: Path, env_dir: Path) -> tuple[float, float] | None:
    """(whole process s, replay-only s) of vLLM's scheduler on `pressure`, recorded by
    simcore/engine/vllm_recorder.py in the environment `env_dir` (setup.sh's DIR)."""
    python = env_dir / "venv/bin/python"
    if not python.exists():
        print(f"  --vllm-env {env_dir}: no venv/bin/python there (build it with "
              f"scripts/vllm_conformance/setup.sh); vLLM not measured")
        return None
    env = dict(os.environ, PYTHONPATH=str(env_dir / "src"))
    cmd = [str(python), "-c", VLLM_TIMER, str(VLLM_RECORDER.parent), str(PRESSURE_SCENARIO),
           str(tmp / "vllm_pressure.jsonl")]
    t = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    whole = time.perf_counter() - t
    if done.returncode != 0:
        print(f"  vLLM's recorder failed (exit {done.returncode}); vLLM not measured")
        return None
    return whole, float(done.stdout.strip().splitlines()[-1])


def bench_replay(tmp: Path, repeats: int, vllm_env: Path | None) -> None:
    from simcore.engine.conformance import load_scenario, replay

    print("\n(a) conformance replay of `pressure` (simcore/data/conformance/scenarios)")
    whole = time_process(dse_command() + ["conformance", str(PRESSURE_SCENARIO), "--out",
                                          str(tmp / "pressure.jsonl")], repeats)
    scenario = load_scenario(PRESSURE_SCENARIO)
    inner = []
    for _ in range(repeats):
        t = time.perf_counter()
        num_steps = sum(1 for _ in replay(scenario))
        inner.append(time.perf_counter() - t)
    best = min(inner)
    row("requests / steps", f"{len(scenario['requests'])} / {num_steps}")
    row("whole process (dse conformance)", fmt_times(whole),
        f"vs vLLM's {VLLM_REPLAY_REF_S:.1f} s: {ratio(min(whole), VLLM_REPLAY_REF_S)}; "
        f"{target(min(whole), REPLAY_WHOLE_TARGET_S)}")
    row("replay only (in process)", fmt_times(inner),
        f"vs vLLM's {VLLM_REPLAY_REF_S:.1f} s: {ratio(best, VLLM_REPLAY_REF_S)}")
    row("scheduler steps per second", f"{num_steps / best:10,.0f}")
    row("simulated s per wall s", "n/a (a step replay has no clock)")
    vllm = measure_vllm(tmp, vllm_env) if vllm_env is not None else None
    if vllm is not None:
        v_whole, v_replay = vllm
        row("vLLM measured now: whole process", f"{v_whole:7.3f} s",
            f"ours: {ratio(min(whole), v_whole)}")
        row("vLLM measured now: replay only", f"{v_replay:7.3f} s",
            f"ours: {ratio(best, v_replay)}")
    elif vllm_env is None:
        row("vLLM measured now", "skipped (--vllm-env DIR: a setup.sh environment)")


def bench_simulate(title: str, config: Path, tmp: Path, repeats: int, vidur: bool) -> None:
    from simcore.config import load_config
    from simcore.simulate import simulate

    print(f"\n{title} ({config.relative_to(ROOT)})")
    whole = time_process(dse_command() + ["simulate", str(config), "--quiet", "--out",
                                          str(tmp / f"{config.stem}.json")], repeats)
    cfg = load_config(config)
    inner = []
    for _ in range(repeats):
        t = time.perf_counter()
        result = simulate(cfg)
        inner.append(time.perf_counter() - t)
    best = min(inner)
    steps = result["num_steps"]
    whole_note = sim_note = ""
    if vidur:
        whole_note = (f"vs Vidur's {VIDUR_WHOLE_REF_S:.0f} s: "
                      f"{ratio(min(whole), VIDUR_WHOLE_REF_S)}; "
                      f"{target(min(whole), SIMULATE_WHOLE_TARGET_S)}")
        sim_note = (f"vs Vidur's {VIDUR_SIM_REF_S:.0f} s: {ratio(best, VIDUR_SIM_REF_S)}; "
                    f"{target(best, SIMULATE_TARGET_S)}")
    row("requests / replicas / steps",
        f"{result['completed']} / {len(result['replicas'])} / {steps}")
    row("whole process (dse simulate)", fmt_times(whole), whole_note)
    row("simulate() only (in process)", fmt_times(inner), sim_note)
    row("scheduler steps per second", f"{steps / best:10,.0f}")
    row("simulated s per wall s", f"{result['duration'] / best:10,.1f}",
        f"({result['duration']:.1f} simulated s)")
    row("load: gpu busy / mean, p99 TTFT",
        f"{result['gpu_busy_fraction']:.2f} / {result['mean_ttft_ms']:.0f}, "
        f"{result['p99_ttft_ms']:.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3,
                        help="Runs per figure for (a) and (b); the best is reported (default 3).")
    parser.add_argument("--mooncake-repeats", type=int, default=1,
                        help="Runs per figure for (c) (default 1).")
    parser.add_argument("--only", default="abc", help="Scenarios to run, e.g. 'ab' (default abc).")
    parser.add_argument("--vllm-env", type=Path, default=None,
                        help="A vLLM environment built by scripts/vllm_conformance/setup.sh: "
                             "also time vLLM's own scheduler recording (a).")
    args = parser.parse_args()
    print(f"engine speed: Python {platform.python_version()}, {os.cpu_count()} CPUs, "
          f"{platform.machine()}; best of {args.repeats} runs for (a) and (b), "
          f"{args.mooncake_repeats} for (c)")
    print(f"references are fixed figures quoted for this machine class (2 cores), not measured "
          f"here: vLLM's scheduler replay {VLLM_REPLAY_REF_S:.1f} s (imports excluded); Vidur "
          f"{VIDUR_WHOLE_REF_S:.0f} s whole process, {VIDUR_SIM_REF_S:.0f} s simulating")
    started = time.perf_counter()
    measure_import(args.repeats)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if "a" in args.only:
            bench_replay(tmp, args.repeats, args.vllm_env)
        if "b" in args.only:
            bench_simulate("(b) Llama-3.1-8B on one A100-80GB, 1,000 requests", QUICKSTART_CONFIG,
                           tmp, args.repeats, vidur=True)
        if "c" in args.only:
            bench_simulate("(c) Mooncake trace, 10,000 requests on 4 x H100-SXM", MOONCAKE_CONFIG,
                           tmp, args.mooncake_repeats, vidur=False)
    print(f"\nbenchmark wall time {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
