"""An external KV tier (CPU memory or storage shared by engines) and the connector that loads from it."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from simcore.engine.request import BlockHashSpace, Request


class ExternalKVTier:
    """A store of KV blocks keyed by content hash, evicting the least recently used block.

    Keys are the ints of `Request.block_hashes` from one `BlockHashSpace`, so every engine that
    shares the space can share the tier. A block is useful only together with every block before
    it in its chain, so a chain is touched and stored last block first: its first blocks become
    the most recent and are evicted last (vLLM's `LRUOffloadingManager.touch` order). Invariant:
    `len(self) <= capacity_blocks`.
    """

    __slots__ = ("capacity_blocks", "_blocks", "num_lookups", "num_hit_blocks",
                 "num_stored_blocks", "num_evicted_blocks")

    def __init__(self, capacity_blocks: int) -> None:
        if capacity_blocks < 0:
            raise ValueError("capacity_blocks must be >= 0")
        self.capacity_blocks = capacity_blocks
        self._blocks: OrderedDict[int, None] = OrderedDict()    # least recently used first
        self.num_lookups = 0
        self.num_hit_blocks = 0
        self.num_stored_blocks = 0
        self.num_evicted_blocks = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._blocks

    def lookup(self, hashes: Sequence[int], start: int = 0, stop: int | None = None) -> int:
        """How many of `hashes[start:stop]`, from `start` on, are stored without a gap; touches them."""
        blocks = self._blocks
        end = len(hashes) if stop is None or stop > len(hashes) else stop
        i = start
        while i < end and hashes[i] in blocks:
            i += 1
        for j in range(i - 1, start - 1, -1):
            blocks.move_to_end(hashes[j])
        self.num_lookups += 1
        self.num_hit_blocks += i - start
        return i - start

    def store(self, hashes: Sequence[int]) -> int:
        """Store a chain's blocks (touching those already stored); returns how many were new.

        Only the first `capacity_blocks` of the chain are considered: the rest could not be held
        together with the blocks before them.
        """
        cap = self.capacity_blocks
        blocks = self._blocks
        num_new = 0
        num_evicted = 0
        for h in reversed(hashes[:cap]):
            if h in blocks:
                blocks.move_to_end(h)
                continue
            if len(blocks) >= cap:
                blocks.popitem(last=False)
                num_evicted += 1
            blocks[h] = None
            num_new += 1
        self.num_stored_blocks += num_new
        self.num_evicted_blocks += num_evicted
        return num_new


class TierConnector:
    """A KV connector that loads full blocks from an `ExternalKVTier` and saves finished requests
    into it (vLLM's offloading connectors, LMCache).

    External tokens are the tier's consecutive hits right after the local prefix-cache hit, in
    whole blocks, never reaching the request's last token; fewer than `min_external_blocks`
    blocks count as none. Loads are asynchronous unless `load_async` is False. A request's full
    blocks of computed KV (prompt and output) are stored when it finishes, not as they are
    computed: vLLM's offloading connector saves block by block, which differs only for a request
    that shares its prefix while it is still running or that is preempted. `loaded_tokens` keeps,
    per request, the tokens loaded over all its loads (bytes = tokens x KV bytes per token).
    `space` must be the scheduler's own `BlockHashSpace`.
    """

    __slots__ = ("tier", "block_size", "space", "min_external_blocks", "load_async",
                 "loaded_tokens", "num_loaded_tokens")

    def __init__(self, tier: ExternalKVTier, block_size: int, space: BlockHashSpace, *,
                 min_external_blocks: int = 1, load_async: bool = True) -> None:
        if min_external_blocks < 1:
            raise ValueError("min_external_blocks must be >= 1")
        self.tier = tier
        self.block_size = block_size
        self.space = space
        self.min_external_blocks = min_external_blocks
        self.load_async = load_async
        self.loaded_tokens: dict[str, int] = {}
        self.num_loaded_tokens = 0

    def get_num_new_matched_tokens(self, req: Request,
                                   num_local_computed_tokens: int) -> tuple[int, bool]:
        bs = self.block_size
        start = num_local_computed_tokens // bs
        stop = (req.prompt_len + req.num_output_tokens - 1) // bs
        if stop - start < self.min_external_blocks:
            return 0, False
        n = self.tier.lookup(req.ensure_block_hashes(self.space, bs)[:stop].tolist(), start, stop)
        if n < self.min_external_blocks:
            return 0, False
        return n * bs, self.load_async

    def update_state_after_alloc(self, req: Request, num_external_tokens: int) -> None:
        if num_external_tokens:
            rid = req.request_id
            self.loaded_tokens[rid] = self.loaded_tokens.get(rid, 0) + num_external_tokens
            self.num_loaded_tokens += num_external_tokens

    def request_finished(self, req: Request) -> None:
        bs = self.block_size
        num_full = req.num_computed_tokens // bs
        hashes = req.ensure_block_hashes(self.space, bs)
        self.tier.store(hashes[:num_full].tolist())
