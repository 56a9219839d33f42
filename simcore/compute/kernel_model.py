"""A step-time model from a kernel profile: every op vLLM runs as a measured kernel timed by the
measurements of that kernel; the rest by the roofline reference, each such part named.

From the kernel profile (`simcore.calibration.kernels`), per layer and summed over the layers
that have the op:
- every linear layer at its per-GPU shape and weight dtype: QKV and output projections, dense
  MLP gate+up and down, MoE routers (16-bit) and shared experts, and the LM head (16-bit, one
  row per scheduled sequence), from the GEMM grid;
- the attention kernel of the mixed batch as the sum of its two parts: the decode sequences from
  the generation grid at their count and mean KV length, the prefilling sequences from the
  context grid at their count and the prompt length with the same causal query-key pairs (a
  chunk over a cached prefix costs the pairs it computes); sliding-window layers from the
  sliding-window grids of their window, mapped the same way, where the profile measured them,
  else from the full-attention grids at the step's window view
  (`simcore.compute.attention_views.windowed_attention`): decodes at their mean KV length within the
  window, prefills at the prompts that keep both their tokens and the window's query-key pairs
  (`windowed_prefill_s`);
- MLA models (DeepSeek-V3 style): vLLM's whole MLA attention module of each layer (down- and
  up-projections, latent norms, rotary, KV-cache write, attention, output projection: see
  `simcore.calibration.mla`) from the module tables of its heads per GPU, weight and KV-cache
  dtype, mapped as `mla_attention_s` says; the projections, latent norms and rotary pass are then
  not timed again elsewhere;
- routed experts from the fused-MoE curve of the model's MoE shape and expert weight format
  (`moe_dtype`: mxfp4 experts from the W4A16 MXFP4 tables), experts split by TP; MXFP4 experts
  laid out for a backend whose kernels measured other shapes only (Marlin on Hopper) from
  those, moved to the model's shape (`_other_backend`, `derived_experts`);
- TP all-reduces (2 per layer + 1) from vLLM's all-reduce curve of the TP group, in CUDA-graph
  mode for steps up to the graph capture size, eager beyond; the logits all-gather before
  sampling from NCCL's all-gather curve (the whole vocabulary of every sequence).

Derived from a measured kernel, named in `assumed_parts()`: the passes the database never
measured (norms, rotary, activation, residual adds, embedding, MoE top-k routing; the sampler's
fp32 cast and sampling passes over the logits) as separate memory-bound kernels, each timed by
the GPU's measured memory-bound kernel (vLLM's static fp8 quantization, a single read-and-write
pass) at the bytes it moves. With them the step's CPU side (the host model, or the declared
per-step overhead) and the declared launch time of steps outside full CUDA graphs.

From the roofline, named in `fallbacks()`: PP hops, routed experts under expert parallelism
(timed over the whole group), anything whose shape or dtype the profile did not measure (e.g. a
GPU without a memory-bound kernel measurement times the passes above by the roofline; MLA's
projections, latent up-projection and attention where the profile has no module table of the
model's layer shape, heads per GPU, weight or KV-cache dtype, e.g. A100's).

Each op class's error bound is the 90th-percentile held-out error of the tables it uses (the
roofline's declared bound for a class with any roofline part).
"""

from __future__ import annotations


from simcore.calibration.kernels import HOST_BOUND_RATIO, MOE_ROUTINGS, KernelProfile
from simcore.calibration.mla import module_shape
from simcore.calibration.moe_transfer import (
    KERNEL_BACKENDS, SECOND_FRAMEWORK, backend_tables, measured_shapes)
from simcore.calibration.triton_attention import context_ratio
from simcore.compute.base import OP_CLASSES, StepShape
from simcore.compute.calibrated import MeasuredModel, _memo
from simcore.compute.derived_kernels import (
    WEIGHT_ONLY_ERROR,
    derived_experts,
    marlin_framework_error,
    weight_only,
    weight_only_ratio,
)
from simcore.compute.attention_views import prompt_len, windowed_attention
from simcore.hardware import GpuSpec
from simcore.model.arch import EXPERT_ONLY_DTYPES, Gemm, ModelArch, dtype_bytes, linear_dtype


def gemm_dtype(weight_dtype: str) -> str:
    """The GEMM and fused-MoE tables of a weight dtype: 16-bit floats share the bf16
    measurements; int4 weight-only is the tables' int4_wo."""
    if weight_dtype in ("bf16", "fp16"):
        return "bf16"
    return "int4_wo" if weight_dtype == "int4" else weight_dtype


SINK_KERNELS = ("_fa3", "_fa4", "trtllm")
"""Marks of the measured attention kernels (AIConfigurator's names) that run attention sinks:
vLLM's FlashAttention backend takes sinks from FlashAttention 3 on, and FlashInfer's through its
TRT-LLM kernels (Blackwell). A GPU whose profile has none of them (FlashAttention 2, FlashInfer's
own kernels) serves a model with sinks, gpt-oss, with vLLM's Triton backend instead (vLLM's
gpt-oss recipe: "GPT-OSS works on Ampere devices by default, using the TRITON_ATTN attention
backend", https://docs.vllm.ai/projects/recipes/en/latest/OpenAI/GPT-OSS.html)."""

TRITON_SINKS = "vLLM runs them on this GPU with its Triton attention backend (TRITON_ATTN)"

_MOE_TABLES = {"mxfp4": "mxfp4_w4a16"}
"""The fused-MoE table of an expert-only weight format: vLLM runs gpt-oss's MXFP4 experts with
16-bit activations (W4A16) by default, on Hopper with OpenAI's triton kernels, on Blackwell with
FlashInfer's TRT-LLM kernel, on Ada (L40S) with Marlin; AIConfigurator measured each of those as
`w4a16_mxfp4`."""


def _other_backend(profile: KernelProfile, mdt: str, arch, tp: int, routing: str,
                   weight_dtype: str, layout: str | None) -> bool:
    """Whether MXFP4 experts laid out for a kernel backend (`layout`, `model.mxfp4_moe_layout`)
    have a measurement of their own shape made with another backend's kernels while the profile
    measured that backend's on at least two other models of this GPU (`backend_tables`): then
    vLLM ran the layout's backend, and its measurements, moved to this shape (`derived_experts`),
    time them. Marlin on Hopper: vLLM 0.10-0.11 ran gpt-oss's experts in Marlin there unless the
    user installed `triton_kernels` (vLLM issue 27672), and the H100 and H200 profiles measured
    gpt-oss's shapes with the Triton kernels only (as B200's, with FlashInfer's, where a config
    names Marlin's layout). For gpt-oss-120b on H100 Marlin's kernels come out at 0.7-0.9 times
    the Triton measurement from 1 to 16 tokens and 1.7-2.0 times it at 4,096-8,192 (gpt-oss-20b:
    1.35-1.5 and 1.8-1.9 times)."""
    if weight_dtype != "mxfp4" or layout not in KERNEL_BACKENDS:
        return False
    kernel = profile.moe_kernel((mdt, arch.hidden_size, arch.moe_intermediate_size,
                                 arch.num_experts_per_tok, arch.num_experts, tp, 1, routing))
    # Two models at least: one predicted from the other bounds the move (`leave_one_out`).
    return bool(kernel) and layout not in kernel and len(
        {k[1:5] for k in measured_shapes(profile, backend_tables(mdt, layout), routing,
                                         layout)}) >= 2


def moe_dtype(weight_dtype: str) -> str:
    """The fused-MoE tables of a weight dtype: an expert-only format's own, else the GEMM
    tables' dtype."""
    return _MOE_TABLES.get(weight_dtype) or gemm_dtype(weight_dtype)


_TABLE_WEIGHTS = {table: weight for weight, table in _MOE_TABLES.items()} | {
    "int4_wo": "int4", "w4a8_mxfp4_mxfp8": "mxfp4"}
"""Tables named otherwise than their weight dtype: `moe_dtype`'s and `gemm_dtype`'s, inverted,
and a measured table no weight dtype selects (MXFP4 experts with MXFP8 activations)."""


def table_weight_dtype(table: str) -> str:
    """The weight dtype of a GEMM or fused-MoE table (what its weights' bytes are)."""
    return _TABLE_WEIGHTS.get(table, table)


def kv_dtype(kv_cache_dtype: str) -> str:
    """The attention table of a KV-cache dtype."""
    return "fp8" if kv_cache_dtype.startswith("fp8") else "bf16"


def _fuse_qkv(gemms: tuple[Gemm, ...]) -> tuple[Gemm, ...]:
    """The q, k and v projections as the one GEMM vLLM runs, the others as they are."""
    qkv = [g for g in gemms if g.name in ("q_proj", "k_proj", "v_proj")]
    if len(qkv) != 3:
        return gemms
    fused = Gemm("qkv_proj", qkv[0].in_features, sum(g.out_features for g in qkv), "attn",
                 bias=qkv[0].bias)
    return (fused,) + tuple(g for g in gemms if g not in qkv)


DEFAULT_MOE_ROUTING = "power_law_1.2"
"""The fused-MoE tables' routing a MoE model is timed with when `compute.moe_routing` is not set
(`simcore.calibration.kernels.MOE_ROUTINGS`): the one with the smallest error on the fit part of
the end-to-end validation set's mixture-of-experts cases (`moe_routing_objective` in
simcore/data/cpu_costs/fitted.json, written by scripts/fit_host_overheads.py)."""

_CAST_BYTES_PER_LOGIT = 6.0
"""The sampler's first pass: the logits cast to fp32 (16-bit read, 32-bit written)."""

_KERNEL_TRANSFER_ERROR = 0.35
"""Error bound of timing a pass by another memory-bound kernel's measured time at the same
bytes: the roofline's declared bound (vLLM's norm, rotary and activation kernels were not measured
on these GPUs; older vLLM's, measured on H100 by Vidur, took from 0.9x to 5x the quantization
kernel's time at the same bytes: `dse calibrate --list`)."""


def elementwise_passes(arch: ModelArch, tp: int, *, routed_experts: bool,
                       act_bytes: float = 2.0,
                       mla_module: bool = False) -> list[tuple[int, float]]:
    """The memory-bound kernels of one step outside the GEMMs, attention and (unless
    `routed_experts`) the fused-MoE layer, as (kernels per step, bytes each moves per token):
    embedding gather, per layer two fused residual-add + RMSNorms (read x and residual, write
    both) and the rotary embedding on q and k, the gated activation of each dense MLP (and of
    shared experts), MoE top-k routing, MLA's latent norms, the final norm. `mla_module`: the
    rotary pass and the latent norms are inside a measured MLA module, not separate passes."""
    h = arch.hidden_size
    layers, moe = arch.num_layers, arch.num_moe_layers()
    dense = layers - moe
    if arch.is_mla:
        heads = arch.num_attention_heads // tp
        rope = heads * arch.qk_rope_head_dim + arch.qk_rope_head_dim
    else:
        rope = (arch.num_attention_heads // tp + arch.kv_heads_per_gpu(tp)) * arch.head_dim
    inside = arch.is_mla and mla_module
    out = [(1, 2 * h * act_bytes), (2 * layers, 4 * h * act_bytes)]
    if not inside:
        out.append((layers, 2 * rope * act_bytes))
    out.append((1, 3 * h * act_bytes))
    if dense:
        out.append((dense, 3 * (arch.intermediate_size // tp) * act_bytes))
    if arch.is_mla and not inside:
        out += [(layers, 2 * arch.q_lora_rank * act_bytes),
                (layers, 2 * arch.kv_lora_rank * act_bytes)]
    if moe:
        k = arch.num_experts_per_tok
        out.append((moe, arch.num_experts * (act_bytes + 4) + 8 * k))   # top-k softmax
        shared = arch.num_shared_experts * arch.shared_expert_intermediate_size // tp
        if shared:
            out.append((moe, 3 * shared * act_bytes))
        if routed_experts:      # inside the fused-MoE measurement otherwise
            out += [(moe, 3 * k * (arch.moe_intermediate_size // tp) * act_bytes),
                    (moe, (k + 1) * h * act_bytes)]
    return out


def _none_s(tokens: int) -> float:
    """No time of its own: a part timed inside another measured kernel."""
    return 0.0


_MLA_WEIGHTS = {"bf16": "bf16", "fp16": "bf16", "fp8_block": "fp8_block", "nvfp4": "nvfp4",
                "fp8": "fp8_block"}
"""The MLA module table of a weight dtype. vLLM's MLA module was measured with bf16, 128x128
block-scaled fp8 and nvfp4 linear layers; per-tensor fp8 layers are timed by the block-scaled
ones (the same fp8 tensor-core GEMMs, one scale per tensor instead of per block), said so."""


def mla_tables(profile: KernelProfile, arch: ModelArch, tp: int, kv_cache: str,
               weight_dtype: str):
    """((generation grid, context grid, weight dtype of the tables), None) of the MLA module
    of `arch` at TP `tp`, or (None, why not)."""
    keys = profile.mla_keys()
    if not keys:
        return None, "no MLA module measurements in the kernel profile"
    shape, heads = module_shape(arch), arch.num_attention_heads // tp
    if not any(k[4] == shape for k in keys):
        return None, ("the profile's MLA module measurements are of another layer shape "
                      "(hidden, latent or head widths)")
    gd = _MLA_WEIGHTS.get(weight_dtype)
    if gd is None or not any(k[2] == gd for k in keys):
        return None, f"no MLA module measurements with {weight_dtype} weights"
    gen = profile.mla_grid("generation", kv_cache, gd, heads, shape)
    ctx = profile.mla_grid("context", kv_cache, gd, heads, shape)
    if gen is None or ctx is None:
        return None, (f"no MLA module measurements with a {kv_cache} KV cache and {gd} weights "
                      f"at {heads} heads per GPU")
    return (gen, ctx, gd), None


def windowed_prefill_s(ctx, num_tokens: float, pairs: float, floor: float) -> float:
    """Attention of prefill chunks of `num_tokens` tokens and `pairs` query-key pairs in a
    sliding-window layer, seconds, from the full-attention context grid `ctx` (batch, length) and
    its one-token time `floor`: b prompts of s tokens with b s = num_tokens and
    b s (s + 1) / 2 = pairs (s = 2 pairs / num_tokens - 1, about twice the window for a long
    chunk); for b < 1 (a short chunk over a context past the window) linear in b between the
    one-token time and one prompt of s tokens, never less than the chunk as one prompt.

    Keeping both tokens and pairs is what matches vLLM's measured sliding-window kernel:
    AIConfigurator's window-128 context rows on H100 (FlashAttention-3, 64/8 and 32/4 heads of
    dim 64) against the full-attention grid so mapped: median -5% and -2%, 10th-90th percentile
    -12% to +5%; at the prompt length with the same pairs alone, median -24%, 10th percentile -70%.
    """
    s = max(2.0 * pairs / num_tokens - 1.0, 1.0)
    b = num_tokens / s
    if b >= 1.0:
        return ctx(b, s)
    return max(b * ctx(1.0, s) + (1.0 - b) * floor, ctx(1.0, num_tokens))


def mla_prefix_tokens(shape: StepShape) -> int:
    """The cached-prefix tokens of a step's prefilling sequences (context before their chunks)."""
    return shape.kv_tokens_read - shape.decode_kv_tokens - shape.num_prefill_tokens


def mla_attention_s(shape: StepShape, gen, ctx, floor: float) -> float:
    """One layer's MLA attention module over a step of `shape`, seconds, from the generation
    grid `gen` and the context grid `ctx` (batch, length) and the module's one-token time
    `floor` (the context grid at one prompt of one token).

    As for the other attention kernels, decodes and prefills are looked up apart:
    - the decode sequences: the generation grid at their count and mean KV length (their KV
      reads summed);
    - the prefilling sequences (N new tokens, P causal query-key pairs, both kept): the context
      grid at b prompts of s tokens with b s = N and b s (s + 1) / 2 = P, i.e. s = 2 P / N - 1
      (prompts of one length L with no cached prefix: b = their count, s = L, a grid cell).
      A chunk over a cached prefix longer than itself gives b < 1: then linear in b between the
      module's one-token time (b = 0) and one prompt of s tokens (b = 1): its tokens at the
      per-token time of a prompt with the same query-key pairs per token. Never less than the
      chunk's tokens as one prompt without the prefix. (vLLM also up-projects the prefix's
      latent again with `kv_b_proj` for a prefill over cached context, which the context rows,
      with no prefix, never ran: the caller adds that GEMM at `mla_prefix_tokens` rows.)
    - a step with both runs the module once (one projection, norm and rotary pass over all its
      tokens, then the decode and the prefill attention): the one-token time is counted once,
      the sum never less than either part.
    """
    d = shape.num_decode_seqs
    x = gen(d, shape.decode_kv_tokens / d) if d else 0.0
    if shape.num_seqs - d <= 0:
        return x
    n = shape.num_prefill_tokens
    pairs = shape.attn_qk_pairs - shape.decode_kv_tokens
    s = max(2.0 * pairs / n - 1.0, 1.0)
    b = n / s
    if b >= 1.0:
        y = ctx(b, s)
    else:
        y = max(b * ctx(1.0, s) + (1.0 - b) * floor, ctx(1.0, n))
    if not d:
        return y
    z = x + y - floor
    return z if z > x and z > y else max(x, y)


class KernelModel(MeasuredModel):
    """StepTimeModel with a kernel profile's measured kernels over the roofline reference."""

    __slots__ = ("moe_routing",)

    def __init__(self, arch: ModelArch, gpu: GpuSpec, *, profile: KernelProfile, tp: int = 1,
                 pp: int = 1, weight_dtype: str = "bf16", kv_cache_dtype: str = "bf16",
                 assumptions=None, sequence_parallel_moe: bool = False,
                 multi_node_tp: bool = False, op_scale: dict[str, float] | None = None,
                 host=None, moe_routing: str | None = None,
                 compute_bound_scale: float = 1.0, mxfp4_moe_layout: str | None = None,
                 collective_skew_s: float = 0.0,
                 graphless_collective_scale: float = 1.0, expert_parallel: bool = False) -> None:
        super().__init__(arch, gpu, tp=tp, pp=pp, weight_dtype=weight_dtype,
                         kv_cache_dtype=kv_cache_dtype, assumptions=assumptions,
                         sequence_parallel_moe=sequence_parallel_moe,
                         multi_node_tp=multi_node_tp, op_scale=op_scale, host=host,
                         compute_bound_scale=compute_bound_scale,
                         collective_skew_s=collective_skew_s,
                         graphless_collective_scale=graphless_collective_scale)
        self._check_gpu(profile, gpu)
        self.profile = profile
        self.moe_routing: str | None = None     # the routing of the MoE table used, if one is
        self.calibrated = True
        self.profile_id = profile.profile_id
        self.profile_version = f"kernels-v{profile.data.version}+sha256:{profile.digest}"
        f = self.op_scale
        self._sources = {c: set() for c in OP_CLASSES}
        self._fallbacks = []
        self._derived = []
        bounds = dict.fromkeys(OP_CLASSES, self.assumptions.relative_uncertainty)
        rough = "roofline"
        wdt = gemm_dtype(linear_dtype(weight_dtype))
        # Linear layers whose table measured the host's launch path (fp8 block-scaled) are timed
        # by the per-tensor fp8 GEMMs: the same tensor-core GEMM, per-block scales aside.
        lin = wdt
        ratio = profile.host_bound_ratio(wdt)
        if ratio is not None and ratio > HOST_BOUND_RATIO and wdt == "fp8_block" \
                and "fp8" in profile.gemm_dtypes():
            lin = "fp8"
            self._derived.append(
                f"{wdt} linear layers: the per-tensor fp8 GEMM measurements (the {wdt} table's "
                f"times up to 64 rows are {ratio:.1f}x bf16's, flat in rows: the host's launch "
                "path measured outside a CUDA graph)")
        num_layers = arch.num_layers
        num_moe = arch.num_moe_layers()
        num_dense = num_layers - num_moe

        def gemm_err(dtype: str) -> float:
            return profile.error_bound(f"gemm/{dtype}") or 0.0

        # MLA: vLLM's whole attention module, where the profile measured it for this layer.
        kvd = kv_dtype(kv_cache_dtype)
        mla, mla_why = mla_tables(profile, arch, tp, kvd, weight_dtype) if arch.is_mla \
            else (None, None)

        def curve(g, dtype: str):
            return profile.gemm_curve(dtype, g.out_features, g.in_features)

        # Linear layers whose rows are the step's tokens, per roofline group; vLLM runs the
        # query, key and value projections as one GEMM (QKVParallelLinear).
        attn = _fuse_qkv(arch.attention_gemms(tp))
        dense_idx = next((i for i in range(num_layers) if not arch.is_moe_layer(i)), None)
        moe_idx = next((i for i in range(num_layers) if arch.is_moe_layer(i)), None)
        dense_mlp = arch.mlp_gemms(dense_idx, tp) if dense_idx is not None else ()
        moe_mlp = arch.mlp_gemms(moe_idx, tp) if moe_idx is not None else ()
        members = {"attn": ([g for g in attn if g.group == "attn"], num_layers, lin),
                   "mlp": (list(dense_mlp), num_dense, lin),
                   "shared_expert": ([g for g in moe_mlp if g.group == "shared_expert"],
                                     num_moe, lin),
                   "router": ([g for g in moe_mlp if g.group == "router"], num_moe, "bf16")}
        meas = []
        gemm_errors = []
        for gi, group in enumerate(self._token_gemm_groups):
            gemms, count, dtype = members[group]
            if arch.is_mla and group == "attn":
                if mla is not None:          # inside the measured module (attention)
                    meas.append(_none_s)
                    continue
                self._sources["gemm"].add(rough)
                self._fallbacks.append(f"attn GEMMs: roofline (MLA projections: {mla_why})")
                meas.append(None)
                continue
            curves = [curve(g, dtype) for g in gemms]
            if curves and any(c is None for c in curves) and weight_only(dtype, gpu):
                # A weight-only format with no table of its own: the 16-bit GEMMs of the same
                # shapes, their weight reads scaled to the format's bytes.
                bf16 = [curve(g, "bf16") for g in gemms]
                if all(c is not None for c in bf16):
                    flop_s, fixed_s, byte_s, _ = self._token_gemms[gi]
                    r = weight_only_ratio(flop_s, fixed_s, byte_s,
                                          dtype_bytes(linear_dtype(weight_dtype)) / 2)
                    fg = f["gemm"] * count
                    meas.append(_memo(lambda t, cs=tuple(bf16), fg=fg, r=r:
                                      fg * r(t) * sum(c(t) for c in cs)))
                    self._sources["gemm"].add("derived")
                    gemm_errors.append(max(gemm_err("bf16"), WEIGHT_ONLY_ERROR))
                    self._derived.append(
                        f"{group} GEMMs with {dtype} weights (weight-only on {gpu.name}, no fp8 "
                        "tensor cores): the bf16 GEMM measurements of the same shapes, their "
                        "weight reads at the format's bytes (the roofline's ratio of the two)")
                    continue
            if not curves or any(c is None for c in curves):
                self._sources["gemm"].add(rough)
                self._fallbacks.append(f"{group} GEMMs: roofline (no {dtype} GEMM measurements)")
                meas.append(None)
                continue
            fg = f["gemm"] * count
            meas.append(_memo(lambda t, cs=tuple(curves), fg=fg: fg * sum(c(t) for c in cs)))
            self._sources["gemm"].add("measured")
            gemm_errors.append(gemm_err(dtype))
        self._token_gemm_meas = tuple(meas)
        if arch.is_mla and mla is None:
            self._sources["gemm"].add(rough)
            self._fallbacks.append(f"MLA latent up-projections: roofline ({mla_why})")
        elif mla is not None:   # the module's, not the roofline's
            self._kvb_flop_s_per_row = self._kvb_byte_s_fixed = 0.0
            self._kvb_byte_s_per_row = self._kvb_floor_s = 0.0
            # A cached prefix's latent, up-projected again for a prefill over it: a GEMM.
            kv_b = next(g for g in arch.attention_gemms(tp) if g.group == "mla_kv_b")
            up_dtype = lin if curve(kv_b, lin) is not None else "bf16"
            up = _memo(lambda t, c=curve(kv_b, up_dtype), fg=f["gemm"]: fg * c(t))
            gemm_errors.append(gemm_err(up_dtype))
        if gemm_errors and rough not in self._sources["gemm"]:
            bounds["gemm"] = max(gemm_errors)

        # The attention kernel.
        heads, kv_heads = arch.num_attention_heads // tp, arch.kv_heads_per_gpu(tp)
        # Only a model with sinks needs the profile's attention kernels.
        attn_kernels = profile.attention_kernels() if arch.attention_sinks else set()
        sinks_on_triton = bool(attn_kernels) and not any(
            m in k for k in attn_kernels for m in SINK_KERNELS)
        # vLLM's Triton kernel takes longer than FlashAttention over a prefill: the
        # full-attention layers' prefill time, measured or on the roofline, scaled by it.
        triton = context_ratio() if sinks_on_triton else None
        self._triton_context = triton
        gen = ctx = None
        if mla is not None:
            mgen, mctx, gd = mla
            fa = f["attention"] * num_layers

            def mla_attention(shape: StepShape, g=mgen, c=mctx, fl=mctx(1, 1), up=up, fa=fa,
                              layers=num_layers) -> float:
                x = fa * mla_attention_s(shape, g, c, fl)
                prefix = mla_prefix_tokens(shape)
                return x + layers * up(prefix) if prefix > 0 else x

            self._attn_meas = mla_attention
            self._sources["attention"].add("measured")
            bounds["attention"] = max(profile.error_bound(f"mla/{ph}/{kvd}/{gd}") or 0.0
                                      for ph in ("context", "generation"))
            if gd != gemm_dtype(weight_dtype):
                self._derived.append(
                    f"MLA attention modules with {weight_dtype} weights: the {gd} module "
                    "measurements (the same fp8 GEMMs, scaled per block instead of per tensor)")
        elif not arch.is_mla:
            gen = profile.attention_grid("generation", kvd, heads, kv_heads, arch.head_dim)
            ctx = profile.attention_grid("context", kvd, heads, kv_heads, arch.head_dim)
        if gen is not None and ctx is not None:
            num_sliding = arch.num_sliding_layers
            fa = f["attention"] * (num_layers - num_sliding)

            def attention(shape: StepShape, gen=gen, ctx=ctx, fa=fa, tr=triton) -> float:
                d = shape.num_decode_seqs
                x = 0.0
                if d:
                    x += gen(d, shape.decode_kv_tokens / d)
                p = shape.num_seqs - d
                if p > 0:
                    pairs = shape.attn_qk_pairs - shape.decode_kv_tokens
                    length = max(prompt_len(pairs / p), 1.0)
                    x += ctx(p, length) if tr is None else ctx(p, length) * tr(p, length)
                return fa * x

            self._attn_meas = attention
            w = arch.sliding_window
            gen_w = ctx_w = None
            if num_sliding:
                gen_w = profile.attention_grid("generation", kvd, heads, kv_heads,
                                               arch.head_dim, w)
                ctx_w = profile.attention_grid("context", kvd, heads, kv_heads, arch.head_dim, w)
            if num_sliding and gen_w is not None and ctx_w is not None:
                # The measured sliding-window kernels at the step's whole lengths (the kernel
                # limits each query to its window itself), mapped as the full-attention ones.
                def windowed(shape: StepShape, full=attention, gen_w=gen_w, ctx_w=ctx_w,
                             fw=f["attention"] * num_sliding) -> float:
                    return full(shape) + full(shape, gen_w, ctx_w, fw, None)

                self._attn_meas = windowed
            elif num_sliding:
                def windowed(shape: StepShape, full=attention, gen=gen, ctx=ctx,
                             fw=f["attention"] * num_sliding, window=w,
                             floor=ctx(1, 1)) -> float:
                    win = windowed_attention(shape, window)
                    d = win.num_decode_seqs
                    y = gen(d, win.decode_kv_tokens / d) if d else 0.0
                    if win.num_seqs > d:
                        y += windowed_prefill_s(ctx, win.num_prefill_tokens,
                                                win.attn_qk_pairs - win.decode_kv_tokens, floor)
                    return full(shape) + fw * y

                self._attn_meas = windowed
                self._derived.append(
                    f"sliding-window layers' attention ({num_sliding} of {num_layers}, window "
                    f"{w}): the full-attention tables at the step's window view (decodes at "
                    "their mean KV length within the window, prefills at the prompts keeping "
                    f"their tokens and the window's query-key pairs); no window-{w} "
                    "measurement of this head shape")
            if self._attn_meas is attention:
                # A decode-only step's measured attention: `attention` at (d, d, d, kv, kv, kv)
                # is fa x gen(d, kv / d), the grid taken along its lengths at the batch size
                # (`simcore.compute.decode_steps`).
                if gen.ndim == 2:
                    self._attn_decode = (gen, fa)
            self._sources["attention"].add("measured")
            families = [f"attention/{ph}/{kvd}" for ph in ("context", "generation")]
            if gen_w is not None and ctx_w is not None:
                families += [f"{fam}/window{w}" for fam in families]
            bounds["attention"] = max(profile.error_bound(fam) or 0.0 for fam in families)
            if sinks_on_triton:
                # The measured kernel is not the one vLLM runs: its error bound does not
                # describe the time, so the part counts as declared (the roofline's bound).
                bounds["attention"] = max(bounds["attention"],
                                          self.assumptions.relative_uncertainty)
                used = sorted({k for k in (profile.attention_kernel(ph, kvd, heads, kv_heads,
                                                                     arch.head_dim)
                                           for ph in ("context", "generation")) if k})
                self._derived.append(
                    f"attention with sinks: {TRITON_SINKS}, timed here by the profile's "
                    f"{'/'.join(used)} measurements, the full-attention layers' prefill scaled "
                    f"by {triton.describe()}; bound +/-{bounds['attention']:.0%} as declared")
        elif mla is None:
            self._sources["attention"].add(rough)
            why = (f"MLA: {mla_why}" if arch.is_mla else
                   f"no {kvd} KV-cache measurements of {heads} query / {kv_heads} KV heads of "
                   f"dim {arch.head_dim} per GPU")
            if sinks_on_triton:
                why += (f"; sinks: {TRITON_SINKS}, not measured: the full-attention layers' "
                        f"prefill scaled by {triton.describe()}")
            self._fallbacks.append(f"attention kernel: roofline ({why})")

        # Routed experts (TP-sharded; expert parallelism times them over its whole group, at
        # any DP: `simcore.compute.expert_parallel`).
        grouped = sequence_parallel_moe or expert_parallel
        if arch.is_moe:
            mdt = moe_dtype(weight_dtype)
            routings = (moe_routing,) if moe_routing else (
                DEFAULT_MOE_ROUTING, *(r for r in MOE_ROUTINGS if r != DEFAULT_MOE_ROUTING))
            moe = routing = None
            for routing in () if grouped else routings:
                moe = profile.moe_curve(mdt, arch.hidden_size, arch.moe_intermediate_size,
                                        arch.num_experts_per_tok, arch.num_experts, tp, 1,
                                        routing)
                if moe is not None:
                    break
            direct = moe
            if moe is not None and _other_backend(profile, mdt, arch, tp, routing, weight_dtype,
                                                  mxfp4_moe_layout):
                moe = None      # the layout's backend ran them: its kernels time them
            derived = None
            if moe is None and not grouped:
                derived = derived_experts(self, profile, arch, gpu, tp, weight_dtype, mdt,
                                          routings, mxfp4_moe_layout)
                if derived is None:
                    moe = direct
            if derived is not None:
                fn, routing, bound, text = derived
                fm = f["moe"] * num_moe
                self._moe_meas = _memo(lambda t, fn=fn, fm=fm: fm * fn(t))
                self._sources["moe"].add("derived")
                self.moe_routing = routing
                bounds["moe"] = bound
                self._derived.append(text)
            elif moe is not None:
                fm = f["moe"] * num_moe
                self._moe_meas = _memo(lambda t, c=moe, fm=fm: fm * c(t))
                self._sources["moe"].add("measured")
                self.moe_routing = routing
                family = mdt if routing == "balanced" else f"{mdt}/{routing}"
                bounds["moe"] = profile.error_bound(f"moe/{family}") or 0.0
                kernel = profile.moe_kernel((mdt, arch.hidden_size, arch.moe_intermediate_size,
                                             arch.num_experts_per_tok, arch.num_experts, tp, 1,
                                             routing))
                if kernel and kernel.startswith(SECOND_FRAMEWORK):
                    bounds["moe"] = max(bounds["moe"], marlin_framework_error(profile))
                    self._derived.append(
                        f"routed experts: measured in SGLang ({kernel}), whose Marlin MoE "
                        "kernel is vLLM's; vLLM's own tables lack this shape (bound: the two "
                        "frameworks' disagreement where both measured Marlin)")
                if routing != (moe_routing or DEFAULT_MOE_ROUTING):
                    self._derived.append(
                        f"routed experts: the {routing} routing table (no "
                        f"{DEFAULT_MOE_ROUTING} measurement of this shape)")
                if weight_dtype == "mxfp4" and kernel and mxfp4_moe_layout in KERNEL_BACKENDS \
                        and mxfp4_moe_layout not in kernel:
                    self._derived.append(
                        f"routed experts: timed by the profile's {kernel} measurements, while "
                        f"model.mxfp4_moe_layout {mxfp4_moe_layout!r} lays the experts out for "
                        "another backend: the layout sets their padding (the weights' memory), "
                        "the measured kernel their time")
            else:
                self._sources["moe"].add(rough)
                why = ("expert parallelism" if grouped else
                       f"no {mdt} fused-MoE measurement of this shape at TP {tp}"
                       + (f" with {moe_routing} routing" if moe_routing else ""))
                if weight_dtype in EXPERT_ONLY_DTYPES and not grouped:
                    why += (f"; {weight_dtype} experts read at "
                            f"{8 * dtype_bytes(weight_dtype):g} bits per weight and run at the "
                            "bf16 tensor-core rate, as vLLM's weight-only MXFP4 kernels (Marlin "
                            "before Hopper) run them")
                self._fallbacks.append(f"routed experts: roofline, uniform routing ({why})")

        # LM head (16-bit) from the GEMM grid.
        lm = profile.gemm_curve("bf16", arch.vocab_size // tp, arch.hidden_size)
        if lm is not None:
            fl = f["lm_head"]
            self._lm_meas = _memo(lambda s, c=lm, fl=fl: fl * c(s))
            self._sources["lm_head"].add("measured")
        else:
            self._sources["lm_head"].add(rough)
            self._fallbacks.append("LM head: roofline (no bf16 GEMM measurements)")

        # TP all-reduces, and the logits all-gather before sampling (NCCL).
        comm_errors = []
        if tp > 1:
            graph = profile.all_reduce_curve(tp, "graph")
            eager = profile.all_reduce_curve(tp, "eager")
            if graph is not None and eager is not None and not sequence_parallel_moe \
                    and not multi_node_tp:
                num_ar = 2 * num_layers + 1
                h = arch.hidden_size
                fc = f["communication"]
                limit = self.cuda_graph_max_num_tokens
                self._ar_meas = (lambda t, g=graph, e=eager, n=num_ar, h=h, fc=fc, lim=limit:
                                 fc * n * (g if t <= lim else e)(t * h))
                self._sources["communication"].add("measured")
                comm_errors += [profile.error_bound("all_reduce/graph") or 0.0,
                                profile.error_bound("all_reduce/eager") or 0.0]
            gather = None if multi_node_tp else profile.all_gather_curve(tp)
            if gather is not None:
                fc, vocab = f["communication"], arch.vocab_size
                self._gather_meas = _memo(lambda s, c=gather, fc=fc, v=vocab: fc * c(s * v))
                self._sources["communication"].add("measured")
                comm_errors.append(profile.error_bound("all_gather/nccl") or 0.0)
        self._communication_fallbacks(tp, pp, self._ar_meas is not None, multi_node_tp,
                                      sequence_parallel_moe,
                                      f"no all-reduce measured over {tp} GPUs",
                                      gather_measured=self._gather_meas is not None)
        if comm_errors and rough not in self._sources["communication"]:
            bounds["communication"] = max(comm_errors)

        # The passes the database never measured (norms, rotary, activations, embedding; the
        # sampler's passes over the logits): each kernel's bytes timed by the measured
        # memory-bound kernel of this GPU.
        memory = profile.memory_curve()
        if memory is not None:
            kernel, mem = memory
            passes = elementwise_passes(arch, tp, routed_experts=self._moe_meas is None,
                                        mla_module=mla is not None)
            fe = f["elementwise"]
            self._ew_meas = _memo(lambda t, m=mem, ps=passes, fe=fe:
                                  fe * sum(n * m(t * b) for n, b in ps))
            bpl = self.assumptions.sampler_hbm_bytes_per_logit
            cast = min(_CAST_BYTES_PER_LOGIT, bpl)
            vocab, fl = arch.vocab_size, f["lm_head"]
            self._smp_meas = _memo(lambda s, m=mem, v=vocab, c=cast, r=bpl - cast, fl=fl:
                                   fl * (m(s * v * c) + (m(s * v * r) if r > 0 else 0.0)))
            self._sources["elementwise"].add("derived")
            self._sources["lm_head"].add("derived")
            err = profile.error_bound(f"memory/{kernel}") or 0.0
            bounds["elementwise"] = max(err, _KERNEL_TRANSFER_ERROR)
            self._derived.append(
                f"elementwise passes (norms, rotary, activation, residual, embedding) and the "
                f"sampler: bytes each kernel moves, timed by vLLM's measured {kernel} on this "
                f"GPU (a memory-bound pass; the sampler moves "
                f"compute.roofline.sampler_hbm_bytes_per_logit = {bpl:g} bytes per logit)")
        else:
            self._sources["elementwise"].add(rough)
            self._fallbacks.append("elementwise passes and sampler: roofline (no memory-bound "
                                   "kernel measured on this GPU)")
            if mla is not None:   # the rotary pass and latent norms are inside the module
                rope = (heads + 1) * arch.qk_rope_head_dim
                inside = num_layers * 2 * (rope + arch.q_lora_rank + arch.kv_lora_rank)
                bw = gpu.hbm_bandwidth_bytes_per_s * self.assumptions.hbm_bandwidth_fraction
                self._ew_byte_s_per_token -= (f["elementwise"] * inside
                                              * max(dtype_bytes(weight_dtype), 2.0) / bw)
        self._cpu_side_parts()
        self._class_bounds = bounds
        self._set_reference_figures()

    def assumption_lines(self) -> list[str]:
        prov = self.profile.data.provenance
        measured = [c for c in OP_CLASSES if "measured" in self._sources[c]]
        return [f"step times from the kernel profile {self.profile_id} ({self.profile.gpu}; "
                f"{prov.package} {prov.package_version}, system {prov.system}) for "
                f"{', '.join(measured) or 'no op class'}"
                + (f" (fused MoE at {self.moe_routing} routing)" if self.moe_routing else "")
                + "; the rest from the roofline reference "
                f"(+/-{self.assumptions.relative_uncertainty:.0%}); step-time bound "
                f"+/-{self.relative_uncertainty:.0%}"] + self.compute_scale_lines()
