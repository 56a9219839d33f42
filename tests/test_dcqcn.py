"""DCQCN reaction and notification points alone: the closed-form rate sequence that the reaction
point's rules (Zhu et al., SIGCOMM 2015, section 3.3) give after one cut, exact timer instants, alpha decay, the Mellanox cut interval, counters and bounds, and
property tests over random interleavings of CNPs, bytes and clock advances."""

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simcore.errors import ConfigError
from simcore.fabric.dcqcn import (DEFAULT_CNP_INTERVAL_S, DcqcnParams, IncreaseStage,
                                  NotificationPoint, ReactionPoint)

FR, AI, HYPER = IncreaseStage.FAST_RECOVERY, IncreaseStage.ADDITIVE, IncreaseStage.HYPER
G = 1 / 256


def just_before(t: float) -> float:
    return math.nextafter(t, -math.inf)


def timer_only(params: DcqcnParams) -> DcqcnParams:
    return replace(params, byte_counter_bytes=None)


# ---------------------------------------------------------------- parameters


def test_paper_values_and_their_scaling_with_line_rate():
    p = DcqcnParams.paper(40e9)
    assert (p.g, p.alpha_timer_s, p.increase_timer_s) == (G, 55e-6, 55e-6)
    assert (p.byte_counter_bytes, p.fast_recovery_steps) == (10_000_000, 5)
    assert (p.rate_ai_bps, p.rate_hai_bps) == (40e6, 200e6)
    assert p.rate_decrease_min_interval_s == 0 and p.clamp_target_rate_on_cut
    q = DcqcnParams.paper(100e9)
    assert (q.rate_ai_bps, q.rate_hai_bps) == (100e6, 500e6)
    assert q.byte_counter_bytes == 25_000_000
    assert q.min_rate_bps == 100e6
    assert (q.alpha_timer_s, q.increase_timer_s, q.fast_recovery_steps) == (55e-6, 55e-6, 5)


def test_mellanox_values_and_their_scaling_with_line_rate():
    p = DcqcnParams.mellanox(25e9)
    assert (p.alpha_timer_s, p.rate_decrease_min_interval_s, p.increase_timer_s) == (
        1e-6, 4e-6, 300e-6)
    assert (p.fast_recovery_steps, p.rate_ai_bps, p.rate_hai_bps) == (1, 5e6, 50e6)
    assert p.byte_counter_bytes is None and not p.clamp_target_rate_on_cut and p.g == G
    q = DcqcnParams.mellanox(100e9)
    assert (q.rate_ai_bps, q.rate_hai_bps, q.min_rate_bps) == (20e6, 200e6, 100e6)


@pytest.mark.parametrize("field, value", [
    ("g", 0.0), ("g", 1.5), ("alpha_timer_s", 0.0), ("increase_timer_s", -1e-6),
    ("rate_decrease_min_interval_s", -1e-6), ("byte_counter_bytes", 0),
    ("fast_recovery_steps", -1), ("rate_ai_bps", -1.0), ("min_rate_bps", 200e9),
    ("initial_alpha", 1.5), ("line_rate_bps", math.inf),
])
def test_bad_parameters_name_the_field(field, value):
    with pytest.raises(ConfigError, match=field):
        replace(DcqcnParams.paper(100e9), **{field: value})


def test_time_cannot_go_backwards():
    rp = ReactionPoint(DcqcnParams.paper(100e9), now_s=1e-3)
    with pytest.raises(ValueError, match="backwards"):
        rp.on_cnp(0.5e-3)


# ---------------------------------------------------------------- the closed-form sequence


@pytest.mark.parametrize("t0", [0.0, 0.0123])
def test_reference_sequence_50_75_87_5_93_75_96_875_at_the_timer_instants(t0):
    """From 100 Gb/s with alpha = 1, one CNP halves the rate (RC (1 - alpha/2)); then each timer
    event of fast recovery averages it with the target, RC <- (RT + RC) / 2."""
    p = timer_only(DcqcnParams.paper(100e9))
    rp = ReactionPoint(p, now_s=t0)
    assert rp.alpha == 1.0 and rp.next_event_s() == math.inf     # unlimited: nothing scheduled
    assert rp.on_cnp(t0) is True
    assert (rp.rate_bps, rp.target_rate_bps, rp.alpha) == (50e9, 100e9, 1.0)
    for k, expected in enumerate([75e9, 87.5e9, 93.75e9, 96.875e9], start=1):
        t_k = t0 + k * p.increase_timer_s
        assert rp.next_event_s() == t_k
        before = rp.rate_bps
        rp.advance(just_before(t_k))
        assert rp.rate_bps == before
        rp.advance(t_k)
        assert rp.rate_bps == expected
        assert rp.target_rate_bps == 100e9
    assert rp.num_cuts == 1 and rp.num_timer_events == 4
    assert rp.num_increases == {FR: 4, AI: 0, HYPER: 0}


def test_fast_recovery_lasts_exactly_F_steps_then_additive_increase():
    """max(T, BC) <= F is fast recovery, counting the event itself: F = 5 steps (the paper's
    "F = 5 successive iterations"); the sixth timer event is additive."""
    p = timer_only(DcqcnParams.paper(100e9))
    rp = ReactionPoint(p)
    rp.on_cnp(0.0)
    rp.on_cnp(1e-6)                       # before any increase: RT <- 50, RC <- 25 (alpha = 1)
    assert (rp.rate_bps, rp.target_rate_bps) == (25e9, 50e9)
    t_cut = 1e-6
    for k, expected in enumerate([37.5e9, 43.75e9, 46.875e9, 48.4375e9, 49.21875e9], start=1):
        rp.advance(t_cut + k * p.increase_timer_s)
        assert (rp.rate_bps, rp.target_rate_bps) == (expected, 50e9)
    assert rp.num_increases[FR] == 5
    rp.advance(t_cut + 6 * p.increase_timer_s)
    assert rp.target_rate_bps == 50e9 + p.rate_ai_bps
    assert rp.rate_bps == (50e9 + p.rate_ai_bps + 49.21875e9) / 2
    assert rp.num_increases == {FR: 5, AI: 1, HYPER: 0}


def test_timer_alone_never_reaches_hyper_increase():
    p = timer_only(DcqcnParams.paper(100e9))
    rp = ReactionPoint(p)
    rp.on_cnp(0.0)
    rp.on_cnp(1e-6)
    rp.advance(1e-6 + 40 * p.increase_timer_s)
    assert rp.num_increases == {FR: 5, AI: 35, HYPER: 0}
    assert rp.target_rate_bps == pytest.approx(50e9 + 35 * p.rate_ai_bps, rel=1e-12)


def test_hyper_increase_after_F_stages_of_both_counters():
    p = DcqcnParams.paper(100e9)
    b, T, F = p.byte_counter_bytes, p.increase_timer_s, p.fast_recovery_steps
    rp = ReactionPoint(p)
    rp.on_cnp(0.0)
    rp.on_cnp(1e-6)                       # RT = 50 Gb/s, well below the line rate
    t_cut = 1e-6

    rp.on_bytes_sent((F + 1) * b, 2e-6)   # BC = 1..5 fast recovery, BC = 6 additive (T = 0)
    assert rp.byte_stage == F + 1 and rp.num_increases == {FR: F, AI: 1, HYPER: 0}
    for k in range(1, F + 1):             # T = 1..5: min(T, BC) <= F, max > F: additive
        rp.advance(t_cut + k * T)
    assert rp.num_increases == {FR: F, AI: 1 + F, HYPER: 0}

    rt = rp.target_rate_bps
    rp.advance(t_cut + (F + 1) * T)       # T = 6, BC = 6: hyper, i = 1
    assert rp.num_increases[HYPER] == 1
    assert rp.target_rate_bps == rt + 1 * p.rate_hai_bps
    rt = rp.target_rate_bps
    rp.on_bytes_sent(b, t_cut + (F + 1) * T + 1e-6)   # BC = 7, T = 6: i = min - F = 1
    assert rp.target_rate_bps == rt + 1 * p.rate_hai_bps
    rt, rc = rp.target_rate_bps, rp.rate_bps
    rp.advance(t_cut + (F + 2) * T)       # T = 7, BC = 7: i = 2
    assert rp.target_rate_bps == rt + 2 * p.rate_hai_bps
    assert rp.rate_bps == (rt + 2 * p.rate_hai_bps + rc) / 2
    assert rp.num_increases == {FR: F, AI: 1 + F, HYPER: 3}


# ---------------------------------------------------------------- byte counter


def test_byte_counter_fires_every_B_bytes_at_the_sending_instant():
    p = replace(DcqcnParams.paper(100e9), byte_counter_bytes=1000)
    rp = ReactionPoint(p)
    rp.on_bytes_sent(10**9, 0.0)                  # unlimited before the first CNP: not counted
    assert rp.num_byte_counter_events == 0
    rp.on_cnp(1e-6)
    rp.on_bytes_sent(999, 2e-6)
    assert rp.num_byte_counter_events == 0 and rp.rate_bps == 50e9
    rp.on_bytes_sent(1, 3e-6)
    assert rp.num_byte_counter_events == 1 and rp.rate_bps == 75e9
    rp.on_bytes_sent(2500, 4e-6)
    assert rp.num_byte_counter_events == 3 and rp.bytes_since_byte_event == 500
    assert rp.rate_bps == 93.75e9 and rp.byte_stage == 3 and rp.timer_stage == 0
    rp.on_cnp(5e-6)                               # a cut restarts the byte counter
    assert rp.bytes_since_byte_event == 0 and rp.byte_stage == 0


def test_byte_counter_off_ignores_bytes():
    rp = ReactionPoint(timer_only(DcqcnParams.paper(100e9)))
    rp.on_cnp(0.0)
    rp.on_bytes_sent(10**12, 1e-6)
    assert rp.num_byte_counter_events == 0 and rp.rate_bps == 50e9


# ---------------------------------------------------------------- alpha


def test_alpha_decays_by_one_minus_g_per_alpha_period():
    p = DcqcnParams.paper(100e9)
    K = p.alpha_timer_s
    rp = ReactionPoint(p)
    rp.on_cnp(0.0)
    assert rp.alpha == 1.0
    for k in (1, 2, 3, 10, 1000):
        rp.advance(just_before(k * K))
        assert rp.alpha == (1 - G) ** (k - 1)
        rp.advance(k * K)
        assert rp.alpha == (1 - G) ** k


def test_a_cut_uses_the_decayed_alpha_then_raises_it_and_restarts_its_timer():
    p = timer_only(DcqcnParams.paper(100e9))
    K = p.alpha_timer_s
    rp = ReactionPoint(p)
    rp.on_cnp(0.0)
    t = 10 * K
    rp.advance(t)
    a = (1 - G) ** 10
    rc_before = rp.rate_bps
    rp.on_cnp(t)
    assert rp.rate_bps == rc_before * (1 - a / 2)
    a_after = (1 - G) * a + G
    assert rp.alpha == a_after
    rp.advance(just_before(t + K))
    assert rp.alpha == a_after
    rp.advance(t + K)
    assert rp.alpha == a_after * (1 - G)


def test_mellanox_alpha_ticks_every_microsecond_without_scheduler_events():
    p = DcqcnParams.mellanox(100e9)
    rp = ReactionPoint(p)
    rp.on_cnp(0.0)
    assert rp.next_event_s() == p.increase_timer_s        # alpha's 1 us ticks are not events
    rp.advance(250e-6)
    assert rp.alpha == pytest.approx((1 - G) ** 250, rel=1e-12)
    assert rp.num_timer_events == 0


# ---------------------------------------------------------------- cuts: paper vs Mellanox


def test_paper_variant_cuts_on_every_cnp():
    rp = ReactionPoint(DcqcnParams.paper(100e9))
    assert [rp.on_cnp(t) for t in (0.0, 1e-6, 2e-6)] == [True, True, True]
    assert (rp.rate_bps, rp.target_rate_bps) == (12.5e9, 25e9)
    assert (rp.num_cnps, rp.num_cuts, rp.num_cnps_coalesced) == (3, 3, 0)


def test_mellanox_coalesces_cnps_inside_the_min_interval_into_one_later_cut():
    p = DcqcnParams.mellanox(100e9)
    rp = ReactionPoint(p)
    assert rp.on_cnp(0.0) is True
    assert (rp.rate_bps, rp.target_rate_bps) == (50e9, 100e9)
    assert rp.on_cnp(1e-6) is False
    assert rp.pending_cut_at == 4e-6 and rp.rate_bps == 50e9
    assert rp.on_cnp(2e-6) is False
    assert rp.num_cnps_coalesced == 1
    assert rp.next_event_s() == 4e-6
    rp.advance(just_before(4e-6))
    assert rp.rate_bps == 50e9 and rp.num_cuts == 1
    rp.advance(4e-6)                      # one cut for both CNPs, with alpha after 4 ticks
    a = (1 - G) ** 4
    assert rp.rate_bps == 50e9 * (1 - a / 2)
    assert rp.target_rate_bps == 100e9    # clamp off and no increase since the last cut
    assert rp.alpha == (1 - G) * a + G
    assert (rp.num_cnps, rp.num_cuts, rp.num_cnps_coalesced) == (3, 2, 1)
    assert rp.pending_cut_at is None
    assert rp.on_cnp(8e-6) is True        # a full interval after the deferred cut: at once
    assert rp.num_cuts == 3


def test_mellanox_clamps_the_target_after_an_increase_since_the_last_cut():
    p = DcqcnParams.mellanox(100e9)
    rp = ReactionPoint(p)
    rp.on_cnp(0.0)
    rp.advance(p.increase_timer_s)        # T = 1 <= F = 1: fast recovery
    assert (rp.rate_bps, rp.target_rate_bps) == (75e9, 100e9)
    rp.on_cnp(400e-6)
    assert rp.target_rate_bps == 75e9


def test_clamp_on_sets_the_target_on_back_to_back_cuts():
    p = replace(DcqcnParams.mellanox(100e9), clamp_target_rate_on_cut=True)
    rp = ReactionPoint(p)
    rp.on_cnp(0.0)
    rp.on_cnp(10e-6)
    assert rp.target_rate_bps == 50e9


# ---------------------------------------------------------------- bounds


def test_rate_floors_at_min_rate():
    p = DcqcnParams.paper(100e9)
    rp = ReactionPoint(p)
    for i in range(12):
        rp.on_cnp(i * 1e-6)
    assert rp.rate_bps == p.min_rate_bps
    rp.on_cnp(20e-6)
    assert rp.rate_bps == p.min_rate_bps <= rp.target_rate_bps


def test_rate_recovers_exactly_to_line_rate_and_then_stops_the_timers():
    p = timer_only(DcqcnParams.paper(100e9))
    rp = ReactionPoint(p)
    rp.on_cnp(0.0)
    rp.advance(1.0)
    assert rp.rate_bps == rp.target_rate_bps == p.line_rate_bps
    assert not rp.is_rate_limited and rp.next_event_s() == math.inf
    n = rp.num_timer_events
    rp.advance(2.0)
    assert rp.num_timer_events == n


# ---------------------------------------------------------------- notification point


def test_np_sends_at_most_one_cnp_per_flow_per_50_us():
    np_ = NotificationPoint()
    assert np_.cnp_interval_s == DEFAULT_CNP_INTERVAL_S == 50e-6
    marks = [("a", 0.0), ("a", 10e-6), ("b", 10e-6), ("a", just_before(50e-6)), ("a", 50e-6),
             ("b", 59e-6), ("b", 60e-6), ("a", 60e-6)]
    got = [np_.on_ecn_marked_packet(f, t) for f, t in marks]
    assert got == [True, False, True, False, True, False, True, False]
    assert (np_.num_marked_packets, np_.num_cnps, np_.num_suppressed) == (8, 4, 4)


def test_np_forget_and_zero_interval():
    np_ = NotificationPoint(cnp_interval_s=0.0)
    assert all(np_.on_ecn_marked_packet(1, 1e-6) for _ in range(3))
    np2 = NotificationPoint()
    np2.on_ecn_marked_packet(7, 0.0)
    np2.forget(7)
    assert np2.on_ecn_marked_packet(7, 1e-6)
    with pytest.raises(ConfigError, match="cnp_interval_s"):
        NotificationPoint(cnp_interval_s=-1.0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 200)), max_size=60))
def test_np_cnps_are_the_greedy_one_per_interval_selection_per_flow(marks):
    """Marks arrive in time order (times in us); per flow, a mark gets a CNP iff it is at least
    one interval after that flow's previous CNP."""
    np_ = NotificationPoint(cnp_interval_s=50e-6)
    t, last = 0, {}
    for flow, dt_us in marks:
        t += dt_us
        now = t * 1e-6
        expected = flow not in last or now >= last[flow] + 50e-6
        assert np_.on_ecn_marked_packet(flow, now) is expected
        if expected:
            last[flow] = now


# ---------------------------------------------------------------- properties of the RP

params_st = st.builds(
    lambda variant, rate, b, clamp: replace(variant(rate), byte_counter_bytes=b,
                                            clamp_target_rate_on_cut=clamp),
    st.sampled_from([DcqcnParams.paper, DcqcnParams.mellanox]),
    st.sampled_from([25e9, 100e9, 400e9]),
    st.sampled_from([None, 4096, 65536, 1_000_000]),
    st.booleans())

# Gaps: bursts inside the Mellanox cut interval, timer periods, and long quiet spells in which
# the rate recovers to the line rate.
dt_st = st.one_of(st.floats(0, 5e-6), st.floats(0, 400e-6), st.sampled_from([0.0, 2e-3, 0.05]))
ops_st = st.lists(st.tuples(st.sampled_from(["cnp", "cnp", "bytes", "advance", "next"]), dt_st,
                            st.integers(0, 3_000_000)),
                  max_size=60)


def rate_state(rp: ReactionPoint) -> tuple:
    """Everything but the clock and alpha (which decays with the clock alone)."""
    return (rp.rate_bps, rp.target_rate_bps, rp.timer_stage, rp.byte_stage,
            rp.bytes_since_byte_event, rp.is_rate_limited, rp.last_cut_at, rp.pending_cut_at,
            rp.next_event_s(), rp.num_cnps, rp.num_cnps_coalesced, rp.num_cuts,
            rp.num_timer_events, rp.num_byte_counter_events, dict(rp.num_increases))


def state(rp: ReactionPoint) -> tuple:
    return rate_state(rp) + (rp.alpha, rp.now_s)


def apply(rp: ReactionPoint, op: str, t: float, n: int) -> None:
    if op == "cnp":
        rp.on_cnp(t)
    elif op == "bytes":
        rp.on_bytes_sent(n, t)
    else:
        rp.advance(t)


def check_invariants(rp: ReactionPoint) -> None:
    p = rp.params
    assert p.min_rate_bps <= rp.rate_bps <= rp.target_rate_bps <= p.line_rate_bps
    assert 0 <= rp.alpha <= 1
    assert rp.next_event_s() > rp.now_s               # everything due has been handled
    if not rp.is_rate_limited:
        assert rp.rate_bps == p.line_rate_bps or rp.num_cuts == 0
    pending = rp.pending_cut_at is not None
    assert rp.num_cnps == rp.num_cuts + rp.num_cnps_coalesced + pending
    assert sum(rp.num_increases.values()) == rp.num_timer_events + rp.num_byte_counter_events


@settings(max_examples=300, deadline=None)
@given(params_st, ops_st)
def test_random_interleavings_keep_min_le_rc_le_rt_le_line(params, ops):
    rp = ReactionPoint(params)
    t = 0.0
    for op, dt, n in ops:
        t += dt
        if op == "next":                              # jump exactly to the next event
            nxt = rp.next_event_s()
            if nxt == math.inf:
                continue
            t = nxt
        apply(rp, op, t, n)
        check_invariants(rp)


@settings(max_examples=300, deadline=None)
@given(params_st, ops_st)
def test_next_event_s_is_exactly_when_advance_has_work(params, ops):
    rp = ReactionPoint(params)
    t = 0.0
    for op, dt, n in ops:
        t += dt
        apply(rp, "advance" if op == "next" else op, t, n)
        nxt = rp.next_event_s()
        if nxt == math.inf:
            continue
        events = rp.num_timer_events + rp.num_cuts
        before = rate_state(rp)
        rp.advance(just_before(nxt))
        assert rate_state(rp) == before
        rp.advance(nxt)
        assert rp.num_timer_events + rp.num_cuts > events
        t = nxt


@settings(max_examples=300, deadline=None)
@given(params_st, ops_st, st.lists(st.floats(0, 1), max_size=40))
def test_extra_advances_change_nothing(params, ops, fractions):
    """Events are handled at their own instants: advancing the clock in many small steps, or to
    every event in turn, ends in exactly the same state as jumping straight to each call."""
    coarse, fine, stepper = (ReactionPoint(params) for _ in range(3))
    t = 0.0
    extra = iter(fractions)
    for op, dt, n in ops:
        t_prev, t = t, t + dt
        op = "advance" if op == "next" else op
        f = next(extra, None)
        if f is not None:
            fine.advance(min(t, t_prev + f * (t - t_prev)))
        while stepper.next_event_s() <= t:
            stepper.advance(stepper.next_event_s())
        for rp in (coarse, fine, stepper):
            apply(rp, op, t, n)
        assert state(fine) == state(coarse) == state(stepper)
