"""How many KV-cache blocks vLLM allocates on each GPU, by its memory-profiling formula."""

from __future__ import annotations

from dataclasses import dataclass

from simcore.engine.hybrid_kv import sliding_window_blocks
from simcore.errors import ConfigError
from simcore.model.arch import ModelArch, dtype_bytes, pp_stage_layers
from simcore.units import GIB

DEFAULT_CUDA_GRAPH_BYTES = 0.5 * GIB
"""Declared estimate of the captured CUDA graphs, which vLLM subtracts before sizing the KV cache
since 0.21 (its CUDA-graph memory profiling, VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS); earlier
releases captured the graphs after allocating the KV cache, out of the memory
gpu_memory_utilization leaves (`engine.profile_cuda_graph_memory`). Logged captures: 0.2-3.5 GiB."""
SAMPLER_BYTES_PER_LOGIT = 38.4
"""Peak working memory of vLLM's profiling sampler run per vocabulary entry of each of its
max_num_seqs rows (fp32 logits and their working copies, sorting scratch). Measured: vLLM 0.10-0.11
start-up logs' torch activation peak, less the T x hidden term below, over max_num_seqs x vocab,
is 38.25-38.55 bytes on gpt-oss-20b/120b, Llama-3.1-8B, Llama-3.3-70B (TP 2), Qwen3-32B (TP 1 and
2) on H100 and Qwen3-235B (TP 4) on H200, whatever the vocabulary (128k-201k), TP or MoE
(`simcore/data/measurements/vllm_startup_memory.csv`, the rows marked fit)."""
DEFAULT_SAMPLER_BYTES_PER_LOGIT = SAMPLER_BYTES_PER_LOGIT
DEFAULT_GPU_MEMORY_UTILIZATION = 0.92
"""vLLM's default gpu_memory_utilization (0.9 before 0.21), engine.gpu_memory_utilization's."""


def non_torch_bytes(tp: int, nvlink: bool) -> float:
    """Memory outside PyTorch's allocator on each GPU at start-up (CUDA context, cuBLAS
    workspaces, NCCL and custom all-reduce buffers), as vLLM 0.10-0.11 logs it: 0.13 GiB alone
    (H100, TP 1), 0.55 GiB at TP 2 over NVLink (H100), 2.04 GiB at TP 4 over NVLink (H200; NCCL's
    NVLink-SHARP buffers on NVSwitch systems; taken for TP 8 too, unlogged), 0.21 GiB at TP 8
    over PCIe (L40S: no custom all-reduce or NVLink buffers). The start-up logs of
    `simcore/data/measurements/vllm_startup_memory.csv`."""
    if tp <= 1:
        return 0.13 * GIB
    if not nvlink:
        return 0.21 * GIB
    return 0.55 * GIB if tp == 2 else 2.04 * GIB


DEFAULT_NON_TORCH_BYTES = non_torch_bytes(1, True)


class MemoryRefusal(ConfigError):
    """vLLM would not start for want of memory; `cause` says which setting to change:
    "weights" (the model's weights: parallelism), "max_num_batched_tokens" or "max_num_seqs"
    (the activation peak of the profiling run, the larger share of what leaves no KV cache),
    "drafter" (a speculative-decoding drafter's weights, heavier than the model's),
    "gpu_memory_utilization" (a utilisation below the default leaves the weights, or the KV
    cache, no room where the default would), or "max_model_len" (one longest request does not
    fit)."""

    def __init__(self, message: str, cause: str):
        super().__init__(message)
        self.cause = cause


@dataclass(frozen=True, slots=True)
class KvCacheMemory:
    """Memory breakdown of the GPU that limits the KV cache, and the resulting block count.

    Invariant: kv_cache_bytes = requested_bytes - weight_bytes - activation_peak_bytes -
    cuda_graph_bytes - non_torch_bytes, and num_blocks = floor(kv_cache_bytes / bytes_per_block).
    With pipeline parallelism every stage computes its own count and vLLM keeps the minimum; the
    terms are those of the limiting stage (`pp_stage`).
    """

    total_memory_bytes: int
    """Device memory reported as total."""
    gpu_memory_utilization: float
    """Fraction of total memory vLLM may use."""
    requested_bytes: float
    """total_memory_bytes x gpu_memory_utilization."""
    weight_bytes: float
    """Model weights on this GPU."""
    activation_peak_bytes: float
    """Peak activation memory of the profiling forward pass (and sampler run)."""
    cuda_graph_bytes: float
    """Declared estimate of the CUDA graphs subtracted (0 where vLLM captures them after)."""
    non_torch_bytes: float
    """Memory outside PyTorch's allocator (`non_torch_bytes`)."""
    kv_cache_bytes: float
    """What is left for the KV cache."""
    bytes_per_block: float
    """KV bytes of one block on this GPU: block_size tokens x the layers one block holds on this
    stage (all of them; with sliding-window layers, one KV-cache group's: `KvCacheGroups`)."""
    block_size: int
    """Tokens per KV block."""
    num_blocks: int
    """KV blocks vLLM allocates (block 0 included; the scheduler reserves it)."""
    pp_stage: int
    """Pipeline stage (0-based) whose GPUs limit the block count."""

    @property
    def num_tokens(self) -> int:
        """Tokens the allocated blocks hold (with sliding-window layers, in the full-attention
        group alone; a request's window of sliding-window KV takes a few blocks more)."""
        return self.num_blocks * self.block_size


@dataclass(frozen=True, slots=True)
class KvCacheGroups:
    """How vLLM's hybrid KV-cache manager groups a model's attention layers into KV-cache groups
    that share one block pool (`vllm/v1/core/kv_cache_utils.py`,
    `_get_kv_cache_groups_uniform_page_size`; every layer's KV per token is the same size).

    The layers are bucketed by attention kind (full attention; sliding window), each bucket is
    split into groups of the same number of layers: the smallest bucket's size, or the largest's
    when it is under 1.5 times the smallest (the last group of a bucket padded), a bucket's layers
    dealt to its groups round-robin (`layers[i::n]`). Every group has its own block table over
    the shared pool; a block id given to one group holds `block_size` tokens of that group's
    layers, so one block's memory is `block_size` tokens x the group size, and vLLM sizes the pool
    as available memory // that. A model without sliding-window layers is one group of all its
    layers; gpt-oss-120b has two, its 18 full-attention layers and its 18 sliding-window ones.
    """

    windows: tuple[int, ...]
    """Per group, the window its layers attend over (0: full attention)."""
    layers_per_block: tuple[int, ...]
    """Per pipeline stage, the layers whose KV one block holds on that stage's GPUs: the most
    layers any group has there."""

    def max_blocks_per_request(self, block_size: int, max_model_len: int,
                               max_num_batched_tokens: int) -> int:
        """Blocks one `max_model_len` request may hold at once, over every group: the whole
        sequence in a full-attention group; in a sliding-window group its window before the
        newest chunk plus that chunk, and one block for a window not aligned to a block (vLLM's
        `SlidingWindowSpec.max_admission_blocks_per_request`)."""
        total = 0
        for w in self.windows:
            total += sliding_window_blocks(w, block_size, max_model_len, max_num_batched_tokens) \
                if w else -(-max_model_len // block_size)
        return total


def kv_cache_groups(arch: ModelArch, pp: int = 1) -> KvCacheGroups:
    """The KV-cache groups of `arch` as vLLM forms them, with `pp` pipeline stages."""
    stages = pp_stage_layers(arch.num_layers, pp)
    sliding = set(arch.sliding_window_layers)
    buckets = [(w, layers) for w, layers in (
        (0, [i for i in range(arch.num_layers) if i not in sliding]),
        (arch.sliding_window, sorted(sliding))) if layers]
    if len(buckets) == 1:
        return KvCacheGroups((buckets[0][0],), stages)
    sizes = [len(layers) for _, layers in buckets]
    size = min(sizes)
    if max(sizes) < 1.5 * size:
        size = max(sizes)
    groups: list[tuple[int, list[int]]] = []
    for w, layers in buckets:
        n = -(-len(layers) // size)
        groups += [(w, layers[i::n]) for i in range(n)]
    per_stage = []
    first = 0
    for num in stages:
        per_stage.append(max(sum(1 for i in layers if first <= i < first + num)
                             for _, layers in groups))
        first += num
    return KvCacheGroups(tuple(w for w, _ in groups), tuple(per_stage))


def activation_peak_bytes(arch: ModelArch, *, tp: int, act_dtype_bytes: float,
                          max_num_batched_tokens: int, max_num_seqs: int, last_stage: bool,
                          sampler_bytes_per_logit: float = DEFAULT_SAMPLER_BYTES_PER_LOGIT,
                          ep: int = 1) -> float:
    """Estimated peak activation memory of vLLM's profiling run on one GPU.

    vLLM profiles a dummy forward pass of `max_num_batched_tokens` tokens, then (on the last
    pipeline stage) a sampler run over `max_num_seqs` rows. Estimate: the residual stream and
    hidden states (2 x T x hidden) plus the largest per-layer intermediate alive at once, the
    largest of
      dense MLP:  gate_up output + activation output, 3 x intermediate / tp per token;
      MoE MLP:    fused-MoE caches, top_k x (3 x moe_intermediate / tp + hidden) per token;
                  with expert parallelism (`ep` > 1) whole experts see, on average, top_k / tp
                  of each token's assignments (every DP rank profiles the same batch, and the
                  dp x tp GPUs share them), so top_k / tp x (3 x moe_intermediate + hidden);
      attention:  QKV output + attention output per token (MLA: decompressed K and V);
    and, on the last stage, the sampler: max_num_seqs x vocab x `sampler_bytes_per_logit`.
    torch.compile buffers and allocator fragmentation are not modelled.
    """
    t = max_num_batched_tokens
    h = arch.hidden_size
    heads = arch.num_attention_heads // tp
    if arch.is_mla:
        attn = heads * (arch.qk_head_dim + arch.qk_nope_head_dim + 2 * arch.v_head_dim)
    else:
        attn = (2 * heads + 2 * arch.kv_heads_per_gpu(tp)) * arch.head_dim
    per_token = [attn]
    if arch.num_moe_layers() < arch.num_layers:
        per_token.append(3 * arch.intermediate_size // tp)
    if arch.is_moe and ep > 1:
        per_token.append(arch.num_experts_per_tok * (3 * arch.moe_intermediate_size + h) / tp)
    elif arch.is_moe:
        per_token.append(arch.num_experts_per_tok * (3 * arch.moe_intermediate_size // tp + h))
    forward = t * act_dtype_bytes * (2 * h + max(per_token))
    if not last_stage:
        return forward
    sampler = (max_num_seqs * arch.vocab_size * sampler_bytes_per_logit
               + t * h * act_dtype_bytes)
    return max(forward, sampler)


def kv_cache_num_blocks(
    arch: ModelArch,
    total_memory_bytes: int,
    *,
    weight_dtype: str = "bf16",
    kv_cache_dtype: str = "bf16",
    tp: int = 1,
    pp: int = 1,
    ep: int = 1,
    block_size: int = 16,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    max_num_batched_tokens: int = 8192,
    max_num_seqs: int = 1024,
    max_model_len: int | None = None,
    cuda_graph_bytes: float = DEFAULT_CUDA_GRAPH_BYTES,
    non_torch_bytes: float = DEFAULT_NON_TORCH_BYTES,
    sampler_bytes_per_logit: float = DEFAULT_SAMPLER_BYTES_PER_LOGIT,
    draft_weight_bytes: float = 0.0,
    draft_kv_bytes_per_token: float = 0.0,
    draft_name: str = "",
    expert_align: tuple[int, int] = (1, 1),
) -> KvCacheMemory:
    """KV blocks per GPU by vLLM's formula, with every term of the breakdown.

    num_blocks = (total x gpu_memory_utilization - weights - activation peak - CUDA graphs -
    non-torch memory) // bytes_per_block, per pipeline stage, minimum over stages. Weights are
    those of the most loaded GPU of the stage (layers split over PP, sharded over TP; routed
    experts split whole over `ep` GPUs when ep > 1, vLLM's expert parallelism with
    EP = DP x TP). A block holds `block_size` tokens of one KV-cache group's layers
    (`kv_cache_groups`: all layers, or with sliding-window layers each kind's share). Raises
    MemoryRefusal when the weights do not fit, when nothing is left for the KV cache, or when one
    `max_model_len` request would not fit (vLLM refuses to start then; a sliding-window group
    needs only its window and a chunk of it); its cause names the larger share where nothing is
    left: the weights, or the activation peak.

    A speculative-decoding drafter adds `draft_weight_bytes` of weights per GPU and
    `draft_kv_bytes_per_token` to every block's tokens (its KV layers share the target's
    blocks), both on the last stage, where it runs; a refusal names it `draft_name`. Under an
    expert-only weight format (mxfp4) the routed experts take the padded shapes of the kernel
    layout `expert_align` (`simcore.model.arch.MXFP4_MOE_LAYOUTS`).
    """
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise ConfigError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    if block_size <= 0:
        raise ConfigError(f"block_size must be positive, got {block_size}")
    arch.check_tp(tp)
    groups = kv_cache_groups(arch, pp)
    requested = total_memory_bytes * gpu_memory_utilization
    act_bytes = max(dtype_bytes(weight_dtype), 2)
    kv_elem_bytes = dtype_bytes(kv_cache_dtype)

    best: KvCacheMemory | None = None
    for stage, layers_per_block in enumerate(groups.layers_per_block):
        target = arch.stage_weight_bytes(weight_dtype, tp, pp, stage, ep, expert_align)
        draft = draft_weight_bytes if stage == pp - 1 else 0.0
        weights = target + draft
        # The larger of the two models' weights is the one to shrink or spread.
        heavier = "drafter" if draft > target else "weights"
        smaller_draft = "use a smaller drafter, " if heavier == "drafter" else ""
        whose = f"model weights of {arch.name}"
        if draft:
            whose += (f" ({target / GIB:.1f} GiB) and of its drafter {draft_name or 'model'} "
                      f"({draft / GIB:.1f} GiB)")
        if weights >= requested:
            # They fit in what the default utilisation allows: the lowered one is to blame.
            at_default = total_memory_bytes * DEFAULT_GPU_MEMORY_UTILIZATION
            lowered = weights < at_default
            raise MemoryRefusal(
                f"{whose} need {weights / GIB:.1f} GiB per GPU but only "
                f"{requested / GIB:.1f} GiB is usable ({gpu_memory_utilization} x "
                f"{total_memory_bytes / GIB:.1f} GiB); "
                + (f"raise gpu_memory_utilization (the default {DEFAULT_GPU_MEMORY_UTILIZATION} "
                   f"allows {at_default / GIB:.1f} GiB), " if lowered else "")
                + f"{smaller_draft}increase tensor_parallel_size or pipeline_parallel_size (now "
                f"{tp} and {pp}), use a GPU with more memory, or use fp8 weights",
                "gpu_memory_utilization" if lowered else heavier)
        peak = dict(tp=tp, act_dtype_bytes=act_bytes,
                    max_num_batched_tokens=max_num_batched_tokens,
                    max_num_seqs=max_num_seqs, sampler_bytes_per_logit=sampler_bytes_per_logit,
                    ep=ep)
        activation = activation_peak_bytes(arch, last_stage=stage == pp - 1, **peak)
        kv_bytes = requested - weights - activation - cuda_graph_bytes - non_torch_bytes
        per_block = block_size * layers_per_block * arch.kv_elems_per_token_per_layer(tp) \
            * kv_elem_bytes
        if draft_kv_bytes_per_token and stage == pp - 1:
            per_block += block_size * draft_kv_bytes_per_token
        num_blocks = int(kv_bytes // per_block) if kv_bytes > 0 else 0
        if num_blocks <= 0:
            cause = heavier
            # What the default utilisation would leave the KV cache: the lowered one is to
            # blame where that holds a block.
            kv_at_default = total_memory_bytes * DEFAULT_GPU_MEMORY_UTILIZATION - (requested
                                                                                  - kv_bytes)
            if kv_at_default >= per_block:
                cause = "gpu_memory_utilization"
            elif activation > weights + cuda_graph_bytes + non_torch_bytes:
                # The sampler's run over max_num_seqs rows, or the forward of a full step.
                forward = activation_peak_bytes(arch, last_stage=False, **peak)
                cause = "max_num_seqs" if activation > forward else "max_num_batched_tokens"
                smaller_draft = ""
            raise MemoryRefusal(
                f"no memory left for the KV cache of {arch.name}: "
                f"{whose if draft else 'weights'} take {weights / GIB:.1f} GiB and "
                f"activations/graphs {(activation + cuda_graph_bytes + non_torch_bytes) / GIB:.1f}"
                f" GiB of {requested / GIB:.1f} GiB; {smaller_draft}increase "
                "gpu_memory_utilization or parallelism, or decrease max_num_batched_tokens / "
                "max_num_seqs"
                + (f" (the default gpu_memory_utilization {DEFAULT_GPU_MEMORY_UTILIZATION} "
                   f"would leave the KV cache {kv_at_default / GIB:.1f} GiB)"
                   if cause == "gpu_memory_utilization" else ""), cause)
        result = KvCacheMemory(
            total_memory_bytes=total_memory_bytes, gpu_memory_utilization=gpu_memory_utilization,
            requested_bytes=requested, weight_bytes=weights, activation_peak_bytes=activation,
            cuda_graph_bytes=cuda_graph_bytes, non_torch_bytes=non_torch_bytes,
            kv_cache_bytes=kv_bytes, bytes_per_block=per_block, block_size=block_size,
            num_blocks=num_blocks, pp_stage=stage)
        if best is None or result.num_blocks < best.num_blocks:
            best = result
    assert best is not None

    if max_model_len is not None:
        needed_blocks = groups.max_blocks_per_request(block_size, max_model_len,
                                                      max_num_batched_tokens)
        if needed_blocks > best.num_blocks:
            raise MemoryRefusal(
                f"one request of max_model_len {max_model_len} tokens needs "
                f"{needed_blocks * best.bytes_per_block / GIB:.2f} GiB of KV cache but only "
                f"{best.kv_cache_bytes / GIB:.2f} GiB is available per GPU; decrease "
                "max_model_len or increase gpu_memory_utilization or parallelism",
                "max_model_len")
    return best
