"""vLLM V1's scheduler (sync mode) as a pure object: `schedule()` plans a step, `update()` applies its outputs.

The decision rules follow vLLM 0.33's `vllm/v1/core/sched/scheduler.py` (`Scheduler.schedule`):
one token budget shared by running and waiting requests (the smaller of
`max_num_scheduled_tokens` and `max_num_batched_tokens`), running requests first, chunked
prefill, `long_prefill_token_threshold`, full-prompt admission, the free-block watermark, prefix
caching with same-step hits, preemption of the last-admitted (or lowest-priority) running request
with recompute, aborts (`finish_requests`), and external KV through a KV connector (asynchronous
loads in WAITING_FOR_REMOTE_KVS), and speculative decoding (drafts scheduled with their request,
lookahead slots, rejected drafts rolled back in `update`, as `update_from_output` does; which
drafts are accepted is drawn by `simcore.engine.speculative`). Three policies of an earlier
simulator design are options beside the default: least-work-done preemption, a persistent
batch, and a cap on requests holding blocks for external loads. No clock lives here: the caller decides when a step starts and how long
it takes, and when an external load ends.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass
from typing import Any, NamedTuple

from simcore.engine.connector import KVConnector
from simcore.engine.hybrid_kv import HybridKVCacheManager
from simcore.engine.kv_cache import KVCacheManager
from simcore.engine.request import (FINISHED, FINISHED_ABORTED, PREEMPTED, RUNNING, WAITING,
                                    WAITING_FOR_REMOTE_KVS, BlockHashSpace, Request)
from simcore.engine.speculative import EAGLE_FAMILY, SpecDecodeParams, SpecDecodeStats

LWD_NEAR_DONE_FRACTION = 0.05
"""Least-work-done preemption spares requests within this fraction of their decode length."""
LWD_MAX_PREEMPTIONS = 3
"""Least-work-done preemption spares requests already preempted this many times."""


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """The scheduler's settings, with vLLM's names and meanings."""

    max_num_seqs: int
    max_num_batched_tokens: int
    num_blocks: int                       # GPU block pool size, null block included
    block_size: int = 16
    max_model_len: int = 131072
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    long_prefill_token_threshold: int = 0
    policy: str = "fcfs"                  # "fcfs" | "priority"
    preemption: str = "vllm"              # "vllm" (last admitted / lowest priority) | "least_work_done"
    persistent_batch: bool = False        # admit new requests only when a running one completed
    reserve_full_isl: bool = True         # vLLM's scheduler_reserve_full_isl
    watermark: float = 0.0                # fraction of num_blocks kept free when admitting while
                                          # something runs (vLLM's SchedulerConfig.watermark)
    max_num_scheduled_tokens: int | None = None   # tokens one step may schedule (None: the budget)
    max_kvc_ready_requests: int = 0       # requests loading external KV at once (0 = unlimited)
    kv_cache_groups: tuple[int, ...] = () # per KV-cache group sharing the pool, the window its
                                          # layers attend over (0: full attention), as vLLM's
                                          # hybrid manager groups them; () or no window: one group
    speculative: SpecDecodeParams | None = None   # speculative decoding (None: off)
    vllm: Any = None                      # a VllmInstall: vLLM's own scheduler decides
                                          # (engine.implementation vllm); None: this one
    compiled: bool = False                # the engine's compiled kernels, the same results,
                                          # faster on long runs: the block pool in arrays
                                          # (`simcore.engine.array_pool`; hybrid KV-cache groups
                                          # keep the Python pool) and quiet runs' step times
                                          # (`simcore.compute.decode_steps`)

    @property
    def token_budget(self) -> int:
        """Tokens one step may schedule: vLLM spends a step's tokens from two budgets at once,
        `max_num_scheduled_tokens` and `max_num_batched_tokens`, and stops at either."""
        limit = self.max_num_scheduled_tokens
        b = self.max_num_batched_tokens
        return b if limit is None or limit > b else limit

    @property
    def watermark_blocks(self) -> int:
        """Free blocks an admission must leave while something runs (vLLM's KVCacheManager:
        `int(watermark * num_blocks)`)."""
        return int(self.watermark * self.num_blocks)


class SchedulerOutput(NamedTuple):
    """What one step runs: the plan `schedule()` returns and `update()` consumes.

    `scheduled` lists (request, num_new_tokens, num_computed_before) in batch order: running
    requests first, then newly admitted or resumed ones. `computed_on_admit` maps admitted request
    ids to their computed tokens on admission (prefix-cache hit plus external KV). `kv_loads` lists
    (request, num_external_tokens) for the external loads started this step: asynchronous ones
    leave the request in WAITING_FOR_REMOTE_KVS until `Scheduler.finish_remote_load`; synchronous
    ones are part of this step (the request is scheduled in it). A named tuple: immutable, and
    built once per step at a fraction of a frozen dataclass's cost.
    """

    scheduled: list[tuple[Request, int, int]]
    new: list[Request]
    resumed: list[Request]
    preempted: list[Request]
    computed_on_admit: dict[str, int]
    num_tokens: int = 0
    kv_loads: tuple[tuple[Request, int], ...] = ()

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class _WaitingQueue:
    """FCFS deque, or a heap on (priority, arrival, index) under the priority policy."""

    __slots__ = ("priority", "items")

    def __init__(self, priority: bool) -> None:
        self.priority = priority
        self.items: deque[Request] | list = [] if priority else deque()

    def __len__(self) -> int:
        return len(self.items)

    def remove(self, reqs: set[int]) -> None:
        """Drop the requests whose `id()` is in `reqs`, keeping the others' order."""
        if self.priority:
            self.items = [t for t in self.items if id(t[3]) not in reqs]
            heapq.heapify(self.items)
        else:
            self.items = deque(r for r in self.items if id(r) not in reqs)

    def add(self, req: Request) -> None:
        if self.priority:
            heapq.heappush(self.items, (req.priority, req.arrival, req.index, req))
        else:
            self.items.append(req)

    def prepend(self, req: Request) -> None:
        if self.priority:
            self.add(req)
        else:
            self.items.appendleft(req)

    def peek(self) -> Request:
        return self.items[0][3] if self.priority else self.items[0]

    def pop(self) -> Request:
        return heapq.heappop(self.items)[3] if self.priority else self.items.popleft()

    def __iter__(self):
        return (t[3] for t in self.items) if self.priority else iter(self.items)


class Scheduler:
    """Continuous batching over one KV block pool.

    Lifecycle per step: `schedule()` -> run the step (caller) -> `update(output)`. Between steps
    the caller may `add_request`, `finish_requests` (aborts) and `finish_remote_load`.
    Invariants: every running request holds blocks for all of its computed tokens; a request is
    in exactly one of waiting, running, or finished; a request in WAITING_FOR_REMOTE_KVS is in the
    waiting queue and in
    `waiting_for_remote`, holds blocks for its local hit plus its external tokens, and is never
    preempted (it is not running).

    With a connector, as in vLLM, a request whose load is under way keeps its place at the head
    of the waiting queue: each step's admission loop passes over it, and takes it up as an
    ordinary waiting request (computed tokens: its blocks' tokens, but never all of its tokens)
    the first time it reaches it after `finish_remote_load`; its loaded blocks enter the prefix
    cache then. A request refused a load by `max_kvc_ready_requests` is passed over the same way
    and asks again next step. Blocks held by loads count against admission like any others; a pool
    too small for the loads under way and the request at the head of the queue stops admission
    until a load ends (vLLM behaves the same; `max_kvc_ready_requests` bounds the blocks at stake).
    """

    def __init__(self, config: SchedulerConfig, space: BlockHashSpace | None = None,
                 connector: KVConnector | None = None) -> None:
        c = config
        if not c.enable_chunked_prefill and c.max_num_batched_tokens < c.max_model_len:
            raise ValueError("without chunked prefill max_num_batched_tokens must be >= max_model_len")
        if c.max_kvc_ready_requests < 0:
            raise ValueError("max_kvc_ready_requests must be >= 0 (0 = unlimited)")
        if not 0 <= c.watermark < 1:
            raise ValueError(f"watermark must be in [0, 1), got {c.watermark}")
        self.config = c
        if any(c.kv_cache_groups):
            if connector is not None:
                raise ValueError("a KV connector (P/D disaggregation, an external KV tier) is not "
                                 "modelled with sliding-window KV-cache groups")
            self.kv = HybridKVCacheManager(c.num_blocks, c.block_size, c.enable_prefix_caching,
                                           c.max_model_len, c.kv_cache_groups,
                                           c.max_num_batched_tokens, space)
        else:
            self.kv = KVCacheManager(c.num_blocks, c.block_size, c.enable_prefix_caching,
                                     c.max_model_len, space, array_pool=c.compiled)
        if c.speculative is not None and c.speculative.method in EAGLE_FAMILY:
            self.kv.use_eagle = True
        self.waiting = _WaitingQueue(c.policy == "priority")
        self.running: list[Request] = []
        self.num_preemptions = 0
        self.num_steps = 0
        self._completed_since_admit = True
        self.connector = connector
        # Requests in WAITING_FOR_REMOTE_KVS by id, oldest load first (they also stay queued).
        self.waiting_for_remote: dict[str, Request] = {}
        self.sending: dict[str, Request] = {}
        """Finished requests whose blocks stay allocated until `finish_sending` (their KV is
        being read by another instance)."""
        self._loads_done: set[str] = set()      # loads reported done, not yet taken up (vLLM's
                                                # finished_recving_kv_req_ids)
        # Aborted while their external load was under way: their blocks go when it ends.
        self._aborted_loads: dict[str, Request] = {}
        self._passed_over: list[Request] = []   # this step's waiting requests to requeue in order
        self._step_loads: list[tuple[Request, int]] = []
        spec = c.speculative
        self.spec_stats = SpecDecodeStats(spec.num_spec_tokens) if spec is not None else None
        """Acceptance counts of the verifications so far (None without speculative decoding)."""

    # -- queue -------------------------------------------------------------------------------
    def add_request(self, req: Request) -> None:
        req.status = WAITING
        self.waiting.add(req)

    def finish_sending(self, req: Request) -> None:
        """Another instance has read a finished request's KV: free its blocks (vLLM's
        finished_sending)."""
        if self.sending.pop(req.request_id, None) is None:
            raise ValueError(f"request {req.request_id} is not holding blocks for a send")
        self.kv.free(req)

    def finish_requests(self, reqs: list[Request]) -> list[Request]:
        """Abort requests of this scheduler (a client gave up), as vLLM's
        `Scheduler.finish_requests(ids, FINISHED_ABORTED)`: each leaves the running list or the
        waiting queue, ends FINISHED_ABORTED and frees its blocks (a request whose external load
        is under way keeps them until `finish_remote_load`, as vLLM delays that free). Its KV is
        sent nowhere: vLLM's P/D connectors send only requests that finished by length.
        Returns the requests aborted, in the order given; those already finished are left out.
        """
        aborted = [r for r in reqs if r.status != FINISHED and r.status != FINISHED_ABORTED]
        if not aborted:
            return aborted
        gone = set(map(id, aborted))
        if any(r.status == RUNNING for r in aborted):
            self.running = [r for r in self.running if id(r) not in gone]
            self._completed_since_admit = True      # a persistent batch refills as on completion
        if any(r.status != RUNNING for r in aborted):
            self.waiting.remove(gone)
        for req in aborted:
            rid = req.request_id
            loading = req.status == WAITING_FOR_REMOTE_KVS
            req.status = FINISHED_ABORTED
            if loading:
                del self.waiting_for_remote[rid]
                if rid not in self._loads_done:
                    self._aborted_loads[rid] = req
                    continue
                self._loads_done.discard(rid)
            self.kv.free(req)
        return aborted

    def finish_remote_load(self, req: Request) -> None:
        """The external KV load of `req` is complete (vLLM's `finished_recving`): the next
        admission loop that reaches the request takes it up as an ordinary waiting request
        (or, if it was aborted meanwhile, its blocks are freed)."""
        if self._aborted_loads.pop(req.request_id, None) is not None:
            self.kv.free(req)
            return
        if req.request_id not in self.waiting_for_remote:
            raise ValueError(f"request {req.request_id!r} is not waiting for remote KV")
        self._loads_done.add(req.request_id)

    @property
    def has_requests(self) -> bool:
        return bool(self.running) or len(self.waiting) > 0

    @property
    def num_spec_tokens(self) -> int:
        """Draft tokens proposed per decoding request and step (k); 0 without speculative
        decoding. A step then may emit several tokens per request."""
        spec = self.config.speculative
        return spec.num_spec_tokens if spec is not None else 0

    @property
    def num_waiting(self) -> int:
        """Waiting requests, those waiting for remote KV excepted (vLLM counts both)."""
        return len(self.waiting.items) - len(self.waiting_for_remote)

    @property
    def num_waiting_for_remote(self) -> int:
        return len(self.waiting_for_remote)

    # -- one step ----------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        c = self.config
        kv = self.kv
        budget = full_budget = c.token_budget
        running = self.running
        waiting = self.waiting
        queued = waiting.items      # the queue's own deque or heap: len() without a method call
        threshold = c.long_prefill_token_threshold if len(running) + len(queued) > 1 else 0
        max_len_cap = c.max_model_len - 1
        scheduled: list[tuple[Request, int, int]] = []
        preempted: list[Request] = []
        fit = kv.num_tokens_fit
        spec = c.speculative
        # Speculative decoding: KV slots past the scheduled tokens for the drafter's own drafts.
        lookahead = spec.num_lookahead_tokens if spec is not None else 0
        if lookahead:
            def allocate_slots(req: Request, n: int) -> bool:
                return kv.allocate_slots(req, n, None, False, 0, lookahead)
        else:
            allocate_slots = kv.allocate_slots

        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            computed = req.num_computed_tokens
            # vLLM's num_tokens_with_spec - num_computed_tokens: the drafts ride along.
            n = req.prompt_len + req.num_output_tokens + req.num_spec_tokens - computed
            if 0 < threshold < n:
                n = threshold
            if n > budget:
                n = budget
            if n > max_len_cap - computed:
                n = max_len_cap - computed
            if n <= 0:
                i += 1
                continue
            # Within `fit` allocate_slots would change nothing and succeed: skip the call.
            if computed + n + lookahead > fit.get(req.request_id, -1) \
                    and not allocate_slots(req, n):
                while True:
                    victim = self._pick_victim(req, scheduled)
                    if victim is None:      # nothing may be preempted: the request waits this step
                        break
                    # The victim is usually the last running request (vLLM's policy).
                    vi = len(running) - 1 if running[-1] is victim else running.index(victim)
                    del running[vi]
                    if vi < i:
                        i -= 1
                    # Preempting a request scheduled earlier in this step hands back its tokens.
                    for k in range(len(scheduled)):
                        if scheduled[k][0] is victim:
                            budget += scheduled[k][1]
                            del scheduled[k]
                            break
                    self._preempt(victim)
                    preempted.append(victim)
                    if victim is req or allocate_slots(req, n):
                        break
                if victim is None:
                    i += 1
                    continue
                if victim is req:
                    # vLLM goes on with the requests after it (under FCFS it was the last one;
                    # under the priority policy the rest rank higher and may fit in the blocks it
                    # freed); least-work-done stops there.
                    if c.preemption == "least_work_done":
                        break
                    continue
            scheduled.append((req, n, computed))
            req.num_computed_tokens = computed + n     # vLLM advances it at schedule time
            budget -= n
            if spec is not None:
                # The drafts that fit (computed + n - num_tokens of them) are verified this
                # step; the rest are dropped, and new ones are proposed after it.
                req.num_spec_tokens = 0
            i += 1

        new: list[Request] = []
        resumed: list[Request] = []
        admit: dict[str, int] = {}
        kv_loads: tuple[tuple[Request, int], ...] = ()
        may_admit = not preempted and (not c.persistent_batch or self._completed_since_admit
                                       or not running)
        if may_admit and queued:
            admitted_any = False
            connector = self.connector
            watermark = c.watermark_blocks
            while queued and budget > 0 and len(running) < c.max_num_seqs:
                req = waiting.peek()
                if connector is not None:
                    computed, n = self._admit_with_connector(req, budget, threshold, bool(running))
                    if n <= 0:
                        if n == 0:      # passed over: loading, or refused a load this step
                            continue
                        break
                else:
                    hit_blocks: list[int] = []
                    if req.num_computed_tokens == 0:
                        hit_blocks = kv.get_computed_blocks(req)
                        computed = len(hit_blocks) * c.block_size
                    else:
                        computed = req.num_computed_tokens
                    n = req.prompt_len + req.num_output_tokens - computed
                    if 0 < threshold < n:
                        n = threshold
                    if not c.enable_chunked_prefill and n > budget:
                        break
                    if n > budget:
                        n = budget
                    # vLLM applies the watermark only while something runs; the whole-prompt
                    # check always; lookahead slots only for a request with computed tokens.
                    if lookahead and req.num_computed_tokens:
                        if not kv.allocate_slots(req, n, hit_blocks, c.reserve_full_isl,
                                                 watermark if running else 0, lookahead):
                            break
                    elif not kv.allocate_slots(req, n, hit_blocks, c.reserve_full_isl,
                                               watermark if running else 0):
                        break
                waiting.pop()
                running.append(req)
                if req.status == PREEMPTED:
                    resumed.append(req)
                else:
                    new.append(req)
                admit[req.request_id] = computed
                if req.num_cached_tokens < 0:
                    req.num_cached_tokens = computed
                req.status = RUNNING
                req.num_computed_tokens = computed + n
                scheduled.append((req, n, computed))
                budget -= n
                admitted_any = True
            if admitted_any:
                self._completed_since_admit = False
            if connector is not None:
                kv_loads = self._end_admission()

        # Counted only now: least-work-done preemption compares the work done before this step.
        for req, n, _ in scheduled:
            req.work_done_tokens += n
        self.num_steps += 1
        return SchedulerOutput(scheduled, new, resumed, preempted, admit, full_budget - budget,
                               kv_loads)

    def update(self, out: SchedulerOutput) -> tuple[list[Request], list[Request]]:
        """Apply the step's sampled tokens: one per request whose prompt is fully computed
        (with speculative decoding, one plus its accepted drafts).

        Returns (requests that emitted tokens, once per token, requests that finished) in batch
        order.
        """
        c = self.config
        if c.speculative is not None:
            emitted, finished = self._sample_with_drafts(out)
        else:
            emitted = []
            finished = []
            max_len = c.max_model_len
            for req, _, _ in out.scheduled:
                if req.status != RUNNING:
                    continue
                num_output = req.num_output_tokens
                if req.num_computed_tokens >= req.prompt_len + num_output:
                    num_output += 1
                    req.num_output_tokens = num_output
                    emitted.append(req)
                    if num_output >= req.max_tokens or req.prompt_len + num_output >= max_len:
                        finished.append(req)
        if finished:
            self.finish_sampled(finished)
        return emitted, finished

    def finish_sampled(self, finished: list[Request]) -> None:
        """`finished` (running, in batch order) have sampled their last token: they leave the
        running list and free their blocks, as `update_from_output` finishes requests."""
        done = set(map(id, finished))
        self.running = [r for r in self.running if id(r) not in done]
        connector = self.connector
        for req in finished:
            req.status = FINISHED
            # Before the blocks go, as vLLM's _free_request; the connector may keep them
            # until another instance has read the KV.
            if connector is not None and connector.request_finished(req):
                self.sending[req.request_id] = req
                continue
            self.kv.free(req)
        self._completed_since_admit = True

    def _sample_with_drafts(self, out: SchedulerOutput) -> tuple[list[Request], list[Request]]:
        """vLLM's `update_from_output` with speculative decoding, then `update_draft_token_ids`.

        A request whose tokens are all computed sampled this step. Its drafts verified this step
        are its computed tokens past its tokens; of them the acceptance model accepts a prefix,
        and the rejected ones leave `num_computed_tokens` (their slots are reused next step).
        It emits the accepted drafts plus one token (the correction, or the bonus token when
        all were accepted), none past max_tokens or max_model_len, each listed in `emitted`
        once. A request that goes on gets k new drafts for its next step; one still in a
        partial prefill sampled nothing and gets none.
        """
        c = self.config
        spec = c.speculative
        k = spec.num_spec_tokens
        stats = self.spec_stats
        max_len = c.max_model_len
        emitted: list[Request] = []
        finished: list[Request] = []
        for req, _, _ in out.scheduled:
            if req.status != RUNNING:
                continue
            num_output = req.num_output_tokens
            num_tokens = req.prompt_len + num_output
            computed = req.num_computed_tokens
            if computed < num_tokens:
                continue
            gen = 1
            drafts = computed - num_tokens
            if drafts > 0:
                key = req.spec_key
                if key is None:
                    key = req.spec_key = spec.request_key(req.request_id)
                accepted = spec.num_accepted(key, num_output, drafts)
                req.num_computed_tokens = computed - (drafts - accepted)
                stats.observe(drafts, accepted)
                gen += accepted
            room = req.max_tokens - num_output
            if max_len - num_tokens < room:
                room = max_len - num_tokens
            if gen >= room:
                gen = room
                finished.append(req)
            else:
                req.num_spec_tokens = k
            req.num_output_tokens = num_output + gen
            emitted.extend([req] * gen)
        return emitted, finished

    # -- external KV -------------------------------------------------------------------------
    def _admit_with_connector(self, req: Request, budget: int, threshold: int,
                              has_running: bool) -> tuple[int, int]:
        """The admission loop's step for the waiting request at the head of the queue when there
        is a connector: vLLM's WAITING_FOR_REMOTE_KVS check, local and external prefix lookup,
        and allocation.

        Returns (computed, n) with n > 0 when `req` is allocated and to be scheduled for n tokens
        after `computed`; n == 0 when it was passed over (moved to `_passed_over`: its load is
        under way, it just started one, or `max_kvc_ready_requests` refused one); n < 0 when
        admission stops at it this step.
        """
        c = self.config
        kv = self.kv
        connector = self.connector
        if req.status == WAITING_FOR_REMOTE_KVS:
            if req.request_id not in self._loads_done:
                self._passed_over.append(self.waiting.pop())
                return 0, 0
            self._take_up_load(req)
        hit_blocks: list[int] = []
        num_external = 0
        num_tokens = req.prompt_len + req.num_output_tokens
        if req.num_computed_tokens == 0:
            hit_blocks = kv.get_computed_blocks(req)
            computed = len(hit_blocks) * c.block_size
            num_external, load_async = connector.get_num_new_matched_tokens(req, computed)
            if req.skip_reading_prefix_cache:
                num_external, load_async = 0, False
            if computed + num_external > num_tokens:
                raise ValueError(f"the KV connector matched {num_external} tokens after {computed} "
                                 f"of request {req.request_id!r}, which has {num_tokens}")
            if num_external > 0 and load_async:
                limit = c.max_kvc_ready_requests
                if limit and len(self.waiting_for_remote) >= limit:
                    self._passed_over.append(self.waiting.pop())
                    return 0, 0
                if not self._allocate_for_load(req, num_external, hit_blocks, has_running):
                    return 0, -1
                connector.update_state_after_alloc(req, num_external)
                req.num_external_tokens = num_external
                req.status = WAITING_FOR_REMOTE_KVS
                self.waiting_for_remote[req.request_id] = req
                self._step_loads.append((req, num_external))
                self._passed_over.append(self.waiting.pop())
                return 0, 0
            if num_external > 0:
                if computed + num_external >= num_tokens:
                    raise ValueError(f"a synchronous KV load must leave a token of request "
                                     f"{req.request_id!r} to compute")
                computed += num_external
            else:
                num_external = 0
        else:
            computed = req.num_computed_tokens
        n = num_tokens - computed
        if 0 < threshold < n:
            n = threshold
        if not c.enable_chunked_prefill and n > budget:
            return 0, -1
        if n > budget:
            n = budget
        # A synchronous load's tokens are allocated (and cached) with the step's own.
        if not kv.allocate_slots(req, num_external + n, hit_blocks, c.reserve_full_isl,
                                 c.watermark_blocks if has_running else 0):
            return 0, -1
        connector.update_state_after_alloc(req, num_external)
        if num_external:
            req.num_external_tokens = num_external
            self._step_loads.append((req, num_external))
        return computed, n

    def _allocate_for_load(self, req: Request, num_external: int, hit_blocks: list[int],
                           has_running: bool) -> bool:
        """Allocate blocks for `req`'s local hit and `num_external` tokens to load, or return False.

        As vLLM's `allocate_slots(..., delay_cache_blocks=True)`: the blocks to load are not
        entered into the prefix cache, as their KV is not there yet (`_take_up_load` does it).
        """
        kv = self.kv
        caching = kv.enable_caching
        kv.enable_caching = False
        try:
            c = self.config
            ok = kv.allocate_slots(req, num_external, hit_blocks, c.reserve_full_isl,
                                   c.watermark_blocks if has_running else 0)
        finally:
            kv.enable_caching = caching
        # Without this bound the next allocation would skip caching the loaded blocks.
        kv.num_tokens_fit.pop(req.request_id, None)
        return ok

    def _take_up_load(self, req: Request) -> None:
        """vLLM's `_update_waiting_for_remote_kv` for a finished load: the request's blocks count
        as computed, all but its last token at most, and its full ones enter the prefix cache."""
        rid = req.request_id
        self._loads_done.discard(rid)
        del self.waiting_for_remote[rid]
        kv = self.kv
        bs = kv.block_size
        blocks = kv.req_blocks[rid]
        num_tokens = req.prompt_len + req.num_output_tokens
        computed = len(blocks) * bs
        if computed >= num_tokens:
            computed = num_tokens - 1
        if kv.enable_caching:
            start = kv.num_cached_block[rid]
            num_full = computed // bs
            if num_full > start:
                hashes = req.ensure_block_hashes(kv.space, bs)
                kv.pool.cache_many(blocks[start:num_full], hashes[start:num_full])
                kv.num_cached_block[rid] = num_full
        req.num_computed_tokens = computed
        req.status = PREEMPTED if req.num_preemptions else WAITING

    def _end_admission(self) -> tuple[tuple[Request, int], ...]:
        """Put the requests passed over back at the head of the waiting queue, in the order they
        were met (vLLM's skipped_waiting_requests), and return the step's external loads."""
        passed = self._passed_over
        if passed:
            prepend = self.waiting.prepend
            for req in reversed(passed):
                prepend(req)
            passed.clear()
        loads = self._step_loads
        if not loads:
            return ()
        self._step_loads = []
        return tuple(loads)

    # -- preemption --------------------------------------------------------------------------
    def _pick_victim(self, req: Request,
                     scheduled: list[tuple[Request, int, int]]) -> Request | None:
        """The running request to preempt so that `req` fits, or None; `scheduled` is the step's
        plan so far (the current policies choose without it)."""
        running = self.running
        c = self.config
        if c.preemption == "least_work_done":
            best = None
            best_key = None
            for r in running:
                if r is req:
                    continue
                remaining = r.max_tokens - r.num_output_tokens
                if r.num_output_tokens > 0 and remaining <= LWD_NEAR_DONE_FRACTION * r.max_tokens:
                    continue
                if r.num_preemptions >= LWD_MAX_PREEMPTIONS:
                    continue
                key = (r.work_done_tokens, -r.index)
                if best_key is None or key < best_key:
                    best, best_key = r, key
            if best is not None:
                return best
            # No one else may be preempted: the request itself yields (vLLM's last resort).
            return req
        if c.policy == "priority":
            return max(running, key=lambda r: (r.priority, r.arrival, r.index))
        return running[-1]

    def _preempt(self, victim: Request) -> None:
        self.kv.free(victim)
        victim.status = PREEMPTED
        victim.num_computed_tokens = 0
        victim.num_spec_tokens = 0
        victim.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.prepend(victim)
