"""vLLM V1's hybrid KV-cache manager: full-attention and sliding-window KV-cache groups sharing
one block pool (`simcore.engine.kv_cache`), with the sizing of a sliding-window group."""

from __future__ import annotations

from simcore.engine.kv_cache import KVCacheManager
from simcore.engine.request import BlockHashSpace, Request


def sliding_window_blocks(window: int, block_size: int, max_model_len: int,
                          max_num_batched_tokens: int) -> int:
    """Blocks a request holds at most in one sliding-window group (vLLM's
    `SlidingWindowSpec.max_admission_blocks_per_request`, which both sizes a request at start-up
    and caps its whole-sequence admission check): the `window - 1` computed tokens the next chunk
    attends to plus that chunk (at most `max_num_batched_tokens`), never more than
    `max_model_len` tokens, and one block more for a window that starts inside a block."""
    tokens = min(window - 1 + max_num_batched_tokens, max_model_len)
    return -(-tokens // block_size) + 1


GROUP_KEY_BITS = 8
"""A hybrid pool caches group g's block of content hash h under `h << GROUP_KEY_BITS | g` (vLLM
keys its prefix cache by block hash and KV-cache group id); up to 2**8 groups."""


class GroupHits(list):
    """A prefix-cache hit in a hybrid pool: a list of the first group's hit blocks (its length is
    the hit in blocks, all the scheduler reads) carrying every group's hit blocks in `groups`; a
    sliding-window group's list has null blocks (0) where its window does not reach."""

    __slots__ = ("groups",)

    def __init__(self, groups: tuple[list[int], ...]) -> None:
        super().__init__(groups[0])
        self.groups = groups


class HybridKVCacheManager(KVCacheManager):
    """vLLM's hybrid KV-cache manager (`vllm/v1/core/kv_cache_coordinator.py`'s
    `HybridKVCacheCoordinator` over `single_type_kv_cache_manager.py`'s `FullAttentionManager` and
    `SlidingWindowManager`): KV-cache groups (`windows`, 0 for full attention) with a block table
    each over one BlockPool, a request holding a block of every group for each `block_size` tokens.

    Rules, as vLLM's:
    - allocation: every group gets ceil(tokens / block_size) block-table entries; before counting,
      a sliding-window group frees the blocks whose tokens no later query attends to (the first
      (computed - window + 1) // block_size, `remove_skipped_blocks`) and puts the null block (0)
      in their place, so it holds only about window / block_size + 1 real blocks;
    - whole-sequence admission (`full_sequence_must_fit`): each sliding-window group's need is
      capped at `sliding_window_blocks`;
    - prefix hits: the full-attention groups' longest run of cached blocks from the start, then
      within it the sliding-window groups' longest prefix that ends with ceil((window - 1) /
      block_size) cached blocks in a row (searched from the right), or, failing that, their run of
      cached blocks from the start; the hit is the shorter, its sliding-window blocks before the
      window null (`find_longest_cache_hit` of both managers, one pass for one full and one other
      attention kind). Blocks of every group are cached under their group's key.

    Invariants: the per-group lists of a request have the same length; a sliding-window group's
    null blocks form a prefix of its list (`num_null`); the pool's invariants hold with the null
    block never released. Only one sliding-window size is modelled, and no KV connector.
    """

    __slots__ = ("windows", "full_groups", "sliding_groups", "window", "num_contiguous",
                 "admission_cap", "num_null")

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool, max_model_len: int,
                 windows: tuple[int, ...], max_num_batched_tokens: int,
                 space: BlockHashSpace | None = None) -> None:
        sizes = {w for w in windows if w}
        if len(sizes) != 1:
            raise ValueError(f"a hybrid KV cache needs one sliding-window size, got {windows}")
        if len(windows) > 1 << GROUP_KEY_BITS:
            raise ValueError(f"at most {1 << GROUP_KEY_BITS} KV-cache groups, got {len(windows)}")
        super().__init__(num_blocks, block_size, enable_caching, max_model_len, space)
        self.windows = tuple(windows)
        self.full_groups = tuple(g for g, w in enumerate(windows) if not w)
        self.sliding_groups = tuple(g for g, w in enumerate(windows) if w)
        self.window = w = sizes.pop()
        self.num_contiguous = -(-(w - 1) // block_size)
        self.admission_cap = sliding_window_blocks(w, block_size, max_model_len,
                                                   max_num_batched_tokens)
        self.num_null: dict[str, int] = {}

    def get_computed_blocks(self, req: Request) -> list[int]:
        """Every group's prefix hit (a GroupHits; [] for none), never covering the request's last
        token; none for a request that skips reading the prefix cache. (`use_eagle` is not
        applied here: the hit keeps its last block.)"""
        if not self.enable_caching or req.skip_reading_prefix_cache:
            return []
        bs = self.block_size
        n = (req.prompt_len + req.num_output_tokens - 1) // bs
        hashes = req.ensure_block_hashes(self.space, bs)[:n].tolist()
        get = self.pool.cached.get
        lists: list[list[int]] = [[] for _ in self.windows]
        if self.full_groups:
            full = [(g, lists[g]) for g in self.full_groups]
            n_full = 0
            for h in hashes:
                key = h << GROUP_KEY_BITS
                found = [get(key | g) for g, _ in full]
                if not all(found):
                    break
                for (_, out), blocks in zip(full, found):
                    out.append(blocks[0])
                n_full += 1
            n = n_full
        sliding = [(g, lists[g]) for g in self.sliding_groups]
        for _, out in sliding:
            out.extend([0] * n)
        run = 0
        for i in range(n - 1, -1, -1):
            key = hashes[i] << GROUP_KEY_BITS
            found = [get(key | g) for g, _ in sliding]
            if not all(found):
                run = 0
                continue
            for (_, out), blocks in zip(sliding, found):
                out[i] = blocks[0]
            run += 1
            if run >= self.num_contiguous:
                n = i + run
                break
        else:
            n = run         # the cached run from the start, shorter than a window
        for out in lists:
            del out[n:]
        self.num_hit_queries += 1
        self.num_hit_blocks += n
        return GroupHits(tuple(lists)) if n else []

    def _skipped_blocks(self, num_computed: int) -> int:
        """Blocks of a sliding-window group no query after `num_computed` tokens attends to."""
        skipped = num_computed - self.window + 1
        return skipped // self.block_size if skipped > 0 else 0

    def _remove_skipped(self, rid: str, held: list[list[int]], num_computed: int) -> None:
        """Free the sliding-window groups' blocks that fell out of the window (vLLM's
        `remove_skipped_blocks`: from the last such block back to the first already freed)."""
        first = self.num_null[rid]
        skipped = self._skipped_blocks(num_computed)
        if skipped <= first:
            return
        release = self.pool.release
        for g in self.sliding_groups:
            blocks = held[g]
            stop = skipped if skipped < len(blocks) else len(blocks)
            freed = blocks[first:stop]
            blocks[first:stop] = [0] * len(freed)
            release(freed)
        self.num_null[rid] = first + len(freed)

    def allocate_slots(self, req: Request, num_new_tokens: int, new_computed_blocks: list[int] | None = None,
                       full_sequence_must_fit: bool = False, reserved_blocks: int = 0,
                       num_lookahead_tokens: int = 0) -> bool:
        """As `KVCacheManager.allocate_slots`, for every group: each needs the same new
        block-table entries, a sliding-window group first freeing what left its window."""
        if self._unchanged(req, num_new_tokens + num_lookahead_tokens, new_computed_blocks,
                           full_sequence_must_fit, reserved_blocks):
            return True
        rid = req.request_id
        bs = self.block_size
        pool = self.pool
        max_len = self.max_model_len
        held = self.req_blocks.get(rid)
        hits: tuple[list[int], ...] = ()
        num_hit = 0
        if new_computed_blocks:
            hits = new_computed_blocks.groups
            num_hit = len(new_computed_blocks)
        num_computed = req.num_computed_tokens + num_hit * bs
        if held is not None:    # vLLM frees these even when the allocation then fails
            self._remove_skipped(rid, held, num_computed if num_computed < max_len else max_len)
        num_held = len(held[0]) if held is not None else 0
        ref = pool.ref_cnt
        num_evictable_hit = sum(1 for blocks in hits for b in blocks if b and ref[b] == 0)
        num_tokens_need = num_computed + num_new_tokens + num_lookahead_tokens
        if num_tokens_need > max_len:
            num_tokens_need = max_len
        num_new_blocks = -(-num_tokens_need // bs) - num_hit - num_held
        if num_new_blocks < 0:
            num_new_blocks = 0
        num_free = pool.num_free - reserved_blocks
        num_tokens = req.prompt_len + req.num_output_tokens
        if full_sequence_must_fit:
            full = -(-(num_tokens if num_tokens < max_len else max_len) // bs)
            windowed = full if full < self.admission_cap else self.admission_cap
            need = (len(self.full_groups) * max(full - num_hit - num_held, 0)
                    + len(self.sliding_groups) * max(windowed - num_hit - num_held, 0))
            if need + num_evictable_hit > num_free:
                return False
        if num_new_blocks * len(self.windows) + num_evictable_hit > num_free:
            return False
        if held is None:
            held = self.req_blocks[rid] = [[] for _ in self.windows]
            self.num_cached_block[rid] = 0
            self.num_null[rid] = 0
        if hits:
            skipped = self._skipped_blocks(num_computed)
            for g, blocks in enumerate(hits):
                skip = skipped if self.windows[g] else 0
                kept = [b for b in blocks[skip:] if b]
                pool.touch(kept)
                held[g].extend([0] * skip)
                held[g].extend(blocks[skip:])
            self.num_cached_block[rid] = num_hit
            self.num_null[rid] = skipped
        if num_new_blocks:
            for blocks in held:
                blocks.extend(pool.allocate(num_new_blocks))
        fit = len(held[0]) * bs
        if self.enable_caching:
            start, n_full = self._uncached(rid, num_computed + num_new_tokens, num_tokens)
            if n_full > start:
                hashes = req.ensure_block_hashes(self.space, bs)[start:n_full].tolist()
                for g, blocks in enumerate(held):
                    pairs = [(b, h << GROUP_KEY_BITS | g)
                             for b, h in zip(blocks[start:n_full], hashes) if b]
                    if pairs:
                        pool.cache_many([b for b, _ in pairs], [k for _, k in pairs])
                self.num_cached_block[rid] = start = n_full
            if fit > (start + 1) * bs - 1:
                fit = (start + 1) * bs - 1
        # The next block to leave the window goes when the computed tokens reach this.
        window_fit = (self.num_null[rid] + 1) * bs + self.window - 1
        self.num_tokens_fit[rid] = fit if fit < window_fit else window_fit
        return True

    def free(self, req: Request) -> None:
        """Release every block of `req`, group by group, each from its last block to its first."""
        rid = req.request_id
        groups = self.req_blocks.pop(rid, None)
        self.num_cached_block.pop(rid, None)
        self.num_tokens_fit.pop(rid, None)
        self.num_null.pop(rid, None)
        if groups:
            release = self.pool.release
            for blocks in groups:
                release([b for b in blocks if b])

    def num_blocks_held(self, req: Request) -> int:
        groups = self.req_blocks.get(req.request_id)
        return sum(1 for blocks in groups for b in blocks if b) if groups else 0
