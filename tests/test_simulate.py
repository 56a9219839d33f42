"""`simulate(config)` end to end: the result's keys, determinism, and the engine effects configs ask for."""

import copy
import json
import math
from pathlib import Path

import numpy as np
import pytest

from simcore.config import load_config, parse_config
from simcore.errors import ConfigError
from simcore.setup import build_deployment
from simcore.simulate import scheduler_config, simulate

BASE = {
    "name": "small",
    "seed": 7,
    "model": {"name": "meta-llama/Llama-3.1-8B"},
    "hardware": {"gpu": "A100-80GB"},
    "workload": {"num_prompts": 100, "request_rate": 20,
                 "dataset": {"kind": "random", "input_len": 256, "output_len": 64}},
    # The metric semantics tested here do not depend on the CPU side; its SLOs and timeouts
    # were chosen against the declared per-step overhead.
    "host": {"model": "constant"},
}

VLLM_BENCH_KEYS = [
    "duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
    "request_throughput", "request_goodput", "output_throughput", "total_token_throughput",
    "max_output_tokens_per_s", "max_concurrent_requests", "request_rate", "burstiness",
    "max_concurrency", "num_prompts", "model_id",
]
ENGINE_KEYS = ["gpu_busy_fraction", "mean_kv_cache_usage", "total_preemptions",
               "prefix_cache_hit_rate", "mean_queue_ms"]


def config(**sections):
    """BASE with whole top-level sections replaced."""
    d = copy.deepcopy(BASE)
    d.update(copy.deepcopy(sections))
    return parse_config(d)


def run(**sections) -> dict:
    return simulate(config(**sections))


@pytest.fixture(scope="module")
def base_result() -> dict:
    return run()


def test_result_has_every_vllm_bench_serve_key(base_result):
    r = base_result
    for key in VLLM_BENCH_KEYS + ENGINE_KEYS:
        assert key in r, key
    for m in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "std", "p50", "p90", "p99"):
            key = f"{stat}_{m}_ms"
            assert isinstance(r[key], float) and math.isfinite(r[key]), key
    assert r["num_prompts"] == 100
    assert r["request_rate"] == 20.0
    assert r["burstiness"] == 1.0
    assert r["max_concurrency"] is None
    assert r["request_goodput"] is None           # no SLOs given
    assert r["model_id"] == "meta-llama/Llama-3.1-8B"
    assert r["name"] == "small"


def test_provenance_says_calibrated_by_default(base_result):
    p = base_result["provenance"]
    assert p["seed"] == 7
    assert p["compute_profile"] == "a100-80gb-aiconfigurator"
    assert p["compute_kind"] == "calibrated (auto: a kernel profile of A100-80GB is shipped)"
    assert p["calibrated"] is True
    assert p["profile_label"].startswith("calibrated profile")
    assert 0 < p["step_time_relative_uncertainty"] < 1


def test_provenance_says_uncalibrated_on_the_roofline():
    p = run(compute={"kind": "roofline"}, workload={
        "num_prompts": 4, "dataset": {"kind": "random", "input_len": 64, "output_len": 4}}
    )["provenance"]
    assert p["compute_profile"] == "roofline/A100-80GB/bf16" and p["compute_kind"] == "roofline"
    assert p["calibrated"] is False
    assert p["profile_label"] == "uncalibrated reference profile"
    # A GPU without a shipped kernel profile falls back to the roofline and says why.
    p = run(hardware={"gpu": "A40"}, workload={
        "num_prompts": 4, "dataset": {"kind": "random", "input_len": 64, "output_len": 4}}
    )["provenance"]
    assert p["compute_kind"] == "roofline (auto: no kernel profile of A40 is shipped)"


def test_result_is_consistent_with_its_requests(base_result):
    r = base_result
    rows = r["requests"]
    assert len(rows) == 100
    assert (r["completed"], r["failed"]) == (100, 0)
    assert all(row["success"] for row in rows)
    # range_ratio 0: every prompt 256 tokens, every output 64.
    assert r["total_input_tokens"] == 256 * 100
    assert r["total_output_tokens"] == 64 * 100
    end = max(row["send_s"] + row["e2el_ms"] / 1e3 for row in rows)
    assert r["duration"] == pytest.approx(end, rel=1e-12)
    assert r["request_throughput"] == pytest.approx(100 / r["duration"], rel=1e-12)
    assert r["output_throughput"] == pytest.approx(6400 / r["duration"], rel=1e-12)
    assert r["total_token_throughput"] == pytest.approx(32000 / r["duration"], rel=1e-12)
    ttft = np.array([row["ttft_ms"] for row in rows])
    tpot = np.array([row["tpot_ms"] for row in rows])
    e2el = np.array([row["e2el_ms"] for row in rows])
    assert r["mean_ttft_ms"] == pytest.approx(ttft.mean(), rel=1e-9)
    assert r["p90_ttft_ms"] == pytest.approx(np.percentile(ttft, 90), rel=1e-9)
    assert r["std_tpot_ms"] == pytest.approx(tpot.std(), rel=1e-9, abs=1e-9)
    assert r["median_e2el_ms"] == pytest.approx(np.median(e2el), rel=1e-9)
    # Every request of 64 tokens: the mean ITL over all gaps equals the mean TPOT.
    assert r["mean_itl_ms"] == pytest.approx(r["mean_tpot_ms"], rel=1e-9)
    queue = np.array([row["queue_ms"] for row in rows])
    assert r["mean_queue_ms"] == pytest.approx(queue.mean(), rel=1e-9)
    assert (queue >= 0).all()
    assert 0 < r["gpu_busy_fraction"] <= 1
    assert 0 <= r["mean_kv_cache_usage"] <= r["max_kv_cache_usage"] <= 1
    assert r["total_preemptions"] == 0
    assert r["prefix_cache_hit_rate"] == 0.0
    assert r["num_gpus"] == 1
    assert r["limits"] == {"max_num_seqs": 256, "max_num_batched_tokens": 2048,
                           "max_model_len": 131072,
                           "num_gpu_blocks": r["kv_cache"]["num_gpu_blocks"]}


def test_result_is_plain_json(base_result):
    text = json.dumps(base_result, allow_nan=False)
    assert json.loads(text) == base_result


def test_unbounded_rate_is_the_string_inf_as_in_vllm():
    r = run(workload={"num_prompts": 50, "dataset": {"kind": "random", "input_len": 64,
                                                      "output_len": 8}})
    assert r["request_rate"] == "inf"
    json.dumps(r, allow_nan=False)


def test_same_seed_same_result_different_seed_different_result(base_result):
    again = run()
    assert json.dumps(again) == json.dumps(base_result)
    other = simulate(config(seed=8))
    assert json.dumps(other) != json.dumps(base_result)
    assert other["mean_ttft_ms"] != base_result["mean_ttft_ms"]


def test_goodput_counts_requests_meeting_every_slo():
    r = run(metrics={"goodput": {"ttft": 40, "tpot": 14}, "percentiles": [50, 99.9]})
    good = sum(1 for row in r["requests"] if row["ttft_ms"] <= 40 and row["tpot_ms"] <= 14)
    assert 0 < good < 100, "pick SLOs that some requests miss"
    assert r["request_goodput"] == pytest.approx(good / r["duration"], rel=1e-12)
    assert "p99.9_ttft_ms" in r and "p50_itl_ms" in r and "p90_ttft_ms" not in r


def test_watermark_and_max_num_scheduled_tokens_reach_the_scheduler():
    cfg = config(engine={"watermark": 0.1, "max_num_scheduled_tokens": 512})
    sched = scheduler_config(cfg, build_deployment(cfg))
    assert (sched.watermark, sched.max_num_scheduled_tokens, sched.token_budget) == (0.1, 512, 512)
    assert sched.watermark_blocks == int(0.1 * sched.num_blocks)


def test_client_timeouts_fail_the_requests_not_finished_in_time():
    workload = {**BASE["workload"], "request_rate": "inf", "request_timeout_s": 2.85}
    r = run(workload=workload)
    assert r["failed"] > 0 and r["completed"] > 0 and r["completed"] + r["failed"] == 100
    done = [q for q in r["requests"] if q["success"]]
    assert r["total_output_tokens"] == sum(q["output_len"] for q in done)
    assert r["num_failed_by_error"] == {
        "client timed out after 2.85 s (workload.request_timeout_s)": r["failed"]}
    # Every latency statistic is taken over the completed requests alone.
    assert r["p99_e2el_ms"] <= 2850


def test_busy_and_saturated_fractions_stay_within_the_duration_when_every_client_gives_up():
    """The run ends with its last request, the step running then counted whole: an engine kept
    busy throughout by requests its clients gave up on was busy 1.004 of the duration."""
    workload = {"num_prompts": 400, "request_rate": 40, "request_timeout_s": 2,
                "dataset": {"kind": "random", "input_len": 512, "output_len": 512}}
    r = run(workload=workload, hardware={"gpu": "A100-80GB"},
            engine={"max_num_seqs": 128, "max_num_batched_tokens": 4096}, host={})
    assert r["completed"] == 0 and r["failed"] == 400
    rep = r["replicas"][0]
    assert rep["busy_s"] > r["duration"]           # the last step outlasts the last request
    assert r["gpu_busy_fraction"] == 1.0
    assert 0 < r["saturated_fraction"] <= 1.0
    # Shares of busy time weigh every step whole.
    assert r["communication_fraction_of_busy"] == pytest.approx(rep["comm_s"] / rep["busy_s"])


def test_a_request_the_client_gives_up_on_in_the_api_server_never_reaches_an_engine(
        monkeypatch):
    """A client timeout while the request is still on the API server's path fails it once:
    the hand-off to the engine drops it (it was re-queued and run, finishing its record a second
    time: with sessions, whose failed turn ends the session, a run then counted -1242 requests
    lost)."""
    import simcore.serve.frontend as frontend

    finished = []
    real = frontend.Frontend.finish
    monkeypatch.setattr(frontend.Frontend, "finish",
                        lambda self, idx: (finished.append(idx), real(self, idx)))
    chat = load_config(Path(__file__).resolve().parents[1] / "examples/multi_turn_chat.yaml")
    r = simulate(chat.model_copy(update={"workload": chat.workload.model_copy(
        update={"request_timeout_s": 1e-9})}))
    assert r["completed"] == 0 and r["failed"] == len(r["requests"]) == 200
    assert sorted(finished) == list(range(200))      # each turn's record finished once
    assert all(row["error"].startswith("client timed out") for row in r["requests"])


def test_a_small_kv_pool_under_load_preempts():
    workload = {"num_prompts": 100, "dataset": {"kind": "random", "input_len": 512,
                                                 "output_len": 128}}
    model = {"name": "meta-llama/Llama-3.1-8B", "max_model_len": 4096}
    small = run(model=model, workload=workload, engine={"num_gpu_blocks_override": 300})
    assert small["kv_cache"]["num_gpu_blocks"] == 300
    assert small["kv_cache"]["memory_breakdown_bytes"] is None
    assert small["completed"] == 100
    assert small["total_preemptions"] > 0
    assert small["num_preempted_requests"] > 0
    assert small["max_kv_cache_usage"] > 0.9
    big = run(model=model, workload=workload)
    assert big["total_preemptions"] == 0
    assert small["mean_ttft_ms"] > big["mean_ttft_ms"]


@pytest.mark.parametrize("engine", [{"preemption_mode": "least_work_done"},
                                    {"persistent_batch": True},
                                    {"persistent_batch": True,
                                     "preemption_mode": "least_work_done"}])
def test_policy_options_run_to_completion(engine):
    workload = {"num_prompts": 60, "request_rate": 50,
                "dataset": {"kind": "random", "input_len": 512, "output_len": 128,
                            "range_ratio": 0.5}}
    model = {"name": "meta-llama/Llama-3.1-8B", "max_model_len": 2048}
    r = run(model=model, workload=workload, engine={"num_gpu_blocks_override": 200, **engine})
    assert (r["completed"], r["failed"]) == (60, 0)
    assert all(row["success"] for row in r["requests"])
    default = run(model=model, workload=workload, engine={"num_gpu_blocks_override": 200})
    assert list(r["requests"]) != list(default["requests"]), \
        "the option should change some decision under KV pressure"


def _priority_run(tmp_path, policy, priorities):
    """One sequence at a time, every request sent at once: the order the engine serves a custom
    file's lines in (their request ids by time to first token)."""
    lines = [{"prompt_len": 64, "output_len": 4, **({} if p is None else {"priority": p})}
             for p in priorities]
    (tmp_path / "prio.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    d = copy.deepcopy(BASE)
    d.update(engine={"max_num_seqs": 1, "scheduling_policy": policy},
             workload={"num_prompts": len(lines), "request_rate": "inf",
                       "dataset": {"kind": "custom", "path": "prio.jsonl", "shuffle": False}})
    r = simulate(parse_config(d, base_dir=tmp_path))
    return [row["request_id"] for row in sorted(r["requests"], key=lambda row: row["ttft_ms"])]


def test_a_custom_files_priorities_order_service_under_the_priority_policy(tmp_path):
    priorities = [3, 1, 2, 0, -1]
    assert _priority_run(tmp_path, "fcfs", [None] * 5) == ["r0", "r1", "r2", "r3", "r4"]
    # vLLM: the lowest value first (ties by arrival).
    assert _priority_run(tmp_path, "priority", priorities) == ["r4", "r3", "r1", "r2", "r0"]


@pytest.mark.parametrize("priorities", [[None, None, None], [0, 0, 0]])
def test_the_priority_policy_over_requests_of_priority_0_is_refused(tmp_path, priorities):
    with pytest.raises(ConfigError, match=r"^engine\.scheduling_policy: priority has no effect"):
        _priority_run(tmp_path, "priority", priorities)


def test_one_priority_other_than_0_shared_by_all_runs_under_the_priority_policy(tmp_path):
    # vLLM accepts such requests only under the priority policy, which then serves them in
    # arrival order: one policy of the two runs them.
    assert _priority_run(tmp_path, "priority", [2, 2, 2]) == ["r0", "r1", "r2"]


def test_priorities_under_fcfs_are_refused_as_vllm_refuses_them(tmp_path):
    # vLLM: "Got priority ... but Priority scheduling is not enabled" for any priority but 0.
    for priorities in ([3, 1, 2], [5, 5, 5]):
        with pytest.raises(ConfigError, match=r"^engine\.scheduling_policy: the workload's "
                                              r"requests carry priorities"):
            _priority_run(tmp_path, "fcfs", priorities)
    assert _priority_run(tmp_path, "fcfs", [0, 0, 0]) == ["r0", "r1", "r2"]


def test_the_priority_policy_is_refused_for_datasets_without_priorities():
    with pytest.raises(ConfigError, match=r"^engine\.scheduling_policy: priority has no effect"):
        run(engine={"scheduling_policy": "priority"})


def test_prefix_repetition_hits_the_prefix_cache():
    # 5 prefixes of 256 tokens (16 full blocks), 64-token unique suffixes. The first request of
    # each prefix misses; the other 95 find the 256 prefix tokens cached: 95 * 256 / (100 * 320).
    workload = {"num_prompts": 100, "request_rate": 20,
                "dataset": {"kind": "prefix_repetition", "prefix_len": 256, "suffix_len": 64,
                            "num_prefixes": 5, "output_len": 32}}
    r = run(workload=workload)
    assert r["prefix_cache_hit_rate"] == pytest.approx(95 * 256 / 32000, rel=1e-12)
    assert sorted({row["num_cached_prompt_tokens"] for row in r["requests"]}) == [0, 256]
    off = run(workload=workload, engine={"enable_prefix_caching": False})
    assert off["prefix_cache_hit_rate"] == 0.0
    assert off["mean_ttft_ms"] > r["mean_ttft_ms"]


def test_tensor_parallelism_changes_step_times():
    h100 = {"gpu": "H100-SXM"}
    tp1 = run(hardware=h100, parallelism={"tensor_parallel_size": 1})
    tp2 = run(hardware=h100, parallelism={"tensor_parallel_size": 2})
    assert (tp1["num_gpus"], tp2["num_gpus"]) == (1, 2)
    assert tp1["replicas"][0]["comm_s"] == 0.0
    assert tp2["replicas"][0]["comm_s"] > 0.0
    assert tp2["mean_tpot_ms"] < tp1["mean_tpot_ms"]
    assert tp2["mean_ttft_ms"] < tp1["mean_ttft_ms"]
    assert tp2["kv_cache"]["num_gpu_blocks"] > tp1["kv_cache"]["num_gpu_blocks"]
    # Same workload either way.
    assert [row["prompt_len"] for row in tp1["requests"]] == \
        [row["prompt_len"] for row in tp2["requests"]]


def test_ramp_up_is_reported_as_vllm_does():
    # vLLM's `vllm bench serve` adds ramp_up_strategy, ramp_up_start_rps and ramp_up_end_rps to
    # its result JSON whenever a ramp-up is used (benchmarks/serve.py, "# Traffic").
    r = run(workload={"num_prompts": 30, "ramp_up_strategy": "linear", "ramp_up_start_rps": 1,
                      "ramp_up_end_rps": 20,
                      "dataset": {"kind": "random", "input_len": 64, "output_len": 8}})
    assert r["request_rate"] == "inf"
    missing = [k for k in ("ramp_up_strategy", "ramp_up_start_rps", "ramp_up_end_rps")
               if k not in r]
    assert not missing, (f"simulate() leaves out vLLM's ramp-up keys {missing}; "
                         "simcore/simulate.py assemble_result should add them")
    assert (r["ramp_up_strategy"], r["ramp_up_start_rps"], r["ramp_up_end_rps"]) == \
        ("linear", 1.0, 20.0)


def test_kv_bytes_per_token_follow_tensor_parallelism():
    # Llama-3.1-8B: 32 layers x 2 (K, V) x 8 KV heads x 128 x 2 bytes = 131072 bytes per token;
    # TP 2 halves the KV heads per GPU.
    small = {"num_prompts": 5, "dataset": {"kind": "random", "input_len": 32, "output_len": 4}}
    tp1 = run(workload=small)
    tp2 = run(workload=small, parallelism={"tensor_parallel_size": 2})
    assert tp1["kv_cache"]["kv_bytes_per_token_per_gpu"] == 131072
    assert tp2["kv_cache"]["kv_bytes_per_token_per_gpu"] == 65536
    for r in (tp1, tp2):
        kv = r["kv_cache"]
        assert kv["num_kv_tokens"] == (kv["num_gpu_blocks"] - 1) * 16
        assert kv["memory_breakdown_bytes"]["bytes_per_block"] == \
            16 * kv["kv_bytes_per_token_per_gpu"]


def test_higher_request_rate_increases_ttft():
    ds = {"kind": "random", "input_len": 512, "output_len": 64}
    slow = run(workload={"num_prompts": 100, "request_rate": 2, "dataset": ds})
    fast = run(workload={"num_prompts": 100, "request_rate": 200, "dataset": ds})
    burst = run(workload={"num_prompts": 100, "dataset": ds})
    assert slow["mean_ttft_ms"] < fast["mean_ttft_ms"] < burst["mean_ttft_ms"]
    assert slow["duration"] > fast["duration"]


def test_data_parallel_replicas_share_the_load():
    r = run(parallelism={"data_parallel_size": 2}, router={"policy": "least_outstanding"})
    assert r["num_gpus"] == 2
    assert [x["replica"] for x in r["replicas"]] == [0, 1]
    per_replica = [sum(1 for row in r["requests"] if row["replica"] == i) for i in (0, 1)]
    assert sum(per_replica) == 100 and min(per_replica) >= 30
    busy = sum(x["busy_s"] for x in r["replicas"])
    assert r["gpu_busy_fraction"] == pytest.approx(busy / (2 * r["duration"]), rel=1e-12)
    assert [x["busy_fraction"] for x in r["replicas"]] == \
        [pytest.approx(x["busy_s"] / r["duration"], rel=1e-12) for x in r["replicas"]]
    assert 0 < r["gpu_busy_fraction"] <= 1
    assert r["completed"] == 100


def test_max_concurrency_is_reported_with_client_queue_time():
    r = run(workload={"num_prompts": 50, "max_concurrency": 4,
                      "dataset": {"kind": "random", "input_len": 128, "output_len": 16}})
    assert r["max_concurrency"] == 4
    assert r["mean_client_queue_time_ms"] > 0
    # At every send no more than 4 requests are in flight (a request sent when another ends
    # takes its place; the 1e-9 s absorbs the rounding of e2el_ms).
    spans = [(row["send_s"], row["send_s"] + row["e2el_ms"] / 1e3) for row in r["requests"]]
    in_flight = [sum(1 for a, b in spans if a <= t < b - 1e-9) for t, _ in spans]
    assert max(in_flight) == 4


def test_requests_too_long_for_the_model_are_failed_not_dropped():
    r = run(model={"name": "meta-llama/Llama-3.1-8B", "max_model_len": 300},
            workload={"num_prompts": 40, "request_rate": 20,
                      "dataset": {"kind": "random", "input_len": 256, "output_len": 64,
                                  "range_ratio": 0.5}})
    too_long = [row for row in r["requests"] if row["prompt_len"] + row["output_len"] > 300]
    assert too_long, "the workload should hold some over-long requests"
    assert r["failed"] == len(too_long) == r["num_failed"]
    assert r["completed"] == 40 - len(too_long)
    assert all(not row["success"] and "max_model_len (300)" in row["error"] for row in too_long)
    json.dumps(r, allow_nan=False)


@pytest.mark.parametrize("enabled", [True, False])
def test_a_run_pauses_the_cyclic_collector_and_restores_it(enabled, monkeypatch):
    """The collector is off while a run steps (it finds nothing there) and as it was after,
    when the run ends and when it fails."""
    import gc

    import simcore.simulate as sim

    seen = []
    real = sim.run_serving

    def spy(*args, **kwargs):
        seen.append(gc.isenabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(sim, "run_serving", spy)
    (gc.enable if enabled else gc.disable)()
    try:
        run(workload={"num_prompts": 5, "request_rate": 20,
                      "dataset": {"kind": "random", "input_len": 64, "output_len": 8}})
        assert seen == [False] and gc.isenabled() is enabled

        def broken(*args, **kwargs):
            raise RuntimeError("boom")

        monkeypatch.setattr(sim, "run_serving", broken)
        with pytest.raises(RuntimeError, match="boom"):
            run()
        assert gc.isenabled() is enabled
    finally:
        gc.enable()
