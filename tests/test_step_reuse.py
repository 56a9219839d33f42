"""Step-DAG structure reuse in expert-parallel groups: a step whose structure an earlier step had
is adopted with its own values, and it is the DAG the full build gives, node for node, with the
routing drawn alike; a whole run is the same with and without reuse."""

import copy
import json
import random
from types import SimpleNamespace

import pytest
import simpy

import simcore.dag.expert_steps as expert_steps
from simcore.cluster.build import build_cluster
from simcore.config import parse_config
from simcore.dag.graph import StepDag
from simcore.setup import build_deployment
from simcore.simulate import simulate

R = SimpleNamespace(client=None)

EP_TP1 = {
    "name": "ep-tp1",
    "seed": 5,
    "model": {"name": "mistralai/Mixtral-8x7B-v0.1"},
    "hardware": {"gpu": "H100-SXM", "gpus_per_node": 2},
    "compute": {"kind": "roofline"},
    # EP 4 = DP 4 x TP 1 over two nodes of two GPUs: every all-to-all crosses the fabric.
    "parallelism": {"tensor_parallel_size": 1, "data_parallel_size": 4,
                    "enable_expert_parallel": True},
    "workload": {"num_prompts": 40, "request_rate": 40,
                 "dataset": {"kind": "random", "input_len": 200, "output_len": 16}},
    "cluster": {"num_nodes": 2, "fabric": {"backend": "analytical"}},
}


def ep_config(overlap="none", popularity="zipf"):
    d = copy.deepcopy(EP_TP1)
    d["cluster"]["dag"] = {"overlap": overlap,
                           "moe_routing": {"popularity": popularity}}
    return parse_config(d)


def builder(cfg):
    dep = build_deployment(cfg)
    rt = build_cluster(simpy.Environment(), cfg, dep)
    return rt.builder, rt.placement.instances


def columns(dag):
    return [getattr(dag, f) for f in ("kind", "lane", "stream", "dur_s", "deps", "stream_dep",
                                      "op", "src", "dst", "size_bytes", "latency_s", "fabric",
                                      "children", "num_inputs")]


@pytest.mark.parametrize("overlap", ["none", "two_batch"])
def test_adopted_steps_are_the_full_builds(overlap, monkeypatch):
    cfg = ep_config(overlap)
    reused, insts = builder(cfg)
    full, _ = builder(cfg)
    assert reused._reuse_ep
    pick = random.Random(3)
    shapes = [None, [(R, 1, 40)] * 3, [(R, 1, 40)] * 3 + [(R, 64, 0)], [(R, 1, 7)],
              [(R, 120, 0), (R, 1, 12)]]
    steps = 60
    for _ in range(steps):
        batches = [(inst, pick.choice(shapes)) for inst in insts]
        if all(b is None for _, b in batches):
            batches[0] = (insts[0], shapes[1])
        monkeypatch.setattr(expert_steps, "REUSE_STEP_DAGS", True)
        a = reused.build(batches)
        monkeypatch.setattr(expert_steps, "REUSE_STEP_DAGS", False)
        b = full.build(batches)
        assert a[1:] == b[1:]
        assert columns(a[0]) == columns(b[0])
        # The routing was drawn alike: the generators are in the same state.
        assert reused.rng.bit_generator.state == full.rng.bit_generator.state
    # Most steps adopted a structure seen before (5 batch shapes on 4 ranks).
    assert 0 < len(reused._ep_templates) < steps / 2


def test_a_run_is_the_same_with_and_without_reuse(monkeypatch):
    cfg = ep_config("two_batch")
    out = []
    for reuse in (True, False):
        monkeypatch.setattr(expert_steps, "REUSE_STEP_DAGS", reuse)
        out.append(json.dumps(simulate(cfg), sort_keys=True, default=str))
    assert out[0] == out[1]


def test_no_reuse_where_values_are_not_derived_node_by_node():
    # TP 2 inside the expert-parallel group (sequence-parallel MoE: its all-gathers) and the
    # direct all-to-all are built in full every step.
    d = copy.deepcopy(EP_TP1)
    d["parallelism"].update(tensor_parallel_size=2, data_parallel_size=2)
    assert not builder(parse_config(d))[0]._reuse_ep
    d = copy.deepcopy(EP_TP1)
    d["cluster"]["dag"] = {"collectives": {"all_to_all": "direct"}}
    assert not builder(parse_config(d))[0]._reuse_ep


def test_adopt_needs_an_empty_dag_and_a_value_per_node():
    dag = StepDag([])
    dag.compute(0, "attention", 1.0)
    template = dag.template()
    other = StepDag([])
    with pytest.raises(ValueError, match="2 values for a template of 1 nodes"):
        other.adopt(template, [1.0, 2.0], [0, 0], [0.0, 0.0])
    other.adopt(template, [3.0], [0], [0.0])
    assert other.dur_s == [3.0] and other.kind == dag.kind
    with pytest.raises(ValueError, match="into a DAG of 1"):
        other.adopt(template, [3.0], [0], [0.0])
