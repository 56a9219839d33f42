"""vLLM V1's paged KV-cache manager: a block pool with an LRU free queue and a prefix cache of full
blocks, for one KV-cache group (the hybrid manager of full-attention and sliding-window groups
sharing the pool is `simcore.engine.hybrid_kv`)."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from simcore.engine.block_table import BlockTable
from simcore.engine.request import BlockHashSpace, Request


class BlockPool:
    """`num_blocks` fixed-size KV blocks; block 0 is the reserved null block, never handed out.

    Invariants: a block is in the free queue iff its ref count is 0; a block with a hash is in
    `cached` under that hash; `num_free + sum(blocks held) == num_blocks - 1` (a block shared by k
    requests counts once). The free queue is ordered for eviction: allocation pops the head,
    evicting the popped block's hash; freeing appends hashed blocks at the tail (least recently
    used go first) and, in vLLM 0.33, puts unhashed blocks at the head (they hold nothing reusable).

    The queue is kept in three parts, head first: `front` (freed unhashed blocks, the latest
    freed first), the blocks never handed out (`fresh` to `num_blocks - 1`, in order, held as a
    range rather than one entry each, so an idle engine's pool costs nothing per block), and
    `free` (freed hashed blocks, least recently used first). `free_queue()` lists it whole.
    """

    __slots__ = ("num_blocks", "ref_cnt", "block_hash", "front", "fresh", "free", "cached",
                 "enable_caching", "num_evictions")

    def __init__(self, num_blocks: int, enable_caching: bool) -> None:
        if num_blocks < 2:
            raise ValueError("num_blocks must be at least 2 (block 0 is the null block)")
        self.num_blocks = num_blocks
        self.ref_cnt = [0] * num_blocks
        self.block_hash: list[int] = [0] * num_blocks     # 0 = no hash
        self.front: OrderedDict[int, None] = OrderedDict()
        self.fresh = 1
        self.free: OrderedDict[int, None] = OrderedDict()
        self.ref_cnt[0] = 1                                # the null block is never free
        self.cached: dict[int, list[int]] = {}            # hash -> block ids, first inserted first
        self.enable_caching = enable_caching
        self.num_evictions = 0

    @property
    def num_free(self) -> int:
        return len(self.front) + self.num_blocks - self.fresh + len(self.free)

    def free_queue(self) -> list[int]:
        """The free blocks in eviction order (the next allocation's first)."""
        return [*self.front, *range(self.fresh, self.num_blocks), *self.free]

    def is_free(self, b: int) -> bool:
        return b >= self.fresh or b in self.front or b in self.free

    def get_cached(self, h: int) -> int:
        """A block holding content hash `h`, or 0 if none is cached."""
        blocks = self.cached.get(h)
        if blocks:
            return blocks[0]
        return 0

    def longest_cached(self, hashes) -> list[int]:
        """The first block cached under each of `hashes` (a list, or an int64 array), from the
        first up to the first hash not cached."""
        if isinstance(hashes, np.ndarray):
            hashes = hashes.tolist()
        get = self.cached.get
        hit = []
        append = hit.append
        for h in hashes:
            blocks = get(h)
            if not blocks:
                break
            append(blocks[0])
        return hit

    def num_evictable(self, blocks: list[int]) -> int:
        """How many of `blocks` no request holds (a hit on them takes a block from the free
        queue)."""
        ref = self.ref_cnt
        return sum(1 for b in blocks if ref[b] == 0)

    def allocate(self, n: int) -> list[int]:
        """Pop `n` blocks from the head of the free queue (caller checked there are enough)."""
        ref = self.ref_cnt
        hashes = self.block_hash
        cached = self.cached
        front = self.front
        k = len(front)
        if k >= n:
            popitem = front.popitem
            out = [popitem(False)[0] for _ in range(n)]
        else:
            out = [front.popitem(False)[0] for _ in range(k)] if k else []
            fresh = self.fresh
            take = min(n - k, self.num_blocks - fresh)
            if take:
                out.extend(range(fresh, fresh + take))
                self.fresh = fresh + take
            if n - k - take:
                popitem = self.free.popitem
                out.extend([popitem(False)[0] for _ in range(n - k - take)])
        num_evicted = 0
        for b in out:
            ref[b] = 1
            h = hashes[b]
            if h:               # evict the popped block's content from the prefix cache
                blocks = cached.pop(h)
                if len(blocks) > 1:     # other blocks still hold h (the order of `cached`
                    blocks.remove(b)    # itself means nothing)
                    cached[h] = blocks
                hashes[b] = 0
                num_evicted += 1
        self.num_evictions += num_evicted
        return out

    def touch(self, blocks: list[int]) -> None:
        """Take a reference on prefix-hit blocks, pulling free ones out of the free queue."""
        ref = self.ref_cnt
        free = self.free
        for b in blocks:
            if ref[b] == 0:
                # A hit block holds a hash, so it was freed to the tail (never fresh).
                if b in free:
                    del free[b]
                else:
                    del self.front[b]
            ref[b] += 1

    def take(self, n: int) -> list[int]:
        """`allocate` (the compiled pool gives an array here, which its `cache_many` takes)."""
        return self.allocate(n)

    def cache(self, b: int, h: int) -> None:
        """Record that block `b` now holds the full block of content hash `h`."""
        h = int(h)
        self.block_hash[b] = h
        blocks = self.cached.get(h)
        if blocks is None:
            self.cached[h] = [b]
        else:
            blocks.append(b)

    def cache_many(self, blocks: list[int], hashes) -> None:
        """`cache(b, h)` for each pair of `blocks` and `hashes` (a list, or an int64 array), in
        order."""
        if isinstance(hashes, np.ndarray):
            hashes = hashes.tolist()
        if isinstance(blocks, np.ndarray):
            blocks = blocks.tolist()
        block_hash = self.block_hash
        cached = self.cached
        for b, h in zip(blocks, hashes):
            block_hash[b] = h
            entry = cached.get(h)
            if entry is None:
                cached[h] = [b]
            else:
                entry.append(b)

    def release(self, blocks: list[int]) -> None:
        """Drop one reference on each block, walking the request's blocks from last to first."""
        if isinstance(blocks, np.ndarray):
            blocks = blocks.tolist()
        ref = self.ref_cnt
        free = self.free
        front = self.front
        hashes = self.block_hash
        for b in reversed(blocks):
            r = ref[b] - 1
            ref[b] = r
            if r == 0:
                if hashes[b]:
                    free[b] = None
                else:
                    front[b] = None
                    front.move_to_end(b, last=False)


class KVCacheManager:
    """Per-request block tables over one BlockPool, with vLLM's prefix-cache lookup and allocation.

    `allocate_slots` either gives a request every block its next tokens need (and caches the full
    blocks among them at once, so a request admitted later in the same step can hit them) or
    changes nothing and returns False.
    """

    __slots__ = ("pool", "block_size", "enable_caching", "space", "req_blocks", "num_cached_block",
                 "num_tokens_fit", "max_model_len", "num_hit_queries", "num_hit_blocks",
                 "use_eagle")

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool, max_model_len: int,
                 space: BlockHashSpace | None = None, array_pool: bool = False) -> None:
        if array_pool:      # the same pool, compiled (`simcore.engine.array_pool`)
            from simcore.engine.array_pool import ArrayBlockPool
            self.pool = ArrayBlockPool(num_blocks, enable_caching)
        else:
            self.pool = BlockPool(num_blocks, enable_caching)
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.space = space if space is not None else BlockHashSpace()
        self.req_blocks: dict[str, BlockTable] = {}
        self.num_cached_block: dict[str, int] = {}
        # Per request with blocks: the most tokens (computed + new) it may reach with no block
        # allocated and no block completed, i.e. while `allocate_slots` would change nothing.
        # Running requests stay within it on most steps, so the scheduler skips the call then.
        self.num_tokens_fit: dict[str, int] = {}
        self.max_model_len = max_model_len
        self.num_hit_queries = 0
        self.num_hit_blocks = 0
        # Speculative decoding with an EAGLE-family drafter (vLLM's use_eagle): a prefix hit
        # gives back its last block, whose hidden states the drafter needs recomputed.
        self.use_eagle = False

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    @property
    def usage(self) -> float:
        """Fraction of usable blocks referenced by some request (vLLM's kv_cache_usage)."""
        return self.usage_with(self.pool.num_free)

    def usage_with(self, num_free: int) -> float:
        """`usage` were `num_free` blocks free."""
        return 1.0 - num_free / (self.pool.num_blocks - 1)

    def get_computed_blocks(self, req: Request) -> list[int]:
        """Longest run of cached full blocks from block 0, never covering the request's last token;
        none for a request that skips reading the prefix cache (vLLM's
        `KVCacheManager.prefix_cache_lookup_enabled`)."""
        if not self.enable_caching or req.skip_reading_prefix_cache:
            return []
        bs = self.block_size
        hashes = req.ensure_block_hashes(self.space, bs)
        max_blocks = (req.prompt_len + req.num_output_tokens - 1) // bs
        hit = self.pool.longest_cached(hashes[:max_blocks])
        if self.use_eagle and hit:
            hit.pop()
        self.num_hit_queries += 1
        self.num_hit_blocks += len(hit)
        return hit

    def allocate_slots(self, req: Request, num_new_tokens: int, new_computed_blocks: list[int] | None = None,
                       full_sequence_must_fit: bool = False, reserved_blocks: int = 0,
                       num_lookahead_tokens: int = 0) -> bool:
        """Give `req` blocks for its computed tokens plus `num_new_tokens`, or return False.

        `new_computed_blocks` are prefix hits found by `get_computed_blocks` for a request being
        admitted. With `full_sequence_must_fit`, admission also requires that the request's whole
        current sequence would fit (vLLM's `scheduler_reserve_full_isl`). `reserved_blocks` must
        stay free after either check (the scheduler's watermark). `num_lookahead_tokens` more
        slots are allocated past the new tokens but neither computed nor cached (speculative
        decoding's drafts). As vLLM's `KVCacheManager.allocate_slots`.
        """
        if self._unchanged(req, num_new_tokens + num_lookahead_tokens, new_computed_blocks,
                           full_sequence_must_fit, reserved_blocks):
            return True
        rid = req.request_id
        bs = self.block_size
        held = self.req_blocks.get(rid)
        num_held = len(held) if held is not None else 0
        pool = self.pool
        num_hit = 0
        num_evictable_hit = 0
        if new_computed_blocks:
            num_hit = len(new_computed_blocks)
            num_evictable_hit = pool.num_evictable(new_computed_blocks)
        num_computed = req.num_computed_tokens + num_hit * bs
        num_tokens_need = num_computed + num_new_tokens + num_lookahead_tokens
        if num_tokens_need > self.max_model_len:
            num_tokens_need = self.max_model_len
        num_required = -(-num_tokens_need // bs)
        num_new_blocks = num_required - num_hit - num_held
        if num_new_blocks < 0:
            num_new_blocks = 0
        num_free = pool.num_free - reserved_blocks
        num_tokens = req.prompt_len + req.num_output_tokens
        if full_sequence_must_fit:
            full = num_tokens if num_tokens < self.max_model_len else self.max_model_len
            need_full = -(-full // bs) - num_hit - num_held
            if need_full < 0:
                need_full = 0
            if need_full + num_evictable_hit > num_free:
                return False
        if num_new_blocks + num_evictable_hit > num_free:
            return False
        if held is None:
            # Room for every block its whole sequence may need, so that the table never grows.
            full = req.prompt_len + req.max_tokens
            held = self.req_blocks[rid] = BlockTable(
                -(-(full if full < self.max_model_len else self.max_model_len) // bs))
            self.num_cached_block[rid] = 0
        if new_computed_blocks:
            pool.touch(new_computed_blocks)
            held.extend(new_computed_blocks)
            self.num_cached_block[rid] = num_hit
        if num_new_blocks:
            held.extend(pool.take(num_new_blocks))
        fit = len(held) * bs
        if self.enable_caching:
            start, n_full = self._uncached(rid, num_computed + num_new_tokens, num_tokens)
            if n_full > start:
                hashes = req.ensure_block_hashes(self.space, bs)
                if n_full - start == 1:
                    pool.cache(held[start], hashes.item(start))
                else:
                    pool.cache_many(held[start:n_full], hashes[start:n_full])
                self.num_cached_block[rid] = start = n_full
            # Completing block `start`, the first uncached one, takes (start + 1) * bs tokens.
            if fit > (start + 1) * bs - 1:
                fit = (start + 1) * bs - 1
        self.num_tokens_fit[rid] = fit
        return True

    def _unchanged(self, req: Request, num_tokens: int, new_computed_blocks,
                   full_sequence_must_fit: bool, reserved_blocks: int) -> bool:
        """Whether `allocate_slots` would change nothing and succeed: `num_tokens` more tokens
        (lookahead slots included) stay within what the request's blocks hold
        (`num_tokens_fit`), with no prefix hit, no whole-sequence check and no watermark."""
        return (req.num_computed_tokens + num_tokens <= self.num_tokens_fit.get(req.request_id, -1)
                and not new_computed_blocks and not full_sequence_must_fit
                and not reserved_blocks)

    def _uncached(self, rid: str, tokens: int, num_tokens: int) -> tuple[int, int]:
        """(request `rid`'s first uncached block, its full blocks once `tokens` are computed, at
        most its `num_tokens`)."""
        return (self.num_cached_block[rid],
                (tokens if tokens < num_tokens else num_tokens) // self.block_size)

    def free(self, req: Request) -> None:
        """Release every block of `req` (finished or preempted)."""
        blocks = self.req_blocks.pop(req.request_id, None)
        self.num_cached_block.pop(req.request_id, None)
        self.num_tokens_fit.pop(req.request_id, None)
        if blocks:
            self.pool.release(blocks.array)

    def num_blocks_held(self, req: Request) -> int:
        blocks = self.req_blocks.get(req.request_id)
        return len(blocks) if blocks else 0
