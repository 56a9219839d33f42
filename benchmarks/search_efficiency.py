"""How quickly each sampler finds the true Pareto front of a space small enough to simulate whole.

The space is the quickstart study's batching knobs on a grid (11 x 5 x 3 = 165 configurations of
Llama-3.1-8B on an A100 at 20 req/s, near its capacity). Every configuration is simulated once;
the exhaustive feasible Pareto front (minimise p99 TTFT and p99 TPOT, subject to an output
throughput of at least 2,000 tok/s per GPU) gives the reference hypervolume, measured from the
front's nadir pushed out by 10% of its extent. Each sampler then searches the same grid
through Optuna's ask/tell (looking results up in the table, so a run costs no simulation), and
the script prints the fraction of the reference hypervolume reached after 10%, 20% and 40% of
the evaluations, averaged over seeds. Target: TPE reaches >= 95% within 20%.

Last, it times `dse search` on a 16-trial study with 1 and 2 Ray workers and prints the speed-up.

Usage: python benchmarks/search_efficiency.py [--seeds 5] [--skip-workers]
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SEQS = [8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512]
TOKENS = [1024, 2048, 4096, 8192, 16384]
THRESHOLDS = [0, 256, 1024]
MIN_THROUGHPUT = 2000.0
FRACTIONS = (0.10, 0.20, 0.40)


def base_config() -> dict:
    from simcore.loading import load_yaml

    base = load_yaml(ROOT / "examples" / "quickstart.yaml")
    base["base_dir"] = str(ROOT / "examples")
    base["workload"].update({"num_prompts": 600, "request_rate": 20})
    return base


def exhaustive_table() -> dict[tuple, tuple[float, float, bool]]:
    """(seqs, tokens, threshold) -> (p99 TTFT ms, p99 TPOT ms, throughput constraint met)."""
    from dse.space import apply
    from simcore.config import parse_config
    from simcore.simulate import simulate

    base = base_config()
    table = {}
    for seqs, tokens, thr in itertools.product(SEQS, TOKENS, THRESHOLDS):
        cfg = parse_config(apply(base, {"engine.max_num_seqs": seqs,
                                        "engine.max_num_batched_tokens": tokens,
                                        "engine.long_prefill_token_threshold": thr}))
        r = simulate(cfg)
        table[(seqs, tokens, thr)] = (r["p99_ttft_ms"], r["p99_tpot_ms"],
                                      r["output_throughput_per_gpu"] >= MIN_THROUGHPUT)
    return table


def hypervolume_2d(points: list[tuple[float, float]], ref: tuple[float, float]) -> float:
    """Area dominated by (minimise x, minimise y) points, bounded by the reference point."""
    pts = sorted({p for p in points if p[0] < ref[0] and p[1] < ref[1]})
    area = 0.0
    best_y = ref[1]
    for x, y in pts:
        if y < best_y:
            area += (ref[0] - x) * (best_y - y)
            best_y = y
    return area


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Non-dominated (minimise x, minimise y) points."""
    return [p for p in points
            if not any(q[0] <= p[0] and q[1] <= p[1] and q != p for q in points)]


def reference_point(table) -> tuple[float, float]:
    """The nadir of the true feasible front, pushed out by 10% of its extent on each axis."""
    front = pareto_front([(x, y) for x, y, ok in table.values() if ok])
    xs = [p[0] for p in front]
    ys = [p[1] for p in front]
    return (max(xs) + 0.1 * (max(xs) - min(xs)), max(ys) + 0.1 * (max(ys) - min(ys)))


def run_sampler(kind: str, seed: int, table, n_evals: int) -> list[tuple[float, float, bool]]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    if kind == "tpe":
        sampler = optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=10)
    elif kind == "nsga2":
        sampler = optuna.samplers.NSGAIISampler(seed=seed, population_size=10)
    else:
        sampler = optuna.samplers.RandomSampler(seed=seed)
    study = optuna.create_study(directions=["minimize", "minimize"], sampler=sampler)
    seen = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(n_evals):
            t = study.ask()
            key = (t.suggest_categorical("engine.max_num_seqs", SEQS),
                   t.suggest_categorical("engine.max_num_batched_tokens", TOKENS),
                   t.suggest_categorical("engine.long_prefill_token_threshold", THRESHOLDS))
            x, y, ok = table[key]
            t.set_constraint("output_throughput_per_gpu >= 2000", 0.0 if ok else 1.0)
            study.tell(t, [x, y])
            seen.append((x, y, ok))
    return seen


def worker_speedup() -> tuple[float, float]:
    from dse.runner import run_search
    from dse.study import load_study

    times = []
    for workers in (1, 2):
        with tempfile.TemporaryDirectory() as d:
            study = load_study(ROOT / "studies" / "quickstart.yaml")
            study = study.model_copy(update={
                "storage": f"sqlite:///{d}/s.db",
                "budget": study.budget.model_copy(update={"n_trials": 16}),
                "fidelity": study.fidelity.model_copy(update={"confirm": None}),
                "execution": study.execution.model_copy(update={"workers": workers}),
                "report": study.report.model_copy(update={"dir": d})})
            t0 = time.perf_counter()
            run_search(study, progress=False)
            times.append(time.perf_counter() - t0)
    return times[0], times[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--skip-workers", action="store_true", help="skip the Ray speed-up figure")
    args = ap.parse_args()

    t0 = time.perf_counter()
    table = exhaustive_table()
    n = len(table)
    print(f"exhaustive: {n} configurations simulated in {time.perf_counter() - t0:.1f} s")
    ref = reference_point(table)
    true_hv = hypervolume_2d([(x, y) for x, y, ok in table.values() if ok], ref)
    n_feasible = sum(ok for *_, ok in table.values())
    front = pareto_front([(x, y) for x, y, ok in table.values() if ok])
    print(f"feasible: {n_feasible}; true front: {len(front)} configurations; reference point "
          f"{ref[0]:.0f} ms TTFT, {ref[1]:.1f} ms TPOT; "
          f"true hypervolume {true_hv:.4g}")
    marks = [max(1, round(f * n)) for f in FRACTIONS]
    print(f"\n{'sampler':<8}" + "".join(f"{f'{int(f * 100)}% ({m} evals)':>18}"
                                       for f, m in zip(FRACTIONS, marks)))
    for kind in ("tpe", "nsga2", "random"):
        fracs = np.zeros(len(marks))
        for seed in range(args.seeds):
            seen = run_sampler(kind, seed, table, marks[-1])
            for j, m in enumerate(marks):
                hv = hypervolume_2d([(x, y) for x, y, ok in seen[:m] if ok], ref)
                fracs[j] += hv / true_hv / args.seeds
        print(f"{kind:<8}" + "".join(f"{v:>17.1%} " for v in fracs))
    print(f"(mean over {args.seeds} seeds; target: tpe >= 95% at 20%)")

    if not args.skip_workers:
        t1, t2 = worker_speedup()
        print(f"\ndse search, 16 trials: 1 worker {t1:.1f} s, 2 workers {t2:.1f} s, "
              f"speed-up {t1 / t2:.2f}x (Ray start-up included)")


if __name__ == "__main__":
    sys.exit(main())
