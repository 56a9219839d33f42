"""Where a search keeps and runs its trials: Optuna storages, seeded samplers, a Ray task pool."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import optuna

from dse.evaluate import TrialOutcome, one_line, run_trial
from dse.study import StudyConfig
from simcore.errors import ConfigError

_OBJECT_STORE_BYTES = 256 * 2**20
"""Ray's object store: trial arguments and outcomes are small."""



def open_storage(url: str) -> optuna.storages.BaseStorage:
    """The Optuna storage for a URL: journal:///path.log, sqlite:///path.db or another RDB URL.

    Files (and their folders) are created as needed.
    """
    if url.startswith("journal://"):
        from optuna.storages.journal import JournalFileBackend

        path = Path(url[len("journal://"):])
        path.parent.mkdir(parents=True, exist_ok=True)
        return optuna.storages.JournalStorage(JournalFileBackend(str(path)))
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///"):]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
    try:
        return optuna.storages.RDBStorage(url)
    except Exception as err:  # SQLAlchemy raises many kinds; the user needs one sentence
        raise ConfigError(f"storage: cannot open {url.split('@')[-1]} ({one_line(err)})") from None


class _AskTellGridSampler(optuna.samplers.GridSampler):
    """Optuna's GridSampler without its stop at the end of the grid.

    GridSampler.after_trial calls `study.stop()`, which raises outside `optimize` (optuna
    issues #4121, #5141; documented for ask-and-tell); the driver stops asking by itself when
    every grid point has been run.
    """

    def after_trial(self, study, trial, state, values) -> None:
        return None


def make_sampler(study: StudyConfig) -> optuna.samplers.BaseSampler:
    """The study's Optuna sampler, seeded. SLOs reach every one of them through the trials'
    constraints (`Trial.set_constraint`), which Optuna 5 samplers read themselves."""
    s = study.sampler
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
            return _AskTellGridSampler(study.space.grid(study.base), seed=s.seed)
    raise ConfigError(f"sampler.kind: unknown sampler {s.kind!r}")


class RayPool:
    """Ray tasks that run `dse.evaluate.run_trial`, one CPU each, never retried.

    Ray is started, or joined, on the first `submit`: the Ray already running in this process,
    the cluster at `address`, or a local one with `workers` CPUs (quiet: no dashboard, worker
    logs not forwarded). `close()` shuts down only a Ray started or joined here.
    """

    def __init__(self, workers: int, address: str | None) -> None:
        self.workers = workers
        self.address = address
        self._ray: Any = None
        self._remote: Any = None
        self._owned = False

    def _start(self) -> Any:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        import ray

        if not ray.is_initialized():
            quiet = dict(log_to_driver=False, logging_level="ERROR")
            try:
                if self.address:
                    ray.init(address=self.address, **quiet)
                else:
                    ray.init(num_cpus=self.workers, include_dashboard=False,
                             object_store_memory=_OBJECT_STORE_BYTES, **quiet)
            except Exception as err:
                where = f"the Ray cluster at {self.address}" if self.address else "a local Ray"
                raise ConfigError(f"execution.ray_address: cannot start or join {where} "
                                  f"({one_line(err)})") from None
            self._owned = True
        self._ray = ray
        self._remote = ray.remote(num_cpus=1, max_retries=0)(run_trial)
        return ray

    def submit(self, *args: Any) -> Any:
        if self._ray is None:
            self._start()
        return self._remote.remote(*args)

    def wait(self, refs: list[Any], timeout_s: float) -> list[Any]:
        """The refs (at most one) that are done within `timeout_s`."""
        return self._ray.wait(refs, num_returns=1, timeout=timeout_s)[0]

    def result(self, ref: Any) -> TrialOutcome:
        try:
            return self._ray.get(ref)
        except Exception as err:  # the worker died (e.g. out of memory): a failed trial
            return TrialOutcome(status="failed", reason=one_line(err))

    def cancel(self, ref: Any) -> None:
        self._ray.cancel(ref, force=True)

    def close(self) -> None:
        if self._owned:
            self._ray.shutdown()
        self._ray = self._remote = None
        self._owned = False


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
