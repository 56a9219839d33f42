"""Kernel times derived from other measurements of the same GPU where the kernel profile has
no table of their own (`simcore.compute.kernel_model.KernelModel` uses them, and names them in
the result's assumed parts):

- weight-only formats on GPUs without fp8 tensor cores (fp8 checkpoints, MXFP4 and int4 experts
  on an A100, which vLLM runs in Marlin kernels): for the routed experts, the nearest shape
  Marlin's MoE kernel was measured at, moved to theirs and to the format's weight reads
  (`derived_experts`); for the other linear layers, and the experts where Marlin was not
  measured, the bf16 measurement of the same shape, the weight reads at the format's bytes
  (`weight_only_ratio`, `experts_weight_only_ratio`);
- fused-MoE shapes the profile did not measure: the nearest measured shape, moved by the
  roofline (`derived_experts`, through `simcore.calibration.moe_transfer`).
"""

from __future__ import annotations

import math

from simcore.calibration.kernels import KernelProfile
from simcore.calibration.moe_transfer import (
    KERNEL_BACKENDS,
    SECOND_FRAMEWORK,
    W4A16_TABLES,
    ExpertShape,
    backend_tables,
    leave_one_out,
    nearest,
    transfer,
)
from simcore.hardware import GpuSpec
from simcore.model.arch import ModelArch, dtype_bytes


def weight_only(dtype: str, gpu: GpuSpec) -> bool:
    """Weights in `dtype` run as weight-only quantization on `gpu` and there alone: a quantized
    format whose GEMMs the GPU computes at its 16-bit tensor-core rate (vLLM's Marlin kernels
    dequantize the weights in the kernel), on a GPU without fp8 tensor cores (A100: fp8
    checkpoints, MXFP4 and int4 experts all run in Marlin there)."""
    return dtype not in ("bf16", "fp16") and not gpu.has_fp8


def weight_only_ratio(flop_s: float, weight_s: float, other_s: float, bytes_ratio: float):
    """`t -> r`: the roofline's time of a linear layer of `t` rows with weights `bytes_ratio`
    the 16-bit bytes, over its time with 16-bit weights, at the same (16-bit) FLOP rate.
    `flop_s` is the FLOP time per row, `weight_s` the quantized weights' read time and `other_s`
    the activations' per row."""
    w16 = weight_s / bytes_ratio

    def ratio(t: float) -> float:
        c = t * flop_s
        return max(c, weight_s + t * other_s) / max(c, w16 + t * other_s)

    return ratio


WEIGHT_ONLY_ERROR = 0.35
"""Error bound of a weight-only kernel timed by the 16-bit measurement of its shape on the same
GPU (`weight_only_ratio`): the roofline's declared bound (`RooflineAssumptions`'s default
relative uncertainty), and the floor of a move from another format's table. Where Marlin's
measurements exist that path is not taken: on A100, the one GPU without fp8 tensor cores with
both kernels measured at the same shapes (vLLM's bf16 fused MoE, SGLang's int4 Marlin), the
bf16 time at int4's weight reads comes out 1.23 times faster than Marlin in median (1.2-1.6
times from 1 to 1,024 tokens): as a prediction of Marlin's time, 28% off in median and 52% at
the 90th percentile (simcore/data/profiles/README.md)."""


MARLIN_FRAMEWORK_ERROR = 0.25
"""The error bound of vLLM's Marlin fused-MoE kernel timed by SGLang's measurements of it on a
GPU where vLLM's were not taken (A100): the 90th percentile of the two frameworks' disagreement
where both measured it without expert parallelism, 23% on H100 and 25% on H200 (`dse calibrate
--list`, family `moe/marlin/sglang_vs_vllm`; a test keeps this at least theirs)."""


def derived_experts(model, profile: KernelProfile, arch: ModelArch, gpu: GpuSpec, tp: int,
                    weight_dtype: str, mdt: str, routings: tuple[str, ...],
                    mxfp4_moe_layout: str | None = None):
    """(seconds of one layer's routed experts against tokens, routing, error bound, what
    it is in words) of `model` (a `RooflineModel` of `arch` on `gpu`: its roofline
    coefficients and assumptions) from another fused-MoE measurement of this GPU, or None:
    - a weight-only format (`weight_only`: fp8, MXFP4 and int4 on a GPU without fp8 tensor
      cores, which vLLM runs in its Marlin MoE kernel): the nearest shape Marlin was measured
      at (the 4-bit weight-only tables, in vLLM or in SGLang, whose Marlin kernel is vLLM's),
      moved to this shape and to the format's weight reads; where Marlin was not measured, the
      bf16 table of this shape, its expert-weight reads at the format's bytes;
    - else the nearest measured shape of the format's own table, then (weight-only) of the
      bf16 table, moved to this shape by the roofline (`simcore.calibration.moe_transfer`),
      where leaving each model out of that table measures the move; MXFP4 experts laid out
      for a backend (`mxfp4_moe_layout`) move only that backend's measurements."""
    from simcore.compute.kernel_model import table_weight_dtype

    wb = dtype_bytes(weight_dtype)
    wo = weight_only(weight_dtype, gpu)
    shape = (arch.hidden_size, arch.moe_intermediate_size, arch.num_experts_per_tok,
             arch.num_experts, tp, 1)
    a = model.assumptions
    bw = gpu.hbm_bandwidth_bytes_per_s * a.hbm_bandwidth_fraction
    target = ExpertShape(arch.hidden_size, arch.moe_intermediate_size / tp,
                         arch.num_experts_per_tok, arch.num_experts)

    def moved(table: str, tables: tuple[str, ...], kernel: str | None, flops: float, lead):
        """The nearest measured shape of `tables` (of `kernel`'s family), moved to this shape
        and to this format's weight reads, or None; `lead(routing)` opens its words."""
        table_bytes = tuple(2.0 if t == "bf16" else dtype_bytes(table_weight_dtype(t))
                            for t in tables)
        for routing in routings:
            key = nearest(profile, tables, routing, target, kernel=kernel)
            err = None if key is None else leave_one_out(profile, tables, routing,
                                                         table_bytes, flops, bw, kernel)
            if err is None:
                continue
            bound = max(err.p90, WEIGHT_ONLY_ERROR if table != mdt else 0.0)
            source = profile.moe_kernel(key) or ""
            second = source.startswith(SECOND_FRAMEWORK)
            if second:
                bound = max(bound, marlin_framework_error(profile))
            tb = table_bytes[tables.index(key[0])]
            fn = transfer(profile, key, target, wb, tb, flops, bw)
            src, h, inter, k, e, ktp = key[:6]
            which = (f"the {src} table's" if len(tables) == 1 else
                     f"the {'/'.join(tables)} tables' (4-bit weights, 16-bit activations: "
                     f"{kernel}'s kernels run both formats"
                     + ("" if table in tables else
                        f", and {weight_dtype} weights with 16-bit activations too") + ")")
            return (fn, routing, bound,
                    f"{lead(routing)}; {which} nearest shape"
                    + (f" of the {kernel} kernels" if kernel else "")
                    + (f" (the {src} table's " if len(tables) > 1 else " (")
                    + f"hidden {h}, intermediate "
                    f"{inter} at TP {ktp}, top-{k} of {e} experts; {routing} routing"
                    + ("; measured in SGLang, whose Marlin kernel is vLLM's" if second else "")
                    + ") at the same tokens per expert, moved to this shape"
                    + (f" and to {weight_dtype} weight reads" if tb != wb else "")
                    + " by the roofline (each model of "
                    + ("that table" if len(tables) == 1 else "those tables")
                    + " predicted from its nearest "
                    f"other: median |error| {err.median:.0%}, p90 {err.p90:.0%} over "
                    f"{err.n} shapes)")
        return None

    if wo:
        # vLLM runs every weight-only format's experts in its Marlin MoE kernel here (fp8
        # checkpoints as W8A16, MXFP4 and int4 as W4A16): Marlin's measurements time them.
        # A format outside the 4-bit tables (fp8) is moved across formats: the floor below.
        own = mdt if mdt in W4A16_TABLES else "marlin"
        out = moved(own, W4A16_TABLES, "marlin", gpu.bf16_flops * a.gemm_flops_fraction,
                    lambda routing: f"routed experts with {weight_dtype} weights (weight-only "
                    f"on {gpu.name}, no fp8 tensor cores: vLLM runs them in its Marlin MoE "
                    f"kernel); no {mdt} fused-MoE measurement of this shape at TP {tp}")
        if out is not None:
            return out
        for routing in routings:
            c = profile.moe_curve("bf16", *shape, routing)
            if c is not None:
                r = experts_weight_only_ratio(model, wb / 2)
                family = "bf16" if routing == "balanced" else f"bf16/{routing}"
                bound = max(profile.error_bound(f"moe/{family}") or 0.0, WEIGHT_ONLY_ERROR)
                return (lambda t, c=c, r=r: r(t) * c(t), routing, bound,
                        f"routed experts with {weight_dtype} weights (weight-only on "
                        f"{gpu.name}, no fp8 tensor cores): the bf16 fused-MoE measurement "
                        f"of this shape at TP {tp} ({routing} routing), its expert-weight "
                        "reads at the format's bytes (the roofline's ratio of the two; no "
                        "Marlin measurement on this GPU at this routing)")
    family = (mxfp4_moe_layout if weight_dtype == "mxfp4"
              and mxfp4_moe_layout in KERNEL_BACKENDS else None)
    for table in (mdt, "bf16") if wo else (mdt,):
        kernel = family if table == mdt else None
        # Marlin's kernels, measured in either 4-bit weight-only table, time the experts of
        # both (`backend_tables`).
        flops = (gpu.bf16_flops if table == "bf16" or wo else gpu.flops_for(weight_dtype)) \
            * a.gemm_flops_fraction
        def lead(routing: str, kernel=kernel) -> str:
            return "routed experts: " + (
                f"no {mdt} fused-MoE measurement of this shape at TP {tp}"
                if profile.moe_curve(mdt, *shape, routing) is None else
                f"MXFP4 experts laid out for {kernel} (model.mxfp4_moe_layout), whose "
                f"kernels the profile did not measure at this shape (its {mdt} "
                "measurement of it is another backend's)")

        out = moved(table, backend_tables(table, kernel), kernel, flops, lead)
        if out is not None:
            return out
    return None


def marlin_framework_error(profile: KernelProfile) -> float:
    """The error bound of vLLM's Marlin fused-MoE kernel timed by its measurements in SGLang:
    the profile's own measure of the two frameworks' disagreement where both measured Marlin
    (`moe/marlin/sglang_vs_vllm`, its 90th percentile), else `MARLIN_FRAMEWORK_ERROR`."""
    return profile.error_bound("moe/marlin/sglang_vs_vllm") or MARLIN_FRAMEWORK_ERROR


def experts_weight_only_ratio(model, bytes_ratio: float):
    """`t -> r`: `model`'s roofline time of the routed experts of a step of `t` tokens with
    expert weights `bytes_ratio` the 16-bit bytes, over its time with 16-bit experts."""
    num, ln_miss = model._e_num, model._e_ln_miss
    flop_s, per_expert_s = model._e_flop_s_per_token, model._e_byte_s_per_expert
    per_token_s, w16 = model._e_byte_s_per_token, model._e_byte_s_per_expert / bytes_ratio

    def ratio(t: float) -> float:
        t = t if t > 1.0 else 1.0     # the measured curves time fewer tokens as one
        active = num * (1.0 - math.exp(t * ln_miss))
        c = t * flop_s
        return (max(c, active * per_expert_s + t * per_token_s)
                / max(c, active * w16 + t * per_token_s))

    return ratio
