"""Every shipped example simulates to completion and its result carries the documented keys."""

import json
import math
from pathlib import Path

import pytest

from simcore.config import load_config
from simcore.simulate import simulate

pytestmark = pytest.mark.slow  # runs every shipped example

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.yaml"))
VLLM_KEYS = ["duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
             "request_throughput", "request_goodput", "output_throughput",
             "total_token_throughput", "max_output_tokens_per_s", "max_concurrent_requests",
             "request_rate", "burstiness", "max_concurrency", "num_prompts", "model_id"]
ENGINE_KEYS = ["gpu_busy_fraction", "mean_kv_cache_usage", "total_preemptions",
               "prefix_cache_hit_rate", "mean_queue_ms", "num_gpus", "output_throughput_per_gpu"]


def test_examples_are_shipped():
    assert {p.name for p in EXAMPLES} >= {"quickstart.yaml"}
    assert len(EXAMPLES) >= 5


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_runs_and_has_the_keys(path):
    cfg = load_config(path)
    r = simulate(cfg)
    for k in VLLM_KEYS + ENGINE_KEYS:
        assert k in r, k
    for m in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "std"):
            assert f"{stat}_{m}_ms" in r
        for p in cfg.metrics.percentiles:
            assert f"p{int(p) if int(p) == p else p}_{m}_ms" in r
    assert r["completed"] + r["failed"] == len(r["requests"]) > 0
    assert r["completed"] > 0
    calibrated = cfg.compute.resolved_kind(cfg.hardware.resolve().name) == "calibrated"
    assert r["provenance"]["calibrated"] is calibrated
    assert r["provenance"]["profile_label"].startswith(
        "calibrated profile (" if calibrated else "uncalibrated reference profile")
    json.dumps(r, allow_nan=False)


CLUSTER_DIR = Path(__file__).resolve().parents[1] / "examples/cluster"
CLUSTER_EXAMPLES = sorted(CLUSTER_DIR.glob("*.yaml"))
EIGHT_NODE_EXAMPLES = [CLUSTER_DIR / "dense_pp_8node.yaml", CLUSTER_DIR / "moe_ep_8node.yaml"]
CLUSTER_KEYS = ["network_share_of_step_time", "fabric_share_of_step_time",
                "congestion_share_of_step_time", "network_share_of_request_latency",
                "exposed_gpu_s", "fabric"]
FABRIC_KEYS = ["slowdown_by_size", "ecn_marks", "cnps", "dcqcn_rate_cuts", "pfc_pause_frames",
               "pfc_paused_s", "drops", "retransmits", "max_queue_bytes",
               "link_utilization_mean", "busiest_link"]


def small_on_analytical(path: Path, num_prompts: int = 4):
    """A cluster example with a handful of requests on the analytical fabric: the shipped runs
    take seconds to minutes (benchmarks/cluster_speed.py times the 8-node ones)."""
    cfg = load_config(path)
    fabric = cfg.cluster.fabric.model_copy(update={"backend": "analytical"})
    return cfg.model_copy(update={
        "workload": cfg.workload.model_copy(update={"num_prompts": num_prompts}),
        "cluster": cfg.cluster.model_copy(update={"fabric": fabric})})


def test_cluster_examples_are_shipped():
    assert set(EIGHT_NODE_EXAMPLES) <= set(CLUSTER_EXAMPLES)


@pytest.mark.parametrize("path", CLUSTER_EXAMPLES, ids=lambda p: p.stem)
def test_cluster_example_runs_small_and_reports_the_cluster(path):
    cfg = small_on_analytical(path)
    r = simulate(cfg)
    assert r["completed"] > 0 and r["completed"] + r["failed"] == len(r["requests"])
    c = r["cluster"]
    for k in CLUSTER_KEYS:
        assert k in c, k
    for k in FABRIC_KEYS:
        assert k in c["fabric"], k
    assert c["backend"] == "analytical"
    assert c["fabric"]["drops"] == 0
    if path in EIGHT_NODE_EXAMPLES:      # their steps cross the fabric
        assert c["fabric"]["num_step_messages"] > 0
        assert 0 < c["network_share_of_request_latency"] < 1
    json.dumps(r, allow_nan=False)


@pytest.mark.parametrize("path", EIGHT_NODE_EXAMPLES, ids=lambda p: p.stem)
def test_eight_node_example_is_the_motivating_experiment(path):
    """8 nodes at 400 Gb/s on a 2-tier Clos, 64 GPUs, RoCEv2 with ECN, DCQCN and PFC on the
    packet fabric, 1,000 requests."""
    cfg = load_config(path)
    c = cfg.cluster
    assert c.num_nodes == 8 and c.fabric.backend == "packet"
    s = c.fabric.settings
    assert s.profile == "roce" and s.ecn.enabled and s.dcqcn.enabled and s.pfc.enabled
    assert c.network.nic_gbps == 400 and c.network.topology.kind == "leaf_spine"
    par = cfg.parallelism
    assert (par.tensor_parallel_size * par.pipeline_parallel_size * par.data_parallel_size
            * par.num_replicas) == 64
    assert cfg.workload.num_prompts == 1000


SIXTY_FOUR_NODE_EXAMPLES = [CLUSTER_DIR / "dense_pp_64node.yaml",
                            CLUSTER_DIR / "moe_ep_64node.yaml"]


@pytest.mark.parametrize("path", SIXTY_FOUR_NODE_EXAMPLES, ids=lambda p: p.stem)
def test_sixty_four_node_examples_load_every_node(path):
    """512 GPUs on 64 nodes, 1,024 requests: at least one per engine, and the router gives an
    idle engine the next request, so every engine (hence every node) works. Checked on the
    analytical fabric with one short request per engine, all sent at once."""
    cfg = load_config(path)
    par = cfg.parallelism
    engines = 512 // (par.tensor_parallel_size * par.pipeline_parallel_size)
    assert cfg.cluster.num_nodes == 64 and cfg.workload.num_prompts == 1024 >= engines
    assert (par.tensor_parallel_size * par.pipeline_parallel_size * par.data_parallel_size
            * par.num_replicas) == 512
    small = small_on_analytical(path, num_prompts=engines)
    dataset = small.workload.dataset.model_copy(update={"input_len": 64, "output_len": 2})
    small = small.model_copy(update={"workload": small.workload.model_copy(update={
        "request_rate": math.inf, "dataset": dataset})})
    r = simulate(small)
    assert r["completed"] == engines
    assert r["cluster"]["gpus_used"] == 512
    assert len(r["replicas"]) == engines
    assert all(x["num_steps"] > 0 and x["num_prefill_tokens"] > 0 for x in r["replicas"])
    assert r["cluster"]["fabric"]["num_step_messages"] > 0
