"""Where a search keeps and runs its trials: Optuna storages, seeded samplers, a Ray task pool."""

from __future__ import annotations

import hashlib
import io
import os
import re
import signal
import sys
import threading
import time
import warnings
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from dse.evaluate import TrialOutcome, clip, one_line, run_trial
from dse.outputs import write_problem
from dse.ray_connect import last_ray_complaint, probe_ray_address, stderr_kept
from dse.reaper import Reaper, children_of
from dse.study import StudyConfig
from simcore.errors import ConfigError

_OBJECT_STORE_BYTES = 256 * 2**20
"""Ray's object store: trial arguments and outcomes are small."""


def available_cpus() -> int:
    """The CPUs this process may run on: its affinity mask where the OS keeps one (taskset,
    cpusets, a batch scheduler's allocation), else every CPU of the machine."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:      # no affinity masks (macOS, Windows)
        return os.cpu_count() or 1


def storage_file(url: str) -> Path | None:
    """The file of a journal:// or sqlite:/// storage URL; None for other URLs and :memory:."""
    for scheme in ("journal://", "sqlite:///"):
        if url.startswith(scheme):
            path = url[len(scheme):]
            return Path(path) if path and path != ":memory:" else None
    return None


@contextmanager
def sole_search(url: str, name: str):
    """Hold study `name`'s lock for a search (a hidden file beside a sqlite or journal storage
    `url`, one per study name): a second `dse search` of the same study while one runs would
    mark the first one's running trials interrupted and queue them again, and the first would
    then fail to record them. ConfigError when it is held."""
    import fcntl

    path = storage_file(url)
    if path is None:                 # a database server: it keeps its own transactions
        yield
        return
    digest = hashlib.sha256(name.encode()).hexdigest()[:12]
    lock = path.parent / f".{path.name}.{digest}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise ConfigError(f"study {name!r} in {path} is being searched by another "
                              "dse search; wait for it to end (or stop it), then run this "
                              "again") from None
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def check_storage_writable(url: str) -> None:
    """Raise ConfigError unless the file of a sqlite:/// or journal:// storage can be created or
    written (other URLs are checked when they are opened)."""
    path = storage_file(url)
    problem = write_problem(path, folder=False) if path is not None else None
    if problem:
        raise ConfigError(f"storage: cannot keep the study in {path}: {problem}")


def open_storage(url: str) -> optuna.storages.BaseStorage:
    """The Optuna storage for a URL: journal:///path.log, sqlite:///path.db or another RDB URL.

    Files (and their folders) are created as needed.
    """
    path = storage_file(url)
    try:
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        if url.startswith("journal://"):
            from optuna.storages.journal import JournalFileBackend

            return optuna.storages.JournalStorage(JournalFileBackend(str(path)))
        return optuna.storages.RDBStorage(url)
    except Exception as err:  # OSError, or SQLAlchemy's many kinds: the user needs one sentence
        raise ConfigError(f"storage: cannot open {url.split('@')[-1]} ({one_line(err)})") from None


class _AskTellGridSampler(optuna.samplers.GridSampler):
    """Optuna's GridSampler without its stop at the end of the grid.

    GridSampler.after_trial calls `study.stop()`, which raises outside `optimize` (optuna
    issues #4121, #5141; documented for ask-and-tell); the driver stops asking by itself when
    every grid point has been run.
    """

    def after_trial(self, study, trial, state, values) -> None:
        return None


class PointsSampler(optuna.samplers.BaseSampler):
    """A grid given as a list of points that need not be a product (a space searching the
    serving mode: each mode's own grid): each trial takes the first point, in an order the seed
    shuffles, that no other trial (but an interrupted one) has taken; trials with fixed
    parameters (enqueued) take none. The driver stops asking once every point has run."""

    ATTR = "grid_point"

    def __init__(self, points: list[dict[str, Any]], seed: int | None = None) -> None:
        import numpy as np

        order = np.random.RandomState(seed).permutation(len(points))
        self.points = [points[i] for i in order]

    def infer_relative_search_space(self, study, trial) -> dict:
        return {}

    def sample_relative(self, study, trial, search_space) -> dict:
        return {}

    def before_trial(self, study, trial) -> None:
        if "fixed_params" in trial.system_attrs:
            return
        from dse.driver import is_interrupted

        taken: set[int] = set()
        ran: set[str] = set()
        for t in study.get_trials(deepcopy=False):
            if t.number == trial.number or is_interrupted(t):
                continue
            if self.ATTR in t.system_attrs:
                taken.add(t.system_attrs[self.ATTR])
            elif t.params:
                ran.add(_point_key(t.params))          # an enqueued trial, e.g. the baseline
        free = next((i for i in range(len(self.points))
                     if i not in taken and _point_key(self.points[i]) not in ran), None)
        # Every point taken (the driver asks no more then): repeat the first.
        study._storage.set_trial_system_attr(trial._trial_id, self.ATTR,
                                             0 if free is None else free)

    def sample_independent(self, study, trial, param_name, param_distribution):
        index = trial.system_attrs.get(self.ATTR, 0)
        return self.points[index][param_name]


def _point_key(params: dict[str, Any]) -> str:
    import json

    return json.dumps(params, sort_keys=True, default=str)


def make_sampler(study: StudyConfig, seed: int | None = None) -> optuna.samplers.BaseSampler:
    """The study's Optuna sampler, seeded with `seed` (default: the study's `sampler.seed`).
    SLOs reach every one of them through the trials' constraints (`Trial.set_constraint`),
    which Optuna 5 samplers read themselves."""
    s = study.sampler
    if seed is not None:
        s = s.model_copy(update={"seed": seed})
    match s.kind:
        case "tpe":
            return optuna.samplers.TPESampler(multivariate=True, seed=s.seed,
                                              n_startup_trials=s.n_startup_trials)
        case "nsga2":
            return optuna.samplers.NSGAIISampler(population_size=s.population_size, seed=s.seed)
        case "nsga3":
            return optuna.samplers.NSGAIIISampler(population_size=s.population_size, seed=s.seed)
        case "gp":
            try:
                import torch  # noqa: F401  (GPSampler imports it lazily; fail before the search)
            except ImportError:
                raise ConfigError("sampler.kind: the gp sampler needs torch: pip install torch"
                                  ) from None
            return optuna.samplers.GPSampler(seed=s.seed, n_startup_trials=s.n_startup_trials,
                                             deterministic_objective=True)
        case "random":
            return optuna.samplers.RandomSampler(seed=s.seed)
        case "grid":
            if study.space.serving is not None:
                from dse.space import grid_points
                return PointsSampler(grid_points(study.space, study.base), seed=s.seed)
            return _AskTellGridSampler(study.space.grid(study.base), seed=s.seed)
    raise ConfigError(f"sampler.kind: unknown sampler {s.kind!r}")


_ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")
_DEATH_RE = re.compile(r"^\(raylet\) (A worker died or was killed while executing a task.*)$")
_DEATH_FIELDS_RE = re.compile(r"Worker PID: (?P<pid>\d+).*?Worker exit type: (?P<type>\w+)"
                              r"(?: Worker exit detail: (?P<detail>.*))?$")
_DEATH_WAIT_S = 2.0
"""How long a trial whose worker died waits for Ray's report of why (it comes separately)."""


@dataclass(frozen=True)
class _Report:
    text: str
    at: float


class RayConsole(io.TextIOBase):
    """Stands in for `sys.stdout` while a pool uses Ray, between `install` and `remove`.

    Ray's driver prints what the raylet reports (e.g. "(raylet) A worker died or was killed
    while executing a task ...") on `sys.stdout` from a thread of its own. Worker-death reports
    are kept here for the trial whose worker died (`death_reason`) instead of reaching the
    terminal; every other line goes on to the stream it replaced, unchanged.
    """

    def __init__(self, out: Any) -> None:
        super().__init__()
        self.out = out
        self._partial = ""
        self._deaths: deque[_Report] = deque()
        self._cond = threading.Condition()

    @classmethod
    def install(cls) -> "RayConsole":
        console = cls(sys.stdout)
        sys.stdout = console
        return console

    def remove(self) -> None:
        with self._cond:
            rest, self._partial = self._partial, ""
        if rest:
            self.out.write(rest)
        if sys.stdout is self:
            sys.stdout = self.out

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return self.out.isatty()

    def flush(self) -> None:
        self.out.flush()

    def write(self, text: str) -> int:
        with self._cond:
            lines = (self._partial + text).split("\n")
            self._partial = lines.pop()
            passed = []
            for line in lines:
                m = _DEATH_RE.match(_ANSI_RE.sub("", line).strip())
                if m:
                    self._deaths.append(_Report(m.group(1), time.monotonic()))
                    self._cond.notify_all()
                else:
                    passed.append(line + "\n")
        if passed:
            self.out.write("".join(passed))
        return len(text)

    def death_reason(self, since: float, timeout_s: float = _DEATH_WAIT_S) -> str | None:
        """Ray's report of a worker death made after `since` (driver clock), waiting up to
        `timeout_s` for it, as one sentence; None if none came."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                while self._deaths and self._deaths[0].at < since:
                    self._deaths.popleft()
                if self._deaths:
                    report = self._deaths.popleft().text
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)
        m = _DEATH_FIELDS_RE.search(report)
        if m is None:
            return clip(f"the Ray worker died: {report}")
        detail = f": {m.group('detail')}" if m.group("detail") else ""
        return clip(f"the Ray worker (pid {m.group('pid')}) died, {m.group('type')}{detail}")


class RayPool:
    """Ray tasks that run `dse.evaluate.run_trial`, one CPU each, never retried.

    `start()` (or the first `submit`) starts or joins Ray, once however many stages use the pool:
    the Ray already running in this process, the cluster at `address` (asked first whether it
    answers, within `connect_timeout_s`), or a local one with `workers` CPUs (quiet: no
    dashboard, worker logs not forwarded; a `dse.reaper` watchdog stops its processes should
    this process be killed before it shuts them down). `workers` None means as many as there
    are CPUs to run them: `available_cpus()` for a local Ray, the CPUs of the Ray it joined
    otherwise; from `start()` on, `workers` is that number and `workers_from` says where it
    came from. A cluster joined here runs the tasks in `runtime_env` when one is given
    (see `dse.ship`). Ray's worker-death reports become the failure reason of the trial whose
    worker died (`RayConsole`). Starting Ray leaves this process's SIGTERM handler as it was
    (ray.init replaces it with one that exits at once, after a stack dump). `close()` shuts
    down only a Ray started or joined here; it is safe to call more than once.
    """

    def __init__(self, workers: int | None, address: str | None, *,
                 connect_timeout_s: float = 10.0,
                 runtime_env: dict[str, Any] | None = None) -> None:
        self.workers = workers
        self.workers_from = "execution.workers"
        self.started = False    # Ray started or joined (once); close() leaves it set
        self.address = address
        self.connect_timeout_s = connect_timeout_s
        self.runtime_env = runtime_env
        self._ray: Any = None
        self._remote: Any = None
        self._owned = False
        self._console: RayConsole | None = None
        self._submitted_at: dict[Any, float] = {}
        self._reaper: Reaper | None = None

    def start(self) -> None:
        if self._ray is not None:
            return
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        # Every worker-death report is its own trial's: none folded into "[repeated 2x]".
        os.environ.setdefault("RAY_DEDUP_LOGS", "0")
        import ray

        if ray.is_initialized():
            if self.runtime_env:
                raise ConfigError("execution.ship_to_workers: Ray already runs in this process, "
                                  "so what the workers are sent cannot be set; set it to none, "
                                  "or search from a process of its own")
        else:
            if self.address:
                probe_ray_address(self.address, self.connect_timeout_s)
            elif self.workers is None:
                self.workers = available_cpus()
                self.workers_from = "one per CPU this process may use"
            quiet = dict(log_to_driver=False, logging_level="ERROR")
            on_term = signal.getsignal(signal.SIGTERM)
            core_log: list[str] = []
            try:
                if self.address:
                    with stderr_kept(core_log):
                        ray.init(address=self.address, runtime_env=self.runtime_env, **quiet)
                else:
                    before = children_of(os.getpid())
                    ray.init(num_cpus=self.workers, include_dashboard=False,
                             object_store_memory=_OBJECT_STORE_BYTES, **quiet)
                    # Stops what Ray started here even if this process is killed outright.
                    self._reaper = Reaper.start(children_of(os.getpid()) - before)
            except BaseException as err:
                ray.shutdown()      # whatever it had started
                if isinstance(err, SystemExit):   # ray.init's own SIGTERM handler, meanwhile
                    raise KeyboardInterrupt from None
                if not isinstance(err, Exception):
                    raise
                where = f"the Ray cluster at {self.address}" if self.address else "a local Ray"
                said = last_ray_complaint(core_log)
                raise ConfigError(f"execution.ray_address: cannot start or join {where} "
                                  f"({one_line(err)}" + (f"; Ray's last complaint: {said}"
                                                         if said else "") + ")") from None
            finally:
                if on_term is not None and threading.current_thread() is threading.main_thread():
                    signal.signal(signal.SIGTERM, on_term)
            self._owned = True
        if self.workers is None:
            self.workers = max(1, int(ray.cluster_resources().get("CPU", 1)))
            self.workers_from = ("the CPUs of the Ray cluster at " + self.address if self.address
                                 else "the CPUs of the Ray running in this process")
        self._ray = ray
        self.started = True
        self._remote = ray.remote(num_cpus=1, max_retries=0)(run_trial)
        self._console = RayConsole.install()

    def submit(self, *args: Any) -> Any:
        self.start()
        ref = self._remote.remote(*args)
        self._submitted_at[ref] = time.monotonic()
        return ref

    def wait(self, refs: list[Any], timeout_s: float) -> list[Any]:
        """The refs (at most one) that are done within `timeout_s`."""
        return self._ray.wait(refs, num_returns=1, timeout=timeout_s)[0]

    def result(self, ref: Any) -> TrialOutcome:
        since = self._submitted_at.pop(ref, 0.0)
        try:
            return self._ray.get(ref)
        except self._ray.exceptions.WorkerCrashedError as err:
            reason = self._console.death_reason(since) if self._console else None
            return TrialOutcome(status="failed", reason=reason or one_line(err))
        except Exception as err:  # e.g. the task could not be scheduled: a failed trial
            return TrialOutcome(status="failed", reason=one_line(err))

    def cancel(self, ref: Any) -> None:
        self._submitted_at.pop(ref, None)
        self._ray.cancel(ref, force=True)

    def close(self) -> None:
        try:
            if self._owned:
                self._ray.shutdown()
        finally:
            if self._reaper is not None:
                self._reaper.close()
                self._reaper = None
            if self._console is not None:
                self._console.remove()
            self._ray = self._remote = self._console = None
            self._owned = False
            self._submitted_at.clear()


@contextmanager
def quiet_optuna() -> Iterator[None]:
    """Optuna without its INFO lines and experimental-feature warnings, restored after."""
    before = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            yield
    finally:
        optuna.logging.set_verbosity(before)
