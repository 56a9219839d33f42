"""Where KV caches move between engines over the fabric: the prefill-to-decode handoff of P/D
disaggregation and fetches from an external KV tier on storage servers.

Both are vLLM KV-connector loads: the receiving scheduler allocates blocks and parks the request
in WAITING_FOR_REMOTE_KVS; here its bytes move (every GPU of the receiving engine gets its own
shard: its pipeline stage's layers and its TP rank's KV heads) over the fabric, or over NVLink
between GPUs of one node (NIXL's UCX picks CUDA IPC there), and when the last byte lands the
scheduler is told (`finish_remote_load`) and the engine woken.
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
                 min_fetch_blocks: int = 1) -> None:
        self.runtime = runtime
        self.placement: Placement = runtime.placement
        self.block_size = block_size
        tp = self.placement.tp
        # KV bytes per token held by one GPU of each pipeline stage.
        self.stage_bytes_per_token = [arch.kv_bytes_per_token(kv_cache_dtype, tp, len(layers))
                                      for layers in stage_layers(arch.num_layers,
                                                                 self.placement.pp)]
        self.tier = (ExternalKVTier(max(1, tier_capacity_tokens // block_size))
                     if tier_capacity_tokens else None)
        self.min_fetch_blocks = min_fetch_blocks
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

    def _loaded(self, req: Request, start_s: float, on_loaded: Callable[[Request], None]) -> None:
        """The request waited on the network for its KV: that is network time of its latency."""
        rec = req.client
        if rec is not None:
            rec.network_s += self.runtime.env.now - start_s
        self.release(req.request_id)
        on_loaded(req)

