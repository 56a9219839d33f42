"""Speculative decoding in an expert-parallel group (analytical group model): every rank
drafts after its target forward, an MTP layer's experts are spread over the group like the
target's and its forwards are lock-step steps of their own, a dense drafter runs on each rank
alone and the group waits for the slowest; tokens per verification follow the closed form."""

import copy

import pytest

from simcore.compute.base import StepShape
from simcore.config import parse_config
from simcore.model.presets import load_preset
from simcore.setup import build_deployment, drafter_memory
from simcore.simulate import simulate

BASE = {
    "name": "spec-ep",
    "seed": 3,
    "model": {"name": "deepseek-ai/DeepSeek-V3", "dtype": "fp8"},
    "hardware": {"gpu": "H200"},
    "compute": {"kind": "roofline"},
    "parallelism": {"enable_expert_parallel": True, "data_parallel_size": 8},
    "engine": {"block_size": 64},
    "workload": {"num_prompts": 48, "request_rate": 16,
                 "dataset": {"kind": "random", "input_len": 400, "output_len": 60}},
}


def config(spec=None, **sections):
    d = copy.deepcopy(BASE)
    d.update(copy.deepcopy(sections))
    if spec is not None:
        d["engine"] = {**d["engine"], "speculative_config": spec}
    return parse_config(d)


def mtp(a: float) -> dict:
    return {"method": "mtp", "num_speculative_tokens": 1, "acceptance_rate": a}


def test_mtp_in_a_group_emits_the_closed_forms_tokens_and_pays_for_its_drafts():
    off = simulate(config())
    good = simulate(config(mtp(0.8)))
    none = simulate(config(mtp(0.0)))
    for r in (off, good, none):
        assert r["completed"] == 48 and r["ep_size"] == 8
    # k = 1 at acceptance a: 1 + a tokens per verification (drawn per position: within 5%).
    assert good["spec_decode_acceptance_length"] == pytest.approx(1.8, rel=0.05)
    assert none["spec_decode_acceptance_length"] == 1.0
    assert good["mean_tpot_ms"] < 0.8 * off["mean_tpot_ms"]
    # Every draft rejected: one token per step, as without speculation, plus the drafter's and
    # the verification's cost.
    assert none["mean_tpot_ms"] > off["mean_tpot_ms"]


def test_an_mtp_layers_experts_spread_over_the_expert_parallel_group():
    """DeepSeek-V3's MTP layer has 256 routed experts of 3 x 7168 x 2048 weights (fp8: a byte
    each, plus block scales): with EP 8 every GPU holds 32 of them, not all 256."""
    arch = load_preset("deepseek-ai/DeepSeek-V3")
    alone, _ = drafter_memory(config(mtp(0.8), parallelism={}), arch, "fp8", "bf16")
    spread, _ = drafter_memory(config(mtp(0.8)), arch, "fp8", "bf16")
    experts = 256 * 3 * 7168 * 2048
    assert alone - spread == pytest.approx(experts * 7 / 8, rel=0.02)


def test_a_dense_drafter_runs_on_each_rank_and_the_group_waits_for_the_slowest():
    """An EAGLE head on a Qwen3-30B-A3B group of 4 ranks (host costs constant, so a step is its
    GPU time plus the declared overhead): the speculative step is the target's group step plus
    the drafter forwards of the rank whose forwards take longest."""
    eagle = {"method": "eagle", "model": "head", "num_speculative_tokens": 2,
             "acceptance_rate": 0.6}
    sections = dict(model={"name": "Qwen/Qwen3-30B-A3B"}, hardware={"gpu": "H100-SXM"},
                    parallelism={"enable_expert_parallel": True, "data_parallel_size": 4},
                    host={"model": "constant"}, engine={"block_size": 16})
    dep = build_deployment(config(eagle, **sections))
    model = dep.step_model
    shapes = [StepShape.from_requests([(1, 900)] * 6), StepShape.from_requests([(300, 0)]),
              StepShape.from_requests([(1, 200)] * 2), StepShape.dummy()]
    target = model.target.step_time_group(shapes).total_s
    draft = model.draft
    per_rank = [sum(draft.step_time(s).total_s for s in model.draft_shapes(shape))
                for shape in shapes]
    assert per_rank[3] == 0.0                     # a dummy batch drafts nothing
    assert model.step_time_group(shapes).total_s == pytest.approx(target + max(per_rank),
                                                                  rel=1e-9)


# -- on a cluster: the MTP layer's forwards as lock-step steps of the group in the step DAGs ------

ONE_NODE = {"num_nodes": 1, "fabric": {"backend": "analytical"}}


def test_mtp_under_expert_parallelism_on_a_cluster_pays_off_as_in_the_group_model():
    """DeepSeek-V3 EP 8 on one node: the step DAGs (routing sampled per step) and the
    analytical group model (the expected hottest GPU) time the group differently, but the
    tokens per verification are the closed form's and MTP shortens TPOT by a like share."""
    off = simulate(config(cluster=ONE_NODE))
    on = simulate(config(mtp(0.8), cluster=ONE_NODE))
    assert on["completed"] == off["completed"] == 48
    assert on["spec_decode_acceptance_length"] == pytest.approx(1.8, rel=0.05)
    assert on["mean_tpot_ms"] < 0.8 * off["mean_tpot_ms"]
    group = simulate(config(mtp(0.8)))["mean_tpot_ms"] / simulate(config())["mean_tpot_ms"]
    assert on["mean_tpot_ms"] / off["mean_tpot_ms"] == pytest.approx(group, rel=0.15)


def _dag(spec, batches):
    from simcore.cluster.build import build_cluster
    import simpy

    cfg = config(spec, hardware={"gpu": "H200", "gpus_per_node": 8},
                 parallelism={"enable_expert_parallel": True, "data_parallel_size": 16},
                 cluster={"num_nodes": 2, "fabric": {"backend": "analytical"},
                          "dag": {"collectives": {"all_to_all": "hierarchical"},
                                  "moe_routing": {"dispatch_bytes_per_element": 1.0,
                                                  "combine_bytes_per_element": 2.0}}})
    rt = build_cluster(simpy.Environment(), cfg, build_deployment(cfg))
    insts = rt.placement.instances
    dag, _, _ = rt.builder.build([(insts[i], batches.get(i)) for i in range(len(insts))])
    return dag, rt.placement.node_of


def _cross(dag, node_of):
    from simcore.dag.graph import TRANSFER

    out = {}
    for i in range(len(dag)):
        if dag.kind[i] == TRANSFER and node_of(dag.src[i]) != node_of(dag.dst[i]):
            out[dag.op[i]] = out.get(dag.op[i], 0) + dag.size_bytes[i]
    return out


def test_the_mtp_layers_all_to_alls_cross_the_fabric_once_per_token_and_node():
    """EP 16 over two nodes of 8 H200, k = 2: after the target's step (routing drawn from the
    same seed, so the same bytes), each MTP forward is a lock-step step of all 16 ranks: every
    rank runs the layer's attention side, experts and LM head (a rank with no batch a dummy
    forward), and the dispatch sends a token at most once to the other node, the combine
    returning it at twice the bytes. Rank 0 drafts over 101 tokens then 2 sequences, rank 9
    over 3 then 3."""
    from tests.test_cluster import R

    batches = {0: [(R, 100, 0), (R, 1, 30)], 9: [(R, 1, 50)] * 3}
    plain, node_of = _dag(None, batches)
    spec, _ = _dag({"method": "mtp", "num_speculative_tokens": 2, "acceptance_rate": 0.8},
                   batches)
    before, after = _cross(plain, node_of), _cross(spec, node_of)
    dispatch = after["dispatch"] - before["dispatch"]
    combine = after["combine"] - before["combine"]
    h = 7168
    tokens = (101 + 2) + (3 + 3) + 14 * 2         # 14 ranks run a one-token dummy forward
    assert dispatch % h == 0 and 0 < dispatch // h <= tokens
    assert combine == 2 * dispatch
    # Per forward: every rank's attention side, its experts and its LM head.
    assert sum(1 for op in spec.op if op == "draft") == 2 * 16 * 3
    assert sum(1 for op in plain.op if op == "draft") == 0
