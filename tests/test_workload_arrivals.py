"""Send times: `vllm bench serve`'s gamma arrivals, rescaling and ramp-up."""

import math

import numpy as np
import pytest

from simcore.workload.arrivals import request_rates, send_times_s


def rng(seed=0):
    return np.random.default_rng(seed)


def test_infinite_rate_sends_everything_at_time_zero():
    times = send_times_s(50, rng(), request_rate=math.inf, burstiness=0.3)
    assert times.shape == (50,)
    assert np.all(times == 0.0)


def test_last_send_is_rescaled_to_n_over_rate():
    for burstiness in (0.5, 1.0, 3.0):
        times = send_times_s(1000, rng(1), request_rate=8.0, burstiness=burstiness)
        assert times[-1] == pytest.approx(1000 / 8.0, rel=1e-12)
        assert np.all(np.diff(times) >= 0)
        assert times[0] > 0  # the first request also waits its gap


def test_mean_gap_is_one_over_rate():
    times = send_times_s(20_000, rng(2), request_rate=25.0)
    gaps = np.diff(np.concatenate([[0.0], times]))
    assert gaps.mean() == pytest.approx(1 / 25.0, rel=1e-9)


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gap_cv_is_one_over_sqrt_burstiness(burstiness):
    times = send_times_s(200_000, rng(3), request_rate=10.0, burstiness=burstiness)
    gaps = np.diff(np.concatenate([[0.0], times]))
    cv = gaps.std() / gaps.mean()
    assert cv == pytest.approx(1 / math.sqrt(burstiness), rel=0.03)


def test_infinite_burstiness_gives_constant_gaps():
    times = send_times_s(10, rng(), request_rate=4.0, burstiness=math.inf)
    np.testing.assert_allclose(times, np.arange(1, 11) / 4.0)


def test_same_generator_seed_same_times():
    a = send_times_s(100, rng(7), request_rate=3.0, burstiness=0.7)
    b = send_times_s(100, rng(7), request_rate=3.0, burstiness=0.7)
    c = send_times_s(100, rng(8), request_rate=3.0, burstiness=0.7)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_linear_ramp_up_rates_follow_vllm_formula():
    rates = request_rates(5, request_rate=math.inf, ramp_up_strategy="linear",
                          ramp_up_start_rps=2.0, ramp_up_end_rps=10.0)
    np.testing.assert_allclose(rates, [2.0, 4.0, 6.0, 8.0, 10.0])


def test_exponential_ramp_up_rates_follow_vllm_formula():
    rates = request_rates(3, request_rate=math.inf, ramp_up_strategy="exponential",
                          ramp_up_start_rps=1.0, ramp_up_end_rps=16.0)
    np.testing.assert_allclose(rates, [1.0, 4.0, 16.0])


def test_single_request_ramp_up_uses_start_rate():
    rates = request_rates(1, request_rate=math.inf, ramp_up_strategy="linear",
                          ramp_up_start_rps=3.0, ramp_up_end_rps=9.0)
    np.testing.assert_allclose(rates, [3.0])


def test_ramp_up_gaps_are_one_over_the_current_rate_and_not_rescaled():
    times = send_times_s(4, rng(), burstiness=math.inf, ramp_up_strategy="linear",
                         ramp_up_start_rps=1.0, ramp_up_end_rps=4.0)
    np.testing.assert_allclose(times, np.cumsum([1 / 1, 1 / 2, 1 / 3, 1 / 4]))


def test_ramp_up_increases_the_sending_rate():
    n = 40_000
    times = send_times_s(n, rng(4), ramp_up_strategy="linear", ramp_up_start_rps=5.0,
                         ramp_up_end_rps=50.0)
    gaps = np.diff(np.concatenate([[0.0], times]))
    first, last = gaps[: n // 10].mean(), gaps[-n // 10:].mean()
    assert 1 / first == pytest.approx(5.0 + 45.0 * 0.05, rel=0.1)
    assert 1 / last == pytest.approx(5.0 + 45.0 * 0.95, rel=0.1)


def test_no_requests_no_times():
    assert send_times_s(0, rng(), request_rate=1.0).shape == (0,)
