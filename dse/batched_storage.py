"""The Optuna storage a search writes through: each running trial's parameters, attributes,
values and state committed together, in one storage transaction per step of the trial.

Optuna's own storages commit every call: a trial of a search asked, given three parameters,
a dozen attributes and its constraints, then told, cost 16 SQLite commits, each one syncing the
database file to disk. Here the writes to a trial made between two steps are kept and committed
at the step: when its parameters are chosen (`flush`, before the trial is sent to a worker) and
when it is told (its state and values, in the same transaction). The stored trial is the same,
attribute for attribute, as the one Optuna's per-call writes leave.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import optuna
from optuna.distributions import BaseDistribution, distribution_to_json
from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

if TYPE_CHECKING:
    from optuna.study._frozen import FrozenStudy

_States = dict[int, tuple[TrialState, "Sequence[float] | None"]]
"""Trial id -> the state (and values) a commit sets."""


@dataclass
class _Pending:
    """Writes to one held trial not yet committed."""

    params: dict[str, tuple[float, BaseDistribution]] = field(default_factory=dict)
    """Name -> (value in Optuna's internal representation, distribution)."""
    user_attrs: dict[str, Any] = field(default_factory=dict)
    system_attrs: dict[str, Any] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.params or self.user_attrs or self.system_attrs)

    def over(self, trial: FrozenTrial) -> FrozenTrial:
        """A copy of `trial` with these writes made, its dicts its own (Optuna's `Trial` adds
        to the dicts of the trial it reads); `trial` is unchanged."""
        t = copy.copy(trial)
        t.params = {**trial.params, **{k: d.to_external_repr(v)
                                       for k, (v, d) in self.params.items()}}
        t.distributions = {**trial.distributions, **{k: d for k, (_, d) in self.params.items()}}
        t.user_attrs = {**trial.user_attrs, **self.user_attrs}
        t.system_attrs = {**trial.system_attrs, **self.system_attrs}
        return t


@dataclass
class _Held:
    """A trial this storage started running: its kept writes, and the trial as committed."""

    pending: _Pending = field(default_factory=_Pending)
    stored: FrozenTrial | None = None
    """As read from the storage underneath, then with each commit made; None until read."""


_Commit = Callable[[dict[int, _Pending], _States], None]
"""Commits the kept writes of some trials, and the new state of some, in one transaction."""


class BatchedStorage(BaseStorage):
    """Optuna storage over another one that commits the writes to a running trial in batches.

    Lifecycle of a trial here: it is *held* from the moment this storage starts it running (a
    new trial created without a template, or a queued one popped to RUNNING: `Study.ask`) until
    its state changes again (`Study.tell`). While held, its `set_trial_param`,
    `set_trial_user_attr` and `set_trial_system_attr` are kept in memory, and every read of
    the trial (`get_trial`, `get_all_trials`) returns it with them made. `flush` commits them;
    `set_trial_state_values` commits them with the new state and values. Each commit is one
    transaction of the storage underneath: one SQLite/RDB transaction, or one append to a
    journal file. Every other call goes straight to the storage underneath.

    Invariants: a held trial is RUNNING in the storage underneath and only this object writes
    to it, so `get_trial` reads it from there once and keeps it up to date itself. What other
    processes (optuna-dashboard, a report) read of it lags behind by the writes not yet
    committed. A trial's writes are taken out before their commit: should the commit fail, its
    error propagates and those writes are not retried.

    On a storage with no single-transaction commit here (an in-memory or gRPC storage, or an
    Optuna whose internals differ from the ones this relies on), the kept writes are made one
    call at a time, at the same steps; `batched` is then False.
    """

    def __init__(self, storage: BaseStorage) -> None:
        # What `optuna.create_study` would have used: an RDB storage behind Optuna's cache of
        # finished trials, so that reads do not load every trial again.
        self._inner = optuna.storages.get_storage(storage)
        self._held: dict[int, _Held] = {}
        commit = _single_transaction(storage)
        self.batched = commit is not None
        self._commit: _Commit = commit or self._one_call_at_a_time

    # Steps of a held trial ---------------------------------------------------------------------

    def flush(self, trial_ids: Iterable[int]) -> None:
        """Commit the kept writes of these held trials, all in one transaction; they stay held.
        Trials not held, or with nothing kept, are skipped."""
        batch: dict[int, _Pending] = {}
        for trial_id in trial_ids:
            held = self._held.get(trial_id)
            if held is not None and held.pending:
                batch[trial_id], held.pending = held.pending, _Pending()
        if not batch:
            return
        self._commit(batch, {})
        for trial_id, pending in batch.items():
            held = self._held[trial_id]
            if held.stored is not None:
                held.stored = pending.over(held.stored)

    def _one_call_at_a_time(self, batch: dict[int, _Pending], states: _States) -> None:
        for trial_id, p in batch.items():
            for name, (value, dist) in p.params.items():
                self._inner.set_trial_param(trial_id, name, value, dist)
            for key, value in p.user_attrs.items():
                self._inner.set_trial_user_attr(trial_id, key, value)
            for key, value in p.system_attrs.items():
                self._inner.set_trial_system_attr(trial_id, key, value)
        for trial_id, (state, values) in states.items():
            self._inner.set_trial_state_values(trial_id, state, values)

    # Trial writes ------------------------------------------------------------------------------

    def create_new_trial(self, study_id: int, template_trial: FrozenTrial | None = None) -> int:
        trial_id = self._inner.create_new_trial(study_id, template_trial)
        if template_trial is None:
            self._hold(trial_id)
        return trial_id

    def _hold(self, trial_id: int) -> None:
        """Start keeping the writes to a trial this storage just started running."""
        self._held[trial_id] = _Held()

    def set_trial_param(self, trial_id: int, param_name: str, param_value_internal: float,
                        distribution: BaseDistribution) -> None:
        held = self._held.get(trial_id)
        if held is None:
            self._inner.set_trial_param(trial_id, param_name, param_value_internal, distribution)
        else:
            held.pending.params[param_name] = (param_value_internal, distribution)

    def set_trial_user_attr(self, trial_id: int, key: str, value: Any) -> None:
        held = self._held.get(trial_id)
        if held is None:
            self._inner.set_trial_user_attr(trial_id, key, value)
        else:
            held.pending.user_attrs[key] = value

    def set_trial_system_attr(self, trial_id: int, key: str, value: Any) -> None:
        held = self._held.get(trial_id)
        if held is None:
            self._inner.set_trial_system_attr(trial_id, key, value)
        else:
            held.pending.system_attrs[key] = value

    def set_trial_state_values(self, trial_id: int, state: TrialState,
                               values: Sequence[float] | None = None) -> bool:
        if trial_id in self._held and state != TrialState.RUNNING:
            held = self._held.pop(trial_id)
            self._commit({trial_id: held.pending}, {trial_id: (state, values)})
            return True
        popped = self._inner.set_trial_state_values(trial_id, state, values)
        if popped and state == TrialState.RUNNING:
            self._hold(trial_id)
        return popped

    def set_trial_intermediate_value(self, trial_id: int, step: int,
                                     intermediate_value: float) -> None:
        self.flush([trial_id])
        if trial_id in self._held:
            self._held[trial_id].stored = None      # changed underneath: read it again
        self._inner.set_trial_intermediate_value(trial_id, step, intermediate_value)

    # Trial reads -------------------------------------------------------------------------------

    def get_trial(self, trial_id: int) -> FrozenTrial:
        held = self._held.get(trial_id)
        if held is None:
            return self._inner.get_trial(trial_id)
        if held.stored is None:
            held.stored = self._inner.get_trial(trial_id)
        return held.pending.over(held.stored)

    def get_all_trials(self, study_id: int, deepcopy: bool = True,
                       states: Container[TrialState] | None = None) -> list[FrozenTrial]:
        trials = self._inner.get_all_trials(study_id, deepcopy=deepcopy, states=states)
        if any(held.pending for held in self._held.values()):
            trials = [self._held[t._trial_id].pending.over(t)
                      if t._trial_id in self._held and self._held[t._trial_id].pending else t
                      for t in trials]
        return trials

    def get_trial_id_from_study_id_trial_number(self, study_id: int, trial_number: int) -> int:
        return self._inner.get_trial_id_from_study_id_trial_number(study_id, trial_number)

    def get_best_trial(self, study_id: int) -> FrozenTrial:
        return self._inner.get_best_trial(study_id)

    # Studies: straight through -----------------------------------------------------------------

    def create_new_study(self, directions: Sequence[StudyDirection],
                         study_name: str | None = None) -> int:
        return self._inner.create_new_study(directions, study_name)

    def delete_study(self, study_id: int) -> None:
        self._inner.delete_study(study_id)

    def set_study_user_attr(self, study_id: int, key: str, value: Any) -> None:
        self._inner.set_study_user_attr(study_id, key, value)

    def set_study_system_attr(self, study_id: int, key: str, value: Any) -> None:
        self._inner.set_study_system_attr(study_id, key, value)

    def get_study_id_from_name(self, study_name: str) -> int:
        return self._inner.get_study_id_from_name(study_name)

    def get_study_name_from_id(self, study_id: int) -> str:
        return self._inner.get_study_name_from_id(study_id)

    def get_study_directions(self, study_id: int) -> list[StudyDirection]:
        return self._inner.get_study_directions(study_id)

    def get_study_user_attrs(self, study_id: int) -> dict[str, Any]:
        return self._inner.get_study_user_attrs(study_id)

    def get_study_system_attrs(self, study_id: int) -> dict[str, Any]:
        return self._inner.get_study_system_attrs(study_id)

    def get_all_studies(self) -> list[FrozenStudy]:
        return self._inner.get_all_studies()

    def remove_session(self) -> None:
        self._inner.remove_session()


# -- one transaction per commit -------------------------------------------------------------------
#
# Optuna has no public call that writes several fields of an existing trial at once (a whole new
# trial, `Study.add_trial`, is one transaction, but a trial has to exist before it is asked).
# The commits below are built from the pieces Optuna's RDB and journal storages make their own
# per-call writes of; `_single_transaction` checks that those are there, and where they are not,
# BatchedStorage writes one call at a time.

_RDB_HELPERS = ("scoped_session", "_set_trial_param_without_commit",
                "_set_trial_value_without_commit")
_JOURNAL_HELPERS = ("_replay_result", "_backend", "_thread_lock", "_sync_with_backend")


def _single_transaction(storage: BaseStorage) -> _Commit | None:
    """The one-transaction commit for this storage, or None where there is none."""
    try:
        if isinstance(storage, RDBStorage):
            from optuna.storages._rdb import models
            from optuna.storages._rdb.storage import _create_scoped_session

            columns = ("trial_id", "key", "value_json")
            if (callable(_create_scoped_session)
                    and all(hasattr(storage, name) for name in _RDB_HELPERS)
                    and hasattr(models.TrialModel, "find_or_raise_by_id")
                    and all(hasattr(model, c) for c in columns
                            for model in (models.TrialUserAttributeModel,
                                          models.TrialSystemAttributeModel))):
                return functools.partial(_rdb_commit, storage)
        elif isinstance(storage, JournalStorage):
            from optuna.storages.journal._storage import JournalOperation

            if (hasattr(JournalOperation, "SET_TRIAL_STATE_VALUES")
                    and all(hasattr(storage, name) for name in _JOURNAL_HELPERS)):
                return functools.partial(_journal_commit, storage)
    except ImportError:
        pass
    return None


def _rdb_commit(storage: RDBStorage, batch: dict[int, _Pending], states: _States) -> None:
    """One RDB transaction. Parameters go through Optuna's own helper (which checks each
    against the study's earlier distributions); attributes are written as Optuna writes them
    (JSON text, a key set again replaced), two statements per table however many; a new state
    is written as `RDBStorage.set_trial_state_values` writes it, with the trial's row locked."""
    import sqlalchemy
    from optuna.storages._rdb import models
    from optuna.storages._rdb.storage import _create_scoped_session

    def write_attrs(session: Any, model: Any, trial_id: int, attrs: dict[str, Any]) -> None:
        if attrs:
            session.execute(sqlalchemy.delete(model).where(model.trial_id == trial_id,
                                                           model.key.in_(list(attrs))))
            session.execute(sqlalchemy.insert(model),
                            [{"trial_id": trial_id, "key": key, "value_json": json.dumps(value)}
                             for key, value in attrs.items()])

    with _create_scoped_session(storage.scoped_session) as session:
        for trial_id in dict.fromkeys([*batch, *states]):
            trial = models.TrialModel.find_or_raise_by_id(trial_id, session, for_update=True)
            storage.check_trial_is_updatable(trial_id, trial.state)
            p = batch.get(trial_id, _Pending())
            for name, (value, dist) in p.params.items():
                storage._set_trial_param_without_commit(session, trial_id, name, value, dist)
            write_attrs(session, models.TrialUserAttributeModel, trial_id, p.user_attrs)
            write_attrs(session, models.TrialSystemAttributeModel, trial_id, p.system_attrs)
            if trial_id in states:
                state, values = states[trial_id]
                for objective, v in enumerate(values or ()):
                    storage._set_trial_value_without_commit(session, trial, objective, v)
                trial.state = state
                if state.is_finished():
                    trial.datetime_complete = datetime.now()


def _journal_commit(storage: JournalStorage, batch: dict[int, _Pending],
                    states: _States) -> None:
    """One append to the journal: the log lines `JournalStorage`'s per-call writes would
    append, in the same order, written under one lock with one fsync."""
    from optuna.storages.journal._storage import JournalOperation as op

    logs: list[dict[str, Any]] = []
    for trial_id, p in batch.items():
        logs += [{"op_code": op.SET_TRIAL_PARAM, "trial_id": trial_id, "param_name": name,
                  "param_value_internal": value, "distribution": distribution_to_json(dist)}
                 for name, (value, dist) in p.params.items()]
        logs += [{"op_code": op.SET_TRIAL_USER_ATTR, "trial_id": trial_id,
                  "user_attr": {key: value}} for key, value in p.user_attrs.items()]
        logs += [{"op_code": op.SET_TRIAL_SYSTEM_ATTR, "trial_id": trial_id,
                  "system_attr": {key: value}} for key, value in p.system_attrs.items()]
    for trial_id, (state, values) in states.items():
        log: dict[str, Any] = {"op_code": op.SET_TRIAL_STATE_VALUES, "trial_id": trial_id,
                               "state": state, "values": values}
        if state.is_finished():
            log["datetime_complete"] = datetime.now(tz=timezone.utc).isoformat(
                timespec="microseconds")
        logs.append(log)
    with storage._thread_lock:
        worker_id = storage._replay_result.worker_id
        storage._backend.append_logs([{**log, "worker_id": worker_id} for log in logs])
        storage._sync_with_backend()
