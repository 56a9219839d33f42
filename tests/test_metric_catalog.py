"""The metric catalog: every numeric top-level key of a result declared once, with its unit,
direction, scaling and the condition it appears under; what it says matches real results."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from dse.evaluate import CAPACITY_METRICS, DERIVED_METRICS, TREND_METRICS
from dse.study import Objective, parse_study
from simcore import metric_catalog as cat
from simcore.cluster import FABRIC_HEALTH_METRICS
from simcore.cluster import HEADLINE_METRICS as CLUSTER_HEADLINE_METRICS
from simcore.config import SimConfig, parse_config
from simcore.errors import ConfigError
from simcore.loading import load_yaml
from simcore.simulate import simulate
from simcore.uncertainty import headline_metrics, metric_scaling

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _example(rel: str, **sections: dict) -> SimConfig:
    """An example configuration with some settings of its sections replaced."""
    path = EXAMPLES / rel
    data = load_yaml(path)
    for section, changes in sections.items():
        data[section] = {**(data.get(section) or {}), **changes}
    return parse_config(data, source=str(path), base_dir=path.parent)


CASES = {
    "quickstart": lambda: _example("quickstart.yaml", workload={"num_prompts": 60}),
    "ramp_up_with_max_concurrency": lambda: _example(
        "quickstart.yaml", workload={"num_prompts": 60, "request_rate": math.inf,
                                     "ramp_up_strategy": "linear", "ramp_up_start_rps": 2,
                                     "ramp_up_end_rps": 20, "max_concurrency": 16}),
    "percentiles_without_goodput": lambda: _example(
        "quickstart.yaml", workload={"num_prompts": 50, "max_concurrency": 8},
        metrics={"percentiles": [25, 99.9, 100], "goodput": None}),
    "all_at_once": lambda: _example("quickstart.yaml", workload={"num_prompts": 30,
                                                                 "request_rate": math.inf}),
    "trace_timestamps": lambda: _example("mooncake_prefix_affinity.yaml",
                                         workload={"num_prompts": 60}),
    "expert_parallel": lambda: _example("qwen3_moe_h200.yaml", workload={"num_prompts": 48},
                                        parallelism={"enable_expert_parallel": True}),
    "speculative": lambda: _example("speculative_eagle3.yaml", workload={"num_prompts": 30}),
    "cluster_pd": lambda: _example("cluster/pd_disaggregation.yaml",
                                   workload={"num_prompts": 40}),
    "cluster_expert_parallel": lambda: _example(
        "cluster/moe_ep_8node.yaml", workload={"num_prompts": 16, "request_rate": math.inf},
        cluster={"fabric": {"backend": "flow"}}),
}


def _numeric_keys(result: dict) -> set[str]:
    return {k for k, v in result.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}


@pytest.mark.parametrize("make", CASES.values(), ids=CASES.keys())
def test_metric_names_are_exactly_the_numeric_keys_of_a_real_result(make):
    cfg = make()
    result = simulate(cfg)
    dse_only = {m.name for m in cat.METRICS if m.by_dse}
    assert cat.metric_names(cfg) == _numeric_keys(result)
    assert cat.metric_names(cfg, dse=True) - dse_only == _numeric_keys(result)
    # Every key of the result, numeric or not, is declared or is a section.
    for key, value in result.items():
        if isinstance(value, (int, float)):
            assert cat.lookup(key) is not None, key


def test_the_cases_cover_every_condition():
    held = set().union(*(cat.conditions(make()) for make in CASES.values()))
    assert held == set(cat.CONDITIONS) - {"capacity"}


def test_non_default_percentiles_are_family_members():
    cfg = CASES["percentiles_without_goodput"]()
    names = cat.metric_names(cfg)
    assert {"p25_ttft_ms", "p99.9_itl_ms", "p100_e2el_ms", "p99.9_queue_ms",
            "p99.9_client_queue_time_ms", "std_e2el_including_client_queue_ms"} <= names
    assert "p99_ttft_ms" not in names and "request_goodput" not in names
    m = cat.lookup("p99.9_ttft_ms")
    assert m is not None and m.unit == "ms" and m.better == "minimize" and m.scaling == 1
    assert "99.9th percentile" in m.description
    assert cat.lookup("p99_ttft") is None and cat.lookup("p99_bogus_ms") is None


def test_every_entry_is_fully_declared():
    entries = [*cat.METRICS, *(f.member(f"p99_{f.quantity}_ms") for f in cat.FAMILIES)]
    assert len({m.name for m in cat.METRICS}) == len(cat.METRICS)
    for m in entries:
        assert m.unit and m.description, m.name
        assert m.scaling in (-1, 0, 1), m.name
        assert m.better in ("minimize", "maximize", None), m.name
        assert m.kind in ("prediction", "input", "count", "flag"), m.name
        assert m.when in cat.CONDITIONS, m.name
        if m.kind == "input":
            assert m.better is None, m.name


def test_latencies_scale_with_step_time_and_throughputs_inversely():
    for name in ("mean_ttft_ms", "p99_tpot_ms", "median_itl_ms", "p99.9_e2el_ms",
                 "mean_queue_ms", "mean_api_server_ms", "cost_per_million_output_tokens_usd"):
        assert cat.scaling(name) == 1 and metric_scaling(name) == 1, name
    for name in ("request_throughput", "output_throughput", "total_token_throughput",
                 "request_goodput", "output_throughput_per_gpu", "request_throughput_per_gpu",
                 "output_tokens_per_dollar", "max_output_tokens_per_s", "max_sustainable_rate"):
        assert cat.scaling(name) == -1 and metric_scaling(name) == -1, name
    for name in ("gpu_busy_fraction", "num_gpus", "fabric_drops", "not_a_metric"):
        assert metric_scaling(name) == 0, name


def test_inputs_and_counts_are_not_enveloped():
    result = {"mean_ttft_ms": 1.0, "gpu_busy_fraction": 0.5, "num_prompts": 10, "completed": 9,
              "num_gpus": 8, "offered_request_rate": 3.0, "over_capacity": True,
              "unknown_key": 2.0}
    assert headline_metrics(result) == {"mean_ttft_ms": 1.0, "gpu_busy_fraction": 0.5}


def test_the_cluster_and_trend_declarations_follow_their_sources():
    assert set(cat.names_when("cluster")) == {*CLUSTER_HEADLINE_METRICS, *FABRIC_HEALTH_METRICS,
                                              "fabric_p99_step_slowdown"}
    assert TREND_METRICS == ("offered_request_rate", "served_request_rate", "queue_growth_rps")
    assert CAPACITY_METRICS == ("max_sustainable_rate", "max_sustainable_rate_per_gpu",
                                "max_sustainable_requests_per_dollar")
    assert set(DERIVED_METRICS) == {"request_throughput_per_gpu", "output_tokens_per_dollar",
                                    "cost_per_million_output_tokens_usd",
                                    "step_time_relative_uncertainty"}
    assert cat.lookup("over_capacity").kind == "flag"
    assert "over_capacity" not in cat.metric_names(CASES["quickstart"](), dse=True)


def test_an_objective_against_its_metrics_better_direction_is_refused():
    with pytest.raises(ValueError, match=r"direction: maximize p99_ttft_ms .* use minimize"):
        Objective(metric="p99_ttft_ms", direction="maximize")
    with pytest.raises(ValueError, match=r"use maximize"):
        Objective(metric="output_tokens_per_dollar", direction="minimize")
    # No better direction declared, or a name the catalog does not know: either way.
    for direction in ("minimize", "maximize"):
        Objective(metric="gpu_busy_fraction", direction=direction)
        Objective(metric="some_future_metric", direction=direction)


def test_a_study_file_with_a_backward_objective_names_it():
    study = {"name": "s", "base": {"model": {"name": "meta-llama/Llama-3.1-8B"},
                                   "hardware": {"gpu": "A100-80GB"}},
             "space": {"parameters": {"engine.max_num_seqs": {"type": "int", "low": 8,
                                                              "high": 64}}},
             "objectives": [{"metric": "output_throughput", "direction": "maximize"},
                            {"metric": "p99_ttft_ms", "direction": "maximize"}]}
    with pytest.raises(ConfigError) as err:
        parse_study(study, source="s.yaml")
    assert str(err.value) == ("s.yaml: objectives[1].direction: maximize p99_ttft_ms would search "
                              "for the worst configurations (lower p99_ttft_ms is better); use "
                              "minimize")
