"""Scale and speed at the sizes deployments are planned at: one row per figure, each beside its
target and the figure before the change, measured in the same run where the old code path still
exists.

Rows:
  (1) the whole Mooncake conversation trace (12,031 requests, 59 minutes) on eight Llama-3.1-8B
      replicas on H100 (configs/mooncake_full_h100_dp8.yaml), with the default compute model
      (the H100 kernel profile) and with the roofline: simulated seconds per CPU second, with
      quiet steps taken together and the engine's compiled kernels (as shipped) and, as the
      references, without the compiled kernels and stepped one at a time; the three results
      are compared byte for byte;
  (2) N requests (default 1,000,000) on one Llama-3.1-8B engine (configs/llama8b_h100_1m.yaml),
      in a child process, the result's request rows as columns (`simulate(cfg, plain=False)`,
      as `dse simulate` runs): CPU seconds and peak memory (the child's own high-water mark);
  (3) `dse simulate examples/quickstart.yaml` as a whole process, with its default envelope;
  (4) Qwen3-235B-A22B, expert parallelism over 8 nodes (examples/cluster/moe_ep_8node.yaml),
      1,000 requests, analytical fabric, with the groups' step-DAG structure reused and their
      steps run as jobs of the compiled fabric (best and median of 3 runs, each with the same
      result) and, as the references, every step built node by node and the fabric in Python
      (`AnalyticalFabric` with `DagRun`); the results are compared byte for byte;
  (5) the flow backend's all-to-all at 64 to 256 hosts (benchmarks/fabric_speed.py has 512);
  (6) `dse search` overhead per trial on SQLite (benchmarks/search_overhead.py has the detail);
  (7) one TP-8 engine on a cluster of 1 and of 512 idle-but-for-it nodes (8 and 4,096 GPUs,
      configs/llama8b_idle_cluster.yaml), analytical fabric, in child processes: CPU seconds
      and peak memory, and the memory each idle GPU adds.
  (8) Qwen3-235B-A22B, expert parallelism over 64 nodes (examples/cluster/moe_ep_64node.yaml,
      512 GPUs, 1,024 requests) on the packet fabric, in a child process: CPU seconds and peak
      memory. Not in the default set (about a quarter of an hour): --only 8.

Figures are printed, never asserted: timings depend on the machine and on whatever else runs on
it. Usage: python benchmarks/scale.py [--only 123456] [--requests N]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

MOONCAKE = HERE / "configs/mooncake_full_h100_dp8.yaml"
MILLION = HERE / "configs/llama8b_h100_1m.yaml"
QUICKSTART = ROOT / "examples/quickstart.yaml"
MOE_8NODE = ROOT / "examples/cluster/moe_ep_8node.yaml"
IDLE = HERE / "configs/llama8b_idle_cluster.yaml"
MOE_64NODE = ROOT / "examples/cluster/moe_ep_64node.yaml"

# Figures before the work on scale (2-core machine), and targets, from the scale table.
BEFORE = {
    "mooncake": "57-88x real time",
    "million": "397 s, 7.0 GB peak",
    "quickstart": "1.8-2.4 s",
    "moe8": "11.7-13.5 s",
    "moe64": "killed at 600 CPU-s",
    "memory": "~6 MB per GPU even when idle; in this run's setup, before routes were computed "
              "per destination on first use: 10.5 CPU-s and 0.54 GB peak at 2,048 GPUs, "
              "45.5 CPU-s and 1.77 GB at 4,096 (quadratic)",
    "flow": "0.3 / 1.6 / 25 / 206 CPU-s at 64 / 128 / 256 / 512 hosts",
    "search": "~0.3 s per trial (24 SQLite commits)",
}
TARGET = {
    "mooncake": ">= 1,000x real time",
    "million": "< 60 s, < 1 GB",
    "quickstart": "< 1 s with an envelope",
    "moe8": "< 5 s",
    "moe64": "< 10 min",
    "memory": "proportional to active work; 4,096 GPUs analytical in < 8 GB",
    "flow": "near-linear in active flows",
    "search": "< 0.05 s per trial",
}

PEAK = """
import resource


def peak_mb():
    # This process's own high-water mark (VmHWM). ru_maxrss would also count the parent it was
    # forked from (Linux keeps the larger across exec), so a child started after a large run
    # would report that run's memory.
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
"""
"""Code the child processes start with: `peak_mb()`, their peak resident memory in MB."""

CHILD = PEAK + """
import json, sys, time
from simcore.config import load_config
from simcore.simulate import simulate
cfg = load_config(sys.argv[1])
if int(sys.argv[2]):
    cfg = cfg.model_copy(update={"workload": cfg.workload.model_copy(
        update={"num_prompts": int(sys.argv[2])})})
t = time.process_time()
r = simulate(cfg, plain=False)
cpu = time.process_time() - t
print(json.dumps({"cpu_s": cpu, "duration_s": r["duration"], "completed": r["completed"],
                  "steps": r["num_steps"],
                  "peak_mb": peak_mb()}))
"""


def row(key: str, label: str, now: str) -> None:
    print(f"  {label}")
    print(f"    now:    {now}")
    print(f"    before: {BEFORE[key]}")
    print(f"    target: {TARGET[key]}")


MOONCAKE_CHILD = """
import hashlib, json, sys, time
import simcore.serve.loop as loop
import simcore.simulate as sim
from simcore.config import load_config
base = load_config(sys.argv[1])
cfg = base.model_copy(update={"compute": base.compute.model_copy(update={"kind": sys.argv[2]})})
loop.QUIET_LEAPS = sys.argv[3] == "1"
if sys.argv[4] == "0":
    sim.COMPILED_MIN_REQUESTS = 1 << 62
t = time.process_time()
r = sim.simulate(cfg)
cpu = time.process_time() - t
print(json.dumps({"cpu_s": cpu, "duration_s": r["duration"], "completed": r["completed"],
                  "steps": r["num_steps"], "replicas": len(r["replicas"]),
                  "profile": r["provenance"]["compute_profile"],
                  "digest": hashlib.sha256(json.dumps(r, sort_keys=True).encode()).hexdigest()}))
"""


def mooncake() -> None:
    for kind in ("auto", "roofline"):
        # Each in a process of its own (a run left in a process slows the next one there): as
        # shipped, without the engine's compiled kernels, and stepping one at a time.
        runs = {name: child("(1)", MOONCAKE_CHILD, MOONCAKE, kind, leaps, kernels)
                for name, leaps, kernels in (("now", 1, 1), ("python", 1, 0), ("single", 0, 1))}
        if any(r is None for r in runs.values()):
            continue
        now, python, single = runs["now"], runs["python"], runs["single"]
        sim_s = now["duration_s"]
        same = ("byte-identical" if now["digest"] == python["digest"] == single["digest"]
                else "DIFFERENT (a defect)")
        row("mooncake", f"(1) Mooncake trace, {now['completed']:,} requests over {sim_s:,.0f} "
            f"simulated s on {now['replicas']} H100 replicas, {now['steps']:,} steps, compute "
            f"{now['profile']}",
            f"{sim_s / now['cpu_s']:,.0f}x real time ({now['cpu_s']:.1f} CPU-s); without the "
            f"engine's compiled kernels {sim_s / python['cpu_s']:,.0f}x "
            f"({python['cpu_s']:.1f} CPU-s), stepping one at a time "
            f"{sim_s / single['cpu_s']:,.0f}x ({single['cpu_s']:.1f} CPU-s), each in a process "
            f"of its own; results {same}")


def child(label: str, code: str, *args) -> dict | None:
    """The JSON line a child process running `code` prints last; None (said) if it fails."""
    proc = subprocess.run([sys.executable, "-c", code, *map(str, args)],
                          capture_output=True, text=True, cwd=ROOT)
    if proc.returncode:
        print(f"  {label} failed: {proc.stderr.strip().splitlines()[-1:]}")
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def million(n: int) -> None:
    r = child("(2)", CHILD, MILLION, n)
    if r is None:
        return
    row("million", f"(2) {r['completed']:,} requests on one Llama-3.1-8B engine "
        f"({r['steps']:,} steps, {r['duration_s']:,.0f} simulated s)",
        f"{r['cpu_s']:.1f} CPU-s, {r['peak_mb'] / 1024:.2f} GB peak "
        f"({r['duration_s'] / r['cpu_s']:,.0f}x real time)")


def quickstart(repeats: int = 3) -> None:
    dse = Path(sys.executable).with_name("dse")
    cmd = ([str(dse)] if dse.exists() else [sys.executable, "-m", "dse.cli"]) + [
        "simulate", str(QUICKSTART), "--quiet", "--out", os.devnull]
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
        times.append(time.perf_counter() - t)
    row("quickstart", "(3) dse simulate examples/quickstart.yaml, whole process, default envelope",
        f"{min(times):.2f} s best of {repeats} (median {sorted(times)[len(times) // 2]:.2f} s)")


def moe8(repeats: int = 3) -> None:
    import simcore.cluster.build as cluster_build
    import simcore.dag.expert_steps as expert_steps
    from cluster_speed import run_one, with_fidelity
    from simcore.config import load_config

    run_one(with_fidelity(load_config(MOE_8NODE), "analytical", 20))   # the lazy imports
    cfg = with_fidelity(load_config(MOE_8NODE), "analytical", 1000)
    make = cluster_build.make_fabric
    out = {}
    # As shipped; every step built node by node; the fabric in Python (`AnalyticalFabric` with
    # `DagRun`, not the compiled fabric's jobs).
    for variant in ("now", "nodes", "python"):
        expert_steps.REUSE_STEP_DAGS = variant != "nodes"
        cluster_build.make_fabric = (make if variant != "python" else
                                     lambda *a, **k: make(*a, **{**k, "compiled": False}))
        try:
            runs = [run_one(cfg) for _ in range(repeats if variant == "now" else 1)]
        finally:
            expert_steps.REUSE_STEP_DAGS = True
            cluster_build.make_fabric = make
        texts = {json.dumps(r, sort_keys=True, default=str) for _, r in runs}
        out[variant] = (sorted(w for w, _ in runs), texts)
        result = runs[-1][1]
    same = ("byte-identical" if len(out["now"][1]) == 1 and out["nodes"][1] == out["now"][1]
            == out["python"][1] else "DIFFERENT (a defect)")
    walls = out["now"][0]
    row("moe8", f"(4) Qwen3-235B-A22B EP over 8 nodes, {result['completed']:,} requests, "
        f"analytical", f"{walls[0]:.1f} s best of {repeats} (median {walls[len(walls) // 2]:.1f} "
        f"s); every step built node by node in this run {out['nodes'][0][0]:.1f} s; the "
        f"fabric in Python (no jobs) {out['python'][0][0]:.1f} s; results {same}")
    print("    (the 64-node packet row is (8): --only 8)")


IDLE_CHILD = PEAK + """
import json, sys, time
from simcore.config import load_config
from simcore.simulate import simulate
cfg = load_config(sys.argv[1])
cfg = cfg.model_copy(update={"cluster": cfg.cluster.model_copy(
    update={"num_nodes": int(sys.argv[2])})})
t = time.process_time()
r = simulate(cfg, plain=False)
print(json.dumps({"cpu_s": time.process_time() - t, "completed": r["completed"],
                  "peak_mb": peak_mb()}))
"""


PACKET_CHILD = PEAK + """
import json, sys, time
from simcore.config import load_config
from simcore.simulate import simulate
cfg = load_config(sys.argv[1])
cfg = cfg.model_copy(update={"cluster": cfg.cluster.model_copy(update={
    "fabric": cfg.cluster.fabric.model_copy(update={"backend": "packet"})})})
t = time.process_time()
r = simulate(cfg, plain=False)
print(json.dumps({"cpu_s": time.process_time() - t, "completed": r["completed"],
                  "steps": r["num_steps"], "duration_s": r["duration"],
                  "peak_mb": peak_mb()}))
"""


def moe64() -> None:
    r = child("(8)", PACKET_CHILD, MOE_64NODE)
    if r is None:
        return
    row("moe64", f"(8) Qwen3-235B-A22B EP over 64 nodes (512 GPUs), {r['completed']:,} requests, "
        f"packet ({r['steps']:,} engine steps, {r['duration_s']:.1f} simulated s)",
        f"{r['cpu_s']:.0f} CPU-s, {r['peak_mb'] / 1024:.1f} GB peak")


def idle() -> None:
    out = {}
    for nodes in (1, 512):
        r = child("(7)", IDLE_CHILD, IDLE, nodes)
        if r is None:
            return
        out[nodes] = r
    small, big = out[1], out[512]
    per_gpu_kb = (big["peak_mb"] - small["peak_mb"]) * 1024 / (4096 - 8)
    row("memory", "(7) one TP-8 engine, 20 requests, on 8 and on 4,096 GPUs (all but 8 idle), "
        "analytical", f"{small['cpu_s']:.2f} / {big['cpu_s']:.2f} CPU-s, {small['peak_mb']:.0f} / "
        f"{big['peak_mb']:.0f} MB peak: {per_gpu_kb:.0f} KB per idle GPU")


def flow() -> None:
    from fabric_speed import flow_all_to_all, flow_warm_up

    flow_warm_up()
    figures = []
    for hosts in (64, 128, 256):
        r = flow_all_to_all(hosts, reference=False)
        figures.append(f"{r['sends_s'] + r['run_s']:.2f}")
    row("flow", "(5) flow backend, all-to-all of 1 MB messages on a leaf-spine",
        f"{' / '.join(figures)} CPU-s at 64 / 128 / 256 hosts (512: fabric_speed.py)")


def search(n: int = 50) -> None:
    import tempfile

    from dse.backends import quiet_optuna
    from search_overhead import batched, open_raw, quickstart_trial
    import dataclasses

    study, outcome = quickstart_trial()
    outcome = dataclasses.replace(outcome, elapsed_s=0.25)
    with quiet_optuna(), tempfile.TemporaryDirectory() as d:
        raw = open_raw("sqlite", Path(d))
        t = time.perf_counter()
        batched(raw, study, outcome, n)
        per_trial = (time.perf_counter() - t) / n
    row("search", f"(6) dse search driver over SQLite, {n} trials, nothing simulated",
        f"{per_trial * 1e3:.1f} ms per trial")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="1234567", help="rows to run, e.g. 13")
    parser.add_argument("--requests", type=int, default=1_000_000,
                        help="requests of row (2) (default 1,000,000)")
    args = parser.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}")
    steps = {"1": mooncake, "2": lambda: million(args.requests), "3": quickstart, "4": moe8,
             "5": flow, "6": search, "7": idle, "8": moe64}
    for k in args.only:
        steps[k]()
        sys.stdout.flush()


if __name__ == "__main__":
    main()
