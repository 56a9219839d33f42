"""Where KV caches move between engines over the fabric: the prefill-to-decode handoff of P/D
disaggregation and fetches from an external KV tier on storage servers.

Both are vLLM KV-connector loads: the receiving scheduler allocates blocks and parks the request
in WAITING_FOR_REMOTE_KVS; here its bytes move (every GPU of the receiving engine gets its own
shard: its pipeline stage's layers and its TP rank's KV heads) over the fabric, or over NVLink
between GPUs of one node (NIXL's UCX picks CUDA IPC there), and when the last byte lands the
scheduler is told (`finish_remote_load`) and the engine woken.

When prefill and decode instances have different TP sizes, each decode GPU reads, from the
prefill GPUs of its pipeline stage, the KV heads it holds (`shard_plan`): with H KV heads, TP
rank r of t holds heads [r H/t, (r+1) H/t) for t <= H, and head r H/t (replicated) for t > H;
a head held by several prefill ranks is read from one of them, decode rank r taking holder
r mod (number of holders) so that the reads spread over the replicas. An MLA latent cache is
whole on every rank: decode rank r reads it from prefill rank r mod prefill TP. So a decode
instance of TP 8 behind prefill instances of TP 4 (8 KV heads) has ranks 2q and 2q+1 read
one head each from prefill rank q, and one of TP 4 behind TP 8 has rank r read two heads, one
from each of prefill ranks 2r and 2r+1.
"""

from __future__ import annotations

from collections.abc import Callable

from simcore.cluster.placement import DECODE, PREFILL, Placement
from simcore.cluster.runtime import ClusterRuntime
from simcore.dag.builder import stage_layers
from simcore.engine.connector import DisaggDecodeConnector, DisaggPrefillConnector
from simcore.engine.kv_tier import ExternalKVTier, TierConnector
from simcore.engine.request import WAITING_FOR_REMOTE_KVS, BlockHashSpace, Request
from simcore.model.arch import ModelArch


class KvPaths:
    """KV-cache moves of one cluster run.

    Lifecycle: built with the runtime; `connector(i, space)` gives engine i's KV connector (or
    None); the serving loop calls `prefill_done(...)` when a prefill instance finishes a prompt
    and `start_loads(...)` with each step's `kv_loads`. Invariant: a request waiting for remote
    KV has exactly one transfer group in flight.
    """

    def __init__(self, runtime: ClusterRuntime, *, arch: ModelArch, kv_cache_dtype: str,
                 block_size: int, tier_capacity_tokens: int | None = None,
                 min_fetch_blocks: int = 1, draft_arch: ModelArch | None = None) -> None:
        self.runtime = runtime
        self.placement: Placement = runtime.placement
        self.block_size = block_size
        tp = self.placement.tp
        # KV bytes per token held by one GPU of each pipeline stage.
        self.stage_bytes_per_token = [arch.kv_bytes_per_token(kv_cache_dtype, tp, len(layers))
                                      for layers in stage_layers(arch.num_layers,
                                                                 self.placement.pp)]
        # A speculative-decoding drafter's KV layers (`draft_arch`) share the target's blocks
        # and move with them; the drafter runs beside the last stage.
        self.draft_arch = draft_arch
        if draft_arch is not None:
            self.stage_bytes_per_token[-1] += draft_arch.kv_bytes_per_token(
                kv_cache_dtype, tp, draft_arch.num_layers)
        self.tier = (ExternalKVTier(max(1, tier_capacity_tokens // block_size))
                     if tier_capacity_tokens else None)
        self.min_fetch_blocks = min_fetch_blocks
        self.arch = arch
        self.kv_cache_dtype = kv_cache_dtype
        self._plans: dict[tuple[int, int], list[list[tuple[int, int, float]]]] = {}
        self.prefilled_on: dict[str, int] = {}     # request id -> prefill instance
        self._release: dict[str, Callable[[], None]] = {}   # request id -> free prefill blocks
        self._next_decode = 0

    # -- roles ---------------------------------------------------------------------------------

    @property
    def disaggregated(self) -> bool:
        return bool(self.placement.instances_of(PREFILL))

    def prefill_instances(self) -> list[int]:
        return [i.index for i in self.placement.instances_of(PREFILL)]

    def connector(self, index: int, space: BlockHashSpace):
        """Engine `index`'s KV connector: the decode side of P/D, the tier's, or None."""
        role = self.placement.instances[index].role
        if role == DECODE:
            return DisaggDecodeConnector(self.block_size)
        if role == PREFILL:
            return DisaggPrefillConnector()
        if self.tier is not None and role != PREFILL:
            return TierConnector(self.tier, self.block_size, space,
                                 min_external_blocks=self.min_fetch_blocks)
        return None

    def pick_decode(self) -> int:
        """The decode instance for the next handed-off request (in turn)."""
        decode = self.placement.instances_of(DECODE)
        inst = decode[self._next_decode % len(decode)]
        self._next_decode += 1
        return inst.index

    def prefill_done(self, req: Request, prefill_index: int,
                     release: Callable[[], None]) -> None:
        """Remember where a prompt's KV lives until its decode instance loads it; `release()`
        frees its blocks there once it has been read (or is not needed)."""
        self.prefilled_on[req.request_id] = prefill_index
        self._release[req.request_id] = release

    def release(self, request_id: str) -> None:
        """The decode side no longer needs the prefill instance's copy of this request's KV."""
        fn = self._release.pop(request_id, None)
        self.prefilled_on.pop(request_id, None)
        if fn is not None:
            fn()

    # -- transfers -----------------------------------------------------------------------------

    def start_loads(self, index: int, loads, on_loaded: Callable[[Request], None]) -> None:
        """Start the transfers of a step's asynchronous loads into engine `index`;
        `on_loaded(req)` runs on the clock when each request's KV has arrived."""
        net = self.runtime.network
        node_of = self.placement.node_of
        dst = self.placement.instances[index]
        for req, num_tokens in loads:
            if req.status != WAITING_FOR_REMOTE_KVS:
                continue                              # a synchronous load: nothing to move
            src_index = self.prefilled_on.get(req.request_id)
            pairs = []
            local = []
            if src_index is not None:
                src_inst = self.placement.instances[src_index]
                if len(src_inst.gpus[0]) != len(dst.gpus[0]):
                    self._resharded(src_inst, dst, num_tokens, pairs, local)
                    self.runtime.transfer_kv(pairs, lambda req=req, t0=self.runtime.env.now:
                                             self._loaded(req, t0, on_loaded),
                                             nvlink_bytes=tuple(local))
                    continue
            for s, stage in enumerate(dst.gpus):
                size = int(num_tokens * self.stage_bytes_per_token[s])
                for r, gpu in enumerate(stage):
                    if src_index is not None:
                        src_gpu = self.placement.instances[src_index].gpus[s][r]
                        if node_of(src_gpu) == node_of(gpu):
                            local.append(size)
                            continue
                        src = net.host_of(src_gpu)
                    else:
                        storage = net.storage_hosts
                        src = storage[req.index % len(storage)]
                    pairs.append((src, net.host_of(gpu), size))
            self.runtime.transfer_kv(pairs, lambda req=req, t0=self.runtime.env.now:
                                     self._loaded(req, t0, on_loaded),
                                     nvlink_bytes=tuple(local))

    def _resharded(self, src, dst, num_tokens: int, pairs: list, local: list) -> None:
        """The transfers of one handoff between instances of different TP (`shard_plan`),
        appended to `pairs` (fabric) and `local` (NVLink bytes)."""
        net = self.runtime.network
        node_of = self.placement.node_of
        key = (len(src.gpus[0]), len(dst.gpus[0]))
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = [
                shard_plan(self.arch, self.kv_cache_dtype, len(layers), *key)
                for layers in stage_layers(self.arch.num_layers, self.placement.pp)]
            d = self.draft_arch
            if d is not None:
                # The drafter's heads are read as the target's are; one read per GPU pair.
                both: dict[tuple[int, int], float] = {}
                for q, r, b in plan[-1] + shard_plan(d, self.kv_cache_dtype, d.num_layers,
                                                     *key):
                    both[q, r] = both.get((q, r), 0.0) + b
                plan[-1] = [(q, r, b) for (q, r), b in both.items()]
        for s, stage in enumerate(dst.gpus):
            for q, r, bytes_per_token in plan[s]:
                size = int(num_tokens * bytes_per_token)
                src_gpu, gpu = src.gpus[s][q], stage[r]
                if node_of(src_gpu) == node_of(gpu):
                    local.append(size)
                else:
                    pairs.append((net.host_of(src_gpu), net.host_of(gpu), size))

    def _loaded(self, req: Request, start_s: float, on_loaded: Callable[[Request], None]) -> None:
        """The request waited on the network for its KV: that is network time of its latency."""
        rec = req.client
        if rec is not None:
            rec.network_s += self.runtime.env.now - start_s
        self.release(req.request_id)
        on_loaded(req)



def kv_heads_of_rank(num_heads: int, tp: int, rank: int) -> range:
    """The KV heads (of `num_heads`) that TP rank `rank` of `tp` holds, as vLLM shards them:
    a contiguous share for tp <= num_heads, one replicated head for tp > num_heads."""
    if tp <= num_heads:
        per = num_heads // tp
        return range(rank * per, (rank + 1) * per)
    head = rank * num_heads // tp
    return range(head, head + 1)


def shard_plan(arch: ModelArch, kv_cache_dtype: str, num_layers: int, src_tp: int,
               dst_tp: int) -> list[tuple[int, int, float]]:
    """(source TP rank, destination TP rank, bytes per token) of every read that moves
    `num_layers` layers of one token's KV cache from an instance of TP `src_tp` to one of TP
    `dst_tp` (see the module's description); the reads of one pair of ranks are one transfer."""
    heads = 1 if arch.is_mla else arch.num_kv_heads      # an MLA latent: one shard, everywhere
    per_head = arch.kv_bytes_per_token(kv_cache_dtype, 1, num_layers) / heads
    holders: dict[int, list[int]] = {}
    for q in range(src_tp):
        for h in (range(1) if arch.is_mla else kv_heads_of_rank(heads, src_tp, q)):
            holders.setdefault(h, []).append(q)
    reads: dict[tuple[int, int], float] = {}
    for r in range(dst_tp):
        for h in (range(1) if arch.is_mla else kv_heads_of_rank(heads, dst_tp, r)):
            who = holders[h]
            q = who[r % len(who)]
            reads[q, r] = reads.get((q, r), 0.0) + per_head
    return [(q, r, b) for (q, r), b in sorted(reads.items(), key=lambda kv: (kv[0][1], kv[0][0]))]
