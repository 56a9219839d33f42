"""The analytical fabric: messages on their ECMP paths under pipelined store-and-forward, each link
serving the messages that cross it one after another (first come, first served), with no other
interaction; a message alone completes at the ideal time every backend reports as `ideal_s`.

A message of S payload bytes travels as n = max(1, ceil(S / P)) packets, P = mtu - header payload
bytes each (the last one carries the rest), so it puts W = S + n x header bytes on every link. With
L1 = min(S, P) + header the first packet's size, C_h and d_h the rate and propagation delay of
hop h and C_min the slowest hop, alone on its path it completes after

    T = sum_h (d_h + L1 / C_h) + (W - L1) / C_min

the first packet's store-and-forward latency plus the rest of the bytes at the bottleneck rate.
This is the exact arrival time of the last packet of a back-to-back train on an idle path when
every packet is full-size (or there is one packet, or all hops have one rate); a short last
packet behind a bottleneck hop can arrive up to its own serialisation time earlier.

Links are shared by serialisation. Every link l keeps F_l, the time by which it has carried
every byte reserved on it so far. Messages are reserved in the order they start (start time, then
send order), each on every link of its path at once. With

    pre_h  = sum_{k<h} (d_k + L1 / C_k)          when its first packet reaches hop h, alone
    post_h = d_h + sum_{k>h} (d_k + L1 / C_k)    from its last byte leaving hop h to arrival, alone

a message starting at t0 occupies hop h (link l_h) for its W bytes at the link's rate,

    b_h = max(F_{l_h}, t0 + pre_h),    e_h = b_h + W / C_h,    F_{l_h} <- e_h

and completes at

    t0 + max(T, max_h (e_h - t0 + post_h))

(exactly t0 + T where it waits on no link, b_h = t0 + pre_h on every hop). So a message never
completes before every link of its path has carried everything reserved on it before, plus its
own W bytes, and a link's spans never overlap: a link carries at most its rate times any
interval, and its reported utilization (each span's W bytes spread evenly over [b_h, e_h)) is at
most 1. Alone on its path a message's e_h + post_h is at most t0 + T, with equality at the
bottleneck, so `ideal_s` keeps its meaning and slowdown = 1 without contention.

What it ignores: every queueing dynamic beyond this serialisation. Each link serves whole
messages first come, first served (no interleaving of packets, no fair sharing: the first
message on a busy link is not slowed by the later ones, the last waits for all of them); a
message's wait at one link does not delay its arrival at the next (each link is a separate
server, which is optimistic for a message held up on more than one link of its path);
buffers are unlimited, so nothing is lost; no ECN marking, PFC, congestion control (DCQCN),
adaptive routing or traffic classes: the settings only the packet backend reads
(`simcore.fabric.fidelity`). Each message costs one pass over its path when it starts.
"""

from __future__ import annotations

from collections.abc import Callable

import heapq
import itertools
import math
from array import array
from typing import Any

import numpy as np

from simcore.fabric.messages import MessageFabric, _known_route
from simcore.fabric.protocol import FabricStats, LinkStats, OnDone
from simcore.fabric.settings import FabricSettings
from simcore.fabric.topology import Topology
from simcore.fabric.utilization import LinkLoadRecorder


class AnalyticalFabric(MessageFabric):
    """The serialising backend: each message reserves the links of its path when it starts (the
    formula of the module docstring) and completes when that reservation says.

    Lifecycle: `send` reserves a message at once when it starts at the fabric's clock and no
    earlier-starting message is waiting, otherwise queues it on a heap keyed (start, sequence)
    until the clock reaches its start, so links serve messages in the order they start whatever
    order they are sent in; a reserved message's completion is queued on a heap keyed (time,
    sequence), and `run(until_s)` processes both in time order (starts first at equal times).
    Message ids count from 0 in `send` order. Each message's bytes are spread evenly over its span
    on each link; delivered messages are added to the link figures when `stats` asks, in
    reservation order (a serving run delivers hundreds of thousands).
    """

    _BATCH = 1 << 16
    """Messages added to the link figures per pass (bounds the temporary arrays)."""

    def __init__(self, topology: Topology, settings: FabricSettings | None = None, *,
                 seed: int = 0) -> None:
        super().__init__(topology, settings, seed)
        links = topology.links
        self._rates = np.array([lk.rate_bytes_per_s for lk in links])
        self._free = [0.0] * len(links)         # F_l: link l has carried all reserved on it
        self._inv_rate = [1.0 / lk.rate_bytes_per_s for lk in links]
        self._inv_rate_array = np.array(self._inv_rate)
        self._delay = [lk.delay_s for lk in links]
        self._header = topology.header_bytes
        self._payload = topology.mtu_bytes - topology.header_bytes
        self._load = LinkLoadRecorder(len(links), self.settings.sample_interval_s)
        self._heap: list[tuple[float, int, int]] = []      # reserved: (end, sequence, id)
        self._starts: list[tuple[float, int, int]] = []    # not yet reserved: (start, seq, id)
        self._order: list[int] = []             # reserved message ids, in reservation order
        # b_h of every hop of the reserved messages' paths, in reservation order (e_h is
        # b_h + W / C_h).
        self._span_begin = array("d")
        self._link_bytes_done = np.zeros(len(links), dtype=np.int64)
        self._recorded = 0          # `_order[:_recorded]` are in the link figures
        self._recorded_spans = 0    # ... and so are their spans

    def send(self, src: int, dst: int, size_bytes: int, *, at_s: float | None = None,
             tag: Any = None, on_done: OnDone | None = None, flow_key: int | None = None,
             traffic_class: int = 0) -> int:
        """Queue a message; `traffic_class` is accepted and ignored (no classes here)."""
        mid = self._accept(src, dst, size_bytes, at_s, tag, on_done, flow_key)
        self._start(mid, self._log.start_s[mid])
        return mid

    def _start(self, mid: int, start: float) -> None:
        """Reserve message mid now if it starts at the clock and no earlier-starting message
        waits, else queue it until the clock reaches `start`."""
        starts = self._starts
        if start <= self._now and not (starts and starts[0][0] <= start):
            self._reserve(mid)
        else:
            heapq.heappush(starts, (start, next(self._seq), mid))

    def send_timed(self, src: int, dst: int, size_bytes: int, at_s: float, fn: Callable,
                   arg: Any, flow_key: int, tag: Any = None) -> float:
        """`MessageFabric.send_timed`, as `send` does it, with `_accept`'s checks and planning
        skipped for a queue pair already routed (a step DAG's transfers: hundreds of thousands
        in a run, on a few hundred queue pairs)."""
        hit = self._routes.get((src, dst, flow_key))
        start = float(at_s)
        if hit is None or size_bytes < 0 or start < self._now:
            return super().send_timed(src, dst, size_bytes, at_s, fn, arg, flow_key, tag)
        size_bytes = int(size_bytes)
        wire, ideal = _known_route(hit, size_bytes, self._payload, self._header)
        self._start(self._log.add(src, dst, size_bytes, start, hit[0], wire, ideal, tag,
                                  (fn, arg)), start)
        return ideal

    def routed(self, src: int, dst: int, flow_key: int) -> tuple | None:
        """The fixed route of queue pair (src, dst, flow_key) for `send_routed`, None until a
        message on it has been sent."""
        hit = self._routes.get((src, dst, flow_key))
        return None if hit is None else (src, dst, hit)

    def send_routed(self, route: tuple, size_bytes: int, at_s: float, fn: Callable, arg: Any,
                    tag: Any = None) -> float:
        """`send_timed` on a queue pair whose route `routed` gave, at `at_s` (not before the
        clock), without looking the route up again; returns the message's ideal time."""
        src, dst, hit = route
        if size_bytes < 0:
            raise ValueError(f"size_bytes must be non-negative, got {size_bytes}")
        size = int(size_bytes)
        start = float(at_s)
        wire, ideal = _known_route(hit, size, self._payload, self._header)
        self._start(self._log.add(src, dst, size, start, hit[0], wire, ideal, tag, (fn, arg)),
                    start)
        return ideal

    def _reserve(self, mid: int) -> None:
        """Serialise message mid on the links of its path (module docstring); queue its end.

        One pass over the path: x is pre_h on reaching hop h and the sum over the whole path at
        the end, so e_h + post_h = e_h - pre_h - L1 / C_h + x_end."""
        log = self._log
        start, wire, size = log.start_s[mid], log.wire_bytes[mid], log.size_bytes[mid]
        payload = self._payload
        first = (size if size < payload else payload) + self._header
        free, inv_rate, delay = self._free, self._inv_rate, self._delay
        begin_at = self._span_begin.append
        x = 0.0
        slack = -math.inf            # max over the hops waited on of e_h - pre_h - L1 / C_h
        for li in log.path[mid]:
            inv = inv_rate[li]
            b = start + x
            f = free[li]
            if f > b:
                b = f
                e = b + wire * inv
                c = e - x - first * inv
                if c > slack:
                    slack = c
            else:
                e = b + wire * inv
            free[li] = e
            begin_at(b)
            x += delay[li] + first * inv
        end = start + log.ideal_s[mid]
        if slack + x > end:
            end = slack + x
        self._order.append(mid)
        heapq.heappush(self._heap, (end, next(self._seq), mid))

    def next_event_s(self) -> float:
        heap, starts = self._heap, self._starts
        t = heap[0][0] if heap else math.inf
        return starts[0][0] if starts and starts[0][0] < t else t

    def run(self, until_s: float | None = None, *,
            stop: Callable[[], bool] | None = None) -> float:
        if self._running:
            raise RuntimeError("run() was called from inside a completion callback")
        limit = math.inf if until_s is None else until_s
        heap, starts, done, log = self._heap, self._starts, self._done, self._log
        end_s, pop_on_done, ideal_s = log.end_s, log.pop_on_done, log.ideal_s
        pop = heapq.heappop
        reserve = self._reserve
        self._running = True
        try:
            while True:
                if starts and starts[0][0] <= limit and (not heap or starts[0][0] <= heap[0][0]):
                    start, _, mid = pop(starts)
                    if start > self._now:
                        self._now = start
                    reserve(mid)
                    continue
                if not (heap and heap[0][0] <= limit):
                    break
                end, _, mid = pop(heap)
                if end > self._now:
                    self._now = end
                end_s[mid] = end
                done.append(mid)
                on_done = pop_on_done(mid)
                if on_done is not None:
                    if on_done.__class__ is tuple:
                        on_done[0](on_done[1], end, ideal_s[mid])
                    else:
                        on_done(log.result(mid))
                    if (stop is not None and stop() and not (heap and heap[0][0] <= self._now)
                            and not (starts and starts[0][0] <= self._now)):
                        return self._now
            if until_s is not None and until_s > self._now:
                self._now = until_s
        finally:
            self._running = False
        return self._now

    def _record_done(self) -> None:
        """Add the reserved messages not yet counted, up to the first one not yet delivered, to
        the link bytes and utilization bins: each span's bytes over [b_h, e_h) at a constant
        rate."""
        order, end_s = self._order, self._log.end_s
        upto = self._recorded
        if not self._heap:          # every reserved message has been delivered
            upto = len(order)
        while upto < len(order) and end_s[order[upto]] is not None:
            upto += 1
        while self._recorded < upto:
            mids = order[self._recorded:min(upto, self._recorded + self._BATCH)]
            self._recorded += len(mids)
            self._recorded_spans = self._record(mids, self._recorded_spans, self._load,
                                                self._link_bytes_done)

    def _record(self, mids: list[int], first_span: int, load: LinkLoadRecorder,
                link_bytes: np.ndarray, until_s: float | None = None) -> int:
        """Add the spans of reserved messages `mids` (consecutive in reservation order, their
        spans from `first_span` on) to `load` and `link_bytes`, only what lies before `until_s`
        if given; returns the index of the span after theirs."""
        wire, num_links, links, begin = self._spans_of(mids, first_span)
        total = len(links)
        last_span = first_span + total
        span_wire = np.repeat(wire, num_links)
        end = begin + span_wire * self._inv_rate_array[links]     # as `_reserve` computes e_h
        rate = span_wire / (end - begin)
        if until_s is None:
            np.add.at(link_bytes, links, span_wire)
        else:
            end = np.minimum(end, until_s)
            np.add.at(link_bytes, links, np.maximum(end - begin, 0.0) * rate)
        load.add_spans(begin, end, rate, links, np.ones(total, dtype=np.int64))
        return last_span

    def _spans_of(self, mids: list[int], first_span: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(wire bytes, number of links, the links in order, each link's b_h) of reserved
        messages `mids`, their spans from `first_span` on."""
        log = self._log
        n = len(mids)
        wire = np.fromiter(map(log.wire_bytes.__getitem__, mids), dtype=np.int64, count=n)
        paths = list(map(log.path.__getitem__, mids))
        num_links = np.fromiter(map(len, paths), dtype=np.int64, count=n)
        total = int(num_links.sum())
        links = np.fromiter(itertools.chain.from_iterable(paths), dtype=np.int64, count=total)
        begin = np.array(self._span_begin[first_span:first_span + total], dtype=float)
        return wire, num_links, links, begin

    def stats(self) -> FabricStats:
        self._record_done()
        now = self._now
        load = self._load.copy()
        link_bytes = self._link_bytes_done.astype(float)
        log = self._log
        started = np.array(log.start_s) <= now
        sent = sum(itertools.compress(log.size_bytes, started.tolist()))
        delivered = sum(map(log.size_bytes.__getitem__, self._done))
        # Reserved messages after the first one not yet delivered: what their spans carried
        # up to now.
        first_span = self._recorded_spans
        for k in range(self._recorded, len(self._order), self._BATCH):
            first_span = self._record(self._order[k:k + self._BATCH], first_span, load,
                                      link_bytes, now)
        links = [LinkStats(bytes_sent=int(round(b)), busy_s=float(b / r))
                 for b, r in zip(link_bytes, self._rates)]
        t_s, util = load.samples(self._rates, now)
        return FabricStats(messages=self._results(), links=links, duration_s=now,
                           payload_sent_bytes=sent, payload_delivered_bytes=delivered,
                           payload_in_flight_bytes=sent - delivered, utilization_t_s=t_s,
                           utilization=util, utilization_interval_s=load.interval_s)
