"""The CPU side of a vLLM server (simcore.host): the engine core's time per step from vLLM's
measured scheduler costs and the fitted model-runner terms, async scheduling's overlap, the API
server's pace and per-request delay, and the calibrated envelope built on the end-to-end
residuals."""

import math

import pytest

from simcore.compute.base import StepShape
from simcore.compute.roofline import RooflineModel
from simcore.config import parse_config
from simcore.hardware import get_gpu
from simcore.host import (HostConfig, HostOverheads, _cpu_costs, fitted_parameters,
                          fitted_residuals, streaming_token_s, tokenize_fit)
from simcore.model.presets import load_preset
from simcore.simulate import simulate
from simcore.uncertainty import (
    MIN_GPU_RESIDUALS, calibrated_range, conformal, metric_family, residuals_for,
    simulate_with_envelope, tail_family)

EXPLICIT = dict(model_runner_step_s=1e-3, model_runner_per_seq_s=2e-5,
                api_server_per_token_s=3e-5, request_overhead_s=0.04,
                api_server_per_request_s=2e-3)
RUNNER = dict(model_runner_step_s=1e-3, model_runner_per_seq_s=2e-5)
"""EXPLICIT's model runner alone: what an offline engine (no API server) reads."""


def test_engine_time_is_the_measured_scheduler_scaled_plus_the_model_runner():
    cfg = HostConfig(host_speed=0.5, **EXPLICIT)
    h = HostOverheads(cfg)
    fits = _cpu_costs(cfg.cpu_costs)["fits"]
    n = 64
    sched = fits["schedule_decode"]["a"] + fits["schedule_decode"]["b_per_seq"] * n
    upd = fits["update_decode"]["a"] + fits["update_decode"]["b_per_seq"] * n
    enc = fits["ipc_outputs_encode"]["a"] + fits["ipc_outputs_encode"]["b_per_seq"] * n
    expected = 0.5 * (sched + upd + enc) + 1e-3 + 2e-5 * n
    assert h.engine_s(n, n, n) == pytest.approx(expected, rel=1e-12)
    # A prefill chunk adds its per-sequence and per-token costs.
    assert h.engine_s(n + 1, n + 2048, n) > h.engine_s(n, n, n)


def test_sync_adds_async_overlaps_and_the_api_server_sets_the_pace():
    sync = HostOverheads(HostConfig(**EXPLICIT))
    asyn = HostOverheads(HostConfig(**EXPLICIT), async_scheduling=True)
    n, gpu = 32, 0.02
    cpu = sync.engine_s(n, n, n)
    assert sync.step_total_s(gpu, n, n, n) == pytest.approx(gpu + cpu)
    # Async scheduling hides vLLM's scheduler behind the GPU; the model runner's time (1 ms +
    # 20 us a sequence) still comes before the step's GPU work.
    runner = 1e-3 + 2e-5 * n
    assert asyn.runner_s(n) == pytest.approx(runner)
    assert asyn.step_total_s(gpu, n, n, n) == pytest.approx(max(gpu + runner, cpu - runner))
    assert asyn.step_total_s(gpu, n, n, n) == pytest.approx(gpu + runner)   # GPU-bound here
    assert asyn.step_total_s(gpu, n, n, n) < sync.step_total_s(gpu, n, n, n)
    # 4096 streams at 30 us a token take longer than the engine's step: the server's pace.
    big = 4096
    front = sync.frontend_s(big)
    assert front > 0.1
    assert asyn.step_total_s(0.01, big, big, big) == pytest.approx(
        max(front, 0.01 + asyn.runner_s(big), asyn.engine_s(big, big, big) - asyn.runner_s(big)))


def test_overhead_scale_scales_every_cpu_term():
    a = HostOverheads(HostConfig(**EXPLICIT))
    b = HostOverheads(HostConfig(**EXPLICIT), scale=1.5)
    assert b.engine_s(10, 10, 10) == pytest.approx(1.5 * a.engine_s(10, 10, 10))
    assert b.frontend_s(10) == pytest.approx(1.5 * a.frontend_s(10))
    assert b.request_overhead_s == pytest.approx(1.5 * a.request_overhead_s)
    assert b.request_cpu_s(500) == pytest.approx(1.5 * a.request_cpu_s(500))


def test_the_step_model_takes_the_host_in_place_of_the_declared_overhead():
    arch, gpu = load_preset("llama-3.1-8b"), get_gpu("H100-SXM")
    plain = RooflineModel(arch, gpu)
    hosted = RooflineModel(arch, gpu, host=(HostConfig(**EXPLICIT), False))
    shape = StepShape.from_requests([(1, 500)] * 16)
    p, h = plain.step_time(shape), hosted.step_time(shape)
    gpu_s = p.total_s - plain.assumptions.step_overhead_s
    assert h.total_s == pytest.approx(gpu_s + hosted.host.engine_s(16, 16, 16), rel=1e-9)
    assert h.overhead_s == pytest.approx(h.total_s - h.compute_s - h.comm_s)


def _cfg(**over):
    d = {"name": "h", "seed": 3, "model": {"name": "meta-llama/Llama-3.1-8B"},
         "hardware": {"gpu": "H100-SXM"}, "uncertainty": {"method": "first_order"},
         "workload": {"num_prompts": 1, "request_rate": "inf",
                      "dataset": {"kind": "random", "input_len": 256, "output_len": 16}}}
    d.update(over)
    return parse_config(d)


def test_request_overhead_delays_the_first_token_by_exactly_its_time():
    base = simulate(_cfg(host={**EXPLICIT, "request_overhead_s": 0.0}))
    late = simulate(_cfg(host={**EXPLICIT, "request_overhead_s": 0.05}))
    assert late["mean_ttft_ms"] - base["mean_ttft_ms"] == pytest.approx(50.0, abs=1e-6)
    assert late["mean_tpot_ms"] == pytest.approx(base["mean_tpot_ms"], rel=1e-12)


def test_the_request_latency_does_not_hold_the_server_process():
    w = {"num_prompts": 8, "request_rate": "inf",
         "dataset": {"kind": "random", "input_len": 64, "output_len": 4}}
    host = {**EXPLICIT, "request_overhead_s": 0.01}
    late = simulate(_cfg(host=host, workload=w))
    base = simulate(_cfg(host={**host, "request_overhead_s": 0.0}, workload=w))
    # Every request of the burst reaches the engine exactly 10 ms later, on one process too.
    assert late["mean_ttft_ms"] - base["mean_ttft_ms"] == pytest.approx(10.0, abs=1e-6)
    assert late["mean_api_server_wait_ms"] == pytest.approx(base["mean_api_server_wait_ms"])


def _fifo_then_shared(arrivals: list[float], tokenize: list[float], work: list[float]
                      ) -> list[float]:
    """When each request leaves one API server process: tokenized one after another in arrival
    order, then its work on the event loop, whose CPU every request there shares equally
    (an oracle for `TokenizerThread` and `SharedCpu`, stepping from event to event)."""
    ready, free = [], 0.0
    for at, t in zip(arrivals, tokenize):
        free = max(free, at) + t
        ready.append(free)
    left = dict(enumerate(work))
    ends: dict[int, float] = {}
    now, waiting = 0.0, sorted(range(len(ready)), key=lambda i: ready[i])
    active: set[int] = set()
    while len(ends) < len(work):
        while waiting and ready[waiting[0]] <= now + 1e-15:
            active.add(waiting.pop(0))
        for i in [i for i in active if left[i] <= 1e-15]:
            active.discard(i)
            ends[i] = now
        if len(ends) == len(work):
            break
        nxt = ready[waiting[0]] if waiting else math.inf
        if active:
            n = len(active)
            first = min(left[i] for i in active) * n
            dt = min(first, nxt - now)
            for i in active:
                left[i] -= dt / n
            now += dt
        else:
            now = nxt
    return [ends[i] for i in range(len(work))]


def test_the_oracle_shares_and_queues_as_described():
    # Two requests at once, tokenized 1 s each, then 1 s of loop work: the first works alone
    # from 1 to 2, the second from 2 to 3.
    assert _fifo_then_shared([0, 0], [1, 1], [1, 1]) == pytest.approx([2, 3])
    # No tokenization: they share the loop and finish together.
    assert _fifo_then_shared([0, 0], [0, 0], [1, 1]) == pytest.approx([2, 2])


def test_a_burst_is_tokenized_in_turn_then_shares_the_event_loop():
    """The API server's tokenizer thread takes a burst's prompts one after another, beside the
    event loop; the loop shares its CPU among the requests it is working on. Long prompts reach
    the loop one tokenization apart; short ones, whose fitted work outlasts their tokenization,
    meet there and share it."""
    host = {**EXPLICIT, "request_overhead_s": 0.0}
    h = HostOverheads(HostConfig(**host))
    measured = tokenize_fit()
    for prompt in (16384, 64):
        # Tokenizing is the tokenizer's call as measured alone, at the host speed.
        assert h.tokenize_s(prompt) == pytest.approx(
            0.4 * (measured["a"] + measured["c_per_token"] * prompt))
        w = {"num_prompts": 8, "request_rate": "inf",
             "dataset": {"kind": "random", "input_len": prompt, "output_len": 4}}
        tok, cpu = h.tokenize_s(prompt), h.request_cpu_s(prompt)
        ends = _fifo_then_shared([0.0] * 8, [tok] * 8, [cpu] * 8)
        one = simulate(_cfg(host=host, workload=w))
        assert one["mean_api_server_ms"] == pytest.approx(1e3 * sum(ends) / 8, rel=1e-9)
        assert one["mean_api_server_wait_ms"] == pytest.approx(
            1e3 * (sum(ends) / 8 - tok - cpu), rel=1e-9)
        eight = simulate(_cfg(host={**host, "api_server_count": 8}, workload=w))
        assert eight["mean_api_server_wait_ms"] == pytest.approx(0.0, abs=1e-9)
        assert eight["mean_api_server_ms"] == pytest.approx(1e3 * (tok + cpu), rel=1e-9)
    assert h.tokenize_s(16384) > h.request_cpu_s(16384)       # long prompts: one at a time
    assert h.tokenize_s(64) < h.request_cpu_s(64) / 4         # short ones: shared


def test_the_servers_unmeasured_work_per_request_holds_it():
    """Eight short requests sent at once to one server process: tokenized in turn, then sharing
    the event loop, whose fitted work per request (5 ms) they wait for together."""
    w = {"num_prompts": 8, "request_rate": "inf",
         "dataset": {"kind": "random", "input_len": 256, "output_len": 4}}
    host = {**EXPLICIT, "request_overhead_s": 0.0, "api_server_per_request_s": 0.0}
    base = simulate(_cfg(host=host, workload=w))
    held = simulate(_cfg(host={**host, "api_server_per_request_s": 0.005}, workload=w))
    h0 = HostOverheads(HostConfig(**host))
    tok = [h0.tokenize_s(256)] * 8
    for run, extra in ((base, 0.0), (held, 0.005)):
        ends = _fifo_then_shared([0.0] * 8, tok, [h0.request_cpu_s(256) + extra] * 8)
        assert run["mean_api_server_ms"] == pytest.approx(1e3 * sum(ends) / 8, rel=1e-9)
    # The 5 ms each, shared: the wait grows by nearly the other seven requests' 35 ms.
    assert 30 < held["mean_api_server_wait_ms"] - base["mean_api_server_wait_ms"] <= 35 + 1e-9
    runner = {k: host[k] for k in ("model_runner_step_s", "model_runner_per_seq_s")}
    assert HostOverheads(HostConfig(**runner, entrypoint="offline")).request_cpu_s(256) == 0.0
    # Without an API server, its parameters are refused (they would have no effect).
    with pytest.raises(Exception, match="api_server_per_request_s: has no effect with "
                                        "entrypoint: offline"):
        HostConfig(**runner, entrypoint="offline", api_server_per_request_s=0.005)


def test_api_server_count_without_an_api_server_is_refused():
    with pytest.raises(Exception, match="api_server_count has no effect"):
        _cfg(host={"entrypoint": "offline", "api_server_count": 2})


def test_async_scheduling_is_modelled_and_never_slower():
    w = {"num_prompts": 64, "request_rate": "inf",
         "dataset": {"kind": "random", "input_len": 128, "output_len": 64}}
    sync = simulate(_cfg(host=EXPLICIT, workload=w))
    asyn = simulate(_cfg(host=EXPLICIT, workload=w, engine={"async_scheduling": True}))
    assert asyn["mean_tpot_ms"] < sync["mean_tpot_ms"]
    assert "async scheduling" in asyn["provenance"]["engine_semantics"]
    assert any("async scheduling: vLLM's scheduler overlaps the GPU, the model runner's "
               "time does not" in a
               for a in asyn["provenance"]["assumptions"])


def test_offline_entrypoint_has_no_api_server_pace_or_request_delay():
    served = HostOverheads(HostConfig(**EXPLICIT))
    offline = HostOverheads(HostConfig(entrypoint="offline", **RUNNER))
    assert offline.request_overhead_s == 0.0 and offline.request_cpu_s(1000) == 0.0
    assert offline.tokenize_s(1000) == 0.0
    assert offline.engine_s(64, 64, 64) == served.engine_s(64, 64, 64)
    # The output processor's measured cost stays; the per-token streaming (measured, and the
    # fitted extra) goes.
    stream = HostConfig().host_speed * streaming_token_s("completions", HostConfig().cpu_costs)
    assert 0 < offline.frontend_s(64) == pytest.approx(
        served.frontend_s(64) - 64 * (3e-5 + stream))
    base = simulate(_cfg(host={**EXPLICIT, "request_overhead_s": 0.0}))
    off = simulate(_cfg(host={**RUNNER, "entrypoint": "offline"}))
    # One request: the engine sees it as soon as it is sent, without the API server's work.
    assert off["mean_api_server_ms"] == 0.0 < base["mean_api_server_ms"]
    assert off["mean_ttft_ms"] == pytest.approx(base["mean_ttft_ms"]
                                                - base["mean_api_server_ms"], rel=1e-9)
    assert any("offline (LLM class): no API server" in a
               for a in off["provenance"]["assumptions"])


def test_offline_entrypoint_with_a_constant_host_is_refused():
    with pytest.raises(Exception, match="entrypoint: offline has no effect"):
        _cfg(host={"model": "constant", "entrypoint": "offline"})


def test_constant_host_keeps_the_declared_overhead_and_no_request_delay():
    r = simulate(_cfg(host={"model": "constant"}))
    assert any("declared compute.roofline.step_overhead_s" in a
               for a in r["provenance"]["assumptions"])
    p = simulate(_cfg(host={"model": "constant"}, compute={"roofline": {"step_overhead_s": 0.0}}))
    assert r["mean_tpot_ms"] - p["mean_tpot_ms"] == pytest.approx(0.5, rel=1e-6)


def test_fitted_parameters_are_shipped_and_non_negative():
    params = fitted_parameters()
    assert set(params) == {"model_runner_step_s", "model_runner_per_seq_s",
                           "api_server_per_token_s", "request_overhead_s",
                           "api_server_per_request_s"}
    assert all(v >= 0 and math.isfinite(v) for v in params.values())


def test_metric_families_and_the_calibrated_range():
    assert metric_family("output_throughput") == "throughput"
    assert metric_family("p99_ttft_ms") == "ttft_p99"
    assert metric_family("p99.9_tpot_ms") == "tpot_p99"
    assert metric_family("p90_ttft_ms") == "ttft"      # below the tail percentile: the mean's
    assert metric_family("p99_itl_ms") == "itl_p99"
    assert metric_family("p90_itl_ms") == "tpot"       # ITL's mean and lower percentiles: TPOT's
    assert metric_family("mean_itl_ms") == "tpot"
    assert metric_family("p99_e2el_ms") == "e2e"
    assert metric_family("mean_itl_ms") == "tpot"
    assert metric_family("duration") == "e2e"
    assert metric_family("mean_kv_cache_usage") is None
    q = {"ttft": {"values": [-0.2, 0.0, 0.1, 0.3, 0.5]}}
    # Centre 0.1; distances 0, 0.1, 0.2, 0.3, 0.4; the ceil(6 x 0.8) = 5th is 0.4.
    assert conformal(q["ttft"]["values"]) == pytest.approx((0.1, 0.4))
    r = calibrated_range("mean_ttft_ms", 100.0, q, None)
    assert r == pytest.approx({"nominal": 100.0, "low": 100 * math.exp(-0.3),
                               "median": 100 * math.exp(0.1), "high": 100 * math.exp(0.5)})
    assert calibrated_range("mean_kv_cache_usage", 0.5, q, None) is None
    # More residuals: the 80% interval leaves the widest 20% out.
    c, w = conformal([0.01 * i for i in range(-50, 51)])
    assert c == pytest.approx(0.0) and w == pytest.approx(0.41)


def test_a_tail_takes_its_own_residuals():
    """A p99 TTFT's envelope is calibrated on the fit part's p99 residuals, not the mean's."""
    q = {"ttft": {"values": [-0.05, 0.0, 0.05]}, "ttft_p99": {"values": [-0.4, 0.1, 0.6]}}
    c, w = conformal(q["ttft_p99"]["values"])
    r = calibrated_range("p99_ttft_ms", 100.0, q, None)
    assert r["low"] == pytest.approx(100 * math.exp(c - w))
    assert r["high"] == pytest.approx(100 * math.exp(c + w))
    assert calibrated_range("mean_ttft_ms", 100.0, q, None)["high"] == pytest.approx(
        100 * math.exp(0.05))
    # The shipped fit has both tails, out of sample, at as many cases as print them
    shipped = fitted_residuals()
    for fam in ("ttft", "tpot", "itl"):
        tail = shipped[tail_family(fam)]
        assert tail["n"] >= 50 and len(tail["values"]) == tail["n"]
        assert tail["values"] != shipped["tpot" if fam == "itl" else fam]["values"]


def test_calibrated_envelope_of_a_kernel_profile_run():
    cfg = _cfg(compute={"kind": "calibrated"}, uncertainty={"method": "calibrated"},
               workload={"num_prompts": 20, "request_rate": 5,
                         "dataset": {"kind": "random", "input_len": 256, "output_len": 32}})
    r = simulate_with_envelope(cfg)
    env = r["envelope"]
    assert env["method"] == "calibrated" and env["runs"] == 1
    for key in ("output_throughput", "mean_ttft_ms", "mean_tpot_ms"):
        e = env["metrics"][key]
        assert e["low"] <= e["nominal"] <= e["high"] or e["low"] <= e["median"] <= e["high"]


def test_a_gpu_with_enough_fit_cases_takes_the_envelope_of_its_own_errors():
    """Group-conditional split conformal: a family's residuals of the run's GPU where its fit
    cases gave at least MIN_GPU_RESIDUALS, else every GPU's."""
    many = [0.01 * i for i in range(MIN_GPU_RESIDUALS)]            # 0 .. 0.19
    few = [0.5] * (MIN_GPU_RESIDUALS - 1)
    q = {"ttft": {"values": sorted(many + few + [-0.3]),
                  "by_gpu": {"H100-SXM": many, "A100-80GB": few, "H200": [-0.3]}}}
    assert residuals_for(q["ttft"], "H100-SXM") == (many, "H100-SXM")
    for gpu in ("A100-80GB", "H200", "B200", None):
        assert residuals_for(q["ttft"], gpu) == (q["ttft"]["values"], "all GPUs")
    own = calibrated_range("mean_ttft_ms", 100.0, q, None, "H100-SXM")
    c, w = conformal(many)
    assert own["low"] == pytest.approx(100 * math.exp(c - w))
    assert own["high"] == pytest.approx(100 * math.exp(c + w))
    assert calibrated_range("mean_ttft_ms", 100.0, q, None, "B200") == \
        calibrated_range("mean_ttft_ms", 100.0, q, None)
    # Residuals written without GPUs (an older fit) give every run the pooled interval.
    assert residuals_for({"values": many}, "H100-SXM") == (many, "all GPUs")


def test_the_shipped_residuals_by_gpu_are_the_pooled_ones_split_up():
    from simcore.host import fitted_cases, fitted_residuals

    for fam, q in fitted_residuals().items():
        by = q["by_gpu"]
        assert sorted(v for vs in by.values() for v in vs) == q["values"], fam
        assert sum(map(len, by.values())) == q["n"]
    # A100 and H100 have enough fit cases for throughput, TTFT and TPOT envelopes of their own.
    for fam in ("throughput", "ttft", "tpot"):
        q = fitted_residuals()[fam]
        assert {g for g, v in q["by_gpu"].items() if len(v) >= MIN_GPU_RESIDUALS} == \
            {"A100-80GB", "H100-SXM"}, fam
    assert len(fitted_cases()) == 71


def test_calibrated_envelope_says_whose_errors_it_took():
    from dse.summary import render_envelope

    w = {"num_prompts": 20, "request_rate": 5,
         "dataset": {"kind": "random", "input_len": 256, "output_len": 32}}
    runs = {gpu: simulate_with_envelope(_cfg(hardware={"gpu": gpu},
                                             compute={"kind": "calibrated"},
                                             uncertainty={"method": "calibrated"}, workload=w))
            for gpu in ("H100-SXM", "A100-80GB", "H200")}
    for gpu, r in runs.items():
        assert r["provenance"]["gpu"] == gpu
        env = r["envelope"]
        own = "all GPUs" if gpu == "H200" else gpu
        assert env["residuals_from"]["throughput"] == own
        assert env["residuals_from"]["e2e"] == "all GPUs"    # too few of any GPU's own
        text = " ".join(render_envelope(r))
        assert (f"its cases on {gpu}" in text) == (gpu != "H200"), text
        # the tails' own residuals, named as the table names them
        assert env["residuals_from"]["ttft_p99"] == own
        assert ("p99 TTFT" in text) == (gpu != "H200") and "ttft_p99" not in text
        assert ("p99 ITL" in text) == (gpu != "H200") and "p99 itl" not in text
    # The fit part's H100 errors are wider than its A100 ones, and so are the envelopes.
    width = {gpu: r["envelope"]["metrics"]["mean_ttft_ms"]["high"]
             / r["envelope"]["metrics"]["mean_ttft_ms"]["low"] for gpu, r in runs.items()}
    assert width["H100-SXM"] > width["A100-80GB"]


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_lock_step_group_waits_for_its_slowest_engine_core(async_scheduling):
    h = HostOverheads(HostConfig(**EXPLICIT), async_scheduling=async_scheduling)
    small = StepShape.from_requests([(1, 100)] * 4)
    big = StepShape.from_requests([(1, 100)] * 64 + [(512, 0)])
    dummy = StepShape.dummy()
    for gpu_s in (1e-4, 0.05):
        # One rank alone is the single-engine step; dummy batches cost no scheduling.
        assert h.group_total_s(gpu_s, [small, dummy]) == h.step_total_s(
            gpu_s, small.num_seqs, small.num_tokens, small.num_decode_seqs)
        assert h.group_total_s(gpu_s, [small, big]) == h.step_total_s(
            gpu_s, big.num_seqs, big.num_tokens, big.num_decode_seqs)


def test_expert_parallel_groups_take_the_host_model():
    cfg = {"name": "ep", "model": {"name": "mistralai/Mixtral-8x7B-v0.1"},
           "hardware": {"gpu": "H100-SXM"},
           "parallelism": {"tensor_parallel_size": 2, "data_parallel_size": 2,
                           "enable_expert_parallel": True},
           "workload": {"num_prompts": 20, "request_rate": 10,
                        "dataset": {"kind": "random", "input_len": 256, "output_len": 16}}}
    vllm = simulate(parse_config(cfg))
    constant = simulate(parse_config({**cfg, "host": {"model": "constant"}}))
    assert vllm["mean_api_server_ms"] > 0 == constant["mean_api_server_ms"]
    assert vllm["mean_tpot_ms"] > constant["mean_tpot_ms"]
    assert any("vLLM's scheduler and output processor as measured" in a
               for a in vllm["provenance"]["assumptions"])


def test_chat_requests_add_the_measured_chat_path_work_which_holds_the_server():
    """Eight chat requests sent at once to one server process, against the same completions
    requests: each does the chat path's measured extra work on the server, which they share, so
    each waits seven of them and its own path takes one more; vLLM 0.11.0's parse of the
    template on every request costs ~40 times the cached resolution."""
    w = {"num_prompts": 8, "request_rate": "inf",
         "dataset": {"kind": "random", "input_len": 256, "output_len": 4}}
    host = {**EXPLICIT, "request_overhead_s": 0.0}
    cached, every = (HostOverheads(HostConfig(**host, chat_template_parse=parse)).chat_request_s
                     for parse in ("cached", "per_request"))
    chat = _costs_json()
    ratio = (_cpu_costs(HostConfig().cpu_costs)["python_reference"]["start"]["method_calls_1e3_s"]
             / chat["python_reference"]["method_calls_1e3_s"])
    assert every == pytest.approx(0.4 * chat["chat_extra_s"]["per_request"] * ratio, rel=1e-12)
    assert 0 < cached < every / 20
    base = simulate(_cfg(host=host, workload=w))
    for parse, extra in (("cached", cached), ("per_request", every)):
        # The template's tokens left out (their tokenizing is tested apart): the path's work alone
        r = simulate(_cfg(host={**host, "chat_template_parse": parse},
                          model={"name": "meta-llama/Llama-3.1-8B", "chat_template_tokens": [0, 0]},
                          workload={**w, "endpoint": "chat_completions"}))
        assert r["mean_api_server_wait_ms"] - base["mean_api_server_wait_ms"] == pytest.approx(
            7 * extra * 1e3, rel=1e-9)
        assert r["mean_api_server_ms"] - base["mean_api_server_ms"] == pytest.approx(
            8 * extra * 1e3, rel=1e-9)
        assert any(line.startswith("chat requests: ") and f"{extra * 1e3:.2f} ms" in line
                   for line in r["provenance"]["assumptions"])


def _costs_json() -> dict:
    import json

    from simcore.host import CHAT_COSTS
    return json.loads(CHAT_COSTS.read_text(encoding="utf-8"))


def test_the_shipped_chat_costs_are_their_runs_chat_minus_completions():
    chat = _costs_json()
    for parse, version in (("per_request", "0.11.0"), ("cached", "0.33.0")):
        runs = chat["versions"][version]["runs"]
        diffs = [r["chat_request_cpu_ms"]["mean_ms"] - r["completions_request_cpu_ms"]["mean_ms"]
                 for r in runs]
        assert len(runs) == 2
        assert chat["chat_extra_s"][parse] * 1e3 == pytest.approx(sum(diffs) / 2, abs=1e-3)


def test_chat_settings_without_effect_are_refused():
    chat = {"num_prompts": 1, "endpoint": "chat_completions",
            "dataset": {"kind": "random", "input_len": 64, "output_len": 4}}
    with pytest.raises(Exception, match="workload.endpoint: chat_completions has no effect"):
        _cfg(host={"entrypoint": "offline"}, workload=chat)
    with pytest.raises(Exception, match="workload.endpoint: chat_completions has no effect"):
        _cfg(host={"model": "constant"}, workload=chat)
    with pytest.raises(Exception, match="host.chat_template_parse: per_request has no effect"):
        _cfg(host={"chat_template_parse": "per_request"})
    with pytest.raises(Exception, match="chat_template_parse has no effect without an API"):
        _cfg(host={"entrypoint": "offline", "chat_template_parse": "per_request"})
    # gpt-oss chats are rendered with harmony, not a Jinja template.
    oss = _cfg(model={"name": "openai/gpt-oss-20b", "dtype": "mxfp4"},
               host={"chat_template_parse": "per_request"}, workload=chat)
    with pytest.raises(Exception, match="rendered with harmony|renders with harmony"):
        simulate(oss)
    plain = simulate(_cfg(model={"name": "openai/gpt-oss-20b", "dtype": "mxfp4"},
                          workload=chat))
    assert any("rendered with harmony" in line for line in plain["provenance"]["assumptions"])


def _streaming_json() -> dict:
    import json

    from simcore.host import STREAMING_COSTS
    return json.loads(STREAMING_COSTS.read_text(encoding="utf-8"))


def test_streaming_each_token_costs_the_measured_generator_and_http_send():
    """Each sampled token costs the API server its endpoint's measured streaming work (the
    response generator and the HTTP send), scaled to the reference CPU and by host_speed, on top
    of the output processor's measured work and the fitted per-token extra; offline runs stream
    nothing."""
    data = _streaming_json()
    ratio = (_cpu_costs(HostConfig().cpu_costs)["python_reference"]["start"]["method_calls_1e3_s"]
             / data["python_reference"]["method_calls_1e3_s"])
    none = HostConfig(**{**EXPLICIT, "api_server_per_token_s": 0.0}, host_speed=0.5)
    cmpl = HostOverheads(none)
    chat = HostOverheads(none, endpoint="chat_completions")
    offline = HostOverheads(none.model_copy(update={"entrypoint": "offline"}))
    n = 256
    for h, endpoint in ((cmpl, "completions"), (chat, "chat_completions")):
        per_token = 0.5 * data["per_token_s"][endpoint] * ratio
        assert h.frontend_s(n) - offline.frontend_s(n) == pytest.approx(n * per_token,
                                                                         rel=1e-9)
        assert f"{per_token * 1e6:.1f} us/token measured" in h.assumption_lines()[0]
    assert chat.frontend_s(n) > cmpl.frontend_s(n) > offline.frontend_s(n)


def test_the_shipped_streaming_costs_are_their_measured_parts():
    """per_token_s is, per endpoint, the response generator's measured per-token CPU (streams
    interleaved as the engine's steps feed them, less the harness's own share) plus the HTTP
    layer's per-chunk CPU, as the file's runs record them."""
    data = _streaming_json()
    parts = data["parts_us"]
    for endpoint, key in (("completions", "cmpl"), ("chat_completions", "chat")):
        want = parts["generator"][key] + parts["http_send"]
        assert data["per_token_s"][endpoint] * 1e6 == pytest.approx(want, abs=1e-6)
        assert 1.0 < want < 100.0


def test_a_server_streaming_many_chat_tokens_paces_the_steps():
    """With no model-runner time, async scheduling (the engine core's scheduler hidden behind
    the GPU) and a host as fast as the measuring CPU, 1,024 streams take the API server longer
    per step than the GPU and the engine core: clients
    get their tokens at the server's pace, so chat responses (whose chunks cost more to build)
    stream slower than completions ones."""
    w = {"num_prompts": 1024, "request_rate": "inf",
         "dataset": {"kind": "random", "input_len": 64, "output_len": 64}}
    eng = {"max_num_seqs": 1024, "max_num_batched_tokens": 65536, "async_scheduling": True}
    host = {**EXPLICIT, "model_runner_step_s": 0.0, "model_runner_per_seq_s": 0.0,
            "api_server_per_token_s": 0.0, "request_overhead_s": 0.0,
            "api_server_per_request_s": 0.0, "host_speed": 1.0}
    cmpl = simulate(_cfg(host=host, workload=w, engine=eng))
    chat = simulate(_cfg(host=host, workload={**w, "endpoint": "chat_completions"},
                         engine=eng))
    assert chat["median_itl_ms"] > cmpl["median_itl_ms"]


def _jobs(server_class, jobs):
    """(env, server, ends): `server_class(env)` given each job (name, work, start) at its start;
    `ends[name]` is set when the job is done."""
    import simpy

    env = simpy.Environment()
    server = server_class(env)
    ends: dict[str, float] = {}

    def start(name: str, work_s: float, at_s: float):
        yield env.timeout(at_s)
        server.add(work_s, lambda end, name=name: ends.__setitem__(name, end))

    for name, work, at in jobs:
        env.process(start(name, work, at))
    return env, server, ends


def test_the_api_server_shares_its_cpu_among_the_requests_it_works_on():
    """Processor sharing, as vLLM's event loop runs request handlers a slice at a time: a job
    alone gets the whole CPU, two get half each, and a later arrival slows the earlier job."""
    from simcore.serve.api_server import SharedCpu

    env, cpu, ends = _jobs(SharedCpu, (("a", 1.0, 0.0), ("b", 1.0, 0.5), ("c", 0.25, 2.5),
                                       ("d", 0.25, 2.5)))
    env.run()
    # a: 0.5 alone, then its last 0.5 at half speed; b: 0.5 shared, its last 0.5 alone; c and
    # d: sent together, each at half speed, finish together.
    assert ends == pytest.approx({"a": 1.5, "b": 2.0, "c": 3.0, "d": 3.0}, abs=1e-12)
    assert len(cpu) == 0


def test_the_tokenizer_thread_takes_prompts_in_turn():
    """First come, first served, one prompt at a time: a prompt sent while the thread is busy
    starts when the ones before it are done; one sent to an idle thread starts at once."""
    from simcore.serve.api_server import TokenizerThread

    env, thread, ends = _jobs(TokenizerThread, (("a", 1.0, 0.0), ("b", 0.5, 0.25),
                                                ("c", 0.25, 0.25), ("d", 0.1, 3.0)))
    env.run(until=0.5)
    assert len(thread) == 3
    env.run()
    assert ends == pytest.approx({"a": 1.0, "b": 1.5, "c": 1.75, "d": 3.1}, abs=1e-12)
    assert len(thread) == 0


def test_the_shipped_measurement_shows_tokenizing_leaves_the_event_loop_its_cpu():
    """The premise of `TokenizerThread`: a pure-Python workload runs at full speed beside a
    thread tokenizing prompts (the measurement shipped with it), for every tokenizer and prompt
    length measured."""
    import json

    from simcore.host import CPU_COSTS_DIR

    data = json.loads((CPU_COSTS_DIR / "tokenizer_thread.json").read_text())
    rows = [row for run in data["runs"] for row in run["lengths"]]
    assert len(rows) >= 6 and {r["prompt_tokens"] > 8000 for r in rows} == {True, False}
    for row in rows:
        assert row["workload_slowdown"] < 1.05
        # ... while the tokenizer itself waits for the GIL (not modelled, documented).
        assert row["tokenize_rate_beside_per_s"] < row["tokenize_rate_alone_per_s"]


def test_the_simulated_server_path_at_no_load_is_no_shorter_than_vllms_measured_one():
    """vLLM 0.11's own server, one chat request at a time (`api_server_burst.json`,
    `sequential`), adds the client's TTFT minus the stand-in engine's first step to a request;
    the simulator's API server time for such a request at the fitted defaults is at least that
    measured path at the declared host speed (so a shortfall of simulated TTFT at low load is
    not in the server's path: documented in simcore/data/cpu_costs/README.md)."""
    import json

    from simcore.host import CPU_COSTS_DIR

    seq = json.loads((CPU_COSTS_DIR / "api_server_burst.json").read_text())["sequential"]
    o = seq["options"]
    assert o["max_concurrency"] == 1 and len(seq["client_ttfts_s"]) == o["num_prompts"]
    path_s = seq["client"]["mean_ttft_ms"] / 1e3 - seq["engine_first_step_s"]
    assert 0.015 < path_s < 0.040
    r = simulate(_cfg(model={"name": "Qwen/Qwen3-8B"}, host={"model": "vllm"},
                      workload={"num_prompts": 8, "max_concurrency": 1, "request_rate": "inf",
                                "endpoint": "chat_completions",
                                "dataset": {"kind": "random", "input_len": o["input_len"],
                                            "output_len": o["output_len"]}}))
    assert r["mean_api_server_ms"] / 1e3 > HostConfig().host_speed * path_s


def test_a_faster_host_takes_less_of_every_cpu_cost_the_fitted_ones_too():
    from simcore.host import fitted_host_speed

    assert fitted_host_speed() == HostConfig().host_speed == 0.4
    base = HostOverheads(HostConfig())
    fast = HostOverheads(HostConfig(host_speed=0.2))
    p = fitted_parameters()
    # At the fit's own host speed the parameters are the fitted values exactly.
    assert base.runner_s(10) == p["model_runner_step_s"] + 10 * p["model_runner_per_seq_s"]
    assert base.request_overhead_s == p["request_overhead_s"]
    # Twice as fast: half of every part, measured or fitted.
    n = 48
    assert fast.runner_s(n) == pytest.approx(base.runner_s(n) / 2, rel=1e-12)
    assert fast.engine_s(n, n + 512, n - 1) == pytest.approx(
        base.engine_s(n, n + 512, n - 1) / 2, rel=1e-12)
    assert fast.frontend_s(n) == pytest.approx(base.frontend_s(n) / 2, rel=1e-12)
    assert fast.request_cpu_s(700) == pytest.approx(base.request_cpu_s(700) / 2, rel=1e-12)
    assert fast.tokenize_s(700) == pytest.approx(base.tokenize_s(700) / 2, rel=1e-12)
    assert fast.request_overhead_s == pytest.approx(base.request_overhead_s / 2, rel=1e-12)
    assert fast.chat_request_s == pytest.approx(base.chat_request_s / 2, rel=1e-12)
    # A figure the config gives is the deployment's own: not scaled.
    own = HostOverheads(HostConfig(host_speed=0.2, model_runner_per_seq_s=3e-5))
    assert own.runner_s(n) - own.runner_s(0) == pytest.approx(n * 3e-5, rel=1e-12)
