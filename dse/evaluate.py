"""One trial of a search: a configuration from the space, checked, simulated and scored.

Everything here is a pure function of its arguments, so a Ray worker can run it; nothing
talks to Optuna. The driver (`dse.runner`) calls `precheck` before dispatching, so an
undeployable configuration never costs a worker, and `evaluate` (through `run_trial`) in the
worker.
"""

from __future__ import annotations

import difflib
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from dse.space import (DECODE_COUNT_PATH, SERVING, FloatParam, IntParam, SearchSpace, apply,
                       on_grid, serving_mode)
from dse.study import Constraint, Objective, hourly_usd
from simcore import metric_catalog
from simcore.config import SimConfig, parse_config
from simcore.errors import ConfigError

if TYPE_CHECKING:
    from dse.study import StudyConfig

HEADLINE_METRICS = (
    "output_throughput", "output_throughput_per_gpu", "request_throughput", "p99_ttft_ms",
    "p99_tpot_ms", "mean_ttft_ms", "mean_tpot_ms", "num_gpus", "gpu_busy_fraction",
    "total_preemptions", "cost_per_million_output_tokens_usd", "step_time_relative_uncertainty",
)
"""Metrics every trial's `summary` carries (when the result has them), besides its objectives
and constraint metrics."""

DERIVED_METRICS = metric_catalog.dse_metrics()
"""Metrics computed here from the simulate result for every trial (output_throughput_per_gpu is
simcore's); `simcore.metric_catalog` declares them."""

CAPACITY_METRICS = metric_catalog.names_when("capacity")
"""Metrics a trial computes only when the study names one: `dse.capacity.find_capacity` on the
trial's configuration, under the study's latency upper bounds as SLOs (the default SLOs when it
has none): the highest sustainable request rate, per GPU, and requests per dollar at it."""

TREND_METRICS = metric_catalog.names_when("load_trend")
"""Metrics a result carries when its arrivals are spread over time and enough of them
(`simcore.saturation.load_trend`): at a finite request rate, under a ramp-up, on a trace's own
timestamps."""

DP_PATH = "parallelism.data_parallel_size"


@dataclass(frozen=True)
class EvalSpec:
    """What a trial needs to know of its study: how to score it and which GPU count is required."""

    objectives: tuple[Objective, ...]
    constraints: tuple[Constraint, ...] = ()
    num_gpus: int | None = None
    usd_per_gpu_hour: float = 2.5
    usd_per_gpu_hour_by_gpu: tuple[tuple[str, float], ...] = ()
    """Prices of named GPUs ((catalog name, USD per hour) pairs); others at usd_per_gpu_hour."""
    derive_dp: bool = False
    """With `num_gpus` set and DP not searched, DP = num_gpus / (TP x PP)."""
    derive_decode: bool = False
    """With `num_gpus` set and the decode instance count not searched, a disaggregated trial
    gets as many decode instances as the GPUs its prefill instances leave hold."""
    max_gpus: int | None = None
    """At most this many GPUs per configuration (the space's `max_gpus`)."""
    envelope: bool = False
    """Run the config's uncertainty method (perturbed re-runs) and keep every metric's envelope
    (the confirmation stage does; screening keeps the first-order one)."""

    @property
    def wants_capacity(self) -> bool:
        """Whether an objective or constraint names a capacity metric (a search per trial)."""
        return any(i.metric in CAPACITY_METRICS for i in (*self.objectives, *self.constraints))

    @classmethod
    def of(cls, study: "StudyConfig | EvalSpec") -> "EvalSpec":
        if isinstance(study, EvalSpec):
            return study
        n = study.space.num_gpus
        derive = n is not None and DP_PATH not in study.space.parameters
        return cls(objectives=tuple(study.objectives), constraints=tuple(study.constraints),
                   num_gpus=n, usd_per_gpu_hour=study.cost.usd_per_gpu_hour,
                   usd_per_gpu_hour_by_gpu=tuple(sorted(
                       study.cost.usd_per_gpu_hour_by_gpu.items())), derive_dp=derive,
                   derive_decode=n is not None and DECODE_COUNT_PATH not in study.space.parameters,
                   max_gpus=study.space.max_gpus)


@dataclass(frozen=True)
class TrialOutcome:
    """The result of one trial, small enough to send back from a worker.

    `status` is "complete" (simulated; `values` holds the objective values in study order and
    `constraints` Optuna's constraint value per SLO name, > 0 when violated), "infeasible" (the
    configuration cannot be deployed; `reason` says why in one sentence) or "failed" (the
    simulation raised or produced an unusable value; `reason` is the one-line message).
    """

    status: Literal["complete", "infeasible", "failed"]
    values: tuple[float, ...] = ()
    constraints: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    summary: dict[str, float] = field(default_factory=dict)
    violations: tuple[str, ...] = ()
    feasible: bool = False
    reason: str | None = None
    profile: str | None = None
    calibrated: bool | None = None
    explanation: dict | None = None
    explanation_error: str | None = None
    elapsed_s: float = 0.0
    envelopes: dict[str, list[float]] = field(default_factory=dict)
    """Metric -> [low, high] from perturbed re-runs (`EvalSpec.envelope`); empty otherwise."""
    envelope_method: str | None = None


# -- building and checking a trial's configuration -----------------------------------------------


def trial_mapping(base: dict, values: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict:
    """The base mapping with the parameter values, then the fidelity overrides, applied."""
    return apply(apply(base, dict(values)), dict(overrides))


def _strip_source(message: str, source: str) -> str:
    prefix = f"{source}: "
    return message[len(prefix):] if message.startswith(prefix) else message


def _check(base: dict, values: Mapping[str, Any], overrides: Mapping[str, Any],
           spec: EvalSpec) -> tuple[SimConfig | None, str | None]:
    """(config, None) if the configuration can be deployed, else (None, one-sentence reason)."""
    from simcore.setup import build_deployment

    source = "trial"
    try:
        cfg = parse_config(trial_mapping(base, values, overrides), source=source)
    except ConfigError as err:
        return None, _strip_source(str(err), source)
    par = cfg.parallelism
    tp, pp, dp = (par.tensor_parallel_size, par.pipeline_parallel_size,
                  par.data_parallel_size)
    if par.prefill_decode is not None:
        cfg, reason = _check_disaggregated(cfg, spec)
        if cfg is None:
            return None, reason
        try:
            deploy_check(cfg)
        except ConfigError as err:
            return None, str(err)
        return cfg, None
    if spec.derive_dp:
        if spec.num_gpus % (tp * pp):
            return None, (f"parallelism: TP x PP = {tp} x {pp} = {tp * pp} does not divide the "
                          f"space's num_gpus = {spec.num_gpus} into whole replicas")
        dp = spec.num_gpus // (tp * pp)
        cfg = cfg.model_copy(update={"parallelism": par.model_copy(
            update={"data_parallel_size": dp})})
    if spec.num_gpus is not None and tp * pp * dp != spec.num_gpus:
        return None, (f"parallelism: TP x PP x DP = {tp} x {pp} x {dp} = {tp * pp * dp} GPUs, "
                      f"but the space requires num_gpus = {spec.num_gpus}")
    used = cfg.parallelism.num_gpus_used
    if spec.max_gpus is not None and used > spec.max_gpus:
        return None, (f"parallelism: TP x PP x DP x replicas = {used} GPUs, but the space "
                      f"allows at most max_gpus = {spec.max_gpus}")
    try:
        build_deployment(cfg)
    except ConfigError as err:
        return None, str(err)
    return cfg, None


def _check_disaggregated(cfg: SimConfig, spec: EvalSpec) -> tuple[SimConfig | None, str | None]:
    """A disaggregated trial's GPU count against the space's: the decode instances derived
    from `num_gpus` where they are not searched, then exactly `num_gpus` or at most
    `max_gpus`; (config, None) or (None, why not)."""
    par = cfg.parallelism
    pd = par.prefill_decode
    pp = par.pipeline_parallel_size
    tp_p, tp_d = (par.role_tensor_parallel_size("prefill"),
                  par.role_tensor_parallel_size("decode"))
    if spec.num_gpus is not None and spec.derive_decode:
        left = spec.num_gpus - pd.num_prefill_instances * tp_p * pp
        per = tp_d * pp
        if left < per or left % per:
            return None, (f"parallelism.prefill_decode: {pd.num_prefill_instances} prefill "
                          f"instance{'s' if pd.num_prefill_instances > 1 else ''} of TP {tp_p} "
                          f"x PP {pp} leave {left} of the space's num_gpus = {spec.num_gpus}, "
                          f"not a whole number of decode instances of TP {tp_d} x PP {pp}")
        cfg = cfg.model_copy(update={"parallelism": par.model_copy(update={
            "prefill_decode": pd.model_copy(update={"num_decode_instances": left // per})})})
        par = cfg.parallelism
    used = par.num_gpus_used
    layout = _pd_layout(cfg)
    if spec.num_gpus is not None and used != spec.num_gpus:
        return None, (f"parallelism.prefill_decode: {layout} use {used} GPUs, but the space "
                      f"requires num_gpus = {spec.num_gpus}")
    if spec.max_gpus is not None and used > spec.max_gpus:
        return None, (f"parallelism.prefill_decode: {layout} use {used} GPUs, but the space "
                      f"allows at most max_gpus = {spec.max_gpus}")
    return cfg, None


def _pd_layout(cfg: SimConfig) -> str:
    par = cfg.parallelism
    pd = par.prefill_decode

    def on(role: str) -> str:
        gpu = par.role_gpu(role)
        return f" on {gpu}" if gpu else ""

    return (f"{pd.num_prefill_instances} prefill x TP {par.role_tensor_parallel_size('prefill')}"
            f"{on('prefill')} + {pd.num_decode_instances} decode x TP "
            f"{par.role_tensor_parallel_size('decode')}{on('decode')}"
            + (f" (PP {par.pipeline_parallel_size})" if par.pipeline_parallel_size > 1 else ""))


def deploy_check(cfg: SimConfig) -> None:
    """vLLM's start-up checks of a configuration (`simcore.setup.build_deployment`); with
    prefill/decode disaggregation, each role's deployment at its TP and the instances'
    placement on the cluster's nodes. Raises ConfigError."""
    from simcore.setup import build_deployment

    par = cfg.parallelism
    if par.prefill_decode is None:
        build_deployment(cfg)
        return
    if cfg.cluster is None:
        raise ConfigError("parallelism.prefill_decode: disaggregation moves KV caches over a "
                          "network; add a cluster section")
    from simcore.cluster.roles import build_role_deployments, check_layout
    if par.per_role:
        build_role_deployments(cfg)
    else:
        build_deployment(cfg)
    check_layout(cfg)


def resolve(base: dict, values: Mapping[str, Any], overrides: Mapping[str, Any],
            study: "StudyConfig | EvalSpec") -> tuple[str | None, str | None]:
    """(digest of the resolved configuration, None), or (None, why it cannot be deployed).

    Two proposals with one digest are the same simulation (a parameter set to its default, a
    conditional one that does not apply, DP derived from the GPU count): the driver simulates
    the first and answers the others from it. Cheap, as `precheck`."""
    import hashlib

    cfg, reason = _check(base, values, overrides, EvalSpec.of(study))
    if cfg is None:
        return None, reason
    return hashlib.sha256(cfg.model_dump_json().encode()).hexdigest(), None


def precheck(base: dict, values: Mapping[str, Any], overrides: Mapping[str, Any],
             study: "StudyConfig | EvalSpec") -> str | None:
    """Why this configuration cannot be deployed (one sentence), or None if it can.

    Cheap (no simulation): config validation, the space's GPU count (TP x PP x DP), and vLLM's
    start-up checks (TP divides the heads, the model fits, batch limits are consistent).
    """
    return _check(base, values, overrides, EvalSpec.of(study))[1]


# -- scoring a result ----------------------------------------------------------------------------


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def result_metrics(result: Mapping[str, Any], usd_per_gpu_hour: float,
                   usd_per_gpu_hour_by_gpu: Mapping[str, float] | None = None
                   ) -> dict[str, float]:
    """Every numeric top-level key of a simulate result, plus the per-GPU and per-cost ones.

    `output_tokens_per_dollar` = output_throughput x 3600 / the hourly cost of the result's
    GPUs (`num_gpus_by_type`, each type at its price in `usd_per_gpu_hour_by_gpu`, else
    `usd_per_gpu_hour`; a result without the breakdown: num_gpus x usd_per_gpu_hour);
    `cost_per_million_output_tokens_usd` is its inverse times 1e6 (inf with no output).
    """
    m = {k: float(v) for k, v in result.items() if _is_number(v)}
    n_gpus = m["num_gpus"]
    if n_gpus > 0:
        if "request_throughput" in m:
            m["request_throughput_per_gpu"] = m["request_throughput"] / n_gpus
        if "output_throughput" in m:
            by_type = result.get("num_gpus_by_type") or {"": n_gpus}
            hourly = hourly_usd(by_type, usd_per_gpu_hour, usd_per_gpu_hour_by_gpu)
            per_dollar = m["output_throughput"] * 3600 / hourly
            m["output_tokens_per_dollar"] = per_dollar
            m["cost_per_million_output_tokens_usd"] = (1e6 / per_dollar if per_dollar > 0
                                                       else math.inf)
    unc = result["provenance"]["step_time_relative_uncertainty"]
    if _is_number(unc):
        m["step_time_relative_uncertainty"] = float(unc)
    return m


def _close_matches(name: str, known: set[str]) -> str:
    close = difflib.get_close_matches(name, sorted(known), n=4, cutoff=0.6)
    if close:
        return f"did you mean {', '.join(close)}?"
    return "e.g. p99_ttft_ms, p99_tpot_ms, output_throughput_per_gpu, output_tokens_per_dollar"


def check_metric_names(spec: EvalSpec, known: set[str],
                       where: str = "the study's base (with its screen overrides)") -> None:
    """Raise ConfigError naming the first objective or constraint whose metric is not known
    (`known`, the metrics of `where`'s result), and the condition under which a result carries
    it where the catalog has one."""
    for field_name, items in (("objectives", spec.objectives), ("constraints", spec.constraints)):
        for i, item in enumerate(items):
            if item.metric not in known:
                from simcore.metric_catalog import CONDITIONS, lookup

                entry = lookup(item.metric)
                if entry is not None and entry.when != "always":
                    raise ConfigError(f"{field_name}[{i}].metric: {item.metric!r} is reported "
                                      f"only {CONDITIONS[entry.when]}, which {where} does "
                                      f"not meet")
                raise ConfigError(f"{field_name}[{i}].metric: {item.metric!r} is not a numeric "
                                  f"metric of the result ({_close_matches(item.metric, known)})")


def violation_text(c: Constraint, x: float) -> str:
    """A violated SLO in plain form, e.g. 'p99_tpot_ms = 63.2 > 50'."""
    broken = {"<=": ">", "<": ">=", ">=": "<", ">": "<="}[c.op]
    return f"{c.metric} = {x:.4g} {broken} {c.value:g}"


def score(result: Mapping[str, Any], spec: EvalSpec, *, elapsed_s: float = 0.0,
          explanation: dict | None = None, explanation_error: str | None = None) -> TrialOutcome:
    """Turn a simulate result into a trial outcome: objective values, SLO values, summary.

    A metric named by an objective or constraint that the result lacks raises ConfigError; a
    non-finite objective or constraint metric makes the trial "failed" (Optuna cannot rank it).
    """
    metrics = result_metrics(result, spec.usd_per_gpu_hour, dict(spec.usd_per_gpu_hour_by_gpu))
    check_metric_names(spec, set(metrics), "this trial's configuration")
    prov = result["provenance"]
    common = dict(profile=prov["compute_profile"], calibrated=prov["calibrated"],
                  elapsed_s=elapsed_s)
    for item in (*spec.objectives, *spec.constraints):
        if not math.isfinite(metrics[item.metric]):
            return TrialOutcome(status="failed", reason=f"{item.metric} is "
                                f"{metrics[item.metric]} (no usable value to rank)", **common)
    values = tuple(metrics[o.metric] for o in spec.objectives)
    constraints = {str(c): c.violation(metrics[c.metric]) for c in spec.constraints}
    violations = tuple(violation_text(c, metrics[c.metric]) for c in spec.constraints
                       if not c.met(metrics[c.metric]))
    wanted = [o.metric for o in spec.objectives] + [c.metric for c in spec.constraints]
    wanted += [k for k in HEADLINE_METRICS if k not in wanted]
    summary = {k: metrics[k] for k in wanted if k in metrics and math.isfinite(metrics[k])}
    finite = {k: v for k, v in metrics.items() if math.isfinite(v)}
    env = result["envelope"] if "envelope" in result else None   # simulate_with_envelope's
    envelopes = {k: [e["low"], e["high"]] for k, e in (env["metrics"] if env else {}).items()
                 if math.isfinite(e["low"]) and math.isfinite(e["high"])}
    return TrialOutcome(status="complete", values=values, constraints=constraints,
                        metrics=finite, summary=summary, violations=violations,
                        feasible=not violations, explanation=explanation,
                        explanation_error=explanation_error, envelopes=envelopes,
                        envelope_method=env["method"] if envelopes else None, **common)


def _explain(result: dict) -> tuple[dict | None, str | None]:
    """`dse.explain.explain(result)` when that module exists; (explanation, error message)."""
    try:
        from dse.explain import explain
    except ImportError:
        return None, None
    try:
        return explain(result), None
    except Exception as err:  # an explanation bug must not cost the trial its metrics
        return None, one_line(err)


# -- the trial itself ----------------------------------------------------------------------------


def capacity_metrics(cfg: SimConfig, spec: EvalSpec, num_gpus: int) -> dict[str, float]:
    """`CAPACITY_METRICS` of a trial's configuration (see there)."""
    from dse.capacity import find_capacity, latency_upper_bounds

    cap = find_capacity(cfg, latency_upper_bounds(spec.constraints), envelope=False)
    return {"max_sustainable_rate": cap.rate,
            "max_sustainable_rate_per_gpu": cap.rate / num_gpus,
            "max_sustainable_requests_per_dollar": cap.rate * 3600 / hourly_usd(
                cfg.gpus_by_type(), spec.usd_per_gpu_hour, dict(spec.usd_per_gpu_hour_by_gpu))}



def evaluate(base: dict, values: Mapping[str, Any], overrides: Mapping[str, Any],
             study: "StudyConfig | EvalSpec") -> TrialOutcome:
    """Run one trial: apply values and overrides to `base`, check, simulate, score.

    An undeployable configuration is an "infeasible" outcome with its reason, never an
    exception; a simulation that raises propagates (see `run_trial`).
    """
    from simcore.simulate import simulate
    from simcore.uncertainty import simulate_with_envelope

    spec = EvalSpec.of(study)
    t0 = time.perf_counter()
    cfg, reason = _check(base, values, overrides, spec)
    if cfg is None:
        return TrialOutcome(status="infeasible", reason=reason,
                            elapsed_s=time.perf_counter() - t0)
    result = simulate_with_envelope(cfg) if spec.envelope else simulate(cfg)
    if spec.wants_capacity:
        result = {**result, **capacity_metrics(cfg, spec, result["num_gpus"])}
    explanation, explanation_error = _explain(result)
    return score(result, spec, elapsed_s=time.perf_counter() - t0, explanation=explanation,
                 explanation_error=explanation_error)


def clip(text: str, limit: int = 400) -> str:
    """The first line of `text`, cut to `limit` characters (an ellipsis marks the cut)."""
    text = text.strip().splitlines()[0] if text.strip() else ""
    return text if len(text) <= limit else text[:limit - 3] + "..."


def one_line(err: BaseException) -> str:
    """An exception as one line: a ConfigError's own sentence, else 'Type: first line'."""
    text = clip(str(err))
    if not isinstance(err, ConfigError):
        text = clip(f"{type(err).__name__}: {text}" if text else type(err).__name__)
    return text


def run_trial(base: dict, values: Mapping[str, Any], overrides: Mapping[str, Any],
              study: "StudyConfig | EvalSpec") -> TrialOutcome:
    """`evaluate`, with any exception turned into a "failed" outcome carrying its message."""
    t0 = time.perf_counter()
    try:
        return evaluate(base, values, overrides, study)
    except Exception as err:
        return TrialOutcome(status="failed", reason=one_line(err),
                            elapsed_s=time.perf_counter() - t0)


# -- study-level helpers -------------------------------------------------------------------------


def metric_names(base: dict, overrides: Mapping[str, Any]) -> set[str]:
    """The numeric metric names a trial of this base configuration (with the overrides) will
    report (`static_metric_names`); none when the configuration does not validate or its
    workload's data cannot be read."""
    try:
        return static_metric_names(parse_config(trial_mapping(base, {}, overrides)))
    except ConfigError:
        return set()


def static_metric_names(cfg: SimConfig) -> set[str]:
    """The numeric metric names a trial of `cfg` reports: the simulate result's, the ones
    `result_metrics` derives and the capacity ones a study may name, from
    `simcore.metric_catalog` (nothing is simulated)."""
    return metric_catalog.metric_names(cfg, dse=True)


def baseline_values(base: dict, space: SearchSpace) -> tuple[dict[str, Any] | None, str | None]:
    """The base configuration's own value of every active parameter, or (None, why not).

    Values come from the base mapping with the simulate defaults filled in; a default that
    vLLM resolves per GPU (max_num_seqs, max_num_batched_tokens) is resolved as simcore does.
    The baseline must lie in the space (Optuna cannot record a value outside a distribution).
    """
    from simcore.setup import build_deployment

    try:
        cfg = parse_config(base)
    except ConfigError as err:
        return None, str(err)
    dumped = cfg.model_dump()
    resolved: dict[str, Any] = {}
    try:
        dep = build_deployment(cfg)
        resolved = {"engine.max_num_seqs": dep.max_num_seqs,
                    "engine.max_num_batched_tokens": dep.max_num_batched_tokens,
                    "model.max_model_len": dep.max_model_len}
    except ConfigError:
        pass
    values: dict[str, Any] = {}
    mode = serving_mode(base)
    for path, p in space.active(base).items():
        if path == SERVING:
            if mode not in p.choices:
                return None, f"serving = {mode} is not one of the choices {list(p.choices)}"
            values[path] = mode
            continue
        if p.when in ("aggregated", "disaggregated") and p.when != mode:
            continue
        node: Any = dumped
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is None:
            node = resolved.get(path)
        problem = _outside(p, node)
        if problem:
            return None, f"{path} = {node!r} {problem}"
        values[path] = node
    return values, None


def _outside(p: Any, v: Any) -> str | None:
    if isinstance(p, IntParam):
        if not _is_number(v) or int(v) != v:
            return "is not an integer"
        if not p.low <= v <= p.high or (v - p.low) % p.step:
            return f"is outside the space ({p.low}..{p.high}, step {p.step})"
    elif isinstance(p, FloatParam):
        if not _is_number(v):
            return "is not a number"
        if not p.low <= v <= p.high:
            return f"is outside the space ({p.low:g}..{p.high:g})"
        if p.step is not None and not on_grid(v, p.low, p.step):
            return f"is off the space's grid ({p.low:g}..{p.high:g}, step {p.step:g})"
    elif not any(type(v) is type(c) and v == c for c in p.choices):
        return f"is not one of the choices {list(p.choices)}"
    return None
