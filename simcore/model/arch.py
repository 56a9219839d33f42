"""The shape of a decoder-only transformer: its weights, GEMMs and KV cache, as seen by one GPU."""

from __future__ import annotations

from dataclasses import dataclass

from simcore.errors import ConfigError
from simcore.units import DTYPE_BYTES

_HIGH_PRECISION_BYTES = 2
"""Bytes per element of what quantized checkpoints keep in bf16 (embeddings, norms, routers)."""

EXPERT_ONLY_DTYPES: dict[str, float] = {"mxfp4": 4.25 / 8}
"""Weight formats that quantize the routed experts' matrices only, and their bytes per expert
weight. MXFP4 (OCP microscaling): 4-bit e2m1 values with one e8m0 scale per 32 of them, 4.25
bits, as gpt-oss checkpoints ship their experts; attention, routers, embeddings, LM head, norms
and every bias stay bf16 (the checkpoint's `modules_to_not_convert`), and vLLM's MXFP4 kernels
compute with 16-bit activations (W4A16)."""


MXFP4_MOE_LAYOUTS: dict[str, tuple[int, int]] = {
    "marlin": (256, 128),
    "triton": (256, 64),
    "flashinfer": (256, 256),
    "rocm": (128, 128),
    "rocm_gfx950": (256, 256),
    "unpadded": (1, 1),
}
"""How vLLM stores MXFP4 routed experts on the GPU, by kernel backend: the multiples it pads
(hidden size, intermediate size per TP rank) to, in both expert matrices, before loading (vLLM's
`Mxfp4MoEMethod.create_weights`). Marlin (GPUs without FP4 tensor cores, and Hopper when the
`triton_kernels` package is not installed, which vLLM 0.10-0.11 left to the user: vLLM issue
27672): n % 256 and k % 128,
so hidden to 256 and intermediate to 128; gpt-oss-120b on one H100 then holds 65.87 GiB of
weights, against the 65.97 GiB vLLM 0.10.1 logged ("Model loading took 65.9651 GiB",
vllm-project/vllm issue 23278). Triton on Hopper (`triton_kernels`' swizzled layout): the
intermediate size to 64 in vLLM's code and the hidden size to 256 in the swizzled layout, the
padding that matches the 64.38 GiB vLLM 0.14.1 logged for the same model and GPU (vLLM issue
33155; 64.45 GiB modelled). FlashInfer on Blackwell: both to 256. ROCm: both to 128 (256 on
gfx950, MI355X). `unpadded`: the checkpoint's own shapes."""

_HOPPER = ("H100-SXM", "H100-PCIe", "H200", "H800", "GH200-96GB", "GH200-144GB")
_BLACKWELL = ("B200", "B300", "GB200")


def default_mxfp4_moe_layout(gpu_name: str) -> str:
    """The MXFP4 expert layout vLLM picks by default on `gpu_name` (`MXFP4_MOE_LAYOUTS`):
    FlashInfer on Blackwell, Triton on Hopper (with `triton_kernels` installed, as current vLLM
    installs it), ROCm's on AMD GPUs (gfx950 on MI355X), Marlin elsewhere."""
    if gpu_name in _BLACKWELL:
        return "flashinfer"
    if gpu_name in _HOPPER:
        return "triton"
    if gpu_name == "MI355X":
        return "rocm_gfx950"
    if gpu_name.startswith("MI"):
        return "rocm"
    return "marlin"


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def dtype_bytes(dtype: str) -> float:
    """Bytes per element of a dtype name (an expert-only format: per expert weight); ConfigError
    for an unknown name."""
    b = EXPERT_ONLY_DTYPES.get(dtype)
    if b is not None:
        return b
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        known = ", ".join(sorted([*DTYPE_BYTES, *EXPERT_ONLY_DTYPES]))
        raise ConfigError(f"unknown dtype {dtype!r}; known dtypes: {known}") from None


def linear_dtype(weight_dtype: str) -> str:
    """The dtype of the linear layers other than routed experts under weight dtype
    `weight_dtype`: bf16 for an expert-only format, else the weight dtype itself."""
    return "bf16" if weight_dtype in EXPERT_ONLY_DTYPES else weight_dtype


def pp_stage_layers(num_layers: int, pp: int) -> tuple[int, ...]:
    """Number of decoder layers on each pipeline stage, split as vLLM's `get_pp_indices` does.

    Every stage gets `num_layers // pp` layers; the remainder goes one each to the stages just
    before the last (the last stage also holds the LM head, so it is kept light).
    """
    if pp < 1 or pp > num_layers:
        raise ConfigError(
            f"pipeline_parallel_size {pp} must be between 1 and the model's {num_layers} layers")
    parts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        parts[-i] += 1
    return tuple(parts)


@dataclass(frozen=True, slots=True)
class Gemm:
    """One weight matrix of a layer on one GPU: `in_features` x `out_features`, `count` copies.

    `count` > 1 only for routed experts (one matrix per expert held on the GPU). `group` says which
    roofline op the GEMM belongs to: "attn" (projections around attention), "mla_kv_b" (MLA's
    latent up-projection, applied to KV tokens rather than query tokens), "mlp" (dense MLP),
    "shared_expert", "router" (kept in bf16 by quantized checkpoints) or "expert".
    """

    name: str
    in_features: int
    out_features: int
    group: str
    count: int = 1
    bias: bool = False

    @property
    def num_params(self) -> int:
        """Parameters of all `count` copies, bias included."""
        bias = self.out_features if self.bias else 0
        return self.count * (self.in_features * self.out_features + bias)


@dataclass(frozen=True, slots=True)
class ModelArch:
    """A decoder-only transformer's architecture, immutable; built from a Hugging Face config.

    Covers grouped-query attention (Llama, Qwen, Mistral, gpt-oss), multi-head latent attention
    (MLA, DeepSeek-V2/V3) and mixture-of-experts MLPs (Mixtral, Qwen-MoE, DeepSeek, gpt-oss). Every
    MLP is a gated (SwiGLU) MLP: gate and up projections of `hidden_size` x `intermediate`, down
    projection back. Layer i uses the MoE MLP when `is_moe` and `i >= first_k_dense_layers` and
    `i % moe_layer_freq == 0` (DeepSeek's rule), else the dense MLP of `intermediate_size`.
    Layers listed in `sliding_window_layers` attend over the last `sliding_window` keys only
    (gpt-oss alternates them with full-attention layers); their KV cache is the same size per token
    but vLLM keeps only the window of it (`simcore.engine.hybrid_kv.HybridKVCacheManager`).
    Attention sinks (gpt-oss: one learned logit per query head joining each softmax) add
    `num_attention_heads` parameters per layer and a few operations per query and head, nothing
    measurable beside the attention kernel: they are counted as parameters and not timed.
    Sharding follows vLLM: attention heads, MLPs, experts and the vocabulary split over tensor
    parallelism (TP); KV heads replicated when TP exceeds them; norms, MoE routers and MLA's
    down-projections (q_a, kv_a) replicated on every TP rank.
    """

    name: str
    """Model identifier, e.g. the Hugging Face repository name."""
    num_layers: int
    """Decoder layers (`num_hidden_layers`)."""
    hidden_size: int
    """Residual stream width."""
    num_attention_heads: int
    """Query heads."""
    num_kv_heads: int
    """Key/value heads (GQA); equal to `num_attention_heads` for MHA. Unused by MLA."""
    head_dim: int
    """Width of one attention head (standard attention)."""
    intermediate_size: int
    """Intermediate width of the dense MLP (dense layers of a MoE model)."""
    vocab_size: int
    """Vocabulary size: rows of the embedding and of the LM head."""
    max_position_embeddings: int
    """Longest sequence the model supports (the default max_model_len)."""
    tie_word_embeddings: bool = False
    """LM head shares the embedding matrix."""
    qkv_bias: bool = False
    """Q, K and V projections have biases (Qwen2)."""
    qk_norm: bool = False
    """Per-head RMSNorm on queries and keys (Qwen3)."""
    num_experts: int = 0
    """Routed experts per MoE layer; 0 for a dense model."""
    num_experts_per_tok: int = 0
    """Routed experts each token is sent to (top-k)."""
    moe_intermediate_size: int = 0
    """Intermediate width of one routed expert."""
    num_shared_experts: int = 0
    """Experts every token goes through in a MoE layer (DeepSeek, Qwen2-MoE)."""
    shared_expert_intermediate_size: int = 0
    """Intermediate width of one shared expert."""
    shared_expert_gate: bool = False
    """A sigmoid gate (hidden_size -> 1) scales the shared expert output (Qwen2-MoE)."""
    router_bias: bool = False
    """The router has a per-expert bias (DeepSeek-V3's score correction, gpt-oss's linear bias)."""
    first_k_dense_layers: int = 0
    """Leading layers that use the dense MLP (DeepSeek's `first_k_dense_replace`)."""
    moe_layer_freq: int = 1
    """Every moe_layer_freq-th layer (after the first k) is a MoE layer."""
    kv_lora_rank: int = 0
    """MLA: width of the compressed KV latent; 0 means standard attention."""
    q_lora_rank: int = 0
    """MLA: width of the compressed query latent; 0 means queries are projected directly."""
    qk_rope_head_dim: int = 0
    """MLA: rotary part of each query/key head (shared by all heads for keys)."""
    qk_nope_head_dim: int = 0
    """MLA: non-rotary part of each query/key head."""
    v_head_dim: int = 0
    """MLA: width of each value head."""
    o_bias: bool = False
    """The attention output projection has a bias (gpt-oss)."""
    expert_bias: bool = False
    """The routed experts' gate+up and down projections have biases (gpt-oss)."""
    attention_sinks: bool = False
    """One learned sink logit per query head joins each attention softmax (gpt-oss)."""
    sliding_window: int = 0
    """Keys a query of a sliding-window layer attends over, its own included; 0 when no layer
    uses a sliding window."""
    sliding_window_layers: tuple[int, ...] = ()
    """0-based indices of the layers with sliding-window attention (the others attend over the
    whole context)."""
    chat_format: str = "jinja"
    """How vLLM turns a chat request into a prompt: "jinja", the checkpoint's Hugging Face chat
    template (most models); "harmony", OpenAI's harmony encoding (gpt-oss), rendered without a
    Jinja template."""
    checkpoint_dtype: str | None = None
    """The weight dtype (`model.dtype`'s values) the checkpoint is quantized in, which vLLM
    follows when it loads it (the config's `quantization_config`): e.g. fp8_block for
    DeepSeek-V3, mxfp4 for gpt-oss; None for a 16-bit checkpoint, or a quantization the
    simulator has no dtype for."""
    num_mtp_layers: int = 0
    """Multi-token-prediction layers shipped beside the model (DeepSeek-V3's
    `num_nextn_predict_layers`): not part of the forward pass, used only as a speculative
    decoding drafter (method mtp)."""

    def __post_init__(self) -> None:
        positive = ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim",
                    "vocab_size", "max_position_embeddings", "moe_layer_freq")
        for field_name in positive:
            if getattr(self, field_name) <= 0:
                raise ConfigError(f"model {self.name}: {field_name} must be positive")
        if self.intermediate_size < 0:
            raise ConfigError(f"model {self.name}: intermediate_size must not be negative")
        if self.num_attention_heads % self.num_kv_heads:
            raise ConfigError(f"model {self.name}: num_attention_heads "
                              f"({self.num_attention_heads}) is not a multiple of num_kv_heads "
                              f"({self.num_kv_heads})")
        if self.is_moe and not (0 < self.num_experts_per_tok <= self.num_experts
                                and self.moe_intermediate_size > 0):
            raise ConfigError(f"model {self.name}: a MoE model needs 0 < num_experts_per_tok <= "
                              "num_experts and a positive moe_intermediate_size")
        if self.is_mla and not (self.qk_rope_head_dim > 0 and self.qk_nope_head_dim > 0
                                and self.v_head_dim > 0):
            raise ConfigError(f"model {self.name}: MLA needs positive qk_rope_head_dim, "
                              "qk_nope_head_dim and v_head_dim")
        if self.chat_format not in ("jinja", "harmony"):
            raise ConfigError(f"model {self.name}: chat_format must be jinja or harmony, not "
                              f"{self.chat_format!r}")
        if self.sliding_window_layers:
            if self.sliding_window <= 0:
                raise ConfigError(f"model {self.name}: sliding-window layers need a positive "
                                  "sliding_window")
            if self.is_mla:
                raise ConfigError(f"model {self.name}: sliding-window MLA layers are not "
                                  "modelled")
            if any(not 0 <= i < self.num_layers for i in self.sliding_window_layers) or \
                    list(self.sliding_window_layers) != sorted(set(self.sliding_window_layers)):
                raise ConfigError(f"model {self.name}: sliding_window_layers must be distinct, "
                                  f"increasing layer indices below {self.num_layers}")

    # --- kinds of model and layer ---------------------------------------------------------------

    @property
    def is_moe(self) -> bool:
        """Some layers use a mixture-of-experts MLP."""
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        """Attention is multi-head latent attention (compressed KV cache)."""
        return self.kv_lora_rank > 0

    def is_moe_layer(self, layer_idx: int) -> bool:
        """Layer `layer_idx` (0-based) uses the MoE MLP."""
        return (self.is_moe and layer_idx >= self.first_k_dense_layers
                and layer_idx % self.moe_layer_freq == 0)

    def num_moe_layers(self, first_layer: int = 0, num_layers: int | None = None) -> int:
        """MoE layers among `num_layers` layers starting at `first_layer` (default: all layers)."""
        stop = self.num_layers if num_layers is None else first_layer + num_layers
        return sum(1 for i in range(first_layer, stop) if self.is_moe_layer(i))

    @property
    def num_sliding_layers(self) -> int:
        """Layers with sliding-window attention."""
        return len(self.sliding_window_layers)

    @property
    def qk_head_dim(self) -> int:
        """Width of one query/key head: head_dim, or nope + rope for MLA."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim if self.is_mla else self.head_dim

    # --- sharding ------------------------------------------------------------------------------

    def check_tp(self, tp: int) -> None:
        """Raise ConfigError unless vLLM can shard this model over `tp` GPUs."""
        if tp < 1:
            raise ConfigError(f"tensor_parallel_size must be at least 1, got {tp}")
        if self.num_attention_heads % tp:
            raise ConfigError(f"model {self.name}: tensor_parallel_size {tp} does not divide the "
                              f"{self.num_attention_heads} attention heads")
        if not self.is_mla and tp > self.num_kv_heads and tp % self.num_kv_heads:
            raise ConfigError(f"model {self.name}: tensor_parallel_size {tp} is neither a divisor "
                              f"nor a multiple of the {self.num_kv_heads} KV heads")
        dense = self.num_layers - self.num_moe_layers()
        if dense and self.intermediate_size % tp:
            # vLLM shards the MLP's columns evenly (MergedColumnParallelLinear asserts it).
            raise ConfigError(f"model {self.name}: tensor_parallel_size {tp} does not divide the "
                              f"intermediate_size {self.intermediate_size}")

    def kv_heads_per_gpu(self, tp: int = 1) -> int:
        """KV heads held by one TP rank: max(1, kv_heads // tp) (replicated when tp > kv_heads)."""
        return max(1, self.num_kv_heads // tp)

    # --- GEMMs ---------------------------------------------------------------------------------

    def attention_gemms(self, tp: int = 1) -> tuple[Gemm, ...]:
        """Weight matrices of one layer's attention block on one of `tp` ranks."""
        h = self.hidden_size
        heads = self.num_attention_heads // tp
        if self.is_mla:
            gemms = []
            if self.q_lora_rank:
                gemms.append(Gemm("q_a_proj", h, self.q_lora_rank, "attn"))
                gemms.append(Gemm("q_b_proj", self.q_lora_rank, heads * self.qk_head_dim, "attn"))
            else:
                gemms.append(Gemm("q_proj", h, heads * self.qk_head_dim, "attn"))
            gemms.append(Gemm("kv_a_proj_with_mqa", h, self.kv_lora_rank + self.qk_rope_head_dim,
                              "attn"))
            gemms.append(Gemm("kv_b_proj", self.kv_lora_rank,
                              heads * (self.qk_nope_head_dim + self.v_head_dim), "mla_kv_b"))
            gemms.append(Gemm("o_proj", heads * self.v_head_dim, h, "attn"))
            return tuple(gemms)
        kv = self.kv_heads_per_gpu(tp) * self.head_dim
        return (Gemm("q_proj", h, heads * self.head_dim, "attn", bias=self.qkv_bias),
                Gemm("k_proj", h, kv, "attn", bias=self.qkv_bias),
                Gemm("v_proj", h, kv, "attn", bias=self.qkv_bias),
                Gemm("o_proj", heads * self.head_dim, h, "attn", bias=self.o_bias))

    def mlp_gemms(self, layer_idx: int, tp: int = 1, ep: int = 1) -> tuple[Gemm, ...]:
        """Weight matrices of layer `layer_idx`'s MLP on one GPU.

        Without expert parallelism (`ep` = 1) every routed expert is split over the `tp` ranks.
        With `ep` > 1 the routed experts are split whole over `ep` GPUs (vLLM's EP: each GPU
        holds ceil(num_experts / ep) unsharded experts); shared experts stay TP-sharded.
        """
        h = self.hidden_size
        if not self.is_moe_layer(layer_idx):
            inter = self.intermediate_size // tp
            return (Gemm("gate_up_proj", h, 2 * inter, "mlp"), Gemm("down_proj", inter, h, "mlp"))
        gemms = [Gemm("gate", h, self.num_experts, "router", bias=self.router_bias)]
        if self.num_shared_experts:
            inter = self.num_shared_experts * self.shared_expert_intermediate_size // tp
            gemms.append(Gemm("shared_gate_up_proj", h, 2 * inter, "shared_expert"))
            gemms.append(Gemm("shared_down_proj", inter, h, "shared_expert"))
            if self.shared_expert_gate:
                gemms.append(Gemm("shared_expert_gate", h, 1, "router"))
        if ep > 1:
            count = -(-self.num_experts // ep)
            inter = self.moe_intermediate_size
        else:
            count = self.num_experts
            inter = self.moe_intermediate_size // tp
        gemms.append(Gemm("experts_gate_up_proj", h, 2 * inter, "expert", count=count,
                          bias=self.expert_bias))
        gemms.append(Gemm("experts_down_proj", inter, h, "expert", count=count,
                          bias=self.expert_bias))
        return tuple(gemms)

    def norm_params_per_layer(self) -> int:
        """Norm weights of one layer (replicated on every TP rank)."""
        n = 2 * self.hidden_size
        if self.qk_norm:
            n += 2 * self.head_dim
        if self.is_mla:
            n += self.kv_lora_rank + self.q_lora_rank
        return n

    def sink_params_per_layer(self, tp: int = 1) -> int:
        """Attention-sink logits of one layer on one of `tp` ranks (one per query head)."""
        return self.num_attention_heads // tp if self.attention_sinks else 0

    # --- parameter counts ------------------------------------------------------------------------

    @property
    def embedding_params(self) -> int:
        """Parameters of the token embedding."""
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """Parameters of the LM head (0 when tied to the embedding)."""
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    def layer_params(self, layer_idx: int) -> int:
        """All parameters of one decoder layer."""
        gemms = self.attention_gemms() + self.mlp_gemms(layer_idx)
        return (sum(g.num_params for g in gemms) + self.norm_params_per_layer()
                + self.sink_params_per_layer())

    def layer_active_params(self, layer_idx: int) -> int:
        """Parameters one token passes through in one layer (top-k routed experts only)."""
        total = self.layer_params(layer_idx)
        if not self.is_moe_layer(layer_idx):
            return total
        per_expert = sum(g.num_params for g in self.mlp_gemms(layer_idx) if g.group == "expert")
        per_expert //= self.num_experts
        return total - (self.num_experts - self.num_experts_per_tok) * per_expert

    @property
    def num_params(self) -> int:
        """Total parameters (embedding, layers, final norm, LM head), as a checkpoint holds them."""
        layers = sum(self.layer_params(i) for i in range(self.num_layers))
        return self.embedding_params + layers + self.hidden_size + self.lm_head_params

    @property
    def num_active_params(self) -> int:
        """Parameters used per token: as `num_params`, with only top-k routed experts counted."""
        layers = sum(self.layer_active_params(i) for i in range(self.num_layers))
        return self.embedding_params + layers + self.hidden_size + self.lm_head_params

    # --- weight bytes ----------------------------------------------------------------------------

    def _gemm_bytes(self, gemm: Gemm, dtype: str,
                    expert_align: tuple[int, int] = (1, 1)) -> float:
        """Bytes of one Gemm entry: linear layers in `dtype`, routers in bf16 below 16 bits; under
        an expert-only format the routed experts' weights in it, all else in bf16, with the
        experts' hidden and intermediate dimensions padded to `expert_align`
        (`MXFP4_MOE_LAYOUTS`)."""
        if dtype in EXPERT_ONLY_DTYPES:
            if gemm.group != "expert":
                return gemm.num_params * _HIGH_PRECISION_BYTES
            h_mult, i_mult = expert_align
            if gemm.name == "experts_gate_up_proj":         # hidden -> 2 x inter
                rows = _round_up(self.hidden_size, h_mult)
                cols = 2 * _round_up(gemm.out_features // 2, i_mult)
            else:                                           # down_proj: inter -> hidden
                rows = _round_up(gemm.in_features, i_mult)
                cols = _round_up(self.hidden_size, h_mult)
            weights = gemm.count * rows * cols
            bias = gemm.count * cols if gemm.bias else 0
            return weights * EXPERT_ONLY_DTYPES[dtype] + bias * _HIGH_PRECISION_BYTES
        b = dtype_bytes(dtype)
        if gemm.group == "router" and b < _HIGH_PRECISION_BYTES:
            b = _HIGH_PRECISION_BYTES
        return gemm.num_params * b

    def _other_bytes_per_elem(self, dtype: str) -> float:
        """Bytes per element of embeddings, LM head and norms under weight dtype `dtype`."""
        return max(dtype_bytes(dtype), _HIGH_PRECISION_BYTES)

    def weight_bytes(self, dtype: str) -> float:
        """Bytes of the whole model's weights stored in `dtype`.

        For a sub-16-bit dtype (fp8, int8, int4) only the linear layers (attention projections,
        MLPs, experts) are quantized: embeddings, LM head, norms and MoE routers stay in bf16, as
        real fp8 checkpoints (e.g. DeepSeek-V3, Llama-3.1-FP8) store them. Per-block scale factors
        (about 0.02% for 128x128 blocks) are not counted. An expert-only format
        (`EXPERT_ONLY_DTYPES`, e.g. mxfp4) quantizes the routed experts' weights alone, its
        scales included; their biases and everything else stay bf16.
        """
        return self.stage_weight_bytes(dtype, tp=1, pp=1, stage=0)

    def stage_weight_bytes(self, dtype: str, tp: int = 1, pp: int = 1, stage: int = 0,
                           ep: int = 1, expert_align: tuple[int, int] = (1, 1)) -> float:
        """Bytes of weights on one GPU of pipeline stage `stage` (0-based) under TP `tp`, PP `pp`.

        The first stage holds the embedding, the last the LM head and final norm (with tied
        embeddings and pp > 1 both ends hold a copy); the vocabulary is split over TP. `ep` > 1
        splits routed experts whole over `ep` GPUs instead of sharding each over TP. Under an
        expert-only format the experts are stored padded to `expert_align` (hidden,
        intermediate per rank), as vLLM's kernels lay them out (`MXFP4_MOE_LAYOUTS`).
        """
        self.check_tp(tp)
        layers = pp_stage_layers(self.num_layers, pp)
        first = sum(layers[:stage])
        other = self._other_bytes_per_elem(dtype)
        total = 0.0
        for i in range(first, first + layers[stage]):
            for g in self.attention_gemms(tp) + self.mlp_gemms(i, tp, ep):
                total += self._gemm_bytes(g, dtype, expert_align)
            total += self.norm_params_per_layer() * other
            if self.attention_sinks:
                total += self.sink_params_per_layer(tp) * other
        vocab_shard = self.embedding_params / tp
        if stage == 0:
            total += vocab_shard * other
        if stage == pp - 1:
            total += self.hidden_size * other
            if not self.tie_word_embeddings or pp > 1:
                total += vocab_shard * other
        return total

    def weight_bytes_per_gpu(self, dtype: str, tp: int = 1, pp: int = 1, ep: int = 1) -> float:
        """Bytes of weights on the most loaded GPU (vLLM sizes the KV cache by that rank)."""
        return max(self.stage_weight_bytes(dtype, tp, pp, s, ep) for s in range(pp))

    # --- KV cache --------------------------------------------------------------------------------

    def kv_elems_per_token_per_layer(self, tp: int = 1) -> int:
        """KV-cache elements one token occupies in one layer on one TP rank.

        Standard attention: 2 (K and V) x max(1, kv_heads // tp) x head_dim. MLA: the latent
        (kv_lora_rank) plus the shared rotary key (qk_rope_head_dim), not split over TP: vLLM
        keeps the whole latent cache on every TP rank.
        """
        if self.is_mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.kv_heads_per_gpu(tp) * self.head_dim

    def kv_bytes_per_token(self, kv_dtype: str, tp: int = 1,
                           num_layers: int | None = None) -> float:
        """KV-cache bytes of one token on one GPU holding `num_layers` layers (default all)."""
        layers = self.num_layers if num_layers is None else num_layers
        return layers * self.kv_elems_per_token_per_layer(tp) * dtype_bytes(kv_dtype)

    def model_kv_bytes_per_token(self, kv_dtype: str) -> float:
        """KV-cache bytes of one token for the whole model, without TP replication.

        This is what a token's KV costs to move between engines (P/D disaggregation, a KV tier).
        """
        return self.kv_bytes_per_token(kv_dtype, tp=1)
