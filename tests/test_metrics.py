"""Hand-computed checks of the run summary against `vllm bench serve`'s definitions."""

import json
import math

import numpy as np
import pytest

from simcore.errors import ConfigError
from simcore.metrics import (RequestRecord, _pack, engine_summary, latency_stats,
                             percentile_word, pooled_latency_stats, summarize)
from simcore.token_times import DeliveryLog, TokenTimes, blockwise_std, pairwise_sum


def approx(x):
    return pytest.approx(x, rel=1e-12, abs=1e-12)


def three_done_one_failed() -> list[RequestRecord]:
    """A: 4 tokens, B: 3 tokens, C: 1 token, D: rejected at send. All times are binary fractions."""
    return [
        RequestRecord("A", prompt_len=10, output_len=4, arrival_s=0.0, send_s=0.0,
                      token_times_s=[0.5, 0.75, 1.0, 1.5], success=True,
                      first_scheduled_s=0.125, num_cached_prompt_tokens=0, replica=0),
        RequestRecord("B", prompt_len=20, output_len=3, arrival_s=0.25, send_s=0.25,
                      token_times_s=[1.25, 1.75, 2.5], success=True,
                      first_scheduled_s=0.5, num_preemptions=2, num_cached_prompt_tokens=16, replica=1),
        RequestRecord("C", prompt_len=5, output_len=1, arrival_s=0.5, send_s=0.5,
                      token_times_s=[1.0], success=True,
                      first_scheduled_s=0.75, num_cached_prompt_tokens=0, replica=0),
        RequestRecord("D", prompt_len=9999, output_len=8, arrival_s=1.0, send_s=1.0,
                      error="prompt longer than max_model_len"),
    ]


# TTFT  A 0.5, B 1.0, C 0.5          E2EL A 1.5, B 2.25, C 0.5
# TPOT  A (1.5-0.5)/3 = 1/3, B (2.25-1.0)/2 = 0.625, C excluded (one token)
# ITL   A 0.25 0.25 0.5, B 0.5 0.75 (pooled, C has none)


def test_counts_durations_and_throughputs():
    r = summarize(three_done_one_failed())
    assert r["duration"] == 2.5  # benchmark start 0 -> last token of B
    assert r["completed"] == 3
    assert r["failed"] == 1
    assert r["num_prompts"] == 4
    assert r["total_input_tokens"] == 35  # the failed prompt is not counted
    assert r["total_output_tokens"] == 8
    assert r["request_throughput"] == approx(3 / 2.5)
    assert r["output_throughput"] == approx(8 / 2.5)
    assert r["total_token_throughput"] == approx(43 / 2.5)
    assert r["request_goodput"] is None  # no SLO given, as vLLM's JSON


def test_ttft_and_e2el_statistics():
    r = summarize(three_done_one_failed(), selected_percentiles=[50, 99, 99.9])
    assert r["mean_ttft_ms"] == approx(2000 / 3)
    assert r["median_ttft_ms"] == 500.0
    assert r["std_ttft_ms"] == approx(math.sqrt(1 / 18) * 1000)  # ddof 0
    # sorted 0.5 0.5 1.0; linear interpolation at rank 0.99 * 2 = 1.98
    assert r["p99_ttft_ms"] == approx(990.0)
    assert r["p99.9_ttft_ms"] == approx(999.0)
    assert r["p50_ttft_ms"] == 500.0
    assert r["mean_e2el_ms"] == approx(4250 / 3)
    assert r["median_e2el_ms"] == 1500.0
    mean_e2el_s = 4.25 / 3
    var_e2el_s2 = ((1.5 - mean_e2el_s) ** 2 + (2.25 - mean_e2el_s) ** 2 + (0.5 - mean_e2el_s) ** 2) / 3
    assert r["std_e2el_ms"] == approx(math.sqrt(var_e2el_s2) * 1000)
    assert r["p99_e2el_ms"] == approx(2235.0)  # 1.5 + 0.98 * 0.75


def test_tpot_excludes_one_token_outputs():
    r = summarize(three_done_one_failed())
    assert r["mean_tpot_ms"] == approx((1 / 3 + 0.625) / 2 * 1000)
    assert r["median_tpot_ms"] == approx((1 / 3 + 0.625) / 2 * 1000)
    assert r["std_tpot_ms"] == approx((0.625 - 1 / 3) / 2 * 1000)
    assert r["p99_tpot_ms"] == approx((1 / 3 + 0.99 * (0.625 - 1 / 3)) * 1000)


def test_itl_pools_every_gap_of_every_request():
    r = summarize(three_done_one_failed(), selected_percentiles=[50, 99])
    assert r["mean_itl_ms"] == approx(450.0)
    assert r["median_itl_ms"] == 500.0
    assert r["std_itl_ms"] == approx(math.sqrt(0.035) * 1000)
    assert r["p50_itl_ms"] == 500.0
    assert r["p99_itl_ms"] == approx(740.0)  # sorted .25 .25 .5 .5 .75, rank 3.96


def test_peak_tokens_and_concurrency_use_one_second_buckets():
    r = summarize(three_done_one_failed())
    # buckets from the first send (0.0): [0,1): 0.5 0.75; [1,2): 1.0 1.5 1.25 1.75 1.0; [2,3): 2.5
    assert r["max_output_tokens_per_s"] == 5.0
    assert isinstance(r["max_output_tokens_per_s"], float)
    # in flight in buckets int(send)..int(end), ends included: A 0-1, B 0-2, C 0-1
    assert r["max_concurrent_requests"] == 3


def test_concurrency_bucket_counts_requests_that_never_overlap():
    records = [
        RequestRecord("a", 4, 1, arrival_s=0.0, send_s=0.0, token_times_s=[1.0], success=True),
        RequestRecord("b", 4, 1, arrival_s=1.5, send_s=1.5, token_times_s=[1.75], success=True),
    ]
    r = summarize(records)
    # a ends exactly at 1.0 and is counted in bucket 1 too, where b runs: vLLM reports 2
    assert r["max_concurrent_requests"] == 2
    assert r["max_output_tokens_per_s"] == 2.0  # 1.0 and 1.75 share bucket 1


def test_buckets_start_at_first_successful_send_not_benchmark_start():
    records = [
        RequestRecord("a", 4, 2, arrival_s=0.75, send_s=0.75, token_times_s=[0.875, 1.25], success=True),
        RequestRecord("b", 4, 1, arrival_s=0.75, send_s=0.75, token_times_s=[1.5], success=True),
    ]
    r = summarize(records)
    # from 0.75 all three tokens fall in [0, 1); counted from 0 they would split 1 + 2
    assert r["max_output_tokens_per_s"] == 3.0
    assert r["duration"] == 1.5  # from the benchmark start, not from the first send
    assert summarize(records, benchmark_start_s=0.75)["duration"] == 0.75


def test_goodput_boundaries_are_inclusive():
    records = three_done_one_failed()
    assert summarize(records, goodput_slos_ms={"ttft": 500})["request_goodput"] == approx(2 / 2.5)
    # B's TPOT is exactly 0.625 s: meets 625 ms, misses 624.999 ms
    assert summarize(records, goodput_slos_ms={"tpot": 625})["request_goodput"] == approx(3 / 2.5)
    assert summarize(records, goodput_slos_ms={"tpot": 624.999})["request_goodput"] == approx(2 / 2.5)
    # a one-token output counts as TPOT 0 for goodput
    assert summarize(records, goodput_slos_ms={"tpot": 0})["request_goodput"] == approx(1 / 2.5)
    # every SLO must hold: B meets tpot but misses e2el
    both = summarize(records, goodput_slos_ms={"tpot": 625, "e2el": 1500})
    assert both["request_goodput"] == approx(2 / 2.5)
    # an empty SLO mapping is no SLO
    assert summarize(records, goodput_slos_ms={})["request_goodput"] is None


def test_bad_goodput_slos_are_rejected():
    with pytest.raises(ConfigError, match="itl"):
        summarize(three_done_one_failed(), goodput_slos_ms={"itl": 10})
    with pytest.raises(ConfigError, match="non-negative"):
        summarize(three_done_one_failed(), goodput_slos_ms={"ttft": -1})


def test_percentile_words_follow_vllm():
    assert percentile_word(99) == "99"
    assert percentile_word(99.0) == "99"
    assert percentile_word(50.0) == "50"
    assert percentile_word(99.9) == "99.9"
    assert percentile_word(99.99) == "99.99"


def test_exact_key_set_and_json():
    r = summarize(three_done_one_failed(), selected_percentiles=[90, 99.9], model_id="m")
    stats = {
        f"{stat}_{m}_ms"
        for m in ("ttft", "tpot", "itl", "e2el")
        for stat in ("mean", "median", "std", "p90", "p99.9")
    }
    assert set(r) == {
        "duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
        "request_throughput", "request_goodput", "output_throughput", "total_token_throughput",
        "max_output_tokens_per_s", "max_concurrent_requests",
        "request_rate", "burstiness", "max_concurrency", "num_prompts", "model_id",
    } | stats
    assert r["request_rate"] == "inf"
    assert r["burstiness"] == 1.0
    assert r["max_concurrency"] is None
    assert r["model_id"] == "m"
    assert json.loads(json.dumps(r)) == r


def test_client_queue_metrics_with_max_concurrency():
    records = [
        RequestRecord("a", 4, 2, arrival_s=0.0, send_s=0.0, token_times_s=[0.5, 1.0], success=True),
        RequestRecord("b", 4, 2, arrival_s=0.25, send_s=1.0, token_times_s=[1.5, 2.0], success=True),
    ]
    r = summarize(records, request_rate=4.0, max_concurrency=1)
    assert r["request_rate"] == 4.0
    assert r["max_concurrency"] == 1
    # TTFT and E2EL exclude the client-side wait
    assert r["mean_ttft_ms"] == 500.0
    assert r["mean_e2el_ms"] == 1000.0
    assert r["mean_client_queue_time_ms"] == 375.0
    assert r["p99_client_queue_time_ms"] == approx(742.5)
    assert r["mean_e2el_including_client_queue_ms"] == 1375.0
    assert "mean_e2el_including_client_queue_ms" not in summarize(records, max_concurrency=1)
    assert "mean_client_queue_time_ms" not in summarize(records)


def test_all_failed_gives_zeros():
    records = [RequestRecord("x", 10, 4, arrival_s=0.5, send_s=0.5, error="prompt longer than max_model_len")]
    r = summarize(records, selected_percentiles=[99])
    assert r["completed"] == 0 and r["failed"] == 1
    assert r["duration"] == 0.5
    assert r["request_throughput"] == 0.0
    assert r["max_output_tokens_per_s"] == 0.0 and r["max_concurrent_requests"] == 0
    for m in ("ttft", "tpot", "itl", "e2el"):
        assert r[f"mean_{m}_ms"] == r[f"std_{m}_ms"] == r[f"p99_{m}_ms"] == 0.0


def test_tokens_arriving_together_are_one_chunk():
    # two tokens in one chunk at 1.0: TPOT counts tokens, ITL and the token peak count chunks
    records = [
        RequestRecord("a", 4, 4, arrival_s=0.0, send_s=0.0, token_times_s=np.array([0.5, 1.0, 1.0, 1.5]),
                      success=True),
    ]
    r = summarize(records)
    assert r["total_output_tokens"] == 4
    assert r["mean_tpot_ms"] == approx(1000 / 3)
    assert r["mean_itl_ms"] == 500.0 and r["std_itl_ms"] == 0.0
    assert r["max_output_tokens_per_s"] == 2.0  # chunks at 1.0 and 1.5


def test_chat_streams_open_with_a_role_chunk_as_vllm_counts_it():
    # vLLM's chat server sends a chunk holding only the role before the first token's; vLLM's
    # client takes TTFT at it, then an ITL of 0 to the first token's chunk, and counts both in
    # the token peak. ITL: A 0 .25 .25 .5, B 0 .5 .75, C 0.
    plain = summarize(three_done_one_failed(), selected_percentiles=[50])
    chat = summarize(three_done_one_failed(), selected_percentiles=[50], role_chunk=True)
    assert chat["mean_ttft_ms"] == plain["mean_ttft_ms"]
    assert chat["mean_tpot_ms"] == plain["mean_tpot_ms"]
    assert chat["mean_itl_ms"] == approx(2250 / 8)
    assert chat["median_itl_ms"] == 250.0
    # [0,1): 0.5 twice and 0.75; [1,2): 1.0 twice (C's), 1.5, 1.25 twice, 1.75, 1.0
    assert chat["max_output_tokens_per_s"] == 7.0
    assert chat["total_output_tokens"] == plain["total_output_tokens"]


def test_successful_record_without_tokens_is_an_error():
    with pytest.raises(ValueError, match="no token"):
        summarize([RequestRecord("a", 4, 4, arrival_s=0.0, send_s=0.0, success=True)])
    with pytest.raises(ValueError, match="without requests"):
        summarize([])


def test_engine_summary():
    e = engine_summary(three_done_one_failed())
    # queueing delay (first scheduled - send): A 0.125, B 0.25, C 0.25; D never scheduled
    assert e["mean_queue_ms"] == approx(625 / 3)
    assert e["median_queue_ms"] == 250.0
    assert e["p50_queue_ms"] == 250.0
    assert e["p99_queue_ms"] == 250.0
    assert e["total_preemptions"] == 2
    assert e["num_preempted_requests"] == 1
    assert e["num_prompt_tokens_scheduled"] == 35
    assert e["num_cached_prompt_tokens"] == 16
    assert e["prefix_cache_hit_rate"] == approx(16 / 35)
    assert e["num_requests"] == 4 and e["num_completed"] == 3 and e["num_failed"] == 1
    assert e["num_failed_by_error"] == {"prompt longer than max_model_len": 1}
    assert not set(e) & set(summarize(three_done_one_failed()))
    assert json.loads(json.dumps(e)) == e


def naive_vllm_summary(records, percentiles, slos_ms):
    """The same definitions written as plain per-request loops, for cross-checking."""
    ok = [r for r in records if r.success]
    ttfts, e2els, tpots, all_tpots, itls = [], [], [], [], []
    for r in ok:
        t = list(r.token_times_s)
        ttfts.append(t[0] - r.send_s)
        e2els.append(t[-1] - r.send_s)
        tpot = (e2els[-1] - ttfts[-1]) / (len(t) - 1) if len(t) > 1 else 0.0
        if len(t) > 1:
            tpots.append(tpot)
        all_tpots.append(tpot)
        itls += [b - a for a, b in zip(t, t[1:])]
    dur = max(r.end_s for r in records)
    good = sum(
        all(slos_ms[k] / 1000 >= v for k, v in (("ttft", f), ("tpot", p), ("e2el", e)) if k in slos_ms)
        for f, p, e in zip(ttfts, all_tpots, e2els)
    )
    out = {"duration": dur, "request_goodput": good / dur}
    t0 = min(r.send_s for r in ok)
    n = int(np.ceil(max(r.send_s + e for r, e in zip(ok, e2els)) - t0)) + 1
    tokens, conc = [0] * n, [0] * n
    for r, e in zip(ok, e2els):
        for x in r.token_times_s:
            tokens[int(x - t0)] += 1
        for sec in range(int(r.send_s - t0), int(r.send_s + e - t0) + 1):
            conc[sec] += 1
    out["max_output_tokens_per_s"] = float(max(tokens))
    out["max_concurrent_requests"] = max(conc)
    for name, vals in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        out[f"mean_{name}_ms"] = np.mean(vals or 0) * 1000
        out[f"std_{name}_ms"] = np.std(vals or 0) * 1000
        out[f"median_{name}_ms"] = np.median(vals or 0) * 1000
        for p in percentiles:
            out[f"p{percentile_word(p)}_{name}_ms"] = np.percentile(vals or 0, p) * 1000
    return out


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("block", [5, None])
def test_matches_per_request_loops_on_random_runs(seed, block, monkeypatch):
    """Also with the per-token arrays worked in blocks of 5 elements (a run's per-token work
    goes block by block, in place), so every block boundary case is crossed."""
    if block is not None:
        monkeypatch.setattr("simcore.token_times._BLOCK", block)
    rng = np.random.default_rng(seed)
    records = []
    for i in range(200):
        arrival = float(rng.uniform(0, 20))
        send = arrival + float(rng.exponential(0.5))
        if rng.random() < 0.1:
            records.append(RequestRecord(str(i), 100, 10, arrival, send, error="rejected"))
            continue
        num_tokens = int(rng.integers(1, 40))
        times = send + np.cumsum(rng.exponential(0.05, size=num_tokens))
        records.append(RequestRecord(str(i), int(rng.integers(1, 500)), num_tokens, arrival, send,
                                     token_times_s=times.tolist(), success=True))
    slos = {"ttft": 100.0, "tpot": 60.0, "e2el": 1500.0}
    got = summarize(records, selected_percentiles=[25, 99.9], goodput_slos_ms=slos)
    for key, value in naive_vllm_summary(records, [25, 99.9], slos).items():
        assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-9), key


def _as_token_times(times: list[float], rng, log: DeliveryLog | None = None) -> TokenTimes:
    """`times` received as an engine delivers them: some as single times, most as ranges of
    the engine's delivery log `log` (shared by the requests of a test), runs of one or more
    steps, now and then two tokens of one step."""
    log = log if log is not None else DeliveryLog()
    out = TokenTimes()
    i = 0
    while i < len(times):
        k = int(rng.integers(1, 6))
        u = rng.random()
        if u < 0.3:
            out.append(times[i])
            i += 1
        else:
            run = times[i:i + k]
            a = len(log.times)
            log.times.extend(run)
            if u < 0.4:                 # not contiguous with what came before
                log.times.append(-1.0)
            out.add_range(log, a, a + len(run))
            i += len(run)
    return out


@pytest.mark.parametrize("seed", range(5))
def test_token_times_read_as_the_list_of_their_times(seed):
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(0.05, size=int(rng.integers(1, 60)))).tolist()
    tt = _as_token_times(times, rng)
    assert len(tt) == len(times)
    assert list(tt) == times
    assert [tt[i] for i in range(len(times))] == times
    assert [tt[-i] for i in range(1, len(times) + 1)] == [times[-i] for i in range(1, len(times) + 1)]
    assert np.asarray(tt).tolist() == times and np.asarray(tt).dtype == np.float64
    assert tt.to_array().tolist() == times and np.asarray(tt, dtype=np.float32).dtype == np.float32
    held = tt.to_array()
    for part in [*(tt._parts or ()), (tt._log, 0, 0)]:
        if type(part) is tuple and part[0] is not None:
            part[0].times.append(9.0)   # the copy holds no buffer of the log's
    assert held.tolist() == times
    assert tt == times and tt == TokenTimes(times)
    assert TokenTimes().to_array().shape == (0,)
    with pytest.raises(IndexError):
        tt[len(times)]
    with pytest.raises(IndexError):
        tt[-len(times) - 1]


def test_contiguous_ranges_of_a_log_are_one_range():
    log = DeliveryLog()
    log.times.extend([1.0, 2.0, 3.0, 4.0])
    tt = TokenTimes([0.5])
    for i in range(4):
        tt.add_range(log, i, i + 1)
    assert tt._parts == [0.5] and (tt._log, tt._a, tt._b) == (log, 0, 4)
    assert list(tt) == [0.5, 1.0, 2.0, 3.0, 4.0] and tt[-1] == 4.0
    tt.append(4.0)                      # a second token of the last step
    tt.add_range(log, 2, 3)             # not contiguous: a range of its own
    assert list(tt) == [0.5, 1.0, 2.0, 3.0, 4.0, 4.0, 3.0] and len(tt) == 7
    # Step by step, as an engine delivers: one range, and a step's second token its own.
    steps = TokenTimes()
    for i in (0, 1, 2, 2, 3):
        steps.add_step(log, i)
    assert list(steps) == [1.0, 2.0, 3.0, 3.0, 4.0] and len(steps) == 5
    assert steps._parts == [(log, 0, 3)] and (steps._a, steps._b) == (2, 4)


@pytest.mark.parametrize("seed", range(3))
def test_summary_of_token_times_equals_that_of_lists(seed):
    rng = np.random.default_rng(seed)
    log = DeliveryLog()
    lists, runs = [], []
    for i in range(150):
        send = float(rng.uniform(0, 20))
        n = int(rng.integers(1, 40))
        times = (send + np.cumsum(rng.exponential(0.05, size=n))).tolist()
        if rng.random() < 0.3:          # tokens that arrive together (one chunk)
            times[n // 2:] = [times[n // 2]] * (n - n // 2)
        lists.append(RequestRecord(str(i), 100, n, send, send, token_times_s=times, success=True))
        runs.append(RequestRecord(str(i), 100, n, send, send,
                                  token_times_s=_as_token_times(times, rng, log), success=True))
    assert summarize(runs, selected_percentiles=[50, 99]) == summarize(lists,
                                                                       selected_percentiles=[50, 99])


@pytest.mark.parametrize("seed", range(4))
def test_pairwise_sum_and_blockwise_std_are_numpys_to_the_bit(seed, monkeypatch):
    """The sum by numpy's pairwise tree with leaves summed apart, and the std whose squared
    deviations are made a block at a time, equal numpy's own floats (all sizes around the
    tree's splits, leaves of 128 elements up to more than the array)."""
    rng = np.random.default_rng(seed)
    for n in (1, 7, 8, 9, 127, 128, 129, 255, 1000, 4097, 65_537, 300_001):
        x = rng.exponential(0.01, n) * float(rng.choice([1e-3, 1.0, 1e3]))
        for leaf in (1, 128, 256, 1000, 1 << 16, 1 << 20):
            assert pairwise_sum(x, leaf=leaf) == np.add.reduce(x), (n, leaf)
        for block in (128, 1000, 1 << 20):
            monkeypatch.setattr("simcore.token_times._BLOCK", block)
            assert blockwise_std(x) == np.std(x), (n, block)


def _pooled_itls(records, role_chunk: bool = False) -> np.ndarray:
    """Every request's gaps between distinct consecutive token times, request after request
    (with `role_chunk`, each request's led by a 0: the role chunk to the first token's)."""
    out = []
    for r in records:
        t = np.asarray(list(r.token_times_s), dtype=np.float64)
        d = np.diff(t)
        out.append(np.concatenate([[0.0], d[d != 0]]) if role_chunk else d[d != 0])
    return np.concatenate(out) if out else np.empty(0)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("block", [5, 300, 1 << 20])
@pytest.mark.parametrize("role_chunk", [False, True])
def test_pooled_itl_statistics_are_those_of_the_whole_array(seed, block, role_chunk, monkeypatch):
    """Made a block of requests at a time and never held whole, the pooled ITLs' mean, std,
    median and percentiles are the floats numpy gives on the whole array: many requests
    sharing the same step gaps (one value thousands of times, as steady decoding gives),
    tokens arriving together, requests with one token."""
    monkeypatch.setattr("simcore.token_times._BLOCK", block)
    rng = np.random.default_rng(seed)
    steps = np.cumsum(rng.choice([0.008, 0.0081, 0.012, float(rng.exponential(0.01))],
                                 size=3000, p=[0.6, 0.2, 0.1, 0.1]))
    log = DeliveryLog()
    log.times.extend(steps.tolist())
    records = []
    for i in range(400):
        a = int(rng.integers(0, 2900))
        k = int(rng.integers(1, 100))
        b = min(a + k, 3000)
        tt = TokenTimes()
        tt.add_range(log, a, b)
        if rng.random() < 0.2:
            tt.append(float(steps[b - 1]))          # a second token of the last step
        records.append(RequestRecord(str(i), 10, len(tt), float(steps[a]) - 0.01,
                                     float(steps[a]) - 0.01, token_times_s=tt, success=True))
    pcts = [0.0, 1.0, 25.0, 50.0, 90.0, 99.0, 99.9, 100.0, float(rng.uniform(0, 100))]
    expected = latency_stats(_pooled_itls(records, role_chunk), "itl", pcts)
    got = pooled_latency_stats(_pack(records, role_chunk=role_chunk).itl, "itl", pcts)
    assert got == expected


def test_pooled_itl_statistics_without_gaps_are_zero():
    records = [RequestRecord("a", 1, 1, 0.0, 0.0, token_times_s=[1.0], success=True)]
    assert pooled_latency_stats(_pack(records).itl, "itl", [99.0]) == latency_stats(
        np.empty(0), "itl", [99.0])


def test_peaks_of_a_run_too_long_for_an_array_a_second_are_the_same(monkeypatch):
    """Past DENSE_PEAK_BUCKETS seconds the peaks count only the seconds that hold something
    (requests a million seconds apart would need an array of years); the maxima are those of
    the array a second."""
    import simcore.metrics as metrics

    rng = np.random.default_rng(7)
    for _ in range(200):
        n = int(rng.integers(1, 40))
        scale = float(rng.choice([1.0, 10.0, 1000.0]))
        send = np.sort(rng.random(n) * scale * 10)
        e2el = rng.random(n) * scale
        chunks = np.concatenate([np.sort(s + rng.random(int(rng.integers(0, 20))) * e)
                                 for s, e in zip(send, e2el)])
        got = []
        for dense in (10**9, 0):
            monkeypatch.setattr(metrics, "DENSE_PEAK_BUCKETS", dense)
            peaks = metrics._Peaks(send, e2el)
            half = chunks.size // 2
            peaks.add(chunks[:half])
            peaks.add(chunks[half:])
            got.append(peaks.result())
        assert got[0] == got[1]
