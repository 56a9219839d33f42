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
    # Fitted over time in units of the span: seconds squared underflow at the spans of very
    # high rates (a span of 1e-168 s left the least-squares fit singular).
    slope = float(np.polyfit((t - t0) / span, in_system, 1)[0]) / span
    arrived = int(np.searchsorted(a, t1, side="right") - np.searchsorted(a, t0, side="right"))
    finished = int(np.searchsorted(d, t1, side="right") - np.searchsorted(d, t0, side="right"))
    offered = arrived / span
    mean_n = float(in_system.mean())
    over = (slope > GROWTH_TOLERANCE * offered
            and slope * span > 2.0 * math.sqrt(mean_n + 1.0))
    return LoadTrend(offered_request_rate=offered, served_request_rate=finished / span,
                     queue_growth_rps=slope, mean_in_system=mean_n, window_s=float(span),
                     over_capacity=bool(over))


NEAR_CAPACITY = 0.85
"""Offered load from this fraction of the throughput capacity on counts as near capacity."""

_NOT_A_RESOURCE = ("queueing", "underloaded")
"""Attribution factors that describe the load, not a resource that sets the capacity."""


def headroom(cfg, result: dict) -> dict | None:
    """How far the run's offered load is from the deployment's throughput capacity, and what
    sets that capacity; None where the rate is not the config's to vary (every request at once,
    a ramp-up, a trace on its own timestamps).

    The capacity is measured, not estimated, by one more run (`capacity_config`): the same kind of
    requests kept at the engines' full concurrency (max_num_seqs per engine), or at the client's
    max_concurrency where that is lower (`client_cap`: then it is what binds first), by a client
    that sends the next as one finishes, until four times that many have been sent. With a cluster
    that run is of one replica on the analytical fabric, scaled by the replicas
    (`capacity_copies`; the result says so: `capacity_run_fabric`,
    `capacity_run_replicas_scaled_to`). Its completion
    rate over the middle half of the completions, the engines full throughout, is
    `throughput_capacity_rps`, and its top resource factor (`simcore.attribution`, queueing and
    the offered load left aside) is what binds first as load rises. `load_fraction` = the
    config's request rate / that capacity; `state`: "over_capacity" when the load fraction
    reaches 1, or the run's queue kept growing (`over_capacity`) at a load fraction from
    `NEAR_CAPACITY`, "near_capacity" from `NEAR_CAPACITY`, else "headroom"; `still_filling`
    when the queue kept growing under `NEAR_CAPACITY` (a run too short for its steady state:
    filling from empty, not overload). No SLO enters: `dse capacity` finds the rate that meets
    latency SLOs. None too where the capacity run completes nothing (every request of the
    kind refused, as one longer than max_model_len): there is no capacity to compare with.
    """
    w = cfg.workload
    # A finite rate is the config's own: a ramp-up or a trace's timestamps need it left inf.
    if not math.isfinite(w.request_rate) or "offered_request_rate" not in result:
        return None
    copies = capacity_copies(cfg)
    full = _capacity(capacity_config(cfg, result))
    if full is None:
        return None
    if copies > 1:
        full = {**full, "throughput_capacity_rps": full["throughput_capacity_rps"] * copies,
                "capacity_run_replicas_measured": 1, "capacity_run_replicas_scaled_to": copies}
    if cfg.cluster is not None:
        full = {**full, "capacity_run_fabric": "analytical"}
    cap = client_cap(cfg, result)
    if cap is not None:
        full = {**full, "binds_first": "max_concurrency", "capacity_run_client_cap": cap,
                "binds_first_label": f"the client's max_concurrency of {cap} requests in "
                                     f"flight (workload.max_concurrency)"}
    if not full["throughput_capacity_rps"] > 0:
        return None     # nothing of this kind completes (every request refused): no capacity
    load = w.request_rate / full["throughput_capacity_rps"]
    # A queue still growing at a load well under the capacity measured with the engines full is
    # the run filling from empty (its requests' time in the system about as long as the half
    # window the trend is taken over), not overload: a longer run shows the steady state.
    filling = bool(result["over_capacity"]) and load < NEAR_CAPACITY
    state = ("over_capacity" if load >= 1.0 or (result["over_capacity"] and not filling)
             else "near_capacity" if load >= NEAR_CAPACITY else "headroom")
    return {"state": state, "offered_rps": w.request_rate, "load_fraction": load,
            "served_rps": result["served_request_rate"],
            "queue_growth_rps": result["queue_growth_rps"], "still_filling": filling, **full}


_CAPACITY_CACHE: dict[str, dict | None] = {}
_CACHE_SIZE = 8


def _capacity(cfg) -> dict | None:
    """The capacity run's figures; rates of one deployment share the run (cached by its config,
    the last `_CACHE_SIZE` kept)."""
    from simcore.attribution import attribute
    from simcore.errors import ConfigError
    from simcore.simulate import simulate

    key = cfg.model_dump_json()
    if key in _CAPACITY_CACHE:
        return _CAPACITY_CACHE[key]
    try:
        run = simulate(cfg)
    except ConfigError:
        out = None
    else:
        top = next(f for f in attribute(run).factors if f.key not in _NOT_A_RESOURCE)
        out = {"throughput_capacity_rps": middle_completion_rate(run),
               "binds_first": top.key, "binds_first_label": top.label,
               "capacity_run_concurrency": run["max_concurrency"],
               "capacity_run_requests": run["num_prompts"]}
    if len(_CAPACITY_CACHE) >= _CACHE_SIZE:
        _CAPACITY_CACHE.pop(next(iter(_CAPACITY_CACHE)))
    _CAPACITY_CACHE[key] = out
    return out


CAPACITY_RUN_MAX_REQUESTS = 20_000
"""The most requests the capacity run sends (its concurrency is cut to a quarter of it)."""


def capacity_copies(cfg) -> int:
    """How many identical copies of the deployment's unit the capacity run measures one of: with
    a cluster, its `num_replicas` (the replicas of a cluster run are alike, each its own engines
    or expert-parallel group on GPUs of its own; the run measures one and the capacity is that
    times their number, leaving out contention between replicas on the shared fabric); else 1
    (the whole deployment is measured)."""
    par = cfg.parallelism
    if cfg.cluster is None or par.prefill_decode is not None:
        return 1
    return par.num_replicas


def client_cap(cfg, result: dict) -> int | None:
    """The workload's max_concurrency where it is below what the engines hold at once
    (max_num_seqs each): the client, not the engines, then sets how many requests are served at
    a time, at any load (one replica's share of it with a cluster, `capacity_copies`); None
    otherwise."""
    cap = cfg.workload.max_concurrency
    if cap is None:
        return None
    full = result["limits"]["max_num_seqs"] * len(result["replicas"])
    return cap if cap < full else None


def capacity_config(cfg, result: dict):
    """The config of the run that measures the throughput capacity (see `headroom`): the
    engines kept full, or as full as the client's max_concurrency lets them be (`client_cap`).
    With a cluster, one replica (`capacity_copies`) on the analytical fabric: a cluster's
    capacity run holds thousands of requests, which a flow or packet fabric would take hours
    over."""
    copies = capacity_copies(cfg)
    engines = len(result["replicas"]) // copies
    full = result["limits"]["max_num_seqs"] * engines
    cap = client_cap(cfg, result)
    if cap is not None:
        full = min(full, max(1, cap // copies))
    concurrency = min(full, CAPACITY_RUN_MAX_REQUESTS // 4)
    n = max((cfg.workload.resolved_num_prompts or 0) // copies, 4 * concurrency)
    out = cfg.with_section("workload", request_rate=math.inf, num_prompts=n,
                           max_concurrency=concurrency)
    if cfg.cluster is not None:
        c = cfg.cluster
        out = out.model_copy(update={"cluster": c.model_copy(update={
            "fabric": c.fabric.model_copy(update={"backend": "analytical"})})})
    if copies > 1:
        out = out.with_section("parallelism", num_replicas=1)
    return out


def middle_completion_rate(run: dict) -> float:
    """Requests completed per second between the 25th and the 75th percentile of completion
    times (the run's request throughput when there are too few)."""
    ends = np.sort([r["send_s"] + r["e2el_ms"] / 1e3 for r in run["requests"] if r["success"]])
    if ends.size < MIN_REQUESTS:
        return float(run["request_throughput"])
    lo, hi = ends.size // 4, (3 * ends.size) // 4
    span = float(ends[hi] - ends[lo])
    return (hi - lo) / span if span > 0 else float(run["request_throughput"])
