"""Bottleneck attribution and its explanation: real runs each factor must win; scores by hand."""

import copy
import re
import subprocess
import sys
import time
from functools import cache

import pytest

from dse.explain import assumptions, explain, pct
from dse.summary import render_summary
from simcore.attribution import FACTOR_KEYS, HBM_DECODE_LABEL, attribute, signals
from simcore.result import ResultError
from simcore.config import parse_config
from simcore.simulate import simulate

BASE = {
    "name": "explain",
    "seed": 3,
    "model": {"name": "meta-llama/Llama-3.1-8B"},
    "hardware": {"gpu": "A100-80GB"},
    # The roofline: the scenarios below are built around its bottlenecks.
    "compute": {"kind": "roofline"},
    "workload": {"num_prompts": 100, "request_rate": 20,
                 "dataset": {"kind": "random", "input_len": 256, "output_len": 64}},
}


def _workload(n: int, rate: float, isl: int, osl: int) -> dict:
    return {"num_prompts": n, "request_rate": rate,
            "dataset": {"kind": "random", "input_len": isl, "output_len": osl}}


SCENARIOS = {
    # Steady load well inside capacity: decode steps read the weights, memory-bound.
    "steady": {},
    # 48 blocks of 16 tokens hold two 320-token requests: the rest wait for KV blocks.
    "tiny_kv": {"model": {"name": "meta-llama/Llama-3.1-8B", "max_model_len": 512},
                "engine": {"num_gpu_blocks_override": 48}},
    # Admission without reserving the whole sequence, growing outputs: preemptions.
    "preempting": {"model": {"name": "meta-llama/Llama-3.1-8B", "max_model_len": 2048},
                   "engine": {"num_gpu_blocks_override": 200,
                              "scheduler_reserve_full_isl": False},
                   "workload": _workload(60, 20, 256, 512)},
    "max_seqs_2": {"engine": {"max_num_seqs": 2}, "workload": _workload(60, 10, 256, 64)},
    "tiny_budget": {"engine": {"max_num_batched_tokens": 32, "max_num_seqs": 32},
                    "workload": _workload(60, 10, 512, 32)},
    "trickle": {"workload": _workload(20, 0.2, 256, 64)},
    # An 8B model over TP 8: every step pays 65 all-reduces for little compute per GPU.
    "tp8": {"hardware": {"gpu": "H100-SXM"}, "parallelism": {"tensor_parallel_size": 8},
            "workload": _workload(60, 20, 4000, 32)},
    "tp8_long_prompts": {"hardware": {"gpu": "H100-SXM"},
                         "parallelism": {"tensor_parallel_size": 8},
                         "workload": _workload(60, 30, 8000, 8)},
    # Engine queueing: the API server's path is taken as free, so the engine is what waits.
    "flood": {"workload": _workload(200, 2000, 512, 64),
              "host": {"request_overhead_s": 0.0, "api_server_per_request_s": 0.0}},
    # 200 requests at once through one API server process on a host CPU 20x slower than the
    # one vLLM's costs were measured on, with 50 ms of unmeasured work a request: about 70 ms of
    # work a request, below what the engine serves (the model runner's and the streaming's
    # fitted terms, which that host speed would make 50x the fit's, given as none).
    "flood_api": {"workload": _workload(200, "inf", 512, 64),
                  "host": {"host_speed": 20.0, "request_overhead_s": 0.0,
                           "api_server_per_request_s": 0.05, "model_runner_step_s": 0.0,
                           "model_runner_per_seq_s": 0.0, "api_server_per_token_s": 0.0}},
}


@cache
def result(name: str) -> dict:
    d = copy.deepcopy(BASE)
    d.update(copy.deepcopy(SCENARIOS[name]))
    return simulate(parse_config(d))


def text(e: dict) -> str:
    return " ".join(e["sentences"])


# --- real runs: each factor wins where it should, and the sentences carry its numbers ---------

def test_steady_load_is_bound_by_hbm_bandwidth_in_decode():
    r = result("steady")
    e = explain(r)
    s = attribute(r).signals
    assert e["bottleneck"] == "decode_compute"
    assert e["label"] == HBM_DECODE_LABEL
    assert text(e).startswith("Decode is bound by HBM bandwidth")
    assert f"a step {pct(r['gpu_busy_fraction'])} of the time" in text(e)
    assert f"{pct(s['memory_bound_step_fraction'])} of steps are memory-bound" in text(e)
    assert f"{pct(s['queue_fraction_of_ttft'])} of TTFT is queueing" in text(e)
    peak = max(rep["max_num_running"] for rep in r["replicas"])
    assert f"peak {peak} of max_num_seqs {r['limits']['max_num_seqs']}" in text(e)
    assert "fp8 weights" in text(e)
    assert len(e["sentences"]) == 2


@pytest.mark.parametrize("dtype", ["fp8", "mxfp4"])
def test_an_hbm_bound_decode_in_8_bit_or_narrower_weights_is_not_told_to_use_fp8(dtype):
    """The advice read the weight dtype off the profile's id, which a kernel profile's id does
    not end in: fp8 runs were told fp8 weights would shorten their steps."""
    r = copy.deepcopy(result("steady"))
    r["provenance"]["weight_dtype"] = dtype
    t = text(explain(r))
    assert "fp8 weights" not in t and "more GPUs (TP) would shorten its steps" in t


def test_tiny_kv_pool_is_limited_by_kv_capacity():
    r = result("tiny_kv")
    e = explain(r)
    assert e["bottleneck"] == "kv_cache_capacity"
    rep = r["replicas"][0]
    blocked = rep["num_steps_waiting_for_kv_blocks"] / rep["num_steps"]
    assert blocked > 0.9
    assert f"waited for KV blocks in {pct(blocked)} of steps" in text(e)
    assert "of its 48 blocks" in text(e)
    assert f"peaked at {pct(r['max_kv_cache_usage'])}" in text(e)


def test_preemptions_count_against_kv_capacity():
    r = result("preempting")
    e = explain(r)
    assert r["total_preemptions"] > 0
    assert e["bottleneck"] == "kv_cache_capacity"
    frac = r["num_preempted_requests"] / r["num_requests"]
    assert f"{r['total_preemptions']} preemptions hit {pct(frac)} of requests" in text(e)
    assert e["factors"][0]["score"] >= frac


def test_max_num_seqs_two_under_load_is_a_scheduler_limit():
    r = result("max_seqs_2")
    e = explain(r)
    assert e["bottleneck"] == "scheduler_max_num_seqs"
    rep = r["replicas"][0]
    frac = rep["num_steps_waiting_at_max_num_seqs"] / rep["num_steps"]
    assert "max_num_seqs (2)" in text(e)
    assert f"waiting in {pct(frac)} of steps" in text(e)
    assert "raising max_num_seqs would let more requests run" in text(e)
    # The queue is the consequence, not a factor of its own.
    assert attribute(r).factor("queueing").score < 0.1


def test_tiny_token_budget_is_a_scheduler_limit():
    r = result("tiny_budget")
    e = explain(r)
    assert e["bottleneck"] == "scheduler_token_budget"
    assert "max_num_batched_tokens 32" in text(e)
    rep = r["replicas"][0]
    full = rep["num_steps_waiting_at_token_budget"] / rep["num_steps"]
    assert f"used up with requests waiting in {pct(full)} of steps" in text(e)


def test_trickle_of_requests_is_underloaded():
    r = result("trickle")
    e = explain(r)
    assert e["bottleneck"] == "underloaded"
    assert r["gpu_busy_fraction"] < 0.3
    assert f"idle {pct(1 - r['gpu_busy_fraction'])} of the time" in text(e)
    assert "headroom" in text(e)


def test_tp8_on_a_small_model_is_limited_by_communication():
    r = result("tp8")
    e = explain(r)
    assert e["bottleneck"] == "communication"
    assert f"takes {pct(r['communication_fraction_of_busy'])} of busy time" in text(e)
    assert "across 8 GPUs per replica" in text(e)


def test_tp8_with_long_prompts_shows_communication():
    a = attribute(result("tp8_long_prompts"))
    ranked = [f.key for f in a.factors]
    assert "communication" in ranked[:3]
    assert a.factor("communication").score > 0.3


def test_flood_of_arrivals_is_queueing_and_names_the_capacity_limit():
    r = result("flood")
    e = explain(r)
    assert e["bottleneck"] == "queueing"
    q = r["mean_queue_ms"] / r["mean_ttft_ms"]
    assert q > 0.8
    assert "arrivals outpace service (200 requests arrived over" in text(e)
    assert f"{pct(q)} of TTFT is spent waiting" in text(e)
    runner_up = e["factors"][1]
    assert f"Service capacity is set by {runner_up['label']}" in text(e)
    assert runner_up["key"] == "prefill_compute"


def test_a_burst_through_one_api_server_process_is_blamed_on_the_api_server():
    r = result("flood_api")
    e = explain(r)
    assert e["bottleneck"] == "api_server"
    # 200 prompts tokenized one after another on the process's tokenizer thread, then sharing
    # its event loop.
    from simcore.host import HostConfig, HostOverheads
    from tests.test_host import _fifo_then_shared

    h = HostOverheads(HostConfig(**SCENARIOS["flood_api"]["host"]))
    tok_ms, loop_ms = 1e3 * h.tokenize_s(512), 1e3 * h.request_cpu_s(512)
    cpu_ms = tok_ms + loop_ms
    assert 20 < cpu_ms < 150
    ends = _fifo_then_shared([0.0] * 200, [tok_ms] * 200, [loop_ms] * 200)
    assert r["mean_api_server_ms"] == pytest.approx(sum(ends) / 200, rel=1e-9)
    assert r["mean_api_server_wait_ms"] == pytest.approx(sum(ends) / 200 - cpu_ms, rel=1e-9)
    share = r["mean_api_server_wait_ms"] / r["mean_ttft_ms"]
    assert share > 0.7          # the rest: the engine's prefill of the burst, all at once
    assert f"The API server limits TTFT: {pct(share)} of it" in text(e)
    assert f"{cpu_ms:.0f} ms of work each" in text(e)
    assert "--api-server-count" in text(e)
    # Four processes cut the path's share of TTFT: the intervention the sentence names.
    d = copy.deepcopy(BASE)
    d.update(copy.deepcopy(SCENARIOS["flood_api"]))
    d["host"]["api_server_count"] = 4
    four = simulate(parse_config(d))
    assert four["mean_api_server_ms"] < r["mean_api_server_ms"] / 3
    assert four["mean_ttft_ms"] < r["mean_ttft_ms"]


def flat(out: str) -> str:
    """Printed text with its line wrapping undone."""
    return " ".join(out.split())


def test_light_load_runs_continuously_at_low_batch_and_is_not_called_saturated():
    # A step is running nearly all the time (busy 1.00), but with a small batch and an almost
    # empty KV cache: the summary must not read as an engine at its limit.
    r = result("steady")
    s = attribute(r).signals
    assert r["gpu_busy_fraction"] > 0.95
    assert r["saturated_fraction"] == 0.0 and r["max_kv_cache_usage"] < 0.05
    assert r["batch_fill_fraction"] < 0.1 and s["engine_load"] == "low_batch"
    t = text(explain(r))
    assert re.search(r"running continuously \(a step (99|100)% of the time\) at low batch", t)
    assert f"mean {r['mean_batch_seqs']:.0f}, peak" in t and "not saturated" in t
    assert "could take more traffic" in t
    out = flat(render_summary(r))
    assert re.search(r"Engine load: running continuously \(a step (99|100)% of the time\) at low "
                     r"batch", out)
    assert "saturated:" not in out


@pytest.mark.parametrize("name", ["tiny_kv", "max_seqs_2", "tiny_budget", "flood"])
def test_an_engine_at_a_limit_is_called_saturated(name):
    r = result(name)
    assert r["saturated_fraction"] > 0.5
    assert attribute(r).signals["engine_load"] == "saturated"
    assert "Engine load: saturated: requests waited at an engine limit in" in flat(
        render_summary(r))


def test_a_trickle_is_idle_not_continuous():
    r = result("trickle")
    assert attribute(r).signals["engine_load"] == "idle"
    assert f"Engine load: idle {pct(1 - r['gpu_busy_fraction'])} of the time" in flat(
        render_summary(r))


def test_batch_fill_is_the_step_time_weighted_batch_over_the_limits():
    r = result("max_seqs_2")
    reps = r["replicas"]
    assert r["mean_batch_seqs"] == pytest.approx(
        sum(rep["mean_batch_seqs"] * rep["busy_s"] for rep in reps)
        / sum(rep["busy_s"] for rep in reps))
    assert 1.9 < r["mean_batch_seqs"] <= 2.0          # two sequences whenever a step runs
    assert r["batch_fill_fraction"] == pytest.approx(r["mean_batch_seqs"] / 2)
    steps = sum(rep["num_steps"] for rep in reps)
    tokens = sum(rep["num_prefill_tokens"] + rep["num_decode_tokens"] for rep in reps)
    assert r["mean_batch_tokens"] == pytest.approx(tokens / steps)
    assert r["token_budget_fill_fraction"] == pytest.approx(
        r["mean_batch_tokens"] / r["limits"]["max_num_batched_tokens"])
    waited = sum(rep["busy_s_waiting_at_max_num_seqs"] + rep["busy_s_waiting_at_token_budget"]
                 + rep["busy_s_waiting_for_kv_blocks"] for rep in reps)
    assert r["saturated_fraction"] == pytest.approx(waited / (r["duration"] * len(reps)))


def test_every_factor_is_scored_once_in_range_and_ranked():
    for name in SCENARIOS:
        factors = explain(result(name))["factors"]
        assert sorted(f["key"] for f in factors) == sorted(FACTOR_KEYS)
        scores = [f["score"] for f in factors]
        assert all(0.0 <= x <= 1.0 for x in scores), name
        assert scores == sorted(scores, reverse=True), name


def test_explanation_is_deterministic():
    r = result("steady")
    assert explain(r) == explain(copy.deepcopy(r))


def test_explain_is_fast():
    r = result("flood")
    t0 = time.perf_counter()
    for _ in range(20):
        explain(r)
    assert (time.perf_counter() - t0) / 20 < 0.05


def test_simulate_summary_prints_explanation_and_assumptions():
    out = render_summary(result("max_seqs_2"))
    assert "Explanation" in out and "Assumptions" in out
    assert out.index("Explanation") < out.index("Assumptions") < out.index("Provenance")
    assert "max_num_seqs (2)" in out
    assert "- uncalibrated reference profile (+/-35%)" in out


@pytest.mark.slow
def test_explain_imports_no_heavy_library():
    code = ("import sys, dse.explain; "
            "heavy = [m for m in ('ray', 'optuna', 'plotly', 'simpy') if m in sys.modules]; "
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True)


# --- hand-made results: the scoring formulas --------------------------------------------------

def replica(**kw) -> dict:
    """One replica's complete counters: busy 10 of 10 s, 2 s of it prefill steps."""
    rep = {"replica": 0, "num_steps": 100, "busy_s": 10.0, "busy_fraction": 1.0,
           "mean_batch_seqs": 10.0, "compute_s": 9.0, "comm_s": 0.0,
           "num_prefill_tokens": 1000, "num_decode_tokens": 1000, "num_preemptions": 0,
           "steps_by_bound": {"memory": 80, "compute": 20}, "max_num_running": 10,
           "max_num_waiting": 0, "num_steps_waiting_at_max_num_seqs": 0,
           "num_steps_waiting_at_token_budget": 0, "num_steps_waiting_for_kv_blocks": 0,
           "num_steps_waiting_at_token_budget_compute_bound": 0,
           "busy_s_waiting_at_max_num_seqs": 0.0, "busy_s_waiting_at_token_budget": 0.0,
           "busy_s_waiting_for_kv_blocks": 0.0,
           "step_s_by_phase_bound": {"prefill/compute": 2.0, "decode/memory": 8.0},
           "prefix_cache_evictions": 0}
    rep.update(kw)
    return rep


def made(**kw) -> dict:
    """A complete hand-made result: one replica busy 10 of 10 s, no requests."""
    r = {"name": "made", "completed": 10, "failed": 0, "num_failed_by_error": {},
         "num_requests": 10, "duration": 10.0,
         "gpu_busy_fraction": 1.0, "mean_ttft_ms": 100.0, "mean_tpot_ms": 10.0,
         "mean_queue_ms": 0.0, "mean_api_server_ms": 0.0, "mean_api_server_wait_ms": 0.0,
         "mean_e2el_ms": 1000.0, "total_preemptions": 0, "num_preempted_requests": 0,
         "prefix_cache_hit_rate": 0.0, "num_gpus": 1, "mean_batch_seqs": 10.0,
         "batch_fill_fraction": 10 / 256, "token_budget_fill_fraction": 0.01,
         "max_kv_cache_usage": 0.5, "kv_cache": {},
         "limits": {"max_num_seqs": 256, "max_num_batched_tokens": 8192,
                    "max_model_len": 8192, "num_gpu_blocks": 1000},
         "replicas": [replica()],
         "timeseries": {"t_s": [], "kv_cache_usage": [], "num_running": [], "num_waiting": []},
         "requests": [],
         "provenance": {"calibrated": False, "step_time_relative_uncertainty": 0.35,
                        "compute_profile": "roofline/H100-SXM/bf16",
                        "assumptions": ["step times from the roofline/H100-SXM/bf16 roofline "
                                        "(uncalibrated reference profile, +/-35%)",
                                        "vLLM V1 scheduler in sync mode"]}}
    r.update(kw)
    return r


def score(r: dict, key: str) -> float:
    return attribute(r).factor(key).score


def test_compute_split_by_prefill_and_decode_step_time():
    a = attribute(made())
    # b = 1, c = 0.9, p = 2 s of prefill steps / 10 s.
    assert a.factor("prefill_compute").score == pytest.approx(0.9 * 0.2)
    assert a.factor("decode_compute").score == pytest.approx(0.9 * 0.8)
    assert a.factor("decode_compute").label == HBM_DECODE_LABEL
    assert a.top.key == "decode_compute"


def test_compute_bound_prefill_leads():
    rep = replica(step_s_by_phase_bound={"prefill/compute": 6.0, "decode/memory": 3.0,
                                         "decode/compute": 1.0})
    a = attribute(made(replicas=[rep]))
    assert a.signals["prefill_fraction_of_busy"] == pytest.approx(0.6)
    assert a.signals["prefill_compute_bound_share"] == pytest.approx(1.0)
    assert a.top.key == "prefill_compute"
    assert a.top.score == pytest.approx(0.9 * 0.6)
    assert "already compute-bound" in text(explain(made(replicas=[rep])))


def test_a_result_missing_a_section_is_refused_by_name():
    thin = made()
    del thin["limits"]
    with pytest.raises(ResultError, match="'limits'"):
        attribute(thin)
    rep = replica()
    del rep["busy_s_waiting_for_kv_blocks"]
    with pytest.raises(ResultError, match="busy_s_waiting_for_kv_blocks"):
        attribute(made(replicas=[rep]))


def test_idle_time_is_the_underloaded_score():
    r = made(gpu_busy_fraction=0.25)
    assert score(r, "underloaded") == pytest.approx(0.75)
    assert score(r, "decode_compute") == pytest.approx(0.25 * 0.9 * 0.8)
    assert attribute(r).top.key == "underloaded"


def test_communication_share_of_busy():
    r = made(replicas=[replica(compute_s=4.0, comm_s=5.5,
                               steps_by_bound={"communication": 100})])
    assert score(r, "communication") == pytest.approx(0.55)
    assert attribute(r).top.key == "communication"


def test_engine_limits_discount_gpu_time_and_queueing():
    rep = replica(num_steps_waiting_at_max_num_seqs=60, busy_s_waiting_at_max_num_seqs=6.0,
                  num_steps_waiting_for_kv_blocks=20, busy_s_waiting_for_kv_blocks=2.0)
    r = made(replicas=[rep], mean_queue_ms=90.0)
    a = attribute(r)
    assert a.factor("scheduler_max_num_seqs").score == pytest.approx(0.6)
    assert a.factor("kv_cache_capacity").score == pytest.approx(0.2)
    free = 1 - 0.8
    assert a.factor("decode_compute").score == pytest.approx(0.9 * 0.8 * free)
    assert a.factor("queueing").score == pytest.approx(0.9 * free)
    assert a.top.key == "scheduler_max_num_seqs"


def test_blocking_is_weighted_by_step_time_not_step_count():
    rep = replica(num_steps_waiting_at_max_num_seqs=60, busy_s_waiting_at_max_num_seqs=2.0)
    assert score(made(replicas=[rep]), "scheduler_max_num_seqs") == pytest.approx(0.2)


def test_preempted_requests_score_kv_capacity():
    r = made(total_preemptions=12, num_preempted_requests=4)
    assert score(r, "kv_cache_capacity") == pytest.approx(0.4)


def test_full_budget_in_compute_bound_steps_is_not_a_limit():
    cb = replica(num_steps_waiting_at_token_budget=15, busy_s_waiting_at_token_budget=1.5,
                 num_steps_waiting_at_token_budget_compute_bound=15)
    assert score(made(replicas=[cb]), "scheduler_token_budget") == 0.0
    # Half the busy time at a full budget, 40 of its 50 steps not compute-bound.
    mem = replica(num_steps_waiting_at_token_budget=50, busy_s_waiting_at_token_budget=5.0,
                  num_steps_waiting_at_token_budget_compute_bound=10)
    assert score(made(replicas=[mem]), "scheduler_token_budget") == pytest.approx(0.4)


def test_queueing_from_ttft_share_and_from_overload():
    assert score(made(mean_queue_ms=70.0), "queueing") == pytest.approx(0.7)
    # 11 arrivals over 1 s, served until 10 s; service 1 s: (9 - 1) / 10 of the span is overload.
    rows = [{"arrival_s": i / 10} for i in range(11)]
    s = signals(made(requests=rows))
    assert s["overload_fraction"] == pytest.approx(0.8)
    assert s["offered_request_rate"] == pytest.approx(10.0)
    assert s["served_request_rate"] == pytest.approx(1.0)
    assert score(made(requests=rows), "queueing") == pytest.approx(0.8)


def test_ties_rank_in_declared_order():
    r = made(gpu_busy_fraction=0.0, replicas=[], requests=[])
    a = attribute(r)
    assert a.top.key == "underloaded"
    zero = [f.key for f in a.factors if f.score == 0.0]
    assert zero == [k for k in FACTOR_KEYS if k in zero]


def test_failed_results_still_explain():
    e = explain(made(completed=0, failed=3, num_failed_by_error={"too long": 3}))
    assert e["bottleneck"] is None
    assert "all 3 failed (first reason: too long)" in text(e)


def test_assumptions_fold_the_profile_caveat_into_one_first_item():
    a = assumptions(made())
    assert a[0].startswith("uncalibrated reference profile (+/-35%)")
    assert "roofline/H100-SXM/bf16" in a[0]
    assert sum("uncalibrated" in x for x in a) == 1
    assert "vLLM V1 scheduler in sync mode" in a
    calibrated = made(provenance={"calibrated": True, "assumptions": ["measured tables"],
                                  "step_time_relative_uncertainty": 0.1,
                                  "compute_profile": "vllm/H100-SXM/bf16"})
    assert assumptions(calibrated) == ["measured tables"]


def test_cluster_runs_split_communication_by_medium_and_congestion():
    rep = replica(num_steps=10, busy_s=1.0, compute_s=0.5, comm_s=0.4)
    r = made(num_gpus=8, replicas=[rep],
             cluster={"network_share_of_step_time": 0.4, "fabric_share_of_step_time": 0.3,
                      "congestion_share_of_step_time": 0.1,
                      "network_share_of_request_latency": 0.35,
                      "fabric": {"dcqcn_rate_cuts": 7, "pfc_pause_frames": 0, "drops": 0}})
    a = attribute(r)
    s = a.signals
    assert s["fabric_fraction_of_comm"] == pytest.approx(0.75)
    assert s["congestion_fraction_of_fabric"] == pytest.approx(1 / 3)
    assert s["dcqcn_rate_cuts"] == 7
    comm = a.factor("communication").score + a.factor("fabric_communication").score + \
        a.factor("network_congestion").score
    assert comm == pytest.approx(0.4)
    assert a.factor("communication").score == pytest.approx(0.4 * 0.25)
    assert a.factor("network_congestion").score == pytest.approx(0.4 * 0.75 / 3)
    assert a.factor("communication").label == "communication inside nodes (NVLink collectives)"
    # Without a cluster the whole of it stays with the one communication factor.
    del r["cluster"]
    a = attribute(r)
    assert a.factor("communication").score == pytest.approx(0.4)
    assert a.factor("fabric_communication").score == 0.0


def test_the_printed_envelope_shows_the_tail_percentile_a_run_reports():
    from dse.summary import _envelope_rows

    e = {"low": 1.0, "nominal": 2.0, "high": 3.0}
    with_99 = {"mean_ttft_ms": e, "p99_ttft_ms": e, "p99.9_ttft_ms": e}
    assert ("p99_ttft_ms", "P99 TTFT (ms)") in _envelope_rows(with_99)
    # Percentiles [25, 99.9]: the highest tail stands in for the 99th (it was left out).
    rows = _envelope_rows({"mean_ttft_ms": e, "p25_ttft_ms": e, "p99.9_ttft_ms": e})
    assert rows == [("mean_ttft_ms", "Mean TTFT (ms)"), ("p99.9_ttft_ms", "P99.9 TTFT (ms)")]
