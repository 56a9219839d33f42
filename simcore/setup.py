"""From a validated config to a deployment: architecture, GPU, KV-cache size, batch limits and step model."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from simcore.compute.base import StepTimeModel
from simcore.compute.expert_parallel import ExpertParallelRoofline
from simcore.compute.roofline import RooflineModel
from simcore.config import (SimConfig, check_batch_limits, default_batch_limits,
                            engines_over_bound)
from simcore.errors import ConfigError
from simcore.hardware import GpuSpec
from simcore.host import FITTED_COMPUTE
from simcore.model.arch import ModelArch, dtype_bytes
from simcore.model.memory import (DEFAULT_CUDA_GRAPH_BYTES, KvCacheMemory, MemoryRefusal,
                                  kv_cache_groups, kv_cache_num_blocks, non_torch_bytes)
from simcore.workload.config import shared_prefix_field

MEMORY_CAUSE_FIELDS = {"weights": "parallelism.tensor_parallel_size",
                       "max_num_batched_tokens": "engine.max_num_batched_tokens",
                       "max_num_seqs": "engine.max_num_seqs",
                       "max_model_len": "model.max_model_len",
                       "gpu_memory_utilization": "engine.gpu_memory_utilization",
                       "drafter": "engine.speculative_config.method",
                       "draft_model": "engine.speculative_config.model"}
"""The setting a start-up memory refusal names, by its MemoryRefusal cause (a drafter's by the
speculative method, a draft model's by its name)."""


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
        if self.weight_dtype == "nvfp4" and not self.step_model.calibrated:
            a.append("nvfp4 linear layers at the FP4 tensor-core peak, their 4.5-bit weights "
                     "read at that width" if self.gpu.fp4_flops is not None else
                     "nvfp4 linear layers at the bf16 tensor-core rate, their 4.5-bit weights "
                     f"read at that width: {self.gpu.name} has no FP4 tensor cores, and vLLM "
                     "runs NVFP4 weights there weight-only (FP4 Marlin)")
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
    if par.enable_expert_parallel and par.prefill_decode is None and ep == 1:
        raise ConfigError("parallelism.enable_expert_parallel: has no effect on one GPU (TP 1, "
                          "DP 1): vLLM spreads the experts only over more than one GPU "
                          "(FusedMoEParallelConfig)")
    if cfg.model.dtype == "mxfp4" and not arch.is_moe:
        raise ConfigError(f"model.dtype: mxfp4 quantizes a mixture-of-experts model's experts "
                          f"(vLLM's MXFP4 checkpoints); {arch.name} is a dense model")
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
    if e.speculative_config is not None:
        check_speculative(cfg, arch)
    max_model_len = cfg.model.resolved_max_model_len(arch)
    too_many = engines_over_bound(par.num_instances)
    if too_many:
        # The config's own check, again for a parallelism set without validation (a search's
        # derived data_parallel_size, a sizing layout).
        raise ConfigError(f"parallelism: {too_many}")
    prefix = shared_prefix_field(cfg.workload.dataset)
    if prefix is not None and prefix[1] >= max_model_len:
        # Every prompt starts with it and every request asks for at least one token, so vLLM
        # would refuse them all; its blocks' keys alone would not fit in memory past a size.
        raise ConfigError(f"workload.dataset.{prefix[0]}: {prefix[1]} tokens begin every prompt, "
                          f"at least the model's max_model_len ({max_model_len}): every request "
                          "would be refused; shorten it or raise model.max_model_len")
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
    draft_weights, draft_kv = drafter_memory(cfg, arch, weight_dtype, kv_dtype)
    memory_args = dict(
        tp=tp, pp=pp, ep=ep, weight_dtype=weight_dtype, kv_cache_dtype=kv_dtype,
        block_size=e.block_size, gpu_memory_utilization=e.gpu_memory_utilization,
        max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
        max_model_len=max_model_len, expert_align=cfg.model.expert_align(gpu.name),
        cuda_graph_bytes=DEFAULT_CUDA_GRAPH_BYTES if e.profile_cuda_graph_memory else 0.0,
        non_torch_bytes=non_torch_bytes(tp, "pcie" not in gpu.interconnect.lower()),
        **({"draft_weight_bytes": draft_weights, "draft_kv_bytes_per_token": draft_kv,
            "draft_name": drafter_arch(cfg, arch).name} if draft_weights or draft_kv else {}))
    if e.num_gpu_blocks_override is not None:
        num_blocks = e.num_gpu_blocks_override
        # vLLM loads the weights before it takes the override: they must fit all the same.
        try:
            kv_cache_num_blocks(arch, gpu.memory_bytes, **memory_args)
        except MemoryRefusal as err:
            if err.cause in ("weights", "drafter", "gpu_memory_utilization"):
                cause = ("draft_model" if err.cause == "drafter"
                         and e.speculative_config.method == "draft_model" else err.cause)
                raise ConfigError(f"{MEMORY_CAUSE_FIELDS[cause]}: {err}") from None
        # One max_model_len request must fit beside the reserved null block: the whole
        # sequence in a full-attention group, its window's admission need in a sliding-window
        # one (vLLM's max_admission_blocks_per_request), over every KV-cache group.
        needed = kv_cache_groups(arch, pp).max_blocks_per_request(
            e.block_size, max_model_len, max_num_batched_tokens)
        if num_blocks - 1 < needed:
            raise ConfigError(
                f"engine.num_gpu_blocks_override: {num_blocks} blocks of {e.block_size} tokens "
                f"cannot hold one max_model_len ({max_model_len}) request ({needed} blocks "
                f"and the null block); lower model.max_model_len or raise the block count")
    else:
        try:
            memory = kv_cache_num_blocks(arch, gpu.memory_bytes, **memory_args)
        except ConfigError as err:
            cause = err.cause if isinstance(err, MemoryRefusal) else "weights"
            if cause == "drafter" and e.speculative_config.method == "draft_model":
                cause = "draft_model"
            field = MEMORY_CAUSE_FIELDS[cause]
            raise ConfigError(f"{field}: {err}") from None
        num_blocks = memory.num_blocks
    model = step_model(cfg, arch, gpu, weight_dtype=weight_dtype, kv_cache_dtype=kv_dtype,
                       op_scale=op_scale)
    if e.speculative_config is not None:
        model = speculative_step_model(cfg, arch, gpu, model, weight_dtype=weight_dtype,
                                       kv_cache_dtype=kv_dtype, op_scale=op_scale)
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
    host = ((cfg.host, cfg.engine.async_scheduling, cfg.workload.endpoint)
            if cfg.host.model == "vllm" else None)
    kw = dict(tp=tp, pp=pp, weight_dtype=weight_dtype, kv_cache_dtype=kv_cache_dtype,
              assumptions=c.roofline, sequence_parallel_moe=seq_moe, multi_node_tp=multi_node,
              op_scale=op_scale, host=host)
    kind = c.resolved_kind(gpu.name)
    peaks = [f for f in ("bf16_flops", "fp8_flops", "fp4_flops", "hbm_bandwidth_bytes_per_s")
             if getattr(cfg.hardware, f) is not None]
    if peaks and kind == "calibrated":
        raise ConfigError(f"hardware.{peaks[0]}: the {gpu.name} kernel profile times the step's "
                          "kernels as measured, so a peak reaches only the ops it does not "
                          "cover; set compute.kind: roofline to time the GPU by its peaks")
    for peak, runs_at in (("fp8_flops", ("fp8", "fp8_block")), ("fp4_flops", ("nvfp4",))):
        if getattr(cfg.hardware, peak) is not None and weight_dtype not in runs_at:
            raise ConfigError(f"hardware.{peak}: only {' and '.join(runs_at)} weights run at "
                              f"this peak, not model.dtype {weight_dtype}; remove it")
    if (cfg.hardware.interconnect_bandwidth_bytes_per_s is not None and kind == "calibrated"
            and pp == 1 and not par.enable_expert_parallel and cfg.cluster is None):
        raise ConfigError(f"hardware.interconnect_bandwidth_bytes_per_s: the {gpu.name} kernel "
                          "profile times the TP all-reduces as measured, and with no pipeline "
                          "stages or expert parallelism nothing else crosses the interconnect; "
                          "set compute.kind: roofline to time it by this bandwidth")
    if c.moe_routing is not None and kind != "calibrated":
        raise ConfigError(f"compute.moe_routing: no kernel profile of {gpu.name} is shipped, so "
                          "the roofline times the experts (routing uniformly); remove it or "
                          "name a profile in compute.profile")
    if c.compute_bound_scale is not None and kind != "calibrated":
        raise ConfigError(f"compute.compute_bound_scale: no kernel profile of {gpu.name} is "
                          "shipped, so the roofline times every op with its own efficiencies "
                          "(compute.roofline); remove it or name a profile in compute.profile")
    # The TP all-reduces' fitted settings: each refused where no all-reduce of the kernel
    # profile takes it (at TP 1 unless it is the value that changes nothing).
    for name, verb in (("collective_skew_s", "wait at"), ("graphless_collective_scale", "scale")):
        value = getattr(c, name)
        if value is None:
            continue
        if kind != "calibrated":
            raise ConfigError(f"compute.{name}: no kernel profile of {gpu.name} is shipped, so "
                              "the roofline times the collectives (compute.roofline); remove it "
                              "or name a profile in compute.profile")
        if tp == 1 and value != FITTED_COMPUTE[name]:
            raise ConfigError(f"compute.{name}: with tensor_parallel_size 1 a step has no "
                              f"all-reduce to {verb}; remove it")
        if multi_node:
            raise ConfigError(f"compute.{name}: a cluster's collectives are timed on its fabric "
                              "(cluster.fabric), where this has no effect; remove it")
    if kind == "calibrated":
        kw["compute_bound_scale"] = c.resolved("compute_bound_scale")
        if not multi_node:
            kw["collective_skew_s"] = c.resolved("collective_skew_s")
            kw["graphless_collective_scale"] = c.resolved("graphless_collective_scale")
        from simcore.calibration.kernels import KernelProfile
        from simcore.compute.calibrated import CalibratedModel, resolve_profile
        from simcore.compute.kernel_model import KernelModel
        profile = resolve_profile(c.profile, gpu, base_dir=Path(cfg.base_dir))
        layout = (cfg.model.resolved_mxfp4_moe_layout(gpu.name) if weight_dtype == "mxfp4"
                  else None)
        rank: StepTimeModel = (KernelModel(arch, gpu, profile=profile, moe_routing=c.moe_routing,
                                           mxfp4_moe_layout=layout,
                                           expert_parallel=par.enable_expert_parallel, **kw)
                               if isinstance(profile, KernelProfile)
                               else CalibratedModel(arch, gpu, profile=profile, **kw))
    else:
        rank = RooflineModel(arch, gpu, **kw)
    if not par.enable_expert_parallel:
        return rank
    return ExpertParallelRoofline(arch, gpu, tp=tp, pp=pp, dp=dp, weight_dtype=weight_dtype,
                                  kv_cache_dtype=kv_cache_dtype, assumptions=c.roofline,
                                  multi_node_tp=multi_node, op_scale=op_scale, rank_model=rank)


def check_speculative(cfg: SimConfig, arch: ModelArch) -> None:
    """Refuse the speculative-decoding setups vLLM refuses, and those the simulator does not
    model, each with one ConfigError naming the field."""
    spec = cfg.engine.speculative_config
    par = cfg.parallelism
    where = "engine.speculative_config"
    if par.pipeline_parallel_size > 1 and spec.method != "eagle3":
        # vLLM runs EAGLE-3 with pipeline parallelism (Model Runner V2 relays the head's
        # auxiliary hidden states over the stages: vllm-project/vllm#50514, its docs since
        # #55623); other methods are not composable with PP, and MTP with PP fails (#49355).
        raise ConfigError(f"{where}.method: {spec.method} with pipeline_parallel_size "
                          f"{par.pipeline_parallel_size} is refused: vLLM runs only eagle3 "
                          "with pipeline parallelism; use eagle3 or pipeline_parallel_size 1")
    if par.pipeline_parallel_size > 1 and par.enable_expert_parallel:
        raise ConfigError(f"{where}: speculative decoding with pipeline parallelism and "
                          "expert parallelism together is not modelled (the EAGLE-3 head's "
                          "hidden states over an expert-parallel group's stages); use "
                          "pipeline_parallel_size 1 or enable_expert_parallel false")
    if spec.method == "mtp":
        if arch.num_mtp_layers <= 0:
            raise ConfigError(f"{where}.method: mtp needs a model with multi-token-prediction "
                              f"layers (num_nextn_predict_layers, e.g. DeepSeek-V3); "
                              f"{arch.name} has none")
        if spec.num_speculative_tokens % arch.num_mtp_layers:
            raise ConfigError(f"{where}.num_speculative_tokens: "
                              f"{spec.num_speculative_tokens} is not a multiple of the "
                              f"{arch.num_mtp_layers} MTP layers of {arch.name} (vLLM requires "
                              "it)")
    if spec.method == "draft_model":
        from simcore.model.presets import is_preset, load_preset, preset_names
        if not is_preset(spec.model):
            raise ConfigError(f"{where}.model: unknown draft model {spec.model!r}; known "
                              f"presets: {', '.join(preset_names())}")
        draft = load_preset(spec.model)
        if draft.vocab_size != arch.vocab_size:
            raise ConfigError(f"{where}.model: {draft.name} has a vocabulary of "
                              f"{draft.vocab_size} tokens, {arch.name} of {arch.vocab_size}; a "
                              "draft model must share the target's vocabulary")
        try:
            draft.check_tp(cfg.parallelism.tensor_parallel_size)
        except ConfigError as err:
            raise ConfigError(f"{where}.model: the draft runs with the target's tensor "
                              f"parallelism: {err}") from None


def drafter_arch(cfg: SimConfig, arch: ModelArch) -> ModelArch | None:
    """The architecture that times and holds the speculative-decoding drafter (None without one,
    or for n-gram lookup): a draft model's own, or the one decoder layer of an EAGLE head or MTP
    layer (`draft_head_arch`). Its KV sits in the same blocks as the target's, so it moves with
    them (a prefill-to-decode handoff)."""
    spec = cfg.engine.speculative_config
    if spec is None or spec.method == "ngram":
        return None
    if spec.method == "draft_model":
        from simcore.model.presets import load_preset
        return load_preset(spec.model)
    from simcore.compute.speculative import draft_head_arch
    return draft_head_arch(arch, spec.method)


def drafter_memory(cfg: SimConfig, arch: ModelArch, weight_dtype: str,
                   kv_cache_dtype: str) -> tuple[float, float]:
    """(weight bytes per GPU, KV-cache bytes per token per GPU) of the speculative-decoding
    drafter, (0, 0) without one: a draft model whole; an EAGLE head or an MTP layer one decoder
    layer of the target (sharing its embedding, and but for EAGLE-3 its LM head: EAGLE-3's own
    is taken at the target's vocabulary), with one layer of KV; n-gram lookup nothing. With
    pipeline parallelism the drafter sits on the last stage, which holds no embedding, so the
    head loads its own (vLLM shares the target's only without PP)."""
    draft = drafter_arch(cfg, arch)
    if draft is None:
        return 0.0, 0.0
    method = cfg.engine.speculative_config.method
    par = cfg.parallelism
    tp = par.tensor_parallel_size
    kv = draft.kv_bytes_per_token(kv_cache_dtype, tp)
    if method == "draft_model":
        return draft.weight_bytes_per_gpu(weight_dtype, tp), kv
    # With expert parallelism an MTP layer's routed experts spread whole over the EP group.
    ep = tp * par.data_parallel_size if par.enable_expert_parallel and draft.is_moe else 1
    other = max(dtype_bytes(weight_dtype), 2.0)      # embeddings, LM head, norms: 16-bit
    vocab_shard = draft.embedding_params / tp * other
    shared = vocab_shard * (1 if draft.tie_word_embeddings else 2) + draft.hidden_size * other
    own_head = vocab_shard if method == "eagle3" else 0.0
    own_embedding = vocab_shard if par.pipeline_parallel_size > 1 else 0.0
    return (draft.stage_weight_bytes(weight_dtype, tp, ep=ep) - shared + own_head
            + own_embedding, kv)


def speculative_step_model(cfg: SimConfig, arch: ModelArch, gpu: GpuSpec,
                           target: StepTimeModel, *, weight_dtype: str, kv_cache_dtype: str,
                           op_scale: dict[str, float] | None = None) -> StepTimeModel:
    """The target's step model plus the drafter's forwards of each step
    (`simcore.compute.speculative`): the drafter timed by a model of the same kind, TP and
    profile, with no CPU time of its own."""
    from simcore.compute.speculative import SpeculativeGroupModel, SpeculativeStepModel

    spec = cfg.engine.speculative_config
    draft = None
    label = ""
    draft_arch = drafter_arch(cfg, arch)
    if draft_arch is not None:
        label = (f"the draft model {draft_arch.name}" if spec.method == "draft_model"
                 else f"one decoder layer and the LM head of {arch.name} ({spec.method})")
        c = cfg.compute
        par = {"pipeline_parallel_size": 1}
        if cfg.parallelism.enable_expert_parallel and not draft_arch.is_moe:
            # A dense drafter runs on each rank of an expert-parallel group alone.
            par.update(enable_expert_parallel=False, data_parallel_size=1)
        bare = cfg.model_copy(update={
            "parallelism": cfg.parallelism.model_copy(update=par),
            "compute": c.model_copy(update={"roofline": c.roofline.model_copy(
                update={"step_overhead_s": 0.0})}),
            "host": cfg.host.model_copy(update={"model": "constant"})})
        draft = step_model(bare, draft_arch, gpu, weight_dtype=weight_dtype,
                           kv_cache_dtype=kv_cache_dtype, op_scale=op_scale)
    kind = (SpeculativeGroupModel if cfg.parallelism.enable_expert_parallel
            else SpeculativeStepModel)
    return kind(target, draft, method=spec.method,
                num_speculative_tokens=spec.num_speculative_tokens, draft_label=label)
