"""The flow-level fabric: every message is a fluid flow on its ECMP path, and the flows in progress
share the links max-min fairly (progressive filling), recomputed whenever a flow starts or ends.

A flow carries its on-wire bytes W (payload plus a header per packet) at its fair rate. When the
last of them has left, the message still needs its pipeline latency (propagation on every hop plus
the first packet's store-and-forward on all but the slowest hop, `pipeline_latency_s`), so a flow
alone completes at exactly the analytical time, and a single packet after sum_h (L/C_h + d_h).
"""

from __future__ import annotations

from collections.abc import Callable

import heapq
import math
from typing import Any

import numpy as np

from simcore.fabric.analytical import MessageFabric, pipeline_latency_s
from simcore.fabric.protocol import FabricStats, LinkStats, OnDone
from simcore.fabric.settings import FabricSettings
from simcore.fabric.topology import Topology
from simcore.fabric.utilization import LinkLoadRecorder

_ARRIVE = 0
_DELIVER = 1
_TIE = 1e-12
"""Relative time tolerance within which fluid departures count as simultaneous."""


def max_min_rates(hops: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """Max-min fair rates by progressive filling.

    `hops` is (path length, flows): row j holds every flow's j-th link, paths shorter than the
    longest padded with the last index of `capacity`, which must be infinite. All unfrozen flows
    grow together; when a link runs out, the flows crossing it freeze at the level reached.
    Returns one rate per flow.

    A link's fill level (capacity left over frozen flows, over its unfrozen flows) only rises as
    flows freeze elsewhere, so the lowest-level link is a bottleneck now; so is every next one in
    level order that shares no unfrozen flow with those before it (their levels cannot have
    changed). Each round freezes the longest such prefix at once, which keeps the rounds few.
    """
    num_hops, num_flows = hops.shape
    rates = np.zeros(num_flows)
    if num_flows == 0:
        return rates
    if num_flows == 1:
        rates[0] = capacity[hops[:, 0]].min()
        return rates
    pad = len(capacity) - 1
    cols = [hops[j] for j in range(num_hops)]
    counts = np.zeros(pad + 1)
    for col in cols:
        counts += np.bincount(col, minlength=pad + 1)
    counts[pad] = 0.0
    used = np.zeros(pad + 1)
    todo = np.arange(num_flows)
    rank = np.empty(pad + 1, dtype=np.int64)
    positions = np.arange(pad + 1)
    level = np.empty(pad + 1)
    while len(todo):
        live = counts > 0
        level.fill(math.inf)
        np.divide(capacity - used, counts, out=level, where=live)
        order = np.argsort(level)
        rank[order] = positions
        # Each flow's lowest and second-lowest link rank: a prefix of the level order is
        # flow-disjoint as long as it stops before any flow's second link.
        first = rank[cols[0]]
        second = np.full_like(first, pad + 1)
        for col in cols[1:]:
            r = rank[col]
            second = np.minimum(second, np.maximum(first, r))
            first = np.minimum(first, r)
        prefix = min(int(np.count_nonzero(live)), int(second.min()))
        hit = first < prefix
        rate = level[order[first[hit]]]
        rates[todo[hit]] = rate
        for col in cols:
            frozen_links = col[hit]
            used += np.bincount(frozen_links, weights=rate, minlength=pad + 1)
            counts -= np.bincount(frozen_links, minlength=pad + 1)
        counts[pad] = 0.0
        keep = ~hit
        todo = todo[keep]
        cols = [col[keep] for col in cols]
    return rates


class FlowFabric(MessageFabric):
    """Max-min fair fluid flows over the topology's ECMP routes.

    Lifecycle: `send` queues an arrival on a heap keyed (time, sequence); `run(until_s)` advances
    the clock event by event: arrivals join the fluid set, flows whose bytes are all out leave it
    and are delivered after their pipeline latency, and the rates are recomputed once per instant
    at which the set changed. Message ids count from 0 in `send` order.

    Invariants: between events every active flow's rate is constant and the sum of rates on a
    link never exceeds its capacity; every message's W bytes cross every link of its path once.
    Nothing queues, so queue, ECN, PFC and drop figures are zero.
    """

    def __init__(self, topology: Topology, settings: FabricSettings | None = None, *,
                 seed: int = 0) -> None:
        super().__init__(topology, settings, seed)
        num_links = len(topology.links)
        self._pad = num_links
        self._rates_link = np.array([lk.rate_bytes_per_s for lk in topology.links])
        self._capacity = np.append(self._rates_link, math.inf)
        self._load = LinkLoadRecorder(num_links, self.settings.sample_interval_s)
        self._link_load = np.zeros(num_links)          # bytes/s on each link now
        self._link_bytes_done = np.zeros(num_links, dtype=np.int64)
        self._heap: list[tuple[float, int, int, int]] = []
        self._latency: list[float] = []
        self._sent_bytes = 0
        self._delivered_bytes = 0
        self._num_callbacks = 0          # completion callbacks fired so far
        # Fluid flows live in slots of these arrays; a slot is reused after its flow leaves.
        self._hops = np.full((4, 64), self._pad, dtype=np.int64)   # (hop position, slot)
        self._remaining = np.zeros(64)
        self._rate = np.zeros(64)
        self._t_end = np.full(64, math.inf)
        self._active = np.zeros(64, dtype=bool)
        self._slot_msg = np.full(64, -1, dtype=np.int64)
        self._free: list[int] = list(range(63, -1, -1))
        self._t_rates = 0.0          # when the current rates were set
        self._fluid_next = math.inf  # earliest fluid departure under the current rates

    def send(self, src: int, dst: int, size_bytes: int, *, at_s: float | None = None,
             tag: Any = None, on_done: OnDone | None = None, flow_key: int | None = None,
             traffic_class: int = 0) -> int:
        """Queue a message; `traffic_class` is accepted and ignored (no classes here)."""
        rec = self._accept(src, dst, size_bytes, at_s, tag, on_done, flow_key)
        self._latency.append(pipeline_latency_s(self.topology, rec.path, rec.size_bytes))
        heapq.heappush(self._heap, (rec.start_s, next(self._seq), _ARRIVE, rec.msg_id))
        return rec.msg_id

    def next_event_s(self) -> float:
        heap_next = self._heap[0][0] if self._heap else math.inf
        return min(heap_next, self._fluid_next)

    def run(self, until_s: float | None = None, *,
            stop: Callable[[], bool] | None = None) -> float:
        if self._running:
            raise RuntimeError("run() was called from inside a completion callback")
        limit = math.inf if until_s is None else until_s
        self._running = True
        try:
            while True:
                t = self.next_event_s()
                if t > limit or t == math.inf:
                    break
                fired = self._num_callbacks
                self._step(t)
                if stop is not None and self._num_callbacks != fired and stop():
                    return self._now
            if until_s is not None and until_s > self._now:
                self._advance(until_s)
        finally:
            self._running = False
        return self._now

    # -- the event loop -------------------------------------------------------------------------

    def _advance(self, t: float) -> None:
        """Move the clock to t under the current rates (link bytes and utilization)."""
        if t > self._now:
            self._load.add(self._now, t, self._link_load)
            self._now = t

    def _settle(self, t: float) -> None:
        """Bring every active flow's remaining bytes up to time t."""
        dt = t - self._t_rates
        if dt > 0:
            idx = np.flatnonzero(self._active)
            self._remaining[idx] -= self._rate[idx] * dt
        self._t_rates = t

    def _step(self, t: float) -> None:
        self._advance(t)
        self._settle(t)
        changed = False
        if self._fluid_next <= t * (1 + _TIE):
            changed = True
            for slot in np.flatnonzero(self._active & (self._t_end <= t * (1 + _TIE))):
                self._leave(int(slot), t)
        while self._heap and self._heap[0][0] <= t:
            _, _, kind, mid = heapq.heappop(self._heap)
            if kind == _ARRIVE:
                self._join(mid)
                changed = True
            else:
                self._deliver(mid, t)
        if changed:
            self._recompute(t)

    def _join(self, mid: int) -> None:
        rec = self._messages[mid]
        self._sent_bytes += rec.size_bytes
        if not self._free:
            self._grow_slots()
        if len(rec.path) > len(self._hops):
            extra = np.full((len(rec.path) - len(self._hops), self._hops.shape[1]), self._pad,
                            dtype=np.int64)
            self._hops = np.concatenate([self._hops, extra])
        slot = self._free.pop()
        self._hops[:, slot] = self._pad
        self._hops[:len(rec.path), slot] = rec.path
        self._remaining[slot] = rec.wire_bytes
        self._rate[slot] = 0.0
        self._t_end[slot] = math.inf
        self._active[slot] = True
        self._slot_msg[slot] = mid

    def _grow_slots(self) -> None:
        n = len(self._active)
        self._hops = np.concatenate([self._hops, np.full_like(self._hops, self._pad)], axis=1)
        self._remaining = np.concatenate([self._remaining, np.zeros(n)])
        self._rate = np.concatenate([self._rate, np.zeros(n)])
        self._t_end = np.concatenate([self._t_end, np.full(n, math.inf)])
        self._active = np.concatenate([self._active, np.zeros(n, dtype=bool)])
        self._slot_msg = np.concatenate([self._slot_msg, np.full(n, -1, dtype=np.int64)])
        self._free.extend(range(2 * n - 1, n - 1, -1))

    def _leave(self, slot: int, t: float) -> None:
        """A flow's last byte has left its source: free the slot, deliver after its latency."""
        mid = int(self._slot_msg[slot])
        rec = self._messages[mid]
        self._active[slot] = False
        self._rate[slot] = 0.0
        self._remaining[slot] = 0.0
        self._t_end[slot] = math.inf
        self._slot_msg[slot] = -1
        self._free.append(slot)
        for li in rec.path:
            self._link_bytes_done[li] += rec.wire_bytes
        heapq.heappush(self._heap, (t + self._latency[mid], next(self._seq), _DELIVER, mid))

    def _deliver(self, mid: int, t: float) -> None:
        rec = self._messages[mid]
        rec.end_s = t
        self._delivered_bytes += rec.size_bytes
        result = rec.result()
        self._results.append(result)
        if rec.on_done is not None:
            self._num_callbacks += 1
            rec.on_done(result)

    def _recompute(self, t: float) -> None:
        idx = np.flatnonzero(self._active)
        if len(idx) == 0:
            self._link_load[:] = 0.0
            self._fluid_next = math.inf
            return
        hops = self._hops[:, idx]
        rates = max_min_rates(hops, self._capacity)
        self._rate[idx] = rates
        t_end = t + np.maximum(self._remaining[idx], 0.0) / rates
        self._t_end[idx] = t_end
        self._fluid_next = float(t_end.min())
        load = np.bincount(hops.ravel(), weights=np.tile(rates, len(hops)),
                           minlength=self._pad + 1)
        self._link_load = load[:self._pad]

    # -- measurements ---------------------------------------------------------------------------

    def stats(self) -> FabricStats:
        link_bytes = self._link_bytes_done.astype(float)
        idx = np.flatnonzero(self._active)
        if len(idx):
            dt = self._now - self._t_rates
            remaining = np.maximum(self._remaining[idx] - self._rate[idx] * dt, 0.0)
            wire = np.array([self._messages[m].wire_bytes for m in self._slot_msg[idx]])
            hops = self._hops[:, idx]
            partial = np.bincount(hops.ravel(), weights=np.tile(wire - remaining, len(hops)),
                                  minlength=self._pad + 1)
            link_bytes += partial[:self._pad]
        links = [LinkStats(bytes_sent=int(round(b)), busy_s=float(b / r))
                 for b, r in zip(link_bytes, self._rates_link)]
        t_s, util = self._load.samples(self._rates_link, self._now)
        return FabricStats(messages=list(self._results), links=links, duration_s=self._now,
                           payload_sent_bytes=self._sent_bytes,
                           payload_delivered_bytes=self._delivered_bytes,
                           payload_in_flight_bytes=self._sent_bytes - self._delivered_bytes,
                           utilization_t_s=t_s, utilization=util)
