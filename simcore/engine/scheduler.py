"""vLLM V1's scheduler (sync mode) as a pure object: `schedule()` plans a step, `update()` applies its outputs.

The decision rules follow vLLM 0.33's `vllm/v1/core/sched/scheduler.py` (REFERENCE.md §1): one token
budget shared by running and waiting requests, running requests first, chunked prefill,
`long_prefill_token_threshold`, full-prompt admission, prefix caching with same-step hits, and
preemption of the last-admitted running request with recompute. Two policies of an earlier
simulator design are options beside the default: least-work-done preemption and a persistent batch.
No clock lives here: the caller decides when a step starts and how long it takes.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass
from typing import NamedTuple

from simcore.engine.kv_cache import KVCacheManager
from simcore.engine.request import FINISHED, PREEMPTED, RUNNING, WAITING, BlockHashSpace, Request

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
    watermark_blocks: int = 0             # free blocks kept back when admitting


class SchedulerOutput(NamedTuple):
    """What one step runs: the plan `schedule()` returns and `update()` consumes.

    `scheduled` lists (request, num_new_tokens, num_computed_before) in batch order: running
    requests first, then newly admitted or resumed ones. `computed_on_admit` maps admitted request
    ids to their prefix-cache hit in tokens. A named tuple: immutable, and built once per step at
    a fraction of a frozen dataclass's cost.
    """

    scheduled: list[tuple[Request, int, int]]
    new: list[Request]
    resumed: list[Request]
    preempted: list[Request]
    computed_on_admit: dict[str, int]
    num_tokens: int = 0

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
    the caller may `add_request`. Invariants: every running request holds blocks for all of its
    computed tokens; a request is in exactly one of waiting, running, or finished.
    """

    def __init__(self, config: SchedulerConfig, space: BlockHashSpace | None = None) -> None:
        c = config
        if not c.enable_chunked_prefill and c.max_num_batched_tokens < c.max_model_len:
            raise ValueError("without chunked prefill max_num_batched_tokens must be >= max_model_len")
        self.config = c
        self.kv = KVCacheManager(c.num_blocks, c.block_size, c.enable_prefix_caching,
                                 c.max_model_len, space)
        self.waiting = _WaitingQueue(c.policy == "priority")
        self.running: list[Request] = []
        self.num_preemptions = 0
        self.num_steps = 0
        self._completed_since_admit = True

    # -- queue -------------------------------------------------------------------------------
    def add_request(self, req: Request) -> None:
        req.status = WAITING
        self.waiting.add(req)

    @property
    def has_requests(self) -> bool:
        return bool(self.running) or len(self.waiting) > 0

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    # -- one step ----------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        c = self.config
        kv = self.kv
        budget = c.max_num_batched_tokens
        running = self.running
        waiting = self.waiting
        queued = waiting.items      # the queue's own deque or heap: len() without a method call
        threshold = c.long_prefill_token_threshold if len(running) + len(queued) > 1 else 0
        max_len_cap = c.max_model_len - 1
        scheduled: list[tuple[Request, int, int]] = []
        preempted: list[Request] = []
        allocate_slots = kv.allocate_slots
        fit = kv.num_tokens_fit

        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            computed = req.num_computed_tokens
            n = req.prompt_len + req.num_output_tokens - computed
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
            if computed + n > fit.get(req.request_id, -1) and not allocate_slots(req, n):
                while True:
                    victim = self._pick_victim(req, scheduled)
                    if victim is None:      # nothing may be preempted: the request waits this step
                        break
                    # The victim is usually the last running request (vLLM's policy).
                    vi = len(running) - 1 if running[-1] is victim else running.index(victim)
                    del running[vi]
                    # Preempting a request scheduled earlier in this step hands back its tokens.
                    for k in range(len(scheduled)):
                        if scheduled[k][0] is victim:
                            budget += scheduled[k][1]
                            del scheduled[k]
                            if vi < i:
                                i -= 1
                            break
                    self._preempt(victim)
                    preempted.append(victim)
                    if victim is req or allocate_slots(req, n):
                        break
                if victim is None:
                    i += 1
                    continue
                if victim is req:
                    break
            scheduled.append((req, n, computed))
            req.num_computed_tokens = computed + n     # vLLM advances it at schedule time
            budget -= n
            i += 1

        new: list[Request] = []
        resumed: list[Request] = []
        admit: dict[str, int] = {}
        may_admit = not preempted and (not c.persistent_batch or self._completed_since_admit
                                       or not running)
        if may_admit and queued:
            admitted_any = False
            while queued and budget > 0 and len(running) < c.max_num_seqs:
                req = waiting.peek()
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
                if not kv.allocate_slots(req, n, hit_blocks, c.reserve_full_isl and bool(running),
                                         c.watermark_blocks):
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

        # Counted only now: least-work-done preemption compares the work done before this step.
        for req, n, _ in scheduled:
            req.work_done_tokens += n
        self.num_steps += 1
        return SchedulerOutput(scheduled, new, resumed, preempted, admit,
                               c.max_num_batched_tokens - budget)

    def update(self, out: SchedulerOutput) -> tuple[list[Request], list[Request]]:
        """Apply the step's sampled tokens: one per request whose prompt is fully computed.

        Returns (requests that emitted a token, requests that finished) in batch order.
        """
        c = self.config
        emitted: list[Request] = []
        finished: list[Request] = []
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
            done = set(map(id, finished))
            self.running = [r for r in self.running if id(r) not in done]
            for req in finished:
                req.status = FINISHED
                self.kv.free(req)
            self._completed_since_admit = True
        return emitted, finished

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
        victim.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.prepend(victim)
