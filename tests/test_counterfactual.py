"""Explanations by intervention (`dse.counterfactual`): each candidate resource relaxed x2 and
re-simulated, ranked by the measured effect."""

from __future__ import annotations

import pytest

from dse.counterfactual import candidates, counterfactuals, render_effects, DEFAULT_OBJECTIVES
from simcore.config import parse_config
from simcore.simulate import simulate


def _cfg(wl: dict, **over):
    d = {"name": "cf", "seed": 0, "model": {"name": "meta-llama/Llama-3.1-8B"},
         "hardware": {"gpu": "A100-80GB"}, "compute": {"kind": "roofline"}, "workload": wl}
    d.update(over)
    return parse_config(d)


def _wl(n: int, rate, i: int, o: int) -> dict:
    return {"num_prompts": n, "request_rate": rate,
            "dataset": {"kind": "random", "input_len": i, "output_len": o}}


def _kinds(cfg) -> set[str]:
    return {p.resource for p in candidates(cfg, simulate(cfg))}


def test_candidates_are_those_that_apply():
    one = _cfg(_wl(20, 5, 128, 8))
    assert _kinds(one) == {"compute", "hbm_bandwidth", "kv_capacity", "max_num_seqs",
                           "token_budget", "cpu_side", "api_server", "offered_load"}
    tp2_burst = _cfg(_wl(20, "inf", 128, 8), parallelism={"tensor_parallel_size": 2},
                     host={"model": "constant"})
    assert _kinds(tp2_burst) == {"compute", "hbm_bandwidth", "intra_node_communication",
                                 "kv_capacity", "max_num_seqs", "token_budget"}
    measured = _cfg(_wl(20, 5, 128, 8), hardware={"gpu": "H100-SXM"},
                    compute={"kind": "calibrated"})
    kinds = _kinds(measured)
    assert "gpu_kernels" in kinds and not {"compute", "hbm_bandwidth"} & kinds


def test_each_relaxation_changes_its_resource_only():
    cfg = _cfg(_wl(20, 5, 128, 8))
    base = cfg.model_dump()
    for p in candidates(cfg, simulate(cfg)):
        changed = {(k, sk) for k, v in p.cfg.model_dump().items() if isinstance(v, dict)
                   for sk in v if v[sk] != base[k][sk]}
        expected = {"compute": {("hardware", "bf16_flops")},
                    "hbm_bandwidth": {("hardware", "hbm_bandwidth_bytes_per_s")},
                    "kv_capacity": {("engine", "num_gpu_blocks_override")},
                    "max_num_seqs": {("engine", "max_num_seqs")},
                    "token_budget": {("engine", "max_num_batched_tokens")},
                    "cpu_side": {("host", "host_speed")},
                    "api_server": {("host", "api_server_count")},
                    "offered_load": {("workload", "request_rate")}}[p.resource]
        assert changed == expected, p.resource
        assert p.op_scale is None


# Seven configurations, each limited by a different resource (the engine limits are set tight).
BOUND = {
    "compute": (_cfg(_wl(150, 6, 2048, 8)), None),
    "hbm_bandwidth": (_cfg(_wl(150, 2, 128, 256)), None),
    "kv_capacity": (_cfg(_wl(150, 8, 512, 512), engine={"num_gpu_blocks_override": 300},
                         model={"name": "meta-llama/Llama-3.1-8B", "max_model_len": 2048}),
                    None),
    "max_num_seqs": (_cfg(_wl(150, 8, 128, 128), engine={"max_num_seqs": 4}), None),
    "token_budget": (_cfg(_wl(150, 4, 2048, 16),
                          engine={"max_num_batched_tokens": 64, "max_num_seqs": 32}), None),
    # Llama-3.1-70B over TP 16 on two nodes of 8 H100 joined by 100 Gb/s NICs: every
    # all-reduce crosses the fabric.
    "nic_rate": (parse_config({
        "name": "tp16", "seed": 0, "model": {"name": "meta-llama/Llama-3.1-70B"},
        "hardware": {"gpu": "H100-SXM"}, "parallelism": {"tensor_parallel_size": 16},
        "workload": _wl(40, 2, 1024, 64),
        "cluster": {"num_nodes": 2, "network": {"nic_gbps": 100},
                    "fabric": {"backend": "analytical"}}}),
        ("nic_rate", "intra_node_communication", "compute", "hbm_bandwidth", "token_budget")),
    # The same over 400 Gb/s NICs, each node under a leaf of its own whose uplinks are 32x
    # oversubscribed: the all-reduces between the nodes are limited by the leaf-spine links.
    "fabric_core": (parse_config({
        "name": "tp16-core", "seed": 0, "model": {"name": "meta-llama/Llama-3.1-70B"},
        "hardware": {"gpu": "H100-SXM"}, "parallelism": {"tensor_parallel_size": 16},
        "workload": _wl(16, 2, 1024, 32),
        "cluster": {"num_nodes": 2, "network": {"nic_gbps": 400, "topology": {
            "kind": "leaf_spine", "rails": False, "nodes_per_leaf": 1, "oversubscription": 32}},
            "fabric": {"backend": "analytical"}}}),
        ("nic_rate", "fabric_core", "intra_node_communication", "hbm_bandwidth")),
}
LEADS = {"compute", "hbm_bandwidth", "nic_rate", "fabric_core"}
"""Where the named resource must rank first; the engine limits must show a real effect and
beat every other engine limit (HBM bandwidth, which shortens every decode step, can rank
above them: relaxing it serves the same requests sooner and so frees the limit as well)."""
ENGINE_LIMITS = {"kv_capacity", "max_num_seqs", "token_budget"}


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(BOUND))
def test_the_ranking_is_the_measured_effect_of_each_intervention(kind):
    cfg, only = BOUND[kind]
    base = simulate(cfg)
    effects = counterfactuals(cfg, base=base, only=only)
    scores = [e.score for e in effects]
    assert scores == sorted(scores, reverse=True)
    # The top cause, relaxed again on its own, improves each objective by what it says.
    top = effects[0]
    plan = next(p for p in candidates(cfg, base) if p.resource == top.resource)
    again = simulate(plan.cfg, op_scale=plan.op_scale)
    for o in DEFAULT_OBJECTIVES:
        assert again[o.metric] == top.values[o.metric]
    named = next(e for e in effects if e.resource == kind)
    assert named.score > 0.05
    if kind in LEADS:
        assert top.resource == kind
    if kind == "fabric_core":   # faster NICs behind the same leaf-spine links do not help
        assert next(e for e in effects if e.resource == "nic_rate").score < 0.01
    else:
        others = [e for e in effects if e.resource in ENGINE_LIMITS - {kind}]
        assert all(named.score > e.score for e in others)
        assert effects.index(named) <= 1
    text = render_effects(effects, DEFAULT_OBJECTIVES, base)
    assert f"Limited first by {top.label}: {top.change}" in text


def test_a_cluster_run_is_offered_its_fabric_and_host_candidates():
    """On a two-node leaf-spine the NICs and the leaf-spine links are relaxed apart; cluster runs
    take vLLM's CPU side and the API server's path, so those are candidates too."""
    cfg = parse_config({
        "name": "pd", "seed": 0, "model": {"name": "meta-llama/Llama-3.1-8B"},
        "hardware": {"gpu": "H100-SXM"},
        "parallelism": {"prefill_decode": {"num_prefill_instances": 1,
                                           "num_decode_instances": 1}},
        "workload": _wl(8, 4, 512, 16),
        "cluster": {"num_nodes": 2, "fabric": {"backend": "analytical"}}})
    kinds = _kinds(cfg)
    assert {"nic_rate", "fabric_core", "cpu_side", "api_server"} <= kinds
    assert "tenant_traffic" not in kinds


def test_the_default_objectives_take_the_tail_percentile_a_run_reports():
    from dse.counterfactual import default_objectives

    names = lambda r: [o.metric for o in default_objectives(r)]   # noqa: E731
    both = {"p99_ttft_ms": 1, "p99_tpot_ms": 1, "p99.9_ttft_ms": 2, "p99.9_tpot_ms": 2}
    assert names(both) == [o.metric for o in DEFAULT_OBJECTIVES]
    # Percentiles [25, 99.9]: the 99th is not there (--explain crashed on it).
    assert names({"p25_ttft_ms": 1, "p99.9_ttft_ms": 2, "p25_tpot_ms": 1,
                  "p99.9_tpot_ms": 2}) == ["p99.9_ttft_ms", "p99.9_tpot_ms",
                                           "output_throughput"]
    assert names({}) == ["mean_ttft_ms", "mean_tpot_ms", "output_throughput"]
