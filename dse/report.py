"""The study report: the Pareto set with its envelopes and explanations, and every trial ranked.

A study in Optuna storage becomes a `StudyReport` (`build_report`), rendered as a self-contained
HTML page (plots need no network), Markdown, CSV (one row per trial) and JSON (`write_report`).
The report, not Optuna's `best_trials`, is authoritative on feasibility: a configuration counts
as feasible only if its trial completed, the runner marked it feasible, every Optuna constraint
value is <= 0 and every SLO of the study holds on its metrics. Configurations are ranked at the
screening fidelity, where all were measured; a confirmation re-run at a higher fidelity is shown
beside its screening run, and one that misses an SLO makes its configuration infeasible.
"""

from __future__ import annotations

import csv
import html
import io
import json
import math
import re
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from itertools import combinations
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dse.pareto import pareto_ranks
from dse.study import Constraint, Objective
from simcore.errors import ConfigError

if TYPE_CHECKING:
    import optuna
    import plotly.graph_objects as go

    from dse.study import StudyConfig

FILE_NAMES = {"html": "report.html", "md": "report.md", "csv": "trials.csv",
              "json": "report.json"}
# Hypervolume reference point: this fraction of the feasible range beyond the worst value.
REFERENCE_MARGIN = 0.1
_NOT_HEADLINE = {"step_time_relative_uncertainty"}
_UNCERTAINTY_RE = re.compile(r"(?:±|\+/-)\s*(\d+(?:\.\d+)?)\s*%")


# ---------------------------------------------------------------------------------------------
# Storage

def redact_url(url: str) -> str:
    """The storage URL with any password replaced by ***, fit to print."""
    return re.sub(r"(://[^:/@]+:)[^@]*@", r"\1***@", url)


def open_existing_storage(url: str) -> optuna.storages.BaseStorage:
    """Open a storage a search has written (sqlite:///, journal:///path.log or an RDB URL).

    Unlike `dse.backends.open_storage`, which it uses, it creates nothing: a sqlite or journal
    file that does not exist is a ConfigError.
    """
    from dse.backends import open_storage

    for scheme in ("journal://", "sqlite:///"):
        if url.startswith(scheme):
            path = Path(url[len(scheme):])
            if str(path) != ":memory:" and not path.is_file():
                raise ConfigError(f"storage {url}: no file at {path}; run `dse search` first")
    return open_storage(url)


# ---------------------------------------------------------------------------------------------
# Envelopes

def metric_scaling(metric: str) -> int:
    """How a metric moves with step time: +1 proportionally (latencies, cost per token), -1
    inversely (throughputs, tokens per dollar), 0 not simply (counts, fractions)."""
    if metric.endswith("_ms") or metric.endswith("_s") or "cost_per" in metric:
        return 1
    if "throughput" in metric or "goodput" in metric or "per_dollar" in metric \
            or metric.endswith("_per_s"):
        return -1
    return 0


def envelope(metric: str, value: float, relative_uncertainty: float | None
             ) -> tuple[float, float] | None:
    """The range of `metric` if every step time is off by up to ±relative_uncertainty.

    First order: latencies scale with step time, throughputs with its inverse. Queueing can
    amplify latency beyond this near saturation, so the range is a guide, not a bound.
    """
    u = relative_uncertainty
    scaling = metric_scaling(metric)
    if u is None or u <= 0 or scaling == 0 or not math.isfinite(value):
        return None
    if scaling > 0:
        return value * (1 - u), value * (1 + u)
    return value / (1 + u), (value / (1 - u) if u < 1 else math.inf)


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


# ---------------------------------------------------------------------------------------------
# The report's data

@dataclass(frozen=True)
class Measurement:
    """One simulation of a configuration at one fidelity, read from its Optuna trial."""

    study_name: str
    number: int
    fidelity: str
    state: str
    values: tuple[float, ...] | None
    metrics: dict[str, float]
    summary: dict[str, float]
    feasible: bool
    reasons: tuple[str, ...]
    constraint_values: dict[str, float]
    explanation: dict[str, Any] | None
    profile: str | None
    calibrated: bool | None
    relative_uncertainty: float | None

    @property
    def complete(self) -> bool:
        return self.state == "COMPLETE"

    def value_of(self, metric: str) -> float | None:
        """A metric of this run, from its metrics, else its summary; None if absent."""
        v = self.metrics.get(metric, self.summary.get(metric))
        return float(v) if _number(v) is not None else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "study": self.study_name, "number": self.number, "fidelity": self.fidelity,
            "state": self.state, "values": list(self.values) if self.values else None,
            "feasible": self.feasible, "reasons": list(self.reasons),
            "constraints": self.constraint_values, "metrics": self.metrics,
            "summary": self.summary, "explanation": self.explanation, "profile": self.profile,
            "calibrated": self.calibrated, "relative_uncertainty": self.relative_uncertainty,
        }


@dataclass(frozen=True)
class Configuration:
    """A configuration the search proposed (one trial of the main study) and all known of it.

    `screen` is that trial; `confirm` the latest re-run at the confirmation fidelity, if any.
    Configurations are compared at the screening fidelity, where every one was measured:
    `rank` is the non-dominated rank of the screen values among feasible configurations
    (1 = Pareto set), None when infeasible. Feasible needs the screen run to be feasible and,
    when a confirmation run completed, that run too. `confirm_rank` ranks the confirmed
    feasible configurations among themselves on their confirmation values.
    """

    number: int
    params: dict[str, Any]
    distributions: dict[str, Any]
    baseline: bool
    screen: Measurement
    confirm: Measurement | None = None
    rank: int | None = None
    confirm_rank: int | None = None

    @property
    def values(self) -> tuple[float, ...] | None:
        return self.screen.values

    @property
    def confirmed(self) -> bool:
        return self.confirm is not None and self.confirm.complete

    @property
    def feasible(self) -> bool:
        return (self.screen.complete and self.screen.feasible
                and (not self.confirmed or self.confirm.feasible))

    @property
    def fidelity(self) -> str:
        return "screen + confirm" if self.confirmed else self.screen.fidelity

    @property
    def reasons(self) -> tuple[str, ...]:
        """Why it is not feasible, and why a confirmation run failed, labelled as such."""
        out = self.screen.reasons
        if self.confirm is not None and (not self.confirm.complete or not self.confirm.feasible):
            label = ("at confirm fidelity" if self.confirm.complete
                     else "confirmation run failed")
            out += tuple(f"{label}: {r}" for r in self.confirm.reasons)
        return out

    @property
    def latest(self) -> Measurement:
        """The most trusted run: the confirmation when it completed, else the screen."""
        return self.confirm if self.confirmed else self.screen

    @property
    def explanation(self) -> dict[str, Any] | None:
        return self.latest.explanation or self.screen.explanation


@dataclass(frozen=True)
class StudyReport:
    """Everything the report files show, built once from storage by `build_report`."""

    study_name: str
    storage: str
    objectives: tuple[Objective, ...]
    constraints: tuple[Constraint, ...]
    configurations: tuple[Configuration, ...]
    reference_point: tuple[float, ...] | None
    notes: tuple[str, ...]
    generated_at: str
    view: Any = field(repr=False, compare=False)   # optuna.Study for Optuna's plots

    def _by_first_objective(self, configs: Iterable[Configuration]) -> list[Configuration]:
        sign = 1.0 if self.objectives[0].direction == "minimize" else -1.0
        return sorted(configs, key=lambda c: (sign * c.values[0], c.number))

    @property
    def pareto(self) -> list[Configuration]:
        """The Pareto set, ordered by the first objective (best first)."""
        return self._by_first_objective(c for c in self.configurations if c.rank == 1)

    @property
    def feasible(self) -> list[Configuration]:
        """Feasible configurations by rank, then trial number."""
        return sorted((c for c in self.configurations if c.rank is not None),
                      key=lambda c: (c.rank, c.number))

    @property
    def not_feasible(self) -> list[Configuration]:
        return [c for c in self.configurations if c.rank is None]

    @property
    def confirmed(self) -> list[Configuration]:
        """Configurations with a confirmation run (completed or not), by confirm rank."""
        return sorted((c for c in self.configurations if c.confirm is not None),
                      key=lambda c: (c.confirm_rank is None, c.confirm_rank or 0, c.number))

    @property
    def baseline(self) -> Configuration | None:
        return next((c for c in self.configurations if c.baseline), None)

    def headline_metrics(self, config: Configuration | None = None) -> list[str]:
        """Objectives, then SLO metrics, then the runner's summary keys, without repeats."""
        names = [o.metric for o in self.objectives] + [c.metric for c in self.constraints]
        if config is not None:
            names += list(config.screen.summary) + list(config.latest.summary)
        # The uncertainty is shown with the profile, not as a metric.
        return [n for n in dict.fromkeys(names) if n not in _NOT_HEADLINE]

    def envelope_overlaps(self) -> list[dict[str, Any]]:
        """For each pair of Pareto configurations, the objectives whose envelopes overlap."""
        out = []
        for a, b in combinations(self.pareto, 2):
            overlapping, separate = [], []
            for i, o in enumerate(self.objectives):
                ea = envelope(o.metric, a.values[i], a.screen.relative_uncertainty)
                eb = envelope(o.metric, b.values[i], b.screen.relative_uncertainty)
                if ea is None or eb is None:
                    continue
                (overlapping if _overlap(ea, eb) else separate).append(o.metric)
            if overlapping or separate:
                out.append({"a": a.number, "b": b.number, "overlapping": overlapping,
                            "separate": separate})
        return out

    def counts(self) -> dict[str, int]:
        states: dict[str, int] = {}
        for c in self.configurations:
            states[c.screen.state.lower()] = states.get(c.screen.state.lower(), 0) + 1
        return {"trials": len(self.configurations), "feasible": len(self.feasible),
                "pareto": len(self.pareto),
                "confirmed": sum(1 for c in self.configurations if c.confirmed),
                **dict(sorted(states.items()))}


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def _relative_uncertainty(attrs: dict[str, Any], metrics: dict[str, float]) -> float | None:
    """The step-time uncertainty a run declares: a number, or ±N% in its profile/assumptions."""
    prov = attrs.get("provenance")
    for v in (metrics.get("step_time_relative_uncertainty"),
              attrs.get("step_time_relative_uncertainty"), attrs.get("relative_uncertainty"),
              prov.get("step_time_relative_uncertainty") if isinstance(prov, dict) else None):
        if _number(v) is not None:
            return float(v)
    texts = [attrs.get("profile")]
    expl = attrs.get("explanation")
    if isinstance(expl, dict):
        texts += list(expl.get("assumptions") or [])
    for t in texts:
        m = _UNCERTAINTY_RE.search(t) if isinstance(t, str) else None
        if m:
            return float(m.group(1)) / 100
    return None


def _mentions(reasons: Sequence[str], key: str) -> bool:
    """Whether a reason already speaks of this constraint ('p99_tpot_ms <= 50') or metric."""
    metric = key.split()[0] if key.split() else key
    return any(key in r or metric in r for r in reasons)


def _measurement(trial: optuna.trial.FrozenTrial, study_name: str,
                 constraints: Sequence[Constraint], default_fidelity: str) -> Measurement:
    a = trial.user_attrs
    metrics = {k: float(v) for k, v in (a.get("metrics") or {}).items()
               if _number(v) is not None}
    summary = {k: float(v) for k, v in (a.get("summary") or {}).items()
               if _number(v) is not None}
    state = trial.state.name
    reasons = [str(r) for r in (a.get("violations") or [])]
    cvalues = {k: float(v) for k, v in trial.constraints.items()}
    if state == "COMPLETE":
        feasible = a.get("feasible", True) is not False
        for c in constraints:
            x = metrics.get(c.metric, summary.get(c.metric))
            if x is not None and not c.met(x):
                feasible = False
                if not _mentions(reasons, c.metric):
                    reasons.append(f"{c} not met ({c.metric} = {_fmt(x)})")
        for key, v in cvalues.items():
            if v > 0:
                feasible = False
                if not _mentions(reasons, key):
                    reasons.append(f"constraint {key} violated by {_fmt(v)}")
        if not feasible and not reasons:
            reasons.append("marked infeasible by the runner")
    else:
        feasible = False
        for key in ("infeasible_reason", "failure_reason"):
            if a.get(key):
                reasons.append(str(a[key]))
        if not reasons:
            reasons.append({"RUNNING": "still running, or left running by an interrupted search",
                            "WAITING": "queued, not yet run",
                            "PRUNED": "pruned"}.get(state, "failed (no reason recorded)"))
    expl = a.get("explanation")
    return Measurement(
        study_name=study_name, number=trial.number,
        fidelity=str(a.get("fidelity") or default_fidelity), state=state,
        values=tuple(float(x) for x in trial.values) if trial.values is not None else None,
        metrics=metrics, summary=summary, feasible=feasible,
        reasons=tuple(dict.fromkeys(reasons)), constraint_values=cvalues,
        explanation=expl if isinstance(expl, dict) else None,
        profile=a.get("profile"), calibrated=a.get("calibrated"),
        relative_uncertainty=_relative_uncertainty(a, metrics))


def _reference_point(values: np.ndarray, directions: Sequence[str]) -> tuple[float, ...]:
    """Worst feasible value per objective, pushed REFERENCE_MARGIN of the range further out."""
    lo, hi = values.min(axis=0), values.max(axis=0)
    ref = []
    for d, low, high in zip(directions, lo, hi):
        span = high - low
        margin = REFERENCE_MARGIN * (span if span > 0 else max(abs(high), 1.0))
        ref.append(float(high + margin) if d == "minimize" else float(low - margin))
    return tuple(ref)


def _ranked(configs: list[Configuration], idx: list[int], values: Callable[[Configuration], Any],
            directions: list[str], attr: str) -> np.ndarray:
    """Set `attr` of configs[idx] to their non-dominated rank on `values`; returns the values."""
    vals = np.array([values(configs[i]) for i in idx], dtype=float)
    for i, r in zip(idx, pareto_ranks(vals, directions)):
        configs[i] = replace(configs[i], **{attr: int(r)})
    return vals


@contextmanager
def _optuna_quiet() -> Iterator[None]:
    """Optuna without its INFO lines and experimental-feature warnings, restored after."""
    import optuna

    before = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            yield
    finally:
        optuna.logging.set_verbosity(before)


def build_report(storage_url: str, study_name: str, objectives: Sequence[Objective],
                 constraints: Sequence[Constraint] = (), *,
                 confirm_study_name: str | None = None) -> StudyReport:
    """Read a study (and its confirmation study, if stored) and rank its configurations.

    `objectives` must match the stored study's directions. `confirm_study_name` defaults to
    f"{study_name}/confirm"; its trials name the screened trial they re-run in the
    `confirms_trial` user attribute. Raises ConfigError when the study is not in the storage.
    """
    import optuna

    objectives = tuple(objectives)
    constraints = tuple(constraints)
    directions = [o.direction for o in objectives]
    storage = open_existing_storage(storage_url)
    names = {s.study_name for s in storage.get_all_studies()}
    if study_name not in names:
        raise ConfigError(f"no study named {study_name!r} in {redact_url(storage_url)}; "
                          f"run `dse search` first")
    with _optuna_quiet():
        study = optuna.load_study(study_name=study_name, storage=storage)
    stored = [d.name.lower() for d in study.directions]
    if stored != directions:
        raise ConfigError(f"study {study_name!r}: stored directions {stored} do not match the "
                          f"objectives {[f'{o.metric} {o.direction}' for o in objectives]}")

    confirms: dict[int, list[Measurement]] = {}
    confirm_name = confirm_study_name or f"{study_name}/confirm"
    if confirm_name in names:
        with _optuna_quiet():
            cstudy = optuna.load_study(study_name=confirm_name, storage=storage)
        for t in cstudy.get_trials(deepcopy=False):
            target = t.user_attrs.get("confirms_trial")
            if isinstance(target, int):
                confirms.setdefault(target, []).append(
                    _measurement(t, confirm_name, constraints, "confirm"))

    configs = []
    for t in study.get_trials(deepcopy=False):
        runs = confirms.get(t.number, [])
        complete = [m for m in runs if m.complete]
        configs.append(Configuration(
            number=t.number, params=dict(t.params), distributions=dict(t.distributions),
            baseline=bool(t.user_attrs.get("baseline", False)),
            screen=_measurement(t, study_name, constraints, "screen"),
            confirm=(complete or runs or [None])[-1]))

    notes = []
    reference = None
    feasible = [i for i, c in enumerate(configs) if c.feasible]
    if feasible:
        vals = _ranked(configs, feasible, lambda c: c.values, directions, "rank")
        if len(objectives) > 1:
            reference = _reference_point(vals, directions)
            notes.append(
                "Hypervolume reference point: the worst feasible value of each objective, "
                f"{REFERENCE_MARGIN:.0%} of its feasible range further out ("
                + ", ".join(f"{o.metric} {_fmt(x)}" for o, x in zip(objectives, reference))
                + ").")
    else:
        notes.append("No configuration is feasible: there is no Pareto set.")
    confirmed = [i for i in feasible if configs[i].confirmed]
    if confirmed:
        _ranked(configs, confirmed, lambda c: c.confirm.values, directions, "confirm_rank")
    if confirms:
        notes.append("Ranks compare configurations at the screening fidelity, where all were "
                     "measured; one whose confirmation run misses an SLO is infeasible. "
                     "Confirmation values are shown beside the screening ones, and ranked "
                     "among the confirmed configurations only.")
    notes.append("Feasible means: the trial completed, the runner marked it feasible, no "
                 "Optuna constraint value is positive, and every SLO holds on its metrics. "
                 "This report is authoritative: optuna-dashboard's best-trials list ignores "
                 "the constraints.")
    if any(c.screen.relative_uncertainty for c in configs):
        notes.append("Envelopes: every step time off by up to the profile's declared ± "
                     "uncertainty; latencies and costs scale with it, throughputs with its "
                     "inverse (first order: queueing near saturation can widen latency "
                     "further). The error is largely shared by configurations on the same "
                     "profile, so overlapping envelopes mean the numbers alone do not settle "
                     "the order.")

    return StudyReport(
        study_name=study_name, storage=redact_url(storage_url), objectives=objectives,
        constraints=constraints, configurations=tuple(configs), reference_point=reference,
        notes=tuple(notes), generated_at=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        view=_view_study(configs, directions))


def _view_study(configs: Sequence[Configuration], directions: list[str]) -> optuna.Study:
    """An in-memory copy of the study carrying the report's feasibility, for Optuna's plots.

    Trials are added in number order, so its trial numbers are the main study's.
    """
    import optuna
    from optuna.trial import TrialState, create_trial

    with _optuna_quiet():
        view = optuna.create_study(storage=optuna.storages.InMemoryStorage(),
                                   directions=directions)
    for c in configs:
        if c.screen.complete and c.values is not None:
            t = create_trial(values=list(c.values), params=c.params,
                             distributions=c.distributions,
                             user_attrs={"fidelity": c.fidelity},
                             constraints={"slo": 0.0 if c.feasible else 1.0})
        else:
            t = create_trial(state=TrialState.FAIL, params=c.params,
                             distributions=c.distributions)
        view.add_trial(t)
    return view


def write_report(study: StudyConfig, *, storage: str | None = None,
                 out_dir: Path | None = None) -> dict[str, Path]:
    """Build the report of `study` and write its formats (study.report.formats) to `out_dir`.

    Defaults: the study's storage URL and report folder. Returns {format: path written}.
    """
    report = build_report(storage or study.storage_url, study.name, study.objectives,
                          study.constraints)
    return write_report_files(report, out_dir or study.report_dir, study.report.formats)


def write_report_files(report: StudyReport, out_dir: Path,
                       formats: Iterable[str] = tuple(FILE_NAMES)) -> dict[str, Path]:
    """Write the chosen formats (html, md, csv, json) of `report` into `out_dir`."""
    renderers: dict[str, Callable[[StudyReport], str]] = {
        "html": render_html, "md": render_markdown, "csv": render_csv,
        "json": lambda r: json.dumps(report_json(r), indent=1, allow_nan=False)}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = {}
    for fmt in formats:
        if fmt not in renderers:
            raise ConfigError(f"report.formats: unknown format {fmt!r} "
                              f"(known: {', '.join(FILE_NAMES)})")
        path = out_dir / FILE_NAMES[fmt]
        path.write_text(renderers[fmt](report), encoding="utf-8")
        written[fmt] = path
    return written


# ---------------------------------------------------------------------------------------------
# Figures

@dataclass(frozen=True)
class Figure:
    """One plot of the page, or the note saying why it is absent."""

    title: str
    figure: Any | None     # plotly.graph_objects.Figure
    note: str = ""


def _quiet(fn: Callable[[], go.Figure]) -> go.Figure:
    """Run a plotting call without Optuna's log lines and its evaluators' advisory warnings."""
    with _optuna_quiet(), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return fn()


def figures(report: StudyReport) -> list[Figure]:
    """The page's plots: Pareto front, hypervolume history, parallel coordinates, importance."""
    from optuna import visualization as vis

    study = report.view
    names = [o.metric for o in report.objectives]
    n_obj = len(names)
    out: list[Figure] = []
    n_complete = sum(1 for c in report.configurations if c.screen.complete)

    if n_obj == 1:
        out.append(Figure("Objective history",
                          _quiet(lambda: vis.plot_optimization_history(study, target_name=names[0]))
                          if n_complete else None,
                          "One objective: the Pareto set is the best feasible value."))
    elif not n_complete:
        out.append(Figure("Pareto front", None, "No trial completed."))
    elif n_obj in (2, 3):
        out.append(Figure("Pareto front", _quiet(
            lambda: vis.plot_pareto_front(study, target_names=names)),
            "Grey: infeasible configurations; blue: feasible; red ('Best Trial'): the Pareto "
            "set. Shades give the trial number."))
    else:
        for i, j in combinations(range(n_obj), 2):
            out.append(Figure(f"Pareto front: {names[i]} vs {names[j]}", _quiet(
                lambda i=i, j=j: vis.plot_pareto_front(
                    study, target_names=[names[i], names[j]],
                    targets=lambda t: (t.values[i], t.values[j]))),
                "Pareto set over all objectives, projected on two."))

    if n_obj > 1:
        if report.reference_point is None:
            out.append(Figure("Hypervolume history", None, "No feasible configuration."))
        else:
            fig = _quiet(lambda: vis.plot_hypervolume_history(study, report.reference_point))
            ref = ", ".join(f"{n} {_fmt(x)}" for n, x in zip(names, report.reference_point))
            final = fig.data[0].y[-1] if fig.data and len(fig.data[0].y) else 0.0
            out.append(Figure("Hypervolume history", fig,
                              f"Reference point: {ref} (worst feasible values, "
                              f"{REFERENCE_MARGIN:.0%} of the range further out). Final "
                              f"hypervolume {_fmt(float(final))}."))

    params = sorted({p for c in report.configurations for p in c.params})
    for i, o in enumerate(report.objectives):
        title = f"Parallel coordinates: {o.metric}" if n_obj > 1 else "Parallel coordinates"
        if not params or not n_complete:
            out.append(Figure(title, None, "No completed trial with parameters."))
            continue
        out.append(Figure(title, _quiet(lambda i=i, o=o: vis.plot_parallel_coordinate(
            study, target=lambda t: t.values[i], target_name=o.metric)),
            "Dotted lines are infeasible configurations."))

    out.append(_importance_figure(report, params, n_complete))
    return out


_MIN_TRIALS_FOR_IMPORTANCE = 4


def _importance_figure(report: StudyReport, params: list[str], n_complete: int) -> Figure:
    """Optuna's parameter importance per objective, or a note when it cannot be computed.

    The importances are Optuna's (`get_param_importances`); the bars are drawn here so that all
    objectives share one chart.
    """
    import plotly.graph_objects as go
    from optuna.importance import get_param_importances

    title = "Parameter importance"
    if n_complete < _MIN_TRIALS_FOR_IMPORTANCE or not params:
        return Figure(title, None, f"Needs at least {_MIN_TRIALS_FOR_IMPORTANCE} completed "
                      f"trials with varying parameters ({n_complete} completed).")
    fig = go.Figure()
    failed = []
    for i, o in enumerate(report.objectives):
        # Optuna's evaluator ranks parameters for reaching low target values.
        sign = 1.0 if o.direction == "minimize" else -1.0
        try:
            imp = _quiet(lambda i=i, sign=sign: get_param_importances(
                report.view, target=lambda t: sign * t.values[i]))
        except (ValueError, RuntimeError, ZeroDivisionError) as err:
            failed.append(f"{o.metric}: {err}")
            continue
        if not imp:
            failed.append(f"{o.metric}: no parameter varies")
            continue
        names = list(imp)[::-1]
        fig.add_trace(go.Bar(x=[imp[n] for n in names], y=names, orientation="h",
                             name=o.metric))
    if not fig.data:
        return Figure(title, None, "Could not be computed: " + "; ".join(failed))
    fig.update_layout(title="Parameter importance", xaxis_title="importance",
                      barmode="group", height=max(320, 60 + 40 * len(params) * len(fig.data)))
    note = "Optuna's default importance evaluator, per objective (sign-adjusted for maximised " \
           "objectives)."
    if failed:
        note += " Not computed for " + "; ".join(failed) + "."
    return Figure(title, fig, note)


# ---------------------------------------------------------------------------------------------
# Formatting helpers

def _fmt(x: Any) -> str:
    """A number as people read it: ints plain, large floats with separators, small ones 4 digits."""
    if isinstance(x, bool) or x is None:
        return "" if x is None else str(x)
    if isinstance(x, int):
        return f"{x:,}" if abs(x) >= 10000 else str(x)
    if isinstance(x, float):
        if not math.isfinite(x):
            return str(x)
        if x == int(x) and abs(x) < 1e15:
            return _fmt(int(x))
        if abs(x) >= 1000:
            return f"{x:,.0f}"
        if abs(x) >= 100:
            return f"{x:.1f}"
        return f"{x:.4g}"
    return str(x)


def _json_safe(x: Any) -> Any:
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    if isinstance(x, (str, int, bool)) or x is None:
        return x
    return str(x)


def _param_diff(report: StudyReport, c: Configuration) -> list[tuple[str, Any, Any, bool]]:
    """(name, value, baseline value, changed) for each parameter of `c`."""
    base = report.baseline
    out = []
    for name in sorted(c.params):
        bv = base.params.get(name) if base is not None else None
        changed = base is not None and (name not in base.params or bv != c.params[name])
        out.append((name, c.params[name], bv, changed))
    return out


@dataclass(frozen=True)
class _MetricRow:
    metric: str
    screen: float | None
    envelope: tuple[float, float] | None
    confirm: float | None
    baseline: float | None


def _metric_rows(report: StudyReport, c: Configuration) -> tuple[list[str], list[_MetricRow]]:
    """A card's metric table: the column heads and, per headline metric, the screen value, its
    envelope, the confirmation value and the baseline's screen value (columns only when some
    row has them)."""
    base = report.baseline if report.baseline is not c else None
    rows = []
    for name in report.headline_metrics(c):
        v = c.screen.value_of(name)
        cv = c.confirm.value_of(name) if c.confirmed else None
        if v is None and cv is None:
            continue
        rows.append(_MetricRow(
            name, v, envelope(name, v, c.screen.relative_uncertainty) if v is not None else None,
            cv, base.screen.value_of(name) if base is not None else None))
    head = ["metric", "screen", "envelope"]
    if any(r.confirm is not None for r in rows):
        head.append("confirm")
    if any(r.baseline is not None for r in rows):
        head.append(f"baseline #{base.number}")
    return head, rows


def _metric_cells(head: list[str], r: _MetricRow) -> list[Any]:
    cells: list[Any] = [r.metric, r.screen, _env_text(r.envelope)]
    if "confirm" in head:
        cells.append(r.confirm)
    if len(head) > len(cells):
        cells.append(r.baseline)
    return cells


def _env_text(env: tuple[float, float] | None) -> str:
    return f"{_fmt(env[0])} – {_fmt(env[1])}" if env else ""


def _overlap_sentence(c: Configuration, overlaps: list[dict[str, Any]]) -> str | None:
    """How c's envelope relates to the other Pareto configurations', grouped."""
    full, none, partial = [], [], []
    for o in overlaps:
        if c.number not in (o["a"], o["b"]):
            continue
        other = f"#{o['b'] if o['a'] == c.number else o['a']}"
        if not o["separate"]:
            full.append(other)
        elif not o["overlapping"]:
            none.append(other)
        else:
            partial.append(f"{other}'s on {', '.join(o['overlapping'])} only")
    parts = ([f"overlaps those of {', '.join(full)} on every objective"] if full else []) \
        + ([f"overlaps {'; '.join(partial)}"] if partial else []) \
        + ([f"is apart from those of {', '.join(none)}"] if none else [])
    return "; ".join(parts) if parts else None


def _fidelity_text(c: Configuration) -> str:
    s = f"screen (trial #{c.screen.number})"
    if c.confirm is None:
        return s
    state = "" if c.confirm.complete else f", {c.confirm.state.lower()}"
    rank = f", rank {c.confirm_rank} among the confirmed" if c.confirm_rank else ""
    return f"{s}; confirm (trial #{c.confirm.number} of {c.confirm.study_name}{state}{rank})"


def _profile_text(m: Measurement) -> str | None:
    if m.profile is None and m.relative_uncertainty is None:
        return None
    label = {True: "calibrated", False: "uncalibrated reference profile"}.get(m.calibrated, "")
    bits = [b for b in (label, f"±{m.relative_uncertainty:.0%}"
                        if m.relative_uncertainty else "") if b]
    return f"{m.profile or 'profile'}" + (f" ({', '.join(bits)})" if bits else "")


def _explanation_parts(c: Configuration) -> tuple[str | None, str | None, list[str]]:
    """(bottleneck, sentences, assumptions) of the most trusted run's explanation."""
    e = c.explanation or {}
    bottleneck = str(e["bottleneck"]).replace("_", " ") if e.get("bottleneck") else None
    s = e.get("sentences")
    sentences = (" ".join(map(str, s)) if isinstance(s, list) else str(s)) if s else None
    if sentences and c.confirmed and c.confirm.explanation:
        sentences = f"At confirm fidelity: {sentences}"
    return bottleneck, sentences, [str(a) for a in e.get("assumptions") or []]


def _summary_lines(report: StudyReport) -> tuple[str, str]:
    objectives = ", ".join(f"{o.metric} ({o.direction})" for o in report.objectives)
    slos = ", ".join(str(c) for c in report.constraints) or "none"
    n = report.counts()
    return (f"Objectives: {objectives}. SLOs: {slos}.",
            f"{n['trials']} trials, {n['feasible']} feasible, {n['pareto']} in the Pareto set, "
            f"{n['confirmed']} confirmed.")


# ---------------------------------------------------------------------------------------------
# HTML

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;
max-width:1200px;padding:0 1rem;color:#1d2330;line-height:1.4}
h1{font-size:1.6rem}h2{margin-top:2.2rem;border-bottom:1px solid #ccd;padding-bottom:.2rem}
table{border-collapse:collapse;margin:.5rem 0;font-size:.9rem}
td,th{border:1px solid #d5d9e0;padding:.25rem .5rem;text-align:left;vertical-align:top}
th{background:#f1f3f7}td.num{text-align:right;font-variant-numeric:tabular-nums}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(540px,1fr));gap:1rem}
.card{border:1px solid #c5ccd8;border-radius:6px;padding:.8rem 1rem;background:#fbfcfe;overflow-x:auto;min-width:0}
.card h3{margin:.1rem 0 .4rem}.changed{font-weight:600;color:#8a3b00}
.badge{display:inline-block;border-radius:4px;padding:0 .4rem;font-size:.8rem;
background:#e3e8f2;margin-right:.3rem}.badge.confirm{background:#d7f0dc}
.note{color:#555;font-size:.88rem}.bad{color:#a00}
"""


def _e(x: Any) -> str:
    """Escaped HTML text of a value (numbers formatted)."""
    return html.escape(x if isinstance(x, str) else _fmt(x), quote=True)


def _table(head: Sequence[str], rows: Iterable[Sequence[str]], num: Sequence[bool] = ()) -> str:
    """An HTML table; `rows` hold ready (escaped) cell HTML, `num` marks right-aligned columns."""
    out = ["<table><thead><tr>", *(f"<th>{_e(h)}</th>" for h in head), "</tr></thead><tbody>"]
    for r in rows:
        out.append("<tr>" + "".join(
            f'<td{" class=num" if i < len(num) and num[i] else ""}>{cell}</td>'
            for i, cell in enumerate(r)) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _card_html(report: StudyReport, c: Configuration, overlaps: list[dict[str, Any]]) -> str:
    badges = [f'<span class="badge">screen #{c.screen.number}</span>']
    if c.confirm is not None:
        cls = "badge confirm" if c.confirm.complete else "badge"
        state = "" if c.confirm.complete else " " + c.confirm.state.lower()
        badges.append(f'<span class="{cls}">confirm #{c.confirm.number}{_e(state)}</span>')
    if c.baseline:
        badges.append('<span class="badge">baseline</span>')
    parts = [f'<div class="card" id="trial-{c.number}"><h3>Trial #{c.number}</h3>',
             "<div>" + "".join(badges) + "</div>",
             f"<p>Measured at: {_e(_fidelity_text(c))}.</p>"]
    prof = _profile_text(c.screen)
    if prof:
        parts.append(f'<p class="note">Profile: {_e(prof)}</p>')

    diff = _param_diff(report, c)
    if diff:
        has_base = report.baseline is not None and report.baseline is not c
        rows = []
        for name, v, bv, changed in diff:
            wrap = (lambda s: f'<span class="changed">{s}</span>') if changed else (lambda s: s)
            rows.append([wrap(_e(name)), wrap(_e(v))]
                        + ([_e(bv) if bv is not None else "—"] if has_base else []))
        head = ["parameter", "value"] + ([f"baseline #{report.baseline.number}"]
                                         if has_base else [])
        parts.append("<h4>Parameters</h4>" + _table(head, rows))

    head, mrows = _metric_rows(report, c)
    parts.append("<h4>Metrics</h4>" + _table(
        head, ([_e(x) for x in _metric_cells(head, r)] for r in mrows),
        [False] + [True] * (len(head) - 1)))
    ov = _overlap_sentence(c, overlaps)
    if ov:
        parts.append(f'<p class="note">Its envelope {_e(ov)}.</p>')

    bottleneck, sentences, assumptions = _explanation_parts(c)
    if bottleneck:
        parts.append(f"<p><b>Limited by:</b> {_e(bottleneck)}</p>")
    if sentences:
        parts.append(f"<p>{_e(sentences)}</p>")
    if assumptions:
        parts.append("<details><summary>Assumptions</summary><ul>"
                     + "".join(f"<li>{_e(a)}</li>" for a in assumptions) + "</ul></details>")
    if c.confirm is not None and not c.confirm.complete:
        parts.append(f'<p class="note bad">Confirmation run {_e(c.confirm.state.lower())}: '
                     f'{_e("; ".join(c.confirm.reasons))}</p>')
    parts.append("</div>")
    return "".join(parts)


def _confirmed_rows(report: StudyReport) -> list[list[Any]]:
    """trial, screen rank, confirm rank, state, confirm values..., verdict."""
    rows = []
    for c in report.confirmed:
        m = c.confirm
        vals = list(m.values) if m.values is not None else [None] * len(report.objectives)
        verdict = "feasible" if c.feasible else "; ".join(c.reasons) or "infeasible"
        rows.append([f"#{c.number}", c.rank, c.confirm_rank, m.state.lower(), *vals, verdict])
    return rows


def render_html(report: StudyReport) -> str:
    """The self-contained page: plotly.js is inlined once, so it opens offline."""
    from plotly.offline import get_plotlyjs

    names = [o.metric for o in report.objectives]
    overlaps = report.envelope_overlaps()
    line1, line2 = _summary_lines(report)
    out = ['<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
           f"<title>{_e(report.study_name)}: study report</title>",
           f"<style>{_CSS}</style>",
           f'<script type="text/javascript">{get_plotlyjs()}</script></head><body>',
           f"<h1>Study {_e(report.study_name)}</h1>",
           f'<p class="note">Storage {_e(report.storage)} · generated {_e(report.generated_at)}'
           "</p>", f"<p>{_e(line1)}</p>", f"<p>{_e(line2)}</p>"]

    def fig_html(f: Figure) -> str:
        body = (f.figure.to_html(full_html=False, include_plotlyjs=False,
                                 default_height=f.figure.layout.height or 480,
                                 config={"displaylogo": False}) if f.figure is not None else "")
        note = f'<p class="note">{_e(f.note)}</p>' if f.note else ""
        return f"<section><h3>{_e(f.title)}</h3>{note}{body}</section>"

    figs = figures(report)
    front = [f for f in figs
             if f.title.startswith("Pareto front") or f.title == "Objective history"]
    out.append("<h2>Pareto front</h2>")
    out += [fig_html(f) for f in front]

    out.append(f"<h2>Pareto configurations ({len(report.pareto)})</h2>")
    if report.pareto:
        out.append('<div class="cards">')
        out += [_card_html(report, c, overlaps) for c in report.pareto]
        out.append("</div>")
    else:
        out.append("<p>No feasible configuration: there is no Pareto set.</p>")
    if overlaps:
        out.append("<h3>Envelope overlaps between Pareto configurations</h3>")
        out.append(_table(["trials", "overlapping", "separate"], (
            [f"#{o['a']} / #{o['b']}", _e(", ".join(o["overlapping"]) or "—"),
             _e(", ".join(o["separate"]) or "—")] for o in overlaps)))
    if report.confirmed:
        out.append(f"<h2>Confirmed configurations ({len(report.confirmed)})</h2>")
        out.append(_table(["trial", "rank", "confirm rank", "state", *names, "verdict"],
                          ([_e(x) for x in row] for row in _confirmed_rows(report)),
                          [False, True, True, False] + [True] * len(names)))

    out.append("<h2>Search</h2>")
    out += [fig_html(f) for f in figs if f not in front]

    params = sorted({p for c in report.configurations for p in c.params})
    out.append(f"<h2>Feasible configurations ({len(report.feasible)})</h2>")
    out.append(_table(["trial", "rank", "fidelity", *names, *params], (
        [f'<a href="#trial-{c.number}">#{c.number}</a>' if c.rank == 1 else f"#{c.number}",
         _e(c.rank), _e(c.fidelity), *(_e(v) for v in c.values),
         *(_e(c.params.get(p, "")) for p in params)] for c in report.feasible),
        [False, True, False] + [True] * len(names)))

    out.append(f"<h2>Infeasible and failed configurations ({len(report.not_feasible)})</h2>")
    if report.not_feasible:
        out.append(_table(["trial", "state", "fidelity", "reasons", *params], (
            [f"#{c.number}", _e(c.screen.state.lower()), _e(c.fidelity),
             "<br>".join(_e(r) for r in c.reasons), *(_e(c.params.get(p, "")) for p in params)]
            for c in report.not_feasible)))
    else:
        out.append("<p>None.</p>")

    out.append("<h2>Notes</h2><ul>" + "".join(f"<li>{_e(n)}</li>" for n in report.notes)
               + "</ul></body></html>")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# Markdown

def _md(x: Any) -> str:
    """A table-safe Markdown cell. Markdown passes raw HTML through, so anything that could open
    a tag is escaped; a bare `<=` stays readable."""
    s = _fmt(x) if not isinstance(x, str) else x
    s = re.sub(r"<(?=[A-Za-z/!?])", "&lt;", s)
    return s.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _bold(s: str, on: bool) -> str:
    return f"**{s}**" if on else s


def _md_table(head: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    out = ["| " + " | ".join(_md(h) for h in head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(_md(x) for x in r) + " |" for r in rows]
    return out + [""]


def render_markdown(report: StudyReport) -> str:
    """The report without plots, for terminals, pull requests and wikis."""
    names = [o.metric for o in report.objectives]
    overlaps = report.envelope_overlaps()
    line1, line2 = _summary_lines(report)
    lines = [f"# Study {_md(report.study_name)}", "",
             f"Storage {_md(report.storage)}, generated {report.generated_at}.", "",
             _md(line1), "", _md(line2), "",
             f"## Pareto configurations ({len(report.pareto)})", ""]
    if not report.pareto:
        lines += ["No feasible configuration: there is no Pareto set.", ""]
    for c in report.pareto:
        lines += [f"### Trial #{c.number}" + (" (baseline)" if c.baseline else ""), "",
                  f"Measured at: {_md(_fidelity_text(c))}.", ""]
        prof = _profile_text(c.screen)
        if prof:
            lines += [f"Profile: {_md(prof)}", ""]
        diff = _param_diff(report, c)
        if diff:
            has_base = report.baseline is not None and report.baseline is not c
            lines += _md_table(
                ["parameter", "value"] + ([f"baseline #{report.baseline.number}"]
                                          if has_base else []),
                ([_bold(n, ch), _bold(_fmt(v), ch)] + ([bv if bv is not None else "—"]
                                                        if has_base else [])
                 for n, v, bv, ch in diff))
        head, mrows = _metric_rows(report, c)
        lines += _md_table(head, (_metric_cells(head, r) for r in mrows))
        ov = _overlap_sentence(c, overlaps)
        if ov:
            lines += [f"Its envelope {_md(ov)}.", ""]
        bottleneck, sentences, _ = _explanation_parts(c)
        if bottleneck:
            lines += [f"**Limited by:** {_md(bottleneck)}", ""]
        if sentences:
            lines += [_md(sentences), ""]
        if c.confirm is not None and not c.confirm.complete:
            lines += [f"Confirmation run {c.confirm.state.lower()}: "
                      f"{_md('; '.join(c.confirm.reasons))}", ""]
    if report.confirmed:
        lines += [f"## Confirmed configurations ({len(report.confirmed)})", ""]
        lines += _md_table(["trial", "rank", "confirm rank", "state", *names, "verdict"],
                           _confirmed_rows(report))
    params = sorted({p for c in report.configurations for p in c.params})
    lines += [f"## Feasible configurations ({len(report.feasible)})", ""]
    lines += _md_table(["trial", "rank", "fidelity", *names, *params],
                       ([f"#{c.number}", c.rank, c.fidelity, *c.values,
                         *(c.params.get(p, "") for p in params)] for c in report.feasible))
    lines += [f"## Infeasible and failed configurations ({len(report.not_feasible)})", ""]
    lines += _md_table(["trial", "state", "fidelity", "reasons"],
                       ([f"#{c.number}", c.screen.state.lower(), c.fidelity,
                         "; ".join(c.reasons)] for c in report.not_feasible))
    lines += ["## Notes", ""] + [f"- {_md(n)}" for n in report.notes] + [""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# CSV and JSON

def render_csv(report: StudyReport) -> str:
    """One row per trial of the study: state, fidelity, ranks, feasibility, params, values,
    metrics and reasons.

    Columns follow Optuna's trials_dataframe naming: params_<name>, values_<objective> (screen),
    metrics_<name> (screen); confirm_<objective> holds a confirmation run's values.
    """
    names = [o.metric for o in report.objectives]
    params = sorted({p for c in report.configurations for p in c.params})
    metrics = sorted({k for c in report.configurations for k in c.screen.metrics})
    head = (["number", "state", "fidelity", "rank", "confirm_rank", "feasible", "baseline",
             "confirm_trial"] + [f"params_{p}" for p in params]
            + [f"values_{n}" for n in names] + [f"confirm_{n}" for n in names]
            + [f"metrics_{k}" for k in metrics] + ["reasons"])

    def nums(values: tuple[float, ...] | None) -> list[str]:
        return [repr(v) for v in values] if values is not None else [""] * len(names)

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(head)
    for c in report.configurations:
        w.writerow([c.number, c.screen.state, c.fidelity, c.rank or "", c.confirm_rank or "",
                    c.feasible, c.baseline, c.confirm.number if c.confirm is not None else ""]
                   + [c.params.get(p, "") for p in params]
                   + nums(c.values) + nums(c.confirm.values if c.confirmed else None)
                   + [repr(c.screen.metrics[k]) if k in c.screen.metrics else "" for k in metrics]
                   + ["; ".join(c.reasons)])
    return buf.getvalue()


def report_json(report: StudyReport) -> dict[str, Any]:
    """Everything in the report as plain data (non-finite numbers become null)."""
    objective_names = [o.metric for o in report.objectives]
    configs = []
    for c in report.configurations:
        envs = {}
        for name in report.headline_metrics(c):
            v = c.screen.value_of(name)
            env = envelope(name, v, c.screen.relative_uncertainty) if v is not None else None
            if env is not None:
                envs[name] = list(env)
        configs.append({
            "number": c.number, "rank": c.rank, "confirm_rank": c.confirm_rank,
            "feasible": c.feasible, "baseline": c.baseline, "state": c.screen.state,
            "fidelity": c.fidelity, "params": c.params,
            "values": dict(zip(objective_names, c.values)) if c.values is not None else None,
            "confirm_values": dict(zip(objective_names, c.confirm.values))
            if c.confirmed else None,
            "envelopes": envs, "reasons": list(c.reasons), "explanation": c.explanation,
            "screen": c.screen.as_dict(),
            "confirm": c.confirm.as_dict() if c.confirm is not None else None,
        })
    return _json_safe({
        "study": report.study_name, "storage": report.storage,
        "generated_at": report.generated_at,
        "objectives": [{"metric": o.metric, "direction": o.direction} for o in report.objectives],
        "constraints": [{"metric": c.metric, "op": c.op, "value": c.value, "text": str(c)}
                        for c in report.constraints],
        "counts": report.counts(), "pareto": [c.number for c in report.pareto],
        "hypervolume_reference_point": list(report.reference_point)
        if report.reference_point else None,
        "envelope_overlaps": report.envelope_overlaps(), "notes": list(report.notes),
        "trials": configs,
    })
