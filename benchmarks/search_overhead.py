"""What a search trial costs in storage writes, apart from its simulation, and the quickstart's
wall time.

Part 1 runs a fixed number of trials of the quickstart study's space with nothing simulated:
every trial gets the same outcome, that of one real quickstart trial computed at the start,
so its attributes have their real sizes. It does so twice per storage (SQLite and a journal
file, both in a temporary folder, and Optuna's in-memory storage as the floor with no I/O):

- per call (before): the driver's writes one storage call at a time, as they were made until
  trials were batched: the same loop over a storage that holds no trial, so the ask, each
  parameter, each attribute and constraint, and the tell are each their own transaction;
- batched (after): over `dse.batched_storage.BatchedStorage` as a search runs it.

Both run the driver itself (`dse.driver.StageDriver`, deterministic batches of two) with a
stand-in pool that answers at once and configurations taken as given (no `resolve`), so nothing
but the ask/tell loop runs.

For each it prints the time per trial, split by step, and the storage write transactions per
trial (SQLite commits that wrote something; appends to the journal file). The random sampler
keeps sampling time out of the figures.

Part 2 runs `dse search` on the quickstart study (40 screened trials, 5 confirmed; Ray
start-up included) with its storage and report in a temporary folder, and prints the wall time.

Usage: python benchmarks/search_overhead.py [--trials 100] [--skip-search]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import math
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "studies" / "quickstart.yaml"
STEPS = ("ask", "dispatch", "tell")


class Counts:
    """Storage write transactions of one storage, counted as they happen."""

    def __init__(self, raw: Any) -> None:
        self.n = 0
        import optuna

        if isinstance(raw, optuna.storages.RDBStorage):
            self._count_commits(raw.engine)
        elif isinstance(raw, optuna.storages.JournalStorage):
            append = raw._backend.append_logs

            def counted(logs: list) -> None:
                self.n += 1
                append(logs)

            raw._backend.append_logs = counted

    def _count_commits(self, engine: Any) -> None:
        """A commit counts if its connection ran anything but a SELECT since the last one
        (Optuna commits its read sessions too; those write nothing)."""
        import sqlalchemy

        dirty: set[int] = set()

        def executed(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            if not statement.lstrip().upper().startswith("SELECT"):
                dirty.add(id(conn))

        def committed(conn: Any) -> None:
            if id(conn) in dirty:
                dirty.discard(id(conn))
                self.n += 1

        sqlalchemy.event.listen(engine, "after_cursor_execute", executed)
        sqlalchemy.event.listen(engine, "commit", committed)


def open_raw(kind: str, folder: Path) -> Any:
    import optuna
    from optuna.storages.journal import JournalFileBackend

    if kind == "sqlite":
        return optuna.storages.RDBStorage(f"sqlite:///{folder / 'study.db'}")
    if kind == "journal":
        return optuna.storages.JournalStorage(JournalFileBackend(str(folder / "study.log")))
    return optuna.storages.InMemoryStorage()


def quickstart_trial() -> tuple[Any, Any]:
    """The quickstart study and the outcome of one of its screening trials (the baseline)."""
    from dse.evaluate import EvalSpec, baseline_values, run_trial
    from dse.study import load_study

    study = load_study(QUICKSTART)
    values, why = baseline_values(study.base, study.space)
    assert values is not None, why
    outcome = run_trial(study.base, values, study.fidelity.screen, EvalSpec.of(study))
    assert outcome.status == "complete", outcome.reason
    return study, outcome


def new_study(storage: Any, study: Any) -> Any:
    import optuna

    return optuna.create_study(storage=storage, study_name=study.name,
                               directions=[o.direction for o in study.objectives],
                               sampler=optuna.samplers.RandomSampler(seed=0))


@contextlib.contextmanager
def timed(spent: dict[str, float], step: str):
    t0 = time.perf_counter()
    try:
        yield
    finally:
        spent[step] += time.perf_counter() - t0


class _AnswerAtOnce:
    """Stands in for `dse.backends.RayPool`: every task is done as soon as it is submitted,
    with the same outcome."""

    def __init__(self, outcome: Any, workers: int) -> None:
        self.outcome = outcome
        self.workers = workers

    def submit(self, *args: Any) -> object:
        return object()

    def wait(self, refs: list, timeout_s: float) -> list:
        return refs[:1]

    def result(self, ref: object) -> Any:
        return self.outcome

    def cancel(self, ref: object) -> None:
        pass


def per_call(raw: Any, study: Any, outcome: Any, n: int) -> dict[str, float]:
    """The driver's writes before batching: the same loop over a storage that holds no trial,
    so every storage call is its own transaction."""
    from dse.batched_storage import BatchedStorage

    class PerCall(BatchedStorage):
        def _hold(self, trial_id: int) -> None:
            pass

    return run_driver(PerCall(raw), study, outcome, n)


def batched(raw: Any, study: Any, outcome: Any, n: int) -> dict[str, float]:
    """The driver's own loop over a BatchedStorage."""
    from dse.batched_storage import BatchedStorage

    return run_driver(BatchedStorage(raw), study, outcome, n)


def run_driver(storage: Any, study: Any, outcome: Any, n: int) -> dict[str, float]:
    """The driver's loop over `storage` for n trials, every configuration taken as given; the
    seconds spent in each step."""
    import dse.driver
    from dse.evaluate import EvalSpec
    from optuna.trial import TrialState

    st = new_study(storage, study)
    spent: dict[str, float] = defaultdict(float)

    class Timed(dse.driver.StageDriver):
        def ask(self):
            with timed(spent, "ask"):
                return super().ask()

        def dispatch(self, flights):
            with timed(spent, "dispatch"):
                return super().dispatch(flights)

        def tell(self, f):
            with timed(spent, "tell"):
                return super().tell(f)

    numbers = itertools.count()
    resolve = dse.driver.resolve
    dse.driver.resolve = lambda *args: (str(next(numbers)), None)
    try:
        driver = Timed(st=st, storage=storage, pool=_AnswerAtOnce(outcome, 2), study=study,
                       spec=EvalSpec.of(study), overrides=dict(study.fidelity.screen),
                       fidelity="screen", deadline=math.inf)
        driver.run(n, lambda: True)
    finally:
        dse.driver.resolve = resolve
    assert len(st.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))) == n
    return spent


def storage_table(n: int) -> None:
    from dse.backends import quiet_optuna

    study, outcome = quickstart_trial()
    outcome = dataclasses.replace(outcome, elapsed_s=0.25)
    print(f"{n} trials per row, quickstart space, random sampler, nothing simulated; "
          f"{len(outcome.metrics)} metrics per trial\n")
    print(f"{'storage':<9}{'writes':<19}{'ms/trial':>9}{'commits/trial':>15}   by step (ms/trial)")
    with quiet_optuna():
        for kind in ("sqlite", "journal", "memory"):
            for label, run in (("per call (before)", per_call), ("batched (after)", batched)):
                with tempfile.TemporaryDirectory() as d:
                    raw = open_raw(kind, Path(d))
                    counts = Counts(raw)
                    t0 = time.perf_counter()
                    spent = run(raw, study, outcome, n)
                    total_ms = (time.perf_counter() - t0) / n * 1e3
                steps = ", ".join(f"{s} {spent[s] / n * 1e3:.1f}" for s in STEPS)
                commits = f"{counts.n / n:.1f}" if kind != "memory" else "-"
                print(f"{kind:<9}{label:<19}{total_ms:>9.1f}{commits:>15}   {steps}")


def search_wall_time() -> None:
    from dse.runner import run_search
    from dse.study import load_study

    with tempfile.TemporaryDirectory() as d:
        study = load_study(QUICKSTART)
        study = study.model_copy(update={
            "storage": f"sqlite:///{d}/study.db",
            "report": study.report.model_copy(update={"dir": d})})
        t0 = time.perf_counter()
        out = run_search(study, progress=False)
        wall_s = time.perf_counter() - t0
    print(f"\ndse search {QUICKSTART.relative_to(ROOT)}: {wall_s:.1f} s wall "
          f"(Ray start-up included; report not written)")
    print(f"  {out.workers_line()}")
    print(f"  {out.summary()}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=100, help="trials per storage and pattern")
    ap.add_argument("--skip-search", action="store_true", help="skip the quickstart search")
    args = ap.parse_args()
    storage_table(args.trials)
    if not args.skip_search:
        search_wall_time()


if __name__ == "__main__":
    sys.exit(main())
