"""Send times of a `vllm bench serve` client: gamma-distributed gaps, rescaled, with optional ramp-up.

Exactly vLLM's `get_request` (benchmarks/serve.py), vectorised. Request i (0-based, of N) has a rate
  - without ramp-up: request_rate;
  - linear ramp-up: start + (end - start) * p, exponential: start * (end / start) ** p,
    with p = i / max(N - 1, 1);
and a gap before it of 0 if its rate is inf, 1 / rate if burstiness is inf, else a gamma variate
with shape burstiness and scale 1 / (rate * burstiness) (mean 1 / rate, coefficient of variation
1 / sqrt(burstiness)). Send times are the cumulative gaps, so even the first request waits its gap.
Without ramp-up, and unless every gap is 0, the times are then rescaled so that the last send is at
exactly N / request_rate (vLLM does this to steady throughput across seeds); ramp-up times are not.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np


def request_rates(num_requests: int, *, request_rate: float,
                  ramp_up_strategy: Literal["linear", "exponential"] | None = None,
                  ramp_up_start_rps: float | None = None,
                  ramp_up_end_rps: float | None = None) -> np.ndarray:
    """The rate (requests/s) at which each request is sent."""
    if ramp_up_strategy is None:
        return np.full(num_requests, float(request_rate))
    if ramp_up_start_rps is None or ramp_up_end_rps is None:
        raise ValueError("a ramp-up needs ramp_up_start_rps and ramp_up_end_rps")
    progress = np.arange(num_requests) / max(num_requests - 1, 1)
    if ramp_up_strategy == "linear":
        return ramp_up_start_rps + (ramp_up_end_rps - ramp_up_start_rps) * progress
    return ramp_up_start_rps * (ramp_up_end_rps / ramp_up_start_rps) ** progress


def send_times_s(num_requests: int, rng: np.random.Generator, *, request_rate: float = math.inf,
                 burstiness: float = 1.0,
                 ramp_up_strategy: Literal["linear", "exponential"] | None = None,
                 ramp_up_start_rps: float | None = None,
                 ramp_up_end_rps: float | None = None) -> np.ndarray:
    """Send time of each of `num_requests` requests, seconds from the start; non-decreasing."""
    if num_requests == 0:
        return np.zeros(0)
    if not burstiness > 0:
        raise ValueError(f"burstiness must be positive, got {burstiness}")
    rates = request_rates(num_requests, request_rate=request_rate,
                          ramp_up_strategy=ramp_up_strategy, ramp_up_start_rps=ramp_up_start_rps,
                          ramp_up_end_rps=ramp_up_end_rps)
    if not np.all(rates > 0):
        raise ValueError("every request rate must be positive")
    finite = np.isfinite(rates)
    gaps_s = np.zeros(num_requests)
    if math.isinf(burstiness):
        gaps_s[finite] = 1.0 / rates[finite]
    elif finite.any():
        gaps_s[finite] = rng.gamma(shape=burstiness, scale=1.0 / (rates[finite] * burstiness))
    times_s = np.cumsum(gaps_s)
    if ramp_up_strategy is None and times_s[-1] != 0:
        times_s *= (num_requests / request_rate) / times_s[-1]
    return times_s
