"""DCQCN congestion control as pure rate state machines driven by the NIC with explicit times: the
sender's reaction point per flow and the receiver's notification point (Zhu et al., SIGCOMM'15)."""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass
from enum import StrEnum

from simcore.errors import ConfigError
from simcore.units import MB

PAPER_REFERENCE_LINE_RATE_BPS = 40e9
"""The paper's parameters are for its 40 Gb/s RoCEv2 NICs."""

MELLANOX_REFERENCE_LINE_RATE_BPS = 25e9
"""The Mellanox-style values (HPCC's ns-3 simulator, alibaba-edu/High-Precision-Congestion-Control,
its DCQCN defaults) are quoted at 25 Gb/s."""

DEFAULT_CNP_INTERVAL_S = 50e-6
"""At most one CNP per flow per 50 us (N in Zhu et al., "Congestion Control for Large-Scale RDMA
Deployments", SIGCOMM 2015, section 3.2)."""

_INF = math.inf


class IncreaseStage(StrEnum):
    """Which rule a rate-increase event applied."""

    FAST_RECOVERY = "fast_recovery"
    ADDITIVE = "additive"
    HYPER = "hyper"


@dataclass(frozen=True, slots=True, kw_only=True)
class DcqcnParams:
    """Settings of one DCQCN reaction point. Build them with `paper()` or `mellanox()` and override
    fields with `dataclasses.replace`.

    Scaling rule of both constructors: rates (R_AI, R_HAI, min rate) and the byte counter B are
    proportional to the line rate, from the speed their values were published at (paper: 40 Gb/s,
    Mellanox-style: 25 Gb/s), so a step is the same fraction of the link and B takes the same time
    at line rate on every link; times (timers, intervals), g and F do not scale.
    """

    line_rate_bps: float
    """Port rate in bits/s. RC and RT never exceed it; the flow starts at it, unlimited."""

    g: float
    """Gain of the alpha EWMA (dimensionless). 1/256 in the paper and in the Mellanox-style
    settings (HPCC's simulator, EWMA_GAIN 0.00390625)."""

    alpha_timer_s: float
    """K, seconds: alpha decays by (1 - g) every K without a cut. Paper 55 us ("K must be larger
    than the CNP generation timer"); Mellanox `dce_tcp_rtt` / t_alpha 1 us."""

    rate_decrease_min_interval_s: float
    """Seconds between two rate cuts at least; CNPs arriving sooner are coalesced into one cut
    when the interval ends. Paper 0 (every CNP cuts); Mellanox `rate_reduce_monitor_period`
    (t_dec) 4 us."""

    increase_timer_s: float
    """T, seconds between timer-driven rate-increase events while rate-limited. Paper 55 us;
    Mellanox `rpg_time_reset` (t_inc) 300 us."""

    byte_counter_bytes: int | None
    """B, bytes sent between byte-counter rate-increase events; None turns the byte counter off,
    so its count BC stays 0 (it never completes a cycle) and hyper increase cannot happen. Paper
    10 MB at 40 Gb/s; Mellanox style: off, as in HPCC's simulator (NIC `rpg_byte_reset`)."""

    fast_recovery_steps: int
    """F, fast-recovery iterations per counter after a cut. Paper 5; Mellanox `rpg_threshold` 1."""

    rate_ai_bps: float
    """R_AI, bits/s added to RT per additive-increase step. Paper 40 Mb/s at 40 Gb/s; Mellanox
    `rpg_ai_rate` 5 Mb/s at 25 Gb/s."""

    rate_hai_bps: float
    """R_HAI, bits/s per hyper-increase stage (RT += i R_HAI). 200 Mb/s at 40 Gb/s in the paper
    authors' simulator (bobzhuyb/ns3-rdma, mix/config.txt); Mellanox `rpg_hai_rate` 50 Mb/s at
    25 Gb/s."""

    min_rate_bps: float
    """Floor of RC in bits/s (Mellanox `rpg_min_rate`). Both constructors use line rate / 1000:
    100 Mb/s at 100 Gb/s, HPCC's simulator MIN_RATE and htsim's DCQCN floor."""

    initial_alpha: float = 1.0
    """Alpha (dimensionless, 0..1) used by the first cut. 1.0: one CNP halves the rate. HPCC's
    simulator sets alpha = 1 at the first CNP; Mellanox `initial_alpha_value` 1023/1024."""

    clamp_target_rate_on_cut: bool
    """True: every cut sets RT <- RC (paper; Mellanox `clamp_tgt_rate` = 1). False: a cut sets
    RT <- RC only if a rate-increase event (timer or byte counter) happened since the previous
    cut, so back-to-back cuts keep the older, higher target (Mellanox `clamp_tgt_rate` = 0 with
    `clamp_tgt_rate_after_time_inc` = 1, the firmware defaults)."""

    def __post_init__(self) -> None:
        def bad(name: str, what: str) -> ConfigError:
            return ConfigError(f"dcqcn.{name} must be {what}, got {getattr(self, name)!r}")

        for name in ("line_rate_bps", "alpha_timer_s", "increase_timer_s", "min_rate_bps"):
            if not (getattr(self, name) > 0 and math.isfinite(getattr(self, name))):
                raise bad(name, "positive and finite")
        if not 0 < self.g <= 1:
            raise bad("g", "in (0, 1]")
        if not (self.rate_decrease_min_interval_s >= 0
                and math.isfinite(self.rate_decrease_min_interval_s)):
            raise bad("rate_decrease_min_interval_s", "non-negative and finite")
        if self.byte_counter_bytes is not None and not self.byte_counter_bytes > 0:
            raise bad("byte_counter_bytes", "positive or None")
        if not (isinstance(self.fast_recovery_steps, int) and self.fast_recovery_steps >= 0):
            raise bad("fast_recovery_steps", "a non-negative integer")
        for name in ("rate_ai_bps", "rate_hai_bps"):
            if not (getattr(self, name) >= 0 and math.isfinite(getattr(self, name))):
                raise bad(name, "non-negative and finite")
        if self.min_rate_bps > self.line_rate_bps:
            raise bad("min_rate_bps", f"at most line_rate_bps ({self.line_rate_bps!r})")
        if not 0 <= self.initial_alpha <= 1:
            raise bad("initial_alpha", "in [0, 1]")

    @classmethod
    def paper(cls, line_rate_bps: float) -> DcqcnParams:
        """Zhu et al. 2015: K = T = 55 us, B = 10 MB, F = 5, R_AI = 40 Mb/s, R_HAI = 200 Mb/s and
        g = 1/256 at 40 Gb/s; every CNP cuts and clamps RT. Rates and B scaled to the line rate."""
        scale = line_rate_bps / PAPER_REFERENCE_LINE_RATE_BPS
        return cls(line_rate_bps=line_rate_bps, g=1 / 256, alpha_timer_s=55e-6,
                   rate_decrease_min_interval_s=0.0, increase_timer_s=55e-6,
                   byte_counter_bytes=max(1, round(10 * MB * scale)), fast_recovery_steps=5,
                   rate_ai_bps=40e6 * scale, rate_hai_bps=200e6 * scale,
                   min_rate_bps=line_rate_bps / 1000, clamp_target_rate_on_cut=True)

    @classmethod
    def mellanox(cls, line_rate_bps: float) -> DcqcnParams:
        """Mellanox / NVIDIA ConnectX style (the DCQCN of HPCC's ns-3 simulator, Li et al., SIGCOMM 2019): t_alpha
        1 us, t_dec 4 us, t_inc 300 us, F = 1, R_AI 5 Mb/s and R_HAI 50 Mb/s at 25 Gb/s, g =
        1/256, no byte counter, RT not clamped on back-to-back cuts. Rates scaled to line rate."""
        scale = line_rate_bps / MELLANOX_REFERENCE_LINE_RATE_BPS
        return cls(line_rate_bps=line_rate_bps, g=1 / 256, alpha_timer_s=1e-6,
                   rate_decrease_min_interval_s=4e-6, increase_timer_s=300e-6,
                   byte_counter_bytes=None, fast_recovery_steps=1,
                   rate_ai_bps=5e6 * scale, rate_hai_bps=50e6 * scale,
                   min_rate_bps=line_rate_bps / 1000, clamp_target_rate_on_cut=False)


def _num_ticks(start_at: float, period_s: float, now_s: float) -> int:
    """How many of the instants start_at + j * period_s (j = 1, 2, ...) are <= now_s, computed
    with the same expression the timers use, so an event exactly at now_s counts."""
    if now_s < start_at + period_s:
        return 0
    k = int((now_s - start_at) / period_s)
    while start_at + (k + 1) * period_s <= now_s:
        k += 1
    while k > 0 and start_at + k * period_s > now_s:
        k -= 1
    return k


class ReactionPoint:
    """The sending NIC's DCQCN state for one flow (queue pair): current rate RC, target rate RT,
    alpha, the timer and byte counters and their stage counts. Rates are bits/s; nothing here owns
    a clock or schedules anything: the NIC calls the event methods with the current virtual time,
    asks `next_event_s()` when to call `advance` next, and re-reads `rate_bps` after every call.

    Paper semantics (Zhu et al., SIGCOMM 2015, section 3.3, the reaction point's algorithm):

    * CNP -> cut: RT <- RC; RC <- max(min_rate, RC (1 - alpha/2)); alpha <- (1 - g) alpha + g;
      the timer and the byte counter restart from zero.
    * Every K (`alpha_timer_s`) after the last cut: alpha <- (1 - g) alpha.
    * Rate-increase events come from a timer (every T = `increase_timer_s`, counted in T) and a
      byte counter (every B bytes sent, counted in BC). Both counts include the event being
      handled: the first event after a cut sees a count of 1. With F = `fast_recovery_steps`:
      max(T, BC) <= F: fast recovery, RC <- (RT + RC)/2;
      min(T, BC) > F: hyper increase, RT += i R_HAI with i = min(T, BC) - F, then RC <- (RT + RC)/2;
      otherwise additive increase, RT += R_AI, then RC <- (RT + RC)/2. RT is capped at the line
      rate. That is exactly F fast-recovery steps per counter (F = 5 iterations in the paper),
      hyper increase only once both counters are past F (QCN), and the comparisons of htsim's
      `DCQCNSrc::increaseRate`.

    Mellanox style adds a minimum interval between cuts (NVIDIA `rate_reduce_monitor_period`): a
    CNP inside it does not cut at once; the CNPs of the interval are coalesced into one cut when it
    ends. The paper cuts on every CNP (interval 0).

    Lifecycle: created unlimited at the line rate (RC = RT = line rate, alpha = `initial_alpha`,
    no timers). The first cut starts rate limiting: from then on the increase timer fires every
    `increase_timer_s` after the last cut and the byte counter counts bytes sent. When increases
    bring RC back to the line rate the limiter is released (QCN; NVIDIA `rpg_max_rate`: "the flow is
    not rate limited any more"): timers and byte counting stop until the next CNP.

    Time: `now_s` only moves forward. Every event method first runs `advance(now_s)`, which handles
    every timer event due at or before `now_s` in time order, each at its own instant (increase
    timer events at cut + k T, a deferred cut at last cut + t_dec; a timer event and a deferred cut
    at the same instant: the timer event first). An event due exactly at `now_s` therefore comes
    before the CNP or bytes of the call. Alpha's decay ticks (last cut + j K) change nothing but
    alpha, which only a cut reads, so alpha is evaluated in closed form at the instant it is
    needed, alpha_ref (1 - g)^j, and its ticks never appear in `next_event_s()`: a 1 us alpha
    timer costs the NIC's scheduler nothing.

    Invariant (checked by property tests): min_rate <= RC <= RT <= line rate. Cuts only lower RC
    and leave RT >= the old RC; increases average RC towards RT and cap RT at the line rate.
    """

    __slots__ = ("params", "now_s", "_rc", "_rt", "_alpha_ref", "_alpha_ref_at", "timer_stage",
                 "byte_stage", "bytes_since_byte_event", "is_rate_limited", "last_cut_at",
                 "_increase_anchor_at", "_next_increase_at", "_pending_cut_at", "num_cnps",
                 "num_cnps_coalesced", "num_cuts", "num_timer_events", "num_byte_counter_events",
                 "num_increases")

    def __init__(self, params: DcqcnParams, now_s: float = 0.0) -> None:
        self.params = params
        self.now_s = now_s
        self._rc = params.line_rate_bps
        self._rt = params.line_rate_bps
        self._alpha_ref = params.initial_alpha
        self._alpha_ref_at: float | None = None     # time of the last cut (alpha's timer start)
        self.timer_stage = 0                        # T: timer events since the last cut
        self.byte_stage = 0                         # BC: byte-counter events since the last cut
        self.bytes_since_byte_event = 0
        self.is_rate_limited = False
        self.last_cut_at: float | None = None
        self._increase_anchor_at = 0.0
        self._next_increase_at = _INF
        self._pending_cut_at = _INF
        self.num_cnps = 0
        self.num_cnps_coalesced = 0                 # CNPs folded into an already pending cut
        self.num_cuts = 0
        self.num_timer_events = 0
        self.num_byte_counter_events = 0
        self.num_increases: dict[IncreaseStage, int] = {s: 0 for s in IncreaseStage}

    @property
    def rate_bps(self) -> float:
        """RC: the rate the NIC paces this flow at, bits/s."""
        return self._rc

    @property
    def target_rate_bps(self) -> float:
        """RT: the rate fast recovery converges to, bits/s."""
        return self._rt

    @property
    def alpha(self) -> float:
        """Alpha at `now_s`."""
        return self.alpha_at(self.now_s)

    @property
    def pending_cut_at(self) -> float | None:
        """When the coalesced cut of CNPs received inside the minimum interval happens, if any."""
        return None if self._pending_cut_at == _INF else self._pending_cut_at

    def alpha_at(self, t_s: float) -> float:
        """Alpha at time t_s (>= the last cut): its value after the last cut, decayed once per
        alpha-timer tick at or before t_s."""
        if self._alpha_ref_at is None:
            return self._alpha_ref
        k = _num_ticks(self._alpha_ref_at, self.params.alpha_timer_s, t_s)
        return self._alpha_ref * (1 - self.params.g) ** k

    def next_event_s(self) -> float:
        """When `advance` next has something to do (an increase-timer event or a deferred cut);
        inf while the flow is unlimited and no cut is pending."""
        return min(self._next_increase_at, self._pending_cut_at)

    def advance(self, now_s: float) -> None:
        """Handle every timer event due at or before now_s, in time order, then set the clock."""
        if now_s < self.now_s:
            raise ValueError(f"time went backwards: {now_s!r} < {self.now_s!r}")
        while True:
            t_inc, t_cut = self._next_increase_at, self._pending_cut_at
            if t_inc <= t_cut:
                if t_inc > now_s:
                    break
                self.now_s = t_inc
                self.timer_stage += 1
                self.num_timer_events += 1
                self._increase()
                if self.is_rate_limited:
                    period_s = self.params.increase_timer_s
                    self._next_increase_at = (self._increase_anchor_at
                                              + (self.timer_stage + 1) * period_s)
            else:
                if t_cut > now_s:
                    break
                self.now_s = t_cut
                self._cut(t_cut)
        self.now_s = now_s

    def on_cnp(self, now_s: float) -> bool:
        """A CNP for this flow arrived. Returns True if it cut the rate now, False if the cut is
        deferred to the end of the minimum interval since the last cut (or already pending)."""
        self.advance(now_s)
        self.num_cnps += 1
        if self._pending_cut_at != _INF:
            self.num_cnps_coalesced += 1
            return False
        if self.last_cut_at is not None:
            earliest_at = self.last_cut_at + self.params.rate_decrease_min_interval_s
            if now_s < earliest_at:
                self._pending_cut_at = earliest_at
                return False
        self._cut(now_s)
        return True

    def on_bytes_sent(self, n_bytes: int, now_s: float) -> None:
        """The NIC put n_bytes of this flow on the wire at now_s. While rate-limited, every
        `byte_counter_bytes` of them is one byte-counter increase event, all at now_s."""
        if n_bytes < 0:
            raise ValueError(f"n_bytes must be non-negative, got {n_bytes!r}")
        self.advance(now_s)
        b = self.params.byte_counter_bytes
        if b is None or not self.is_rate_limited:
            return
        self.bytes_since_byte_event += n_bytes
        while self.bytes_since_byte_event >= b and self.is_rate_limited:
            self.bytes_since_byte_event -= b
            self.byte_stage += 1
            self.num_byte_counter_events += 1
            self._increase()

    def _cut(self, t_s: float) -> None:
        p = self.params
        alpha = self.alpha_at(t_s)
        if p.clamp_target_rate_on_cut or self.timer_stage or self.byte_stage:
            self._rt = self._rc
        self._rc = max(p.min_rate_bps, self._rc * (1 - alpha / 2))
        self._alpha_ref = (1 - p.g) * alpha + p.g
        self._alpha_ref_at = t_s
        self.timer_stage = self.byte_stage = 0
        self.bytes_since_byte_event = 0
        self.last_cut_at = t_s
        self._pending_cut_at = _INF
        self.num_cuts += 1
        self.is_rate_limited = self._rc < p.line_rate_bps
        self._increase_anchor_at = t_s
        self._next_increase_at = t_s + p.increase_timer_s if self.is_rate_limited else _INF

    def _increase(self) -> None:
        p = self.params
        line = p.line_rate_bps
        t, bc, f = self.timer_stage, self.byte_stage, p.fast_recovery_steps
        if max(t, bc) <= f:
            stage = IncreaseStage.FAST_RECOVERY
        elif min(t, bc) > f:
            stage = IncreaseStage.HYPER
            self._rt = min(line, self._rt + (min(t, bc) - f) * p.rate_hai_bps)
        else:
            stage = IncreaseStage.ADDITIVE
            self._rt = min(line, self._rt + p.rate_ai_bps)
        self._rc = (self._rt + self._rc) / 2
        self.num_increases[stage] += 1
        if self._rc >= line:
            self._rc = line
            self.is_rate_limited = False
            self._next_increase_at = _INF
            self.bytes_since_byte_event = 0


class NotificationPoint:
    """The receiving NIC's CNP generator: answers ECN-marked packets with at most one CNP per flow
    per `cnp_interval_s`.

    A marked packet of a flow triggers a CNP at once unless that flow got one less than
    `cnp_interval_s` ago; marks inside the interval are absorbed (the paper's N = 50 us per flow;
    NVIDIA's `min_time_between_cnps` is the same knob). htsim's sink additionally sends a late CNP
    when the interval ends if a mark was absorbed; this one does not. Flows are independent.
    Lifecycle: one per receiving NIC; `forget` a flow when it ends to drop its state.
    """

    __slots__ = ("cnp_interval_s", "_next_cnp_at", "num_marked_packets", "num_cnps")

    def __init__(self, cnp_interval_s: float = DEFAULT_CNP_INTERVAL_S) -> None:
        if not (cnp_interval_s >= 0 and math.isfinite(cnp_interval_s)):
            raise ConfigError(f"dcqcn.cnp_interval_s must be non-negative and finite, "
                              f"got {cnp_interval_s!r}")
        self.cnp_interval_s = cnp_interval_s
        self._next_cnp_at: dict[Hashable, float] = {}
        self.num_marked_packets = 0
        self.num_cnps = 0

    @property
    def num_suppressed(self) -> int:
        """Marked packets that did not trigger a CNP."""
        return self.num_marked_packets - self.num_cnps

    def on_ecn_marked_packet(self, flow_key: Hashable, now_s: float) -> bool:
        """A CE-marked packet of flow_key arrived at now_s; True if a CNP must be sent for it."""
        self.num_marked_packets += 1
        next_at = self._next_cnp_at.get(flow_key)
        if next_at is not None and now_s < next_at:
            return False
        self._next_cnp_at[flow_key] = now_s + self.cnp_interval_s
        self.num_cnps += 1
        return True

    def forget(self, flow_key: Hashable) -> None:
        """Drop a finished flow's state (its next marked packet, if any, gets a CNP at once)."""
        self._next_cnp_at.pop(flow_key, None)
