"""Fit the parameters that could not be measured on the `fit` part of the end-to-end validation
set, and write them to simcore/data/cpu_costs/fitted.json.

The parameters: the model runner's CPU time per step and per scheduled sequence, the API
server's per streamed token and per request (its latency, and its work that holds it:
`simcore.host`), and the calibrated compute
model's compute-bound scale (`compute.compute_bound_scale`: sustained against boost clocks),
the TP ranks' skew at each all-reduce (`compute.collective_skew_s`: the last rank's wait) and the
all-reduces' scale in steps not replayed as one full CUDA graph
(`compute.graphless_collective_scale`). The
objective: the mean over the fit cases and their metric families of |log(predicted /
measured)|, each prediction `dse.validate_e2e.predict`'s (for an offline ShareGPT batch the median
over its draws); with the result, per metric family the fit cases' residuals log(measured /
predicted), which calibrated envelopes use, and those of the 99th percentiles of TTFT, TPOT and
ITL where a case's source prints them (families `ttft_p99`, `tpot_p99` and `itl_p99`, the first
draw's p99: the tails' own envelopes; not in the objective): out of sample, by cross-validation over the fit part
(`CV_FOLDS` folds of whole sources, `cv_fold`: each fold's residuals at parameters fitted on the
other folds), since residuals at parameters fitted on the same cases understate the error a new
case meets; the in-sample residuals are kept beside them. The search: coordinate descent over grids
(each parameter in turn, all others fixed; the request path's two together, `UNITS`), two
rounds, then a finer grid around the best, the
API server's two parameters and the compute-bound scale kept under `BOUNDS` (published
measurements); the held-out cases are never simulated here.

With the parameters, the objective over the fit cases of mixture-of-experts models under each
measured MoE routing (`moe_routing_objective`), from which the default routing was chosen.

    python scripts/fit_host_overheads.py [--workers 2] [--out simcore/data/cpu_costs/fitted.json]
    python scripts/fit_host_overheads.py --residuals-only   # keep the parameters, redo the
                                                            # objective and residuals
    python scripts/fit_host_overheads.py --residuals-only --reuse-folds   # and the folds' too
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dse.validate_e2e import load_cases, predict_with_tails  # noqa: E402
from simcore.calibration.kernels import MOE_ROUTINGS  # noqa: E402
from simcore.host import FITTED, FITTED_COMPUTE, FITTED_KEYS, HostConfig  # noqa: E402
from simcore.model.presets import load_preset  # noqa: E402
from simcore.uncertainty import is_tail_family, tail_family  # noqa: E402

GRIDS = {
    "compute_bound_scale": [1.0, 1.05, 1.1, 1.15, 1.2, 1.25],
    "collective_skew_s": [0.0, 5e-6, 1e-5, 2e-5, 3e-5, 4e-5],
    "graphless_collective_scale": [1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0],
    "model_runner_step_s": [0.0, 2.5e-4, 5e-4, 1e-3, 1.5e-3, 2e-3, 3e-3, 4e-3],
    "model_runner_per_seq_s": [0.0, 1e-5, 2e-5, 4e-5, 8e-5, 1.2e-4, 1.8e-4, 2.5e-4],
    "api_server_per_token_s": [0.0, 5e-6, 1e-5, 2e-5, 3e-5, 4e-5, 6e-5],
    "request_overhead_s": [0.0, 4e-3, 8e-3, 0.012, 0.015],
    "api_server_per_request_s": [0.0, 2e-3, 4e-3, 6e-3, 7e-3],
}

BOUNDS = {"api_server_per_token_s": 6e-5, "request_overhead_s": 0.015,
          "api_server_per_request_s": 7e-3, "compute_bound_scale": 1.25,
          "graphless_collective_scale": 4.0}
"""Upper bounds from a published measurement of a whole vLLM server, so that the fit cannot
give the API server costs no real one has: Llama-3.1-8B on H100 under ShareGPT at 200 req/s
offered served 129.9 req/s on 1.71 replicas on average (about 76 req/s, some 15,000 output
tokens/s each) with a median ITL of 6.5 ms and a median TTFT of 28.6 ms (llm-d/llm-d-autoscaling
pull request 1025, 2026-04-17, real vLLM on one H100 per replica). One API server process keeping
up with 15,000 tokens/s spends at most 66 us per token, and at a 6.5 ms step with about 100
streams at most 60 us beyond the output processor's measured cost; a 28.6 ms median TTFT that
also holds the prompt's prefill and a step's wait leaves at most about 15 ms of latency on the
request's path, held or not (`REQUEST_PATH_BOUND`: request_overhead_s and
api_server_per_request_s together). The server's unmeasured work per request holds it: at 76
req/s and 15,000 tokens/s, with the measured output processor's 21 us a token (0.32 s of each
second) and the measured 2 ms of a ShareGPT request's own work (0.15 s), at most 0.53 s of each
second remains for 76 requests, 7 ms each.

The compute-bound scale (`compute.compute_bound_scale`) stands for the tensor cores' sustained
clock under serving load against the boost clock the kernel databases measured at: at its power
limit an A100 sustains 1,305 of its 1,410 MHz (the clock NVIDIA took for its HPL peak; G. Lockwood,
"Peak FLOPS", glennklockwood.com/garden/peak-FLOPS), and an H100 PCIe under sustained GEMM load
was seen averaging 1,384 of its 1,755 MHz boost (0.79; reanimator/bee, benchmark clock
calibration notes, 2026-04-06). The bound 1.25 is the inverse of that lowest ratio. The
graphless steps' collective scale is held to the range `compute.graphless_collective_scale`
accepts."""


FLOORS = {"compute_bound_scale": 1.0, "graphless_collective_scale": 1.0}
"""Lower bounds: a sustained clock is never above the boost clock; a collective in a step is
never faster than measured alone."""
REQUEST_PATH_BOUND = 0.015
"""request_overhead_s + api_server_per_request_s, at most (see `BOUNDS`)."""
PATH_KEYS = ("request_overhead_s", "api_server_per_request_s")


UNITS = [("compute_bound_scale",), ("collective_skew_s",), ("graphless_collective_scale",),
         ("model_runner_step_s",),
         ("model_runner_per_seq_s",), ("api_server_per_token_s",), PATH_KEYS]
"""The coordinates of the descent: one parameter each, but for the request path's two, searched
together (their sum is bounded)."""


def unit_trials(unit: tuple[str, ...], params: dict, refine: bool) -> list[dict]:
    """The trial values of one coordinate: its grid (each value within its bounds), or, to
    refine, factors around the current value; the request path's pair over both grids, their
    sum within `REQUEST_PATH_BOUND`."""
    grids = []
    for key in unit:
        v = params[key]
        grid = (sorted({max(FLOORS.get(key, 0.0), v * f)
                        for f in (0.6, 0.8, 0.9, 1.1, 1.25, 1.5)} | {v}) if refine
                else GRIDS[key])
        grids.append([g for g in grid if g <= BOUNDS.get(key, math.inf) + 1e-12])
    trials = [{}]
    for key, grid in zip(unit, grids):
        trials = [{**t, key: g} for t in trials for g in grid]
    if unit == PATH_KEYS:
        trials = [t for t in trials if sum(t.values()) <= REQUEST_PATH_BOUND + 1e-12]
    return [t for t in trials if any(t[k] != params[k] for k in unit)]


CV_FOLDS = 3
"""Folds of the cross-validation that gives the envelope's out-of-sample residuals (5 while the
fit part had 28-30 cases; 3 since it has 68, each fold's parameters then fitted on about 45 of
them, more than 5 folds left each when the part was smaller, at 3 of 5 folds' CPU time)."""


OFFLINE_UNREAD = ("api_server_per_token_s", "request_overhead_s", "api_server_per_request_s")
"""The API server's parameters, which a case of vLLM's LLM class (host.entrypoint offline) has no
server to spend."""


def cv_fold(case) -> int:
    """The declared fold of a fit case: by its source (a page or CI build measures several
    cases, which leave and join the fit together), the first 8 hex digits of the sha256 of the
    source's URL modulo `CV_FOLDS`."""
    return int(hashlib.sha256(case.source.encode()).hexdigest()[:8], 16) % CV_FOLDS


def _residuals(args):
    case, params, *routing = args
    params = dict(params)
    compute = dict(case.config.get("compute", {}))
    compute["compute_bound_scale"] = params.pop("compute_bound_scale", 1.0)
    skew = params.pop("collective_skew_s", 0.0)
    graphless = params.pop("graphless_collective_scale", 1.0)
    if case.config.get("parallelism", {}).get("tensor_parallel_size", 1) > 1:
        compute["collective_skew_s"] = skew       # refused at TP 1: no all-reduce to wait at
        compute["graphless_collective_scale"] = graphless
    if routing and routing[0]:
        compute["moe_routing"] = routing[0]
    if (case.config.get("host") or {}).get("entrypoint") == "offline":
        for key in OFFLINE_UNREAD:      # no API server: refused there (no effect)
            params.pop(key, None)
    pred, tails = predict_with_tails(case, compute, host={"model": "vllm", **params})
    out = {f: math.log(case.measured[f] / pred[f]) for f in case.measured}
    # The printed 99th percentiles' residuals too, for the tails' own envelopes (not fitted to)
    out.update({tail_family(f): math.log(case.p99_ms[f] / v) for f, v in tails.items()})
    return out


def residual_quantiles(cases, params, pool) -> dict:
    """Per metric family, quantiles of log(measured / predicted) over `cases`."""
    return _quantiles(pool.map(_residuals, [(c, params) for c in cases]), cases)


def cv_residuals(cases, pool, log=print, folds: dict | None = None) -> tuple[dict, dict]:
    """Out-of-sample residuals of `cases` (quantiles per family, as `residual_quantiles`): each
    fold's at the parameters `descend` fits on the other folds (or, given `folds`, a fit's
    recorded `cv_folds`, at the parameters it recorded for each); and those parameters by
    fold."""
    out, tested, fitted = [], [], {}
    for f in range(CV_FOLDS):
        train = [c for c in cases if cv_fold(c) != f]
        test = [c for c in cases if cv_fold(c) == f]
        if not test:
            continue
        if folds is None:
            params, score = descend(train, pool, log=lambda m: log(f"fold {f}: {m}"))
        else:
            kept = folds[str(f)]
            if kept["cases"] != sorted(c.id for c in test):
                raise SystemExit(f"fold {f}: its recorded cases are not the fold's cases now; "
                                 "refit it (without --reuse-folds)")
            params, score = kept["parameters"], kept["train_objective"]
        fitted[f] = {"parameters": params, "train_objective": score,
                     "cases": sorted(c.id for c in test)}
        out += pool.map(_residuals, [(c, params) for c in test])
        tested += test
    return _quantiles(out, tested), fitted


def _quantiles(rows, cases) -> dict:
    """Per family: n, quantiles and the sorted values of the residuals `rows` (one per case of
    `cases`), and the values of each GPU's cases apart (`by_gpu`: what a run on that GPU takes
    its envelope from where it has enough, `simcore.uncertainty.calibrated_range`)."""
    by: dict[str, list[float]] = {}
    by_gpu: dict[str, dict[str, list[float]]] = {}
    for r, case in zip(rows, cases, strict=True):
        gpu = case.config["hardware"]["gpu"]
        for f, v in r.items():
            by.setdefault(f, []).append(v)
            by_gpu.setdefault(f, {}).setdefault(gpu, []).append(v)
    return {f: {"n": len(v), "p10": float(np.quantile(v, 0.1)),
                "p50": float(np.quantile(v, 0.5)), "p90": float(np.quantile(v, 0.9)),
                "values": sorted(round(float(x), 6) for x in v),
                "by_gpu": {g: sorted(round(float(x), 6) for x in w)
                           for g, w in sorted(by_gpu[f].items())}}
            for f, v in sorted(by.items())}


def objective(cases, params, pool, routing: str | None = None) -> float:
    errs = []
    for r in pool.map(_residuals, [(c, params, routing) for c in cases]):
        errs += [abs(v) for f, v in r.items() if not is_tail_family(f)]
    return float(np.mean(errs))


def routing_objectives(cases, params, pool) -> dict[str, float]:
    """The objective over the fit cases of mixture-of-experts models with each measured MoE
    routing (`compute.moe_routing`); the smallest is `simcore.compute.kernel_model.
    DEFAULT_MOE_ROUTING` (a test holds them together)."""
    moe = [c for c in cases if load_preset(c.config["model"]["name"]).is_moe]
    return {r: round(objective(moe, params, pool, r), 6) for r in MOE_ROUTINGS}


def descend(cases, pool, log=print) -> tuple[dict, float]:
    """The parameters of least `objective` over `cases`, by coordinate descent from zero (the
    scale from 1): two rounds over each unit's grid, then a round refining around the best."""
    params = {**dict.fromkeys(FITTED_KEYS, 0.0), **FITTED_COMPUTE}
    best = objective(cases, params, pool)
    log(f"start {best:.4f}")
    for rnd in range(3):
        for unit in UNITS:           # the third round refines around the current values
            for change in unit_trials(unit, params, refine=rnd == 2):
                trial = {**params, **change}
                score = objective(cases, trial, pool)
                if score < best:
                    best, params = score, trial
            values = ", ".join(f"{k} = {params[k]:.3g}" for k in unit)
            log(f"round {rnd} {values}  objective {best:.4f}")
    return params, best


def _log(message: str) -> None:
    print(message, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=FITTED)
    ap.add_argument("--residuals-only", action="store_true",
                    help="Keep the parameters of --out; recompute its residual quantiles.")
    ap.add_argument("--reuse-folds", action="store_true",
                    help="With --residuals-only: keep the cross-validation folds' parameters of "
                         "--out too (no refit of the folds; minutes instead of half an hour).")
    args = ap.parse_args()
    cases, _ = load_cases()
    fit = [c for c in cases if c.split == "fit"]
    speeds = {c.id for c in fit if "host_speed" in (c.config.get("host") or {})}
    if speeds:      # the fit records one host speed for all of its cases
        raise SystemExit(f"fit cases set host.host_speed: {sorted(speeds)}")
    with ProcessPoolExecutor(args.workers) as pool:
        if args.residuals_only:
            out = json.loads(args.out.read_text(encoding="utf-8"))
            params = out["parameters"]
            # The model may have changed since the fit: the objective at its parameters now.
            out["objective_value"] = objective(fit, params, pool)
        else:
            params, best = descend(fit, pool, log=_log)
            out = {"format": "simcore-host-fit", "version": 1,
                   # Every case runs at the default host speed: the parameters are CPU time on
                   # hosts of that speed (`simcore.host.host_parameter` moves them to another).
                   "host_speed": HostConfig.model_fields["host_speed"].default,
                   "parameters": params,
                   "objective": "mean |log(predicted / measured)| over the fit cases' metric "
                                "families",
                   "objective_value": best,
                   "fit_cases": sorted(c.id for c in fit),
                   "method": "coordinate descent over log-spaced grids, 2 rounds, then a "
                             "refinement round around the best (scripts/fit_host_overheads.py)"}
        out["moe_routing_objective"] = routing_objectives(fit, params, pool)
        out["in_sample_residuals"] = residual_quantiles(fit, params, pool)
        folds = out["cv_folds"] if args.residuals_only and args.reuse_folds else None
        out["residuals"], out["cv_folds"] = cv_residuals(fit, pool, log=_log, folds=folds)
        out["residuals_method"] = (
            f"{CV_FOLDS}-fold cross-validation over the fit cases, folds of whole sources "
            "(scripts/fit_host_overheads.py cv_fold): each fold's residuals at the parameters "
            "fitted the same way on the other folds")
    args.out.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(out["residuals"], indent=1))


if __name__ == "__main__":
    main()
