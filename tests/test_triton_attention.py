"""vLLM's Triton attention for models with sinks where FlashAttention has none: the prefill ratio
fitted from AIConfigurator's L40S tables, and the step models that apply it."""

from __future__ import annotations

import dataclasses
import json

import pytest

from simcore.calibration.triton_attention import (SHIPPED, context_ratio, fit_triton_context_ratio,
                                                  ratio_from)
from simcore.compute.base import StepShape
from simcore.compute.attention_views import prefill_prompts_factor
from simcore.config import parse_config
from simcore.errors import ConfigError
from simcore.setup import build_deployment


def _shipped() -> dict:
    return json.loads(SHIPPED.read_text(encoding="utf-8"))


def test_the_shipped_table_equals_a_fresh_fit_from_the_installed_package():
    aic = pytest.importorskip("simcore.calibration.aiconfigurator")
    try:
        aic.data_root()
    except ConfigError:
        pytest.skip("aiconfigurator-core is not installed")
    assert fit_triton_context_ratio() == _shipped()


def test_the_ratio_reads_the_grid_and_keeps_flat_past_it():
    data = _shipped()
    r = context_ratio()
    b, s = data["batch"], data["prompt"]
    # A measured cell, exactly; the long prompts' ratio is about 2 or more, the short ones' not.
    assert r(b[0], s[-1]) == pytest.approx(data["ratio"][0][-1], rel=1e-9)
    assert r(4, 8192) > 1.8 and r(4, 16) < 1.2
    # Past the last prompt length and below the first batch: the edge cells' values.
    assert r(4, 131072) == pytest.approx(r(4, s[-1]), rel=1e-9)
    assert r(0.25, 4096) == pytest.approx(r(1, 4096), rel=1e-9)
    # Batch 256 was not measured at 16,384 tokens (memory): the largest batch that was, carried.
    i = max(i for i, row in enumerate(data["ratio"]) if row[-1] is not None)
    assert data["ratio"][-1][-1] is None
    assert r(b[-1], s[-1]) == pytest.approx(data["ratio"][i][-1], rel=1e-9)
    q = data["long_prompt_quantiles"]
    assert 1.5 < q["p10"] <= q["median"] <= q["p90"] < 3.0


def test_a_table_of_another_format_is_refused():
    with pytest.raises(ConfigError, match="format"):
        ratio_from({**_shipped(), "version": 99})


def test_prefill_chunks_take_the_ratio_at_the_prompts_they_stand_for():
    calls = []

    def factor(b, s):
        calls.append((b, s))
        return 2.0

    # Two 1,000-token prompts: 2 x 1000 x 1001 / 2 pairs.
    assert prefill_prompts_factor(factor, 2, 1000 * 1001) == 2.0
    assert calls[-1] == pytest.approx((2, 1000.0))
    # A 512-token chunk over 8,000 cached tokens: the one prompt with as many pairs.
    pairs = 512 * 8000 + 512 * 513 / 2
    prefill_prompts_factor(factor, 1, pairs)
    b, s = calls[-1]
    assert b == 1 and s * (s + 1) / 2 == pytest.approx(pairs)


def _model(gpu: str, sinks: bool = True, name: str = "openai/gpt-oss-120b"):
    cfg = {"model": {"name": name, "dtype": "mxfp4", "max_model_len": 32768},
           "hardware": {"gpu": gpu}, "compute": {"kind": "calibrated"},
           "workload": {"num_prompts": 1, "dataset": {"kind": "random", "input_len": 10,
                                                     "output_len": 1}}}
    dep = build_deployment(parse_config(cfg, source="t"))
    if sinks:
        return dep.step_model
    m = dep.step_model
    arch = dataclasses.replace(m.arch, attention_sinks=False)
    return type(m)(arch, m.gpu, profile=m.profile, tp=m.tp, weight_dtype=m.weight_dtype,
                   kv_cache_dtype=m.kv_cache_dtype, mxfp4_moe_layout="marlin",
                   compute_bound_scale=m._cscale)


def _attention(m, shape) -> float:
    by: dict[str, float] = {}
    m.op_bounds(shape, by_op=by)
    return by["attention"]


PREFILL = StepShape.from_requests([(8192, 0)])
DECODE = StepShape.from_requests([(1, 16000)] * 4)
MIXED = StepShape.from_requests([(2048, 20000)] + [(1, 16000)] * 4)


@pytest.mark.parametrize("gpu,name", [("A100-80GB", "openai/gpt-oss-120b"),
                                      ("L40S", "openai/gpt-oss-20b")])
def test_sink_attention_on_triton_takes_longer_over_prefills_only(gpu, name):
    """On A100 (gpt-oss's attention on the roofline: no measurement of its head shape) and L40S
    (FlashAttention 2 measured at gpt-oss's shape), vLLM runs sink attention with its Triton
    backend: a prefill's full-attention layers take the fitted ratio's time, decodes are as
    before, and the model names the ratio."""
    triton, flash = _model(gpu, name=name), _model(gpu, sinks=False, name=name)
    assert _attention(triton, DECODE) == pytest.approx(_attention(flash, DECODE), rel=1e-12)
    grew = _attention(triton, PREFILL) / _attention(flash, PREFILL)
    # The 18 sliding-window layers keep their time: the whole grows by less than the ratio.
    assert 1.3 < grew < context_ratio()(1, 8192)
    assert _attention(triton, MIXED) > _attention(flash, MIXED)
    notes = " ".join(triton.fallbacks() + triton.assumed_parts())
    assert "Triton context attention measured against FlashAttention 2 on NVIDIA L40S" in notes


def test_the_l40s_note_names_the_kernels_that_time_the_attention():
    """With a 16-bit KV cache the L40S profile's FlashAttention 2 tables time gpt-oss's attention,
    with an fp8 one FlashInfer's: the note names those, not every kernel the profile holds."""
    def note(kv):
        cfg = {"model": {"name": "openai/gpt-oss-20b", "dtype": "mxfp4", "max_model_len": 32768,
                         "kv_cache_dtype": kv},
               "hardware": {"gpu": "L40S"}, "compute": {"kind": "calibrated"},
               "workload": {"num_prompts": 1, "dataset": {"kind": "random", "input_len": 10,
                                                         "output_len": 1}}}
        m = build_deployment(parse_config(cfg, source="t")).step_model
        [n] = [p for p in m.assumed_parts() if p.startswith("attention with sinks")]
        return n
    bf16, fp8 = note("auto"), note("fp8")
    assert "vllm_flash_attn_fa2 measurements" in bf16 and "flashinfer" not in bf16
    assert "flashinfer" in fp8 and "vllm_flash_attn_fa2" not in fp8


def test_the_roofline_part_grows_by_the_ratio_on_its_full_attention_pairs():
    m, flash = _model("A100-80GB"), _model("A100-80GB", sinks=False)
    pairs = PREFILL.attn_qk_pairs
    extra = ((context_ratio()(1, 8192) - 1.0) * pairs * m._attn_flop_s_per_pair * m._cscale)
    assert _attention(m, PREFILL) - _attention(flash, PREFILL) == pytest.approx(extra, rel=1e-6)


def test_a_mixed_step_adds_its_prefills_extra_alone():
    """The ratio scales a mixed step's prefill only: its extra time over FlashAttention is that
    of the same prefill without the decodes beside it (the roofline path, A100)."""
    m, flash = _model("A100-80GB"), _model("A100-80GB", sinks=False)
    prefill = StepShape.from_requests([(2048, 20000)])
    extra_mixed = _attention(m, MIXED) - _attention(flash, MIXED)
    assert extra_mixed == pytest.approx(_attention(m, prefill) - _attention(flash, prefill),
                                        rel=1e-9)
    assert extra_mixed > 0


def test_the_roofline_never_takes_less_than_its_flop_time():
    """Where the measured ratio is under 1 (short prompts in large batches: the kernels' fixed
    costs), the roofline's attention keeps its FLOP time; over 1 it grows by it."""
    m, flash = _model("A100-80GB"), _model("A100-80GB", sinks=False)
    assert context_ratio()(256, 256) < 1.0
    m._triton_context = lambda b, s: 0.5        # a compute-bound step at a ratio under 1
    assert _attention(m, PREFILL) == pytest.approx(_attention(flash, PREFILL), rel=1e-12)
    m._triton_context = lambda b, s: 1.5
    assert _attention(m, PREFILL) > _attention(flash, PREFILL)


def test_an_eagle_head_of_gpt_oss_has_no_sinks():
    """The published EAGLE-3 heads of gpt-oss are Llama decoder layers: no sinks, so vLLM runs
    them on FlashAttention and their prefill takes no Triton ratio."""
    from simcore.compute.speculative import draft_head_arch
    from simcore.model.presets import load_preset
    arch = load_preset("openai/gpt-oss-120b")
    assert arch.attention_sinks
    assert not draft_head_arch(arch, "eagle3").attention_sinks


def test_flashattention_3_runs_sinks_itself():
    """On H100 vLLM's FlashAttention 3 takes the sinks: no ratio, the same times with or without
    sinks in the attention part."""
    name = "openai/gpt-oss-20b"
    m, plain = _model("H100-SXM", name=name), _model("H100-SXM", sinks=False, name=name)
    assert m._triton_context is None
    for shape in (PREFILL, DECODE, MIXED):
        assert _attention(m, shape) == pytest.approx(_attention(plain, shape), rel=1e-12)
