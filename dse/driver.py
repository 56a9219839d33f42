"""The dispatch loop of one search stage: trials asked from the Optuna study, run on Ray workers
(or answered at once: infeasible, or the same configuration as an earlier trial), and told with
their outcome, in batches (deterministic) or as each ends. `dse.runner` drives the stages.

Storage writes per trial: the study's storage is a `dse.batched_storage.BatchedStorage`, so a
trial costs three transactions: the ask (Optuna creates the trial, or pops a queued one), its
parameters (`dispatch`, before any worker gets it; one transaction for a whole batch) and the
tell (attributes, constraints, values and state together)."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from dse.backends import RayPool
from dse.batched_storage import BatchedStorage
from dse.evaluate import EvalSpec, TrialOutcome, one_line, resolve
from dse.interrupts import storage_writes
from dse.ship import Shipment
from dse.study import StudyConfig

INTERRUPTED = "interrupted"
"""`failure_reason` of a trial whose driver stopped before it finished; its parameters are
enqueued again and it does not count toward the budget."""

DASHBOARD_CONSTRAINTS_ATTR = "constraints"
"""Trial system attribute: the constraint values in the study's order, as optuna-dashboard
reads them (it does not read Optuna 5's named constraints)."""

_WAIT_SLICE_S = 1.0
"""Longest single wait on Ray, so a signal (Ctrl-C, SIGTERM) stops the driver within it."""


def is_interrupted(t: FrozenTrial) -> bool:
    return t.state == TrialState.FAIL and t.user_attrs.get("failure_reason") == INTERRUPTED



def interrupt_trials(st: optuna.Study, storage: optuna.storages.BaseStorage,
               trials: list[FrozenTrial], names: set[str]) -> None:
    """Fail trials whose driver is gone ("interrupted"); enqueue again the parameters of those
    that had all of `names` (were dispatched). A trial stopped while its parameters were being
    suggested never ran: the sampler proposes afresh instead. `storage` is the study's own
    (for a trial this process holds, the reason is then committed with the FAIL)."""
    with storage_writes():
        study_id = storage.get_study_id_from_name(st.study_name)
        for t in trials:
            trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, t.number)
            storage.set_trial_user_attr(trial_id, "failure_reason", INTERRUPTED)
            st.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
            if set(t.params) == names:
                keep = {k: t.user_attrs[k] for k in ("baseline", "confirms_trial")
                        if k in t.user_attrs}
                st.enqueue_trial(dict(t.params), user_attrs=keep or None)



@dataclass
class Flight:
    """A trial between ask and tell: its values, Ray task (None if prechecked) and outcome."""

    trial: optuna.Trial
    values: dict[str, Any]
    ref: Any = None
    """The Ray task simulating it, once dispatched."""
    deadline: float = math.inf
    outcome: TrialOutcome | None = None
    digest: str | None = None
    """The resolved configuration's digest (`dse.evaluate.resolve`); None if infeasible."""
    twin: "Flight | None" = None
    """An earlier flight of the same configuration, still running: this one takes its outcome."""


@dataclass
class StageDriver:
    """Runs trials of one Optuna study on Ray, one stage (screen or confirm) at a time."""

    st: optuna.Study
    storage: BatchedStorage
    """The study's storage (`st`'s own)."""
    pool: RayPool
    """Started: its `workers` is the number of trials in flight."""
    study: StudyConfig
    spec: EvalSpec
    overrides: dict[str, Any]
    fidelity: str
    deadline: float
    bar: Any = None
    sampler_for: Callable[[int], optuna.samplers.BaseSampler] | None = None
    """Makes the sampler of the trial with this many (not interrupted) trials before it."""
    shipment: Shipment | None = None
    """What the workers were sent; trials name its copies of the data files."""
    num_told: int = 0
    counts: dict[str, int] = field(default_factory=lambda: {"failed": 0, "infeasible": 0})
    untold: set[int] = field(default_factory=set)
    """Numbers of the trials asked and not yet told, noted in the same storage-write block as
    the ask, so that however the driver stops none is left RUNNING."""
    outcomes: dict[str, tuple[int, TrialOutcome]] = field(default_factory=dict)
    """Per configuration digest, the first trial that simulated it and its outcome."""
    running: dict[str, Flight] = field(default_factory=dict)
    """Per configuration digest, the flight simulating it now."""
    num_simulated: int = 0
    """Trials sent to a worker in this stage (the rest were infeasible or answered again)."""

    @property
    def names(self) -> set[str]:
        return set(self.study.space.active(self.study.base))

    # One trial ----------------------------------------------------------------------------------

    def ask(self) -> Flight:
        if self.sampler_for is not None:
            before = sum(t.state != TrialState.WAITING and not is_interrupted(t)
                         for t in self.st.get_trials(deepcopy=False))
            self.st.sampler = self.sampler_for(before)
        with storage_writes():
            trial = self.st.ask()
            self.untold.add(trial.number)
            try:
                values = self.study.space.suggest(trial, self.study.base)
            except Exception as err:
                trial.set_user_attr("failure_reason", one_line(err))
                self.st.tell(trial, state=TrialState.FAIL)
                self.untold.discard(trial.number)
                raise
        f = Flight(trial=trial, values=values)
        digest, reason = resolve(self.study.base, values, self.overrides, self.spec)
        f.digest = digest
        if reason is not None:
            f.outcome = TrialOutcome(status="infeasible", reason=reason)
        elif digest in self.outcomes:
            first, outcome = self.outcomes[digest]
            f.outcome = dataclasses.replace(outcome, elapsed_s=0.0)
            trial.set_user_attr("same_config_as", first)
        elif digest in self.running:
            f.twin = self.running[digest]
            trial.set_user_attr("same_config_as", f.twin.trial.number)
        else:
            self.running[digest] = f
            self.num_simulated += 1
        return f

    def dispatch(self, flights: list[Flight]) -> None:
        """Commit the parameters of these just-asked flights (one storage transaction), so that
        a resumed search can run them again, then send those to simulate to the workers."""
        with storage_writes():
            self.storage.flush([f.trial._trial_id for f in flights])
        for f in flights:
            if f.outcome is not None or f.twin is not None:
                continue
            args = (self.study.base, f.values, self.overrides)
            if self.shipment is not None:
                args = tuple(self.shipment.localize(a) for a in args)
            f.ref = self.pool.submit(*args, self.spec)
            f.deadline = time.monotonic() + self.study.execution.trial_timeout_s

    def tell(self, f: Flight) -> None:
        with storage_writes():
            self._tell(f)
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(failed=self.counts["failed"],
                                 infeasible=self.counts["infeasible"],
                                 pareto=len(self.st.best_trials))

    def _tell(self, f: Flight) -> None:
        t, o = f.trial, f.outcome
        assert o is not None
        if f.digest is not None and self.running.get(f.digest) is f:
            del self.running[f.digest]
            if o.status == "complete":
                self.outcomes[f.digest] = (t.number, o)
        t.set_user_attr("fidelity", self.fidelity)
        t.set_user_attr("elapsed_s", o.elapsed_s)
        if o.status == "complete":
            for name, value in o.constraints.items():
                t.set_constraint(name, value)
            if o.constraints:
                # optuna-dashboard reads the values as one list under "constraints" (the
                # layout before Optuna 5's named constraints) to mark infeasible trials.
                self.storage.set_trial_system_attr(t._trial_id, DASHBOARD_CONSTRAINTS_ATTR,
                                                   list(o.constraints.values()))
            t.set_user_attr("metrics", o.metrics)
            t.set_user_attr("summary", o.summary)
            t.set_user_attr("feasible", o.feasible)
            t.set_user_attr("violations", list(o.violations))
            t.set_user_attr("profile", o.profile)
            t.set_user_attr("calibrated", o.calibrated)
            if o.envelopes:
                t.set_user_attr("envelopes", o.envelopes)
                t.set_user_attr("envelope_method", o.envelope_method)
            if o.explanation is not None:
                t.set_user_attr("explanation", o.explanation)
            if o.explanation_error is not None:
                t.set_user_attr("explanation_error", o.explanation_error)
            self.st.tell(t, list(o.values))
        else:
            t.set_user_attr("feasible", False)
            key = "infeasible_reason" if o.status == "infeasible" else "failure_reason"
            t.set_user_attr(key, o.reason or "unknown")
            self.st.tell(t, state=TrialState.FAIL)
            self.counts[o.status] += 1
        self.untold.discard(t.number)
        self.num_told += 1

    # Waiting ------------------------------------------------------------------------------------

    def wait(self, flights: list[Flight], *, first_only: bool) -> list[Flight]:
        """Wait for the flights' tasks (all of them, or the first to end); cancel any that run
        past their deadline. Returns the flights that have an outcome."""
        timeout_s = self.study.execution.trial_timeout_s
        while True:
            for f in flights:
                if f.outcome is None and f.twin is not None and f.twin.outcome is not None:
                    f.outcome = dataclasses.replace(f.twin.outcome, elapsed_s=0.0)
            pending = [f for f in flights if f.outcome is None]
            done = [f for f in flights if f.outcome is not None]
            if not pending or (first_only and done):
                return done
            pending = [f for f in pending if f.twin is None]
            now = time.monotonic()
            for f in pending:
                if now < f.deadline:
                    continue
                if self.pool.wait([f.ref], 0):
                    f.outcome = self.pool.result(f.ref)
                else:
                    self.pool.cancel(f.ref)
                    f.outcome = TrialOutcome(status="failed",
                                             reason=f"timed out after {timeout_s:g} s",
                                             elapsed_s=timeout_s)
            pending = [f for f in pending if f.outcome is None]
            if not pending:
                continue
            wait_s = min(_WAIT_SLICE_S,
                         max(0.0, min(f.deadline for f in pending) - time.monotonic()))
            by_ref = {f.ref: f for f in pending}
            for ref in self.pool.wait(list(by_ref), wait_s):
                by_ref[ref].outcome = self.pool.result(ref)

    def cancel(self, flights: list[Flight]) -> None:
        """The driver is stopping abnormally: stop the tasks, mark their trials interrupted."""
        for f in flights:
            if f.ref is not None and f.outcome is None:
                self.pool.cancel(f.ref)
        if self.untold:
            stuck = [t for t in self.st.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                     if t.number in self.untold]
            interrupt_trials(self.st, self.storage, stuck, self.names)

    # A stage ------------------------------------------------------------------------------------

    def run(self, budget: int, can_ask: Callable[[], bool]) -> str:
        """Run up to `budget` more trials while `can_ask()`; returns what stopped it."""
        flights: list[Flight] = []
        try:
            if self.study.execution.deterministic:
                return self._run_batches(budget, can_ask, flights)
            return self._run_async(budget, can_ask, flights)
        except BaseException:
            self.cancel(flights)
            raise

    def _stop_reason(self, budget: int, in_flight: int, can_ask: Callable[[], bool]) -> str | None:
        if self.num_told + in_flight >= budget:
            return "n_trials"
        if time.monotonic() >= self.deadline:
            return "timeout"
        if not can_ask():
            return "grid"
        return None

    def _run_batches(self, budget: int, can_ask: Callable[[], bool],
                     flights: list[Flight]) -> str:
        """Ask `workers` trials, wait for all, tell them in trial-number order: the same seed
        gives the same trials whatever the timing."""
        while True:
            stop = self._stop_reason(budget, 0, can_ask)
            if stop is not None:
                return stop
            while (len(flights) < self.pool.workers
                   and self._stop_reason(budget, len(flights), can_ask) is None):
                flights.append(self.ask())
            self.dispatch(flights)
            self.wait(flights, first_only=False)
            for f in sorted(flights, key=lambda f: f.trial.number):
                self.tell(f)
            flights.clear()

    def _run_async(self, budget: int, can_ask: Callable[[], bool],
                   flights: list[Flight]) -> str:
        """Keep `workers` trials in flight; tell each as it ends."""
        stop: str | None = None
        while True:
            while len(flights) < self.pool.workers:
                stop = self._stop_reason(budget, len(flights), can_ask)
                if stop is not None:
                    break
                f = self.ask()
                if f.outcome is not None:
                    self.tell(f)
                else:
                    self.dispatch([f])
                    flights.append(f)
            if not flights:
                return stop or "n_trials"
            for f in self.wait(flights, first_only=True):
                self.tell(f)
                flights.remove(f)


