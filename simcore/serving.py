"""The serving loop on the virtual clock: a benchmark client, a router and engine replicas under SimPy.

Replicas step independently, one SimPy process each; with expert parallelism the DP ranks of an
EP group step in lock-step, one process per group (see `run_serving`)."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import simpy

from simcore.compute.base import GroupStepTimeModel, StepShape, StepTimeModel
from simcore.engine.request import BlockHashSpace, Request
from simcore.engine.scheduler import Scheduler, SchedulerConfig
from simcore.metrics import RequestRecord
from simcore.router import Router
from simcore.workload.generate import RequestStream
from simcore.workload.spec import RequestSpec

MAX_EMPTY_STEPS = 1000
"""Consecutive empty steps with requests queued before the engine is declared wedged."""


@dataclass(slots=True)
class ReplicaStats:
    """What one engine replica did over the run."""

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
    num_steps_at_max_seqs: int = 0
    num_steps_budget_full: int = 0
    num_steps_waiting_blocked: int = 0
    num_steps_budget_full_compute_bound: int = 0
    busy_s_at_max_seqs: float = 0.0          # step time while requests waited at max_num_seqs
    busy_s_budget_full: float = 0.0          # ... at a full token budget
    busy_s_waiting_blocked: float = 0.0      # ... for KV blocks (neither limit reached)
    seq_s: float = 0.0                       # step time x sequences in its batch
    step_s_by_phase_bound: dict[str, float] = field(default_factory=dict)
    """Step time by "prefill/<bound>" (steps carrying prompt tokens) or "decode/<bound>", and
    "dummy/<bound>" for dummy batches of an expert-parallel group."""
    dummy_steps: int = 0                     # lock-step steps this rank ran a dummy batch in
    dummy_busy_s: float = 0.0                # ... and their time (included in busy_s)
    all_to_all_s: float = 0.0                # EP dispatch/combine time (included in comm_s)


@dataclass(slots=True)
class TimeSeries:
    """Per-replica samples at a fixed virtual interval."""

    t_s: list[float] = field(default_factory=list)
    kv_usage: list[list[float]] = field(default_factory=list)
    num_running: list[list[int]] = field(default_factory=list)
    num_waiting: list[list[int]] = field(default_factory=list)


@dataclass(slots=True)
class ServingRun:
    """Raw outcome of a serving run, before summarising."""

    records: list[RequestRecord]
    replicas: list[ReplicaStats]
    timeseries: TimeSeries
    schedulers: list[Scheduler]
    end_s: float
    num_routed_by_prefix: int


class _Replica:
    __slots__ = ("index", "sched", "model", "stats", "wake", "env")

    def __init__(self, index: int, env: simpy.Environment, sched: Scheduler, model: StepTimeModel):
        self.index = index
        self.env = env
        self.sched = sched
        self.model = model
        self.stats = ReplicaStats()
        self.wake: simpy.Event | None = None

    def notify(self) -> None:
        if self.wake is not None and not self.wake.triggered:
            self.wake.succeed()


def run_serving(specs: Sequence[RequestSpec] | RequestStream, *, sched_config: SchedulerConfig,
                num_replicas: int,
                step_model: StepTimeModel, router_policy: str, report_interval_s: float,
                balance_threshold: int, max_concurrency: int | None, max_model_len: int,
                sample_interval_s: float,
                progress: Callable[[float, int, int], None] | None = None,
                lockstep_groups: list[tuple[int, ...]] | None = None,
                env: simpy.Environment | None = None, cluster=None,
                kv_paths=None, request_timeout_s: float | None = None,
                request_cpu_s: Callable[[int], float] | None = None,
                request_latency_s: float = 0.0, api_servers: int = 1) -> ServingRun:
    """Serve `specs` (sorted by arrival) on `num_replicas` engines; return every request's record.

    `specs` is read once, in order, as the client reaches each request (a RequestStream makes
    them then); each request's record is made when it arrives.

    A request whose prompt plus output exceeds `max_model_len` is refused at once, as vLLM's API
    server refuses it, and recorded as failed. With `request_timeout_s`, a request not finished
    that long after its send is given up by the client: aborted in the engine
    (`Scheduler.finish_requests`) and recorded as failed, its tokens left out of the metrics.
    Between a request's send and its arrival in the scheduler lies the API server's path: its
    work, `request_cpu_s(prompt_len)` (tokenization, input processing), on one of `api_servers`
    server processes, each doing one request's work at a time (Python's work holds the
    process), in send order, so that a burst of requests queues there; then
    `request_latency_s`, which every request pays concurrently.

    `lockstep_groups` (expert parallelism) partitions the replicas into groups that step
    together, timed by `step_model.step_time_group` (a `GroupStepTimeModel`): while any rank of
    a group has requests, every step each rank's scheduler plans its batch, a rank with nothing
    to run contributes a dummy batch, all wait for the group's step time, then each scheduler
    takes its outputs. Without it, every replica steps on its own.

    `cluster` (a `simcore.cluster.runtime.ClusterRuntime` on `env`) runs every step as a DAG
    over the cluster's fabric instead of timing it with `step_model`; the step ends when the
    DAG does. `kv_paths` (a `simcore.cluster.kvpaths.KvPaths`) gives engines KV connectors and
    moves KV caches over the fabric: with prefill/decode disaggregation the router sends each
    request to a prefill instance, which runs its prompt (max_tokens 1, its token not streamed);
    then a decode instance loads the KV and generates every output token; with an external KV
    tier, tier hits are fetched from the storage servers before the request is scheduled.
    """
    env = env or simpy.Environment()
    space = BlockHashSpace()
    replicas = [_Replica(i, env, Scheduler(sched_config, space,
                                           kv_paths.connector(i, space) if kv_paths else None),
                         step_model)
                for i in range(num_replicas)]
    # With P/D disaggregation the router sees only the prefill instances.
    entry = (kv_paths.prefill_instances() if kv_paths is not None and kv_paths.disaggregated
             else list(range(num_replicas)))
    prefill_of = set(entry) if len(entry) < num_replicas else set()
    router = Router(router_policy, len(entry), space=space, balance_threshold=balance_threshold)
    records: list[RequestRecord] = []
    total = len(specs)
    state = {"done": 0}
    all_done = env.event()
    if total == 0:
        all_done.succeed()
    backlog: deque[tuple[int, RequestSpec]] = deque()   # held by the max-concurrency limit
    in_flight = [0]
    in_server = [0]       # sent, still on the API server's path to an engine
    server_free = [0.0] * api_servers     # when each API server process is next free (a heap)

    def finish(idx: int) -> None:
        state["done"] += 1
        in_flight[0] -= 1
        if progress is not None:
            progress(env.now, state["done"], total)
        if backlog:
            send(*backlog.popleft())
        if state["done"] == total and not all_done.triggered:
            all_done.succeed()

    def send(idx: int, spec: RequestSpec) -> None:
        rec = records[idx]
        rec.send_s = env.now
        in_flight[0] += 1
        if spec.prompt_len + spec.output_len > max_model_len:
            rec.success = False
            rec.error = (f"prompt ({spec.prompt_len}) + output ({spec.output_len}) tokens exceed "
                         f"max_model_len ({max_model_len})")
            finish(idx)
            return
        r = entry[router.route(spec.block_keys)]
        rec.replica = r
        rep = replicas[r]
        # A prefill instance runs the prompt and samples one token (vLLM P/D: max_tokens 1).
        req = Request(spec.request_id, idx, spec.prompt_len,
                      1 if r in prefill_of else spec.output_len, spec.block_keys,
                      spec.priority, spec.arrival_s, rec)
        if router.last_hashes is not None:
            # The router already chained this prompt's keyed blocks in the shared hash space.
            req.block_hashes = router.last_hashes
        if request_cpu_s is not None or request_latency_s > 0:
            # The API server's path before the engine sees the request: its work on the first
            # free server process, then the path's latency.
            in_server[0] += 1
            free = heapq.heappop(server_free)
            start = free if free > env.now else env.now
            done = start + (request_cpu_s(spec.prompt_len) if request_cpu_s is not None
                            else 0.0)
            heapq.heappush(server_free, done)
            rec.server_wait_s = start - env.now
            rec.server_s = done + request_latency_s - env.now

            def arrive(_, rep=rep, req=req) -> None:
                in_server[0] -= 1
                rep.sched.add_request(req)
                rep.notify()

            env.timeout(rec.server_s).callbacks.append(arrive)
        else:
            rep.sched.add_request(req)
            rep.notify()
        if request_timeout_s is not None:
            env.timeout(request_timeout_s).callbacks.append(
                lambda _: give_up(idx, rec, rep.sched, req))

    def give_up(idx: int, rec: RequestRecord, sched: Scheduler, req: Request) -> None:
        """The client's timeout: a request not finished by then is aborted in its engine (vLLM's
        API server aborts it when the client disconnects) and counts as failed."""
        if rec.success or not sched.finish_requests([req]):
            return
        rec.error = f"client timed out after {request_timeout_s:g} s (workload.request_timeout_s)"
        rec.finished_s = env.now
        rec.num_preemptions += req.num_preemptions
        finish(idx)

    def deliver(emitted: list[Request], finished: list[Request], now: float,
                rep: _Replica) -> None:
        """A step's sampled tokens reach their clients; finished requests complete (a prompt
        finished on a prefill instance moves on to a decode instance instead)."""
        if rep.index in prefill_of:
            for req in finished:
                handoff(req, rep)
            return
        for req in emitted:
            req.client.token_times_s.append(now)
        for req in finished:
            rec = req.client
            rec.success = True
            rec.num_preemptions += req.num_preemptions
            # The local prefix-cache hit; KV loaded from elsewhere (a tier fetch, a P/D
            # handoff) is counted apart, as vLLM's metrics keep the two apart.
            external = req.num_external_tokens
            rec.num_external_prompt_tokens = external
            if not req.remote_prefill_tokens:     # P/D: the prefill instance's hit stands
                rec.num_cached_prompt_tokens = max(req.num_cached_tokens - external, 0)
            finish(req.index)

    def handoff(req: Request, prefill: _Replica) -> None:
        """P/D: the prompt's KV stays on the prefill instance until a decode instance loads it."""
        rec = req.client
        rec.num_cached_prompt_tokens = max(req.num_cached_tokens, 0)
        rec.num_preemptions = req.num_preemptions
        d = replicas[kv_paths.pick_decode()]
        def release() -> None:
            prefill.sched.finish_sending(req)
            prefill.notify()

        kv_paths.prefill_done(req, prefill.index, release)
        dreq = Request(req.request_id, req.index, req.prompt_len, rec.output_len,
                       req.block_keys, req.priority, req.arrival, rec,
                       remote_prefill_tokens=req.prompt_len)
        dreq.block_hashes = list(req.block_hashes)
        d.sched.add_request(dreq)
        d.notify()

    def start_loads(rep: _Replica, loads) -> None:
        sched = rep.sched

        def loaded(req: Request) -> None:
            sched.finish_remote_load(req)
            rep.notify()

        kv_paths.start_loads(rep.index, loads, loaded)

    def client():
        for idx, spec in enumerate(specs):
            records.append(RequestRecord(request_id=spec.request_id, prompt_len=spec.prompt_len,
                                         output_len=spec.output_len, arrival_s=spec.arrival_s))
            delay = spec.arrival_s - env.now
            if delay > 0:
                yield env.timeout(delay)
            if max_concurrency is not None and in_flight[0] >= max_concurrency:
                backlog.append((idx, spec))
            else:
                send(idx, spec)
        state["all_sent"] = True

    def engine(rep: _Replica):
        sched = rep.sched
        stats = rep.stats
        step_time = rep.model.step_time
        schedule = sched.schedule
        update = sched.update
        shape_of = StepShape.from_scheduled
        timeout = env.timeout
        empty = 0
        while True:
            if not sched.has_requests:
                yield from sleep_group((rep,))
            out = schedule()
            scheduled = out.scheduled
            if out.preempted:
                stats.num_preemptions += len(out.preempted)
            if out.kv_loads:
                start_loads(rep, out.kv_loads)
            if kv_paths is not None and out.new:
                for req in out.new:     # admitted without a load: the prefill copy is not needed
                    kv_paths.release(req.request_id)
            if not scheduled:
                if sched.num_waiting_for_remote:
                    # Nothing to run until a load lands (or a request arrives).
                    yield from sleep_group((rep,))
                    continue
                empty += 1
                if empty > MAX_EMPTY_STEPS:
                    raise RuntimeError(f"replica {rep.index}: requests queued but nothing can be "
                                       f"scheduled")
                yield timeout(0)
                continue
            empty = 0
            now = env.now
            # Only a newly admitted request can be scheduled for the first time.
            for req in out.new:
                rec = req.client
                if rec.first_scheduled_s is None:
                    rec.first_scheduled_s = now
            shape = shape_of(scheduled)
            if cluster is None:
                st = step_time(shape)
                record(rep, out, shape, st)
                yield timeout(st.total_s)
            else:
                counts = (len(sched.running), len(sched.waiting))
                st = yield from cluster.step([(rep.index, scheduled)])
                record(rep, out, shape, st, counts)
            deliver(*update(out), env.now, rep)

    def record(rep: _Replica, out, shape: StepShape, st,
               counts: tuple[int, int] | None = None) -> None:
        """Count one step that ran `out` (shape `shape`) and took `st` on replica `rep`;
        `counts`: (running, waiting) when it was scheduled, if not now."""
        stats = rep.stats
        sched = rep.sched
        n_run, n_wait = counts or (len(sched.running), len(sched.waiting))
        if n_run > stats.max_num_running:
            stats.max_num_running = n_run
        if n_wait > stats.max_num_waiting:
            stats.max_num_waiting = n_wait
        total_s = st.total_s
        bound = st.bound
        if n_wait:
            if n_run >= sched.config.max_num_seqs:
                stats.num_steps_at_max_seqs += 1
                stats.busy_s_at_max_seqs += total_s
            elif out.num_tokens >= sched.config.token_budget:
                stats.num_steps_budget_full += 1
                stats.busy_s_budget_full += total_s
                if bound == "compute":
                    stats.num_steps_budget_full_compute_bound += 1
            else:
                stats.num_steps_waiting_blocked += 1
                stats.busy_s_waiting_blocked += total_s
        stats.num_tokens += shape.num_tokens
        stats.seq_s += total_s * shape.num_seqs
        stats.num_decode_tokens += shape.num_decode_seqs
        stats.num_prefill_tokens += shape.num_tokens - shape.num_decode_seqs
        phase = ("prefill/" if shape.num_tokens > shape.num_decode_seqs else "decode/") + bound
        count_step(stats, st, phase)

    def count_step(stats: ReplicaStats, st, phase: str) -> None:
        stats.num_steps += 1
        stats.busy_s += st.total_s
        stats.compute_s += st.compute_s
        stats.comm_s += st.comm_s
        stats.all_to_all_s += st.all_to_all_s
        stats.steps_by_bound[st.bound] = stats.steps_by_bound.get(st.bound, 0) + 1
        by_phase = stats.step_s_by_phase_bound
        by_phase[phase] = by_phase.get(phase, 0.0) + st.total_s

    def sleep_group(ranks):
        """Wait until any of `ranks` (one engine, or a lock-step group) is notified: a request
        arrived, or a KV load landed."""
        wake = env.event()
        for rep in ranks:
            rep.wake = wake
        yield wake
        for rep in ranks:
            rep.wake = None

    def group_engine(ranks: list[_Replica], model: GroupStepTimeModel):
        scheds = [rep.sched for rep in ranks]
        dummy = StepShape.dummy()
        shape_of = StepShape.from_scheduled
        empty = 0
        while True:
            if not any(sched.has_requests for sched in scheds):
                yield from sleep_group(ranks)
            outs = [sched.schedule() for sched in scheds]
            for rep, out in zip(ranks, outs):
                if out.preempted:
                    rep.stats.num_preemptions += len(out.preempted)
                if out.kv_loads:
                    start_loads(rep, out.kv_loads)
            if not any(out.scheduled for out in outs):
                if any(sched.num_waiting_for_remote for sched in scheds):
                    yield from sleep_group(ranks)
                    continue
                empty += 1
                if empty > MAX_EMPTY_STEPS:
                    raise RuntimeError(f"replicas {[rep.index for rep in ranks]}: requests "
                                       f"queued but nothing can be scheduled")
                yield env.timeout(0)
                continue
            empty = 0
            now = env.now
            shapes = []
            for out in outs:
                for req in out.new:
                    rec = req.client
                    if rec.first_scheduled_s is None:
                        rec.first_scheduled_s = now
                shapes.append(shape_of(out.scheduled) if out.scheduled else dummy)
            counts = [(len(sched.running), len(sched.waiting)) for sched in scheds]
            if cluster is None:
                st = model.step_time_group(shapes)
            else:
                st = yield from cluster.step([(rep.index, out.scheduled or None)
                                              for rep, out in zip(ranks, outs)])
            for rep, out, shape, c in zip(ranks, outs, shapes, counts):
                if out.scheduled:
                    record(rep, out, shape, st, c)
                else:
                    rep.stats.dummy_steps += 1
                    rep.stats.dummy_busy_s += st.total_s
                    count_step(rep.stats, st, "dummy/" + st.bound)
            if cluster is None:
                yield env.timeout(st.total_s)
            now = env.now
            for rep, out in zip(ranks, outs):
                if not out.scheduled:
                    continue
                deliver(*rep.sched.update(out), now, rep)

    series = TimeSeries()

    def reporter():
        while True:
            for k, i in enumerate(entry):
                sched = replicas[i].sched
                router.publish(k, len(sched.running) + sched.num_waiting)
            yield env.timeout(report_interval_s)

    def sampler():
        while True:
            if state.get("all_sent") and not backlog and not in_server[0] \
                    and not all_done.triggered and not any(
                        rep.sched.has_requests for rep in replicas):
                raise RuntimeError(f"{total - state['done']} requests were lost: every engine is "
                                   f"idle but they never completed")
            series.t_s.append(env.now)
            series.kv_usage.append([round(rep.sched.kv.usage, 4) for rep in replicas])
            series.num_running.append([len(rep.sched.running) for rep in replicas])
            series.num_waiting.append([rep.sched.num_waiting for rep in replicas])
            yield env.timeout(sample_interval_s)

    if cluster is not None:
        cluster.start()
    env.process(client())
    if lockstep_groups is None:
        for rep in replicas:
            env.process(engine(rep))
    else:
        members = sorted(i for g in lockstep_groups for i in g)
        if members != list(range(num_replicas)):
            raise ValueError(f"lockstep_groups must partition the {num_replicas} replicas, "
                             f"got {lockstep_groups}")
        for g in lockstep_groups:
            env.process(group_engine([replicas[i] for i in g], step_model))
    if len(entry) > 1:
        env.process(reporter())
    env.process(sampler())
    env.run(until=all_done)
    return ServingRun(records, [r.stats for r in replicas], series, [r.sched for r in replicas],
                      env.now, router.num_prefix_routed)
