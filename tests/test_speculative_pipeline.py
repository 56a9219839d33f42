"""EAGLE-3 with pipeline parallelism, as vLLM's Model Runner V2 runs it: the drafter on the last
stage's GPUs (its weights, its own embedding and its KV there only), the head's auxiliary hidden
states carried over the stage hops from the stage that captured them, every other method
refused. On one node with the analytical fabric the step DAGs give the engine's figures; across
nodes the fabric carries the hand-computed bytes."""

import pytest
import simpy

from simcore.cluster.build import build_cluster
from simcore.compute.base import StepShape
from simcore.compute.speculative import aux_states_per_hop, eagle3_aux_layers
from simcore.setup import build_deployment
from simcore.simulate import simulate
from tests.test_cluster import AB, H, R, cross_node_bytes
from tests.test_speculative_cluster import EAGLE3, METRICS, config

LAYERS = 32                      # Llama-3.1-8B
KV_PER_TOKEN_LAYER = 2 * 8 * 128 * 2   # K and V, 8 KV heads of 128, bf16 (TP 1)


def test_the_auxiliary_states_each_hop_carries():
    assert eagle3_aux_layers(LAYERS) == (2, 16, 29)
    # PP 2: layers 0-15 | 16-31; layer 2's input is captured on stage 0, 16's and 29's on 1.
    assert aux_states_per_hop(LAYERS, 2) == (1,)
    # PP 4: 0-7 | 8-15 | 16-23 | 24-31.
    assert aux_states_per_hop(LAYERS, 4) == (1, 1, 2)
    # 61 layers over 4 stages (vLLM gives the remainder to the stages just before the last):
    # 0-14 | 15-29 | 30-45 | 46-60; aux layers 2, 30, 58: layer 30's input is captured on
    # stage 2, so only the last hop carries it.
    assert aux_states_per_hop(61, 4) == (1, 1, 2)


def test_the_engine_step_carries_the_auxiliary_states_over_the_hops():
    """PP 2 inside one node: the speculative step's communication is the target's, the
    drafter's, and one more hidden-state vector per token over the one NVLink hop."""
    dep = build_deployment(config(parallelism={"pipeline_parallel_size": 2}))
    model = dep.step_model
    assert model.aux_states_per_hop == (1,)
    shape = StepShape.from_scheduled([(R, 100, 0), (R, 1, 50), (R, 1, 70)])
    target = model.target
    draft_comm = sum(model.draft.comm_s(s) for s in model.draft_shapes(shape))
    a = target.assumptions
    ic = target.gpu.interconnect_bandwidth_bytes_per_s * a.interconnect_bandwidth_fraction
    aux = shape.num_tokens * H * AB / ic
    st = model.step_time(shape)
    assert st.comm_s == pytest.approx(target.comm_s(shape) + draft_comm + aux, rel=1e-12)
    assert aux > 0


def test_the_drafter_and_its_kv_sit_on_the_last_stage():
    """Llama-3.1-8B, PP 2, bf16: stage 1 holds 16 layers and the LM head, the EAGLE-3 head's
    decoder layer, its LM head and (under PP) its own embedding, and one more KV layer per
    block; stage 0 none of the drafter's."""
    plain = build_deployment(config(None, parallelism={"pipeline_parallel_size": 2})).memory
    spec = build_deployment(config(parallelism={"pipeline_parallel_size": 2})).memory
    assert spec.pp_stage == 1
    assert spec.bytes_per_block == 16 * (16 + 1) * KV_PER_TOKEN_LAYER
    vocab = 128256 * H * 2
    layer = (H * (32 + 2 * 8) * 128 + 32 * 128 * H + 3 * H * 14336) * 2 + 2 * H * 2
    drafter = layer + 2 * vocab             # its own LM head and its own embedding
    arch = build_deployment(config(None)).arch
    assert spec.weight_bytes == pytest.approx(
        arch.stage_weight_bytes("bf16", 1, 2, 1) + drafter, rel=1e-9)
    assert plain.bytes_per_block == 16 * 16 * KV_PER_TOKEN_LAYER
    assert spec.num_blocks < plain.num_blocks


def test_one_node_on_the_analytical_fabric_reproduces_the_engine():
    sections = {"parallelism": {"tensor_parallel_size": 2, "pipeline_parallel_size": 2},
                "host": {"model": "vllm"}}
    plain = simulate(config(EAGLE3, **sections))
    clustered = simulate(config(EAGLE3, **sections,
                                cluster={"num_nodes": 1, "fabric": {"backend": "analytical"}}))
    assert plain["spec_decode_num_drafts"] > 0
    for key in METRICS:
        assert clustered[key] == pytest.approx(plain[key], rel=1e-9), key


def test_the_hop_across_nodes_carries_the_auxiliary_states():
    """PP 2 with TP 2 on two nodes of two GPUs: the one hop crosses the fabric, each TP rank
    sending its half of (2 + 1) x hidden x 2 bytes per token of the step."""
    cfg = config(EAGLE3, hardware={"gpu": "H100-SXM", "gpus_per_node": 2},
                 parallelism={"tensor_parallel_size": 2, "pipeline_parallel_size": 2},
                 cluster={"num_nodes": 2, "fabric": {"backend": "analytical"}})
    dep = build_deployment(cfg)
    rt = build_cluster(simpy.Environment(), cfg, dep)
    batch = [(R, 100, 0), (R, 1, 50), (R, 1, 70)]
    dag, _, _ = rt.builder.build([(rt.placement.instances[0], batch)])
    assert cross_node_bytes(dag, rt.placement.node_of) == {"pp_send": 102 * 3 * H * AB}
    plain = config(None, hardware={"gpu": "H100-SXM", "gpus_per_node": 2},
                   parallelism={"tensor_parallel_size": 2, "pipeline_parallel_size": 2},
                   cluster={"num_nodes": 2, "fabric": {"backend": "analytical"}})
    rt0 = build_cluster(simpy.Environment(), plain, build_deployment(plain))
    dag0, _, _ = rt0.builder.build([(rt0.placement.instances[0], batch)])
    assert cross_node_bytes(dag0, rt0.placement.node_of) == {"pp_send": 102 * 2 * H * AB}


def test_speculation_with_pipeline_stages_shortens_tpot():
    sections = {"parallelism": {"pipeline_parallel_size": 2}}
    off = simulate(config(None, **sections))
    on = simulate(config(EAGLE3, **sections))
    assert on["spec_decode_acceptance_length"] > 1.5
    assert on["mean_tpot_ms"] < 0.8 * off["mean_tpot_ms"]
