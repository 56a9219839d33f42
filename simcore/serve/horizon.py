"""What may change an engine's scheduler from outside its loop, read from SimPy's event queue:
the kinds of timeout a quiet run passes or counts later, and the horizon they leave it
(`simcore.serve.quiet` plans the runs up to it)."""

from __future__ import annotations

import math

import simpy


def just_before(t: float) -> float:
    """A time a hair (a billionth, relatively) before `t`: a lower bound on a time that sums of
    the same durations, made in another order or through the API server's shared CPU, reach
    within rounding."""
    return t - 1e-9 * max(1.0, abs(t))


class InertTimeout(simpy.Timeout):
    """A timeout whose firing changes no engine's scheduler from outside that engine's loop (an
    engine loop's own step, the router's load report): the horizon of a quiet run passes it."""


class DeferredTimeout(simpy.Timeout):
    """A timeout whose firing changes no engine's scheduler before `effect_s`: a step of a
    request's way to an engine (the API server's tokenizer thread and event loop working on it)
    that the fixed latency of the server's path still separates from the scheduler. The horizon
    of a quiet run counts it at `effect_s`; with `bound` (the engines that the requests on its
    API server process are bound for, a count per engine index, kept by the process) only for
    those engines: the process's work reaches no other engine, and a request sent to another
    engine later cuts that engine's run (`simcore.serve.quiet.QuietRun.cut`)."""

    __slots__ = ("effect_s", "bound")

    def __init__(self, env: simpy.Environment, delay: float, effect_s: float,
                 bound: dict | None = None) -> None:
        super().__init__(env, delay)
        self.effect_s = effect_s
        self.bound = bound


class ArrivalTimeout(DeferredTimeout):
    """A request's arrival at the client where the API server's path separates the send from
    every engine (by `effect_s` minus its time at least). A quiet run's horizon passes it: the
    send routes the request to one engine and cuts that engine's run to the steps that end
    before the request can reach it and the one running, or the one that begins before then
    where the path only hands the request on (`simcore.serve.quiet.QuietRun.cut`)."""

    __slots__ = ()


class SampleTimeout(simpy.Timeout):
    """The next sample of the engines' state (`simcore.serve.observers.TimeSeriesSampler`): it
    changes no scheduler, and reads an engine inside a quiet run as single stepping would show
    it (`simcore.serve.quiet.QuietRun.blocks_free_at`), so the horizon of a quiet run passes it;
    a run whose step would end at the very instant of a sample stops before that step
    (`simcore.serve.quiet.QuietLeap.plan`)."""


class HandOff(simpy.Timeout):
    """A request's hand-off to engine `target` at the end of the API server's path, whose firing
    only adds the request to that engine's waiting queue: a step running when it fires decided
    its batch before, so a quiet run's last step may span it
    (`simcore.serve.quiet.QuietLeap.plan`); no other engine's scheduler hears of it, so their
    runs pass it."""

    def __init__(self, env: simpy.Environment, delay: float, target: int) -> None:
        super().__init__(env, delay)
        self.target = target


def horizon(env: simpy.Environment, all_events: bool, rank: int | None = None) -> float:
    """The earliest virtual time at which something outside the engine loops may change engine
    `rank`'s scheduler (any engine's if None): the first queued event that is not an
    `InertTimeout`, a `SampleTimeout` nor a `HandOff` to another engine, a `DeferredTimeout`
    counting at its effect (with `all_events`, the first queued event of any kind)."""
    queue = env._queue
    if not queue:
        return math.inf
    if all_events:
        return queue[0][0]
    return _earliest(queue, (InertTimeout, SampleTimeout, ArrivalTimeout), True, rank)


def span_horizon(env: simpy.Environment) -> float:
    """The earliest queued event that is neither an `InertTimeout`, a `SampleTimeout`, a
    `DeferredTimeout` nor a `HandOff`: before it, what fires only hands requests on towards an
    engine (or samples the engines), and a quiet run's last step may span that
    (`simcore.serve.quiet.QuietLeap.plan`)."""
    return _earliest(env._queue, (InertTimeout, SampleTimeout, DeferredTimeout, ArrivalTimeout,
                                  HandOff), False)


def _earliest(queue: list, passed: tuple, deferred_at_effect: bool,
              rank: int | None = None) -> float:
    """The time of the first event of SimPy's heap `queue` whose kind is not in `passed` (nor a
    `HandOff` to an engine other than `rank`, nor a `DeferredTimeout` whose `bound` leaves
    `rank` out, where given), a `DeferredTimeout` counting at its effect if
    `deferred_at_effect`. Walks the heap from the root, pruning subtrees that start no earlier
    than the best found."""
    best = math.inf
    n = len(queue)
    stack = [0] if queue else []
    pop = stack.pop
    push = stack.append
    while stack:
        i = pop()
        entry = queue[i]
        t = entry[0]
        if t >= best:
            continue
        kind = type(entry[3])
        if kind not in passed and (kind is not HandOff or rank is None
                                   or entry[3].target == rank):
            if kind is not DeferredTimeout or not deferred_at_effect:
                best = t
                continue
            ev = entry[3]
            effect = ev.effect_s
            if effect < best and (rank is None or ev.bound is None or ev.bound.get(rank)):
                best = effect
        c = 2 * i + 1
        if c < n:
            push(c)
            if c + 1 < n:
                push(c + 1)
    return best
