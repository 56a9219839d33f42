"""Offered against served load: whether a run kept up with its arrivals or its queue kept growing.

A run past its capacity still finishes (every request is served in the end), and its latency
percentiles then measure the run's length as much as the deployment: at twice the capacity a
run twice as long has about twice the p99 TTFT. What tells the two apart is the trend of the
number of requests in the system, N(t) = arrivals by t - requests finished by t, while
arrivals last: flat (it fluctuates about a level) below capacity, growing at offered - served
above it, whatever the run's length.

`load_trend(arrivals_s, ends_s)` measures it over the second half of the arrival window (the
first half holds the warm-up from an empty system), on 64 evenly spaced samples:

- `offered_request_rate`: arrivals in that half / its length.
- `served_request_rate`: requests finished in that half / its length.
- `queue_growth_rps`: the least-squares slope of N(t) there.
- `over_capacity`: the slope is over 3% of the offered rate (a deployment within 3% of its
  capacity is at it; Little's law would need a longer run to tell) and N grew by more than
  twice its own noise over the half (2 sqrt(mean N + 1), N being about Poisson when the
  system keeps up), so that a short run's fluctuation does not count as a trend.

None of it is defined when every request arrives at once (rate inf) or the window is too short
to sample (fewer than `MIN_REQUESTS` requests): `load_trend` then returns None.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

MIN_REQUESTS = 40
"""Fewer arrivals than this leave the trend undefined."""

GROWTH_TOLERANCE = 0.03
"""Queue growth up to this fraction of the offered rate counts as keeping up."""

_SAMPLES = 64


@dataclass(frozen=True, slots=True)
class LoadTrend:
    """Offered and served load over the second half of a run's arrival window."""

    offered_request_rate: float
    served_request_rate: float
    queue_growth_rps: float
    mean_in_system: float
    window_s: float
    over_capacity: bool

    def as_dict(self) -> dict:
        return {"offered_request_rate": self.offered_request_rate,
                "served_request_rate": self.served_request_rate,
                "queue_growth_rps": self.queue_growth_rps,
                "over_capacity": self.over_capacity}


def load_trend(arrivals_s: np.ndarray, ends_s: np.ndarray) -> LoadTrend | None:
    """The trend of requests in the system while arrivals last (see the module docstring).

    `arrivals_s`: when each request arrived at the client (intended send time); `ends_s`: when
    the client was done with it (last token, or failure), same order or not.
    """
    a = np.sort(np.asarray(arrivals_s, dtype=float))
    d = np.sort(np.asarray(ends_s, dtype=float))
    if a.size < MIN_REQUESTS:
        return None
    t0 = a[0] + (a[-1] - a[0]) / 2
    t1 = a[-1]
    span = t1 - t0
    if not span > 0 or not math.isfinite(span):
        return None
    t = np.linspace(t0, t1, _SAMPLES)
    in_system = (np.searchsorted(a, t, side="right")
                 - np.searchsorted(d, t, side="right")).astype(float)
    slope = float(np.polyfit(t - t0, in_system, 1)[0])
    arrived = int(np.searchsorted(a, t1, side="right") - np.searchsorted(a, t0, side="right"))
    finished = int(np.searchsorted(d, t1, side="right") - np.searchsorted(d, t0, side="right"))
    offered = arrived / span
    mean_n = float(in_system.mean())
    over = (slope > GROWTH_TOLERANCE * offered
            and slope * span > 2.0 * math.sqrt(mean_n + 1.0))
    return LoadTrend(offered_request_rate=offered, served_request_rate=finished / span,
                     queue_growth_rps=slope, mean_in_system=mean_n, window_s=span,
                     over_capacity=bool(over))
