"""Cluster mode end to end: on one node with the analytical fabric it is the engine's analytical
model exactly; tensor and expert parallelism put on the fabric exactly the bytes their
collectives imply, and nothing when they stay inside a node; another tenant's traffic on shared
links slows steps and so changes the batches that follow (on every backend: the analytical one
serialises messages on shared links); placement follows vLLM's rank order and refuses impossible
layouts; a run is reproducible from its seed."""

import copy
import json
from types import SimpleNamespace

import numpy as np
import pytest
import simpy

from simcore.cluster.build import build_cluster
from simcore.cluster.placement import place
from simcore.cluster.runtime import ClusterRuntime
from simcore.compute.base import StepShape
from simcore.config import parse_config
from simcore.dag.graph import TRANSFER
from simcore.errors import ConfigError
from simcore.setup import build_deployment
from simcore.simulate import simulate

BASE = {
    "name": "cluster",
    "seed": 11,
    "model": {"name": "meta-llama/Llama-3.1-8B"},
    "hardware": {"gpu": "H100-SXM"},
    # The roofline: these tests hold the cluster runtime to the engine's analytical model.
    "compute": {"kind": "roofline"},
    "workload": {"num_prompts": 30, "request_rate": 30,
                 "dataset": {"kind": "random", "input_len": 300, "output_len": 24}},
}

REQUEST_METRICS = ("mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms", "mean_itl_ms",
                   "mean_e2el_ms", "num_steps", "duration", "completed")


def config(**sections):
    """BASE with whole top-level sections replaced."""
    d = copy.deepcopy(BASE)
    d.update(copy.deepcopy(sections))
    return parse_config(d)


R = SimpleNamespace(client=None)
"""A scheduled request as the cluster runtime sees it (no client record to charge)."""


def runtime(cfg):
    """The deployment, a fresh clock and the cluster runtime of `cfg`, its pump started."""
    dep = build_deployment(cfg)
    env = simpy.Environment()
    rt = build_cluster(env, cfg, dep)
    rt.start()
    return dep, env, rt


def run_step(env, rt, batches):
    """One step of the listed (instance, batch) through the runtime, on the clock."""
    out = {}

    def proc():
        out["step"] = yield from rt.step(batches)

    env.run(until=env.process(proc()))
    return out["step"]


def cross_node_bytes(dag, node_of) -> dict[str, int]:
    """Bytes of the DAG's transfers between GPUs of different nodes, by op."""
    out: dict[str, int] = {}
    for i in range(len(dag)):
        if dag.kind[i] == TRANSFER and node_of(dag.src[i]) != node_of(dag.dst[i]):
            out[dag.op[i]] = out.get(dag.op[i], 0) + dag.size_bytes[i]
    return out


# --- 1. one node, analytical fabric: the engine's analytical model ------------------------------

SINGLE_NODE_CASES = {
    "dense-tp1": ({}, {}),
    "dense-tp2": ({}, {"tensor_parallel_size": 2}),
    "dense-tp4": ({}, {"tensor_parallel_size": 4}),
    "dense-tp4-pp2": ({}, {"tensor_parallel_size": 4, "pipeline_parallel_size": 2}),
    "moe-qwen3-235b-tp8": ({"model": {"name": "Qwen/Qwen3-235B-A22B"},
                            "hardware": {"gpu": "H200"}}, {"tensor_parallel_size": 8}),
    "moe-mixtral-tp2": ({"model": {"name": "mistralai/Mixtral-8x7B-v0.1"}},
                        {"tensor_parallel_size": 2}),
    # MLA, and layer groups that mix dense and MoE layers (3 dense of 61, in groups of 15-16).
    "moe-deepseek-v3-tp8-fp8": ({"model": {"name": "deepseek-ai/DeepSeek-V3", "dtype": "fp8"},
                                 "hardware": {"gpu": "H200"}}, {"tensor_parallel_size": 8}),
}


HOSTS = {"constant": ({"model": "constant"}, {}),
         "vllm-sync": ({"model": "vllm"}, {}),
         "vllm-async": ({"model": "vllm"}, {"async_scheduling": True})}
"""The CPU side: the declared per-step overhead, or vLLM's measured costs with sync or async
scheduling (and the API server's path before each request)."""


@pytest.mark.parametrize("host", HOSTS)
@pytest.mark.parametrize("case", SINGLE_NODE_CASES)
def test_one_node_on_the_analytical_fabric_reproduces_the_engine_model(case, host):
    sections, parallelism = SINGLE_NODE_CASES[case]
    host_section, engine = HOSTS[host]
    extra = {"host": host_section, **({"engine": engine} if engine else {})}
    plain = simulate(config(**sections, parallelism=parallelism, **extra))
    clustered = simulate(config(**sections, parallelism=parallelism, **extra,
                                cluster={"num_nodes": 1, "fabric": {"backend": "analytical"}}))
    if host != "constant":
        assert clustered["mean_api_server_ms"] == plain["mean_api_server_ms"] > 0
    for key in REQUEST_METRICS:
        assert clustered[key] == pytest.approx(plain[key], rel=1e-9), key
    assert clustered["cluster"]["fabric"]["payload_bytes"] == 0
    assert [r["num_prefill_tokens"] for r in clustered["replicas"]] == [
        r["num_prefill_tokens"] for r in plain["replicas"]]


BATCHES = {
    "decode-graph": [(R, 1, 100 + 7 * i) for i in range(8)],      # a full CUDA graph
    "mixed": [(R, 300, 0), (R, 1, 40), (R, 1, 900)],
    "short-prefill": [(R, 2, 0)],
}


@pytest.mark.parametrize("eager_s_per_layer", [20e-6, 3e-3],
                         ids=["default-launch", "launch-bound"])
@pytest.mark.parametrize("case", ["dense-tp1", "dense-tp2", "dense-tp4-pp2",
                                  "moe-deepseek-v3-tp8-fp8"])
def test_one_step_dag_takes_the_roofline_step_time(case, eager_s_per_layer):
    """The runtime's step (CPU overhead, the DAG's critical path, eager launch outside full CUDA
    graphs) against `RooflineModel.step_time` for the same batch."""
    sections, parallelism = SINGLE_NODE_CASES[case]
    cfg = config(**sections, parallelism=parallelism, cluster={"num_nodes": 1},
                 compute={"roofline": {"eager_launch_s_per_layer": eager_s_per_layer}},
                 host={"model": "constant"})
    dep, env, rt = runtime(cfg)
    launch_bound = 0
    for name, batch in BATCHES.items():
        t0 = env.now
        st = run_step(env, rt, [(0, batch)])
        ref = dep.step_model.step_time(StepShape.from_scheduled(batch))
        assert st.total_s == pytest.approx(ref.total_s, rel=1e-12), name
        assert env.now - t0 == pytest.approx(ref.total_s, rel=1e-12), name
        if parallelism.get("pipeline_parallel_size", 1) == 1:
            assert st.compute_s == pytest.approx(ref.compute_s, rel=1e-12), name
            assert st.comm_s == pytest.approx(ref.comm_s, rel=1e-12, abs=1e-15), name
        launch_bound += ref.overhead_s > cfg.compute.roofline.step_overhead_s * (1 + 1e-9)
    # The launch-bound variant exercises the eager-launch floor on every non-graph batch.
    assert launch_bound == (2 if eager_s_per_layer == 3e-3 else 0)


# --- 2. bytes on the fabric ---------------------------------------------------------------------

def test_tensor_parallelism_inside_nodes_puts_no_byte_on_the_fabric():
    r = simulate(config(parallelism={"tensor_parallel_size": 8, "data_parallel_size": 2},
                        cluster={"num_nodes": 2, "fabric": {"backend": "flow"}}))
    c = r["cluster"]
    assert c["gpus_used"] == 16 and c["num_nodes"] == 2
    assert c["fabric"]["payload_bytes"] == 0
    assert c["fabric"]["num_step_messages"] == 0
    assert c["fabric_share_of_step_time"] == 0.0
    assert c["exposed_gpu_s"] and all(k.endswith("/nvlink") or k in ("sync", "pipeline")
                                      for k in c["exposed_gpu_s"])
    assert r["completed"] == 30
    # Every GPU's communication-induced stall, summed, is the exposed communication.
    stall = c["comm_stall_s_by_gpu"]
    assert sorted(map(int, stall)) == list(range(16))
    comm = sum(v for k, v in c["exposed_gpu_s"].items() if k.endswith(("/nvlink", "/fabric")))
    assert sum(stall.values()) == pytest.approx(comm, rel=1e-9)
    for key in ("network_share_of_request_latency", "network_share_of_step_time",
                "congestion_share_of_step_time"):
        assert r[key] == c[key]


H, AB, VOCAB = 4096, 2, 128256          # Llama-3.1-8B: hidden size, bf16 bytes, vocabulary
TP_BATCH = [(R, 100, 0), (R, 1, 50), (R, 1, 70)]


def tp_across_nodes_config(all_reduce="auto", all_gather="auto", backend="analytical"):
    """TP 4 over two nodes of two GPUs: ranks 0, 1 on node 0 and 2, 3 on node 1."""
    return config(hardware={"gpu": "H100-SXM", "gpus_per_node": 2},
                  parallelism={"tensor_parallel_size": 4},
                  cluster={"num_nodes": 2, "fabric": {"backend": backend},
                           "dag": {"collectives": {"all_reduce": all_reduce,
                                                   "all_gather": all_gather}}})


@pytest.mark.parametrize("all_gather", ["ring", "hierarchical"])
@pytest.mark.parametrize("all_reduce", ["ring", "hierarchical"])
def test_tensor_parallelism_across_nodes_sends_the_bytes_its_algorithm_implies(all_reduce,
                                                                              all_gather):
    _, _, rt = runtime(tp_across_nodes_config(all_reduce, all_gather))
    b = rt.builder
    assert b.groups == [[(8, 8, 0)] * 4]         # 32 layers fused into 4 groups of 8
    dag, full_graph, _ = b.build([(rt.placement.instances[0], TP_BATCH)])
    assert not full_graph
    tokens, seqs, n, nodes = 102, 3, 4, 2
    # All-reduced bytes: the embedding's (one layer's worth) plus, per layer group, the
    # attention and the MLP all-reduce of 8 fused layers each.
    all_reduced = tokens * H * AB * (1 + 4 * 2 * 8)
    gathered = seqs * VOCAB * AB                 # the logits
    if all_reduce == "ring":
        # A ring over 0, 1, 2, 3 crosses nodes on 2 of its 4 edges; each edge carries
        # 2 (n - 1) segments of S / n.
        ar = nodes * 2 * (n - 1) * all_reduced // n
    else:
        # Intra-node reduce-scatter, then per local position a ring all-reduce of its half
        # over the 2 nodes (2 (M - 1) x shard in all), then an intra-node all-gather.
        ar = (n // nodes) * 2 * (nodes - 1) * (all_reduced // (n // nodes))
    if all_gather == "ring":
        ag = nodes * (n - 1) * gathered // n     # n - 1 segments on each crossing edge
    else:
        ag = (nodes - 1) * gathered              # each node receives the other node's parts
    assert cross_node_bytes(dag, rt.placement.node_of) == {"all_reduce": ar,
                                                           "all_gather": ag}
    assert (ar, ag) == {("ring", "ring"): (3 * all_reduced, 3 * gathered // 2),
                        ("ring", "hierarchical"): (3 * all_reduced, gathered),
                        ("hierarchical", "ring"): (2 * all_reduced, 3 * gathered // 2),
                        ("hierarchical", "hierarchical"): (2 * all_reduced, gathered),
                        }[(all_reduce, all_gather)]


@pytest.mark.parametrize("backend", ["analytical", "flow", "packet"])
def test_the_fabric_carries_exactly_the_dags_cross_node_bytes(backend):
    """Contract: whatever the backend, one step delivers the DAG's cross-node transfer bytes and
    nothing else, and the step lasts longer than with TP inside one node."""
    cfg = tp_across_nodes_config("ring", "ring", backend)
    _, env, rt = runtime(cfg)
    expected = cross_node_bytes(rt.builder.build([(rt.placement.instances[0], TP_BATCH)])[0],
                                rt.placement.node_of)
    st = run_step(env, rt, [(0, TP_BATCH)])
    fs = rt.fabric.stats()
    assert fs.payload_delivered_bytes == sum(expected.values())
    assert fs.payload_sent_bytes == fs.payload_delivered_bytes
    assert all(m.tag == "step" for m in fs.messages)
    causes = rt.stats.gpu_exposed_s
    assert causes.get("all_reduce/fabric", 0.0) > 0.0
    one_node = config(parallelism={"tensor_parallel_size": 4}, cluster={"num_nodes": 1})
    _, env1, rt1 = runtime(one_node)
    assert st.total_s > run_step(env1, rt1, [(0, TP_BATCH)]).total_s


MIXTRAL_EP = {
    "model": {"name": "mistralai/Mixtral-8x7B-v0.1"},
    "hardware": {"gpu": "H100-SXM", "gpus_per_node": 2},
    "parallelism": {"tensor_parallel_size": 2, "data_parallel_size": 2,
                    "enable_expert_parallel": True},
}


def ep_config(all_to_all="auto", backend="flow", workload=BASE["workload"], **cluster):
    """EP 4 = DP 2 x TP 2 over two nodes of two GPUs: each DP rank's TP group on its own node,
    so every all-to-all crosses nodes. fp8-like dispatch (1 B/element), bf16 combine."""
    return config(**MIXTRAL_EP, workload=workload, cluster={
        "num_nodes": 2, "fabric": {"backend": backend},
        "dag": {"collectives": {"all_to_all": all_to_all},
                "moe_routing": {"dispatch_bytes_per_element": 1.0,
                                "combine_bytes_per_element": 2.0}}, **cluster})


@pytest.mark.parametrize("all_to_all", ["direct", "hierarchical"])
def test_expert_parallel_all_to_all_sends_each_token_once_per_gpu_or_node(all_to_all):
    _, env, rt = runtime(ep_config(all_to_all))
    b = rt.builder
    batches = [(0, [(R, 100, 0), (R, 1, 30)]), (1, [(R, 1, 50)] * 3)]
    insts = rt.placement.instances
    dag, _, _ = b.build([(insts[i], s) for i, s in batches])
    node_of = rt.placement.node_of
    layers = 8                                    # Mixtral's 32 layers in 4 groups of 8
    # Layer-tokens each GPU holds per group: its TP rank's half of its DP rank's tokens (101
    # and 3), over the group's 8 layers.
    held = {0: 404, 1: 404, 2: 12, 3: 12}
    assert sum(held.values()) == layers * (101 + 3)
    sent: dict[tuple[str, int, int], int] = {}
    for i in range(len(dag)):
        if dag.kind[i] == TRANSFER and node_of(dag.src[i]) != node_of(dag.dst[i]):
            key = (dag.op[i], dag.src[i], dag.dst[i])
            sent[key] = sent.get(key, 0) + dag.size_bytes[i]
    dispatch = {k: v for k, v in sent.items() if k[0] == "dispatch"}
    combine = {k: v for k, v in sent.items() if k[0] == "combine"}
    assert dispatch
    per_group = 4                                 # transfers of one (src, dst) pair: 1 per group
    for (_, src, dst), size in dispatch.items():
        assert size % H == 0                      # whole tokens at 1 B/element
        # DeepEP sends a token at most once to each GPU (direct) or node (hierarchical).
        assert 0 < size // H <= per_group * held[src]
        # The combine returns the same tokens, at 2 B/element, the other way.
        assert combine[("combine", dst, src)] == 2 * size
    assert len(combine) == len(dispatch)
    # The fabric carries exactly these bytes: the same step, re-sampled from the same seed.
    expected = cross_node_bytes(dag, node_of)
    _, env, rt = runtime(ep_config(all_to_all))
    run_step(env, rt, batches)
    assert rt.fabric.stats().payload_delivered_bytes == sum(expected.values())
    assert {"dispatch/fabric", "combine/fabric"} <= set(rt.stats.gpu_exposed_s)


def test_per_node_deduplication_matches_its_expectation():
    # With uniform routing over Mixtral's 8 experts (top 2), two experts per GPU and GPUs 2, 3
    # on the other node, a token needs that node with probability 1 - (1/2)^2 = 3/4.
    cfg = ep_config("hierarchical")
    _, env, rt = runtime(cfg)
    b = rt.builder
    insts = rt.placement.instances
    batch = [(R, 1, 10)] * 200
    total = 0
    for _ in range(20):
        dag, _, _ = b.build([(insts[0], batch), (insts[1], None)])
        for i in range(len(dag)):
            if dag.kind[i] == TRANSFER and dag.op[i] == "dispatch" and dag.src[i] == 0:
                total += dag.size_bytes[i] // H
    # GPU 0 holds 100 of the 200 tokens, 8 layers per group, 4 groups, 20 steps.
    trials = 100 * 8 * 4 * 20
    assert total == pytest.approx(0.75 * trials, rel=0.02)


# --- 3. a competing tenant: closed loop ---------------------------------------------------------

def tenant_config(backend, tenant):
    """TP 4 over two nodes of two GPUs on 100 Gb/s NICs. The tenant sends from GPU 1's NIC to
    GPU 3's (rail 1 to rail 1) at half the NIC rate: the same links the inter-node rings of the
    TP collectives use."""
    cluster = {"num_nodes": 2, "network": {"nic_gbps": 100}, "fabric": {"backend": backend}}
    if tenant:
        cluster["tenant_traffic"] = [{"src_gpu": 1, "dst_gpu": 3, "rate_gbps": 50,
                                      "message_bytes": 4_000_000, "stop_s": 1.0}]
    return config(hardware={"gpu": "H100-SXM", "gpus_per_node": 2},
                  parallelism={"tensor_parallel_size": 4}, cluster=cluster,
                  workload={"num_prompts": 20, "request_rate": 100,
                            "dataset": {"kind": "random", "input_len": 128,
                                        "output_len": 16}})


def run_recording_batches(cfg, monkeypatch):
    """simulate(cfg) and the (new tokens, context) of every request of every step."""
    steps = []
    step = ClusterRuntime.step

    def recording(self, batches):
        steps.append(tuple(tuple((n, c) for _, n, c in s or ()) for _, s in batches))
        return (yield from step(self, batches))

    monkeypatch.setattr(ClusterRuntime, "step", recording)
    result = simulate(cfg)
    monkeypatch.setattr(ClusterRuntime, "step", step)
    return result, steps


def mean_batch_tokens(r):
    rep = r["replicas"][0]
    return (rep["num_prefill_tokens"] + rep["num_decode_tokens"]) / rep["num_steps"]


@pytest.mark.parametrize("backend", ["analytical", "flow", "packet"])
def test_a_tenant_on_shared_links_slows_steps_and_changes_the_batches(backend, monkeypatch):
    alone, alone_steps = run_recording_batches(tenant_config(backend, False), monkeypatch)
    shared, shared_steps = run_recording_batches(tenant_config(backend, True), monkeypatch)
    assert alone["completed"] == shared["completed"] == 20
    assert shared["mean_tpot_ms"] > 1.1 * alone["mean_tpot_ms"]
    assert shared["num_steps"] != alone["num_steps"]
    assert len(shared_steps) == shared["num_steps"] and len(alone_steps) == alone["num_steps"]
    assert shared_steps != alone_steps
    # Slower steps let more requests queue, so batches hold more of them.
    assert mean_batch_tokens(shared) > mean_batch_tokens(alone)
    assert (shared["replicas"][0]["max_num_running"]
            > alone["replicas"][0]["max_num_running"])
    # The slowdown is the fabric's congestion, which the step's exposure reports.
    assert alone["cluster"]["congestion_share_of_step_time"] < 1e-9
    assert shared["cluster"]["congestion_share_of_step_time"] > 0.05
    slow = max(b["slowdown_max"] for b in shared["cluster"]["fabric"]["slowdown_by_size"])
    assert slow > 1.5                            # at most half the link left at times


def test_without_a_tenant_the_flow_and_analytical_steps_agree(monkeypatch):
    # No two transfers share a link here, so serialising and fair sharing give the same times:
    # the batches match.
    alone, alone_steps = run_recording_batches(tenant_config("analytical", False), monkeypatch)
    flow, flow_steps = run_recording_batches(tenant_config("flow", False), monkeypatch)
    assert flow_steps == alone_steps
    assert flow["mean_tpot_ms"] == pytest.approx(alone["mean_tpot_ms"], rel=1e-9)
    assert alone["cluster"]["congestion_share_of_step_time"] < 1e-9


# --- 4. placement --------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    ({"num_nodes": 1, "gpus_per_node": 8, "tp": 8, "pp": 2, "dp": 1},
     "cluster.num_nodes: 1 replica of 1 DP rank of TP 8 x PP 2 need 16 GPUs; 1 node of 8 have 8"),
    ({"num_nodes": 2, "gpus_per_node": 4, "tp": 2, "pp": 1, "dp": 2, "num_replicas": 3},
     "cluster.num_nodes: 3 replicas of 2 DP ranks of TP 2 x PP 1 need 12 GPUs; 2 nodes of 4 "
     "have 8"),
    ({"num_nodes": 2, "gpus_per_node": 8, "tp": 3, "pp": 1, "dp": 1},
     "parallelism.tensor_parallel_size: 3 does not divide the 8 GPUs of a node"),
    ({"num_nodes": 3, "gpus_per_node": 8, "tp": 12, "pp": 1, "dp": 1},
     "parallelism.tensor_parallel_size: 12 spans nodes of 8 GPUs unevenly"),
    ({"num_nodes": 2, "gpus_per_node": 4, "tp": 2, "pp": 1, "dp": 3, "expert_parallel": True},
     "parallelism.data_parallel_size: an expert-parallel group of 6 GPUs spreads unevenly over "
     "nodes of 4 GPUs ([2, 4])"),
    # Stage 0 of the group sits evenly on node 0 (GPUs 0, 2, 4); stage 1 does not (1, 3 | 5).
    ({"num_nodes": 2, "gpus_per_node": 5, "tp": 1, "pp": 2, "dp": 3, "expert_parallel": True},
     "parallelism.data_parallel_size: an expert-parallel group of 3 GPUs in pipeline stage 1 "
     "spreads unevenly over nodes of 5 GPUs ([1, 2])"),
])
def test_impossible_placements_are_refused_naming_the_field(kwargs, message):
    kwargs = {"expert_parallel": False, **kwargs}
    with pytest.raises(ConfigError) as err:
        place(**kwargs)
    assert str(err.value).startswith(message)


def test_placement_follows_vllms_rank_order():
    p = place(num_nodes=2, gpus_per_node=8, tp=2, pp=2, dp=3, expert_parallel=False,
              num_replicas=1)
    assert len(p.instances) == 3 and p.ep_groups == ()
    for inst in p.instances:
        for s in range(2):
            for r in range(2):
                assert inst.gpus[s][r] == inst.index * 2 * 2 + s * 2 + r
    assert p.instances[2].gpus == ((8, 9), (10, 11))
    assert p.num_gpus_used == 12
    assert [p.node_of(g) for g in p.instances[1].all_gpus] == [0, 0, 0, 0]
    assert p.nodes_spanned(p.instances[2].all_gpus) == 1
    # TP across nodes: whole nodes per TP group, in order.
    wide = place(num_nodes=4, gpus_per_node=2, tp=4, pp=2, dp=1, expert_parallel=False)
    assert wide.instances[0].gpus == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert [wide.nodes_spanned(g) for g in wide.instances[0].gpus] == [2, 2]
    # Expert parallelism: each replica's DP ranks step together.
    ep = place(num_nodes=2, gpus_per_node=4, tp=2, pp=1, dp=2, expert_parallel=True,
               num_replicas=2)
    assert ep.ep_groups == ((0, 1), (2, 3))
    assert ep.instances[3].gpus == ((6, 7),)


# --- 5. determinism -----------------------------------------------------------------------------

def test_same_seed_same_result_with_sampled_routing_and_a_tenant():
    workload = {"num_prompts": 20, "request_rate": 40,
                "dataset": {"kind": "random", "input_len": 128, "output_len": 8}}
    cfg = ep_config("auto", "flow", workload, tenant_traffic=[
        {"src_gpu": 0, "dst_gpu": 2, "rate_gbps": 100, "message_bytes": 1_000_000,
         "stop_s": 0.02}])
    first = simulate(cfg)
    second = simulate(cfg)
    assert json.dumps(first, sort_keys=True) == json.dumps(second, sort_keys=True)
    assert first["cluster"]["fabric"]["payload_bytes"] > 0
    other = simulate(cfg.model_copy(update={"seed": cfg.seed + 1}))
    assert other["cluster"]["fabric"]["payload_bytes"] != first["cluster"]["fabric"][
        "payload_bytes"]
