"""Prefill and decode instances on GPUs of their own: each role's nodes, its deployment on its
GPU (memory, step times, batch limits), the result's GPUs by type and per-role provenance,
prices per GPU type in a study's cost metrics, and the launch plan."""

import pytest

from dse.evaluate import EvalSpec, precheck, result_metrics
from dse.space import SERVING
from dse.study import Cost
from simcore.cluster.placement import DECODE, PREFILL, place_roles
from simcore.cluster.roles import build_role_deployments
from simcore.config import parse_config
from simcore.errors import ConfigError
from simcore.setup import build_deployment
from simcore.simulate import simulate

LLAMA_70B = "meta-llama/Llama-3.1-70B"


def pd_mapping(prefill_gpu=None, decode_gpu=None, *, num_prompts=40, rate=4.0, **pd):
    roles = {"num_prefill_instances": 2, "num_decode_instances": 2, **pd}
    if prefill_gpu is not None:
        roles["prefill_gpu"] = prefill_gpu
    if decode_gpu is not None:
        roles["decode_gpu"] = decode_gpu
    return {
        "name": "pd-gpus", "seed": 0,
        "model": {"name": LLAMA_70B, "dtype": "fp8", "max_model_len": 8192},
        "hardware": {"gpu": "H100-SXM"},
        "parallelism": {"tensor_parallel_size": 4, "prefill_decode": roles},
        "engine": {"max_num_seqs": 128, "max_num_batched_tokens": 8192},
        "workload": {"num_prompts": num_prompts, "request_rate": rate,
                     "dataset": {"kind": "random", "input_len": 3000, "output_len": 64,
                                 "range_ratio": 0.25}},
        "cluster": {"num_nodes": 2, "fabric": {"backend": "analytical"}},
    }


def pd_config(prefill_gpu=None, decode_gpu=None, **kw):
    return parse_config(pd_mapping(prefill_gpu, decode_gpu, **kw))


# -- placement ------------------------------------------------------------------------------------

def test_roles_on_different_gpus_fill_nodes_of_their_own():
    # Packed, a TP-4 prefill and a TP-4 decode instance would share node 0.
    shared = place_roles(num_nodes=2, gpus_per_node=8, pp=1, num_prefill=1, num_decode=1,
                         prefill_tp=4, decode_tp=4)
    assert shared.instances[1].all_gpus == (4, 5, 6, 7)
    apart = place_roles(num_nodes=2, gpus_per_node=8, pp=1, num_prefill=1, num_decode=1,
                        prefill_tp=4, decode_tp=4, separate_roles=True)
    assert [i.role for i in apart.instances] == [PREFILL, DECODE]
    assert apart.instances[0].all_gpus == (0, 1, 2, 3)
    assert apart.instances[1].all_gpus == (8, 9, 10, 11)
    nodes = [{apart.node_of(g) for g in i.all_gpus} for i in apart.instances]
    assert nodes == [{0}, {1}]
    # Three TP-4 prefill instances take two nodes of their own, so one decode instance needs a
    # third node although 4 of the 16 GPUs are free.
    with pytest.raises(ConfigError, match="cluster.num_nodes: with each role on nodes of its "
                                          "own .* need 24 GPUs; the cluster has 16"):
        place_roles(num_nodes=2, gpus_per_node=8, pp=1, num_prefill=3, num_decode=1,
                    prefill_tp=4, decode_tp=4, separate_roles=True)


# -- each role's deployment -----------------------------------------------------------------------

def test_each_role_is_the_deployment_of_its_own_gpu():
    cfg = pd_config(decode_gpu="H200")
    roles = build_role_deployments(cfg)
    assert roles["prefill"].gpu.name == "H100-SXM"
    assert roles["decode"].gpu.name == "H200"
    alone = {gpu: build_deployment(parse_config({**pd_mapping(), "hardware": {"gpu": gpu},
                                                 "parallelism": {"tensor_parallel_size": 4}}))
             for gpu in ("H100-SXM", "H200")}
    # KV-cache size from the role GPU's memory (141 GB against 80 GB), step model from its
    # kernel profile.
    assert roles["decode"].num_blocks == alone["H200"].num_blocks
    assert roles["prefill"].num_blocks == alone["H100-SXM"].num_blocks
    assert roles["decode"].num_blocks > 1.5 * roles["prefill"].num_blocks
    assert roles["decode"].step_model.profile_id == alone["H200"].step_model.profile_id
    assert roles["prefill"].step_model.profile_id == alone["H100-SXM"].step_model.profile_id


def test_the_decode_gpu_sets_tpot_and_the_prefill_gpu_ttft():
    both_h100 = simulate(pd_config())
    mixed = simulate(pd_config(decode_gpu="H200"))
    both_h200 = simulate(pd_config(prefill_gpu="H200", decode_gpu="H200"))
    # Decode instances on H200 decode as fast as in the all-H200 run (the same instances,
    # fed a little differently), clearly faster than on H100 (4.8 against 3.35 TB/s).
    assert mixed["mean_tpot_ms"] == pytest.approx(both_h200["mean_tpot_ms"], rel=0.02)
    assert mixed["mean_tpot_ms"] < 0.9 * both_h100["mean_tpot_ms"]
    # Prompts run on the prefill instances: TTFT follows the prefill GPU.
    assert mixed["mean_ttft_ms"] > both_h200["mean_ttft_ms"]
    assert mixed["num_gpus"] == 16
    assert mixed["num_gpus_by_type"] == {"H100-SXM": 8, "H200": 8}
    assert both_h200["num_gpus_by_type"] == {"H200": 16}
    assert both_h100["num_gpus_by_type"] == {"H100-SXM": 16}
    roles = mixed["kv_cache"]["roles"]
    assert (roles["prefill"]["gpu"], roles["decode"]["gpu"]) == ("H100-SXM", "H200")
    prov = mixed["provenance"]
    assert prov["compute_kind"].startswith("prefill on H100-SXM: calibrated")
    assert "decode on H200: calibrated" in prov["compute_kind"]
    assert prov["roles"]["decode"]["compute_profile"] == "h200-aiconfigurator"
    assert any(a.startswith("prefill instances on H100-SXM: ") for a in prov["assumptions"])
    assert prov["gpu"] is None and both_h100["provenance"]["gpu"] == "H100-SXM"
    # Both roles on one GPU other than hardware.gpu: the provenance names that GPU.
    assert both_h200["provenance"]["gpu"] == "H200"
    assert "H200" in both_h200["provenance"]["compute_kind"]
    assert "H100" not in both_h200["provenance"]["compute_kind"]


def test_role_gpus_are_checked_and_spelled_as_the_catalog_does():
    with pytest.raises(ConfigError, match="parallelism.prefill_decode.decode_gpu.*unknown GPU "
                                          "'H300'"):
        pd_config(decode_gpu="H300")
    assert pd_config(decode_gpu="h200").parallelism.prefill_decode.decode_gpu == "H200"
    # GH200 servers hold one GPU a node, H100 ones eight: the cluster's GPUs could not be
    # numbered node by node.
    with pytest.raises(ConfigError, match="parallelism.prefill_decode.decode_gpu: H100-SXM "
                                          "nodes hold 8 GPUs and GH200-96GB nodes 1"):
        simulate(pd_config(decode_gpu="GH200-96GB"))
    # A role GPU too small for its TP is refused naming that role's field.
    small = pd_mapping(decode_gpu="L4")
    small["model"]["dtype"] = "bf16"          # 35 GB of weights per GPU at TP 4; an L4 has 24
    with pytest.raises(ConfigError, match=r"^parallelism.prefill_decode.decode_gpu \(decode "
                                          r"instances on L4\): "):
        simulate(parse_config(small))


# -- cost and search ------------------------------------------------------------------------------

def test_an_hour_of_mixed_gpus_is_priced_per_type():
    result = {"num_gpus": 16, "num_gpus_by_type": {"H100-SXM": 8, "H200": 8},
              "output_throughput": 1000.0, "request_throughput": 5.0,
              "provenance": {"step_time_relative_uncertainty": 0.1}}
    m = result_metrics(result, 2.0, {"H200": 3.0})
    assert m["output_tokens_per_dollar"] == pytest.approx(1000 * 3600 / (8 * 2.0 + 8 * 3.0))
    assert m["cost_per_million_output_tokens_usd"] == pytest.approx(
        1e6 / m["output_tokens_per_dollar"])
    # Without prices per type (or a breakdown), every GPU costs usd_per_gpu_hour.
    flat = result_metrics(result, 2.0)
    assert flat["output_tokens_per_dollar"] == pytest.approx(1000 * 3600 / (16 * 2.0))
    legacy = {k: v for k, v in result.items() if k != "num_gpus_by_type"}
    assert result_metrics(legacy, 2.0, {"H200": 3.0})["output_tokens_per_dollar"] == \
        flat["output_tokens_per_dollar"]
    cost = Cost(usd_per_gpu_hour=2.0, usd_per_gpu_hour_by_gpu={"h200": 3.0})
    assert cost.usd_per_gpu_hour_by_gpu == {"H200": 3.0}
    assert cost.hourly_usd({"H100-SXM": 8, "H200": 8}) == 40.0
    with pytest.raises(ValueError, match="unknown GPU 'H300'"):
        Cost(usd_per_gpu_hour_by_gpu={"H300": 1.0})


def test_a_role_gpu_is_a_search_dimension_checked_before_it_runs():
    spec = EvalSpec(objectives=(), max_gpus=16)
    base = pd_mapping(num_prompts=4)
    base["parallelism"] = {"tensor_parallel_size": 4, "data_parallel_size": 4}
    dis = {SERVING: "disaggregated", "parallelism.prefill_decode.num_prefill_instances": 2,
           "parallelism.prefill_decode.num_decode_instances": 2,
           "parallelism.prefill_decode.decode_gpu": "H200"}
    assert precheck(base, dis, {}, spec) is None
    # Three TP-4 prefill instances on H100 nodes leave no whole H200 node for decode.
    reason = precheck(base, {**dis, "parallelism.prefill_decode.num_prefill_instances": 3,
                             "parallelism.prefill_decode.num_decode_instances": 1}, {}, spec)
    assert reason is not None and "each role on nodes of its own" in reason


# -- the launch plan ------------------------------------------------------------------------------

def test_the_launch_plan_puts_each_role_on_its_gpus_nodes():
    from dse.launch import launch_plan, render_plan

    plan = launch_plan(pd_config(decode_gpu="H200"))
    units = {u.name: u for u in plan.units}
    assert {units[n].nodes for n in ("prefill 0", "prefill 1")} == {(0,)}
    assert {units[n].nodes for n in ("decode 0", "decode 1")} == {(1,)}
    assert plan.gpu == "H100-SXM (prefill) and H200 (decode)"
    resolved = {s: v for s, v, _ in plan.resolved}
    assert resolved["GPU per role"] == "prefill H100-SXM, decode H200"
    assert any("H100-SXM nodes and decode instances on H200 nodes" in n for n in plan.notes)
    text = render_plan(plan)
    assert "H100-SXM (prefill) and H200 (decode) x 8 per node" in text


def test_prices_per_type_change_a_stored_studys_cost_only_when_set():
    from pathlib import Path

    from dse.fingerprint import _sha256_json, study_digest
    from dse.study import load_study

    study = load_study(Path(__file__).resolve().parents[1] / "studies" /
                       "pd_vs_aggregated_70b.yaml")
    # As digested before prices per type existed: a stored study resumes.
    assert study_digest(study)["cost"] == _sha256_json({"usd_per_gpu_hour": 2.5})
    priced = study.model_copy(update={"cost": Cost(usd_per_gpu_hour_by_gpu={"H200": 3.5})})
    assert study_digest(priced)["cost"] != study_digest(study)["cost"]
