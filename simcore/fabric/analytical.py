"""The analytical fabric: each message alone on its ECMP path under pipelined store-and-forward,
with no contention; its completion time is the ideal every backend reports as `ideal_s`.

A message of S payload bytes travels as n = max(1, ceil(S / P)) packets, P = mtu - header payload
bytes each (the last one carries the rest), so it puts W = S + n x header bytes on every link. With
L1 = min(S, P) + header the first packet's size, C_h and d_h the rate and propagation delay of
hop h and C_min the slowest hop, it completes after

    T = sum_h (d_h + L1 / C_h) + (W - L1) / C_min

the first packet's store-and-forward latency plus the rest of the bytes at the bottleneck rate.
This is the exact arrival time of the last packet of a back-to-back train on an idle path when
every packet is full-size (or there is one packet, or all hops have one rate); a short last
packet behind a bottleneck hop can arrive up to its own serialisation time earlier.
"""

from __future__ import annotations

from collections.abc import Callable

import heapq
import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from simcore.fabric.ecmp import default_salts, flow_hash, path, source_port
from simcore.fabric.protocol import FabricStats, LinkStats, MessageResult, OnDone
from simcore.fabric.settings import FabricSettings
from simcore.fabric.topology import HOST, Topology
from simcore.fabric.utilization import LinkLoadRecorder


def num_packets(size_bytes: int, mtu_bytes: int, header_bytes: int) -> int:
    """Packets a message of `size_bytes` payload is cut into (an empty message is one packet)."""
    return max(1, -(-size_bytes // (mtu_bytes - header_bytes)))


def wire_bytes(size_bytes: int, mtu_bytes: int, header_bytes: int) -> int:
    """Bytes a message puts on every link of its path: payload plus one header per packet."""
    return size_bytes + num_packets(size_bytes, mtu_bytes, header_bytes) * header_bytes


def first_packet_bytes(size_bytes: int, mtu_bytes: int, header_bytes: int) -> int:
    """On-wire size of a message's first packet."""
    return min(size_bytes, mtu_bytes - header_bytes) + header_bytes


def message_path(topology: Topology, src: int, dst: int, flow_key: int,
                 salts: list[int]) -> tuple[int, ...]:
    """The links a message of flow `flow_key` takes: ECMP on the hash of its 5-tuple, whose UDP
    source port the NIC derives from the flow key (so every backend routes it alike)."""
    fhash = flow_hash(src, dst, source_port(flow_key))
    return tuple(path(topology, src, dst, fhash, salts))


def ideal_message_s(topology: Topology, links: tuple[int, ...] | list[int],
                    size_bytes: int) -> float:
    """T = sum_h (d_h + L1 / C_h) + (W - L1) / C_min over the path `links` (module docstring)."""
    mtu, header = topology.mtu_bytes, topology.header_bytes
    first = first_packet_bytes(size_bytes, mtu, header)
    rest = wire_bytes(size_bytes, mtu, header) - first
    total = 0.0
    slowest = math.inf
    for li in links:
        link = topology.links[li]
        rate = link.rate_bytes_per_s
        total += link.delay_s + first / rate
        slowest = min(slowest, rate)
    return total + rest / slowest


def pipeline_latency_s(topology: Topology, links: tuple[int, ...] | list[int],
                       size_bytes: int) -> float:
    """ideal_message_s minus W / C_min: what a message needs beyond its bytes at the bottleneck
    rate (propagation plus the first packet's store-and-forward on the other hops)."""
    mtu, header = topology.mtu_bytes, topology.header_bytes
    first = first_packet_bytes(size_bytes, mtu, header)
    total = 0.0
    slowest = math.inf
    for li in links:
        link = topology.links[li]
        total += link.delay_s + first / link.rate_bytes_per_s
        slowest = min(slowest, link.rate_bytes_per_s)
    return total - first / slowest


@dataclass(slots=True)
class MessageRecord:
    """A message a backend has accepted: its route, on-wire size and ideal time are fixed at
    `send`; `end_s` is set once, when its last byte arrives."""

    msg_id: int
    src: int
    dst: int
    size_bytes: int
    start_s: float
    path: tuple[int, ...]
    wire_bytes: int
    ideal_s: float
    tag: Any = None
    on_done: OnDone | None = None
    end_s: float | None = None

    def result(self) -> MessageResult:
        assert self.end_s is not None
        return MessageResult(self.msg_id, self.src, self.dst, self.size_bytes, self.start_s,
                             self.end_s, self.ideal_s, self.tag)


def plan_message(topology: Topology, salts: list[int], msg_id: int, src: int, dst: int,
                 size_bytes: int, start_s: float, *, tag: Any = None,
                 on_done: OnDone | None = None, flow_key: int | None = None,
                 routes: dict | None = None) -> MessageRecord:
    """Check a `send` and fix the message's route, wire bytes and ideal time.

    `routes` caches the route of each (src, dst, flow_key) for a fabric whose senders reuse
    flow keys (queue pairs), so ECMP is hashed once per flow. Raises ValueError for endpoints
    that are not two distinct hosts or a negative size.
    """
    if routes is not None and flow_key is not None:
        hit = routes.get((src, dst, flow_key))
        if hit is not None and size_bytes >= 0:
            # A known queue pair: its endpoints were checked and its route fixed before.
            route, delay_s, inv_rate_sum, min_rate = hit
            mtu, header = topology.mtu_bytes, topology.header_bytes
            first = first_packet_bytes(size_bytes, mtu, header)
            wire = wire_bytes(size_bytes, mtu, header)
            ideal = delay_s + first * inv_rate_sum + (wire - first) / min_rate
            return MessageRecord(msg_id, src, dst, int(size_bytes), start_s, route, wire, ideal,
                                 tag, on_done)
    n = len(topology.nodes)
    for role, node in (("src", src), ("dst", dst)):
        if not (isinstance(node, (int, np.integer)) and 0 <= node < n
                and topology.nodes[node].kind == HOST):
            raise ValueError(f"{role} must be the index of a host of topology "
                             f"{topology.name}, got {node!r}")
    if src == dst:
        raise ValueError(f"a message needs two different hosts, got {src} -> {dst}")
    if size_bytes < 0:
        raise ValueError(f"size_bytes must be non-negative, got {size_bytes}")
    if routes is not None and flow_key is not None:
        route = message_path(topology, int(src), int(dst), flow_key, salts)
        links = [topology.links[li] for li in route]
        routes[(src, dst, flow_key)] = (
            route, sum(lk.delay_s for lk in links),
            sum(1.0 / lk.rate_bytes_per_s for lk in links),
            min(lk.rate_bytes_per_s for lk in links))
    else:
        route = message_path(topology, int(src), int(dst),
                             msg_id if flow_key is None else flow_key, salts)
    return MessageRecord(msg_id, int(src), int(dst), int(size_bytes), start_s, route,
                         wire_bytes(size_bytes, topology.mtu_bytes, topology.header_bytes),
                         ideal_message_s(topology, route, size_bytes), tag, on_done)


class MessageFabric:
    """What the backends that plan whole messages share (analytical, flow): the topology and
    settings, ECMP salts and each queue pair's cached route, the clock, and every message
    accepted, its id its index in `_messages`. Subclasses queue the record `_accept` returns."""

    def __init__(self, topology: Topology, settings: FabricSettings | None, seed: int) -> None:
        self.topology = topology
        self.settings = settings or FabricSettings()
        self._salts = default_salts(topology, seed)
        self._routes: dict = {}
        self._now = 0.0
        self._seq = itertools.count()
        self._messages: list[MessageRecord] = []
        self._results: list[MessageResult] = []
        self._running = False

    @property
    def now_s(self) -> float:
        return self._now

    def ideal_s(self, msg_id: int) -> float:
        """Message `msg_id`'s completion time alone on an idle network along its path."""
        return self._messages[msg_id].ideal_s

    def _accept(self, src: int, dst: int, size_bytes: int, at_s: float | None, tag: Any,
                on_done: OnDone | None, flow_key: int | None) -> MessageRecord:
        """Check a `send` against the clock, plan the message and record it."""
        start = self._now if at_s is None else float(at_s)
        if start < self._now:
            raise ValueError(f"at_s {start} is before the fabric's clock {self._now}")
        rec = plan_message(self.topology, self._salts, len(self._messages), src, dst, size_bytes,
                           start, tag=tag, on_done=on_done, flow_key=flow_key,
                           routes=self._routes)
        self._messages.append(rec)
        return rec


class AnalyticalFabric(MessageFabric):
    """The contention-free backend: a message sent at t completes at t + ideal_message_s.

    Lifecycle: `send` fixes each message's completion time and queues it on a heap keyed
    (time, sequence); `run(until_s)` fires completions in that order. Message ids count from 0 in
    `send` order. Link figures attribute a message's wire bytes to each link of its path evenly
    over its lifetime, so a link shared by simultaneous messages can exceed utilization 1 here.
    """

    def __init__(self, topology: Topology, settings: FabricSettings | None = None, *,
                 seed: int = 0) -> None:
        super().__init__(topology, settings, seed)
        self._rates = np.array([lk.rate_bytes_per_s for lk in topology.links])
        self._load = LinkLoadRecorder(len(topology.links), self.settings.sample_interval_s)
        self._heap: list[tuple[float, int, int]] = []
        self._link_bytes_done = np.zeros(len(topology.links), dtype=np.int64)

    def send(self, src: int, dst: int, size_bytes: int, *, at_s: float | None = None,
             tag: Any = None, on_done: OnDone | None = None, flow_key: int | None = None,
             traffic_class: int = 0) -> int:
        """Queue a message; `traffic_class` is accepted and ignored (no classes here)."""
        rec = self._accept(src, dst, size_bytes, at_s, tag, on_done, flow_key)
        heapq.heappush(self._heap, (rec.start_s + rec.ideal_s, next(self._seq), rec.msg_id))
        return rec.msg_id

    def next_event_s(self) -> float:
        return self._heap[0][0] if self._heap else math.inf

    def run(self, until_s: float | None = None, *,
            stop: Callable[[], bool] | None = None) -> float:
        if self._running:
            raise RuntimeError("run() was called from inside a completion callback")
        limit = math.inf if until_s is None else until_s
        self._running = True
        try:
            while self._heap and self._heap[0][0] <= limit:
                end, _, mid = heapq.heappop(self._heap)
                self._now = max(self._now, end)
                rec = self._messages[mid]
                rec.end_s = end
                self._account(rec, self._load, end)
                for li in rec.path:
                    self._link_bytes_done[li] += rec.wire_bytes
                result = rec.result()
                self._results.append(result)
                if rec.on_done is not None:
                    rec.on_done(result)
                    if stop is not None and stop() and not (self._heap
                                                           and self._heap[0][0] <= self._now):
                        return self._now
            if until_s is not None and until_s > self._now:
                self._now = until_s
        finally:
            self._running = False
        return self._now

    def _account(self, rec: MessageRecord, load: LinkLoadRecorder, until_s: float) -> float:
        """Record rec's bytes on its links over [start, min(end, until_s)); return the share of
        its wire bytes that is."""
        end = rec.start_s + rec.ideal_s
        upto = min(end, until_s)
        if upto <= rec.start_s:
            return 0.0
        rate = rec.wire_bytes / rec.ideal_s
        if rec.path:
            load.add(rec.start_s, upto, rate, list(rec.path))   # a path has no repeated link
        return (upto - rec.start_s) / rec.ideal_s

    def stats(self) -> FabricStats:
        now = self._now
        load = self._load.copy()
        link_bytes = self._link_bytes_done.astype(float)
        sent = delivered = 0
        for rec in self._messages:
            if rec.start_s > now:
                continue
            sent += rec.size_bytes
            if rec.end_s is not None:
                delivered += rec.size_bytes
                continue
            share = self._account(rec, load, now)
            for li in rec.path:
                link_bytes[li] += share * rec.wire_bytes
        links = [LinkStats(bytes_sent=int(round(b)), busy_s=float(b / r))
                 for b, r in zip(link_bytes, self._rates)]
        t_s, util = load.samples(self._rates, now)
        return FabricStats(messages=list(self._results), links=links, duration_s=now,
                           payload_sent_bytes=sent, payload_delivered_bytes=delivered,
                           payload_in_flight_bytes=sent - delivered, utilization_t_s=t_s,
                           utilization=util)
