"""How fast cluster mode runs: wall time of simulate() per fabric fidelity on the cluster examples.

Four scenarios, the shipped examples in examples/cluster/ (see the README there): `dense`
(Llama-3.1-70B, TP 8 x PP 2 x DP 4 on 64 H100s, pipeline hops across nodes) and `moe`
(Qwen3-235B-A22B, four replicas of EP 16 on 64 H200s, dispatch and combine across nodes), 1,000
requests each, the default; and their 64-node versions `dense64` (32 replicas on 512 H100s) and
`moe64` (32 replicas of EP 16 on 512 H200s), 1,024 requests each, eight times the load.
Each is run with the fabric backend switched to analytical, flow and packet, nothing else
changed. Targets per run: analytical under 10 s, flow under 60 s, packet under 10 min.

Figures are printed, never asserted: timings depend on the machine and on whatever else runs on
it. The packet kernel is compiled (or loaded from numba's cache) before any timing, on a small
warm-up scenario, and that time is printed separately.
Usage: python benchmarks/cluster_speed.py [--fidelity analytical flow packet]
       [--config dense moe dense64 moe64] [--num-prompts N]
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CONFIGS = {
    "dense": ROOT / "examples/cluster/dense_pp_8node.yaml",
    "moe": ROOT / "examples/cluster/moe_ep_8node.yaml",
    "dense64": ROOT / "examples/cluster/dense_pp_64node.yaml",
    "moe64": ROOT / "examples/cluster/moe_ep_64node.yaml",
}
DEFAULT_CONFIGS = ("dense", "moe")
FIDELITIES = ("analytical", "flow", "packet")
TARGET_S = {"analytical": 10.0, "flow": 60.0, "packet": 600.0}
"""Wall-time target of one simulate() call per fidelity, 1,000 requests, seconds."""


def warm_up() -> float:
    """Compile or load the packet kernel; seconds taken."""
    from simcore.fabric import topology as topo_mod
    from simcore.fabric.packet import PacketFabric, roce_v2

    t = time.perf_counter()
    fab = PacketFabric(topo_mod.star(3, rate_bps=100e9, delay_s=1e-6), roce_v2())
    for h in fab.topology.hosts[1:]:
        fab.send(h, fab.topology.hosts[0], 2_000_000)
    fab.run()
    fab.stats()
    return time.perf_counter() - t


def with_fidelity(cfg, backend: str, num_prompts: int | None):
    """`cfg` with its fabric backend (and optionally its request count) replaced."""
    c = cfg.cluster
    update = {"cluster": c.model_copy(update={
        "fabric": c.fabric.model_copy(update={"backend": backend})})}
    if num_prompts is not None:
        update["workload"] = cfg.workload.model_copy(update={"num_prompts": num_prompts})
    return cfg.model_copy(update=update)


def run_one(cfg) -> tuple[float, dict]:
    from simcore.simulate import simulate

    t = time.perf_counter()
    result = simulate(cfg)
    return time.perf_counter() - t, result


def fmt_wall(s: float) -> str:
    return f"{s:8.1f} s" if s < 600 else f"{s / 60:6.1f} min"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fidelity", nargs="+", choices=FIDELITIES, default=list(FIDELITIES),
                        help="Fabric backends to time (default: all three).")
    parser.add_argument("--config", nargs="+", choices=sorted(CONFIGS),
                        default=list(DEFAULT_CONFIGS),
                        help="Examples to time (default: dense and moe, the 8-node ones).")
    parser.add_argument("--num-prompts", type=int, default=None,
                        help="Override the examples' request count (default: theirs, 1,000); "
                             "the targets are for 1,000.")
    args = parser.parse_args()

    from simcore.config import load_config

    print(f"cluster speed: Python {platform.python_version()}, {os.cpu_count()} CPUs, "
          f"{platform.machine()}; one run per figure")
    if args.num_prompts is not None:
        print(f"{args.num_prompts} requests per run instead of the examples' own; the targets "
              f"are for 1,000")
    if "packet" in args.fidelity:
        print(f"packet kernel compile / cache load: {warm_up():.2f} s (not included below)")
    started = time.perf_counter()
    head = (f"  {'fidelity':<11}{'requests':>9}{'wall':>12}  {'target':<18}{'x analytical':>13}"
            f"{'simulated':>11}{'steps':>9}{'steps/s':>9}{'DAG steps/s':>12}")
    for name in args.config:
        path = CONFIGS[name]
        base = load_config(path)
        print(f"\n{name}: {base.name} ({path.relative_to(ROOT)})")
        print(head)
        reference = None
        for fidelity in args.fidelity:
            cfg = with_fidelity(base, fidelity, args.num_prompts)
            wall, r = run_one(cfg)
            c = r["cluster"]
            f = c["fabric"]
            limit = TARGET_S[fidelity]
            target = f"< {limit:g} s: {'met' if wall < limit else 'NOT met'}"
            if fidelity == "analytical":
                reference = wall
            ratio = f"{wall / reference:.1f}x" if reference else "-"
            print(f"  {fidelity:<11}{r['completed']:>9}{fmt_wall(wall):>12}  {target:<18}"
                  f"{ratio:>13}{r['duration']:>9.1f} s{r['num_steps']:>9}"
                  f"{r['num_steps'] / wall:>9.0f}{c['num_steps'] / wall:>12.0f}")
            sizes = ", ".join(f"{s['size']} {s['slowdown_mean']:.2f}"
                              for s in f["slowdown_by_size"])
            print(f"  {'':<11}network share of latency {c['network_share_of_request_latency']:.3f}"
                  f"; mean slowdown by size: {sizes}; DCQCN cuts {f['dcqcn_rate_cuts']}, "
                  f"PFC pauses {f['pfc_pause_frames']}, drops {f['drops']}")
    print("\nsteps: engine steps summed over the engines (`num_steps`); DAG steps: steps run "
          "as a DAG over the fabric (an expert-parallel group's lock-step step counts once)")
    print(f"benchmark wall time {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
