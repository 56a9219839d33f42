"""Speculative decoding on a cluster and with prefill/decode disaggregation: on one node with the
analytical fabric the step DAGs give the engine's figures exactly (the drafter's forwards close
each step); with TP across nodes the drafter's collectives put on the fabric the bytes their
algorithm implies; a P/D handoff moves the drafter's KV layers with the target's, and the
decode instances speculate; the launch plan passes the drafter to every vLLM instance."""

import copy

import pytest
import simpy

from simcore.cluster.build import build_cluster
from simcore.config import parse_config
from simcore.setup import build_deployment
from simcore.simulate import simulate
from tests.test_cluster import AB, BASE, H, R, VOCAB, cross_node_bytes

EAGLE3 = {"method": "eagle3", "num_speculative_tokens": 2, "acceptance_rate": 0.7}

METRICS = ("mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms", "mean_itl_ms",
           "mean_e2el_ms", "num_steps", "duration", "completed",
           "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens")


def config(spec=EAGLE3, **sections):
    """test_cluster's base config (Llama-3.1-8B on H100, roofline) with `spec` as the
    speculative config and whole top-level sections replaced."""
    d = copy.deepcopy(BASE)
    engine = dict(sections.pop("engine", {}))
    if spec is not None:
        engine["speculative_config"] = spec
    d["engine"] = engine
    d.update(copy.deepcopy(sections))
    return parse_config(d)


CASES = {
    "eagle3-tp2-vllm-sync": (EAGLE3, {"parallelism": {"tensor_parallel_size": 2},
                                      "host": {"model": "vllm"}}),
    "eagle3-tp2-constant": (EAGLE3, {"parallelism": {"tensor_parallel_size": 2},
                                     "host": {"model": "constant"}}),
    "eagle3-tp1-vllm-async": (EAGLE3, {"host": {"model": "vllm"},
                                       "engine": {"async_scheduling": True}}),
    "ngram-tp2": ({"method": "ngram", "num_speculative_tokens": 3, "acceptance_rate": 0.4},
                  {"parallelism": {"tensor_parallel_size": 2}}),
    "draft-model-tp4": ({"method": "draft_model", "model": "meta-llama/Llama-3.1-8B",
                         "num_speculative_tokens": 3, "acceptance_rate": 0.6},
                        {"model": {"name": "meta-llama/Llama-3.1-70B"},
                         "parallelism": {"tensor_parallel_size": 4}}),
    "mtp-deepseek-v3-tp8": ({"method": "mtp", "num_speculative_tokens": 1, "acceptance_rate": 0.8},
                            {"model": {"name": "deepseek-ai/DeepSeek-V3", "dtype": "fp8"},
                             "hardware": {"gpu": "H200"},
                             "parallelism": {"tensor_parallel_size": 8},
                             "workload": {"num_prompts": 12, "request_rate": 20,
                                          "dataset": {"kind": "random", "input_len": 300,
                                                      "output_len": 24}}}),
}


@pytest.mark.parametrize("case", CASES)
def test_one_node_on_the_analytical_fabric_reproduces_the_engine_with_speculation(case):
    spec, sections = CASES[case]
    plain = simulate(config(spec, **sections))
    clustered = simulate(config(spec, **sections,
                                cluster={"num_nodes": 1, "fabric": {"backend": "analytical"}}))
    assert plain["spec_decode_num_drafts"] > 0
    for key in METRICS:
        assert clustered[key] == pytest.approx(plain[key], rel=1e-9), key
    assert clustered["cluster"]["fabric"]["payload_bytes"] == 0


def test_speculation_shortens_tpot_on_a_cluster_as_on_one_engine():
    sections = {"parallelism": {"tensor_parallel_size": 2},
                "cluster": {"num_nodes": 1, "fabric": {"backend": "flow"}}}
    off = simulate(config(None, **sections))
    on = simulate(config(EAGLE3, **sections))
    assert on["spec_decode_acceptance_length"] > 1.5
    assert on["mean_tpot_ms"] < 0.8 * off["mean_tpot_ms"]


# -- the drafter's collectives across nodes ------------------------------------------------------

BATCH = [(R, 100, 0), (R, 1, 50), (R, 1, 70)]      # a prompt chunk and two decodes, no drafts


def test_the_drafters_collectives_cross_the_fabric_as_a_ring_implies():
    """TP 4 over two nodes of two GPUs, ring collectives: a ring over ranks 0-3 crosses nodes on
    2 of its 4 edges, each carrying 2 (n - 1) segments of S / n for an all-reduce of S (3 S in
    all) and n - 1 segments for an all-gather (3/2 of it). The EAGLE-3 head (one layer) with
    k = 2 runs one forward over the step's 102 tokens and one over its 3 sequences; each
    all-reduces the embedding, the attention and the MLP output and gathers 3 rows of logits."""
    cfg = config(EAGLE3, hardware={"gpu": "H100-SXM", "gpus_per_node": 2},
                 parallelism={"tensor_parallel_size": 4},
                 cluster={"num_nodes": 2, "fabric": {"backend": "analytical"},
                          "dag": {"collectives": {"all_reduce": "ring",
                                                  "all_gather": "ring"}}})
    dep = build_deployment(cfg)
    rt = build_cluster(simpy.Environment(), cfg, dep)
    dag, _, _ = rt.builder.build([(rt.placement.instances[0], BATCH)])
    tokens, seqs = 102, 3
    target_reduced = tokens * H * AB * (1 + 2 * 32)
    draft_reduced = (tokens + seqs) * H * AB * (1 + 2 * 1)
    gathered = seqs * VOCAB * AB * (1 + 2)          # the target's logits, then each forward's
    assert cross_node_bytes(dag, rt.placement.node_of) == {
        "all_reduce": 3 * (target_reduced + draft_reduced), "all_gather": 3 * gathered // 2}
    assert sum(1 for op in dag.op if op == "draft") == 2 * 3


# -- prefill/decode disaggregation ---------------------------------------------------------------

def pd_config(spec=EAGLE3, *, decode_tp=None, backend="flow"):
    pd = {"num_prefill_instances": 2, "num_decode_instances": 2}
    if decode_tp:
        pd["decode_tensor_parallel_size"] = decode_tp
    return config(spec, parallelism={"tensor_parallel_size": 2, "prefill_decode": pd},
                  workload={"num_prompts": 40, "request_rate": 8,
                            "dataset": {"kind": "random", "input_len": 1000,
                                        "output_len": 60}},
                  cluster={"num_nodes": 2, "fabric": {"backend": backend}})


# KV bytes of one token over all of an instance's GPUs, bf16: 32 layers x 8 KV heads x 128 x
# (K, V) x 2 bytes for Llama-3.1-8B; the EAGLE-3 head keeps one layer of the same shape.
TARGET_KV, HEAD_KV = 32 * 8 * 128 * 2 * 2, 1 * 8 * 128 * 2 * 2


@pytest.mark.parametrize("decode_tp", [None, 4], ids=["same-tp", "decode-tp4"])
def test_the_handoff_moves_the_drafters_kv_with_the_targets(decode_tp):
    off = simulate(pd_config(None, decode_tp=decode_tp))
    on = simulate(pd_config(decode_tp=decode_tp))
    prompt_tokens = 40 * 1000
    assert off["cluster"]["kv_transfers"]["num"] == on["cluster"]["kv_transfers"]["num"] == 40
    assert off["cluster"]["kv_transfers"]["bytes"] == prompt_tokens * TARGET_KV
    assert on["cluster"]["kv_transfers"]["bytes"] == prompt_tokens * (TARGET_KV + HEAD_KV)


def test_decode_instances_speculate_and_prefill_instances_only_prefill():
    off = simulate(pd_config(None))
    on = simulate(pd_config())
    assert on["completed"] == 40
    assert on["spec_decode_num_drafts"] > 0
    assert on["spec_decode_acceptance_length"] > 1.5
    assert on["mean_tpot_ms"] < 0.8 * off["mean_tpot_ms"]
    reps = on["replicas"]
    # Placement order: prefill instances first. They run prompts only; verifications (decodes
    # carrying drafts) run on the decode instances.
    assert [r["num_decode_tokens"] for r in reps[:2]] == [0, 0]
    assert all(r["num_prefill_tokens"] == 0 and r["num_decode_tokens"] > 0 for r in reps[2:])
    # The prefill instances' steps carry the drafter's forward over the prompt: slower than
    # without a drafter for the same prompts.
    assert sum(r["busy_s"] for r in reps[:2]) > sum(r["busy_s"] for r in off["replicas"][:2])


def test_the_launch_plan_passes_the_drafter_to_every_instance():
    from dse.launch import launch_plan

    plan = launch_plan(pd_config())
    serves = [c for u in plan.units for c in u.commands if c.is_serve]
    assert len(serves) == 4
    for c in serves:
        i = c.argv.index("--speculative-config")
        assert c.argv[i + 1] == ('{"method": "eagle3", "model": "<EAGLE head checkpoint>", '
                                 '"num_speculative_tokens": 2}')
    assert any("speculative_config.model not set" in w for w in plan.warnings)


# -- expert-parallel groups on a cluster ---------------------------------------------------------

def ep_config(spec=EAGLE3):
    return config(spec, model={"name": "Qwen/Qwen3-30B-A3B"},
                  parallelism={"enable_expert_parallel": True, "data_parallel_size": 4},
                  cluster={"num_nodes": 1, "fabric": {"backend": "analytical"}})


def test_a_dense_drafter_drafts_on_each_busy_rank_of_an_expert_parallel_group():
    """A lock-step step in which rank 0 runs a batch and the others dummy batches: only rank 0's
    lane carries the EAGLE-3 head's forwards (k = 2, each an attention side, an MLP side and an
    LM head)."""
    cfg = ep_config()
    dep = build_deployment(cfg)
    rt = build_cluster(simpy.Environment(), cfg, dep)
    insts = rt.placement.instances
    dag, _, _ = rt.builder.build([(insts[0], BATCH)] + [(i, None) for i in insts[1:]])
    drafts = [dag.lanes[dag.lane[i]].engine for i in range(len(dag)) if dag.op[i] == "draft"]
    assert drafts == [insts[0].index] * (2 * 3)


def test_speculation_shortens_tpot_in_an_expert_parallel_group_on_a_cluster():
    off = simulate(ep_config(None))
    on = simulate(ep_config())
    assert on["ep_size"] == off["ep_size"] == 4
    assert on["spec_decode_acceptance_length"] > 1.5
    assert on["mean_tpot_ms"] < 0.8 * off["mean_tpot_ms"]

