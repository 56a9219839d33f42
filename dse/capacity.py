"""Capacity: the highest request rate a configuration sustains within its SLOs.

`find_capacity(cfg, slos)` runs the configuration's workload shape (its dataset, burstiness and
engine, everything but the rate and the number of requests) at a sequence of rates:

1. A burst run (every request at time 0) measures the most the engine serves with all work
   queued; its request throughput, less 10%, is the first rate tried (or `start` where that is
   higher: a rate the caller found to meet, which also bounds the answer from below, so that
   `dse capacity --target-rate` states a capacity of at least the rate it says its layout
   serves).
2. Bracketing: from there, up by x1.25 while the rate meets the SLOs, down by x0.8 while it does
   not, until one rate meets and the next fails (or the rate falls below 1/64 of the burst
   throughput: then no rate meets, and the capacity is 0).
3. Bisection in log space until the failing rate is within `tolerance` of the meeting one.
4. The neighbours: runs at 0.9x and 1.1x the capacity, in the result so that a reader sees the
   SLOs met just below and missed just above; when they contradict the bracket (noise near the
   edge), a note says so.

A rate *meets* when every SLO holds on the run's own metrics (what `vllm bench serve` would
print at that rate), no request failed, and the run is stationary: a queue that keeps growing
(`simcore.saturation`) is over capacity whatever the percentiles of a finite run say. Each run
sends `window_s` seconds of arrivals (at least `min_prompts`, at most `max_prompts` requests),
so its second half, where the trend is measured, is past the warm-up. Every run uses the
config's seed: the arrival gaps are the same draws scaled by the rate (common random numbers),
so neighbouring rates differ by the rate alone.

The metric that *binds first* is the SLO missed by the largest factor at the lowest failing
rate (or the queue's growth when the SLOs still held there). With `envelope=True` the search is
repeated with every op class at the low and at the high end of its error bound (the `bounds`
envelope of `simcore.uncertainty`), giving the capacity's own range.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from dse.study import Constraint
from simcore.config import SimConfig
from simcore.errors import ConfigError
from simcore.workload.config import SESSION_DATASETS

DEFAULT_SLOS = ("p99_ttft_ms <= 1000", "p99_tpot_ms <= 50")
"""The SLOs capacity is measured against when none are given."""

_SLO_RE = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*(<=|<)\s*(\S+)\s*$")
_LATENCY_RE = re.compile(r"^(mean|median|p(\d+(?:\.\d+)?))_(ttft|tpot|itl|e2el|queue)_ms$")
_GOODPUT_FAMILIES = ("ttft", "tpot", "e2el")
_STEP_UP, _STEP_DOWN = 1.25, 0.8
_FLOOR = 1 / 64
"""Below this fraction of the burst throughput the search gives up: no rate meets."""


def parse_slos(text: str | None, *, where: str = "--slo") -> tuple[Constraint, ...]:
    """'p99_ttft_ms<=1000,p99_tpot_ms<=50' -> constraints; the default SLOs when None or empty.

    Only upper bounds on latency statistics (mean, median or a percentile of ttft, tpot, itl,
    e2el or queue, in ms): a capacity is the rate up to which they hold.
    """
    items = [s for s in (text or "").split(",") if s.strip()] or list(DEFAULT_SLOS)
    out = []
    for item in items:
        m = _SLO_RE.match(item)
        if not m:
            raise ConfigError(f"{where}: {item.strip()!r} is not 'metric <= value' (an upper "
                              f"bound, e.g. p99_ttft_ms<=1000)")
        metric, op = m.group(1), m.group(2)
        stat = _LATENCY_RE.match(metric)
        if not stat:
            raise ConfigError(f"{where}: {metric!r} is not a latency statistic: use mean_, "
                              f"median_ or pNN_ with ttft, tpot, itl, e2el or queue and _ms "
                              f"(e.g. p99_ttft_ms)")
        if stat.group(2) is not None and not 0 < float(stat.group(2)) <= 100:
            raise ConfigError(f"{where}: {metric}: a percentile lies in (0, 100], got "
                              f"{stat.group(2)}")
        try:
            value = float(m.group(3))
        except ValueError:
            value = math.nan
        if not (value > 0 and math.isfinite(value)):
            raise ConfigError(f"{where}: {metric} must be bounded by a positive, finite number "
                              f"of ms, got {m.group(3)!r}")
        out.append(Constraint(metric=metric, op=op, value=value))
    names = [c.metric for c in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"{where}: {', '.join(twice)} is bounded twice")
    return tuple(out)


def latency_upper_bounds(constraints) -> tuple[Constraint, ...]:
    """The constraints that are SLOs a capacity can be measured against (upper bounds on
    latency statistics); the default SLOs when there are none."""
    slos = tuple(c for c in constraints if c.op in ("<=", "<") and _LATENCY_RE.match(c.metric))
    return slos or parse_slos(None)


@dataclass(frozen=True)
class RateRun:
    """One run of the search: its rate, the SLO metrics and whether it kept up."""

    rate: float
    num_prompts: int
    values: dict[str, float]
    request_throughput: float
    output_throughput: float
    request_goodput: float | None
    """Requests/s within the SLOs' goodput thresholds (`goodput_thresholds`); None where the SLOs
    give none."""
    queue_growth_rps: float | None
    over_capacity: bool
    failed: int
    violations: tuple[str, ...]
    client_cap: int | None = None
    """The client's max_concurrency where the run's requests in flight reached it (it, not the
    engine, then held the rest back); None otherwise."""

    @property
    def meets(self) -> bool:
        return not self.violations

    def as_dict(self) -> dict:
        return {"rate": self.rate, "num_prompts": self.num_prompts, "meets": self.meets,
                "violations": list(self.violations), **self.values,
                "request_throughput": self.request_throughput,
                "output_throughput": self.output_throughput,
                "request_goodput": self.request_goodput,
                "queue_growth_rps": self.queue_growth_rps, "over_capacity": self.over_capacity,
                "failed": self.failed}


@dataclass(frozen=True)
class Capacity:
    """The answer: the highest rate that meets the SLOs, with the runs that show it."""

    rate: float
    slos: tuple[Constraint, ...]
    binding: str
    binding_detail: str
    burst_request_throughput: float
    num_gpus: int
    runs: tuple[RateRun, ...]
    below: RateRun | None
    above: RateRun | None
    at: RateRun | None
    envelope: dict[str, float] | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def rate_per_gpu(self) -> float:
        return self.rate / self.num_gpus

    def as_dict(self) -> dict:
        at = self.at
        return {
            "max_sustainable_rate": self.rate,
            "max_sustainable_rate_per_gpu": self.rate_per_gpu,
            "slos": [str(c) for c in self.slos],
            "binding": self.binding, "binding_detail": self.binding_detail,
            "goodput_at_capacity": at.request_goodput if at else None,
            "output_throughput_at_capacity": at.output_throughput if at else 0.0,
            "burst_request_throughput": self.burst_request_throughput,
            "num_gpus": self.num_gpus,
            "neighbours": {"below": self.below.as_dict() if self.below else None,
                           "above": self.above.as_dict() if self.above else None},
            "envelope": self.envelope, "notes": list(self.notes),
            "runs": [r.as_dict() for r in self.runs],
        }


def _check_workload(cfg: SimConfig) -> None:
    w = cfg.workload
    if w.ramp_up_strategy is not None:
        raise ConfigError("workload.ramp_up_strategy: capacity varies the request rate itself; "
                          "remove the ramp-up")
    if isinstance(w.dataset, SESSION_DATASETS):
        raise ConfigError(f"workload.dataset: {w.dataset.kind}: the request rate is the rate "
                          "sessions start, and each turn waits for the reply before it, so the "
                          "rate of requests is not capacity's to set; use a single-turn dataset")
    if getattr(w.dataset, "use_timestamps", False):
        raise ConfigError("workload.dataset.use_timestamps: a trace's own timestamps fix its "
                          "rate; set it to false to find the capacity for the trace's "
                          "request shapes")


def goodput_thresholds(slos: tuple[Constraint, ...]) -> dict[str, float]:
    """The per-request goodput thresholds the SLOs give (vLLM's --goodput: a request counts when
    its TTFT, TPOT and E2E latency are each within their bound): each percentile SLO on ttft,
    tpot or e2el bounds every request's value (the tightest where several do). A mean or median
    bound is not one on each request (half the requests exceed a median by construction), nor
    is one on the ITL or the queue (vLLM's goodput has no such threshold); none gives one."""
    goodput: dict[str, float] = {}
    for c in slos:
        m = _LATENCY_RE.match(c.metric)
        fam = m.group(3)
        if m.group(2) is not None and fam in _GOODPUT_FAMILIES:
            goodput[fam] = min(goodput.get(fam, math.inf), c.value)
    return goodput


def _with_slo_metrics(cfg: SimConfig, slos: tuple[Constraint, ...]) -> SimConfig:
    """The config with every SLO percentile reported and the SLOs' goodput thresholds
    (`goodput_thresholds`) in place of its own; none where they give none."""
    pcts = list(cfg.metrics.percentiles)
    for c in slos:
        m = _LATENCY_RE.match(c.metric)
        if m.group(2) is not None and float(m.group(2)) not in pcts:
            pcts.append(float(m.group(2)))
    return cfg.with_section("metrics", percentiles=tuple(sorted(pcts)),
                            goodput=goodput_thresholds(slos) or None)


class _Search:
    """The runs of one capacity search (one op-scale), cached by rate."""

    def __init__(self, cfg: SimConfig, slos: tuple[Constraint, ...], *, window_s: float,
                 min_prompts: int, max_prompts: int, op_scale: dict[str, float] | None,
                 progress: Callable[[RateRun], None] | None):
        self.cfg, self.slos = cfg, slos
        self.window_s, self.min_prompts, self.max_prompts = window_s, min_prompts, max_prompts
        self.op_scale, self.progress = op_scale, progress
        self.runs: dict[float, RateRun] = {}
        self.num_gpus = 0

    def _simulate(self, rate: float, num_prompts: int) -> dict:
        from simcore.simulate import simulate

        result = simulate(self.cfg.with_section("workload", request_rate=rate,
                                                num_prompts=num_prompts),
                          op_scale=self.op_scale)
        self.num_gpus = result["num_gpus"]
        return result

    def burst(self) -> float:
        """Request throughput with every request sent at once."""
        n = max(self.min_prompts, self.cfg.workload.resolved_num_prompts or self.min_prompts)
        return float(self._simulate(math.inf, min(n, self.max_prompts))["request_throughput"])

    def at(self, rate: float) -> RateRun:
        key = float(f"{rate:.6g}")
        if key in self.runs:
            return self.runs[key]
        n = int(min(self.max_prompts, max(self.min_prompts, math.ceil(key * self.window_s))))
        r = self._simulate(key, n)
        violations = []
        values = {}
        for c in self.slos:
            if c.metric not in r or r[c.metric] is None:
                raise ConfigError(f"--slo: the result has no {c.metric}")
            v = r[c.metric]
            values[c.metric] = float(v)
            if not c.met(float(v)):
                violations.append(f"{c.metric} {float(v):,.4g} > {c.value:g}")
        if r["failed"]:
            violations.append(f"{r['failed']} requests failed")
        # The load trend is measured when the run has enough requests at a finite rate.
        trend = "over_capacity" in r
        over = trend and bool(r["over_capacity"])
        growth = r["queue_growth_rps"] if trend else None
        if over:
            violations.append(f"queue grows {growth:.3g} req/s")
        run = RateRun(rate=key, num_prompts=n, values=values,
                      request_throughput=float(r["request_throughput"]),
                      output_throughput=float(r["output_throughput"]),
                      request_goodput=(None if r["request_goodput"] is None
                                       else float(r["request_goodput"])),
                      queue_growth_rps=growth, over_capacity=over, failed=int(r["failed"]),
                      violations=tuple(violations), client_cap=_client_cap(r))
        self.runs[key] = run
        if self.progress is not None:
            self.progress(run)
        return run

    def bracket(self, start: float, floor: float, tolerance: float,
                known: RateRun | None = None) -> tuple[RateRun | None, RateRun]:
        """(highest meeting run or None, lowest failing run above it), within tolerance;
        `known`, a run found to meet, bounds the meeting side from below where it lies under
        the failing run."""
        first = self.at(start)
        lo: RateRun | None = None
        hi: RateRun | None = None
        if first.meets:
            lo = first
            for _ in range(40):
                nxt = self.at(lo.rate * _STEP_UP)
                if not nxt.meets:
                    hi = nxt
                    break
                lo = nxt
            if hi is None:
                raise ConfigError("capacity: every rate tried up to "
                                  f"{lo.rate:,.4g} req/s met the SLOs; loosen nothing, but "
                                  "check the SLOs bound what you mean")
        else:
            hi = first
            while hi.rate * _STEP_DOWN >= floor:
                nxt = self.at(hi.rate * _STEP_DOWN)
                if nxt.meets:
                    lo = nxt
                    break
                hi = nxt
        if known is not None and known.meets and known.rate < hi.rate and (
                lo is None or known.rate > lo.rate):
            lo = known
        if lo is None:
            return None, hi
        while hi.rate / lo.rate > 1 + tolerance:
            mid = self.at(math.sqrt(lo.rate * hi.rate))
            if mid.meets:
                lo = mid
            else:
                hi = mid
        return lo, hi


def _client_cap(result: dict) -> int | None:
    """The workload's max_concurrency where a run's requests in flight reached it."""
    cap = result.get("max_concurrency")
    peak = result.get("max_concurrent_requests")
    return int(cap) if cap is not None and peak is not None and peak >= cap else None


def _binding(run: RateRun, slos: tuple[Constraint, ...]) -> tuple[str, str]:
    """The SLO missed by the largest factor in `run` (else the queue's growth: behind the
    client's max_concurrency where the run reached it, else the engine's)."""
    worst = max(((run.values[c.metric] / c.value, c) for c in slos
                 if not c.met(run.values[c.metric])), default=None, key=lambda t: t[0])
    if worst is not None:
        ratio, c = worst
        return c.metric, (f"{c.metric} is {run.values[c.metric]:,.4g} ms at {run.rate:,.4g} "
                          f"req/s, {ratio:.2f}x its bound of {c.value:g}")
    if run.over_capacity and run.client_cap is not None:
        return "max_concurrency", (
            f"the SLOs hold but requests pile up {run.queue_growth_rps:.3g} req/s at "
            f"{run.rate:,.4g} req/s behind the client's max_concurrency of {run.client_cap} in "
            f"flight (workload.max_concurrency), which caps what is served at "
            f"{run.request_throughput:,.4g} req/s")
    if run.over_capacity:
        return "queue_growth", (f"the SLOs hold but the queue grows {run.queue_growth_rps:.3g} "
                                f"req/s at {run.rate:,.4g} req/s: the engine cannot keep up")
    return "failed_requests", f"{run.failed} requests failed at {run.rate:,.4g} req/s"


def find_capacity(cfg: SimConfig, slos: tuple[Constraint, ...] | None = None, *,
                  tolerance: float = 0.05, window_s: float = 120.0, min_prompts: int = 200,
                  max_prompts: int = 20_000, envelope: bool = True,
                  progress: Callable[[RateRun], None] | None = None,
                  start: float | None = None) -> Capacity:
    """The highest sustainable request rate of `cfg`'s deployment under `slos` (see the module
    docstring), the bracket starting at `start` where given (else 0.9x the burst's throughput);
    raises ConfigError for a workload whose rate cannot vary."""
    if not 0 < tolerance < 1:
        raise ConfigError("tolerance: must be in (0, 1)")
    slos = slos or parse_slos(None)
    _check_workload(cfg)
    cfg = _with_slo_metrics(cfg, slos)
    kw = dict(window_s=window_s, min_prompts=min_prompts, max_prompts=max_prompts,
              progress=progress)
    search = _Search(cfg, slos, op_scale=None, **kw)
    burst = search.burst()
    if not burst > 0:
        raise ConfigError("capacity: the burst run completed no request; nothing to search")
    first, known = burst * 0.9, None
    if start is not None and start > 0:
        known = search.at(start)
        first = max(start, first)
    lo, hi = search.bracket(first, burst * _FLOOR, tolerance, known)
    notes: list[str] = []
    below = above = None
    if lo is None:
        rate = 0.0
        notes.append(f"no rate meets the SLOs: even at {hi.rate:,.4g} req/s "
                     f"({', '.join(hi.violations)})")
    else:
        rate = lo.rate
        below, above = search.at(rate * 0.9), search.at(rate * 1.1)
        if not below.meets:
            notes.append(f"the run at 0.9x ({below.rate:,.4g} req/s) misses "
                         f"({', '.join(below.violations)}): the edge is noisy at this run length")
        if above.meets:
            notes.append(f"the run at 1.1x ({above.rate:,.4g} req/s) meets the SLOs: the edge "
                         "is noisy at this run length")
    binding, detail = _binding(hi, slos)
    env = None
    if envelope and lo is not None:
        env = _capacity_envelope(cfg, slos, rate, tolerance, burst, kw)
    runs = tuple(sorted(search.runs.values(), key=lambda r: r.rate))
    return Capacity(rate=rate, slos=slos, binding=binding, binding_detail=detail,
                    burst_request_throughput=burst, num_gpus=search.num_gpus, runs=runs,
                    below=below, above=above, at=lo, envelope=env, notes=tuple(notes))


def _capacity_envelope(cfg: SimConfig, slos: tuple[Constraint, ...], rate: float,
                       tolerance: float, burst: float, kw: dict) -> dict[str, float]:
    """The capacity with every op class at the low and at the high end of its error bound."""
    from simcore.setup import build_deployment
    from simcore.uncertainty import perturbations

    bounds = build_deployment(cfg).step_model.op_error_bounds()
    fast, slow = perturbations(bounds, "bounds", 0, cfg.seed)
    out = {"nominal": rate}
    for name, scale in (("high", fast), ("low", slow)):
        s = _Search(cfg, slos, op_scale=scale, **{**kw, "progress": None})
        lo, _ = s.bracket(rate, burst * _FLOOR * min(scale.values()), tolerance)
        out[name] = lo.rate if lo is not None else 0.0
    out["op_error_bounds"] = dict(bounds)
    return out


def render_capacity(c: Capacity) -> str:
    """The answer first, then the runs that show it."""
    slos = ", ".join(str(s) for s in c.slos)
    lines = []
    if c.rate > 0:
        at = c.at
        lines.append(f"Capacity: {c.rate:,.4g} req/s ({c.rate_per_gpu:,.4g} per GPU on "
                     f"{c.num_gpus}) under {slos}")
        goodput = ("goodput n/a (no percentile SLO on TTFT, TPOT or E2E latency to hold each "
                   "request to)" if at.request_goodput is None else
                   f"goodput {at.request_goodput:,.4g} req/s")
        lines.append(f"  at it: {at.output_throughput:,.0f} output tok/s, {goodput}")
    else:
        lines.append(f"Capacity: none: no rate meets {slos}")
    lines.append(f"  binds first: {c.binding_detail}")
    if c.envelope is not None:
        e = c.envelope
        lines.append(f"  envelope: {e['low']:,.4g} - {e['high']:,.4g} req/s (every op class at "
                     f"either end of its error bound)")
    lines.append(f"  burst (every request at once): {c.burst_request_throughput:,.4g} req/s "
                 f"served")
    lines.extend(f"  note: {n}" for n in c.notes)
    names = [s.metric for s in c.slos]
    header = (f"{'rate':>10}  {'requests':>8}  " + "  ".join(f"{n:>12}" for n in names)
              + f"  {'served':>8}  {'queue +/s':>9}  verdict")
    lines += ["", header]
    for r in c.runs:
        mark = (" <- capacity" if c.at is not None and r.rate == c.at.rate
                else " (0.9x)" if c.below is not None and r.rate == c.below.rate
                else " (1.1x)" if c.above is not None and r.rate == c.above.rate else "")
        growth = "-" if r.queue_growth_rps is None else f"{r.queue_growth_rps:+.3g}"
        lines.append(f"{r.rate:10,.4g}  {r.num_prompts:8d}  "
                     + "  ".join(f"{r.values[n]:12,.4g}" for n in names)
                     + f"  {r.request_throughput:8,.4g}  {growth:>9}  "
                     + ("meets" if r.meets else "misses") + mark)
    return "\n".join(lines)
