"""Fused-MoE times of a shape the kernel profile did not measure, from the nearest one it did.

AIConfigurator measured vLLM's fused-MoE kernels at the expert shapes of a few dozen models. A
model outside them (gpt-oss on an A100, a user's own MoE) would otherwise be timed by the
roofline. This module times it by the measured shape nearest to it, on the same GPU, in the same
table, at the same tokens per expert:

    t_target(t) = t_near(t') x roofline_target(t) / roofline_near(t'),
    t' = t x (k / E) / (k' / E'),

where k and E are the routed experts per token and the experts, and the roofline is that of the
routed experts' gated GEMMs (weights read once per expert touched, FLOPs per routed token). The
measured kernel's efficiency at that load is kept, and the roofline moves it to the new shape.

How good that is, is measured on each profile: every measured shape is predicted from its nearest
other model's shape (`leave_one_out`), and the error's quantiles are the transfer's bound.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from simcore.calibration.kernels import KernelProfile

KERNEL_BACKENDS = ("marlin", "triton", "flashinfer")
"""The MXFP4 expert layouts (`model.mxfp4_moe_layout`) whose backend names the fused-MoE kernels
the profiles measured (`KernelProfile.moe_kernel`): experts laid out for one move only that
backend's measurements."""

TOKENS = (1, 4, 16, 64, 256, 1024, 4096, 16384)
"""The step sizes (tokens) at which a transfer is checked against the measurement."""


@dataclass(frozen=True)
class ExpertShape:
    """A routed-expert layer as one GPU runs it: hidden size, intermediate size per GPU (the
    layer's divided by TP), experts per token, experts."""

    hidden: int
    inter_per_gpu: float
    topk: int
    num_experts: int

    @property
    def routed_share(self) -> float:
        """The share of experts a token is routed to."""
        return self.topk / self.num_experts


def experts_roofline_s(shape: ExpertShape, tokens: float, weight_bytes: float, flops: float,
                       bandwidth: float) -> float:
    """Roofline seconds of one routed-expert layer over `tokens` tokens: the gated up and down
    GEMMs' FLOPs at `flops`, against the weights of the experts touched (uniform routing) at
    `weight_bytes` per weight plus 16-bit activations, at `bandwidth`."""
    h, i, k, e = shape.hidden, shape.inter_per_gpu, shape.topk, shape.num_experts
    touched = e if k >= e else e * -math.expm1(tokens * math.log1p(-k / e))
    compute = 2 * 3 * h * i * tokens * k / flops
    memory = (touched * 3 * h * i * weight_bytes + tokens * k * (2 * h + 3 * i) * 2) / bandwidth
    return max(compute, memory)


def _distance(a: ExpertShape, b: ExpertShape) -> float:
    """How far apart two expert shapes are: log distances of the hidden and per-GPU
    intermediate sizes and of the routed share, and a quarter of that of the expert counts."""
    return (abs(math.log(a.hidden / b.hidden)) + abs(math.log(a.inter_per_gpu / b.inter_per_gpu))
            + abs(math.log(a.routed_share / b.routed_share))
            + 0.25 * abs(math.log(a.num_experts / b.num_experts)))


W4A16_TABLES = ("mxfp4_w4a16", "int4_wo")
"""The fused-MoE tables of 4-bit weights with 16-bit activations. vLLM's Marlin MoE kernel
(`fused_marlin_moe`) runs MXFP4 and int4 weights alike, only its scale type and group differ,
so Marlin's measurements in either table time MXFP4 experts laid out for Marlin
(`backend_tables`); on an H100 each of its Marlin-measured models (two in vLLM, ten in SGLang)
predicted from its nearest other is off by 5% in median (27% at the 90th percentile, 40 shapes
and TPs). Other backends' kernels are one format's
each (OpenAI's Triton kernel, FlashInfer's): their table alone."""


def backend_tables(table: str, kernel: str | None) -> tuple[str, ...]:
    """The fused-MoE tables whose measurements with `kernel`'s backend time experts of `table`:
    both W4A16 tables for Marlin's kernel, else `table` itself."""
    return W4A16_TABLES if kernel == "marlin" and table in W4A16_TABLES else (table,)


SECOND_FRAMEWORK = "sglang_"
"""How the kernel of a fused-MoE curve measured in SGLang, not vLLM, is named: the Marlin shapes
vLLM's tables lack (`simcore.calibration.aiconfigurator`). SGLang's Marlin MoE kernel is vLLM's
(`fused_marlin_moe`), so its curves join Marlin's family (`KERNEL_BACKENDS`)."""


def measured_shapes(profile: KernelProfile, dtype: str | tuple[str, ...], routing: str,
                    kernel: str | None = None) -> list[tuple]:
    """The profile's fused-MoE keys of `dtype` (a table, or several) and `routing` without
    expert parallelism (with `kernel`, only those measured with a kernel whose name holds it:
    one backend's family)."""
    tables = (dtype,) if isinstance(dtype, str) else dtype
    return [k for k in profile.moe_keys() if k[0] in tables and k[6] == 1 and k[7] == routing
            and (kernel is None or kernel in (profile.moe_kernel(k) or ""))]


def _shape(key: tuple) -> ExpertShape:
    _, hidden, inter, topk, experts, tp = key[:6]
    return ExpertShape(hidden, inter / tp, topk, experts)


def nearest(profile: KernelProfile, dtype: str | tuple[str, ...], routing: str,
            shape: ExpertShape, exclude: tuple | None = None, kernel: str | None = None
            ) -> tuple | None:
    """The measured key nearest to `shape` (`exclude`: a model's (hidden, inter, topk, experts)
    left out; `kernel`: as `measured_shapes`), or None when the table has none."""
    return _closest(measured_shapes(profile, dtype, routing, kernel), shape, exclude)


def _closest(keys: list[tuple], shape: ExpertShape, exclude: tuple | None) -> tuple | None:
    """`nearest` among `keys`."""
    keys = [k for k in keys if exclude is None or k[1:5] != exclude]
    if not keys:
        return None
    return min(keys, key=lambda k: (_distance(shape, _shape(k)), k))


def transfer(profile: KernelProfile, key: tuple, shape: ExpertShape, weight_bytes: float,
             table_weight_bytes: float, flops: float, bandwidth: float
             ) -> Callable[[float], float]:
    """`t -> seconds` of one routed-expert layer of `shape` (weights of `weight_bytes`), timed
    by the measured curve `key` (weights of `table_weight_bytes`) at the same tokens per
    expert, through the roofline at `flops` and `bandwidth`."""
    curve = profile.moe_curve(*key)
    near = _shape(key)
    scale = shape.routed_share / near.routed_share

    def seconds(t: float) -> float:
        t = t if t > 1.0 else 1.0         # the measured curves time fewer tokens as one
        t2 = t * scale
        return (curve(t2) * experts_roofline_s(shape, t, weight_bytes, flops, bandwidth)
                / experts_roofline_s(near, t2, table_weight_bytes, flops, bandwidth))

    return seconds


@dataclass(frozen=True)
class TransferError:
    """Leave-one-model-out errors of the transfer on one table of a profile."""

    median: float
    """Median |relative error| over the shapes and `TOKENS`."""
    p90: float
    """Its 90th percentile: the transfer's error bound."""
    signed: float
    """Median signed relative error."""
    n: int
    """Shapes (model and TP) predicted."""


_ERRORS: dict[tuple, TransferError | None] = {}


def leave_one_out(profile: KernelProfile, dtype: str | tuple[str, ...], routing: str,
                  weight_bytes: float | tuple[float, ...], flops: float, bandwidth: float,
                  kernel: str | None = None) -> TransferError | None:
    """Each measured shape of the table (or of the tables `dtype`, each with its weights' bytes
    in `weight_bytes`; `kernel`: of one kernel family, as `measured_shapes`) predicted from its
    nearest other model's shape, at `TOKENS`; None when the tables hold fewer than two models.
    Memoized per profile digest."""
    memo = (profile.digest, dtype, routing, weight_bytes, flops, bandwidth, kernel)
    if memo in _ERRORS:
        return _ERRORS[memo]
    tables = (dtype,) if isinstance(dtype, str) else dtype
    wbs = (weight_bytes,) if isinstance(weight_bytes, (int, float)) else weight_bytes
    bytes_of = dict(zip(tables, wbs))
    keys = measured_shapes(profile, tables, routing, kernel)
    errors, n = [], 0
    for key in keys:
        near = _closest(keys, _shape(key), key[1:5])
        if near is None:
            continue
        n += 1
        pred = transfer(profile, near, _shape(key), bytes_of[key[0]], bytes_of[near[0]], flops,
                        bandwidth)
        meas = profile.moe_curve(*key)
        errors += [pred(t) / meas(t) - 1.0 for t in TOKENS]
    out = None
    if errors:
        a = np.abs(errors)
        out = TransferError(float(np.median(a)), float(np.quantile(a, 0.9)),
                            float(np.median(errors)), n)
    _ERRORS[memo] = out
    return out
