"""What the engine loop tells its observers, and the observers that count a run.

`EngineLoop` (simcore.serve.loop) emits four events per rank of its group:

- `on_scheduled(rank, out)`: the scheduler planned `out` (possibly empty) this iteration;
- `on_admitted(rank, requests, now)`: requests scheduled for the first time start running;
- `on_step(rank, out, shape, st, counts)`: a step ran `out` (shape `shape`) and took `st`
  (a `StepTime`); `counts` = (running, waiting) when it was planned;
- `on_dummy(rank, st)`: the rank ran a dummy batch in its lock-step group's step;
- `on_outputs(rank, emitted, finished, now)`: the step's sampled tokens and finished
  requests, as `Scheduler.update` returns them;
- `on_quiet_steps(rank, run)`: a run of quiet steps taken together (`simcore.serve.quiet`):
  each request of `run.requests` decoded one token in each of its steps; by default the
  observer sees them as the single steps they stand for.

`StepObserver` gives each a no-op default; an observer overrides what it needs.
`ReplicaCounters` fills one `ReplicaStats` per engine; `NetworkShares` charges requests the
network time of their steps (cluster runs); `TimeSeriesSampler` samples every engine's KV usage
and queue lengths at a fixed virtual interval.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import simpy

from simcore.compute.base import StepShape
from simcore.compute.decode_steps import BOUNDS, StepColumns
from simcore.serve.horizon import SampleTimeout


def sum_steps(total, compute, comm, bound, num, sums, counts, phase_s, order):
    """A run's steps (columns: total, compute and communication seconds, bound index) added in
    order to the running sums `sums` (a sequence's seconds: each total times `num`; busy;
    compute; communication) and to each bound's `phase_s`, counted by bound into `counts` (zero
    on entry): the floats a step at a time gives, to the bit. The bounds met go into `order` in
    the order they first occur; returns how many."""
    seq_s, busy, comp, com = sums[0], sums[1], sums[2], sums[3]
    first = 0
    for j in range(total.shape[0]):
        t = total[j]
        seq_s += t * num
        busy += t
        comp += compute[j]
        com += comm[j]
        b = bound[j]
        if counts[b] == 0:
            order[first] = b
            first += 1
        counts[b] += 1
        phase_s[b] += t
    sums[0], sums[1], sums[2], sums[3] = seq_s, busy, comp, com
    return first


_compiled_sum = None
_DECODE_KEYS = tuple("decode/" + b for b in BOUNDS)


def _sum_steps():
    """`sum_steps` compiled on first use (only runs with compiled kernels make step columns)."""
    global _compiled_sum
    if _compiled_sum is None:
        from simcore.compiled import compile_kernel
        _compiled_sum = compile_kernel(sum_steps)
    return _compiled_sum


class StepObserver:
    """An observer of the engine loop; every event is a no-op unless overridden."""

    __slots__ = ()

    def on_scheduled(self, rank, out) -> None:
        pass

    def on_admitted(self, rank, requests, now: float) -> None:
        pass

    def on_step(self, rank, out, shape: StepShape, st, counts: tuple[int, int]) -> None:
        pass

    def on_dummy(self, rank, st) -> None:
        pass

    def on_outputs(self, rank, emitted, finished, now: float) -> None:
        pass

    def on_quiet_steps(self, rank, run) -> None:
        """A quiet run, replayed as its single steps: each scheduled every request of the batch
        for one token (the scheduler has already advanced them past the run)."""
        from simcore.engine.scheduler import SchedulerOutput

        reqs = run.requests
        k = run.num_steps
        counts = (len(reqs), 0)
        for j, (shape, st, end) in enumerate(zip(run.shapes, run.times, run.ends_s)):
            back = k - j
            scheduled = [(r, 1, r.num_computed_tokens - back) for r in reqs]
            out = SchedulerOutput(scheduled, [], [], [], {}, len(reqs))
            self.on_scheduled(rank, out)
            self.on_step(rank, out, shape, st, counts)
            self.on_outputs(rank, reqs, [], end)


@dataclass(slots=True)
class ReplicaStats:
    """What one engine replica did over the run. The field names are the result's keys (see
    `simcore.result.ReplicaResult`)."""

    num_steps: int = 0
    busy_s: float = 0.0
    compute_s: float = 0.0
    comm_s: float = 0.0
    num_tokens: int = 0
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    num_preemptions: int = 0
    steps_by_bound: dict[str, int] = field(default_factory=dict)
    max_num_running: int = 0
    max_num_waiting: int = 0
    num_steps_waiting_at_max_num_seqs: int = 0
    num_steps_waiting_at_token_budget: int = 0
    num_steps_waiting_for_kv_blocks: int = 0
    num_steps_waiting_at_token_budget_compute_bound: int = 0
    busy_s_waiting_at_max_num_seqs: float = 0.0   # step time while requests waited at max_num_seqs
    busy_s_waiting_at_token_budget: float = 0.0   # ... at a full token budget
    busy_s_waiting_for_kv_blocks: float = 0.0     # ... for KV blocks (neither limit reached)
    seq_s: float = 0.0                            # step time x sequences in its batch
    step_s_by_phase_bound: dict[str, float] = field(default_factory=dict)
    """Step time by "prefill/<bound>" (steps carrying prompt tokens) or "decode/<bound>", and
    "dummy/<bound>" for dummy batches of an expert-parallel group."""
    dummy_steps: int = 0                     # lock-step steps this rank ran a dummy batch in
    dummy_busy_s: float = 0.0                # ... and their time (included in busy_s)
    all_to_all_s: float = 0.0                # EP dispatch/combine time (included in comm_s)


class ReplicaCounters(StepObserver):
    """Counts every engine's steps into its `ReplicaStats`: time by bound and phase, tokens,
    preemptions, and the steps (and their time) that left requests waiting, by the limit that
    held them: max_num_seqs, the token budget, or KV blocks (neither limit reached)."""

    __slots__ = ("stats", "_scratch")

    def __init__(self, num_replicas: int):
        self.stats = [ReplicaStats() for _ in range(num_replicas)]
        self._scratch = None        # `sum_steps`'s arrays, made on a compiled run's first use

    def on_scheduled(self, rank, out) -> None:
        if out.preempted:
            self.stats[rank.index].num_preemptions += len(out.preempted)

    def on_step(self, rank, out, shape: StepShape, st, counts: tuple[int, int]) -> None:
        stats = self.stats[rank.index]
        config = rank.sched.config
        n_run, n_wait = counts
        if n_run > stats.max_num_running:
            stats.max_num_running = n_run
        if n_wait > stats.max_num_waiting:
            stats.max_num_waiting = n_wait
        total_s = st.total_s
        if n_wait:
            if n_run >= config.max_num_seqs:
                stats.num_steps_waiting_at_max_num_seqs += 1
                stats.busy_s_waiting_at_max_num_seqs += total_s
            elif out.num_tokens >= config.token_budget:
                stats.num_steps_waiting_at_token_budget += 1
                stats.busy_s_waiting_at_token_budget += total_s
                if st.bound == "compute":
                    stats.num_steps_waiting_at_token_budget_compute_bound += 1
            else:
                stats.num_steps_waiting_for_kv_blocks += 1
                stats.busy_s_waiting_for_kv_blocks += total_s
        stats.num_tokens += shape.num_tokens
        stats.seq_s += total_s * shape.num_seqs
        decode = shape.num_decode_seqs + shape.num_spec_tokens    # drafts verified are decode
        stats.num_decode_tokens += decode
        stats.num_prefill_tokens += shape.num_tokens - decode
        phase = "prefill/" if shape.num_tokens > decode else "decode/"
        self._count(stats, st, phase)

    def on_quiet_steps(self, rank, run) -> None:
        """`on_step` for each step of a quiet run: no request waits, every token decodes."""
        stats = self.stats[rank.index]
        num = len(run.requests)
        if num > stats.max_num_running:
            stats.max_num_running = num
        k = len(run.times)
        stats.num_tokens += num * k
        stats.num_decode_tokens += num * k
        stats.num_steps += k
        by_bound, by_phase = stats.steps_by_bound, stats.step_s_by_phase_bound
        times = run.times
        if type(times) is StepColumns:
            # A compiled run's columns, summed by the compiled `sum_steps`; it has no
            # all-to-all (adding its 0.0 to a sum that starts at 0.0 and only grows changes no
            # bit).
            if self._scratch is None:
                self._scratch = (np.empty(4), np.empty(len(BOUNDS)),
                                 np.empty(len(BOUNDS), dtype=np.int64),
                                 np.empty(len(BOUNDS), dtype=np.int64), _sum_steps())
            sums, phase_s, counts, order, kernel = self._scratch
            sums[:] = (stats.seq_s, stats.busy_s, stats.compute_s, stats.comm_s)
            phase_s[:] = [by_phase.get(key, 0.0) for key in _DECODE_KEYS]
            counts.fill(0)
            first = kernel(times.total, times.compute, times.comm, times.bound, num, sums,
                           counts, phase_s, order)
            stats.seq_s, stats.busy_s, stats.compute_s, stats.comm_s = sums.tolist()
            # Keys new to the dicts go in where a step at a time would put them: in the order
            # their bounds first occur.
            for b in order[:first].tolist():
                bound = BOUNDS[b]
                by_bound[bound] = by_bound.get(bound, 0) + int(counts[b])
                by_phase[_DECODE_KEYS[b]] = float(phase_s[b])
            return
        # `_count` step by step, its sums kept in locals (each added to in the same order).
        seq_s, busy, compute = stats.seq_s, stats.busy_s, stats.compute_s
        comm, a2a = stats.comm_s, stats.all_to_all_s
        for st in times:
            total = st.total_s
            seq_s += total * num
            busy += total
            compute += st.compute_s
            comm += st.comm_s
            a2a += st.all_to_all_s
            bound = st.bound
            by_bound[bound] = by_bound.get(bound, 0) + 1
            key = "decode/" + bound
            by_phase[key] = by_phase.get(key, 0.0) + total
        stats.seq_s, stats.busy_s, stats.compute_s = seq_s, busy, compute
        stats.comm_s, stats.all_to_all_s = comm, a2a

    def on_dummy(self, rank, st) -> None:
        stats = self.stats[rank.index]
        stats.dummy_steps += 1
        stats.dummy_busy_s += st.total_s
        self._count(stats, st, "dummy/")

    @staticmethod
    def _count(stats: ReplicaStats, st, phase: str) -> None:
        stats.num_steps += 1
        stats.busy_s += st.total_s
        stats.compute_s += st.compute_s
        stats.comm_s += st.comm_s
        stats.all_to_all_s += st.all_to_all_s
        bound = st.bound
        stats.steps_by_bound[bound] = stats.steps_by_bound.get(bound, 0) + 1
        key = phase + bound
        by_phase = stats.step_s_by_phase_bound
        by_phase[key] = by_phase.get(key, 0.0) + st.total_s


class NetworkShares(StepObserver):
    """Charges each request the exposed communication of every step it ran in (cluster runs:
    the step DAG's collectives and transfers on the critical path), for the network's share
    of request latency."""

    __slots__ = ()

    def on_step(self, rank, out, shape: StepShape, st, counts: tuple[int, int]) -> None:
        total = st.total_s
        share = st.comm_s / total if total > 0 else 0.0
        if share > 0:
            charge = total * share
            for req, _, _ in out.scheduled:
                rec = req.client
                if rec is not None:
                    rec.network_s += charge


@dataclass(slots=True)
class TimeSeries:
    """Per-replica samples at a fixed virtual interval."""

    t_s: list[float] = field(default_factory=list)
    kv_usage: list[list[float]] = field(default_factory=list)
    num_running: list[list[int]] = field(default_factory=list)
    num_waiting: list[list[int]] = field(default_factory=list)


class TimeSeriesSampler:
    """Samples every engine's KV-cache usage and running / waiting counts each `interval_s`;
    before each sample, `check()` (the front end's lost-request check) runs. An engine inside a
    quiet run (`Rank.quiet`) is read as single stepping would show it at that instant: its
    free blocks from the run's allocations so far (`QuietRun.blocks_free_at`); its running and
    waiting requests are those of its scheduler, which a run changes only at its end.
    `next_s` is the time of the next sample."""

    __slots__ = ("env", "ranks", "interval_s", "check", "series", "next_s")

    def __init__(self, env: simpy.Environment, ranks, interval_s: float, check):
        self.env = env
        self.ranks = ranks
        self.interval_s = interval_s
        self.check = check
        self.series = TimeSeries()
        self.next_s = env.now

    def process(self):
        series = self.series
        ranks = self.ranks
        scheds = [rank.sched for rank in ranks]
        while True:
            self.check()
            now = self.env.now
            series.t_s.append(now)
            series.kv_usage.append([round(s.kv.usage if rank.quiet is None
                                          else s.kv.usage_with(rank.quiet.blocks_free_at(now)),
                                          4)
                                    for rank, s in zip(ranks, scheds)])
            series.num_running.append([len(s.running) for s in scheds])
            series.num_waiting.append([s.num_waiting for s in scheds])
            self.next_s = now + self.interval_s
            yield SampleTimeout(self.env, self.interval_s)
