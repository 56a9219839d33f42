"""The serving loop on the virtual clock: exact timestamps and metrics of hand-computed micro-scenarios.

Step times are binary fractions (1/64 s, or a + b * num_tokens with power-of-two a and b), so
every virtual timestamp below is exact and the expected values are worked out step by step in
the comments.
"""

import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from simcore.compute.base import StepShape, StepTime
from simcore.engine.scheduler import SchedulerConfig
from simcore.metrics import engine_summary, summarize
from simcore.serve import run_serving
from simcore.workload.spec import RequestSpec

S = 1 / 64
"""Constant step time of the default stub model, seconds."""


class LinearStep:
    """Stub step model: `a_s + b_s * num_tokens` seconds per step, all of it compute."""

    profile_id = "stub/linear"
    calibrated = False
    relative_uncertainty = 0.0

    def __init__(self, a_s: float, b_s: float = 0.0) -> None:
        self.a_s = a_s
        self.b_s = b_s
        self.shapes: list[StepShape] = []

    def step_time(self, shape: StepShape) -> StepTime:
        self.shapes.append(shape)
        t = self.a_s + self.b_s * shape.num_tokens
        return StepTime(total_s=t, compute_s=t, comm_s=0.0, bound="compute")


def approx(x):
    return pytest.approx(x, rel=1e-12, abs=1e-15)


def serve(specs, *, step=None, num_replicas=1, policy="round_robin", report_interval_s=4 * S,
          balance_threshold=16, max_concurrency=None, max_model_len=4096, request_timeout_s=None,
          scheduling_policy="fcfs", router_options=None, **sched):
    base = dict(max_num_seqs=8, max_num_batched_tokens=2048, num_blocks=1000, block_size=16,
                max_model_len=max_model_len, policy=scheduling_policy)
    base.update(sched)
    return run_serving(list(specs), sched_config=SchedulerConfig(**base),
                       num_replicas=num_replicas, step_model=step or LinearStep(S),
                       router_policy=policy, report_interval_s=report_interval_s,
                       balance_threshold=balance_threshold, max_concurrency=max_concurrency,
                       max_model_len=max_model_len, sample_interval_s=1.0,
                       request_timeout_s=request_timeout_s, router_options=router_options)


def spec(rid, arrival_s, prompt_len, output_len, keys=()):
    return RequestSpec(request_id=rid, arrival_s=arrival_s, prompt_len=prompt_len,
                       output_len=output_len, block_keys=tuple(keys))


def by_id(run):
    return {r.request_id: r for r in run.records}


def ttft(r):
    return r.token_times_s[0] - r.send_s


def e2el(r):
    return r.token_times_s[-1] - r.send_s


def tpot(r):
    return (e2el(r) - ttft(r)) / (len(r.token_times_s) - 1)


# -- a single request -------------------------------------------------------------------------


def test_single_request_prefill_then_one_token_per_step():
    # Step 1 [0, S]: the 100-token prompt, first token at S; steps 2-4: one token each.
    run = serve([spec("a", 0.0, 100, 4)])
    (a,) = run.records
    assert a.success and a.error is None
    assert a.send_s == 0.0 and a.first_scheduled_s == 0.0 and a.replica == 0
    assert a.token_times_s == [approx(S), approx(2 * S), approx(3 * S), approx(4 * S)]
    assert run.end_s == approx(4 * S)
    st = run.replicas[0]
    assert (st.num_steps, st.num_prefill_tokens, st.num_decode_tokens) == (4, 100, 3)
    assert st.busy_s == approx(4 * S)
    assert st.steps_by_bound == {"compute": 4}

    m = summarize(run.records, selected_percentiles=[50, 99])
    assert m["duration"] == approx(4 * S)
    assert (m["completed"], m["failed"]) == (1, 0)
    assert (m["total_input_tokens"], m["total_output_tokens"]) == (100, 4)
    assert m["request_throughput"] == approx(16.0)          # 1 request in 1/16 s
    assert m["output_throughput"] == approx(64.0)
    assert m["total_token_throughput"] == approx(104 * 16.0)
    assert m["mean_ttft_ms"] == approx(S * 1e3)
    assert m["mean_tpot_ms"] == approx(S * 1e3)
    assert m["mean_itl_ms"] == approx(S * 1e3)
    assert m["std_itl_ms"] == approx(0.0)
    assert m["mean_e2el_ms"] == approx(4 * S * 1e3)
    assert m["p99_e2el_ms"] == approx(4 * S * 1e3)
    assert m["max_output_tokens_per_s"] == 4.0
    assert m["max_concurrent_requests"] == 1


def test_step_time_grows_with_tokens():
    # a = 1/128 s, b = 1/16384 s per token. Prefill of 128 tokens: 1/128 + 1/128 = 1/64 s;
    # each decode step: 1/128 + 1/16384 = 129/16384 s.
    u = 1 / 16384
    run = serve([spec("a", 0.0, 128, 3)], step=LinearStep(128 * u, u))
    (a,) = run.records
    assert a.token_times_s == [approx(256 * u), approx(385 * u), approx(514 * u)]
    assert ttft(a) == approx(256 * u)
    assert tpot(a) == approx(129 * u)


# -- a second request joins the batch mid-prefill ---------------------------------------------


def test_second_request_arrives_mid_prefill_and_joins_next_step():
    # Token budget 64, step time 128u + u * num_tokens with u = 1/16384 s.
    #   step 1 [0, 192u]:      a 64 tokens (of 100); b arrives at 64u, mid-step.
    #   step 2 [192u, 376u]:   a 36 (prompt done, token) + b 20 (whole prompt, token) = 56 tokens
    #   step 3 [376u, 506u]:   a 1 + b 1 (b's 2nd and last token)
    #   step 4 [506u, 635u]:   a 1 (a's 3rd and last token)
    u = 1 / 16384
    model = LinearStep(128 * u, u)
    run = serve([spec("a", 0.0, 100, 3), spec("b", 64 * u, 20, 2)], step=model,
                max_num_batched_tokens=64)
    assert [s.num_tokens for s in model.shapes] == [64, 56, 2, 1]
    assert [s.num_decode_seqs for s in model.shapes] == [0, 0, 2, 1]
    r = by_id(run)
    a, b = r["a"], r["b"]
    assert a.token_times_s == [approx(376 * u), approx(506 * u), approx(635 * u)]
    assert b.send_s == approx(64 * u)
    assert b.first_scheduled_s == approx(192 * u)
    assert b.token_times_s == [approx(376 * u), approx(506 * u)]
    assert (ttft(a), tpot(a), e2el(a)) == (approx(376 * u), approx(129.5 * u), approx(635 * u))
    assert (ttft(b), tpot(b), e2el(b)) == (approx(312 * u), approx(130 * u), approx(442 * u))

    m = summarize(run.records, selected_percentiles=[50])
    ms = u * 1e3
    assert m["duration"] == approx(635 * u)
    assert m["mean_ttft_ms"] == approx(344 * ms)
    assert m["median_ttft_ms"] == approx(344 * ms)
    assert m["std_ttft_ms"] == approx(32 * ms)
    assert m["mean_tpot_ms"] == approx(129.75 * ms)
    # ITL pooled over both requests: a 130u, 129u; b 130u.
    assert m["mean_itl_ms"] == approx(389 / 3 * ms)
    assert m["median_itl_ms"] == approx(130 * ms)
    assert m["mean_e2el_ms"] == approx(538.5 * ms)
    e = engine_summary(run.records, selected_percentiles=[50])
    assert e["mean_queue_ms"] == approx(64 * ms)      # a: 0, b: 192u - 64u


# -- chunked prefill -------------------------------------------------------------------------


def test_chunked_prefill_ttft_is_number_of_chunks_times_step():
    # 1000 prompt tokens under a 256-token budget: 256, 256, 256, 232 -> first token after 4 steps.
    model = LinearStep(S)
    run = serve([spec("a", 0.0, 1000, 3)], step=model, max_num_batched_tokens=256)
    (a,) = run.records
    assert [s.num_tokens for s in model.shapes] == [256, 256, 256, 232, 1, 1]
    assert ttft(a) == approx(4 * S)
    assert a.token_times_s == [approx(4 * S), approx(5 * S), approx(6 * S)]
    assert tpot(a) == approx(S)
    m = summarize(run.records)
    assert m["mean_ttft_ms"] == approx(4 * S * 1e3)
    assert m["mean_e2el_ms"] == approx(6 * S * 1e3)


# -- client-side max concurrency ----------------------------------------------------------------


def test_max_concurrency_holds_back_the_second_request():
    # a: tokens at S, 2S, 3S. b arrives at S/4 but waits in the client until a completes at 3S,
    # then prefills in [3S, 4S] and decodes in [4S, 5S].
    run = serve([spec("a", 0.0, 100, 3), spec("b", S / 4, 100, 2)], max_concurrency=1)
    r = by_id(run)
    a, b = r["a"], r["b"]
    assert a.token_times_s == [approx(S), approx(2 * S), approx(3 * S)]
    assert b.arrival_s == approx(S / 4)
    assert b.send_s == a.token_times_s[-1]
    assert b.first_scheduled_s == approx(3 * S)
    assert b.token_times_s == [approx(4 * S), approx(5 * S)]
    # TTFT and E2EL start at the send, not the arrival.
    assert (ttft(b), e2el(b)) == (approx(S), approx(2 * S))

    m = summarize(run.records, max_concurrency=1, request_rate=4.0, selected_percentiles=[50])
    ms = S * 1e3
    assert m["max_concurrency"] == 1
    assert m["mean_ttft_ms"] == approx(ms)
    assert m["mean_e2el_ms"] == approx(2.5 * ms)          # a 3S, b 2S
    assert m["mean_client_queue_time_ms"] == approx(1.375 * ms)   # a 0, b 3S - S/4
    assert m["mean_e2el_including_client_queue_ms"] == approx((3 + 4.75) / 2 * ms)
    assert m["duration"] == approx(5 * S)
    assert m["max_concurrent_requests"] == 2         # both in flight within the first second
    e = engine_summary(run.records)
    assert e["mean_queue_ms"] == approx(0.0)


def test_max_concurrency_one_serialises_every_request():
    specs = [spec(f"r{i}", 0.0, 16, 2) for i in range(4)]
    run = serve(specs, max_concurrency=1)
    for i, rec in enumerate(run.records):
        assert rec.send_s == approx(2 * i * S)
        assert rec.token_times_s == [approx((2 * i + 1) * S), approx((2 * i + 2) * S)]
    assert run.replicas[0].max_num_running == 1


# -- refusal above max_model_len ---------------------------------------------------------------


def test_request_longer_than_max_model_len_fails_at_once():
    run = serve([spec("ok", 0.0, 100, 20), spec("long", S / 2, 120, 20)], max_model_len=128)
    r = by_id(run)
    ok, long = r["ok"], r["long"]
    assert ok.success and len(ok.token_times_s) == 20
    assert not long.success
    assert long.error == "prompt (120) + output (20) tokens exceed max_model_len (128)"
    assert long.send_s == approx(S / 2)
    assert long.token_times_s == [] and long.first_scheduled_s is None and long.replica is None
    m = summarize(run.records)
    assert (m["completed"], m["failed"], m["num_prompts"]) == (1, 1, 2)
    assert m["total_input_tokens"] == 100 and m["total_output_tokens"] == 20
    assert m["duration"] == approx(20 * S)
    e = engine_summary(run.records)
    assert e["num_failed_by_error"] == {long.error: 1}
    assert e["num_prompt_tokens_scheduled"] == 100


def test_prompt_plus_output_equal_to_max_model_len_is_served():
    run = serve([spec("edge", 0.0, 100, 28)], max_model_len=128)
    (rec,) = run.records
    assert rec.success and len(rec.token_times_s) == 28


def test_only_failed_requests_still_end():
    run = serve([spec("x", 0.0, 200, 1), spec("y", S, 300, 1)], max_model_len=128)
    assert [r.success for r in run.records] == [False, False]
    m = summarize(run.records)
    assert (m["completed"], m["failed"]) == (0, 2)
    assert m["duration"] == approx(S)


# -- client timeouts ---------------------------------------------------------------------------


def test_a_request_past_the_client_timeout_is_aborted_and_failed():
    # a would take 50 steps; the client gives up at 10.5 S, during its 11th step. b finishes at
    # 2 S; c, sent at 11 S, runs alone in the blocks a freed: tokens at 12, 13, 14 S.
    run = serve([spec("a", 0.0, 100, 50), spec("b", 0.0, 16, 2), spec("c", 11 * S, 16, 3)],
                request_timeout_s=10.5 * S)
    r = by_id(run)
    a, b, c = r["a"], r["b"], r["c"]
    assert not a.success and a.finished_s == approx(10.5 * S)
    assert a.error == f"client timed out after {10.5 * S:g} s (workload.request_timeout_s)"
    assert len(a.token_times_s) == 10          # what it streamed before; none counts
    assert b.success and c.success and c.token_times_s == [approx(12 * S), approx(13 * S),
                                                           approx(14 * S)]
    sched = run.schedulers[0]
    assert not sched.has_requests and sched.kv.num_free_blocks == 999
    m = summarize(run.records, selected_percentiles=[50])
    assert (m["completed"], m["failed"]) == (2, 1)
    assert m["total_input_tokens"] == 32 and m["total_output_tokens"] == 5
    assert m["mean_e2el_ms"] == approx((2 * S + 3 * S) / 2 * 1e3)
    assert m["duration"] == approx(14 * S)
    assert engine_summary(run.records)["num_failed_by_error"] == {a.error: 1}


def test_a_timed_out_waiting_request_leaves_the_queue_and_frees_a_client_slot():
    # One sequence at a time, urgent first; --max-concurrency 2. u1 runs [0, 2 S]; u2, sent when
    # u1 completes, [2 S, 4 S]; low waits behind them and is given up at 3.5 S without ever
    # running; last is sent as soon as low's slot frees, and runs after u2.
    low = RequestSpec("low", 0.0, 16, 2, priority=5)
    u1, u2 = RequestSpec("u1", 0.0, 16, 2), RequestSpec("u2", S, 16, 2)
    last = RequestSpec("last", S, 16, 2)
    run = serve([low, u1, u2, last], max_num_seqs=1, max_concurrency=2,
                scheduling_policy="priority", request_timeout_s=3.5 * S)
    r = by_id(run)
    assert not r["low"].success and r["low"].first_scheduled_s is None
    assert r["low"].token_times_s == [] and r["low"].finished_s == approx(3.5 * S)
    assert r["u2"].send_s == approx(2 * S) and r["last"].send_s == approx(3.5 * S)
    assert r["u1"].success and r["u2"].success and r["last"].success
    assert r["last"].first_scheduled_s == approx(4 * S)


def test_requests_finished_within_the_timeout_are_untouched():
    specs = [spec("a", 0.0, 100, 5), spec("b", S, 30, 4)]
    plain, timed = serve(specs), serve(specs, request_timeout_s=5.5 * S)
    assert [x.token_times_s for x in plain.records] == [x.token_times_s for x in timed.records]
    assert all(x.success for x in timed.records)


# -- routing over replicas -----------------------------------------------------------------------


def test_round_robin_alternates_replicas():
    specs = [spec(f"r{i}", 0.0, 32, 2) for i in range(5)]
    run = serve(specs, num_replicas=2, policy="round_robin")
    assert [r.replica for r in run.records] == [0, 1, 0, 1, 0]
    assert [s.num_prefill_tokens for s in run.replicas] == [96, 64]
    assert [s.num_steps for s in run.replicas] == [2, 2]
    # Replicas run in parallel: everybody's first token after one step.
    assert all(ttft(r) == approx(S) for r in run.records)


def test_least_outstanding_routes_on_stale_reports():
    # Reports at 0, 4S, 8S, ... At 0 (after a was routed) replica 0 reports load 1, replica 1 load
    # 0. b, c, d arrive before the next report, so the router still sees [1, 0] and sends all three
    # to replica 1 (fresh loads would have split them). At 4S it sees [1, 3] and e goes to 0.
    specs = [spec("a", 0.0, 32, 40), spec("b", S / 2, 32, 40), spec("c", S, 32, 40),
             spec("d", 1.5 * S, 32, 40), spec("e", 4.5 * S, 32, 2)]
    run = serve(specs, num_replicas=2, policy="least_outstanding")
    assert [r.replica for r in run.records] == [0, 1, 1, 1, 0]
    assert [s.max_num_running for s in run.replicas] == [2, 3]


def test_least_outstanding_counts_waiting_requests():
    # Token budget 64. At t = 0 five requests are dealt in turn (no report yet): r0, r2, r4 -> 0,
    # r1, r3 -> 1. On replica 0 the 1280-token prompt of r0 takes the whole budget, so r2 and r4
    # wait: the report at 0 says [1 running + 2 waiting, 2 running] = [3, 2], and x goes to 1.
    specs = [spec("r0", 0.0, 1280, 2)] + [spec(f"r{i}", 0.0, 16, 40) for i in range(1, 5)]
    specs.append(spec("x", S / 2, 16, 2))
    run = serve(specs, num_replicas=2, policy="least_outstanding", max_num_batched_tokens=64)
    assert [r.replica for r in run.records] == [0, 1, 0, 1, 0, 1]
    assert run.replicas[0].max_num_waiting == 2


def test_prefix_affinity_keeps_a_prefix_on_its_replica_and_hits_the_cache():
    # a (no shared blocks) -> 0. b (keys 10, 11, 12) arrives while the report says [1, 0] -> 1.
    # d has b's keys and arrives at 21S (report at 20S: [0, 0]); least loaded would be replica 0,
    # but b's prefix lives on replica 1, and there d finds b's three full prompt blocks cached.
    keys = (10, 11, 12)
    specs = [spec("a", 0.0, 64, 2), spec("b", S / 4, 64, 2, keys), spec("d", 21 * S, 64, 2, keys)]
    run = serve(specs, num_replicas=2, policy="prefix_affinity")
    r = by_id(run)
    assert [x.replica for x in run.records] == [0, 1, 1]
    assert run.num_routed_by_prefix == 1
    assert r["d"].num_cached_prompt_tokens == 48
    assert r["a"].num_cached_prompt_tokens == 0 and r["b"].num_cached_prompt_tokens == 0
    e = engine_summary(run.records)
    assert e["num_cached_prompt_tokens"] == 48
    assert e["prefix_cache_hit_rate"] == approx(48 / 192)
    # d prefilled only 64 - 48 = 16 tokens.
    assert run.replicas[1].num_prefill_tokens == 64 + 16

    # The same requests in turn: d lands on replica 0, whose cache has nothing of b's.
    rr = serve(specs, num_replicas=2, policy="round_robin")
    assert [x.replica for x in rr.records] == [0, 1, 0]
    assert by_id(rr)["d"].num_cached_prompt_tokens == 0
    assert rr.num_routed_by_prefix == 0


def test_prefix_affinity_gives_way_to_balance():
    # With balance_threshold 0 the owner must not be more loaded than the least loaded replica.
    keys = (10, 11, 12)
    specs = [spec("b", 0.0, 64, 40, keys), spec("x", S / 2, 64, 40),
             spec("d", 4.5 * S, 64, 2, keys)]
    run = serve(specs, num_replicas=2, policy="prefix_affinity", balance_threshold=0)
    # b -> 0; x -> 1 (report [1, 0]); at 4S the report is [1, 1]: d may follow its prefix to 0.
    assert [x.replica for x in run.records] == [0, 1, 0]
    specs = [spec("b", 0.0, 64, 40, keys), spec("d", 4.5 * S, 64, 2, keys)]
    run = serve(specs, num_replicas=2, policy="prefix_affinity", balance_threshold=0)
    # Report at 4S: [1, 0]; the owner is 1 request busier, above the threshold: d goes to 1.
    assert [x.replica for x in run.records] == [0, 1]
    assert run.num_routed_by_prefix == 0
    run = serve(specs, num_replicas=2, policy="prefix_affinity", balance_threshold=1)
    assert [x.replica for x in run.records] == [0, 0]
    assert run.num_routed_by_prefix == 1


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.sampled_from([0, 1, 8, 16, 24, 40, 80]),
                          st.integers(0, 3),
                          st.lists(st.integers(0, 3), min_size=3, max_size=3), st.booleans()),
                min_size=1, max_size=25),
       st.integers(0, 2))
@example([(0, 8, 0, [0, 0, 0], False), (0, 24, 0, [0, 0, 0], True),
          (0, 40, 1, [1, 0, 0], False)], 1)
def test_prefix_affinity_routes_as_a_block_by_block_index(prompts, threshold):
    # The router's owner index (an array by block id, prompts hashed run by run) routes each
    # prompt where an index of every block's last replica, walked block by block, would:
    # prompts share the leading blocks of one of a few bases (Mooncake's conversations) and
    # diverge, under random load reports. Some blocks are hashed by an engine, not the router
    # (a conversation's replies), so they are known to the hash space but sent nowhere.
    from simcore.engine.request import BlockHashSpace
    from simcore.router import Router

    bases = [[b * 1000 + k for k in range(80)] for b in range(3)]
    router = Router("prefix_affinity", 3, space=BlockHashSpace(), balance_threshold=threshold)
    owner: dict[tuple[int, ...], int] = {}          # the reference: prefix -> replica
    for base, shared, tail, loads, by_engine in prompts:
        keys = tuple(bases[base][:shared]) + tuple(7_000_000 + base * 10 + t for t in range(tail))
        if by_engine:
            router.space.chain(keys)
            continue
        router.publish_all(list(loads))
        least = sorted(range(3), key=lambda r: (loads[r], (r - router._next) % 3))[0]
        best = -1
        for j in range(1, len(keys) + 1):
            if keys[:j] not in owner:
                break
            best = owner[keys[:j]]
        want = best if best >= 0 and loads[best] - loads[least] <= threshold else least
        assert router.route(keys) == want
        for j in range(1, len(keys) + 1):
            owner[keys[:j]] = want


def test_cache_aware_follows_a_prefix_on_its_own_in_flight_count():
    # a -> 0 (no match; loads [0, 0]: the first). b shares a's four blocks, all of its prompt:
    # it follows a to 0 though 0 has a request in flight ([1, 0]: balanced under 64 and 1.5).
    # c matches nothing -> the least loaded, 1. By 20S every request has completed, so the
    # router's count is [0, 0] again and e (no match) goes to the first, 0.
    keys = (1, 2, 3, 4)
    specs = [spec("a", 0.0, 64, 8, keys), spec("b", S / 4, 64, 2, keys), spec("c", S / 2, 64, 2),
             spec("e", 20 * S, 64, 2)]
    run = serve(specs, num_replicas=2, policy="cache_aware")
    assert [x.replica for x in run.records] == [0, 0, 1, 0]
    assert run.num_routed_by_prefix == 1
    assert by_id(run)["b"].num_cached_prompt_tokens == 48    # its last block is recomputed
    # Any gap is an imbalance with thresholds 0 and 1: b goes to the idle replica instead.
    tight = serve(specs, num_replicas=2, policy="cache_aware",
                  router_options={"balance_abs_threshold": 0, "balance_rel_threshold": 1.0})
    assert [x.replica for x in tight.records] == [0, 1, 0, 0]
    assert tight.num_routed_by_prefix == 0


def test_cache_aware_matches_the_client_prompt_not_the_chat_template():
    """Every chat request starts with the template's blocks. prefix_affinity follows them to the
    replica sent them last (up to its balance threshold); cache_aware, which matches the
    request's own text as vLLM's router does, spreads the requests."""
    from simcore.engine.request import BlockHashSpace
    from simcore.router import Router

    template = (900, 901)
    prompts = [template + (100 * i, 100 * i + 1, 100 * i + 2) for i in range(6)]
    aware = Router("cache_aware", 3, space=BlockHashSpace(), block_size=16)
    assert [aware.route(k, 48, 2) for k in prompts] == [0, 1, 2, 0, 1, 2]
    assert aware.in_flight == [2, 2, 2] and aware.num_prefix_routed == 0
    affinity = Router("prefix_affinity", 3, space=BlockHashSpace())
    assert [affinity.route(k) for k in prompts] == [0, 0, 0, 0, 0, 0]
    # Two of three own blocks of prompt 1 (32 of its 48 tokens, above 0.3) follow it to 1; one
    # of four (16 of 64, below) goes to the least loaded, which the release made replica 2.
    aware.release(2)
    assert aware.route(template + (100, 101, 7), 48, 2) == 1
    assert aware.route(template + (100, 8, 9, 10), 64, 2) == 2
    assert aware.num_prefix_routed == 1


def test_engines_report_loads_only_to_a_router_that_reads_them(monkeypatch):
    from simcore.engine.request import BlockHashSpace
    from simcore.router import Router
    from simcore.serve.frontend import Frontend

    reads = {p: Router(p, 2, space=BlockHashSpace()).reads_reports
             for p in ("round_robin", "least_outstanding", "prefix_affinity", "cache_aware")}
    assert reads == {"round_robin": False, "least_outstanding": True, "prefix_affinity": True,
                     "cache_aware": False}
    assert not Router("least_outstanding", 1, space=BlockHashSpace()).reads_reports
    started = []
    reporter = Frontend.reporter

    def counting(self, interval_s):
        started.append(self.router.policy)
        return reporter(self, interval_s)

    monkeypatch.setattr(Frontend, "reporter", counting)
    specs = [spec(f"r{i}", i * S / 3, 64, 6) for i in range(6)]
    for policy in reads:
        serve(specs, num_replicas=3, policy=policy)
    assert started == ["least_outstanding", "prefix_affinity"]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.sampled_from([0, 1, 8, 16, 24, 40]),
                          st.integers(0, 3), st.integers(0, 40),
                          st.lists(st.integers(0, 80), min_size=3, max_size=3)),
                min_size=1, max_size=25),
       st.sampled_from([0.0, 0.3, 0.5, 0.9]), st.sampled_from([(0, 1.0), (4, 1.5), (64, 1.5)]))
def test_cache_aware_routes_as_vllm_router_decides(prompts, threshold, balance):
    # Against a direct transcription of the policy: a dict of every prefix sent, the one sent
    # it last; loads set as the router's count before each request.
    from simcore.engine.request import BlockHashSpace
    from simcore.router import Router

    bs = 16
    bases = [[b * 1000 + k for k in range(80)] for b in range(3)]
    router = Router("cache_aware", 3, space=BlockHashSpace(), block_size=bs,
                    cache_threshold=threshold, balance_abs_threshold=balance[0],
                    balance_rel_threshold=balance[1])
    owner: dict[tuple[int, ...], int] = {}
    for base, shared, tail, extra, loads in prompts:
        keys = tuple(bases[base][:shared]) + tuple(7_000_000 + base * 10 + t for t in range(tail))
        prompt_len = len(keys) * bs + extra
        router.in_flight[:] = loads
        low, high = min(loads), max(loads)
        want = loads.index(low)
        if not (high - low > balance[0] and high > low * balance[1]):
            matched = 0
            for j in range(1, len(keys) + 1):
                if keys[:j] not in owner:
                    break
                matched = j
            if prompt_len and matched * bs > threshold * prompt_len:
                want = owner[keys[:matched]]
        assert router.route(keys, prompt_len) == want
        assert router.in_flight[want] == loads[want] + 1
        for j in range(1, len(keys) + 1):
            owner[keys[:j]] = want


# -- the whole loop ------------------------------------------------------------------------------


def test_no_requests_ends_at_time_zero():
    run = serve([])
    assert run.records == [] and run.end_s == 0.0


def test_records_obey_their_invariants_under_preemption():
    # A pool of 20 usable blocks for 6 requests of up to 80 tokens: preemption must happen, and
    # every request still completes with its full output, tokens in order, after its send.
    specs = [spec(f"r{i}", i * S / 3, 48, 32) for i in range(6)]
    run = serve(specs, num_blocks=21, max_model_len=128)
    assert sum(s.num_preemptions for s in run.replicas) > 0
    assert sum(r.num_preemptions for r in run.records) == sum(s.num_preemptions
                                                               for s in run.replicas)
    for r in run.records:
        assert r.success
        assert len(r.token_times_s) == r.output_len
        assert r.token_times_s == sorted(r.token_times_s)
        assert r.token_times_s[0] > r.send_s
        assert len(set(r.token_times_s)) == len(r.token_times_s)
    assert run.end_s == max(r.token_times_s[-1] for r in run.records)
    assert not math.isnan(summarize(run.records)["mean_itl_ms"])
