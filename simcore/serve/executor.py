"""How an engine step takes time: the `StepExecutor` protocol and its two implementations.

An executor times one step of a lock-step group (a plain replica is a group of one) and
returns its `StepTime`; `remaining_s(st)` is how much of the step is still to run on the
virtual clock when `run` returns (a model's step is timed at its start and counted then; a
DAG's step has ended when `run` returns):

- `ModelExecutor`: a replica timed by its step-time model (`StepTimeModel.step_time`), or the
  DP ranks of an expert-parallel group timed together by a `GroupStepTimeModel` (ranks with
  nothing to run contribute a dummy batch);
- `DagExecutor`: every step as a DAG of compute and collectives over the cluster's fabric
  (`simcore.cluster.runtime.ClusterRuntime.step`); the step ends when the DAG does.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any, Protocol

from simcore.compute.base import GroupStepTimeModel, StepShape, StepTimeModel


class StepExecutor(Protocol):
    """Runs one step of a group on the clock."""

    immediate: bool
    """Whether `time` gives the StepTime at once, with no wait on the clock (a model's step);
    the engine loop then skips the generator of `run`."""

    def time(self, indices: Sequence[int], batches: Sequence[list | None],
             shapes: Sequence[StepShape]) -> Any:
        """The step's `StepTime`, when `immediate`."""
        ...

    def run(self, indices: Sequence[int], batches: Sequence[list | None],
            shapes: Sequence[StepShape]) -> Generator[Any, Any, Any]:
        """A SimPy generator that returns the step's `StepTime`.

        `indices`: the engines of the group; `batches`: each one's scheduled batch (request,
        new tokens, computed before), None for a rank that runs a dummy batch; `shapes`: each
        batch's shape (`StepShape.dummy()` for a dummy batch)."""
        ...

    def remaining_s(self, st) -> float | None:
        """Seconds of the step `run` returned still to run on the clock (None: none, and no
        wait at all)."""
        ...


class ModelExecutor:
    """A step timed by the step-time model: one replica's (`StepTimeModel.step_time`), or with
    `lockstep` an expert-parallel group's (`GroupStepTimeModel.step_time_group`: every rank
    waits for the group's step time)."""

    __slots__ = ("model", "lockstep")
    immediate = True

    def __init__(self, model: StepTimeModel | GroupStepTimeModel, *, lockstep: bool = False):
        self.model = model
        self.lockstep = lockstep

    def time(self, indices, batches, shapes):
        if self.lockstep:
            return self.model.step_time_group(list(shapes))
        return self.model.step_time(shapes[0])

    def run(self, indices, batches, shapes):
        return self.time(indices, batches, shapes)
        yield  # a generator that never waits

    @staticmethod
    def remaining_s(st) -> float:
        return st.total_s


class DagExecutor:
    """A step as a DAG over the cluster's fabric (`ClusterRuntime.step`)."""

    __slots__ = ("cluster",)
    immediate = False

    def __init__(self, cluster):
        self.cluster = cluster

    def time(self, indices, batches, shapes):
        raise TypeError("a step over the fabric takes time on the clock: use run()")

    def run(self, indices, batches, shapes):
        return (yield from self.cluster.step(list(zip(indices, batches))))

    @staticmethod
    def remaining_s(st) -> None:
        return None
