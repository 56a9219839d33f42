"""Quiet steps taken together: an engine whose every running request only decodes advances many
steps at once, with exactly the decisions, times and records of stepping one at a time.

A step is *quiet* when the batch is the running requests, each decoding one token, and nothing is
waiting: nothing is admitted, preempted or blocked, and the step's shape follows from the
previous one (every context one token longer). Such steps repeat up to the one that samples a
request's last token (the run's last step: its requests finish at its end, as
`Scheduler.update` finishes them, and the observers hear of it as of a step's outputs), until
the block pool runs short, or until something from outside the engine loops changes the
scheduler: a request arrives (the client, the API server's path), a client gives up.
`QuietLeap.plan` finds how many quiet steps lie ahead before any of these can happen and times
them with the step-time model one by one (the same shapes in the
same order; a model with a `decode_timer` gives each the StepTime its `step_time` gives, with
the batch size's constant parts worked out once, so every step time and every end time is the
same float as when stepping); the loop then waits once for the steps before the last, and for
the last from its start, as single stepping would (so an event made during the run at the very
instant of its end comes before that step's end, as it would have), and
`QuietLeap.apply` brings the scheduler to where the steps would have left it: every request `k`
tokens further, and the block allocations of the steps that cross a block boundary made in the
steps' order, request by request in batch order, so the pool's free queue, the prefix cache and
its evictions are those of single steps. Observers take the steps together
(`StepObserver.on_quiet_steps`).

*Outside the engine loops* is read from SimPy's event queue (`simcore.serve.horizon`): the
earliest queued event that is not an `InertTimeout` (an engine loop's own step, the router's
load report, which reads only counts a quiet run leaves unchanged) nor a `SampleTimeout` (a
sample of the engines' state, which reads an engine inside a run as single stepping would show
it: the blocks allocated up to the step running then, `QuietRun.blocks_free_at`; a run stops
before a step that would end at the very instant of a sample), a `DeferredTimeout` (the API
server's tokenizer thread and event loop working on requests bound for this engine) counting
at its effect, the path's latency later, since no scheduler hears of the request sooner. The
client's arrivals on that path (`ArrivalTimeout`) are passed: the send routes the request to
one engine and cuts that engine's run to the steps that end before the request can reach it
and the one running, or, where the request's way only hands it on, the one that begins before
it can reach the engine, as the run's spanning step (`QuietRun.cut`); no other engine's
scheduler hears of it. While the
client holds requests back (max concurrency), a request finishing on another engine sends one
at once, so then every queued event counts.
The run is taken only when it ends strictly before that horizon: a step ending exactly at an
external event's time is left to single stepping, whose order SimPy decides. One step may pass
it: when what the horizon holds only hands requests on towards an engine (a request's send and
its steps on the API server's path, its `HandOff` to an engine), the run takes the step that
the first hand-off falls in, as that step's batch was made before it, and the loop waits for
that step from its start, as single stepping would.

Taken only where the equivalence is simple: one engine stepping alone on a step-time model (not
over the fabric, not an expert-parallel group), with no KV connector and a single KV-cache
group. Elsewhere the engine steps one at a time, as it always does at the edges of a run.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field

import numpy as np
import simpy

from simcore.compute import decode_steps
from simcore.compute.base import StepShape, StepTime
from simcore.compute.decode_steps import StepColumns, decode_step_time
from simcore.engine.kv_cache import KVCacheManager
from simcore.engine.run_blocks import allocate_run
from simcore.serve.horizon import InertTimeout, horizon, span_horizon

MIN_STEPS = 2
"""Fewest quiet steps worth taking together (one step is cheaper stepped on its own)."""
MAX_STEPS = 65536
"""Most steps taken together (bounds the lists of one run)."""


@dataclass(slots=True)
class QuietRun:
    """`num_steps` quiet steps of `requests` (the batch, in order), starting at `start_s`: each
    step's `StepTime` and end time, and the single wait that covers them. The first step's
    sequences read `kv0` KV tokens in all, each next step one more per sequence."""

    requests: list
    kv0: int
    times: list | StepColumns
    ends_s: list[float]
    start_s: float
    delay_s: float
    finished: list = field(default_factory=list)
    """The requests whose last token the run's last step samples (batch order): they finish
    at its end, as `Scheduler.update` finishes them (`QuietLeap.apply`)."""
    span_s: float | None = None
    """The last step's own wait, taken at the end of `delay_s` (the steps before it), as single
    stepping would take it: a planned run's last step (None only where no delay reaches the
    step before it exactly), which may span a request's hand-off, or the step a cut keeps that
    begins before a request can reach the engine."""
    blocks: tuple | None = None
    """(each request's computed tokens and blocks held at the start, the free blocks then, the
    block size), for `blocks_free_at`."""
    wait: simpy.Timeout | None = None
    """The timeout the engine loop waits on for the run's steps (before a spanning last step's
    own), while it may still be cut (`cut`)."""
    before_s: float | None = None
    """When the step before the run began (whose end's callback began the run), where known
    (the engine loop sets it)."""

    def _began_s(self, i: int) -> float | None:
        """When step `i` began (-1: the step before the run, None where unknown). In single
        stepping step `i + 1` begins in the callback of step `i`'s end, whose timeout was made
        as step `i` began."""
        if i > 0:
            return self.ends_s[i - 1]
        return self.start_s if i == 0 else self.before_s

    def cut(self, env: simpy.Environment, reach_s: float, span: bool = False,
            made_s: float | None = None, made_before_s: float | None = None) -> None:
        """A request sent to this engine now may reach its scheduler at `reach_s` (now or
        later) at the earliest: keep only the steps that end before then, and the step running
        now, which single stepping would have run as they are, batched before the request could
        be in the waiting queue.

        The kept steps are a prefix of the run, so what its plan checked for them still holds
        (every event queued then that may change the scheduler falls after their ends, or only
        hands requests on while the last of them runs; no step ends at a sample); without
        `span`, none finishes a request (only the run's last step does). The loop's wait moves
        to the new last step's end (or the end of the step before a spanning one): a timeout
        made now, before anything of the request's way to the engine is queued. A step that ends
        at or after `reach_s` is kept only when it is running now: its own timeout, made at its
        start, would also come before anything of the request's at an equal time (a step begun
        later might come after the request's hand-off, made later). When the send comes at the
        very end of a step, `made_s` (when the event that sends the request was made, where
        known) says which came first in single stepping: a step begun before that event was
        made ended first, and the next one, begun then, is the one running. A step begun at the
        very instant that event was made began in the callback of the previous step's end,
        whose timeout was made at that step's start; the event was made in the callback of an
        event made at `made_before_s` (where known): SimPy ran the callback of the one made
        first first, so the step began first when the previous step began before then.

        With `span` (the request's way to the engine only hands it on: the API server's path,
        then its hand-off, which adds it to the waiting queue), the step after those, which
        begins before `reach_s`, is kept too, as the run's spanning step (`span_s`): single
        stepping would batch it before the request could be in the queue, and the loop waits
        for it from its start, as single stepping does, so what happens at its end is ordered
        as it would have been (as `QuietLeap.plan` takes a step spanning a hand-off). Where it
        is the run's last step, its requests still finish with it, unless another event is
        queued at its very end."""
        wait = self.wait
        if wait is None:
            return
        ends = self.ends_s
        now = env.now
        before = bisect_left(ends, reach_s)      # the steps that end before reach_s
        running = bisect_left(ends, now)         # the step running now
        if made_s is not None and running < len(ends) - 1 and ends[running] == now:
            began, prior = self._began_s(running), self._began_s(running - 1)
            if began < made_s or (began == made_s and made_before_s is not None
                                  and prior is not None and prior < made_before_s):
                # The step ending now began before the event that sends the request was made,
                # so single stepping ended it first, and began the next one, before the send.
                running += 1
        keep = max(before, running + 1)
        span_s = None
        finished: list = []
        if span and keep == before < len(ends):
            last = keep + 1 == len(ends)
            if last and self.span_s is not None:
                return                           # already waited for from its start
            finished = self.finished if last else []
            if finished and _queued_at(env, ends[keep], wait):
                finished = []                    # that step is left to single stepping
            else:
                span_s = self.times[keep].total_s
                keep += 1
        if keep >= len(ends) and span_s is None:
            return
        waited = keep - 1 if span_s is not None else keep
        delay = _exact_delay(now, ends[waited - 1])
        if delay is None:
            raise RuntimeError(f"a quiet run cut at {now!r} s found no delay to its step's end "
                               f"{ends[waited - 1]!r} s")
        self._move_wait(env, delay)
        del self.times[keep:], ends[keep:]
        self.finished = finished
        self.span_s = span_s

    def yield_to(self, env: simpy.Environment, t: float, woke_s: float | None = None) -> None:
        """An event made now falls due at `t`. Where the run's wait falls due at `t` too and
        single stepping would make the timeout of the step ending then only later (at that
        step's start, after now), the wait is made again now, after the event, so that the
        event comes first at that instant, as it would have. A step beginning now would have
        begun in the callback of the previous step's end, whose timeout was made at that step's
        start; the event is made in the callback of an event made at `woke_s` (where known):
        SimPy runs the callback of the one made first first, so the step's timeout comes after
        the event when `woke_s` is before the previous step's start."""
        wait = self.wait
        if wait is None:
            return
        ends = self.ends_s
        w = len(ends) - (2 if self.span_s is not None else 1)   # the step the wait ends with
        if ends[w] != t:
            return
        began, prior = self._began_s(w), self._began_s(w - 1)
        now = env.now
        if not (now < began or (now == began and woke_s is not None and prior is not None
                                and woke_s < prior)):
            return
        delay = _exact_delay(now, t)
        if delay is not None:
            self._move_wait(env, delay)

    def _move_wait(self, env: simpy.Environment, delay: float) -> None:
        """The loop's wait made again now, `delay` from now: what waited on it waits on that."""
        moved = InertTimeout(env, delay)
        moved.callbacks, self.wait.callbacks = self.wait.callbacks, []
        self.wait = moved

    def blocks_free_at(self, t: float) -> int:
        """The engine's free blocks at `t` inside the run (`start_s` <= t < its last end, no
        step ending at t), as single stepping shows them: the step running at t has made its
        allocations (at its start), none has freed any (requests finish at the run's end)."""
        ctx, held, free, bs = self.blocks
        return free - new_blocks(ctx, held, bs, bisect_right(self.ends_s, t) + 1)

    @property
    def num_steps(self) -> int:
        return len(self.ends_s)

    @property
    def shapes(self) -> list[StepShape]:
        """Each step's shape."""
        num = len(self.requests)
        return [StepShape(num, num, num, float(kv), kv, kv)
                for kv in range(self.kv0, self.kv0 + num * len(self.ends_s), num)]


class QuietLeap:
    """Plans and applies quiet runs for one engine (`sched`) timed by `time_step(shape)`, or by
    `decode_timer(num)(kv)` where the step-time model has one (`RooflineModel.decode_timer`:
    the same StepTime, with the batch size's constant parts worked out once).

    `all_events()` says whether every queued event must count as external (the client holds
    requests back, so another engine's output may send one at once)."""

    __slots__ = ("env", "sched", "time_step", "decode_timer", "all_events", "budget",
                 "block_size", "max_model_len", "decode_params", "_params", "_columns",
                 "sampler", "rank")

    def __init__(self, env: simpy.Environment, sched, time_step, all_events,
                 decode_timer=None, decode_params=None, sampler=None, rank=None):
        # `rank`: the engine's index (hand-offs to other engines pass its runs), or None.
        self.rank = rank
        # `sampler` (its `next_s` and `interval_s`): the engine-state sampler whose samples a
        # run passes (`SampleTimeout`), or None.
        self.sampler = sampler
        self.env = env
        self.sched = sched
        self.time_step = time_step
        self.decode_timer = decode_timer
        # Where given (`RooflineModel.decode_params`, an engine with compiled kernels), runs are
        # timed at once by `simcore.compute.decode_steps`; per batch size its arrays (or None).
        self.decode_params = decode_params
        self._params: dict = {}
        self._columns = None
        self.all_events = all_events
        c = sched.config
        self.budget = c.token_budget
        self.block_size = c.block_size
        self.max_model_len = c.max_model_len

    @staticmethod
    def supported(sched, immediate: bool) -> bool:
        """Whether quiet runs are exact for this engine: a step-time model's immediate step, no
        KV connector, one KV-cache group, no speculative tokens."""
        return (immediate and sched.connector is None and type(sched.kv) is KVCacheManager
                and not sched.num_spec_tokens)

    def plan(self, last_total_s: float) -> QuietRun | None:
        """The quiet steps ahead of the engine now, or None when fewer than `MIN_STEPS`.

        `last_total_s` is the time of the engine's last step that only decoded (about what a
        quiet step takes now): when even one more such step would reach the horizon, nothing
        is computed."""
        sched = self.sched
        running = sched.running
        num = len(running)
        if not num or num > self.budget or len(sched.waiting.items):
            return None
        env = self.env
        now = env.now
        all_events = self.all_events()
        limit = horizon(env, all_events, self.rank)
        # Without all_events, a run may end with a step that spans the horizon (below).
        if now + (MIN_STEPS if all_events else 1) * last_total_s >= limit:
            return None
        max_len = self.max_model_len
        steps = MAX_STEPS
        ctx = []
        lefts = []
        for req in running:
            tokens = req.prompt_len + req.num_output_tokens
            c = req.num_computed_tokens
            if c != tokens - 1:                # not decoding one token
                return None
            # Steps up to the one that samples its last token (the run's last step at most).
            left = req.max_tokens - req.num_output_tokens
            if max_len - tokens < left:
                left = max_len - tokens
            if left < steps:
                steps = left
            ctx.append(c)
            lefts.append(left)
        if steps < MIN_STEPS:
            return None
        steps, blocks = self._block_limit(running, ctx, steps)
        if steps < MIN_STEPS:
            return None
        # Time the steps one by one, as single stepping would, until one would end at or after
        # the horizon.
        kv0 = sum(ctx) + num
        times, ends, span = self._timed(num, kv0, steps, now, limit)
        sampler = self.sampler
        if sampler is not None and ends:
            # A sample at the very end of a step is ordered against it by when each was
            # queued, which a run changes: the run stops before that step.
            tie = _sample_tie(ends if span is None else [*ends, span[1]], sampler.next_s,
                              sampler.interval_s)
            if tie is not None:
                if tie < len(ends):
                    del times[tie:], ends[tie:]
                span = None
        if span is not None and ends and not all_events:
            run = self._spanning(running, lefts, kv0, times, ends, span, blocks)
            if run is not None:
                return run
        k, delay = _longest_exact(now, ends, len(ends))
        if not k:
            return None
        finished = [r for r, left in zip(running, lefts) if left == k]
        if finished and _queued_at(env, ends[k - 1]):
            # Another event at the very instant the requests finish (a load report reading
            # the running count) is ordered against the finishing step by when each was
            # queued, which a run changes: that step is left to single stepping.
            finished = []
            k, delay = _longest_exact(now, ends, k - 1)
            if not k:
                return None
        if k < len(ends):
            del times[k:], ends[k:]
        # The last step is waited for from its start, as single stepping waits for it: an event
        # made during the run at the very instant of its end (a client's next arrival, a load
        # report) then comes before it, as it would have.
        last_s = times[k - 1].total_s
        before = _exact_delay(now, ends[k - 2])
        if before is None or ends[k - 2] + last_s != ends[k - 1]:
            return QuietRun(list(running), kv0, times, ends, now, delay, finished, blocks=blocks)
        return QuietRun(list(running), kv0, times, ends, now, before, finished, last_s, blocks)

    def _timed(self, num: int, kv0: int, steps: int, now: float, limit: float):
        """(the step times, their ends, the step that ends at or after `limit` with its end, and
        from the compiled kernel the columns of all the steps with it; or None) of up to
        `steps` quiet steps of `num` sequences from `now`, the first reading `kv0` KV tokens:
        one by one, or at once by the compiled kernel."""
        params = None
        if self.decode_params is not None:
            params = self._params.get(num, False)
            if params is False:
                p = self.decode_params(num)
                params = self._params[num] = (None if p is None else
                                              tuple(np.asarray(a, dtype=float) for a in p))
        if params is not None:
            if self._columns is None:
                # Scratch for the kernel: total, compute and communication seconds as the rows
                # of one array (copied at once), the bounds, the ends.
                self._columns = (np.empty((3, MAX_STEPS)), np.empty(MAX_STEPS, dtype=np.int64),
                                 np.empty(MAX_STEPS))
            seconds, bound, ends = self._columns
            n = decode_steps.compiled_steps()(*params, kv0, num, steps, now, limit, seconds[0],
                                              seconds[1], seconds[2], bound, ends)
            # With the step past the horizon (it may be taken with them, `_spanning`): the
            # columns of all, the run's steps a view of them.
            m = n + 1 if n < steps else n
            (total, compute, comm), bounds = seconds[:, :m].copy(), bound[:m].copy()
            if m == n:
                return StepColumns.of(total, compute, comm, bounds), ends[:n].tolist(), None
            span = (decode_step_time(float(total[n]), float(compute[n]), float(comm[n]),
                                     int(bounds[n])), float(ends[n]),
                    StepColumns.of(total, compute, comm, bounds))
            return (StepColumns.of(total[:n], compute[:n], comm[:n], bounds[:n]),
                    ends[:n].tolist(), span)
        if self.decode_timer is not None:
            timer = self.decode_timer(num)
        else:
            time_step = self.time_step

            def timer(kv: int):
                return time_step(StepShape(num, num, num, float(kv), kv, kv))
        times = []
        ends: list[float] = []
        append_time, append_end = times.append, ends.append
        t = now
        for kv in range(kv0, kv0 + steps * num, num):
            st = timer(kv)
            t_end = t + st.total_s
            if not t_end < limit:
                return times, ends, (st, t_end)
            append_time(st)
            append_end(t_end)
            t = t_end
        return times, ends, None

    def _spanning(self, running, lefts: list[int], kv0: int, times: list, ends: list[float],
                  span, blocks: tuple) -> QuietRun | None:
        """The run of the quiet steps `ends` and the one after them, `span` (its StepTime and
        end, and where compiled the columns of the steps with it), which ends past the horizon,
        or None when that step may not be taken with them.

        It may be when everything queued before its end only hands requests on towards an
        engine (`span_horizon`): a hand-off adds its request to a waiting queue, which the
        step, batched at its start, does not read, and the next step finds it there as it
        would have. The engine loop waits for the steps before it, then for the step itself,
        as single stepping does from the step's start, so events at its end are ordered against
        it as they would have been."""
        env = self.env
        st, t_end = span[0], span[1]
        if not t_end < span_horizon(env):
            return None
        now = env.now
        delay = _exact_delay(now, ends[-1])
        if delay is None:
            return None
        k = len(ends) + 1
        finished = [r for r, left in zip(running, lefts) if left == k]
        if finished and _queued_at(env, t_end):
            return None
        times = span[2] if len(span) > 2 else [*times, st]
        return QuietRun(list(running), kv0, times, [*ends, t_end], now, delay, finished,
                        st.total_s, blocks)

    def _block_limit(self, running, ctx: list[int], steps: int) -> tuple[int, tuple]:
        """The most of `steps` quiet steps whose new blocks the free pool holds (so no
        allocation fails and nothing is preempted), and the run's `blocks`."""
        kv = self.sched.kv
        free = kv.pool.num_free
        bs = self.block_size
        req_blocks = kv.req_blocks
        held = [len(req_blocks[r.request_id]) for r in running]
        blocks = (ctx, held, free, bs)
        if new_blocks(ctx, held, bs, steps) <= free:
            return steps, blocks
        lo, hi = 0, steps            # need(lo) <= free < need(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if new_blocks(ctx, held, bs, mid) <= free:
                lo = mid
            else:
                hi = mid
        return lo, blocks

    def apply(self, run: QuietRun) -> None:
        """Bring the scheduler to where `run`'s steps leave it, making the block allocations of
        the steps that cross a block boundary as single steps make them (`allocate_run`)."""
        sched = self.sched
        k = run.num_steps
        reqs = run.requests
        base = [(r.num_computed_tokens, r.num_output_tokens) for r in reqs]
        allocate_run(sched.kv, reqs, base, k)
        for r, (c0, o0) in zip(reqs, base):
            r.num_computed_tokens = c0 + k
            r.num_output_tokens = o0 + k
            r.work_done_tokens += k
        sched.num_steps += k
        if run.finished:
            sched.finish_sampled(run.finished)


def new_blocks(ctx: list[int], held: list[int], bs: int, k: int) -> int:
    """The blocks that `k` quiet steps allocate to requests with computed tokens `ctx` holding
    `held` blocks (`bs` tokens a block): each step's token needs room in its request's blocks."""
    total = 0
    for c, h in zip(ctx, held):
        n = -(-(c + k) // bs) - h
        if n > 0:
            total += n
    return total


def _sample_tie(ends: list[float], sample_s: float, interval_s: float) -> int | None:
    """The index of the first of the step ends `ends` (ascending) that falls at the very
    instant of a sample (at `sample_s` and every `interval_s` after it, each added as SimPy
    adds a delay to the time of the one before), or None."""
    t = sample_s
    last = ends[-1]
    while t <= last:
        i = bisect_left(ends, t)
        if ends[i] == t:
            return i
        t = t + interval_s
    return None


def _longest_exact(now: float, ends: list[float], k: int) -> tuple[int, float | None]:
    """The most steps, at most `k` and at least `MIN_STEPS`, whose end one delay from `now`
    reaches exactly (`_exact_delay`), and that delay; (0, None) if none."""
    while k >= MIN_STEPS:
        delay = _exact_delay(now, ends[k - 1])
        if delay is not None:
            return k, delay
        k -= 1
    return 0, None


def _queued_at(env: simpy.Environment, t: float, but: simpy.Event | None = None) -> bool:
    """Whether any queued event (but `but`, where given) is due at exactly `t`."""
    return any(entry[0] == t and entry[3] is not but for entry in env._queue)


def _exact_delay(now: float, end: float) -> float | None:
    """A delay that SimPy adds to `now` to land exactly on `end` (it schedules at now + delay),
    or None if none is found near `end - now`."""
    delay = end - now
    if now + delay == end:
        return delay
    for direction in (math.inf, -math.inf):
        d = delay
        for _ in range(4):
            d = math.nextafter(d, direction)
            if d >= 0 and now + d == end:
                return d
    return None
