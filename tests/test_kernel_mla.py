"""MLA attention in the kernel profiles: vLLM's whole MLA module measured per call (DeepSeek-V3's
layer), its tables and held-out errors, and how the step model maps a step onto them."""

import numpy as np
import pandas as pd
import pytest

from simcore.calibration.kernels import KernelProfile, shipped_kernel_profile
from simcore.calibration.mla import MlaTable, fit_mla, module_shape
from simcore.compute.base import StepShape
from simcore.compute.kernel_model import (
    KernelModel, elementwise_passes, mla_attention_s, mla_prefix_tokens)
from simcore.compute.roofline import RooflineModel
from simcore.config import SimConfig
from simcore.hardware import get_gpu
from simcore.model.presets import load_preset
from simcore.simulate import simulate

DS = load_preset("deepseek-v3")
H200 = "h200-aiconfigurator"
MLA_WORDS = ("MLA", "attention kernel", "attn GEMMs")


def _h200(weight_dtype="fp8_block", kv_cache_dtype="bf16", tp=8, profile=None, **kw):
    p = profile or shipped_kernel_profile(H200)
    return KernelModel(DS, get_gpu("H200"), profile=p, tp=tp, weight_dtype=weight_dtype,
                       kv_cache_dtype=kv_cache_dtype, **kw)


def _table(p: KernelProfile, phase: str, kv: str, gemm: str, heads: int) -> MlaTable:
    return next(t for t in p.data.mla if (t.phase, t.kv_cache_dtype, t.gemm_dtype, t.num_heads)
                == (phase, kv, gemm, heads))


def _cell_s(t: MlaTable, batch: int, seq: int) -> float:
    return t.time_us[t.batch.index(batch) * len(t.seq) + t.seq.index(seq)] / 1e6


# ---- the fit -------------------------------------------------------------------------------

class _Reader:
    """Stands for the package reader: one table per name."""

    def __init__(self, tables):
        self.tables = tables

    def table(self, op, name):
        return self.tables.get(name)


def _synthetic(phase: str) -> pd.DataFrame:
    """A module table that is an exact power law in batch and length, with the opt-in fp8
    prefill-query rows (another backend, ten times slower) beside it."""
    rows = []
    for b in (1, 2, 4, 8, 16, 32, 64):
        for s in (1, 16, 64, 256, 1024, 4096, 16384):
            for q, kernel, f in (("bfloat16", "FLASH_ATTN" if s > 16 else "FLASH_ATTN_MLA", 1.0),
                                 ("fp8", "TRTLLM_RAGGED", 10.0)):
                rows.append({"model": "deepseek-ai/DeepSeek-V3", "mla_dtype": q,
                             "kv_cache_dtype": "bfloat16", "gemm_type": "fp8_block",
                             "num_heads": 16, "batch_size": b, "tp_size": 1,
                             "isl": s if phase == "context" else 1,
                             "step": 0 if phase == "context" else s, "kernel_source": kernel,
                             "latency": f * 0.01 * b ** 0.9 * s ** 0.7})
    return pd.DataFrame(rows)


def test_mla_fit_is_exact_for_a_power_law_and_keeps_the_default_path():
    reader = _Reader({"mla_context_module_perf.parquet": _synthetic("context"),
                      "mla_generation_module_perf.parquet": _synthetic("generation")})
    errors = {}
    tables = [MlaTable.model_validate(t)
              for t in fit_mla(reader, np.random.default_rng(0), errors)]
    assert {t.phase for t in tables} == {"context", "generation"}
    for t in tables:
        assert t.shape == module_shape(DS) and t.num_heads == 16
        assert "TRTLLM_RAGGED" not in t.kernel            # the opt-in fp8 prefill queries
        assert t.kernel == "FLASH_ATTN_MLA (1-16), FLASH_ATTN (64-16384)"
        assert t.held_out["seq"] and not set(t.held_out["seq"]) & set(t.seq)
        for b, n in ((1, 16384), (64, 1), (16, 256)):
            if b in t.batch and n in t.seq:
                assert _cell_s(t, b, n) == pytest.approx(1e-5 * b ** 0.9 * n ** 0.7, rel=1e-3)
    for phase in ("context", "generation"):
        stats = errors[f"mla/{phase}/bf16/fp8_block"]
        assert stats.n > 0 and stats.max < 2e-3          # log-log interpolation of a power law


def test_a_system_without_mla_tables_has_none():
    errors = {}
    assert fit_mla(_Reader({}), np.random.default_rng(0), errors) == [] and errors == {}


# ---- the shipped tables --------------------------------------------------------------------

@pytest.mark.parametrize("pid,decode", [("h100-sxm-aiconfigurator", "FLASH_ATTN_MLA"),
                                        ("h200-aiconfigurator", "FLASH_ATTN_MLA"),
                                        ("b200-aiconfigurator", "FLASHINFER_MLA")])
def test_shipped_mla_tables_hold_vllms_default_backends_and_held_out_errors(pid, decode):
    p = shipped_kernel_profile(pid)
    heads = {t.num_heads for t in p.data.mla}
    assert {16, 32, 64, 128} <= heads                    # DeepSeek-V3 at TP 8, 4, 2, 1
    gen = _table(p, "generation", "bf16", "fp8_block", 16)
    ctx = _table(p, "context", "bf16", "fp8_block", 16)
    assert gen.kernel == decode
    assert ctx.kernel.startswith(f"{decode} (1-") and ", FLASH_ATTN (" in ctx.kernel
    assert all("TRTLLM_RAGGED" not in t.kernel for t in p.data.mla)
    if pid != "b200-aiconfigurator":                     # Hopper: FlashMLA for an fp8 cache
        assert _table(p, "generation", "fp8", "bf16", 16).kernel == "FLASHMLA"
    files = [f.path for f in p.data.provenance.files if "/mla/" in f.path]
    assert len(files) == 2 and all("vllm/0.24.0" in f for f in files)
    for kv in ("bf16", "fp8"):
        for phase in ("context", "generation"):
            stats = p.data.errors[f"mla/{phase}/{kv}/fp8_block"]
            assert stats.n > 0 and stats.median < 0.05 and stats.p90 < 0.15


def test_a100_profile_has_no_mla_tables():
    p = shipped_kernel_profile("a100-80gb-aiconfigurator")
    assert p.data.mla == [] and not any(k.startswith("mla/") for k in p.data.errors)


# ---- the step model ------------------------------------------------------------------------

@pytest.mark.parametrize("weights,kv,pp", [("fp8_block", "auto", 1), ("fp8_block", "fp8", 1),
                                           ("bf16", "auto", 2), ("bf16", "fp8", 2)])
def test_deepseek_v3_on_h200_has_no_mla_fallback(weights, kv, pp):
    cfg = SimConfig.model_validate({
        "name": "ds", "seed": 1,
        "model": {"name": "deepseek-ai/DeepSeek-V3", "dtype": weights, "kv_cache_dtype": kv,
                  "max_model_len": 8192},
        "hardware": {"gpu": "H200"},
        "parallelism": {"tensor_parallel_size": 8, "pipeline_parallel_size": pp},
        "compute": {"kind": "calibrated"}, "uncertainty": {"method": "first_order"},
        "workload": {"num_prompts": 24, "request_rate": "inf", "max_concurrency": 8,
                     "dataset": {"kind": "random", "input_len": 512, "output_len": 16}}})
    prov = simulate(cfg)["provenance"]
    assert prov["compute_profile"] == H200
    assert not any(w in f for f in prov["reference_fallbacks"] for w in MLA_WORDS), \
        prov["reference_fallbacks"]


def test_decode_and_prompt_steps_equal_the_tables_at_grid_points():
    p = shipped_kernel_profile(H200)
    m = _h200(profile=p)
    gen = _table(p, "generation", "bf16", "fp8_block", 16)
    ctx = _table(p, "context", "bf16", "fp8_block", 16)
    L = DS.num_layers
    for d, kv in ((gen.batch[2], gen.seq[8]), (gen.batch[-1], gen.seq[3])):
        shape = StepShape.from_requests([(1, kv - 1)] * d)
        assert m._attn_meas(shape) == pytest.approx(L * _cell_s(gen, d, kv), rel=1e-9)
    for b, s in ((ctx.batch[0], ctx.seq[-3]), (ctx.batch[3], ctx.seq[6])):
        shape = StepShape.from_requests([(s, 0)] * b)
        assert m._attn_meas(shape) == pytest.approx(L * _cell_s(ctx, b, s), rel=1e-9)


def test_a_mixed_step_counts_the_modules_one_token_time_once():
    p = shipped_kernel_profile(H200)
    m = _h200(profile=p)
    gen = _table(p, "generation", "bf16", "fp8_block", 16)
    ctx = _table(p, "context", "bf16", "fp8_block", 16)
    d, kv, s = gen.batch[5], gen.seq[10], ctx.seq[9]
    decodes, prompt = [(1, kv - 1)] * d, [(s, 0)]
    mixed = m._attn_meas(StepShape.from_requests(decodes + prompt))
    parts = _cell_s(gen, d, kv) + _cell_s(ctx, 1, s) - _cell_s(ctx, 1, 1)
    assert mixed == pytest.approx(DS.num_layers * parts, rel=1e-9)
    assert mixed > max(m._attn_meas(StepShape.from_requests(decodes)),
                       m._attn_meas(StepShape.from_requests(prompt)))


def test_a_chunk_over_a_cached_prefix_costs_its_pairs_and_the_prefix_up_projection():
    p = shipped_kernel_profile(H200)
    m = _h200(profile=p)
    first = StepShape.from_requests([(2048, 0)])
    later = StepShape.from_requests([(2048, 14336)])
    assert mla_prefix_tokens(first) == 0 and mla_prefix_tokens(later) == 14336
    assert m._attn_meas(later) > 1.5 * m._attn_meas(first)
    # One prompt of s tokens with the chunk's pairs per token (b = 2048 / s < 1): linear in b
    # from the one-token time; the prefix's latent up-projection from the per-tensor fp8 GEMMs
    # (the block-scaled table timed the host).
    gen = p.mla_grid("generation", "bf16", "fp8_block", 16, module_shape(DS))
    ctx = p.mla_grid("context", "bf16", "fp8_block", 16, module_shape(DS))
    s = 2 * later.attn_qk_pairs / 2048 - 1
    b = 2048 / s
    module = max(b * ctx(1, s) + (1 - b) * ctx(1, 1), ctx(1, 2048))
    assert mla_attention_s(later, gen, ctx, ctx(1, 1)) == pytest.approx(module, rel=1e-12)
    up = p.gemm_time_s("fp8", 14336, 16 * 256, 512)
    assert m._attn_meas(later) == pytest.approx(DS.num_layers * (module + up), rel=2e-3)


@pytest.mark.parametrize("kv", ["bf16", "fp8"])
def test_step_time_grows_with_kv_length_and_batch(kv):
    m = _h200(kv_cache_dtype=kv)

    def step(batch, ctx):
        return m.step_time(StepShape.from_requests([(1, ctx - 1)] * batch)).total_s

    for batch in (8, 64, 256):
        times = [step(batch, c) for c in (1024, 8192, 32768, 131072)]
        assert times == sorted(times) and times[0] < times[-1], (batch, times)
    for ctx in (1024, 16384):
        times = [step(b, ctx) for b in (4, 32, 128, 512)]
        assert times == sorted(times) and times[0] < times[-1], (ctx, times)
    chunks = [m.step_time(StepShape.from_requests([(1024, c)])).total_s
              for c in (0, 4096, 16384, 65536)]
    assert chunks == sorted(chunks)


def test_the_module_replaces_the_projections_norms_and_rotary_it_covers():
    arch, gpu = DS, get_gpu("H200")
    p = shipped_kernel_profile(H200)
    measured = _h200(profile=p)
    bare = _h200(profile=KernelProfile(p.data.model_copy(update={"mla": []})))
    # The attention projections and the latent up-projection: no time of their own.
    attn = measured._token_gemm_groups.index("attn")
    assert measured._token_gemm_meas[attn](512) == 0.0
    assert measured._kvb_flop_s_per_row == measured._kvb_byte_s_fixed == 0.0
    assert bare._token_gemm_meas[attn] is None and bare._kvb_flop_s_per_row > 0
    # The rotary pass and the two latent norms are inside the module; the layer's own
    # add + norms, the MLP and MoE passes stay.
    inside = elementwise_passes(arch, 8, routed_experts=False, mla_module=True)
    outside = elementwise_passes(arch, 8, routed_experts=False)
    assert len(outside) - len(inside) == 3 and set(inside) <= set(outside)
    shape = StepShape.from_requests([(1, 2047)] * 64)
    a, b = {}, {}
    measured.op_bounds(shape, by_op=a)
    bare.op_bounds(shape, by_op=b)
    assert a["elementwise"] < b["elementwise"]
    assert a["moe"] == b["moe"] and a["mlp"] == b["mlp"]
    # TP all-reduces (after o_proj and the MLP) are timed as before.
    assert measured.comm_s(shape) == bare.comm_s(shape)
    # Without a memory-bound kernel table, the roofline's elementwise passes lose the same
    # rotary and latent-norm bytes.
    nomem = {"memory": []}
    rm = _h200(profile=KernelProfile(p.data.model_copy(update=nomem)))
    rb = _h200(profile=KernelProfile(p.data.model_copy(update={**nomem, "mla": []})))
    assert rm._ew_byte_s_per_token < rb._ew_byte_s_per_token
    roof = RooflineModel(arch, gpu, tp=8, weight_dtype="fp8_block")
    assert rb._ew_byte_s_per_token == roof._ew_byte_s_per_token


@pytest.mark.parametrize("kv", ["bf16", "fp8"])
def test_attention_bound_is_the_mla_tables_held_out_error(kv):
    p = shipped_kernel_profile(H200)
    m = _h200(profile=p, kv_cache_dtype=kv)
    bound = m.op_error_bounds()["attention"]
    assert bound == max(p.error_bound(f"mla/context/{kv}/fp8_block"),
                        p.error_bound(f"mla/generation/{kv}/fp8_block"))
    assert bound < m.assumptions.relative_uncertainty
    assert m.fallbacks() == [] and m.measured_share() > 0.9


def test_per_tensor_fp8_weights_take_the_block_scaled_module_and_say_so():
    p = shipped_kernel_profile(H200)
    m = _h200(weight_dtype="fp8", profile=p)
    block = _h200(weight_dtype="fp8_block", profile=p)
    shape = StepShape.from_requests([(1, 999)] * 16)
    assert m._attn_meas(shape) == block._attn_meas(shape)
    assert any(x.startswith("MLA attention modules with fp8 weights: the fp8_block module")
               for x in m.assumed_parts())
    assert not any(w in f for f in m.fallbacks() for w in MLA_WORDS)


def test_without_mla_data_the_roofline_times_mla_and_says_why():
    arch = DS
    a100 = shipped_kernel_profile("a100-80gb-aiconfigurator")
    gpu = get_gpu("A100-80GB")
    m = KernelModel(arch, gpu, profile=a100, tp=8, pp=2, weight_dtype="bf16")
    roof = RooflineModel(arch, gpu, tp=8, pp=2, weight_dtype="bf16")
    why = "no MLA module measurements in the kernel profile"
    assert f"attn GEMMs: roofline (MLA projections: {why})" in m.fallbacks()
    assert f"MLA latent up-projections: roofline ({why})" in m.fallbacks()
    assert f"attention kernel: roofline (MLA: {why})" in m.fallbacks()
    for shape in (StepShape.from_requests([(1, 999)] * 32), StepShape.from_requests([(700, 300)]),
                  StepShape.from_requests([(1, 999)] * 8 + [(512, 0)])):
        a, b = {}, {}
        m.op_bounds(shape, by_op=a)
        roof.op_bounds(shape, by_op=b)
        assert a["attention"] == b["attention"]          # the roofline path, unchanged
    assert m.op_error_bounds()["attention"] == m.assumptions.relative_uncertainty


def test_unmeasured_heads_or_kv_dtype_fall_back_with_the_reason():
    p = shipped_kernel_profile(H200)
    no16 = KernelProfile(p.data.model_copy(
        update={"mla": [t for t in p.data.mla if t.num_heads != 16]}))
    l40s = shipped_kernel_profile("l40s-aiconfigurator")      # measured with a bf16 cache only
    for m, why in ((_h200(profile=no16), "with a bf16 KV cache and fp8_block weights at 16 heads"),
                   (KernelModel(DS, get_gpu("L40S"), profile=l40s, tp=8, weight_dtype="fp8_block",
                                kv_cache_dtype="fp8"), "with a fp8 KV cache")):
        assert any(f.startswith("attention kernel: roofline (MLA: no MLA module measurements")
                   and why in f for f in m.fallbacks()), m.fallbacks()
    ok = KernelModel(DS, get_gpu("L40S"), profile=l40s, tp=8, weight_dtype="fp8_block")
    assert not any(w in f for f in ok.fallbacks() for w in MLA_WORDS)


def test_calibrate_list_prints_the_mla_tables_errors():
    from click.testing import CliRunner

    from dse.cli import main

    r = CliRunner().invoke(main, ["calibrate", "--list"])
    assert r.exit_code == 0, r.output
    for family in ("mla/context/bf16/fp8_block", "mla/generation/fp8/fp8_block",
                   "mla/generation/bf16/nvfp4"):
        assert family in r.output


def test_op_scale_scales_the_mla_module_with_every_class():
    classes = ("gemm", "attention", "moe", "elementwise", "lm_head", "communication", "overhead")
    base = _h200()
    scaled = _h200(op_scale=dict.fromkeys(classes, 1.3))
    only = _h200(op_scale={"attention": 2.0})
    for shape in (StepShape.from_requests([(1, 999)] * 16),
                  StepShape.from_requests([(1, 999)] * 16 + [(900, 3000)])):
        assert scaled.step_time(shape).total_s == pytest.approx(
            1.3 * base.step_time(shape).total_s, rel=1e-9)
    decode = StepShape.from_requests([(1, 999)] * 16)
    assert only._attn_meas(decode) == pytest.approx(2 * base._attn_meas(decode), rel=1e-12)
