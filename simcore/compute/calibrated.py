"""A calibrated step-time model: the ops a calibration profile measured, timed by its curves; the
rest by the roofline reference, and said so.

From the profile (per layer, summed over the layers that have the op, at the step's token count):
- the QKV and output projections of every layer and the gate+up and down GEMMs of dense MLP
  layers: the measured curve of that per-GPU GEMM shape, or the profile's generic GEMM fallback
  (nearest measured shapes rescaled by a fitted cost model) for shapes it never measured;
- the elementwise passes vLLM runs around them: the two RMSNorms, rotary embedding, the MLP
  activation (dense layers), the residual add, and the embedding lookup once per step;
- TP all-reduces (2 per layer + 1 for the embedding) of tokens x hidden 16-bit activations,
  from the NCCL all-reduce table of the profile's node when it measured a group of TP GPUs.

From the roofline: the attention kernel (no attention measurements), MoE routers, shared and
routed experts, MLA's extra projections, the LM head and sampler, PP hops, the logits gather,
sequence-parallel all-gathers, CPU overheads. Every such part is listed by `fallbacks()`.

Each op class's error bound (`op_error_bounds()`) is the 90th-percentile held-out relative
error of the curves it uses (the generic fallback's error on held-out shapes where a shape was
not measured), and the roofline's declared bound for classes with any roofline part.
`relative_uncertainty` is the step-time bound: the class bounds weighted by each class's share
of two reference steps (a decode batch and a prefill chunk), the larger of the two.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

from simcore.calibration.ops import layer_op_shapes
from simcore.calibration.kernels import (
    KernelProfile, is_kernel_profile_file, shipped_kernel_profile, shipped_kernel_profile_ids)
from simcore.calibration.profile import CalibrationProfile, shipped_profile, shipped_profile_ids
from simcore.compute.base import OP_CLASSES, StepShape
from simcore.compute.roofline import RooflineModel
from simcore.errors import ConfigError
from simcore.hardware import GpuSpec
from simcore.model.arch import ModelArch

_ACT_BYTES = 2
"""Activations are 16-bit: an all-reduce moves tokens x hidden x 2 bytes."""



@lru_cache(maxsize=32)
def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def profile_version(profile: CalibrationProfile) -> str:
    """The profile's format version and a digest of its contents: two runs that name the same
    version used the same curves."""
    return f"v{profile.data.version}+sha256:{_digest(profile.to_json())}"


def resolve_profile(name: str | None, gpu: GpuSpec, *,
                    base_dir: Path) -> CalibrationProfile | KernelProfile:
    """The profile `compute.profile` names (a shipped id or a file path, a calibration or a
    kernel profile), or when it names none the shipped profile of `gpu`: its kernel profile
    (measured vLLM kernels, every op class) where one is shipped, else its calibration profile;
    ConfigError naming the field when there is none."""
    if name is None:
        kernel_id = f"{gpu.name.lower()}-aiconfigurator"
        if kernel_id in shipped_kernel_profile_ids():
            return shipped_kernel_profile(kernel_id)
        for pid in shipped_profile_ids():
            p = shipped_profile(pid)
            if p.gpu == gpu.name:
                return p
        shipped = [f"{i} ({shipped_profile(i).gpu})" for i in shipped_profile_ids()]
        shipped += shipped_kernel_profile_ids()
        raise ConfigError(f"compute.kind: calibrated: no shipped calibration profile for "
                          f"{gpu.name} (shipped: {', '.join(shipped)}); name one in "
                          "compute.profile, fit one with `dse calibrate`, or use kind: roofline")
    if name.endswith((".json", ".json.gz")) or "/" in name:
        path = Path(name)
        if not path.is_absolute():
            path = base_dir / path
        try:
            if path.is_file() and is_kernel_profile_file(path):
                return KernelProfile.load(path)
            return CalibrationProfile.load(path)
        except ConfigError as e:
            raise ConfigError(f"compute.profile: {e}") from None
    try:
        if name in shipped_kernel_profile_ids():
            return shipped_kernel_profile(name)
        return shipped_profile(name)
    except ConfigError as e:
        raise ConfigError(f"compute.profile: {e}; kernel profiles: "
                          f"{', '.join(shipped_kernel_profile_ids())}") from None


def _memo(fn):
    """`fn(tokens)` remembered per token count (a generic fallback costs ~10 us a call, and
    decode steps repeat the same few counts)."""
    cache: dict[int, float] = {}

    def f(t: int) -> float:
        x = cache.get(t)
        if x is None:
            x = cache[t] = fn(t)
        return x

    return f


class MeasuredModel(RooflineModel):
    """A roofline whose measured ops a subclass replaced: the figures both kinds of profile
    report (what share of a step is measured, each op class's bound, the fallbacks).

    A subclass sets, in its __init__, `profile`, `_sources` (per op class, the set of where its
    times come from: "measured", "generic", "roofline"), `_fallbacks` (the parts timed by the
    roofline or a generic model, in words) and `_class_bounds` (per op class, its relative
    error bound), then calls `_set_reference_figures()`."""

    __slots__ = ("profile", "_sources", "_fallbacks", "_derived", "_class_bounds",
                 "_measured_share")

    def _communication_fallbacks(self, tp: int, pp: int, all_reduce_measured: bool,
                                 multi_node_tp: bool, sequence_parallel_moe: bool,
                                 unmeasured: str, gather_measured: bool = False) -> None:
        """Record the communication a profile does not time: TP collectives when its all-reduce
        is not used (`unmeasured` says why when the profile lacks it), the logits gather, PP
        hops."""
        if tp > 1:
            if not all_reduce_measured:
                why = ("a cluster run: the step DAG lowers collectives onto NVLink and the "
                       "fabric" if multi_node_tp else "sequence-parallel MoE"
                       if sequence_parallel_moe else unmeasured)
                self._sources["communication"].add("roofline")
                self._fallbacks.append(f"TP collectives over {tp} GPUs: roofline formulas "
                                       f"({why})")
            if not gather_measured:
                self._fallbacks.append("logits all-gather: roofline ring formula")
        if pp > 1:
            self._sources["communication"].add("roofline")
            self._fallbacks.append("PP hops: roofline")

    def _cpu_side_parts(self) -> None:
        """Record where the step's CPU side and launch time come from (declared or fitted
        assumptions, not measured kernels)."""
        if self.host is None:
            self._derived.append("per-step CPU time: compute.roofline.step_overhead_s "
                                 "(declared)")
        else:
            self._derived.append("CPU side: vLLM's measured engine costs and the host "
                                 "section's parameters (fitted on the end-to-end set)")
        self._derived.append("kernel launches of steps outside full CUDA graphs: "
                             "compute.roofline.eager_launch_s_per_layer (declared), where "
                             "longer than the GPU work")

    def assumed_parts(self) -> list[str]:
        """The parts of a step neither a measured kernel nor the roofline times: derived from
        another kernel's measurements, or declared or fitted constants."""
        return list(self._derived)

    @staticmethod
    def _check_gpu(profile, gpu: GpuSpec) -> None:
        """ConfigError naming compute.profile when `profile` was measured on another GPU."""
        if profile.gpu != gpu.name:
            raise ConfigError(f"compute.profile: {profile.profile_id} was measured on "
                              f"{profile.gpu}, not on the configured {gpu.name}")

    def _reference_parts(self) -> list[dict[str, float]]:
        """Seconds per op class of two reference steps: 64 decodes at 1k context, and a
        2048-token prefill chunk."""
        out = []
        for shape in (StepShape.from_requests([(1, 1024)] * 64),
                      StepShape.from_requests([(2048, 0)])):
            by_op: dict[str, float] = {}
            self.op_bounds(shape, by_op=by_op)
            parts = {"gemm": by_op.get("mlp", 0.0), "attention": by_op.get("attention", 0.0),
                     "moe": by_op.get("moe", 0.0), "elementwise": by_op.get("elementwise", 0.0),
                     "lm_head": by_op.get("lm_head", 0.0),
                     "communication": self.comm_s(shape) - self._ar_skew_s,
                     "overhead": self._step_overhead_s}
            # The attention op holds the projections (gemm) and the kernel (attention).
            if "attn" in self._token_gemm_groups:
                proj = self._token_gemm_meas[self._token_gemm_groups.index("attn")]
                if proj is not None:
                    p = proj(shape.num_tokens)
                    parts["gemm"] += p
                    parts["attention"] -= p
            out.append(parts)
        return out

    def _set_reference_figures(self) -> None:
        """From the reference steps: `relative_uncertainty`, the class bounds weighted by each
        class's share of a step (the larger of the two steps), and the share of a step's time
        that comes from the profile's curves (the smaller of the two)."""
        worst, shares = 0.0, []
        for parts in self._reference_parts():
            total = sum(parts.values())
            if total <= 0:
                shares.append(0.0)
                continue
            worst = max(worst, sum(parts[c] * self._class_bounds[c] for c in parts) / total)
            measured = sum(v for c, v in parts.items() if self._sources[c]
                           and not self._sources[c] & {"roofline", "derived"})
            shares.append(measured / total)
        self.relative_uncertainty = worst
        self._measured_share = min(shares)

    def measured_share(self) -> float:
        """The share of a reference step's time that comes from the profile's curves: what
        "calibrated" covers in this deployment."""
        return self._measured_share

    def op_error_bounds(self) -> dict[str, float]:
        """Per op class: the held-out p90 error of the profile's curves it uses, the roofline's
        declared bound where any part of it is timed by the roofline."""
        return dict(self._class_bounds)

    def fallbacks(self) -> list[str]:
        """The parts of a step timed by the roofline or a generic fallback."""
        return list(self._fallbacks)



class CalibratedModel(MeasuredModel):
    """StepTimeModel with a calibration profile's per-op times over the roofline reference."""

    __slots__ = ()

    def __init__(self, arch: ModelArch, gpu: GpuSpec, *, profile: CalibrationProfile,
                 tp: int = 1, pp: int = 1, weight_dtype: str = "bf16",
                 kv_cache_dtype: str = "bf16", assumptions=None,
                 sequence_parallel_moe: bool = False, multi_node_tp: bool = False,
                 op_scale: dict[str, float] | None = None, host=None,
                 compute_bound_scale: float = 1.0, collective_skew_s: float = 0.0,
                 graphless_collective_scale: float = 1.0) -> None:
        super().__init__(arch, gpu, tp=tp, pp=pp, weight_dtype=weight_dtype,
                         kv_cache_dtype=kv_cache_dtype, assumptions=assumptions,
                         sequence_parallel_moe=sequence_parallel_moe,
                         multi_node_tp=multi_node_tp, op_scale=op_scale, host=host,
                         compute_bound_scale=compute_bound_scale,
                         collective_skew_s=collective_skew_s,
                         graphless_collective_scale=graphless_collective_scale)
        self._check_gpu(profile, gpu)
        if weight_dtype not in ("bf16", "fp16"):
            raise ConfigError(f"compute.profile: {profile.profile_id} measured 16-bit GEMMs; "
                              f"model.dtype {weight_dtype} would time every GEMM by the "
                              "roofline (use compute.kind: roofline)")
        self.profile = profile
        self.calibrated = True
        self.profile_id = profile.profile_id
        self.profile_version = profile_version(profile)
        f = self.op_scale
        self._sources: dict[str, set[str]] = {c: set() for c in OP_CLASSES}
        self._fallbacks: list[str] = []
        self._derived: list[str] = []
        rough = "roofline"

        shapes = layer_op_shapes(hidden=arch.hidden_size,
                                 num_heads=arch.num_attention_heads,
                                 num_kv_heads=arch.num_kv_heads, ffn=arch.intermediate_size,
                                 vocab=arch.vocab_size, tp=tp, head_dim=arch.head_dim)
        num_layers = arch.num_layers
        num_moe = arch.num_moe_layers()
        num_dense = num_layers - num_moe
        gemm_errors: list[float] = []
        ew_errors: list[float] = []

        def timed(op: str, cls: str, errors: list[float]):
            """The profile's time of `op` at this model's shape, as a function of tokens: its
            measured curve, else its generic model (said so), else None."""
            sh = shapes[op]
            curve = profile.curve(op, **sh)
            if curve is not None:
                errors.append(profile.relative_error(op) or 0.0)
                self._sources[cls].add("measured")
                return curve
            if cls == "gemm":
                def query(t, k=sh["in_features"], n=sh["out_features"]):
                    return profile.gemm_time_s(k, n, t)
            else:
                def query(t):
                    return profile.elementwise_time_s(op, t, **sh)
            if query(1) is None:
                return None
            errors.append(profile.relative_error(op, "generic") or 0.0)
            self._sources[cls].add("generic")
            self._fallbacks.append(f"{op} ({', '.join(f'{k} {v}' for k, v in sh.items())}): "
                                   "shape not measured, the profile's generic model")
            return _memo(lambda t: query(t)[0])

        def gemm_fn(op: str):
            return timed(op, "gemm", gemm_errors)

        def ew_fn(op: str):
            return timed(op, "elementwise", ew_errors)

        # Linear layers: the attention projections of every layer (not MLA's), the dense MLP.
        meas = []
        for group in self._token_gemm_groups:
            fn = None
            if group == "attn" and not arch.is_mla:
                qkv, out = gemm_fn("attn_pre_proj"), gemm_fn("attn_post_proj")
                if qkv is not None and out is not None:
                    fg = f["gemm"] * num_layers
                    fn = (lambda t, a=qkv, b=out, fg=fg: fg * (a(t) + b(t)))
            elif group == "mlp" and num_dense:   # every catalog model has a gated MLP
                up, down = gemm_fn("mlp_up_proj"), gemm_fn("mlp_down_proj")
                if up is not None and down is not None:
                    fg = f["gemm"] * num_dense
                    fn = (lambda t, a=up, b=down, fg=fg: fg * (a(t) + b(t)))
            if fn is None:
                self._sources["gemm"].add(rough)
                self._fallbacks.append(f"{group} GEMMs: roofline")
            meas.append(fn)
        if arch.is_mla:
            self._sources["gemm"].add(rough)
            self._fallbacks.append("MLA projections: roofline")
        self._token_gemm_meas = tuple(meas)

        # Elementwise passes: per layer two norms, rotary, residual add; per dense layer the
        # activation; once per step the embedding. MoE layers add routing, top-k and combine
        # passes the profile never measured, MLA its latent norms: those keep the roofline.
        measurable = not arch.is_moe and not arch.is_mla
        per_layer = [ew_fn(op) for op in ("input_layernorm", "post_attention_layernorm",
                                          "attn_rope", "add")] if measurable else [None]
        act = ew_fn("mlp_act") if measurable and num_dense else None
        emb = ew_fn("emb") if measurable else None
        if measurable and all(x is not None for x in per_layer) and emb is not None \
                and (act is not None or not num_dense):
            fe = f["elementwise"]
            n1, n2, nr, na = per_layer

            def ew(t, n1=n1, n2=n2, nr=nr, na=na, act=act, emb=emb):
                x = num_layers * (n1(t) + n2(t) + nr(t) + na(t)) + emb(t)
                if act is not None:
                    x += num_dense * act(t)
                return fe * x

            self._ew_meas = ew
        else:
            self._sources["elementwise"].add(rough)
            self._fallbacks.append("elementwise passes: roofline (this architecture's passes "
                                   "are not only those the profile measured)")

        # TP all-reduces from the NCCL table of a group of tp GPUs in one node.
        comm_error = None
        if tp > 1:
            ar = (profile.collective_time_s("all_reduce", 1.0, tp, tp)
                  if not sequence_parallel_moe and not multi_node_tp else None)
            if ar is not None:
                num_ar = 2 * num_layers + 1
                h_bytes = arch.hidden_size * _ACT_BYTES
                fc = f["communication"]
                self._ar_meas = (lambda t, p=profile, n=num_ar, hb=h_bytes, fc=fc, tp=tp:
                                 fc * n * p.collective_time_s("all_reduce", t * hb, tp, tp))
                comm_error = profile.relative_error("all_reduce") or 0.0
                self._sources["communication"].add("measured")
        self._communication_fallbacks(tp, pp, self._ar_meas is not None, multi_node_tp,
                                      sequence_parallel_moe, "no NCCL table of that group")
        self._fallbacks += ["attention kernel: roofline (no attention measurements)",
                            "LM head and sampler: roofline"]
        if arch.is_moe:
            self._fallbacks.append("MoE router, shared and routed experts: roofline")
        self._cpu_side_parts()

        ref = self.assumptions.relative_uncertainty
        bounds = dict.fromkeys(OP_CLASSES, ref)
        if rough not in self._sources["gemm"] and gemm_errors:
            bounds["gemm"] = max(gemm_errors)
        if rough not in self._sources["elementwise"] and ew_errors:
            bounds["elementwise"] = max(ew_errors)
        if rough not in self._sources["communication"] and comm_error is not None:
            bounds["communication"] = comm_error
        self._class_bounds = bounds
        self._set_reference_figures()

    def assumption_lines(self) -> list[str]:
        src = self.profile.data.provenance.source
        measured = [c for c in OP_CLASSES if self._sources[c] and
                    "roofline" not in self._sources[c]]
        return [f"step times from the calibration profile {self.profile_id} "
                f"({self.profile.gpu}; {src}) "
                f"for {', '.join(measured) or 'no op class'}; the rest from the roofline "
                f"reference (+/-{self.assumptions.relative_uncertainty:.0%}); step-time bound "
                f"+/-{self.relative_uncertainty:.0%}"] + self.compute_scale_lines() + (
                    ["TP all-reduce times are NCCL's as measured (vLLM's custom all-reduce can "
                     "be faster for small messages inside a node)"]
                    if self._ar_meas is not None else [])
