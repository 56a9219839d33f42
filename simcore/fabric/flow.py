"""The flow-level fabric: every message is a fluid flow on its ECMP path, and the flows in progress
share the links max-min fairly (progressive filling), recomputed whenever a flow starts or ends.

A flow carries its on-wire bytes W (payload plus a header per packet) at its fair rate. When the
last of them has left, the message still needs its pipeline latency (propagation on every hop plus
the first packet's store-and-forward on all but the slowest hop, `pipeline_latency_s`), so a flow
alone completes at exactly the analytical time, and a single packet after sum_h (L/C_h + d_h).

A serving run has a few fluid flows at a time and hundreds of thousands of events, so the rates
and the per-event bookkeeping run as small kernels compiled by numba (the same Python where numba
is absent), each computing to the bit what the whole-array numpy formulation computes. An
all-to-all over hundreds of hosts has tens of thousands of flows at a time and needs hundreds of
filling rounds per event; there `LevelOrderSolver` computes the same rates, to the bit, at a cost
that grows with the flows rather than with flows times rounds.
"""

from __future__ import annotations

from collections.abc import Callable

import heapq
import math
from typing import Any

import numpy as np

from simcore.fabric.messages import MessageFabric, first_packet_bytes, pipeline_latency_s
from simcore.compiled import compile_kernel
from simcore.fabric.level_order import LevelOrderSolver
from simcore.fabric.protocol import FabricStats, LinkStats, OnDone
from simcore.fabric.settings import FabricSettings
from simcore.fabric.topology import Topology
from simcore.fabric.utilization import LinkLoadRecorder

_ARRIVE = 0
_DELIVER = 1
_TIE = 1e-12
"""Relative time tolerance within which fluid departures count as simultaneous."""
WALK_FROM_FLOWS = 32
"""Active flows from which the rates come from `LevelOrderSolver`, whose work grows with the
flows that freeze, rather than from `MaxMinSolver`'s whole-array rounds, which cost a pass over
every flow per round but less per call: below about this many flows the rounds are as fast."""


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
    return MaxMinSolver(len(capacity)).solve(hops, capacity, np.arange(hops.shape[1]))


class MaxMinSolver:
    """`max_min_rates` for a fabric, which recomputes rates at every event: work arrays kept
    between calls, and each round one compiled pass (`_fill_round`) around numpy's argsort of
    the links' fill levels. Links of equal level keep numpy's order and every sum runs in the
    order of the whole-array formulation, so the rates are the same to the bit.

    Lifecycle: built for a fixed number of links (padding index included); `solve` may be
    called any number of times, and the rates it returns live in a buffer the next call reuses.
    """

    def __init__(self, num_links: int) -> None:
        self.counts = np.zeros(num_links)
        self.used = np.zeros(num_links)
        self.level = np.zeros(num_links)
        self.rank = np.zeros(num_links, dtype=np.int64)
        self.acc = np.zeros(num_links)
        self.touched = np.zeros(num_links, dtype=np.bool_)
        self._size(4, 64)

    def _size(self, num_hops: int, num_flows: int) -> None:
        self.cols = np.zeros((num_hops, num_flows), dtype=np.int64)   # compacted as flows freeze
        self.todo = np.zeros(num_flows, dtype=np.int64)
        self.first = np.zeros(num_flows, dtype=np.int64)
        self.rates = np.zeros(num_flows)

    def solve(self, hops: np.ndarray, capacity: np.ndarray, flows: np.ndarray) -> np.ndarray:
        """Max-min fair rates, over links `capacity`, of the flows whose links are the columns
        `flows` of `hops` (see max_min_rates); one rate per entry of `flows`, in its order."""
        num_hops, num_flows = hops.shape[0], len(flows)
        if num_hops > self.cols.shape[0] or num_flows > self.cols.shape[1]:
            self._size(max(num_hops, self.cols.shape[0]), max(num_flows, 2 * self.cols.shape[1]))
        cols, rates, level = self.cols[:num_hops], self.rates[:num_flows], self.level
        left = _fill_start(hops, flows, capacity, self.counts, self.used, level, cols, self.todo,
                           rates)
        while left:
            left = _fill_round(np.argsort(level), level, self.counts, self.used, capacity, cols,
                               self.todo, left, rates, self.rank, self.first, self.acc,
                               self.touched)
        return rates


@compile_kernel
def _fill_levels(capacity, counts, used, level):
    """Each link's fill level: capacity left over its unfrozen flows (inf where it has none)."""
    for li in range(len(level)):
        level[li] = (capacity[li] - used[li]) / counts[li] if counts[li] > 0 else np.inf


@compile_kernel
def _fill_start(hops, flows, capacity, counts, used, level, cols, todo, rates):
    """Set up the filling of the flows `flows` (columns of `hops`): their links into `cols`,
    every one unfrozen (`todo`), flows per link (the padding index counts none), nothing used
    yet, the first levels. A lone flow gets its slowest link's capacity at once. Returns how
    many flows are left to fill."""
    num_flows = len(flows)
    if num_flows == 1:
        lowest = np.inf
        for j in range(hops.shape[0]):
            c = capacity[hops[j, flows[0]]]
            if c < lowest:
                lowest = c
        rates[0] = lowest
        return 0
    counts[:] = 0.0
    used[:] = 0.0
    for j in range(hops.shape[0]):
        for f in range(num_flows):
            li = hops[j, flows[f]]
            cols[j, f] = li
            counts[li] += 1.0
    counts[len(counts) - 1] = 0.0
    for f in range(num_flows):
        todo[f] = f
    _fill_levels(capacity, counts, used, level)
    return num_flows


@compile_kernel
def _fill_round(order, level, counts, used, capacity, cols, todo, num_todo, rates, rank, first,
                acc, touched):
    """One round of progressive filling, links ranked by `order` (the argsort of `level`):
    every flow whose lowest-ranked link lies in the flow-disjoint prefix freezes at that link's
    level. Flows 0..num_todo-1 of `cols` (their links, by hop) and `todo` (their indices in
    `rates`) are the unfrozen ones; the survivors are moved to the front, in order, and the
    levels recomputed. Returns how many survive.

    Sums run in the order numpy's bincount would run them (per hop row, flows in order, the
    row's total then added to `used`), so every bit matches the vectorized formulation."""
    num_links = len(level)
    for p in range(num_links):
        rank[order[p]] = p
    prefix = 0
    for li in range(num_links):
        if counts[li] > 0:
            prefix += 1
    num_hops = cols.shape[0]
    for f in range(num_todo):
        lowest = rank[cols[0, f]]
        second = num_links
        for j in range(1, num_hops):
            r = rank[cols[j, f]]
            upper = lowest if lowest > r else r
            if upper < second:
                second = upper
            if r < lowest:
                lowest = r
        first[f] = lowest
        if second < prefix:
            prefix = second
    for j in range(num_hops):
        for f in range(num_todo):
            if first[f] < prefix:
                li = cols[j, f]
                acc[li] += level[order[first[f]]]
                touched[li] = True
        for f in range(num_todo):
            if first[f] < prefix:
                li = cols[j, f]
                if touched[li]:
                    used[li] += acc[li]
                    acc[li] = 0.0
                    touched[li] = False
                counts[li] -= 1.0
    counts[num_links - 1] = 0.0
    left = 0
    for f in range(num_todo):
        if first[f] < prefix:
            rates[todo[f]] = level[order[first[f]]]
        else:
            todo[left] = todo[f]
            for j in range(num_hops):
                cols[j, left] = cols[j, f]
            left += 1
    _fill_levels(capacity, counts, used, level)
    return left


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
                 seed: int = 0, walk_from_flows: int = WALK_FROM_FLOWS) -> None:
        """`walk_from_flows`: the number of active flows from which `LevelOrderSolver`
        computes the rates instead of `MaxMinSolver` (see WALK_FROM_FLOWS); the rates are the
        same to the bit either way."""
        super().__init__(topology, settings, seed)
        num_links = len(topology.links)
        self._pad = num_links
        self._rates_link = np.array([lk.rate_bytes_per_s for lk in topology.links])
        self._capacity = np.append(self._rates_link, math.inf)
        self._load = LinkLoadRecorder(num_links, self.settings.sample_interval_s)
        self._load_now = np.zeros(num_links + 1)       # bytes/s on each link now, padding last
        self._link_load = self._load_now[:num_links]
        self._link_bytes_done = np.zeros(num_links + 1, dtype=np.int64)   # padding last
        self._heap: list[tuple[float, int, int, int]] = []
        self._latency: list[float] = []
        self._sent_bytes = 0
        self._delivered_bytes = 0
        self._num_callbacks = 0          # completion callbacks fired so far
        self._num_solves = 0             # rate computations so far
        self._num_solved_flows = 0       # active flows summed over them
        # Fluid flows live in slots of these arrays; a slot is reused after its flow leaves.
        # (hop position, slot); 32-bit, as the rate computations read it whole every time.
        self._hops = np.full((4, 64), self._pad, dtype=np.int32)
        self._remaining = np.zeros(64)
        self._rate = np.zeros(64)
        self._t_end = np.full(64, math.inf)
        self._active = np.zeros(64, dtype=bool)
        self._slot_msg = np.full(64, -1, dtype=np.int64)
        self._slot_wire = np.zeros(64, dtype=np.int64)      # each flow's W bytes
        self._free: list[int] = list(range(63, -1, -1))
        self._live = np.zeros(0, dtype=np.int64)   # the active slots, ascending
        self._t_rates = 0.0          # when the current rates were set
        self._fluid_next = math.inf  # earliest fluid departure under the current rates
        self._rounds = MaxMinSolver(num_links + 1)
        self._walk = LevelOrderSolver(num_links + 1)
        self._walk_from_flows = walk_from_flows
        self._latency_of: dict[tuple[tuple[int, ...], int], float] = {}

    def send(self, src: int, dst: int, size_bytes: int, *, at_s: float | None = None,
             tag: Any = None, on_done: OnDone | None = None, flow_key: int | None = None,
             traffic_class: int = 0) -> int:
        """Queue a message; `traffic_class` is accepted and ignored (no classes here)."""
        mid = self._accept(src, dst, size_bytes, at_s, tag, on_done, flow_key)
        log = self._log
        # The latency depends on the path and the first packet's size only.
        path, size = log.path[mid], log.size_bytes[mid]
        key = (path, first_packet_bytes(size, self.topology.mtu_bytes, self.topology.header_bytes))
        latency = self._latency_of.get(key)
        if latency is None:
            latency = self._latency_of[key] = pipeline_latency_s(self.topology, path, size)
        self._latency.append(latency)
        heapq.heappush(self._heap, (log.start_s[mid], next(self._seq), _ARRIVE, mid))
        return mid

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
        if dt > 0 and len(self._live):
            _drain_flows(self._live, self._remaining, self._rate, dt)
        self._t_rates = t

    def _step(self, t: float) -> None:
        self._advance(t)
        self._settle(t)
        changed = False
        if self._fluid_next <= t * (1 + _TIE):
            changed = True
            live = self._live
            self._leave(live[self._t_end[live] <= t * (1 + _TIE)], t)
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
        log = self._log
        path = log.path[mid]
        self._sent_bytes += log.size_bytes[mid]
        if not self._free:
            self._grow_slots()
        if len(path) > len(self._hops):
            extra = np.full((len(path) - len(self._hops), self._hops.shape[1]), self._pad,
                            dtype=np.int32)
            self._hops = np.concatenate([self._hops, extra])
        slot = self._free.pop()
        self._hops[:, slot] = self._pad
        self._hops[:len(path), slot] = path
        self._remaining[slot] = self._slot_wire[slot] = log.wire_bytes[mid]
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
        self._slot_wire = np.concatenate([self._slot_wire, np.zeros(n, dtype=np.int64)])
        self._free.extend(range(2 * n - 1, n - 1, -1))

    def _leave(self, slots: np.ndarray, t: float) -> None:
        """The flows in `slots` (ascending) have sent their last byte: free their slots, in that
        order, and deliver each message after its latency."""
        mids = self._slot_msg[slots].tolist()
        _free_slots(slots, self._hops, self._slot_wire, self._link_bytes_done, self._active,
                    self._rate, self._remaining, self._t_end, self._slot_msg)
        self._free.extend(slots.tolist())
        heap, seq, latency = self._heap, self._seq, self._latency
        for mid in mids:
            heapq.heappush(heap, (t + latency[mid], next(seq), _DELIVER, mid))

    def _deliver(self, mid: int, t: float) -> None:
        log = self._log
        log.end_s[mid] = t
        self._delivered_bytes += log.size_bytes[mid]
        self._done.append(mid)
        on_done = log.pop_on_done(mid)
        if on_done is not None:
            self._num_callbacks += 1
            if on_done.__class__ is tuple:
                on_done[0](on_done[1], t, log.ideal_s[mid])
            else:
                on_done(log.result(mid))

    def _recompute(self, t: float) -> None:
        idx = self._live = np.flatnonzero(self._active)
        if len(idx) == 0:
            self._link_load[:] = 0.0
            self._fluid_next = math.inf
            return
        solver = self._walk if len(idx) >= self._walk_from_flows else self._rounds
        rates = solver.solve(self._hops, self._capacity, idx)
        self._num_solves += 1
        self._num_solved_flows += len(idx)
        self._fluid_next = _set_rates(idx, self._hops, rates, self._rate, self._remaining,
                                      self._t_end, t, self._load_now)

    # -- measurements ---------------------------------------------------------------------------

    def counters(self) -> dict[str, int]:
        """The work done so far: rate_solves (max-min computations, one per instant at which
        the set of flows changed) and solved_flows (the active flows summed over them)."""
        return {"rate_solves": self._num_solves, "solved_flows": self._num_solved_flows}

    def stats(self) -> FabricStats:
        link_bytes = self._link_bytes_done[:self._pad].astype(float)
        idx = np.flatnonzero(self._active)
        if len(idx):
            dt = self._now - self._t_rates
            remaining = np.maximum(self._remaining[idx] - self._rate[idx] * dt, 0.0)
            wire = np.array([self._log.wire_bytes[m] for m in self._slot_msg[idx]])
            hops = self._hops[:, idx]
            partial = np.bincount(hops.ravel(), weights=np.tile(wire - remaining, len(hops)),
                                  minlength=self._pad + 1)
            link_bytes += partial[:self._pad]
        links = [LinkStats(bytes_sent=int(round(b)), busy_s=float(b / r))
                 for b, r in zip(link_bytes, self._rates_link)]
        t_s, util = self._load.samples(self._rates_link, self._now)
        return FabricStats(messages=self._results(), links=links, duration_s=self._now,
                           payload_sent_bytes=self._sent_bytes,
                           payload_delivered_bytes=self._delivered_bytes,
                           payload_in_flight_bytes=self._sent_bytes - self._delivered_bytes,
                           utilization_t_s=t_s, utilization=util,
                           utilization_interval_s=self._load.interval_s)


@compile_kernel
def _free_slots(slots, hops, slot_wire, link_bytes, active, rate, remaining, t_end, slot_msg):
    """Count the W bytes of each flow in `slots` on every link of its path (the padding index
    last in `link_bytes`), and clear the slots."""
    for s in slots:
        for j in range(hops.shape[0]):
            link_bytes[hops[j, s]] += slot_wire[s]
        active[s] = False
        rate[s] = 0.0
        remaining[s] = 0.0
        t_end[s] = np.inf
        slot_msg[s] = -1


@compile_kernel
def _drain_flows(slots, remaining, rate, dt):
    """Each listed flow has sent rate x dt more bytes."""
    for s in slots:
        remaining[s] -= rate[s] * dt


@compile_kernel
def _set_rates(slots, hops, rates, rate, remaining, t_end, t, load):
    """Give the flows of `slots` their new rates from time t: each one's rate and departure time,
    and every link's total rate into `load` (summed hop row by hop row, flows in order, as
    numpy's bincount would). Returns the earliest departure."""
    first_end = np.inf
    for f in range(len(slots)):
        s = slots[f]
        rate[s] = rates[f]
        left = remaining[s] if remaining[s] > 0.0 else 0.0
        t_end[s] = t + left / rates[f]
        if t_end[s] < first_end:
            first_end = t_end[s]
    load[:] = 0.0
    for j in range(hops.shape[0]):
        for f in range(len(slots)):
            load[hops[j, slots[f]]] += rates[f]
    return first_end
