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
  chunk over a cached prefix costs the pairs it computes);
- routed experts from the fused-MoE curve of the model's MoE shape, experts split by TP;
- TP all-reduces (2 per layer + 1) from vLLM's all-reduce curve of the TP group, in CUDA-graph
  mode for steps up to the graph capture size, eager beyond; the logits all-gather before
  sampling from NCCL's all-gather curve (the whole vocabulary of every sequence).

Derived from a measured kernel, named in `assumed_parts()`: the passes the database never
measured (norms, rotary, activation, residual adds, embedding, MoE top-k routing; the sampler's
fp32 cast and sampling passes over the logits) as separate memory-bound kernels, each timed by
the GPU's measured memory-bound kernel (vLLM's static fp8 quantization, a single read-and-write
pass) at the bytes it moves. With them the step's CPU side (the host model, or the declared
per-step overhead) and the declared launch time of steps outside full CUDA graphs.

From the roofline, named in `fallbacks()`: PP hops, MLA's projections and attention, routed
experts under expert parallelism (timed over the whole group), anything whose shape or dtype the
profile did not measure (e.g. a GPU without a memory-bound kernel measurement times the passes
above by the roofline).

Each op class's error bound is the 90th-percentile held-out error of the tables it uses (the
roofline's declared bound for a class with any roofline part).
"""

from __future__ import annotations

import math

from simcore.calibration.kernels import HOST_BOUND_RATIO, KernelProfile
from simcore.compute.base import OP_CLASSES, StepShape
from simcore.compute.calibrated import MeasuredModel, _memo
from simcore.errors import ConfigError
from simcore.hardware import GpuSpec
from simcore.model.arch import Gemm, ModelArch


def gemm_dtype(weight_dtype: str) -> str:
    """The GEMM and fused-MoE tables of a weight dtype: 16-bit floats share the bf16
    measurements; int4 weight-only is the tables' int4_wo."""
    if weight_dtype in ("bf16", "fp16"):
        return "bf16"
    return "int4_wo" if weight_dtype == "int4" else weight_dtype


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


_CAST_BYTES_PER_LOGIT = 6.0
"""The sampler's first pass: the logits cast to fp32 (16-bit read, 32-bit written)."""

_KERNEL_TRANSFER_ERROR = 0.35
"""Error bound of timing a pass by another memory-bound kernel's measured time at the same
bytes: the roofline's declared bound (vLLM's norm, rotary and activation kernels were not measured
on these GPUs; older vLLM's, measured on H100 by Vidur, took from 0.9x to 5x the quantization
kernel's time at the same bytes: `dse calibrate --list`)."""


def elementwise_passes(arch: ModelArch, tp: int, *, routed_experts: bool,
                       act_bytes: float = 2.0) -> list[tuple[int, float]]:
    """The memory-bound kernels of one step outside the GEMMs, attention and (unless
    `routed_experts`) the fused-MoE layer, as (kernels per step, bytes each moves per token):
    embedding gather, per layer two fused residual-add + RMSNorms (read x and residual, write
    both) and the rotary embedding on q and k, the gated activation of each dense MLP (and of
    shared experts), MoE top-k routing, MLA's latent norms, the final norm."""
    h = arch.hidden_size
    layers, moe = arch.num_layers, arch.num_moe_layers()
    dense = layers - moe
    if arch.is_mla:
        heads = arch.num_attention_heads // tp
        rope = heads * arch.qk_rope_head_dim + arch.qk_rope_head_dim
    else:
        rope = (arch.num_attention_heads // tp + arch.kv_heads_per_gpu(tp)) * arch.head_dim
    out = [(1, 2 * h * act_bytes), (2 * layers, 4 * h * act_bytes),
           (layers, 2 * rope * act_bytes), (1, 3 * h * act_bytes)]
    if dense:
        out.append((dense, 3 * (arch.intermediate_size // tp) * act_bytes))
    if arch.is_mla:
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


def _prompt_len(pairs_per_seq: float) -> float:
    """The prompt length whose causal query-key pairs, L (L + 1) / 2, are `pairs_per_seq`."""
    return (math.sqrt(1.0 + 8.0 * pairs_per_seq) - 1.0) / 2.0


class KernelModel(MeasuredModel):
    """StepTimeModel with a kernel profile's measured kernels over the roofline reference."""

    __slots__ = ()

    def __init__(self, arch: ModelArch, gpu: GpuSpec, *, profile: KernelProfile, tp: int = 1,
                 pp: int = 1, weight_dtype: str = "bf16", kv_cache_dtype: str = "bf16",
                 assumptions=None, sequence_parallel_moe: bool = False,
                 multi_node_tp: bool = False, op_scale: dict[str, float] | None = None,
                 host=None) -> None:
        super().__init__(arch, gpu, tp=tp, pp=pp, weight_dtype=weight_dtype,
                         kv_cache_dtype=kv_cache_dtype, assumptions=assumptions,
                         sequence_parallel_moe=sequence_parallel_moe,
                         multi_node_tp=multi_node_tp, op_scale=op_scale, host=host)
        self._check_gpu(profile, gpu)
        self.profile = profile
        self.calibrated = True
        self.profile_id = profile.profile_id
        self.profile_version = f"kernels-v{profile.data.version}+sha256:{profile.digest}"
        f = self.op_scale
        self._sources = {c: set() for c in OP_CLASSES}
        self._fallbacks = []
        self._derived = []
        bounds = dict.fromkeys(OP_CLASSES, self.assumptions.relative_uncertainty)
        rough = "roofline"
        wdt = gemm_dtype(weight_dtype)
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
        for group in self._token_gemm_groups:
            gemms, count, dtype = members[group]
            curves = [curve(g, dtype) for g in gemms]
            if arch.is_mla and group == "attn" or not curves or any(c is None for c in curves):
                self._sources["gemm"].add(rough)
                self._fallbacks.append(f"{group} GEMMs: roofline (no {dtype} GEMM measurements"
                                       f"{' of MLA projections' if arch.is_mla else ''})")
                meas.append(None)
                continue
            fg = f["gemm"] * count
            meas.append(_memo(lambda t, cs=tuple(curves), fg=fg: fg * sum(c(t) for c in cs)))
            self._sources["gemm"].add("measured")
            gemm_errors.append(gemm_err(dtype))
        self._token_gemm_meas = tuple(meas)
        if arch.is_mla:
            self._sources["gemm"].add(rough)
            self._fallbacks.append("MLA latent up-projections: roofline")
        if gemm_errors and rough not in self._sources["gemm"]:
            bounds["gemm"] = max(gemm_errors)

        # The attention kernel.
        kvd = kv_dtype(kv_cache_dtype)
        heads, kv_heads = arch.num_attention_heads // tp, arch.kv_heads_per_gpu(tp)
        gen = ctx = None
        if not arch.is_mla:
            gen = profile.attention_grid("generation", kvd, heads, kv_heads, arch.head_dim)
            ctx = profile.attention_grid("context", kvd, heads, kv_heads, arch.head_dim)
        if gen is not None and ctx is not None:
            fa = f["attention"] * num_layers

            def attention(shape: StepShape, gen=gen, ctx=ctx, fa=fa) -> float:
                d = shape.num_decode_seqs
                x = 0.0
                if d:
                    x += gen(d, shape.decode_kv_tokens / d)
                p = shape.num_seqs - d
                if p > 0:
                    pairs = shape.attn_qk_pairs - shape.decode_kv_tokens
                    x += ctx(p, max(_prompt_len(pairs / p), 1.0))
                return fa * x

            self._attn_meas = attention
            self._sources["attention"].add("measured")
            bounds["attention"] = max(profile.error_bound(f"attention/{ph}/{kvd}") or 0.0
                                      for ph in ("context", "generation"))
        else:
            self._sources["attention"].add(rough)
            why = ("MLA attention is not in the kernel profile" if arch.is_mla else
                   f"no {kvd} KV-cache measurements of {heads} query / {kv_heads} KV heads of "
                   f"dim {arch.head_dim} per GPU")
            self._fallbacks.append(f"attention kernel: roofline ({why})")

        # Routed experts (TP-sharded; expert parallelism times them over its whole group).
        if arch.is_moe:
            moe = None if sequence_parallel_moe else profile.moe_curve(
                wdt, arch.hidden_size, arch.moe_intermediate_size, arch.num_experts_per_tok,
                arch.num_experts, tp, 1)
            if moe is not None:
                fm = f["moe"] * num_moe
                self._moe_meas = _memo(lambda t, c=moe, fm=fm: fm * c(t))
                self._sources["moe"].add("measured")
                bounds["moe"] = profile.error_bound(f"moe/{wdt}") or 0.0
            else:
                self._sources["moe"].add(rough)
                self._fallbacks.append(
                    "routed experts: roofline (" + ("expert parallelism" if sequence_parallel_moe
                                                    else f"no {wdt} fused-MoE measurement of "
                                                    f"this shape at TP {tp}") + ")")

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
            passes = elementwise_passes(arch, tp, routed_experts=self._moe_meas is None)
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
        self._cpu_side_parts()
        self._class_bounds = bounds
        self._set_reference_figures()

    def assumption_lines(self) -> list[str]:
        prov = self.profile.data.provenance
        measured = [c for c in OP_CLASSES if "measured" in self._sources[c]]
        return [f"step times from the kernel profile {self.profile_id} ({self.profile.gpu}; "
                f"{prov.package} {prov.package_version}, system {prov.system}) for "
                f"{', '.join(measured) or 'no op class'}; the rest from the roofline reference "
                f"(+/-{self.assumptions.relative_uncertainty:.0%}); step-time bound "
                f"+/-{self.relative_uncertainty:.0%}"]
