"""One trial without Ray: values and overrides applied, deployability checked (an undeployable
configuration is an outcome with its reason, never an exception), metrics derived, SLOs scored."""

import pickle
from pathlib import Path

import pytest

from dse.evaluate import (CAPACITY_METRICS, TREND_METRICS, EvalSpec, TrialOutcome,
                          baseline_values, check_metric_names,
                          evaluate, metric_names, precheck, result_metrics, run_trial,
                          static_metric_names, violation_text)
from dse.space import SearchSpace
from dse.study import Constraint, Objective, load_study
from simcore.config import parse_config
from simcore.errors import ConfigError
from simcore.simulate import simulate

DATA = Path(__file__).parent / "data"
BASE = {"model": {"name": "meta-llama/Llama-3.1-8B"}, "hardware": {"gpu": "A100-80GB"},
        "workload": {"num_prompts": 30, "request_rate": 20,
                     "dataset": {"kind": "random", "input_len": 128, "output_len": 32}},
        "base_dir": str(DATA)}
SPEC = EvalSpec(objectives=(Objective(metric="p99_ttft_ms", direction="minimize"),
                            Objective(metric="output_tokens_per_dollar", direction="maximize")),
                constraints=(Constraint(metric="p99_tpot_ms", op="<=", value=1000),
                             Constraint(metric="request_throughput", op=">=", value=1e6)),
                usd_per_gpu_hour=4.0)


def test_a_feasible_configuration_is_simulated_and_scored():
    out = evaluate(BASE, {"engine.max_num_seqs": 16}, {"workload.num_prompts": 20}, SPEC)
    assert out.status == "complete" and out.reason is None
    m = out.metrics
    assert m["num_prompts"] == 20                               # the override applied
    assert out.values == (m["p99_ttft_ms"], m["output_tokens_per_dollar"])
    per_dollar = m["output_throughput"] * 3600 / (m["num_gpus"] * 4.0)
    assert m["output_tokens_per_dollar"] == pytest.approx(per_dollar)
    assert m["cost_per_million_output_tokens_usd"] == pytest.approx(1e6 / per_dollar)
    assert m["request_throughput_per_gpu"] == pytest.approx(m["request_throughput"] / m["num_gpus"])
    assert m["output_throughput_per_gpu"] == pytest.approx(m["output_throughput"] / m["num_gpus"])
    assert all(isinstance(v, float) for v in m.values())
    # One SLO met (negative slack), one violated (positive shortfall) and said in words.
    assert out.constraints["p99_tpot_ms <= 1000"] < 0
    assert out.constraints["request_throughput >= 1e+06"] > 0
    assert out.violations == (f"request_throughput = {m['request_throughput']:.4g} < 1e+06",)
    assert out.feasible is False
    assert out.profile == "a100-80gb-aiconfigurator" and out.calibrated is True
    assert {"p99_ttft_ms", "output_tokens_per_dollar", "p99_tpot_ms", "request_throughput",
            "output_throughput_per_gpu"} <= set(out.summary)
    assert out.elapsed_s > 0
    assert pickle.loads(pickle.dumps(out)) == out               # travels back from a worker


def test_the_same_configuration_gives_the_same_outcome():
    a = evaluate(BASE, {"engine.max_num_seqs": 16}, {}, SPEC)
    b = evaluate(BASE, {"engine.max_num_seqs": 16}, {}, SPEC)
    assert (a.values, a.metrics) == (b.values, b.metrics)


@pytest.mark.parametrize("values, spec, words", [
    ({"parallelism.tensor_parallel_size": 3}, SPEC, ["tensor_parallel_size", "32"]),
    ({"parallelism.data_parallel_size": 2}, EvalSpec(objectives=SPEC.objectives, num_gpus=4),
     ["TP x PP x DP = 1 x 1 x 2 = 2 GPUs", "num_gpus = 4"]),
    ({"engine.block_size": 7}, SPEC, ["block_size", "got 7"]),
    ({"model.name": "meta-llama/Llama-3.1-70B"}, SPEC, ["tensor_parallel_size"]),
    ({"engine.max_num_seqs": 512, "engine.max_num_batched_tokens": 256}, SPEC,
     ["max_num_batched_tokens", "max_num_seqs"]),
])
def test_an_undeployable_configuration_is_an_infeasible_outcome(values, spec, words):
    reason = precheck(BASE, values, {}, spec)
    assert reason is not None and "\n" not in reason
    for w in words:
        assert w in reason, (w, reason)
    out = evaluate(BASE, values, {}, spec)
    assert out.status == "infeasible" and out.reason == reason and not out.feasible
    assert out.values == () and out.metrics == {}


def test_precheck_passes_a_deployable_configuration():
    assert precheck(BASE, {"parallelism.tensor_parallel_size": 2}, {}, SPEC) is None
    assert precheck(BASE, {"parallelism.data_parallel_size": 4}, {},
                    EvalSpec(objectives=SPEC.objectives, num_gpus=4)) is None


def test_a_simulation_that_raises_is_a_failed_outcome_from_run_trial():
    base = {**BASE, "workload": {"num_prompts": 5,
                                 "dataset": {"kind": "mooncake", "path": "no_such_trace.jsonl"}}}
    assert precheck(base, {}, {}, SPEC) is None                 # only the simulation finds out
    with pytest.raises(ConfigError):
        evaluate(base, {}, {}, SPEC)
    out = run_trial(base, {}, {}, SPEC)
    assert out.status == "failed" and "no_such_trace.jsonl" in out.reason
    assert "\n" not in out.reason


def test_an_unknown_objective_metric_names_the_field_and_close_matches():
    spec = EvalSpec(objectives=(Objective(metric="p99_ttft", direction="minimize"),))
    with pytest.raises(ConfigError, match=r"objectives\[0\]\.metric: 'p99_ttft' .*p99_ttft_ms"):
        evaluate(BASE, {}, {}, spec)
    spec = EvalSpec(objectives=SPEC.objectives,
                    constraints=(Constraint(metric="goodput", op=">=", value=1),))
    with pytest.raises(ConfigError, match=r"constraints\[0\]\.metric: 'goodput'"):
        check_metric_names(spec, metric_names(BASE, {}))


def test_metric_names_match_a_real_result():
    base = {**BASE, "metrics": {"percentiles": [50, 95], "goodput": {"ttft": 200}}}
    result = simulate(parse_config(base))
    real = set(result_metrics(result, 2.5))
    assert {"p95_ttft_ms", "request_goodput", "output_tokens_per_dollar"} <= real
    # Capacity metrics are computed for a trial only when a study names one.
    assert metric_names(base, {}) == real | set(CAPACITY_METRICS)
    assert static_metric_names(parse_config(base)) == real | set(CAPACITY_METRICS)
    # Enough requests for the load trend (30 are too few).
    assert not set(TREND_METRICS) & real
    longer = {**base, "workload": {**base["workload"], "num_prompts": 60}}
    real = set(result_metrics(simulate(parse_config(longer)), 2.5))
    assert set(TREND_METRICS) <= real
    assert metric_names(longer, {}) == real | set(CAPACITY_METRICS)
    assert static_metric_names(parse_config(longer)) == real | set(CAPACITY_METRICS)


def test_metric_names_of_an_undeployable_base_come_from_the_layout():
    base = {**BASE, "model": {"name": "meta-llama/Llama-3.1-70B"}}
    names = metric_names(base, {})
    assert {"p99_ttft_ms", "output_throughput_per_gpu", "cost_per_million_output_tokens_usd"} \
        <= names


def test_violation_text_for_every_operator():
    for op, x, text in [("<=", 63.2, "p99_tpot_ms = 63.2 > 50"),
                        ("<", 50, "p99_tpot_ms = 50 >= 50"),
                        (">=", 12.5, "p99_tpot_ms = 12.5 < 50"),
                        (">", 50, "p99_tpot_ms = 50 <= 50")]:
        assert violation_text(Constraint(metric="p99_tpot_ms", op=op, value=50), x) == text


def test_a_non_finite_objective_fails_the_trial():
    from dse.evaluate import score

    result = {"p99_ttft_ms": float("nan"), "output_throughput": 0.0, "num_gpus": 1,
              "request_throughput": 0.0, "p99_tpot_ms": 1.0,
              "provenance": {"compute_profile": "roofline/H100-SXM/bf16", "calibrated": False,
                             "step_time_relative_uncertainty": 0.35}}
    out = score(result, SPEC)
    assert out.status == "failed" and "p99_ttft_ms is nan" in out.reason


def test_baseline_values_fill_vllm_defaults_and_must_lie_in_the_space():
    space = SearchSpace.model_validate({"parameters": {
        "engine.max_num_seqs": {"type": "int", "low": 16, "high": 512, "log": True},
        "engine.max_num_batched_tokens": {"type": "categorical", "choices": [1024, 2048, 4096]},
        "parallelism.tensor_parallel_size": {"type": "categorical", "choices": [1, 2]},
        "parallelism.enable_expert_parallel": {"type": "categorical", "choices": [False],
                                               "when": "moe"}}})
    values, why = baseline_values(BASE, space)
    assert why is None
    # vLLM's A100 defaults; the MoE-only parameter does not exist for a dense model.
    assert values == {"engine.max_num_seqs": 256, "engine.max_num_batched_tokens": 2048,
                      "parallelism.tensor_parallel_size": 1}
    narrow = SearchSpace.model_validate({"parameters": {
        "engine.max_num_seqs": {"type": "int", "low": 16, "high": 128}}})
    values, why = baseline_values(BASE, narrow)
    assert values is None and why.startswith("engine.max_num_seqs = 256 is outside the space")
    ones = SearchSpace.model_validate({"parameters": {
        "parallelism.tensor_parallel_size": {"type": "categorical", "choices": [True, 2]}}})
    assert baseline_values(BASE, ones)[0] is None               # 1 is not the choice True


def test_evaluate_takes_a_study_config():
    study = load_study(DATA / "studies" / "tiny.yaml")
    out = evaluate(study.base, {"engine.max_num_seqs": 8, "engine.max_num_batched_tokens": 512},
                   {"workload.num_prompts": 10}, study)
    assert out.status == "complete" and len(out.values) == 2
    assert set(out.constraints) == {"p99_tpot_ms <= 13"}
    assert isinstance(out, TrialOutcome)


def test_data_parallel_size_is_derived_from_the_gpu_count_when_not_searched():
    from dse.study import parse_study

    study = parse_study({
        "name": "derive", "base": {**BASE, "parallelism": {"data_parallel_size": 1}},
        "space": {"parameters": {"parallelism.tensor_parallel_size":
                                 {"type": "categorical", "choices": [1, 2, 3]}}, "num_gpus": 4},
        "objectives": [{"metric": "p99_ttft_ms", "direction": "minimize"}]})
    spec = EvalSpec.of(study)
    assert spec.derive_dp
    out = evaluate(study.base, {"parallelism.tensor_parallel_size": 2}, {}, spec)
    assert out.status == "complete" and out.metrics["num_gpus"] == 4   # TP 2 x DP 2
    out = evaluate(study.base, {"parallelism.tensor_parallel_size": 1}, {}, spec)
    assert out.metrics["num_gpus"] == 4                                # TP 1 x DP 4
    reason = precheck(study.base, {"parallelism.tensor_parallel_size": 3}, {}, spec)
    assert reason is not None and "does not divide" in reason
