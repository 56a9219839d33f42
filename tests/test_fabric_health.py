"""The fabric's health at the top level of a cluster result, where a study can bound or
minimise it (PFC pauses, drops, DCQCN cuts, ECN marks, the p99 step-message slowdown)."""

from __future__ import annotations

import pytest

from dse.evaluate import EvalSpec, check_metric_names, static_metric_names
from dse.study import Constraint, Objective
from simcore.cluster import FABRIC_HEALTH_METRICS
from simcore.config import parse_config
from simcore.simulate import simulate
from tests.test_cli_cluster import SMALL

# The CLI tests' small cluster: TP 8 x PP 2 of Llama-3.1-8B over two H100 nodes.
CFG = {**SMALL, "cluster": {"num_nodes": 2, "network": {"nic_gbps": 100},
                            "fabric": {"backend": "flow"}}}
NAMES = {*FABRIC_HEALTH_METRICS, "fabric_p99_step_slowdown"}


@pytest.fixture(scope="module")
def result():
    return simulate(parse_config(CFG))


def test_a_cluster_result_carries_the_fabric_health_at_the_top(result):
    fabric = result["cluster"]["fabric"]
    for top, key in FABRIC_HEALTH_METRICS.items():
        assert result[top] == fabric[key] and result[top] >= 0
    assert result["fabric_p99_step_slowdown"] == (fabric["step_slowdown"]["p99"] or 1.0)
    assert result["fabric_p99_step_slowdown"] >= 1.0


def test_a_study_can_name_them(result):
    names = static_metric_names(parse_config(CFG))
    assert NAMES <= names
    spec = EvalSpec(objectives=(Objective(metric="fabric_p99_step_slowdown",
                                          direction="minimize"),),
                    constraints=(Constraint(metric="fabric_drops", op="<=", value=0),
                                 Constraint(metric="fabric_pfc_pause_frames", op="<=",
                                            value=0)))
    check_metric_names(spec, names)
    assert NAMES <= set(result)


def test_no_cluster_no_fabric_metrics():
    plain = {k: v for k, v in CFG.items() if k != "cluster"}
    plain["parallelism"] = {"tensor_parallel_size": 8}
    assert not NAMES & set(static_metric_names(parse_config(plain)))
