"""The block allocations of a quiet run's decode steps, made at once.

`k` steps in which every request of a batch decodes one token call `KVCacheManager.allocate_slots(r,
1)` for a request only at the steps whose token passes what its blocks hold
(`num_tokens_fit`): the step that completes a block (which is then cached) and the step that
needs a new one. Which steps those are follows from the request's counts alone: its `m`-th
block is allocated at the step that computes the block's first token (or the run's first step,
for a block the request already lacks), and is cached at the step that completes it (or the
first step, for one already full); the `num_tokens_fit` that `allocate_slots` leaves after its
last call follows from the blocks held and cached then. `allocate_run` makes those decisions for
each request at once, and the pool's work in single steps' order (step by step, each step's
batch in order, a request's blocks in block order): the run's new blocks are taken from the
free queue by one `pool.allocate(n)` call, which pops the same blocks in the same order as `n`
calls of one, and the run's completed blocks are cached by one `pool.cache_many` call, in that
order, their hashes drawn in it (keyed ones by `Request.ensure_block_hashes`, interned in the
same order; the others by `Request.draw_fresh`, which gives them the same fresh ids).

Why that order of the pool's work changes nothing: a block the run allocates loses the hash it
held (an eviction) and a block it completes gains one. A completed block is held by its request
while the run lasts, so no allocation of the run pops it, and a block allocated and then
completed within the run is allocated first in both orders. Evicting a block from a hash's
blocks and appending another block to them commute (the blocks left, and their order, are the
same either way), so the prefix cache holds the same blocks under the same hashes, in the same
order, at the end of the run; nothing looks it up during the run (no request is admitted).
"""

from __future__ import annotations

from simcore.engine.block_table import BlockTable
from simcore.engine.kv_cache import KVCacheManager
from simcore.engine.request import Request


def allocate_run(kv: KVCacheManager, reqs: list[Request], base: list[tuple[int, int]],
                 k: int) -> None:
    """Make the block allocations of `k` steps in which each of `reqs` (in batch order, each
    decoding, `num_computed_tokens + 1 == num_tokens`, none reaching `max_model_len`; `base`
    their computed and output tokens) computes one token a step, as `k` single steps' calls of
    `kv.allocate_slots(r, 1)` make them. The requests' counts are read, not changed, except
    `num_output_tokens`, which the caller sets after (it is moved to a call's step where a
    completed block's hash is drawn). Raises RuntimeError if the pool runs short (the caller's
    plan counted the blocks)."""
    fit = kv.num_tokens_fit
    bs = kv.block_size
    caching = kv.enable_caching
    req_blocks = kv.req_blocks
    num_cached = kv.num_cached_block
    # (step, position in the batch, block index) of each block to allocate and of each block to
    # cache, steps counted from 1; by position, the block table and the number of keys of each
    # request with a call in the run.
    allocs: list[tuple[int, int, int]] = []
    completed: list[tuple[int, int, int]] = []
    tables: list[BlockTable | None] = [None] * len(reqs)
    num_keys: list[int] = [0] * len(reqs)
    for i, (r, (c0, _)) in enumerate(zip(reqs, base)):
        rid = r.request_id
        if fit[rid] - c0 >= k:          # no call within the run
            continue
        held = tables[i] = req_blocks[rid]
        end = c0 + k                    # computed tokens after the run
        num_held = len(held)
        num_needed = -(-end // bs)
        for m in range(num_held, num_needed):
            j = m * bs - c0 + 1
            allocs.append((j if j > 1 else 1, i, m))
        if num_needed < num_held:
            num_needed = num_held
        f = num_needed * bs
        if caching:
            start = num_cached[rid]
            num_full = end // bs
            for m in range(start, num_full):
                j = (m + 1) * bs - c0
                completed.append((j if j > 1 else 1, i, m))
            if num_full > start:
                num_cached[rid] = start = num_full
                num_keys[i] = len(r.block_keys)
            if f > (start + 1) * bs - 1:
                f = (start + 1) * bs - 1
        fit[rid] = f
    pool = kv.pool
    if allocs:
        if len(allocs) > pool.num_free:
            raise RuntimeError(f"a quiet run found {pool.num_free} free blocks for "
                               f"{len(allocs)} (the plan counted enough)")
        allocs.sort()
        for (_, i, _), b in zip(allocs, pool.allocate(len(allocs))):
            tables[i].append(b)
    if completed:
        completed.sort()
        space = kv.space
        # A completed block's hash is drawn at its step's call unless drawn before: a keyed one
        # chained, one past its request's keys a fresh id.
        blocks = []
        hashes_of = []
        for j, i, m in completed:
            r = reqs[i]
            if m < r.num_hashes:
                h = r.block_hashes.item(m)
            elif m < num_keys[i]:
                r.num_output_tokens = base[i][1] + j - 1
                h = r.ensure_block_hashes(space, bs).item(m)
            else:
                h = r.draw_fresh(space)
            blocks.append(tables[i].at(m))
            hashes_of.append(h)
        if len(blocks) == 1:
            pool.cache(blocks[0], hashes_of[0])
        else:
            pool.cache_many(blocks, hashes_of)
