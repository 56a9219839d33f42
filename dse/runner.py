"""The search driver: one process owns the Optuna study (ask/tell) and runs trials as Ray tasks.

Lifecycle of a trial: asked from the study (an enqueued trial first), its parameters suggested,
prechecked in the driver (an undeployable configuration is told FAIL with its reason at once),
dispatched to a Ray worker (`dse.evaluate.run_trial`), then told COMPLETE with its objective
values and SLO constraints, or FAIL with the reason it failed or timed out. Every outcome is
written to the storage as it is told, so a killed driver loses nothing but the trials it had
in flight; the next run of the same study fails those ("interrupted") and enqueues their
parameters again.

Each ask gets a sampler seeded from the study's seed and the number of trials before it that
were not interrupted, so a resumed search proposes what the uninterrupted one would have (with
the TPE and random samplers; NSGA-II/III count generations from attributes that a trial re-run
from the queue lacks, and the grid sampler keeps one seed, which orders the whole grid): the
samplers' random state is not kept in the storage, and a sampler made again from the study's
seed alone would start its random stream from the beginning.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from optuna.trial import FrozenTrial, TrialState

from dse.backends import RayPool, make_sampler, open_storage, quiet_optuna, sole_search
from dse.batched_storage import BatchedStorage
from dse.driver import StageDriver, interrupt_trials, is_interrupted
from dse.evaluate import EvalSpec, baseline_values, check_metric_names, clip
from dse.fingerprint import DIGEST_ATTR, changed_parts, changed_words, study_digest
from dse.interrupts import search_signals, storage_writes
from dse.pareto import pareto_ranks
from dse.search_checks import base_metric_names, check_before_search
from dse.ship import Shipment, shipment
from dse.study import StudyConfig
from simcore.errors import ConfigError



@dataclass(frozen=True)
class SearchOutcome:
    """What a search left in its storage, in counts and trial numbers.

    `stopped_by` is "n_trials" (the budget was reached), "grid" (every grid point was run) or
    "timeout" (the wall-clock limit stopped the asking; the confirmation stage is then skipped
    until the study is resumed). `failure_reasons` counts why screening trials failed or could
    not be deployed, most common first. `confirmed_trials` are the screened trials whose
    confirmation run completed, `confirm_failed` those whose latest one did not (a resumed
    search runs them again), with `confirm_reasons` counted the same way. `notes` are things
    the user should know (e.g. why the baseline was not enqueued).
    """

    study_name: str
    storage_url: str
    num_complete: int
    num_failed: int
    num_infeasible: int
    num_interrupted: int
    pareto_trials: tuple[int, ...]
    confirm_study_name: str | None = None
    confirmed_trials: tuple[int, ...] = ()
    confirm_failed: tuple[int, ...] = ()
    stopped_by: str = "n_trials"
    notes: tuple[str, ...] = ()
    failure_reasons: tuple[tuple[str, int], ...] = ()
    confirm_reasons: tuple[tuple[str, int], ...] = ()
    num_reused: int = 0
    """Complete trials answered from an earlier trial of the same resolved configuration (not
    simulated again; their `same_config_as` attribute names it)."""
    workers: int | None = None
    """Trials simulated at once; None when this run simulated nothing (Ray was not started)."""
    workers_from: str = ""
    """Where `workers` came from: the study's `execution.workers`, or the CPUs counted."""

    def workers_line(self) -> str | None:
        """How many trials ran at once and why that many, in one line; None if none ran."""
        if self.workers is None:
            return None
        return f"{self.workers} Ray worker{'s' if self.workers != 1 else ''} ({self.workers_from})"

    def summary(self, report=None) -> str:
        """One line of counts: trials by outcome, the Pareto set, the confirmations. With the
        study's `report` (`dse.report.StudyReport`), the SLO-feasible count and the Pareto set
        are the report's, so that the terminal and the report agree."""
        reused = (f" ({self.num_reused} answered from an identical earlier configuration)"
                  if self.num_reused else "")
        if report is None:
            line = (f"study {self.study_name}: {self.num_complete} complete{reused}, "
                    f"{self.num_infeasible} infeasible, {self.num_failed} failed; Pareto set of "
                    f"{len(self.pareto_trials)}")
        else:
            interrupted = (f", {self.num_interrupted} interrupted" if self.num_interrupted
                           else "")
            line = (f"study {self.study_name}: {self.num_complete} complete{reused} "
                    f"({len(report.feasible)} within every SLO), {self.num_infeasible} "
                    f"undeployable, {self.num_failed} failed{interrupted}; Pareto set of "
                    f"{len(report.pareto)}")
        if self.confirmed_trials:
            line += f", {len(self.confirmed_trials)} confirmed"
        if self.confirm_failed:
            line += f", {len(self.confirm_failed)} confirmation runs failed"
        return line

    def problem(self) -> str | None:
        """Why the search did not finish its job, in one sentence, or None: no trial completed,
        or a confirmation run failed (a resumed search runs it again)."""
        if self.num_complete == 0:
            return f"no trial completed: {reasons_text(self.failure_reasons)}"
        if self.confirm_failed:
            n = len(self.confirm_failed) + len(self.confirmed_trials)
            return (f"{len(self.confirm_failed)} of {n} confirmation runs failed "
                    f"({reasons_text(self.confirm_reasons)}); run the same command to retry them")
        return None


_REASONS_SHOWN = 3
_REASON_CHARS = 160


def reasons_text(counted: tuple[tuple[str, int], ...]) -> str:
    """Counted reasons as one line, most common first: '5 x timed out after 3 s; 2 x ...'."""
    if not counted:
        return "no trial ran"
    shown = [f"{n} x {clip(reason, _REASON_CHARS)}" for reason, n in counted[:_REASONS_SHOWN]]
    rest = sum(n for _, n in counted[_REASONS_SHOWN:])
    if rest:
        shown.append(f"{rest} for other reasons")
    return "; ".join(shown)


# -- the study in the storage --------------------------------------------------------------------


def _counts_toward_budget(t: FrozenTrial) -> bool:
    return t.state in (TrialState.COMPLETE, TrialState.FAIL) and not is_interrupted(t)


def _stored_study_names(storage: optuna.storages.BaseStorage) -> set[str]:
    return {s.study_name for s in storage.get_all_studies()}


def _open_study(storage: optuna.storages.BaseStorage, name: str, study: StudyConfig,
                sampler: optuna.samplers.BaseSampler, stage: str, resume: bool,
                url: str) -> optuna.Study:
    """Create the study, or load it to resume; a stored study must have the same objectives."""
    with storage_writes():
        return _create_or_load(storage, name, study, sampler, stage, resume, url)


def _create_or_load(storage: optuna.storages.BaseStorage, name: str, study: StudyConfig,
                    sampler: optuna.samplers.BaseSampler, stage: str, resume: bool,
                    url: str) -> optuna.Study:
    exists = name in _stored_study_names(storage)
    if exists and not resume:
        raise ConfigError(f"study {name!r} already exists in {url.split('@')[-1]}; resume it, "
                          f"or choose another name or storage")
    directions = [o.direction for o in study.objectives]
    st = optuna.create_study(storage=storage, study_name=name, sampler=sampler,
                             directions=directions, load_if_exists=True)
    objectives = [f"{o.metric} {o.direction}" for o in study.objectives]
    digest = study_digest(study)
    if exists:
        stored = st.user_attrs.get("objectives", objectives)
        if (list(stored) != objectives
                or [d.name.lower() for d in st.directions] != directions):
            raise ConfigError(f"study {name!r} in the storage was run with objectives {stored}, "
                              f"not {objectives}; choose another name or storage")
        changed = changed_parts(st.user_attrs.get(DIGEST_ATTR, {}), digest)
        if changed:
            what = changed_words(changed)
            raise ConfigError(
                f"study {name!r} in {url.split('@')[-1]} was run with another {what}: resuming "
                f"it would put trials of both into one Pareto set; to start a new study give "
                f"this one another `name` (or `storage`), or restore the {what} it was run with")
        if DIGEST_ATTR not in st.user_attrs:   # stored before studies kept their digest
            st.set_user_attr(DIGEST_ATTR, digest)
    else:
        st.set_metric_names([o.metric for o in study.objectives])
        st.set_user_attr("objectives", objectives)
        st.set_user_attr("constraints", [str(c) for c in study.constraints])
        st.set_user_attr("fidelity", stage)
        st.set_user_attr(DIGEST_ATTR, digest)
    return st


def _params_key(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, default=str)


def trial_seed(seed: int, index: int) -> int:
    """The sampler seed of the `index`-th trial (not counting interrupted ones) of a study."""
    return int(np.random.SeedSequence([seed % 2**64, index]).generate_state(1)[0])


def count_reasons(trials: list[FrozenTrial]) -> tuple[tuple[str, int], ...]:
    """Why the trials failed or could not be deployed, with how many each, most common first."""
    reasons = Counter(t.user_attrs.get("failure_reason") or t.user_attrs.get("infeasible_reason")
                      or "unknown" for t in trials)
    return tuple(reasons.most_common())


# -- confirmation --------------------------------------------------------------------------------


def confirm_candidates(st: optuna.Study, k: int) -> list[FrozenTrial]:
    """The best `k` feasible completed trials by non-dominated rank (ties: lower trial number),
    one per distinct parameter set."""
    trials = [t for t in st.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
              if all(v <= 0 for v in t.constraints.values())]
    if not trials:
        return []
    directions = ["minimize" if d == optuna.study.StudyDirection.MINIMIZE else "maximize"
                  for d in st.directions]
    ranks = pareto_ranks([t.values for t in trials], directions)
    chosen, seen = [], set()
    for _, t in sorted(zip(ranks, trials), key=lambda rt: (rt[0], rt[1].number)):
        key = _params_key(t.params)
        if key not in seen:
            seen.add(key)
            chosen.append(t)
        if len(chosen) == k:
            break
    return chosen


# -- the search ----------------------------------------------------------------------------------


def _progress_bar(enabled: bool, total: int, initial: int, desc: str) -> Any:
    if not (enabled and sys.stderr.isatty()):
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=min(initial, total), desc=desc, unit="trial",
                file=sys.stderr, dynamic_ncols=True)


def off_grid(study: StudyConfig, values: dict[str, Any]) -> str | None:
    """Why the baseline `values` are not a point of the study's grid (the first value not among
    its parameter's grid values), or None when they are."""
    grid = study.space.grid(study.base)
    off = next((k for k, v in values.items() if k in grid and v not in grid[k]), None)
    return (None if off is None
            else f"{off} = {values[off]!r} is not a point of the grid ({grid[off]})")


def run_search(study: StudyConfig, *, progress: bool = True, resume: bool = True
               ) -> SearchOutcome:
    """Search the study's space and leave every trial in its storage; returns the counts.

    Screening trials run with `fidelity.screen` overrides into the study `study.name`; with
    `fidelity.confirm` set, the best `confirm_top_k` feasible screened configurations are then
    re-run with the confirm overrides (on the base, without the screen ones) into the study
    f"{name}/confirm" of the same storage. Re-running a study resumes it (`resume=False`
    refuses to touch an existing one). Bad input raises ConfigError before any trial runs.
    A progress bar goes to stderr when `progress` and stderr is a terminal.
    """
    spec = EvalSpec.of(study)
    check_before_search(study)
    url = study.storage_url
    names = set(study.space.active(study.base))
    notes: list[str] = []
    deadline = (time.monotonic() + study.budget.timeout_s if study.budget.timeout_s
                else math.inf)
    with ExitStack() as cleanup, quiet_optuna(), search_signals():
        sampler = make_sampler(study)
        ship = None
        if study.execution.ray_address is not None:
            staging = cleanup.enter_context(tempfile.TemporaryDirectory(prefix="dse-ship-"))
            ship = shipment(study, Path(staging))
            if ship is not None:
                ship.stage()
        pool = RayPool(study.execution.workers, study.execution.ray_address,
                       connect_timeout_s=study.execution.connect_timeout_s,
                       runtime_env=ship.runtime_env if ship is not None else None)
        cleanup.callback(pool.close)
        if study.execution.ray_address is not None:
            pool.start()           # a cluster that does not answer fails before any check
        check_metric_names(spec, base_metric_names(study))
        stage = dict(study=study, spec=spec, pool=pool, deadline=deadline, progress=progress,
                     shipment=ship)
        cleanup.enter_context(sole_search(url, study.name))   # checked; the storage opens now
        storage = BatchedStorage(open_storage(url))
        st = _open_study(storage, study.name, study, sampler, "screen", resume, url)
        interrupt_trials(st, storage, st.get_trials(deepcopy=False, states=(TrialState.RUNNING,)),
                   names)
        trials = st.get_trials(deepcopy=False)
        if not trials and study.baseline:
            values, why = baseline_values(study.base, study.space)
            if values is not None and study.sampler.kind == "grid":
                off = off_grid(study, values)
                if off is not None:     # it would take a trial of the grid's budget
                    values, why = None, off
            if values is None:
                notes.append(f"baseline not enqueued: {why}")
            else:
                with storage_writes():
                    st.enqueue_trial(values, user_attrs={"baseline": True})
        finished = sum(_counts_toward_budget(t) for t in trials)
        can_ask = _grid_open(st, study) if study.sampler.kind == "grid" else (lambda: True)
        stopped_by = _run_stage(st, storage, "screen", study.fidelity.screen,
                                study.budget.n_trials, finished, can_ask,
                                sampler_for=_sampler_for(study), **stage)
        confirm = None
        if study.fidelity.confirm is not None and stopped_by != "timeout":
            confirm = _confirm(st, storage, url, f"{study.name}/confirm", stage)
        if stopped_by == "timeout":
            notes.append("budget.timeout_s stopped the search before its budget of trials"
                         + ("; its confirmation stage did not run"
                            if study.fidelity.confirm is not None else "")
                         + "; run the same command to go on")
    outcome = _outcome(st, url, confirm, stopped_by, notes)
    if not pool.started:
        return outcome
    return dataclasses.replace(outcome, workers=pool.workers, workers_from=pool.workers_from)


def _sampler_for(study: StudyConfig) -> Callable[[int], optuna.samplers.BaseSampler] | None:
    """A sampler per trial, seeded by its place in the study (see the module docstring); None
    for the grid sampler, whose seed fixes the order of the whole grid and must not vary."""
    if study.sampler.kind == "grid":
        return None
    return lambda k: make_sampler(study, seed=trial_seed(study.sampler.seed, k))


def _run_stage(st: optuna.Study, storage: BatchedStorage, fidelity: str,
               overrides: dict[str, Any], total: int, finished: int,
               can_ask: Callable[[], bool], *, study: StudyConfig, spec: EvalSpec,
               pool: RayPool, deadline: float, progress: bool, shipment: Shipment | None,
               sampler_for: Callable[[int], optuna.samplers.BaseSampler] | None = None) -> str:
    """Run trials of `st` until `total` count toward its budget; returns what stopped it."""
    if finished >= total:
        return "n_trials"
    pool.start()        # before the first ask, so no trial is left waiting on Ray to start
    bar = _progress_bar(progress, total, finished, st.study_name)
    driver = StageDriver(st=st, storage=storage, pool=pool, study=study, spec=spec,
                     overrides=dict(overrides), fidelity=fidelity, deadline=deadline, bar=bar,
                     sampler_for=sampler_for, shipment=shipment)
    for t in st.get_trials(deepcopy=False, states=(TrialState.FAIL,)):
        if "infeasible_reason" in t.user_attrs:
            driver.counts["infeasible"] += 1
        elif not is_interrupted(t):
            driver.counts["failed"] += 1
    try:
        return driver.run(total - finished, can_ask)
    finally:
        if bar is not None:
            bar.close()


def _grid_open(st: optuna.Study, study: StudyConfig) -> Callable[[], bool]:
    """Whether a grid point is still unrun (or a trial is queued)."""
    grid = study.space.grid(study.base)
    names = list(grid)
    if study.space.serving is not None:
        # Each serving mode's own grid: a trial's point is its parameters, whatever they are.
        from dse.space import grid_points
        points = {_params_key(p) for p in grid_points(study.space, study.base)}
    else:
        points = {_params_key(dict(zip(names, combo)))
                  for combo in itertools.product(*grid.values())}

    def can_ask() -> bool:
        covered = set()
        for t in st.get_trials(deepcopy=False):
            if t.state == TrialState.WAITING:
                return True
            if not is_interrupted(t):
                covered.add(_params_key(t.params if study.space.serving is not None
                                        else {k: t.params.get(k) for k in names}))
        return bool(points - covered)

    return can_ask


@dataclass(frozen=True)
class _Confirmed:
    """Where the confirmation stage stands: per screened trial it re-runs, done or not."""

    study_name: str
    complete: tuple[int, ...]
    failed: tuple[int, ...]
    reasons: tuple[tuple[str, int], ...]


def _confirm(st: optuna.Study, storage: BatchedStorage, url: str, name: str,
             stage: dict[str, Any]) -> _Confirmed:
    """Re-run the best screened configurations with the confirm overrides into study `name`.

    A configuration is re-run unless a run of it completed or is queued, so one whose
    confirmation failed (timed out, the worker died) is tried again when the search is resumed.
    """
    study: StudyConfig = stage["study"]
    targets = confirm_candidates(st, study.fidelity.confirm_top_k)
    cst = _open_study(storage, name, study, optuna.samplers.RandomSampler(seed=study.sampler.seed),
                      "confirm", True, url)
    interrupt_trials(cst, storage, cst.get_trials(deepcopy=False, states=(TrialState.RUNNING,)),
               set(study.space.active(study.base)))
    trials = cst.get_trials(deepcopy=False)
    present = {t.user_attrs.get("confirms_trial") for t in trials
               if t.state in (TrialState.COMPLETE, TrialState.WAITING)}
    with storage_writes():
        for t in targets:
            if t.number not in present:
                attrs = {"confirms_trial": t.number}
                if t.user_attrs.get("baseline"):
                    attrs["baseline"] = True
                cst.enqueue_trial(dict(t.params), user_attrs=attrs)

    def queued() -> bool:
        return bool(cst.get_trials(deepcopy=False, states=(TrialState.WAITING,)))

    finished = sum(_counts_toward_budget(t) for t in trials)
    total = finished + len(cst.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
    # Confirmations also run the perturbed re-runs of the config's uncertainty method, so the
    # report can compare the best configurations by envelopes that went through the whole run.
    _run_stage(cst, storage, "confirm", study.fidelity.confirm or {}, total, finished, queued,
               **{**stage, "spec": dataclasses.replace(stage["spec"], envelope=True)})
    latest: dict[int, FrozenTrial] = {}
    complete = set()
    for t in cst.get_trials(deepcopy=False):
        target = t.user_attrs.get("confirms_trial")
        if is_interrupted(t) or not t.state.is_finished():
            continue
        latest[target] = t
        if t.state == TrialState.COMPLETE:
            complete.add(target)
    numbers = [t.number for t in targets]
    failed = [n for n in numbers if n not in complete and n in latest]
    return _Confirmed(study_name=name, complete=tuple(n for n in numbers if n in complete),
                      failed=tuple(failed), reasons=count_reasons([latest[n] for n in failed]))


def _outcome(st: optuna.Study, url: str, confirm: _Confirmed | None, stopped_by: str,
             notes: list[str]) -> SearchOutcome:
    trials = st.get_trials(deepcopy=False)
    fails = [t for t in trials if t.state == TrialState.FAIL and not is_interrupted(t)]
    infeasible = sum("infeasible_reason" in t.user_attrs for t in fails)
    return SearchOutcome(
        study_name=st.study_name, storage_url=url,
        num_complete=sum(t.state == TrialState.COMPLETE for t in trials),
        num_failed=len(fails) - infeasible, num_infeasible=infeasible,
        num_interrupted=sum(is_interrupted(t) for t in trials),
        pareto_trials=tuple(t.number for t in st.best_trials),
        confirm_study_name=confirm.study_name if confirm else None,
        confirmed_trials=confirm.complete if confirm else (),
        confirm_failed=confirm.failed if confirm else (), stopped_by=stopped_by,
        notes=tuple(notes), failure_reasons=count_reasons(fails),
        confirm_reasons=confirm.reasons if confirm else (),
        num_reused=sum(t.state == TrialState.COMPLETE and "same_config_as" in t.user_attrs
                       for t in trials))


def best_configs(storage: str, name: str) -> list[dict[str, Any]]:
    """The Pareto-optimal feasible trials of a stored study: number, params, values, metrics,
    summary, explanation and whether it is the baseline."""
    with quiet_optuna():
        st = optuna.load_study(study_name=name, storage=open_storage(storage))
        best = st.best_trials
    return [{"number": t.number, "params": dict(t.params), "values": list(t.values),
             "metrics": t.user_attrs.get("metrics", {}), "summary": t.user_attrs.get("summary", {}),
             "explanation": t.user_attrs.get("explanation"),
             "baseline": bool(t.user_attrs.get("baseline", False))}
            for t in sorted(best, key=lambda t: t.number)]
