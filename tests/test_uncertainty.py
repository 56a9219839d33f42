"""Envelopes: op-class scaling in the step models, perturbed runs, and their configuration."""

import math

import pytest

from simcore.compute.base import StepShape
from simcore.compute.expert_parallel import ExpertParallelRoofline
from simcore.compute.roofline import OP_CLASSES, RooflineModel
from simcore.config import SimConfig, load_config
from simcore.errors import ConfigError
from simcore.hardware import get_gpu
from simcore.model.presets import load_preset
from simcore.uncertainty import (first_order, headline_metrics, perturbations,
                                 simulate_with_envelope)

SHAPES = [StepShape.from_requests([(1, 500)] * 64),
          StepShape.from_requests([(2048, 0)]),
          StepShape.from_requests([(512, 1000), (1, 300), (1, 4000)])]


def _cfg(kind: str = "roofline", gpu: str = "H100-SXM", **uncertainty) -> SimConfig:
    return SimConfig.model_validate({
        "seed": 3,
        "model": {"name": "meta-llama/Llama-3.1-8B"}, "hardware": {"gpu": gpu},
        "compute": {"kind": kind},
        "workload": {"num_prompts": 60, "request_rate": 20,
                     "dataset": {"kind": "random", "input_len": 400, "output_len": 40,
                                 "range_ratio": 0.5}},
        "uncertainty": uncertainty})


@pytest.mark.parametrize("name", ["llama-3.1-70b", "deepseek-v3", "qwen3-235b-a22b"])
@pytest.mark.parametrize("f", [0.7, 1.35])
def test_scaling_every_class_scales_every_step_exactly(name, f):
    arch, gpu = load_preset(name), get_gpu("H200")
    tp = 8
    base = RooflineModel(arch, gpu, tp=tp)
    scaled = RooflineModel(arch, gpu, tp=tp, op_scale=dict.fromkeys(OP_CLASSES, f))
    for shape in SHAPES:
        a, b = base.step_time(shape), scaled.step_time(shape)
        assert b.total_s == pytest.approx(f * a.total_s, rel=1e-12)
        assert b.comm_s == pytest.approx(f * a.comm_s, rel=1e-12)


@pytest.mark.parametrize("classes,ops", [
    (("gemm", "attention"), ("attention", "mlp")),    # projections + kernel; dense MLP GEMMs
    (("elementwise",), ("elementwise",)),
    (("lm_head",), ("lm_head",)),
])
def test_scaling_classes_scales_exactly_their_ops(classes, ops):
    arch, gpu = load_preset("llama-3.1-70b"), get_gpu("H200")
    base = RooflineModel(arch, gpu, tp=4)
    scaled = RooflineModel(arch, gpu, tp=4, op_scale=dict.fromkeys(classes, 1.5))
    for shape in SHAPES:
        a, b = {}, {}
        base.op_bounds(shape, by_op=a)
        scaled.op_bounds(shape, by_op=b)
        for op in a:
            assert b[op] == pytest.approx((1.5 if op in ops else 1.0) * a[op], rel=1e-12)
        assert scaled.comm_s(shape) == base.comm_s(shape)


def test_scaling_routed_experts_leaves_the_rest():
    arch, gpu = load_preset("qwen3-235b-a22b"), get_gpu("H200")
    base = RooflineModel(arch, gpu, tp=8)
    scaled = RooflineModel(arch, gpu, tp=8, op_scale={"moe": 2.0})
    a, b = {}, {}
    base.op_bounds(SHAPES[1], by_op=a)
    scaled.op_bounds(SHAPES[1], by_op=b)
    assert b["moe"] > 1.5 * a["moe"]         # the router (a GEMM) is not scaled
    assert {k: v for k, v in b.items() if k != "moe"} == {k: v for k, v in a.items()
                                                          if k != "moe"}


def test_expert_parallel_group_scales_its_experts_and_all_to_all():
    arch, gpu = load_preset("deepseek-v3"), get_gpu("H200")
    base = ExpertParallelRoofline(arch, gpu, tp=1, dp=16, weight_dtype="fp8")
    scaled = ExpertParallelRoofline(arch, gpu, tp=1, dp=16, weight_dtype="fp8",
                                    op_scale=dict.fromkeys(OP_CLASSES, 1.2))
    shapes = [SHAPES[0]] * 8 + [StepShape.dummy()] * 8
    a, b = base.step_time_group(shapes), scaled.step_time_group(shapes)
    assert b.total_s == pytest.approx(1.2 * a.total_s, rel=1e-12)
    assert b.all_to_all_s == pytest.approx(1.2 * a.all_to_all_s, rel=1e-12)


@pytest.mark.parametrize("bad,msg", [({"gemms": 1.1}, "unknown op class 'gemms'"),
                                     ({"gemm": 0.0}, "must be positive")])
def test_bad_op_scale_is_refused(bad, msg):
    with pytest.raises(ConfigError, match=msg):
        RooflineModel(load_preset("llama-3.1-8b"), get_gpu("H100-SXM"), op_scale=bad)


def test_perturbations_are_seeded_and_within_their_model():
    bounds = dict.fromkeys(OP_CLASSES, 0.35)
    lo, hi = perturbations(bounds, "bounds", 0, seed=0)
    assert set(lo.values()) == {0.65} and set(hi.values()) == {1.35}
    a = perturbations(bounds, "samples", 400, seed=1)
    assert a == perturbations(bounds, "samples", 400, seed=1)
    assert a != perturbations(bounds, "samples", 400, seed=2)
    inside = sum(0.65 <= p["gemm"] <= 1.35 for p in a) / len(a)
    assert 0.85 < inside < 0.95        # the bound holds 90% of the draws


def test_first_order_directions():
    assert first_order("mean_ttft_ms", 100.0, 0.2) == pytest.approx((80.0, 120.0))
    lo, hi = first_order("output_throughput", 100.0, 0.25)
    assert lo == pytest.approx(80.0) and hi == pytest.approx(100 / 0.75)
    assert first_order("gpu_busy_fraction", 0.5, 0.2) is None


def test_bounds_envelope_brackets_the_nominal_run_and_is_deterministic():
    cfg = _cfg()
    r = simulate_with_envelope(cfg)
    env = r["envelope"]
    assert env["method"] == "bounds" and env["runs"] == 3 and not env["calibrated"]
    m = env["metrics"]
    for key in ("mean_ttft_ms", "p99_tpot_ms", "mean_e2el_ms", "output_throughput"):
        e = m[key]
        assert e["nominal"] == r[key]
        assert e["low"] <= e["nominal"] <= e["high"]
        assert e["high"] > e["low"]
    # Slower ops lengthen every step: TPOT's range is at least the first-order one's order.
    assert m["mean_tpot_ms"]["high"] / m["mean_tpot_ms"]["nominal"] > 1.2
    assert simulate_with_envelope(cfg)["envelope"] == env


def test_samples_envelope_with_workload_seeds():
    r = simulate_with_envelope(_cfg(method="samples", samples=6, vary_workload_seed=True,
                                    percentiles=[10, 90]))
    env = r["envelope"]
    assert env["runs"] == 7 and env["seeds"] == [4, 5, 6, 7, 8, 9]
    e = env["metrics"]["mean_tpot_ms"]
    assert e["low"] <= e["median"] <= e["high"]


def test_first_order_envelope_runs_once():
    r = simulate_with_envelope(_cfg(method="first_order"))
    env = r["envelope"]
    assert env["runs"] == 1
    assert env["metrics"]["mean_tpot_ms"]["high"] == pytest.approx(1.35 * r["mean_tpot_ms"])
    assert "gpu_busy_fraction" not in env["metrics"]


def test_headline_metrics_skip_counts_and_inputs():
    m = headline_metrics({"mean_ttft_ms": 1.0, "completed": 5, "seed": 0, "x": "y",
                          "flag": True, "inf": math.inf})
    assert m == {"mean_ttft_ms": 1.0}


@pytest.mark.parametrize("bad,msg", [
    ({"percentiles": [95, 5]}, "percentiles"),
    ({"vary_workload_seed": True}, "vary_workload_seed"),
    ({"method": "monte_carlo"}, "method"),
    ({"samples": 1}, "samples"),
])
def test_bad_uncertainty_settings_name_the_field(tmp_path, bad, msg):
    import yaml

    data = _cfg().model_dump(mode="json", exclude={"base_dir"})
    data["uncertainty"] = bad
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=msg):
        load_config(p)


@pytest.mark.parametrize("method", ["first_order", "calibrated", "bounds"])
def test_the_printed_summary_says_how_each_envelope_was_made(method):
    from dse.summary import render_summary

    text = render_summary(simulate_with_envelope(_cfg(method=method)))
    how = {"first_order": "first order in the step",
           "calibrated": "split-conformal interval from the end-to-end",
           "bounds": "op classes at both ends of their bounds"}[method]
    assert how in " ".join(text.split())


def test_default_envelope_follows_the_compute_model():
    """Calibrated compute gets the envelope from measured end-to-end errors in one run; the
    roofline, which those residuals do not describe, its two bounding runs."""
    from simcore.uncertainty import envelope_method
    roof = _cfg()
    assert roof.uncertainty.method is None and envelope_method(roof) == "bounds"
    cal = _cfg("calibrated")
    assert envelope_method(cal) == "calibrated"
    # By default (auto) a GPU with a shipped kernel profile is calibrated, one without is not.
    assert envelope_method(_cfg("auto")) == "calibrated"
    assert envelope_method(_cfg("auto", gpu="A40")) == "bounds"
    env = simulate_with_envelope(cal)["envelope"]
    assert env["method"] == "calibrated" and env["runs"] == 1 and env["calibrated"]
    assert env["metrics"]["output_throughput"]["low"] < env["metrics"]["output_throughput"]["high"]
    explicit = cal.model_copy(update={"uncertainty": cal.uncertainty.model_copy(
        update={"method": "first_order"})})
    assert envelope_method(explicit) == "first_order"
