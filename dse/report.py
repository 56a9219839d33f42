"""The study report: the Pareto set with its envelopes and explanations, and every trial ranked.

A study in Optuna storage becomes a `StudyReport` (`build_report`), rendered as a self-contained
HTML page (plots need no network), Markdown, CSV (one row per trial) and JSON (`write_report`).
The report, not Optuna's `best_trials`, is authoritative on feasibility: a configuration counts
as feasible only if its trial completed, the runner marked it feasible, every Optuna constraint
value is <= 0 and every SLO of the study holds on its metrics. Configurations are ranked at the
screening fidelity, where all were measured; a confirmation re-run at a higher fidelity is shown
beside its screening run, and one that misses an SLO makes its configuration infeasible.
Each trial's run is read into a `Measurement` by `dse.report_trials`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from itertools import combinations
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dse.fingerprint import DIGEST_ATTR, changed_parts, changed_words
from dse.pareto import pareto_ranks
from dse.study import Constraint, Objective
from simcore.errors import ConfigError
from simcore.uncertainty import first_order as envelope

if TYPE_CHECKING:
    import optuna

    from dse.study import StudyConfig

FILE_NAMES = {"html": "report.html", "md": "report.md", "csv": "trials.csv",
              "json": "report.json"}
LAUNCH_FILE = "launch.md"
"""The recommended configuration's launch plan, written beside the report."""
# Hypervolume reference point: this fraction of the feasible range beyond the worst value.
REFERENCE_MARGIN = 0.1
_NOT_HEADLINE = {"step_time_relative_uncertainty"}


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

def overlap(a: tuple[float, float] | None, b: tuple[float, float] | None) -> bool:
    """Whether two envelopes (low, high) share a value; False when either is missing."""
    return a is not None and b is not None and a[0] <= b[1] and b[0] <= a[1]


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
    envelopes: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Metric -> (low, high) from perturbed re-runs (confirmation runs); first-order otherwise."""
    envelope_method: str | None = None

    def envelope(self, metric: str) -> tuple[float, float] | None:
        """This run's envelope of `metric`: from its perturbed re-runs when it had them, else
        first order around its value."""
        if metric in self.envelopes:
            return self.envelopes[metric]
        v = self.value_of(metric)
        return envelope(metric, v, self.relative_uncertainty) if v is not None else None

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
            "envelopes": {k: list(v) for k, v in self.envelopes.items()},
            "envelope_method": self.envelope_method,
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
    repeat_of: int | None = None
    """The earlier trial of the same resolved configuration this trial was answered from
    (`same_config_as`): listed with the trials, but ranked, carded and counted once, as that
    trial."""

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
    recommendation: Any = None
    """`dse.recommend.Recommendation` (set by `write_report`, which knows the study's base)."""
    noise: dict[str, float] = field(default_factory=dict)
    """Per objective, its seed-to-seed spread (`dse.report_groups.measure_noise`; set by
    `write_report`): differences smaller than this do not tell configurations apart."""
    causes: dict[int, tuple[str, ...]] = field(default_factory=dict)
    """Per Pareto card (the first configuration of each group), what limits it measured by
    intervention (`dse.recommend.causes`, at the screening fidelity; the recommended one's at
    its own; set by `write_report`)."""
    pairs: Any = None
    """`dse.report_pairs.PairMatrix`: the Pareto configurations (and the recommendation and its
    runner-up) re-run over shared draws of the step-time errors, and per pair and objective the
    chance that one does better (set by `write_report`); it orders and merges the cards."""
    serving: Any = None
    """`dse.report_serving.ServingComparison` when the space searched aggregated against
    disaggregated serving (set by `write_report`)."""

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
        return [c for c in self.configurations if c.rank is None and c.repeat_of is None]

    @property
    def confirmed(self) -> list[Configuration]:
        """Configurations with a confirmation run (completed or not), by confirm rank."""
        return sorted((c for c in self.configurations if c.confirm is not None),
                      key=lambda c: (c.confirm_rank is None, c.confirm_rank or 0, c.number))

    @property
    def baseline(self) -> Configuration | None:
        """The base configuration's trial: the first that completed (a search interrupted and
        resumed runs the base again), else the first."""
        runs = [c for c in self.configurations if c.baseline]
        return next((c for c in runs if c.screen.complete), runs[0] if runs else None)

    def no_recommendation(self) -> str:
        """Why there is no recommendation: no configuration meets every SLO, or none of those
        finished yet while trials still run (a report written during a search)."""
        running = sum(c.screen.state == "RUNNING" for c in self.configurations)
        if running:
            return (f"No finished configuration meets every SLO yet ({running} trial"
                    f"{'s are' if running > 1 else ' is'} still running): nothing to recommend "
                    f"so far.")
        return "No configuration meets every SLO: nothing to recommend."

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
            # Both confirmed with perturbed re-runs: compare those envelopes; else the
            # screening values' first-order ones.
            propagated = (a.confirmed and b.confirmed and bool(a.confirm.envelopes)
                          and bool(b.confirm.envelopes))
            for i, o in enumerate(self.objectives):
                if propagated:
                    ea, eb = a.confirm.envelope(o.metric), b.confirm.envelope(o.metric)
                else:
                    ea = envelope(o.metric, a.values[i], a.screen.relative_uncertainty)
                    eb = envelope(o.metric, b.values[i], b.screen.relative_uncertainty)
                if ea is None or eb is None:
                    continue
                (overlapping if overlap(ea, eb) else separate).append(o.metric)
            if overlapping or separate:
                out.append({"a": a.number, "b": b.number, "overlapping": overlapping,
                            "separate": separate,
                            "basis": "confirmation re-runs" if propagated else "first order"})
        return out

    def counts(self) -> dict[str, int]:
        states: dict[str, int] = {}
        for c in self.configurations:
            states[c.screen.state.lower()] = states.get(c.screen.state.lower(), 0) + 1
        return {"trials": len(self.configurations),
                "repeats": sum(c.repeat_of is not None for c in self.configurations),
                "feasible": len(self.feasible),
                "pareto": len(self.pareto),
                "confirmed": sum(1 for c in self.configurations if c.confirmed),
                **dict(sorted(states.items()))}


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


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


def _optuna_quiet():
    """Optuna without its INFO lines and experimental-feature warnings (dse.backends')."""
    from dse.backends import quiet_optuna

    return quiet_optuna()


def build_report(storage_url: str, study_name: str, objectives: Sequence[Objective],
                 constraints: Sequence[Constraint] = (), *,
                 confirm_study_name: str | None = None,
                 digest: Mapping[str, str] | None = None) -> StudyReport:
    """Read a study (and its confirmation study, if stored) and rank its configurations.

    `objectives` must match the stored study's directions. `confirm_study_name` defaults to
    f"{study_name}/confirm"; its trials name the screened trial they re-run in the
    `confirms_trial` user attribute. `digest` (`dse.fingerprint.study_digest` of the study file
    reporting it), where given, must match the one the study was run with, part by part, as a
    resumed search must: another objective, constraint, base, space, fidelity or price would
    label the stored trials with what they were not run under. Raises ConfigError when the
    study is not in the storage, or was run with another study file.
    """
    import optuna

    from dse.report_trials import measurement

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
    if digest is not None:
        changed = changed_parts(study.user_attrs.get(DIGEST_ATTR, {}), digest)
        if changed:
            what = changed_words(changed)
            raise ConfigError(f"study {study_name!r} in {redact_url(storage_url)} was run with "
                              f"another {what}: its report would label the stored trials with "
                              f"this study file's; report it with the study file it was run "
                              f"with (restore the {what})")
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
                    measurement(t, confirm_name, constraints, "confirm"))

    configs = []
    for t in study.get_trials(deepcopy=False):
        runs = confirms.get(t.number, [])
        complete = [m for m in runs if m.complete]
        twin = t.user_attrs.get("same_config_as")
        configs.append(Configuration(
            number=t.number, params=dict(t.params), distributions=dict(t.distributions),
            baseline=bool(t.user_attrs.get("baseline", False)),
            screen=measurement(t, study_name, constraints, "screen"),
            confirm=(complete or runs or [None])[-1],
            repeat_of=twin if isinstance(twin, int) else None))

    notes = []
    repeats = sum(c.repeat_of is not None for c in configs)
    if repeats:
        notes.append(f"{repeats} trial{'s' if repeats != 1 else ''} proposed a configuration "
                     "already run and took its result (same_config_as): each configuration is "
                     "ranked and counted once, as its first trial.")
    reference = None
    feasible = [i for i, c in enumerate(configs) if c.feasible and c.repeat_of is None]
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
    if any(c.confirmed and c.confirm.envelopes for c in configs):
        method = next(c.confirm.envelope_method for c in configs
                      if c.confirmed and c.confirm.envelopes)
        notes.append(f"Confirmation envelopes come from perturbed re-runs ({method}): each op "
                     "class's duration scaled within its error bound for the whole run, so "
                     "batching and queueing carry the error; Pareto configurations that were "
                     "both confirmed are compared on these.")

    return StudyReport(
        study_name=study_name, storage=redact_url(storage_url), objectives=objectives,
        constraints=constraints, configurations=tuple(configs), reference_point=reference,
        notes=tuple(notes), generated_at=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        view=_view_study(configs, directions))


def _view_study(configs: Sequence[Configuration], directions: list[str]) -> optuna.Study:
    """An in-memory copy of the study carrying the report's feasibility, for Optuna's plots.

    Trials are added in number order, so its trial numbers are the main study's. A repeat of an
    earlier trial's configuration (answered from it, `Configuration.repeat_of`) is added as not
    completed, so that the plots count each configuration once, as the report's ranks do.
    """
    import optuna
    from optuna.trial import TrialState, create_trial

    with _optuna_quiet():
        view = optuna.create_study(storage=optuna.storages.InMemoryStorage(),
                                   directions=directions)
    for c in configs:
        if c.screen.complete and c.values is not None and c.repeat_of is None:
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
    """Build the report of `study` and write its formats (`dse.report_files.write_report`)."""
    from dse.report_files import write_report as write

    return write(study, storage=storage, out_dir=out_dir)


def write_report_files(report: StudyReport, out_dir: Path,
                       formats: Iterable[str] = tuple(FILE_NAMES)) -> dict[str, Path]:
    """Write the chosen formats of `report` into `out_dir` (`dse.report_files`)."""
    from dse.report_files import write_report_files as write

    return write(report, out_dir, formats)


def setting_text(x: Any) -> str:
    """A searched setting's value as it is written in a config (8192 and 16384 alike, without
    separators; a fraction to six significant digits), where `_fmt` writes measured numbers."""
    if isinstance(x, float) and math.isfinite(x):
        return f"{x:g}" if x != int(x) or abs(x) >= 1e15 else str(int(x))
    return "" if x is None else str(x)


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
