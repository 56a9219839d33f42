"""The block allocations of a quiet run's decode steps, made at once.

`k` steps in which every request of a batch decodes one token call `KVCacheManager.allocate_slots(r,
1)` for a request only at the steps whose token passes what its blocks hold
(`num_tokens_fit`): the step that completes a block (which is then cached) and the step that
needs a new one. `allocate_run` finds those calls in the order single steps make them (step by
step, each step's batch in order) and makes each one's decisions as `allocate_slots` makes
them, but leaves the pool's work to the end: the run's new blocks are taken from the free queue
by one `pool.allocate(n)` call, which pops the same blocks in the same order as `n` calls of
one, and the run's completed blocks are cached by one `pool.cache_many` call, in the calls'
order.

Why that order of the pool's work changes nothing: a block the run allocates loses the hash it
held (an eviction) and a block it completes gains one. A completed block is held by its request
while the run lasts, so no allocation of the run pops it, and a block allocated and then
completed within the run is allocated first in both orders. Evicting a block from a hash's
blocks and appending another block to them commute (the blocks left, and their order, are the
same either way), so the prefix cache holds the same blocks under the same hashes, in the same
order, at the end of the run; nothing looks it up during the run (no request is admitted). The
hashes of completed blocks are drawn in the calls' order (`Request.ensure_block_hashes`), so
blocks with no key get the same fresh ids.
"""

from __future__ import annotations

import heapq

from simcore.engine.kv_cache import KVCacheManager
from simcore.engine.request import Request


def allocate_run(kv: KVCacheManager, reqs: list[Request], base: list[tuple[int, int]],
                 k: int) -> None:
    """Make the block allocations of `k` steps in which each of `reqs` (in batch order, each
    decoding, `num_computed_tokens + 1 == num_tokens`; `base` their computed and output
    tokens) computes one token a step, as `k` single steps' calls of `kv.allocate_slots(r, 1)`
    make them. The requests' counts are read, not changed, except `num_output_tokens`, which the
    caller sets after (it is moved to a call's step where a completed block's hash is drawn).
    Raises RuntimeError if the pool runs short (the caller's plan counted the blocks)."""
    fit = kv.num_tokens_fit
    bs = kv.block_size
    max_len = kv.max_model_len
    caching = kv.enable_caching
    req_blocks = kv.req_blocks
    num_cached = kv.num_cached_block
    space = kv.space
    # (step, position in the batch) of each request's next call: the first step j (1-based)
    # whose token would pass the tokens its blocks hold.
    heap = [(j, i) for i, (r, (c0, _)) in enumerate(zip(reqs, base))
            if (j := fit[r.request_id] - c0 + 1) <= k]
    if not heap:
        return
    heapq.heapify(heap)
    heappop, heappush = heapq.heappop, heapq.heappush
    slots: list[tuple[list[int], int]] = []      # (block table, index) of each new block
    completed: list[tuple[list[int], int]] = []  # (block table, index) of each completed block
    completed_hashes: list[int] = []
    while heap:
        j, i = heappop(heap)
        r = reqs[i]
        rid = r.request_id
        c0, o0 = base[i]
        c = c0 + j - 1          # the request's computed tokens before step j
        held = req_blocks[rid]
        need = c + 1 if c + 1 < max_len else max_len
        for _ in range(-(-need // bs) - len(held)):
            slots.append((held, len(held)))
            held.append(-1)     # filled in below
        f = len(held) * bs
        if caching:
            num_tokens = r.prompt_len + o0 + j - 1
            n_full = (c + 1 if c + 1 < num_tokens else num_tokens) // bs
            start = num_cached[rid]
            if n_full > start:
                r.num_output_tokens = o0 + j - 1
                hashes = r.ensure_block_hashes(space, bs)
                for m in range(start, n_full):
                    completed.append((held, m))
                    completed_hashes.append(hashes[m])
                num_cached[rid] = start = n_full
            if f > (start + 1) * bs - 1:
                f = (start + 1) * bs - 1
        fit[rid] = f
        nxt = f - c0 + 1
        if nxt <= j:
            raise RuntimeError(f"allocate_slots left {rid} no room for its token")
        if nxt <= k:
            heappush(heap, (nxt, i))
    pool = kv.pool
    if slots:
        if len(slots) > pool.num_free:
            raise RuntimeError(f"a quiet run found {pool.num_free} free blocks for "
                               f"{len(slots)} (the plan counted enough)")
        for (held, m), b in zip(slots, pool.allocate(len(slots))):
            held[m] = b
    if len(completed) == 1:
        held, m = completed[0]
        pool.cache(held[m], completed_hashes[0])
    elif completed:
        pool.cache_many([held[m] for held, m in completed], completed_hashes)
