"""Every shipped example simulates to completion and its result carries the documented keys."""

import json
from pathlib import Path

import pytest

from simcore.config import load_config
from simcore.simulate import simulate

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
    assert r["provenance"]["calibrated"] is False
    assert r["provenance"]["profile_label"] == "uncalibrated reference profile"
    json.dumps(r, allow_nan=False)
