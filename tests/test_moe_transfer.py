"""Weight-only formats on GPUs without fp8 tensor cores, and fused-MoE shapes the kernel
profile did not measure: timed from the measurements the profile has, with measured errors."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simcore.calibration.kernels import shipped_kernel_profile
from simcore.calibration.moe_transfer import (
    ExpertShape,
    experts_roofline_s,
    leave_one_out,
    nearest,
    transfer,
)
from simcore.compute.base import StepShape
from simcore.compute.derived_kernels import (
    MARLIN_FRAMEWORK_ERROR, WEIGHT_ONLY_ERROR, weight_only, weight_only_ratio)
from simcore.compute.kernel_model import KernelModel, gemm_dtype, moe_dtype, table_weight_dtype
from simcore.hardware import get_gpu
from simcore.model.arch import dtype_bytes
from simcore.model.presets import load_preset

A100 = get_gpu("A100-80GB")
FLOPS, BW = 312e12, 2.0e12


def test_weight_only_is_a_quantized_format_on_a_gpu_without_fp8_tensor_cores():
    assert weight_only("fp8", A100) and weight_only("fp8_block", A100)
    assert weight_only("mxfp4", A100) and weight_only("int4", A100)
    assert not weight_only("bf16", A100)
    assert not weight_only("fp8", get_gpu("H100-SXM"))


@given(st.floats(1e-9, 1e-3), st.floats(1e-6, 1e-1), st.floats(0, 1e-6),
       st.sampled_from([0.5, 4.25 / 16, 0.25]))
def test_weight_only_ratio_halves_memory_bound_steps_and_keeps_compute_bound_ones(
        flop_s, weight_s, other_s, bytes_ratio):
    r = weight_only_ratio(flop_s, weight_s, other_s, bytes_ratio)
    assert r(0.0) == pytest.approx(bytes_ratio)
    assert 0 < bytes_ratio <= r(1.0) <= 1.0
    huge = 1e6 * weight_s / bytes_ratio / flop_s
    assert r(huge) == pytest.approx(1.0)


def test_fp8_on_a100_takes_marlins_measurements_at_fp8_weight_reads():
    """Qwen3-235B in fp8 at TP 4 on A100 (vLLM: Marlin W8A16): no roofline part but the
    elementwise passes; the experts are timed by the nearest shape Marlin was measured at on
    A100 (SGLang's int4 tables: vLLM's Marlin kernel, which AIConfigurator measured in SGLang
    only there), moved to fp8's weight reads: fewer bytes than bf16's at a decode, but not half
    its time (Marlin reads them slower than the bf16 kernel)."""
    arch, prof = load_preset("qwen3-235b-a22b"), shipped_kernel_profile("a100-80gb-aiconfigurator")
    fp8 = KernelModel(arch, A100, profile=prof, tp=4, weight_dtype="fp8")
    bf16 = KernelModel(arch, A100, profile=prof, tp=4, weight_dtype="bf16")
    assert not any(f.startswith(("routed experts", "attn GEMMs")) for f in fp8.fallbacks())
    parts = fp8.assumed_parts()
    [how] = [p for p in parts if p.startswith("routed experts")]
    assert how.startswith("routed experts with fp8 weights (weight-only on A100-80GB")
    assert "nearest shape of the marlin kernels" in how and "measured in SGLang" in how
    assert "to fp8 weight reads" in how
    assert any(p.startswith("attn GEMMs with fp8 weights") for p in parts)
    assert fp8._sources["moe"] == {"derived"} and bf16._sources["moe"] == {"measured"}

    # The routed experts alone (the step's "moe" op also holds the 16-bit router).
    assert 0.5 * bf16._moe_meas(1) < fp8._moe_meas(1) < bf16._moe_meas(1)
    assert fp8._moe_meas(0) == fp8._moe_meas(1)     # no token is timed as one, as measured
    shape = StepShape.from_requests([(1, 1000)] * 64)
    assert fp8.step_time(shape).compute_s < bf16.step_time(shape).compute_s
    # Another format's table, another framework's measurement: at least both floors.
    assert fp8.op_error_bounds()["moe"] >= max(0.35, MARLIN_FRAMEWORK_ERROR)


def test_without_marlin_measurements_fp8_experts_take_the_bf16_table_at_fp8_reads():
    """The same model on an A100 profile without Marlin's curves (as a profile fitted before
    SGLang's were read): the bf16 measurement of its shape, the expert weights read at fp8's
    bytes, half the time on a decode step and the bf16 time on a large prefill, at the declared
    bound."""
    from simcore.calibration.kernels import KernelProfile, KernelProfileData

    data = shipped_kernel_profile("a100-80gb-aiconfigurator").data.model_dump()
    data["moe"] = [c for c in data["moe"] if c["dtype"] not in ("int4_wo", "mxfp4_w4a16")]
    prof = KernelProfile(KernelProfileData.model_validate(data), source="no Marlin")
    arch = load_preset("qwen3-235b-a22b")
    fp8 = KernelModel(arch, A100, profile=prof, tp=4, weight_dtype="fp8")
    bf16 = KernelModel(arch, A100, profile=prof, tp=4, weight_dtype="bf16")
    [how] = [p for p in fp8.assumed_parts() if p.startswith("routed experts")]
    assert "the bf16 fused-MoE measurement of this shape at TP 4" in how
    assert "no Marlin measurement on this GPU at this routing" in how
    assert fp8._moe_meas(1) == pytest.approx(0.5 * bf16._moe_meas(1), rel=0.01)
    assert fp8._moe_meas(16384) == pytest.approx(bf16._moe_meas(16384), rel=0.01)
    assert fp8.op_error_bounds()["moe"] == pytest.approx(WEIGHT_ONLY_ERROR)


def test_the_bf16_kernel_at_4_bit_reads_is_faster_than_marlin_on_a100():
    """The check behind timing weight-only experts by Marlin's measurements: on A100, where
    vLLM's bf16 fused MoE and (in SGLang) vLLM's Marlin kernel with int4 weights were measured
    at the same shapes, the bf16 time at int4's weight reads (`experts_roofline_s`' ratio) is
    1.23 times faster than Marlin in median and, as a prediction of Marlin's time, 52% off at
    the 90th percentile: past the declared bound of that path (`WEIGHT_ONLY_ERROR`)."""
    import numpy as np

    from simcore.calibration.moe_transfer import TOKENS, _shape, experts_roofline_s

    prof = shipped_kernel_profile("a100-80gb-aiconfigurator")
    flops, bw = 0.7 * A100.bf16_flops, 0.8 * A100.hbm_bandwidth_bytes_per_s
    ratios = []
    for key in prof.moe_keys():
        bf16 = prof.moe_curve("bf16", *key[1:])
        if key[0] != "int4_wo" or key[6] != 1 or bf16 is None:
            continue
        assert prof.moe_kernel(key).startswith("sglang_") and "marlin" in prof.moe_kernel(key)
        shape = _shape(key)
        for t in TOKENS:
            r = (experts_roofline_s(shape, t, dtype_bytes("int4"), flops, bw)
                 / experts_roofline_s(shape, t, 2.0, flops, bw))
            ratios.append(prof.moe_curve(*key)(t) / (r * bf16(t)))
    ratios = np.asarray(ratios)
    assert len(ratios) > 300
    assert np.median(ratios) == pytest.approx(1.23, abs=0.03)
    assert np.quantile(np.abs(1 / ratios - 1), 0.9) == pytest.approx(0.52, abs=0.02)
    assert np.quantile(np.abs(1 / ratios - 1), 0.9) > WEIGHT_ONLY_ERROR


class _Profile:
    """A profile stand-in whose fused-MoE curves are the roofline of their shapes at one
    efficiency: the transfer must reproduce them exactly."""

    digest = "synthetic"

    def __init__(self, keys, efficiency=0.6):
        self.keys, self.eff = keys, efficiency

    def moe_keys(self):
        return list(self.keys)

    def moe_curve(self, dtype, h, inter, k, e, tp, ep, routing):
        shape = ExpertShape(h, inter / tp, k, e)
        return lambda t: experts_roofline_s(shape, t, 2.0, FLOPS, BW) / self.eff


KEYS = [("bf16", h, i, k, e, tp, 1, "power_law_1.2")
        for h, i, k, e in [(2048, 768, 8, 128), (4096, 1536, 8, 128), (7168, 2048, 8, 256),
                           (4096, 14336, 2, 8)] for tp in (1, 2, 4)]


@settings(max_examples=30)
@given(st.integers(1024, 8192), st.integers(256, 16384), st.integers(1, 8),
       st.sampled_from([8, 32, 64, 128, 256]), st.sampled_from([1, 2, 4, 8]),
       st.floats(1, 20000))
def test_transfer_is_exact_where_kernels_run_at_one_roofline_efficiency(h, inter, k, e, tp, t):
    p = _Profile(KEYS)
    target = ExpertShape(h, inter / tp, min(k, e), e)
    key = nearest(p, "bf16", "power_law_1.2", target)
    for wb in (2.0, 1.0, 4.25 / 8):
        fn = transfer(p, key, target, wb, 2.0, FLOPS, BW)
        assert fn(t) == pytest.approx(experts_roofline_s(target, t, wb, FLOPS, BW) / p.eff,
                                      rel=1e-9)
        assert fn(0.0) == fn(1.0) > 0
    err = leave_one_out(p, "bf16", "power_law_1.2", 2.0, FLOPS, BW)
    assert err.n == len(KEYS) and err.p90 < 1e-9


def test_nearest_shape_is_the_measured_one_itself_and_excludes_its_model():
    p = _Profile(KEYS)
    shape = ExpertShape(4096, 1536 / 4, 8, 128)
    assert nearest(p, "bf16", "power_law_1.2", shape) == ("bf16", 4096, 1536, 8, 128, 4, 1,
                                                          "power_law_1.2")
    other = nearest(p, "bf16", "power_law_1.2", shape, exclude=(4096, 1536, 8, 128))
    assert other[1:5] != (4096, 1536, 8, 128)
    assert nearest(p, "fp8", "power_law_1.2", shape) is None


@pytest.mark.parametrize("pid", ["a100-80gb-aiconfigurator", "h100-sxm-aiconfigurator",
                                 "l40s-aiconfigurator"])
def test_leave_one_model_out_error_of_the_shipped_bf16_tables(pid):
    """Each model's measured fused-MoE predicted from its nearest other model's: a median
    error of a few percent to 15% on the shipped profiles' bf16 tables (large at the tiny
    per-GPU shapes of TP 16 and 32: the p90)."""
    p = shipped_kernel_profile(pid)
    gpu = get_gpu(p.gpu)
    err = leave_one_out(p, "bf16", "power_law_1.2", 2.0, 0.7 * gpu.bf16_flops,
                        0.8 * gpu.hbm_bandwidth_bytes_per_s)
    assert err.n >= 40
    assert err.median < 0.15 and abs(err.signed) < 0.05
    assert 0.2 < err.p90 < 1.0


def test_an_unmeasured_moe_shape_is_timed_from_the_nearest_measured_one():
    """gpt-oss-120b with bf16 experts on H100 (the profile measured gpt-oss's shape in MXFP4
    only): the experts come from the nearest bf16 shape, with the transfer's measured p90 as
    their bound."""
    from simcore.config import parse_config
    from simcore.simulate import build_deployment
    cfg = {"model": {"name": "openai/gpt-oss-120b", "dtype": "bf16", "max_model_len": 8192},
           "hardware": {"gpu": "H100-SXM"}, "compute": {"kind": "calibrated"},
           "parallelism": {"tensor_parallel_size": 4},
           "workload": {"num_prompts": 1, "dataset": {"kind": "random", "input_len": 10,
                                                     "output_len": 1}}}
    m = build_deployment(parse_config(cfg, source="t")).step_model
    assert m._sources["moe"] == {"derived"}
    assert not any(f.startswith("routed experts") for f in m.fallbacks())
    [how] = [p for p in m.assumed_parts() if p.startswith("routed experts")]
    assert "bf16 table's nearest shape" in how and "p90" in how
    gpu = get_gpu("H100-SXM")
    a = m.assumptions
    err = leave_one_out(m.profile, "bf16", m.moe_routing, 2.0,
                        a.gemm_flops_fraction * gpu.bf16_flops,
                        a.hbm_bandwidth_fraction * gpu.hbm_bandwidth_bytes_per_s)
    assert m.op_error_bounds()["moe"] == pytest.approx(err.p90)


@pytest.mark.parametrize("layout", ["triton", "marlin"])
def test_mxfp4_experts_move_only_their_layouts_kernel_measurements(layout):
    """A gpt-oss-like MXFP4 model with 64 experts (unmeasured) on H100: the H100 tables hold
    gpt-oss's shapes in OpenAI's Triton kernel, and two other models in Marlin (one MXFP4, one
    int4: Marlin's MoE kernel runs both). In the Triton layout the experts take the nearest
    Triton-measured shape, bounded by moving gpt-oss-20b's 32 experts to 120b's 128 and back
    (large: 4x the experts); in Marlin's, the nearest Marlin-measured shape of either 4-bit
    table, bounded by moving each of the two Marlin models to the other."""
    import dataclasses

    prof = shipped_kernel_profile("h100-sxm-aiconfigurator")
    gpu = get_gpu("H100-SXM")
    arch = dataclasses.replace(load_preset("gpt-oss-20b"), num_experts=64)
    m = KernelModel(arch, gpu, profile=prof, weight_dtype="mxfp4", mxfp4_moe_layout=layout)
    shape = ExpertShape(arch.hidden_size, arch.moe_intermediate_size, 4, 64)
    a = m.assumptions
    flops = a.gemm_flops_fraction * gpu.bf16_flops
    bw = a.hbm_bandwidth_fraction * gpu.hbm_bandwidth_bytes_per_s
    [how] = [p for p in m.assumed_parts() if p.startswith("routed experts")]
    assert m._sources["moe"] == {"derived"}
    assert f"nearest shape of the {layout} kernels" in how
    if layout == "triton":
        key = nearest(prof, "mxfp4_w4a16", m.moe_routing, shape, kernel="triton")
        assert "triton" in prof.moe_kernel(key) and key[1:5] in ((2880, 2880, 4, 32),
                                                                 (2880, 2880, 4, 128))
        err = leave_one_out(prof, "mxfp4_w4a16", m.moe_routing, 4.25 / 8, flops, bw, "triton")
        assert err.n == 12 and m.op_error_bounds()["moe"] == pytest.approx(err.p90)
    else:
        tables = ("mxfp4_w4a16", "int4_wo")
        key = nearest(prof, tables, m.moe_routing, shape, kernel="marlin")
        assert "marlin" in prof.moe_kernel(key)
        assert "mxfp4_w4a16/int4_wo tables" in how
        err = leave_one_out(prof, tables, m.moe_routing,
                            (dtype_bytes("mxfp4"), dtype_bytes("int4")), flops, bw, "marlin")
        # Two models at several TPs each; each predicted from the other.
        assert err.n >= 8 and err.median < 0.15
        assert m.op_error_bounds()["moe"] == pytest.approx(err.p90)
        # Without the layout's filter a Triton-measured model would have been the nearest.
        assert "triton" in prof.moe_kernel(nearest(prof, "mxfp4_w4a16", m.moe_routing, shape))


def test_marlin_experts_on_hopper_are_slower_at_a_prefill_and_faster_at_a_decode():
    """gpt-oss-120b's experts on H100 in Marlin's layout (vLLM 0.10-0.11 without
    triton_kernels) are timed by the Marlin measurements moved to its shape: against the
    Triton kernel's measurement of that shape, faster at a decode's few tokens per expert and
    well over 1.5 times as slow at a long prefill's, as Marlin's mma.sync kernels against
    Triton's Hopper ones (vLLM pull request 27523: gpt-oss-120b on Hopper with Triton's kernel
    took 35% more latency in `vllm bench latency` than with Marlin's)."""
    prof = shipped_kernel_profile("h100-sxm-aiconfigurator")
    gpu = get_gpu("H100-SXM")
    arch = load_preset("gpt-oss-120b")
    marlin = KernelModel(arch, gpu, profile=prof, weight_dtype="mxfp4",
                         mxfp4_moe_layout="marlin")
    triton = KernelModel(arch, gpu, profile=prof, weight_dtype="mxfp4",
                         mxfp4_moe_layout="triton")
    assert marlin._sources["moe"] == {"derived"} and triton._sources["moe"] == {"measured"}
    for t in (1, 4, 16):
        assert marlin._moe_meas(t) < 0.9 * triton._moe_meas(t), t
    assert marlin._moe_meas(8192) > 1.5 * triton._moe_meas(8192)


def test_a_family_of_two_tables_moves_each_model_by_its_own_tables_bytes():
    """Marlin's family on H100 spans the MXFP4 and the int4 table, measured in vLLM (two models)
    and in SGLang (ten more): each model is predicted from its nearest other with the predicted
    model's weight bytes and its source's (5% median, 27% p90 over the 40 shapes and TPs), and
    the same bytes taken for both would predict worse."""
    import numpy as np

    from simcore.calibration.moe_transfer import TOKENS, _shape, measured_shapes

    prof = shipped_kernel_profile("h100-sxm-aiconfigurator")
    gpu = get_gpu("H100-SXM")
    flops, bw = 0.7 * gpu.bf16_flops, 0.8 * gpu.hbm_bandwidth_bytes_per_s
    tables = ("mxfp4_w4a16", "int4_wo")
    wb = {"mxfp4_w4a16": dtype_bytes("mxfp4"), "int4_wo": dtype_bytes("int4")}
    assert wb["mxfp4_w4a16"] != wb["int4_wo"]
    err = leave_one_out(prof, tables, "power_law_1.2", tuple(wb.values()), flops, bw, "marlin")
    keys = measured_shapes(prof, tables, "power_law_1.2", "marlin")
    assert err.n == len(keys) == 40 and {k[0] for k in keys} == set(tables)
    assert {prof.moe_kernel(k).startswith("sglang_") for k in keys} == {True, False}
    errors = []
    for key in keys:
        [near] = [k for k in keys if k[1:5] != key[1:5] and k == nearest(
            prof, tables, "power_law_1.2", _shape(key), key[1:5], "marlin")]
        f = transfer(prof, near, _shape(key), wb[key[0]], wb[near[0]], flops, bw)
        errors += [f(t) / prof.moe_curve(*key)(t) - 1.0 for t in TOKENS]
    assert err.median == pytest.approx(float(np.median(np.abs(errors))))
    assert err.median == pytest.approx(0.052, abs=0.005)
    assert err.p90 == pytest.approx(0.273, abs=0.01)
    same = leave_one_out(prof, tables, "power_law_1.2", (wb["mxfp4_w4a16"],) * 2, flops, bw,
                         "marlin")
    # Each table's own bytes predict better than one format's for both.
    assert same.median > err.median + 0.005 and same.p90 > err.p90


def test_other_backends_do_not_pool_the_int4_table():
    """Only Marlin's kernel runs both 4-bit formats: an unmeasured MXFP4 shape in the Triton
    layout moves the Triton-measured MXFP4 shapes alone."""
    import dataclasses

    from simcore.calibration.moe_transfer import backend_tables

    assert backend_tables("mxfp4_w4a16", "marlin") == ("mxfp4_w4a16", "int4_wo")
    assert backend_tables("mxfp4_w4a16", "triton") == ("mxfp4_w4a16",)
    assert backend_tables("bf16", "marlin") == ("bf16",)
    arch = dataclasses.replace(load_preset("gpt-oss-20b"), num_experts=64)
    m = KernelModel(arch, get_gpu("H100-SXM"), profile=shipped_kernel_profile(
        "h100-sxm-aiconfigurator"), weight_dtype="mxfp4", mxfp4_moe_layout="triton")
    [how] = [p for p in m.assumed_parts() if p.startswith("routed experts")]
    assert "int4_wo" not in how and "the mxfp4_w4a16 table's nearest shape" in how


class _MoeIndex:
    """A kernel profile's fused-MoE index alone: keys and the kernel of each."""

    def __init__(self, kernels: dict):
        self.kernels = kernels

    def moe_keys(self):
        return list(self.kernels)

    def moe_kernel(self, key):
        return self.kernels.get(key)


def test_the_layouts_backend_times_the_experts_only_with_two_models_measured():
    """`_other_backend`: the shape measured with Triton's kernel, Marlin's layout; Marlin's
    measurements of other models take over only where there are two of them (one predicted
    from the other bounds the move), never for a backend that measured the shape itself."""
    from simcore.compute.kernel_model import _other_backend

    arch = load_preset("gpt-oss-20b")
    own = ("mxfp4_w4a16", arch.hidden_size, arch.moe_intermediate_size,
           arch.num_experts_per_tok, arch.num_experts, 1, 1, "balanced")
    a = ("mxfp4_w4a16", 3584, 3072, 16, 896, 1, 1, "balanced")
    b = ("int4_wo", 7168, 2048, 8, 384, 1, 1, "balanced")
    triton, marlin = "vllm_gptossmxfp4moe_triton", "vllm_marlin_marlinexperts"

    def other(kernels, layout="marlin", dtype="mxfp4"):
        return _other_backend(_MoeIndex(kernels), "mxfp4_w4a16", arch, 1, "balanced", dtype,
                              layout)

    assert other({own: triton, a: marlin, b: marlin})
    assert not other({own: triton, a: marlin})                 # one Marlin model
    assert not other({own: triton, a: marlin, a[:5] + (2, 1, "balanced"): marlin})  # one, 2 TPs
    assert not other({own: marlin, a: marlin, b: marlin})      # Marlin measured the shape
    assert not other({own: triton, a: marlin, b: marlin}, layout="triton")
    assert not other({own: triton, a: marlin, b: marlin}, layout="unpadded")
    assert not other({own: triton, a: marlin, b: marlin}, dtype="bf16")
    assert not other({a: marlin, b: marlin})                   # the shape unmeasured


def test_without_a_derived_time_the_measured_shape_stays(monkeypatch):
    """Should the layout's backend give no time after all, the other backend's measurement of
    the shape times the experts, with the note that the layout sets their padding alone."""
    import simcore.compute.kernel_model as km

    monkeypatch.setattr(km, "derived_experts", lambda *a, **k: None)
    m = KernelModel(load_preset("gpt-oss-20b"), get_gpu("H100-SXM"),
                    profile=shipped_kernel_profile("h100-sxm-aiconfigurator"),
                    weight_dtype="mxfp4", mxfp4_moe_layout="marlin")
    assert m._sources["moe"] == {"measured"}
    [note] = [p for p in m.assumed_parts() if "mxfp4_moe_layout" in p]
    assert "'marlin'" in note and "padding" in note


@pytest.mark.parametrize("weight", ["bf16", "fp16", "fp8", "fp8_block", "int4", "mxfp4", "nvfp4"])
def test_a_tables_weight_dtype_is_what_selects_it(weight):
    """`dse calibrate`'s leave-one-out moves a table's shapes by its weights' bytes: those of the
    weight dtype whose GEMM or fused-MoE table it is."""
    for table in (gemm_dtype(weight), moe_dtype(weight)):
        assert dtype_bytes(table_weight_dtype(table)) == dtype_bytes(weight)
    assert table_weight_dtype("w4a8_mxfp4_mxfp8") == "mxfp4"
