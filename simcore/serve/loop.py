"""`EngineLoop`: the busy loop of one lock-step group of engines on the virtual clock.

A plain replica is a group of one. Each iteration every rank's scheduler plans its batch
(`Scheduler.schedule`); when none has anything to run the loop sleeps until a request arrives
or a KV load lands; otherwise the group's step runs on its `StepExecutor` (a rank with nothing
to run contributes a dummy batch: expert parallelism keeps the ranks in lock-step), then each
scheduler takes its outputs (`Scheduler.update`). Everything that is counted or delivered
happens in observers (`simcore.serve.observers.StepObserver`), called in their listed order.
"""

from __future__ import annotations

from collections.abc import Sequence

import simpy

from simcore.compute.base import StepShape
from simcore.engine.scheduler import Scheduler
from simcore.serve.executor import StepExecutor
from simcore.serve.observers import StepObserver
from simcore.serve.horizon import InertTimeout
from simcore.serve.quiet import QuietLeap

MAX_EMPTY_STEPS = 1000
"""Consecutive empty steps with requests queued before the engine is declared wedged."""
QUIET_LEAPS = True
"""Whether a lone engine takes runs of quiet steps together (`simcore.serve.quiet`); the
results are the same either way (tests compare them)."""


class Rank:
    """One engine: its index, its scheduler, and the event that wakes its loop when asleep."""

    __slots__ = ("index", "sched", "wake", "quiet")

    def __init__(self, index: int, sched: Scheduler):
        self.index = index
        self.sched = sched
        self.wake: simpy.Event | None = None
        self.quiet = None
        """The quiet run the engine is in (`simcore.serve.quiet.QuietRun`), else None: its
        scheduler is brought to the run's end only when the run ends."""

    def notify(self) -> None:
        """Wake the loop this engine belongs to (a request arrived, a KV load landed)."""
        if self.wake is not None and not self.wake.triggered:
            self.wake.succeed()


class EngineLoop:
    """The step loop of `ranks` (one engine, or the DP ranks of an expert-parallel group)."""

    __slots__ = ("env", "ranks", "executor", "observers", "leap")

    def __init__(self, env: simpy.Environment, ranks: Sequence[Rank], executor: StepExecutor,
                 observers: Sequence[StepObserver], all_events=None, sampler=None):
        """`all_events()`, where given, says whether any queued event may change this engine's
        scheduler (see `simcore.serve.horizon.horizon`); without it the engine steps one at a
        time. `sampler`, the engine-state sampler whose samples quiet runs pass (its
        `next_s`, `interval_s`), or None."""
        self.env = env
        self.ranks = list(ranks)
        self.executor = executor
        self.observers = tuple(observers)
        self.leap = None
        if (QUIET_LEAPS and all_events is not None and len(self.ranks) == 1
                and QuietLeap.supported(self.ranks[0].sched, executor.immediate)):
            time = executor.time
            indices = (self.ranks[0].index,)
            model = getattr(executor, "model", None)
            sched = self.ranks[0].sched
            single = not getattr(executor, "lockstep", True)
            self.leap = QuietLeap(env, sched,
                                  lambda shape: time(indices, (None,), (shape,)), all_events,
                                  decode_timer=(getattr(model, "decode_timer", None)
                                                if single else None),
                                  decode_params=(getattr(model, "decode_params", None)
                                                 if single and sched.config.compiled
                                                 else None),
                                  sampler=sampler, rank=self.ranks[0].index)

    def _sleep(self):
        """Wait until any rank is notified."""
        wake = self.env.event()
        for rank in self.ranks:
            rank.wake = wake
        yield wake
        for rank in self.ranks:
            rank.wake = None

    def _wedged(self) -> RuntimeError:
        who = (f"replica {self.ranks[0].index}" if len(self.ranks) == 1
               else f"replicas {[r.index for r in self.ranks]}")
        return RuntimeError(f"{who}: requests queued but nothing can be scheduled")

    def process(self):
        """The SimPy process: runs until the simulation ends. A group of one takes `_single`,
        the same loop without the per-rank lists (most runs step one engine per loop; a test
        checks that the two give identical results)."""
        return self._single() if len(self.ranks) == 1 else self._group()

    def _single(self):
        env = self.env
        rank = self.ranks[0]
        sched = rank.sched
        observers = self.observers
        executor = self.executor
        immediate = executor.immediate
        time_step, run_step, remaining_s = executor.time, executor.run, executor.remaining_s
        schedule, update = sched.schedule, sched.update
        shape_of = (StepShape.from_scheduled if sched.config.speculative is None
                    else StepShape.from_scheduled_spec)
        leap = self.leap
        step_s = 0.0
        indices = (rank.index,)
        empty = 0
        began_s = None     # when the last step began, where its end woke the loop (else None)
        while True:
            if not sched.has_requests:
                began_s = None
                yield from self._sleep()
            elif leap is not None:
                run = leap.plan(step_s)
                if run is not None:
                    run.before_s = began_s
                    rank.quiet = run
                    run.wait = InertTimeout(env, run.delay_s)
                    yield run.wait           # or the timeout a cut moved the wait to
                    run.wait = None
                    if run.span_s is not None:
                        yield InertTimeout(env, run.span_s)
                    rank.quiet = None
                    leap.apply(run)
                    for ob in observers:
                        ob.on_quiet_steps(rank, run)
                    if run.finished:         # their last tokens came with the run's steps
                        now = env.now
                        for ob in observers:
                            ob.on_outputs(rank, [], run.finished, now)
                    ends = run.ends_s
                    began_s = ends[-2] if len(ends) > 1 else run.start_s
                    continue
            out = schedule()
            for ob in observers:
                ob.on_scheduled(rank, out)
            scheduled = out.scheduled
            if not scheduled:
                began_s = None
                if sched.num_waiting_for_remote:
                    yield from self._sleep()
                    continue
                empty += 1
                if empty > MAX_EMPTY_STEPS:
                    raise self._wedged()
                yield env.timeout(0)
                continue
            empty = 0
            if out.new:
                now = env.now
                for ob in observers:
                    ob.on_admitted(rank, out.new, now)
            shape = shape_of(scheduled)
            counts = (len(sched.running), len(sched.waiting))
            if immediate:
                st = time_step(indices, (scheduled,), (shape,))
            else:
                st = yield from run_step(indices, (scheduled,), (shape,))
            for ob in observers:
                ob.on_step(rank, out, shape, st, counts)
            wait_s = remaining_s(st)
            if wait_s is not None:
                if shape.num_decode_seqs == shape.num_tokens:
                    # A decode step's time: what the next quiet step takes, about (a step with
                    # prompt tokens in it would make `plan` give up on runs that fit).
                    step_s = wait_s
                began_s = env.now
                yield InertTimeout(env, wait_s)
            else:
                began_s = None
            emitted, finished = update(out)
            now = env.now
            for ob in observers:
                ob.on_outputs(rank, emitted, finished, now)

    def _group(self):
        env = self.env
        ranks = self.ranks
        scheds = [rank.sched for rank in ranks]
        observers = self.observers
        run_step = self.executor.run
        remaining_s = self.executor.remaining_s
        shape_of = (StepShape.from_scheduled if scheds[0].config.speculative is None
                    else StepShape.from_scheduled_spec)
        dummy = StepShape.dummy()
        indices = [rank.index for rank in ranks]
        empty = 0
        while True:
            if not any(s.has_requests for s in scheds):
                yield from self._sleep()
            outs = [s.schedule() for s in scheds]
            for rank, out in zip(ranks, outs):
                for ob in observers:
                    ob.on_scheduled(rank, out)
            if not any(out.scheduled for out in outs):
                if any(s.num_waiting_for_remote for s in scheds):
                    # Nothing to run until a load lands (or a request arrives).
                    yield from self._sleep()
                    continue
                empty += 1
                if empty > MAX_EMPTY_STEPS:
                    raise self._wedged()
                yield env.timeout(0)
                continue
            empty = 0
            now = env.now
            for rank, out in zip(ranks, outs):
                if out.new:
                    for ob in observers:
                        ob.on_admitted(rank, out.new, now)
            shapes = [shape_of(out.scheduled) if out.scheduled else dummy for out in outs]
            counts = [(len(s.running), len(s.waiting)) for s in scheds]
            st = yield from run_step(indices, [out.scheduled or None for out in outs], shapes)
            for rank, out, shape, c in zip(ranks, outs, shapes, counts):
                if out.scheduled:
                    for ob in observers:
                        ob.on_step(rank, out, shape, st, c)
                else:
                    for ob in observers:
                        ob.on_dummy(rank, st)
            wait_s = remaining_s(st)
            if wait_s is not None:
                yield InertTimeout(env, wait_s)
            now = env.now
            for rank, out, sched in zip(ranks, outs, scheds):
                if out.scheduled:
                    emitted, finished = sched.update(out)
                    for ob in observers:
                        ob.on_outputs(rank, emitted, finished, now)
