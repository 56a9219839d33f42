"""Kernel profiles fitted from AIConfigurator's vLLM kernel measurements: the log-log grid, the
profile format, the shipped profiles (re-fitted byte for byte from the installed package), and
the step-time model that uses them."""

import gzip
import hashlib
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simcore.calibration.grid import LogGrid, fill_along
from simcore.calibration.kernels import (
    HOST_BOUND_RATIO, KernelProfile, shipped_kernel_profile, shipped_kernel_profile_ids)
from simcore.compute.base import StepShape
from simcore.compute.kernel_model import KernelModel
from simcore.compute.attention_views import prompt_len
from simcore.config import SimConfig
from simcore.errors import ConfigError
from simcore.hardware import get_gpu
from simcore.model.presets import load_preset
from simcore.simulate import simulate

SHIPPED = {"h100-sxm-aiconfigurator": "H100-SXM", "h200-aiconfigurator": "H200",
           "b200-aiconfigurator": "B200", "a100-80gb-aiconfigurator": "A100-80GB",
           "l40s-aiconfigurator": "L40S", "b300-aiconfigurator": "B300",
           "gb200-aiconfigurator": "GB200"}
SYSTEMS = {"h100-sxm-aiconfigurator": "h100_sxm", "h200-aiconfigurator": "h200_sxm",
           "b200-aiconfigurator": "b200_sxm", "a100-80gb-aiconfigurator": "a100_sxm",
           "l40s-aiconfigurator": "l40s", "b300-aiconfigurator": "b300_sxm",
           "gb200-aiconfigurator": "gb200"}


# ---- the grid ------------------------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(a=st.floats(-1.5, 1.5), b=st.floats(0, 2), c=st.floats(1e-6, 1e-2),
       x=st.floats(1, 1000), y=st.floats(1, 1000))
def test_grid_is_exact_for_power_laws_inside(a, b, c, x, y):
    xs, ys = [1, 3, 10, 100, 1000], [1, 7, 50, 1000]
    vals = np.array([[c * u ** a * v ** b for v in ys] for u in xs])
    g = LogGrid([xs, ys], vals, (2.0, 2.0))
    assert g(x, y) == pytest.approx(c * x ** a * y ** b, rel=1e-9)


def test_grid_is_flat_below_and_capped_above():
    xs = [1, 10, 100]
    g = LogGrid([xs], np.array([1.0, 4.0, 64.0]), (1.0,))   # last slope log(16)/log(10) > 1
    assert g(0.5) == 1.0
    assert g(1000) == pytest.approx(64.0 * 10)               # capped at linear
    g2 = LogGrid([xs], np.array([1.0, 1.0, 2.0]), (1.0,))
    assert g2(1000) == pytest.approx(2.0 * 10 ** math.log10(2))   # its own slope below the cap


def test_grid_uses_measured_corners_and_none_without_any():
    vals = np.array([[1.0, np.nan], [np.nan, np.nan]])
    g = LogGrid([[1, 2], [1, 2]], vals, (1.0, 1.0))
    assert g(1.5, 1.5) == pytest.approx(1.0)
    g = LogGrid([[1, 2], [1, 2]], np.full((2, 2), np.nan), (1.0, 1.0))
    assert g(1.5, 1.5) is None


@settings(max_examples=200, deadline=None)
@given(data=st.data(), n0=st.integers(1, 5), n1=st.integers(1, 6),
       caps=st.tuples(st.floats(0, 2), st.floats(0, 2)),
       floors=st.tuples(st.floats(0, 0.5), st.floats(0, 0.5)))
def test_grid_along_its_last_axis_is_the_grid_to_the_bit(data, n0, n1, caps, floors):
    """`along` and a two-axis grid's `__call__` repeat the N-axis arithmetic (`_call_any`):
    missing corners, single-value axes, points below, inside and above each axis, a fixed value
    above its axis."""
    steps = st.floats(0.1, 100.0)
    a0 = np.cumsum(data.draw(st.lists(steps, min_size=n0, max_size=n0)))
    a1 = np.cumsum(data.draw(st.lists(steps, min_size=n1, max_size=n1)))
    flat = data.draw(st.lists(st.one_of(st.floats(1e-6, 1.0), st.just(math.nan)),
                              min_size=n0 * n1, max_size=n0 * n1))
    g = LogGrid([a0, a1], np.array(flat).reshape(n0, n1), caps,
                floors if data.draw(st.booleans()) else None)
    points = st.one_of(st.floats(-1.0, 500.0), st.sampled_from([*a0.tolist(), *a1.tolist()]))
    for p in data.draw(st.lists(points, min_size=1, max_size=3)):
        along = g.along(p)
        for x in data.draw(st.lists(points, min_size=1, max_size=10)):
            assert along(x) == g(p, x) == g._call_any((p, x))


def test_grid_along_checks_its_fixed_values_and_passes_other_grids_through():
    g3 = LogGrid([[1, 2], [1, 2], [1, 4]], np.arange(1.0, 9.0).reshape(2, 2, 2), (1, 1, 1))
    assert g3.along(1.5, 1.2)(3.0) == g3(1.5, 1.2, 3.0)
    with pytest.raises(ValueError, match="2 fixed values"):
        LogGrid([[1, 2], [1, 2]], np.ones((2, 2)), (1, 1)).along(1.0, 2.0)


def test_fill_extends_each_line_with_its_last_slope():
    vals = np.array([[1.0, 2.0, np.nan, np.nan], [1.0, 1.0, 1.0, np.nan]])
    out = fill_along(vals, np.array([1, 2, 4, 8]), 1, cap=1.0)
    assert out[0].tolist() == pytest.approx([1, 2, 4, 8])
    assert out[1, 3] == pytest.approx(1.0)


def test_prompt_len_inverts_causal_pairs():
    for n in (1, 7, 512, 4096):
        assert prompt_len(n * (n + 1) / 2) == pytest.approx(n)


# ---- shipped profiles ----------------------------------------------------------------------

def test_shipped_kernel_profiles_are_listed_with_their_gpus():
    assert set(shipped_kernel_profile_ids()) == set(SHIPPED)
    for pid, gpu in SHIPPED.items():
        p = shipped_kernel_profile(pid)
        assert p.gpu == gpu and get_gpu(gpu).name == gpu
        prov = p.data.provenance
        assert prov.package == "aiconfigurator-core" and prov.files
        assert all(len(f.sha256) == 64 and f.rows > 0 for f in prov.files)
        assert "gemm/bf16" in p.data.errors and "attention/generation/bf16" in p.data.errors


@pytest.mark.parametrize("pid", ["h100-sxm-aiconfigurator", "h200-aiconfigurator",
                                 "b200-aiconfigurator"])
def test_attention_and_moe_are_measured_on_hopper_and_blackwell(pid):
    p = shipped_kernel_profile(pid)
    assert p.attention_grid("generation", "bf16", 32, 8, 128) is not None
    assert p.attention_grid("context", "fp8", 64, 8, 128) is not None
    assert p.moe_curve("bf16", 4096, 1536, 8, 128, 4, 1) is not None     # Qwen3-235B, TP4
    assert p.moe_curve("fp8_block", 7168, 2048, 8, 256, 8, 1) is not None  # DeepSeek-V3, TP8
    for family, stats in p.data.errors.items():
        assert stats.n > 0 and stats.median < 0.1, family


def test_held_out_values_are_not_in_the_grid():
    p = shipped_kernel_profile("h100-sxm-aiconfigurator")
    g = p.data.gemm[0]
    for axis in ("m", "n", "k"):
        held = set(g.held_out[axis])
        assert held and not held & set(getattr(g, axis))
    a = p.data.attention[0]
    assert set(a.held_out["seq"]) and not set(a.held_out["seq"]) & set(a.seq)


def test_gemm_lookup_matches_measured_cells_and_scales_beyond():
    p = shipped_kernel_profile("h100-sxm-aiconfigurator")
    g = next(t for t in p.data.gemm if t.dtype == "bf16")
    i, j, k = len(g.m) - 1, g.n.index(4096), g.k.index(4096)
    cell = g.time_us[(i * len(g.n) + j) * len(g.k) + k] / 1e6
    assert p.gemm_time_s("bf16", g.m[-1], 4096, 4096) == pytest.approx(cell, rel=1e-9)
    assert p.gemm_time_s("bf16", 2 * g.m[-1], 4096, 4096) == pytest.approx(2 * cell, rel=0.05)
    # A 128k-vocabulary LM head is wider than any measured n: time in proportion to n.
    wide = p.gemm_time_s("bf16", 64, 2 * g.n[-1], 4096)
    assert wide == pytest.approx(2 * p.gemm_time_s("bf16", 64, g.n[-1], 4096), rel=0.05)
    assert p.gemm_time_s("int4_wo", 64, 4096, 4096) is None


def test_profile_round_trips_and_bad_files_name_the_problem(tmp_path):
    p = shipped_kernel_profile("a100-80gb-aiconfigurator")
    p.save(tmp_path / "p.json.gz")
    p.save(tmp_path / "p.json")
    assert KernelProfile.load(tmp_path / "p.json.gz").to_json() == p.to_json()
    assert KernelProfile.load(tmp_path / "p.json").to_json() == p.to_json()
    raw = json.loads(p.to_json())
    raw["gemm"][0]["time_us"] = raw["gemm"][0]["time_us"][:-1]
    (tmp_path / "bad.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match=r"bad.json: field 'gemm.0': .*len\(m\)"):
        KernelProfile.load(tmp_path / "bad.json")
    (tmp_path / "v.json").write_text(json.dumps({**raw, "version": 9}))
    with pytest.raises(ConfigError, match="reads version 1 kernel profiles"):
        KernelProfile.load(tmp_path / "v.json")
    (tmp_path / "x.json.gz").write_bytes(b"not gzip")
    with pytest.raises(ConfigError, match="x.json.gz: cannot be read"):
        KernelProfile.load(tmp_path / "x.json.gz")


def _refit_params():
    return [pytest.param(pid, marks=pytest.mark.slow) if pid != "a100-80gb-aiconfigurator"
            else pid for pid in SHIPPED]


@pytest.mark.parametrize("pid", _refit_params())
def test_shipped_profiles_equal_a_fresh_fit_from_the_installed_package(pid):
    aic = pytest.importorskip("simcore.calibration.aiconfigurator")
    try:
        aic.data_root()
    except ConfigError:
        pytest.skip("aiconfigurator-core is not installed")
    fresh = aic.fit_system(SYSTEMS[pid])
    assert fresh.data.provenance.package_version == \
        shipped_kernel_profile(pid).data.provenance.package_version
    assert fresh.to_json() == shipped_kernel_profile(pid).to_json()


# ---- the step-time model -------------------------------------------------------------------

NAMED = ["llama-3.1-8b", "llama-3.1-70b", "qwen3-32b", "mixtral-8x7b", "qwen3-235b-a22b"]


@pytest.mark.parametrize("gpu", ["H100-SXM", "H200"])
@pytest.mark.parametrize("dtype", ["bf16", "fp8", "fp8_block"])
@pytest.mark.parametrize("name", NAMED)
def test_named_models_have_no_roofline_fallback(name, dtype, gpu):
    arch = load_preset(name)
    tp = 4 if arch.is_moe and arch.num_experts > 8 else 2   # block-fp8 experts need 128 | inter/tp
    prof = shipped_kernel_profile(f"{gpu.lower()}-aiconfigurator")
    m = KernelModel(arch, get_gpu(gpu), profile=prof, tp=tp, weight_dtype=dtype)
    assert m.fallbacks() == []
    assert any("elementwise passes" in p and "static_scaled_fp8_quant" in p
               for p in m.assumed_parts())
    bounds = m.op_error_bounds()
    for cls in ("gemm", "attention", "communication") + (("moe",) if arch.is_moe else ()):
        assert bounds[cls] < m.assumptions.relative_uncertainty, cls


def test_step_time_is_the_measured_kernels_summed_over_layers():
    arch = load_preset("llama-3.1-8b")
    gpu = get_gpu("H100-SXM")
    p = shipped_kernel_profile("h100-sxm-aiconfigurator")
    m = KernelModel(arch, gpu, profile=p)
    shape = StepShape.from_requests([(1, 999)] * 32)      # 32 decodes over 1000 KV tokens
    by_op: dict[str, float] = {}
    m.op_bounds(shape, by_op=by_op)
    L = arch.num_layers
    q, kv, h, f = 32 * 128, 8 * 128, 4096, 14336
    proj = L * (p.gemm_time_s("bf16", 32, q + 2 * kv, h) + p.gemm_time_s("bf16", 32, h, q))
    kernel = L * p.attention_grid("generation", "bf16", 32, 8, 128)(32, 1000)
    assert by_op["attention"] == pytest.approx(proj + kernel, rel=2e-3)
    mlp = L * (p.gemm_time_s("bf16", 32, 2 * f, h) + p.gemm_time_s("bf16", 32, h, f))
    assert by_op["mlp"] == pytest.approx(mlp, rel=2e-3)
    lm = p.gemm_time_s("bf16", 32, arch.vocab_size, h)
    _, mem = p.memory_curve()
    logits = 32 * arch.vocab_size
    sampler = mem(6 * logits) + mem(10 * logits)    # fp32 cast, then 10 of the 16 bytes/logit
    assert by_op["lm_head"] == pytest.approx(lm + sampler, rel=2e-3)
    # Elementwise: per layer two add+norms and the rotary pass, the activation; embedding and
    # final norm once, each kernel at its bytes.
    ew = (L * (2 * mem(32 * 4 * h * 2) + mem(32 * 2 * (q + kv) * 2) + mem(32 * 3 * f * 2))
          + mem(32 * 2 * h * 2) + mem(32 * 3 * h * 2))
    assert by_op["elementwise"] == pytest.approx(ew, rel=2e-3)


def test_memory_kernel_and_all_gather_are_fitted_with_held_out_errors():
    p = shipped_kernel_profile("h200-aiconfigurator")
    kernel, mem = p.memory_curve()
    assert kernel == "static_scaled_fp8_quant"
    # A large pass runs near the H200's HBM bandwidth (4.8 TB/s peak), a tiny one at a floor.
    assert 3.0e12 < 1e9 / mem(1e9) < 4.8e12
    assert 1e-6 < mem(1e3) < 4e-6
    assert p.error_bound("memory/static_scaled_fp8_quant") < 0.1
    ag = p.all_gather_curve(8)
    assert ag is not None and p.error_bound("all_gather/nccl") < 0.2
    assert ag(1e8) > ag(1e6) > 0
    # Without them (an older profile), the model says so and times the passes by the roofline.
    old = KernelProfile(p.data.model_copy(update={"memory": [], "all_gather": []}))
    m = KernelModel(load_preset("llama-3.1-70b"), get_gpu("H200"), profile=old, tp=4)
    assert any(f.startswith("elementwise passes and sampler: roofline") for f in m.fallbacks())
    assert "logits all-gather: roofline ring formula" in m.fallbacks()


def test_tp_logits_gather_is_nccl_all_gather_of_the_whole_vocabulary():
    arch = load_preset("llama-3.1-70b")
    p = shipped_kernel_profile("h100-sxm-aiconfigurator")
    m = KernelModel(arch, get_gpu("H100-SXM"), profile=p, tp=4)
    one = StepShape.from_requests([(1, 999)] * 64)
    ar = m._ar_meas(64)
    assert m.comm_s(one) == pytest.approx(ar + p.all_gather_curve(4)(64 * arch.vocab_size))


def test_prefill_chunk_over_a_prefix_costs_its_causal_pairs():
    arch = load_preset("llama-3.1-8b")
    p = shipped_kernel_profile("h100-sxm-aiconfigurator")
    m = KernelModel(arch, get_gpu("H100-SXM"), profile=p)
    first = m._attn_meas(StepShape.from_requests([(2048, 0)]))
    later = m._attn_meas(StepShape.from_requests([(2048, 6144)]))
    assert later > 3 * first      # 2048 x (6144 + 1024) pairs against 2048 x 1024


def test_op_scale_scales_every_measured_class():
    arch = load_preset("qwen3-235b-a22b")
    gpu = get_gpu("H200")
    p = shipped_kernel_profile("h200-aiconfigurator")
    base = KernelModel(arch, gpu, profile=p, tp=4)
    scaled = KernelModel(arch, gpu, profile=p, tp=4, op_scale={
        "gemm": 1.3, "attention": 1.3, "moe": 1.3, "elementwise": 1.3, "lm_head": 1.3,
        "communication": 1.3, "overhead": 1.3})
    for shape in (StepShape.from_requests([(1, 500)] * 16), StepShape.from_requests([(900, 0)])):
        assert scaled.step_time(shape).total_s == pytest.approx(
            1.3 * base.step_time(shape).total_s, rel=1e-9)


def _config(**over):
    d = {"name": "k", "seed": 1, "model": {"name": "meta-llama/Llama-3.1-8B"},
         "hardware": {"gpu": "H100-SXM"}, "compute": {"kind": "calibrated"},
         "uncertainty": {"method": "first_order"},
         "workload": {"num_prompts": 60, "request_rate": "inf", "max_concurrency": 16,
                      "dataset": {"kind": "random", "input_len": 256, "output_len": 32}}}
    d.update(over)
    return SimConfig.model_validate(d)


def test_calibrated_default_on_h100_is_the_kernel_profile():
    r = simulate(_config())
    prov = r["provenance"]
    assert prov["compute_profile"] == "h100-sxm-aiconfigurator"
    assert prov["profile_version"].startswith("kernels-v1+sha256:")
    assert not any("attention kernel" in f for f in prov["reference_fallbacks"])
    assert prov["measured_share_of_step_time"] > 0.7


def test_a_kernel_profile_for_another_gpu_is_refused():
    with pytest.raises(ConfigError, match="measured on H200, not on the configured H100-SXM"):
        simulate(_config(compute={"kind": "calibrated", "profile": "h200-aiconfigurator"}))


def test_a_kernel_profile_file_resolves_by_its_format(tmp_path):
    shipped_kernel_profile("h100-sxm-aiconfigurator").save(tmp_path / "mine.json")
    r = simulate(_config(compute={"kind": "calibrated", "profile": str(tmp_path / "mine.json")}))
    assert r["provenance"]["compute_profile"] == "h100-sxm-aiconfigurator"


def test_gzip_profile_is_byte_stable(tmp_path):
    p = shipped_kernel_profile("a100-80gb-aiconfigurator")
    p.save(tmp_path / "a.json.gz")
    p.save(tmp_path / "b.json.gz")
    assert (tmp_path / "a.json.gz").read_bytes() == (tmp_path / "b.json.gz").read_bytes()
    assert json.loads(gzip.decompress((tmp_path / "a.json.gz").read_bytes()))["format"] == \
        "simcore-kernel-profile"


# ---- the command line ----------------------------------------------------------------------

def test_calibrate_list_shows_kernel_profiles_and_source_disagreement():
    from click.testing import CliRunner

    from dse.cli import main

    r = CliRunner().invoke(main, ["calibrate", "--list"])
    assert r.exit_code == 0, r.output
    assert "h100-sxm-aiconfigurator (H100-SXM): aiconfigurator-core 0.12.0" in r.output
    assert "attention/generation/bf16" in r.output and "moe/fp8_block" in r.output
    assert "sources disagree on H100-SXM: h100-sxm-aiconfigurator / h100-vidur" in r.output
    assert "a100-vidur (A100-80GB): relative errors" in r.output
    # The leave-one-model-out errors of moving a fused-MoE measurement to another shape.
    a100 = r.output[r.output.index("a100-80gb-aiconfigurator (A100-80GB)"):]
    head = "fused-MoE shapes moved from the nearest other model's"
    assert head in a100
    row = a100[a100.index(head):].splitlines()[3].split()
    assert row[0] == "moe/bf16/power_law_1.2" and int(row[1]) >= 40
    # MXFP4 per kernel backend, as the step model moves it: on H100 the Triton-measured
    # gpt-oss shapes (two models), not mixed with the Marlin-measured one.
    h100 = r.output[r.output.index("h100-sxm-aiconfigurator (H100-SXM)"):]
    h100 = h100[h100.index(head):h100.index("\n\n", h100.index(head))]
    assert "moe/mxfp4_w4a16/power_law_1.2 [triton]" in h100
    assert "[marlin]" not in h100
    assert not any(line.split()[:2][-1].isdigit() for line in h100.splitlines()
                   if line.startswith("moe/mxfp4_w4a16/"))


def test_calibrate_from_aiconfigurator_writes_the_profile_or_names_the_problem(tmp_path):
    from click.testing import CliRunner

    from dse.cli import main

    runner = CliRunner()
    r = runner.invoke(main, ["calibrate", "--from-aiconfigurator", "nope",
                             "--out", str(tmp_path / "x.json.gz")])
    assert r.exit_code == 2 and "no system 'nope'" in r.output
    r = runner.invoke(main, ["calibrate", "--from-aiconfigurator", "a100_sxm"])
    assert r.exit_code == 2 and "--out is required" in r.output
    r = runner.invoke(main, ["calibrate", "--from-aiconfigurator", "a100_sxm",
                             "--out", str(tmp_path / "a100.json.gz")])
    assert r.exit_code == 0, r.output
    assert "kernel profile a100-80gb-aiconfigurator (A100-80GB) written" in r.output
    assert KernelProfile.load(tmp_path / "a100.json.gz").to_json() == \
        shipped_kernel_profile("a100-80gb-aiconfigurator").to_json()


@pytest.mark.parametrize("pid", ["h100-sxm-aiconfigurator", "h200-aiconfigurator",
                                 "b200-aiconfigurator"])
def test_block_fp8_linear_layers_take_the_fp8_gemms_where_the_table_timed_the_host(pid):
    p = shipped_kernel_profile(pid)
    # The block-scaled table is flat at small m, far above bf16; per-tensor fp8 is not.
    assert p.host_bound_ratio("fp8_block") > HOST_BOUND_RATIO > p.host_bound_ratio("fp8")
    arch = load_preset("qwen3-32b")
    gpu = get_gpu(p.gpu)
    block = KernelModel(arch, gpu, profile=p, tp=2, weight_dtype="fp8_block")
    fp8 = KernelModel(arch, gpu, profile=p, tp=2, weight_dtype="fp8")
    shape = StepShape.from_requests([(1, 999)] * 32)
    a, b = {}, {}
    block.op_bounds(shape, by_op=a)
    fp8.op_bounds(shape, by_op=b)
    assert a["mlp"] == pytest.approx(b["mlp"], rel=1e-12)
    assert any(x.startswith("fp8_block linear layers: the per-tensor fp8 GEMM measurements")
               for x in block.assumed_parts())
    assert not any("linear layers" in x for x in fp8.assumed_parts())


def test_communication_bound_is_the_declared_one_while_any_collective_is_on_the_roofline():
    p = shipped_kernel_profile("h100-sxm-aiconfigurator")
    arch, gpu = load_preset("llama-3.1-70b"), get_gpu("H100-SXM")
    measured = KernelModel(arch, gpu, profile=p, tp=4)
    declared = measured.assumptions.relative_uncertainty
    assert measured.op_error_bounds()["communication"] == max(
        p.error_bound("all_reduce/graph"), p.error_bound("all_reduce/eager"),
        p.error_bound("all_gather/nccl")) < declared
    # The all-gather is measured but the all-reduces (sequence-parallel MoE) or the PP hops
    # are not: the class keeps the roofline's bound.
    for kw in ({"sequence_parallel_moe": True}, {"pp": 2}):
        m = KernelModel(arch, gpu, profile=p, tp=4, **kw)
        assert m.op_error_bounds()["communication"] == declared, kw


# ---- MoE routing ---------------------------------------------------------------------------

def _qwen_moe(p, routing):
    return p.moe_curve("bf16", 4096, 1536, 8, 128, 4, 1, routing)


def test_moe_tables_are_kept_per_routing_with_their_own_errors():
    p = shipped_kernel_profile("h100-sxm-aiconfigurator")
    assert p.moe_routings() == ("balanced", "power_law_1.01", "power_law_1.2")
    bal, skew = _qwen_moe(p, "balanced"), _qwen_moe(p, "power_law_1.2")
    # A skewed router touches fewer experts in a small batch (fewer weights read) and queues
    # more tokens on its hottest expert in a large one.
    assert skew(16) < 0.9 * bal(16)
    assert skew(8192) > bal(8192)
    for family in ("moe/bf16", "moe/bf16/power_law_1.2", "moe/fp8_block/power_law_1.01"):
        assert p.error_bound(family) is not None, family
    # vLLM's A100 tables were only measured with skewed routing; SGLang's Marlin ones with all
    # three: the bf16 table has no balanced curve, the int4 one has.
    a100 = shipped_kernel_profile("a100-80gb-aiconfigurator")
    assert a100.moe_routings() == ("balanced", "power_law_1.01", "power_law_1.2")
    assert {k[7] for k in a100.moe_keys() if k[0] == "bf16"} == {"power_law_1.01",
                                                                 "power_law_1.2"}
    assert {k[7] for k in a100.moe_keys() if k[0] == "int4_wo"} == {
        "balanced", "power_law_1.01", "power_law_1.2"}


def test_moe_routing_picks_the_table_and_says_which():
    from simcore.compute.kernel_model import DEFAULT_MOE_ROUTING
    arch, gpu = load_preset("qwen3-235b-a22b"), get_gpu("H100-SXM")
    p = shipped_kernel_profile("h100-sxm-aiconfigurator")
    shape = StepShape.from_requests([(1, 1000)] * 2)
    times = {}
    for routing in (None, "balanced", "power_law_1.2"):
        m = KernelModel(arch, gpu, profile=p, tp=4, moe_routing=routing)
        by_op: dict[str, float] = {}
        m.op_bounds(shape, by_op=by_op)
        times[routing] = by_op["moe"]
        assert m.moe_routing == (routing or DEFAULT_MOE_ROUTING)
        assert f"fused MoE at {m.moe_routing} routing" in m.assumption_lines()[0]
        assert m.fallbacks() == []
    assert times[None] == times[DEFAULT_MOE_ROUTING]
    assert times["power_law_1.2"] < times["balanced"]
    # On A100 no balanced table: asked for, the experts fall back to the roofline, named; by
    # default the measured skewed table is used, and the step says it was not the default.
    a100 = shipped_kernel_profile("a100-80gb-aiconfigurator")
    mix = load_preset("mixtral-8x7b")
    asked = KernelModel(mix, get_gpu("A100-80GB"), profile=a100, tp=2, moe_routing="balanced")
    assert any("routed experts: roofline, uniform routing" in f and "balanced routing" in f
               for f in asked.fallbacks())
    auto = KernelModel(mix, get_gpu("A100-80GB"), profile=a100, tp=2)
    assert auto.moe_routing in ("power_law_1.01", "power_law_1.2")
    assert not any("routed experts" in f for f in auto.fallbacks())


def test_default_moe_routing_is_the_one_fitted_on_the_validation_fit_part():
    from simcore.compute.kernel_model import DEFAULT_MOE_ROUTING
    from simcore.host import FITTED
    fitted = json.loads(FITTED.read_text())["moe_routing_objective"]
    assert set(fitted) == {"balanced", "power_law_1.01", "power_law_1.2"}
    assert DEFAULT_MOE_ROUTING == min(fitted, key=fitted.get)


def test_moe_routing_is_refused_where_it_would_do_nothing():
    base = {"model": {"name": "llama-3.1-8b"}, "hardware": {"gpu": "H100-SXM"},
            "workload": {"num_prompts": 4}}
    with pytest.raises(Exception, match="moe_routing: only used with a calibrated profile"):
        SimConfig.model_validate({**base, "compute": {"kind": "roofline",
                                                      "moe_routing": "power_law_1.2"}})
    # By default (auto) a GPU without a kernel profile is timed by the roofline: refused there.
    moe = {"model": {"name": "mistralai/Mixtral-8x7B-v0.1"}, "hardware": {"gpu": "A40"},
           "parallelism": {"tensor_parallel_size": 4}, "workload": {"num_prompts": 4}}
    with pytest.raises(ConfigError, match="compute.moe_routing: no kernel profile of A40"):
        simulate(SimConfig.model_validate({**moe, "compute": {"moe_routing": "balanced"}}))
    cfg = SimConfig.model_validate({**base, "compute": {"kind": "calibrated",
                                                       "moe_routing": "power_law_1.2"}})
    with pytest.raises(ConfigError, match="compute.moe_routing: .* dense model"):
        simulate(cfg)


@pytest.mark.parametrize("parallelism", [
    {"tensor_parallel_size": 2, "data_parallel_size": 2, "enable_expert_parallel": True},
    {"tensor_parallel_size": 2, "enable_expert_parallel": True},
    {"tensor_parallel_size": 2, "enable_expert_parallel": True,
     "prefill_decode": {"num_prefill_instances": 1, "num_decode_instances": 1}},
], ids=["dp2", "dp1", "both-roles"])
def test_moe_routing_is_refused_where_expert_parallelism_times_the_experts(parallelism):
    # The group's roofline routes uniformly: the routing would change nothing.
    moe = {"model": {"name": "mistralai/Mixtral-8x7B-v0.1"}, "hardware": {"gpu": "H100-SXM"},
           "parallelism": parallelism, "workload": {"num_prompts": 4}}
    SimConfig.model_validate(moe)
    with pytest.raises(Exception, match=r"compute\.moe_routing: has no effect with expert "
                                        r"parallelism"):
        SimConfig.model_validate({**moe, "compute": {"moe_routing": "balanced"}})


def test_moe_routing_is_kept_where_one_role_runs_without_expert_parallelism():
    SimConfig.model_validate({
        "model": {"name": "mistralai/Mixtral-8x7B-v0.1"}, "hardware": {"gpu": "H100-SXM"},
        "parallelism": {"tensor_parallel_size": 2, "enable_expert_parallel": True,
                        "prefill_decode": {"num_prefill_instances": 1, "num_decode_instances": 1,
                                           "prefill_expert_parallel": False}},
        "compute": {"moe_routing": "balanced"}, "workload": {"num_prompts": 4}})


@pytest.mark.parametrize("profile_id", shipped_kernel_profile_ids())
def test_a_shipped_profiles_digest_is_that_of_its_json_text(profile_id):
    """A shipped profile's digest is taken from its file's bytes; they are exactly the JSON text
    `save` writes, so the digest is the one `to_json` gives (results record it)."""
    p = shipped_kernel_profile(profile_id)
    assert p.digest == hashlib.sha256(p.to_json().encode()).hexdigest()[:16]


# ---- vLLM's Marlin fused MoE measured in SGLang --------------------------------------------

def test_marlin_shapes_vllm_did_not_measure_come_from_sglang_with_their_files():
    """A100's vLLM tables have no Marlin fused MoE: its int4 curves are SGLang's measurements of
    the same kernel, named as SGLang names it, from a file the provenance lists with its
    digest; where vLLM measured a Marlin shape (H100, H200, L40S) its own curve stays, and the
    two frameworks' disagreement there is reported, never above the bound that times Marlin by
    SGLang's measurements on a GPU where vLLM's are missing."""
    from simcore.compute.derived_kernels import MARLIN_FRAMEWORK_ERROR

    a100 = shipped_kernel_profile("a100-80gb-aiconfigurator")
    int4 = [k for k in a100.moe_keys() if k[0] == "int4_wo"]
    assert len({k[1:5] for k in int4}) == 10
    assert all(a100.moe_kernel(k) == "sglang_marlin_moe" for k in int4)
    assert not any(a100.moe_kernel(k).startswith("sglang_") for k in a100.moe_keys()
                   if k[0] != "int4_wo")
    files = a100.data.provenance.files
    [sgl] = [f for f in files if "/sglang/" in f.path]
    assert sgl.path == "a100_sxm/moe/sglang/0.5.10/moe_perf.parquet" and sgl.rows > 0
    assert "moe/marlin/sglang_vs_vllm" not in a100.data.errors      # nothing to compare with
    for pid in ("h100-sxm-aiconfigurator", "h200-aiconfigurator"):
        p = shipped_kernel_profile(pid)
        # vLLM's own measurement of Kimi-K2's int4 shape stays vLLM's.
        assert "vllm" in p.moe_kernel(("int4_wo", 7168, 2048, 8, 384, 1, 1, "power_law_1.2"))
        assert p.moe_kernel(("int4_wo", 2048, 768, 8, 128, 1, 1, "power_law_1.2")) \
            == "sglang_marlin_moe"
        both = p.data.errors["moe/marlin/sglang_vs_vllm"]
        assert both.n > 800 and both.median < 0.08
        assert both.p90 <= MARLIN_FRAMEWORK_ERROR


def test_an_int4_model_at_a_shape_sglang_measured_is_measured_with_its_bound():
    """Qwen3-30B-A3B with int4 experts on A100 and on H100: its own shape's Marlin curve (SGLang's
    measurement), no roofline part for the experts, and a bound no tighter than the frameworks'
    disagreement."""
    from simcore.compute.derived_kernels import MARLIN_FRAMEWORK_ERROR

    arch = load_preset("qwen3-30b-a3b")
    for gpu, pid in (("A100-80GB", "a100-80gb-aiconfigurator"),
                     ("H100-SXM", "h100-sxm-aiconfigurator")):
        p = shipped_kernel_profile(pid)
        m = KernelModel(arch, get_gpu(gpu), profile=p, weight_dtype="int4")
        assert m._sources["moe"] == {"measured"}, gpu
        assert not any(f.startswith("routed experts") for f in m.fallbacks())
        assert any(a.startswith("routed experts: measured in SGLang (sglang_marlin_moe)")
                   for a in m.assumed_parts())
        bound = p.error_bound("moe/marlin/sglang_vs_vllm") or MARLIN_FRAMEWORK_ERROR
        assert m.op_error_bounds()["moe"] >= bound


def test_calibrate_list_reports_the_two_frameworks_disagreement():
    from dse.calibrate import kernel_error_table, render_kernel_errors

    p = shipped_kernel_profile("h100-sxm-aiconfigurator")
    text = render_kernel_errors(p)
    assert "SGLang 0.5.10, 0.5.14" in text.splitlines()[0]
    assert "vLLM's Marlin fused-MoE kernel measured in SGLang" in text
    assert "moe/marlin/sglang_vs_vllm" not in set(kernel_error_table(p)["table"])
