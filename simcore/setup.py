"""From a validated config to a deployment: architecture, GPU, KV-cache size, batch limits and step model."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from simcore.compute.base import StepTimeModel
from simcore.compute.expert_parallel import ExpertParallelRoofline
from simcore.compute.roofline import RooflineModel
from simcore.config import SimConfig, check_batch_limits, default_batch_limits
from simcore.errors import ConfigError
from simcore.hardware import GpuSpec
from simcore.model.arch import ModelArch
from simcore.model.memory import KvCacheMemory, kv_cache_num_blocks


@dataclass(frozen=True)
class Deployment:
    """Everything derived from the config that the serving loop needs, resolved once."""

    arch: ModelArch
    gpu: GpuSpec
    step_model: StepTimeModel
    memory: KvCacheMemory | None      # None when num_gpu_blocks_override fixes the pool
    num_blocks: int
    block_size: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    gpus_per_replica: int
    base_dir: Path
    weight_dtype: str
    kv_cache_dtype: str
    ep_size: int = 1
    """Expert-parallel group size (DP x TP) with expert parallelism on; 1 without it."""
    expert_parallel: bool = False
    """Expert parallelism on: the DP ranks form one lock-step group (`step_model` times it)."""

    def memory_report(self) -> dict:
        """KV-cache size and, when derived from memory, the formula's every term. With vLLM's
        hybrid manager (sliding-window layers) a block holds one KV-cache group's layers, so the
        tokens are counted as vLLM reports them: the usable blocks shared out over the groups."""
        from simcore.model.memory import kv_cache_groups

        groups = len(kv_cache_groups(self.arch).windows)
        out = {"num_gpu_blocks": self.num_blocks, "block_size": self.block_size,
               "num_kv_tokens": (self.num_blocks - 1) // groups * self.block_size,
               "kv_bytes_per_token_per_gpu": self.arch.kv_bytes_per_token(
                   self.kv_cache_dtype, self.step_model.tp,
                   num_layers=None) / max(1, self.step_model.pp)}
        if self.memory is not None:
            out["memory_breakdown_bytes"] = {k: v for k, v in asdict(self.memory).items()
                                             if k not in ("block_size", "num_blocks")}
        else:
            out["memory_breakdown_bytes"] = None
        return out

    def assumptions(self) -> list[str]:
        """The modelling assumptions a result from this deployment rests on, in plain words."""
        a = self.step_model.assumption_lines() + [
            "vLLM V1 scheduler's sync-mode decisions (async scheduling, where set, overlaps only "
            "the CPU side)",
            "every request generates exactly its output length (ignore_eos)",
            "tokens reach the client when the step that sampled them ends",
        ]
        if self.memory is None:
            a.append("KV-cache size fixed by engine.num_gpu_blocks_override")
        else:
            a.append("KV-cache size by vLLM's memory formula with declared activation, CUDA-graph "
                     "and non-torch allowances")
        if self.step_model.pp > 1:
            a.append("pipeline stages run one after another per step (no micro-batch overlap)")
        if self.expert_parallel:
            m = self.step_model
            link = ("the intra-node interconnect" if m.ep_local >= m.ep
                    else "the declared per-GPU network bandwidth across nodes")
            a.append(f"expert parallelism over {m.ep} GPUs ({m.experts_per_gpu} whole experts "
                     f"each); the {m.dp} DP ranks step in lock-step, idle ranks running "
                     "one-token dummy batches")
            a.append("MoE tokens routed uniformly at random; the hottest GPU's expert load is "
                     "the expected maximum by a normal approximation (no expert load balancer)")
            if m.dp > 1:
                a.append(f"EP dispatch and combine all-to-all (top-k copies per token) over "
                         f"{link}, not overlapped with compute; no fabric contention")
        elif self.arch.is_moe:
            a.append("MoE tokens routed uniformly over experts; experts sharded by TP")
        return a


def build_deployment(cfg: SimConfig, *, op_scale: dict[str, float] | None = None) -> Deployment:
    """Resolve model, GPU, limits and KV-cache size; vLLM's start-up checks raise ConfigError.
    `op_scale` scales the step model's op classes (see `simcore.compute.roofline.OP_CLASSES`)."""
    base_dir = Path(cfg.base_dir)
    arch = cfg.model.resolve(base_dir)
    gpu = cfg.hardware.resolve()
    par = cfg.parallelism
    e = cfg.engine
    tp, pp = par.tensor_parallel_size, par.pipeline_parallel_size
    ep = par.expert_parallel_size
    if cfg.compute.moe_routing is not None and not arch.is_moe:
        raise ConfigError(f"compute.moe_routing: {arch.name} is a dense model; it has no router")
    if par.enable_expert_parallel and not arch.is_moe:
        raise ConfigError(f"parallelism.enable_expert_parallel: {arch.name} is a dense model; "
                          "expert parallelism needs a mixture-of-experts model")
    try:
        arch.check_tp(tp)
    except ConfigError as err:
        raise ConfigError(f"parallelism.tensor_parallel_size: {err}") from None
    if pp > arch.num_layers:
        raise ConfigError(f"parallelism.pipeline_parallel_size: {pp} stages exceed the "
                          f"{arch.num_layers} layers of {arch.name}")
    gpus_per_node = cfg.hardware.gpus_per_node or gpu.gpus_per_node
    if tp > gpus_per_node and cfg.cluster is None:
        raise ConfigError(f"parallelism.tensor_parallel_size: {tp} exceeds the {gpus_per_node} "
                          f"GPUs of one {gpu.name} node (TP across nodes is not modelled)")
    max_model_len = cfg.model.resolved_max_model_len(arch)
    seqs, tokens = default_batch_limits(gpu.memory_bytes, gpu.name, e.enable_chunked_prefill,
                                        max_model_len)
    max_num_seqs = e.max_num_seqs or seqs
    max_num_batched_tokens = e.max_num_batched_tokens or tokens
    try:
        check_batch_limits(max_num_seqs, max_num_batched_tokens, max_model_len,
                           e.enable_chunked_prefill, e.long_prefill_token_threshold)
    except ConfigError as err:
        raise ConfigError(f"engine.{err}") from None
    weight_dtype = cfg.model.dtype
    kv_dtype = cfg.model.resolved_kv_cache_dtype
    memory = None
    if e.num_gpu_blocks_override is not None:
        num_blocks = e.num_gpu_blocks_override
        if (num_blocks - 1) * e.block_size < max_model_len:
            raise ConfigError(
                f"engine.num_gpu_blocks_override: {num_blocks} blocks of {e.block_size} tokens "
                f"cannot hold one max_model_len ({max_model_len}) request; lower "
                f"model.max_model_len or raise the block count")
    else:
        try:
            memory = kv_cache_num_blocks(
                arch, gpu.memory_bytes, weight_dtype=weight_dtype, kv_cache_dtype=kv_dtype,
                tp=tp, pp=pp, ep=ep, block_size=e.block_size,
                gpu_memory_utilization=e.gpu_memory_utilization,
                max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                max_model_len=max_model_len)
        except ConfigError as err:
            raise ConfigError(f"parallelism.tensor_parallel_size: {err}") from None
        num_blocks = memory.num_blocks
    model = step_model(cfg, arch, gpu, weight_dtype=weight_dtype, kv_cache_dtype=kv_dtype,
                       op_scale=op_scale)
    return Deployment(arch=arch, gpu=gpu, step_model=model, memory=memory, num_blocks=num_blocks,
                      block_size=e.block_size, max_model_len=max_model_len,
                      max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                      gpus_per_replica=tp * pp, base_dir=base_dir, weight_dtype=weight_dtype,
                      kv_cache_dtype=kv_dtype, ep_size=ep,
                      expert_parallel=par.enable_expert_parallel)


def step_model(cfg: SimConfig, arch: ModelArch, gpu: GpuSpec, *, weight_dtype: str,
               kv_cache_dtype: str, op_scale: dict[str, float] | None = None) -> StepTimeModel:
    """The configured compute model: the roofline reference, or a calibration profile's per-op
    times over it; with expert parallelism, the lock-step group model over either."""
    par = cfg.parallelism
    c = cfg.compute
    tp, pp, dp = par.tensor_parallel_size, par.pipeline_parallel_size, par.data_parallel_size
    multi_node = cfg.cluster is not None
    seq_moe = par.enable_expert_parallel and dp > 1
    host = (cfg.host, cfg.engine.async_scheduling) if cfg.host.model == "vllm" else None
    kw = dict(tp=tp, pp=pp, weight_dtype=weight_dtype, kv_cache_dtype=kv_cache_dtype,
              assumptions=c.roofline, sequence_parallel_moe=seq_moe, multi_node_tp=multi_node,
              op_scale=op_scale, host=host)
    if c.kind == "calibrated":
        from simcore.calibration.kernels import KernelProfile
        from simcore.compute.calibrated import CalibratedModel, resolve_profile
        from simcore.compute.kernel_model import KernelModel
        profile = resolve_profile(c.profile, gpu, base_dir=Path(cfg.base_dir))
        rank: StepTimeModel = (KernelModel(arch, gpu, profile=profile, moe_routing=c.moe_routing,
                                           **kw)
                               if isinstance(profile, KernelProfile)
                               else CalibratedModel(arch, gpu, profile=profile, **kw))
    else:
        rank = RooflineModel(arch, gpu, **kw)
    if not par.enable_expert_parallel:
        return rank
    return ExpertParallelRoofline(arch, gpu, tp=tp, pp=pp, dp=dp, weight_dtype=weight_dtype,
                                  kv_cache_dtype=kv_cache_dtype, assumptions=c.roofline,
                                  multi_node_tp=multi_node, op_scale=op_scale, rank_model=rank)
