"""Envelopes: the range a result's metrics can take given the errors of the compute model.

Every step-time model declares a relative error bound per op class (`op_error_bounds()`: GEMMs,
attention, routed experts, elementwise passes, LM head, communication, overhead): the held-out
error of a calibration profile for the classes it measured, the roofline's declared bound for the
rest. Model errors are systematic (a kernel that is 10% slower than modelled is slower in every
step), so a perturbed run scales each class by one factor for the whole run and the serving loop
propagates it through batching and queueing, which a first-order scaling cannot:

- `bounds`: two extra runs, every class at the low (1 - b) and at the high (1 + b) end of its
  bound; the envelope spans the three runs (errors taken fully correlated: conservative).
- `samples`: N extra runs, each class scaled by exp(z * sigma) with z standard normal and sigma
  such that (1 - b, 1 + b) holds 90% of the draws (log-normal); the envelope is the chosen
  percentiles of the runs, optionally with a fresh workload draw per run.
- `first_order`: no extra run; latencies scaled by 1 -/+ u, throughputs by 1 / (1 +/- u), u the
  step-time bound. Near saturation queueing amplifies latency beyond this.
- `calibrated`: no extra run; a split-conformal interval per metric family (throughput, TTFT,
  TPOT/ITL, E2E latency, and the 99th percentiles of TTFT, TPOT and ITL apart) from the
  residuals r = log(measured / predicted) of the fit part of the end-to-end validation set
  (`simcore/data/cpu_costs/fitted.json`), out of sample (each fold of sources at parameters
  fitted on the others, `scripts/fit_host_overheads.py`): centre
  c = median(r), half width w = the ceil((n + 1) x 0.8)-th smallest |r - c| (the largest when
  that exceeds n), so that a new case like those has at least an 80% chance to fall inside (a
  residual at parameters fitted on its own case would understate that); the envelope is nominal
  x exp(c -/+ w) and its `median` nominal x exp(c): width and centre from measured errors. Where
  the step model has roofline parts (its op bounds wider than the validated profiles'), the
  first-order range is taken where it is wider. Its coverage is measured on the held-out part
  (`dse validate --suite end_to_end`).

Unless `uncertainty.method` says otherwise, a calibrated compute model gets the `calibrated`
envelope and the roofline the `bounds` one (`envelope_method`). All draws are seeded from the
config's seed; nothing reads the clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from simcore import metric_catalog
from simcore.config import SimConfig

_Z90 = 1.6448536269514722
"""Standard normal quantile of 0.95: (1 - b, 1 + b) is the central 90% of the samples."""

_VALIDATED_BOUND = 0.25
"""Step-time bounds up to this are those of the kernel profiles the end-to-end residuals were
measured with (their largest on the validated configurations): inside the residuals already."""


def metric_scaling(metric: str) -> int:
    """How a metric moves with step time, as `simcore.metric_catalog` declares it: +1
    proportionally (latencies, cost per token), -1 inversely (throughputs, tokens per dollar),
    0 not simply (counts, fractions, and names the catalog does not know)."""
    return metric_catalog.scaling(metric)


def first_order(metric: str, value: float, relative_uncertainty: float | None
                ) -> tuple[float, float] | None:
    """The range of `metric` if every step time is off by up to +/-relative_uncertainty, to
    first order: latencies scale with step time, throughputs with its inverse; None for metrics
    that do not scale simply."""
    u = relative_uncertainty
    scaling = metric_scaling(metric)
    if u is None or u <= 0 or scaling == 0 or not math.isfinite(value):
        return None
    if scaling > 0:
        return value * (1 - u), value * (1 + u)
    return value / (1 + u), (value / (1 - u) if u < 1 else math.inf)


def headline_metrics(result: dict) -> dict[str, float]:
    """The top-level numeric predictions of a result, finite ones: the metrics
    `simcore.metric_catalog` declares as predictions (not inputs, counts or flags)."""
    return {k: float(v) for k, v in result.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
            and metric_catalog.enveloped(k) and math.isfinite(float(v))}


TAIL_PERCENTILE = 99.0
"""A TTFT, TPOT or ITL percentile at or above this takes its tail family's residuals
(`tail_family`): the fit part's sources print the p99 of each. Lower percentiles (p90, p95) take
the mean's family."""
TAIL_QUANTITIES = ("ttft", "tpot", "itl")
"""The latencies whose tails are calibrated apart (few sources print a p99 E2E latency)."""


def tail_family(family: str) -> str:
    """The family of a latency's 99th percentile: `ttft_p99`, `tpot_p99`, `itl_p99`."""
    return f"{family}_p99"


def is_tail_family(family: str) -> bool:
    return family.endswith("_p99")


def metric_family(metric: str) -> str | None:
    """The end-to-end family of a headline metric: throughput, ttft, tpot (ITL too), e2e; a
    TTFT, TPOT or ITL percentile of at least `TAIL_PERCENTILE`, its tail's (`ttft_p99`,
    `tpot_p99`, `itl_p99`): a tail's errors are not its mean's (a queue's last request waits
    for more than the mean one, the p99 ITL is a decode step that carried a prefill chunk)."""
    if "throughput" in metric or "goodput" in metric:
        return "throughput"
    for quantity in TAIL_QUANTITIES:
        pct = metric_catalog.percentile_of(metric, quantity)
        if pct is not None and pct >= TAIL_PERCENTILE:
            return tail_family(quantity)
    if "ttft" in metric:
        return "ttft"
    if "tpot" in metric or "itl" in metric:
        return "tpot"
    if "e2el" in metric or metric == "duration":
        return "e2e"
    return None


COVERAGE = 0.8
"""The coverage the calibrated envelope is built for."""


def conformal(residuals: list[float], coverage: float = COVERAGE) -> tuple[float, float]:
    """(centre, half width) of a split-conformal interval over `residuals`: the median, and the
    ceil((n + 1) x coverage)-th smallest distance from it (the largest when n is too small)."""
    r = np.sort(np.asarray(residuals, dtype=float))
    c = float(np.median(r))
    d = np.sort(np.abs(r - c))
    k = math.ceil((len(d) + 1) * coverage)
    return c, float(d[min(k, len(d)) - 1])


MIN_GPU_RESIDUALS = 20
"""Fewest residuals of a family that a GPU's own fit cases must give for a run on that GPU to
take its envelope from them alone (group-conditional, "Mondrian", split conformal: the model's
errors differ by GPU, on the fit part as on the rest, so an interval from every GPU's residuals
is too wide on some and too narrow on others); a GPU with fewer takes every GPU's."""


def residuals_for(q: dict, gpu: str | None) -> tuple[list[float], str]:
    """The residuals of one family's quantiles `q` (`simcore.host.fitted_residuals`) that a run
    on `gpu` takes its envelope from, and which they are ("H100-SXM" or "all GPUs")."""
    own = (q.get("by_gpu") or {}).get(gpu) if gpu else None
    if own is not None and len(own) >= MIN_GPU_RESIDUALS:
        return own, gpu
    return q["values"], "all GPUs"


def calibrated_range(metric: str, value: float, residuals: dict,
                     relative_uncertainty: float | None,
                     gpu: str | None = None) -> dict[str, float] | None:
    """low / median / high of `metric` from the end-to-end residuals of its family (those of
    `gpu`'s fit cases where there are enough, `residuals_for`), widened to the first-order
    range where that is wider; None for metrics without a family."""
    fam = metric_family(metric)
    q = residuals.get(fam) if fam else None
    if q is None or not math.isfinite(value):
        return None
    c, w = conformal(residuals_for(q, gpu)[0])
    lo, mid, hi = value * math.exp(c - w), value * math.exp(c), value * math.exp(c + w)
    fo = first_order(metric, value, relative_uncertainty)
    if fo is not None:
        lo, hi = min(lo, fo[0]), max(hi, fo[1])
    return {"nominal": value, "low": min(lo, mid), "median": mid, "high": max(hi, mid)}


def calibrated_envelope(provenance: dict, metrics: dict[str, float]) -> dict[str, dict]:
    """The `calibrated` envelope of `metrics` (name -> value) predicted by a run with this
    `provenance`: each metric's `calibrated_range` (from the residuals of the run's GPU,
    `provenance["gpu"]`, where it has enough) where its model is calibrated and the metric has
    a family, else its first-order range; metrics with neither are left out."""
    from simcore.host import fitted_residuals

    residuals = fitted_residuals()
    # The validated profiles' step-time bound is inside the residuals; a model with a wider
    # bound (roofline parts) widens by the excess.
    u = provenance["step_time_relative_uncertainty"]
    rel = max(0.0, u - _VALIDATED_BOUND)
    gpu = provenance.get("gpu")
    out = {}
    for k, v in metrics.items():
        r = calibrated_range(k, v, residuals, rel, gpu) if provenance["calibrated"] else None
        if r is None:
            fo = first_order(k, v, u)
            r = None if fo is None else {"nominal": v, "low": fo[0], "high": fo[1]}
        if r is not None:
            out[k] = r
    return out


def perturbations(bounds: dict[str, float], method: str, samples: int,
                  seed: int) -> list[dict[str, float]]:
    """The op-class scale factors of each perturbed run."""
    classes = sorted(bounds)
    if method == "bounds":
        return [{c: max(1e-3, 1.0 - bounds[c]) for c in classes},
                {c: 1.0 + bounds[c] for c in classes}]
    if method != "samples":
        return []
    rng = np.random.default_rng([seed, 0x5EED_E1])
    z = rng.standard_normal((samples, len(classes)))
    sigma = np.array([math.log1p(bounds[c]) / _Z90 for c in classes])
    factors = np.exp(z * sigma)
    return [{c: float(f) for c, f in zip(classes, row)} for row in factors]


def envelope_of(nominal: dict[str, float], runs: list[dict[str, float]], method: str,
                percentiles: tuple[float, float]) -> dict[str, dict[str, float]]:
    """Per metric: nominal, low, high (and for samples the median) over the perturbed runs."""
    out: dict[str, dict[str, float]] = {}
    for k, v in nominal.items():
        vals = np.array([r[k] for r in runs if k in r and math.isfinite(r[k])])
        if vals.size == 0:
            continue
        if method == "bounds":
            lo, hi = float(min(vals.min(), v)), float(max(vals.max(), v))
            out[k] = {"nominal": v, "low": lo, "high": hi}
        else:
            lo, med, hi = np.percentile(vals, [percentiles[0], 50.0, percentiles[1]])
            out[k] = {"nominal": v, "low": float(lo), "median": float(med), "high": float(hi)}
    return out


def envelope_method(cfg: SimConfig) -> str:
    """The config's uncertainty method: `uncertainty.method` where set, else `calibrated` for a
    calibrated compute model (the validation set's residuals describe those) and `bounds` for
    the roofline (whose errors the residuals do not describe)."""
    if cfg.uncertainty.method is not None:
        return cfg.uncertainty.method
    kind = cfg.compute.resolved_kind(cfg.hardware.resolve().name)
    return "calibrated" if kind == "calibrated" else "bounds"


def simulate_with_envelope(cfg: SimConfig, *, progress: Callable | None = None,
                           run_progress: Callable[[int, int], None] | None = None,
                           plain: bool = True) -> dict:
    """`simulate(cfg, plain=plain)` plus `result["envelope"]` by the config's uncertainty
    method.

    `progress` is passed to the nominal run; `run_progress(done, total)` is called after each
    perturbed run. The nominal result is returned unchanged apart from the envelope.
    """
    from simcore.simulate import simulate

    result = simulate(cfg, progress=progress, plain=plain)
    if cfg.metrics.headroom:
        from simcore.saturation import headroom

        h = headroom(cfg, result)
        if h is not None:
            result["headroom"] = h
    u = cfg.uncertainty
    method = envelope_method(cfg)
    prov = result["provenance"]
    bounds = prov["op_error_bounds"]
    metrics = headline_metrics(result)
    env: dict = {"method": method, "calibrated": prov["calibrated"],
                 "op_error_bounds": bounds,
                 "step_time_relative_uncertainty": prov["step_time_relative_uncertainty"]}
    if method == "calibrated":
        from simcore.host import fitted_residuals

        env["runs"] = 1
        env["residual_quantiles"] = fitted_residuals()
        env["residuals_from"] = {fam: residuals_for(q, prov.get("gpu"))[1]
                                 for fam, q in env["residual_quantiles"].items()}
        env["metrics"] = calibrated_envelope(prov, metrics)
        result["envelope"] = env
        return result
    if method == "first_order":
        rel = prov["step_time_relative_uncertainty"]
        env["runs"] = 1
        env["metrics"] = {}
        for k, v in metrics.items():
            r = first_order(k, v, rel)
            if r is not None:
                env["metrics"][k] = {"nominal": v, "low": r[0], "high": r[1]}
        result["envelope"] = env
        return result
    plans = perturbations(bounds, method, u.samples, cfg.seed)
    runs: list[dict[str, float]] = []
    seeds: list[int] = []
    for i, scale in enumerate(plans):
        run_cfg = cfg
        if u.vary_workload_seed:
            run_cfg = cfg.model_copy(update={"seed": cfg.seed + i + 1})
        seeds.append(run_cfg.seed)
        r = simulate(run_cfg, op_scale=scale, plain=False)    # its rows are never read
        runs.append(headline_metrics(r))
        if run_progress is not None:
            run_progress(i + 1, len(plans))
    env["runs"] = 1 + len(plans)
    env["seeds"] = seeds
    if method == "samples":
        env["percentiles"] = list(u.percentiles)
    env["metrics"] = envelope_of(metrics, runs, method, u.percentiles)
    result["envelope"] = env
    return result
