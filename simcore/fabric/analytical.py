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

from collections.abc import Callable, Iterator, Sequence

import heapq
import itertools
import math
from array import array
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
    src, dst, size_bytes, route, wire, ideal = _plan(topology, salts, msg_id, src, dst,
                                                     size_bytes, flow_key, routes)
    return MessageRecord(msg_id, src, dst, size_bytes, start_s, route, wire, ideal, tag, on_done)


def _known_route(hit: tuple, size_bytes: int, payload: int, header: int) -> tuple[int, float]:
    """(wire bytes, ideal time) of a message of `size_bytes` on a cached route `hit` (route,
    sum of delays, sum of inverse rates, slowest rate): first_packet_bytes, wire_bytes and
    ideal_message_s, inlined (this runs for every message)."""
    _, delay_s, inv_rate_sum, min_rate = hit
    first = (size_bytes if size_bytes < payload else payload) + header
    wire = size_bytes + (-(-size_bytes // payload) or 1) * header
    return wire, delay_s + first * inv_rate_sum + (wire - first) / min_rate


def _plan(topology: Topology, salts: list[int], msg_id: int, src: int, dst: int,
          size_bytes: int, flow_key: int | None, routes: dict | None
          ) -> tuple[int, int, int, tuple[int, ...], int, float]:
    """`plan_message` without the record: (src, dst, size_bytes, route, wire bytes, ideal)."""
    if routes is not None and flow_key is not None:
        hit = routes.get((src, dst, flow_key))
        if hit is not None and size_bytes >= 0:
            # A known queue pair: its endpoints were checked and its route fixed before.
            size_bytes = int(size_bytes)
            header = topology.header_bytes
            wire, ideal = _known_route(hit, size_bytes, topology.mtu_bytes - header, header)
            return src, dst, size_bytes, hit[0], wire, ideal
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
    return (int(src), int(dst), int(size_bytes), route,
            wire_bytes(size_bytes, topology.mtu_bytes, topology.header_bytes),
            ideal_message_s(topology, route, size_bytes))


class MessageLog:
    """Every message a backend has accepted, one list per field, a message's id its row.

    Lifecycle: `add` appends a message with its route, on-wire size and ideal time fixed at
    send; `end_s[id]` is set once, when its last byte arrives, and its callback (if any) is
    handed out once by `pop_on_done`. Columns of plain numbers rather than an object per message:
    a serving run sends hundreds of thousands, and objects that live that long make every full
    garbage collection walk them all.
    """

    __slots__ = ("src", "dst", "size_bytes", "start_s", "path", "wire_bytes", "ideal_s", "tag",
                 "end_s", "_on_done")

    def __init__(self) -> None:
        self.src: list[int] = []
        self.dst: list[int] = []
        self.size_bytes: list[int] = []
        self.start_s: list[float] = []
        self.path: list[tuple[int, ...]] = []
        self.wire_bytes: list[int] = []
        self.ideal_s: list[float] = []
        self.tag: list[Any] = []
        self.end_s: list[float | None] = []
        self._on_done: dict[int, OnDone] = {}

    def __len__(self) -> int:
        return len(self.src)

    def add(self, src: int, dst: int, size_bytes: int, start_s: float, path: tuple[int, ...],
            wire_bytes: int, ideal_s: float, tag: Any, on_done: OnDone | None) -> int:
        msg_id = len(self.src)
        self.src.append(src)
        self.dst.append(dst)
        self.size_bytes.append(size_bytes)
        self.start_s.append(start_s)
        self.path.append(path)
        self.wire_bytes.append(wire_bytes)
        self.ideal_s.append(ideal_s)
        self.tag.append(tag)
        self.end_s.append(None)
        if on_done is not None:
            self._on_done[msg_id] = on_done
        return msg_id

    def pop_on_done(self, msg_id: int) -> OnDone | tuple | None:
        """The message's callback, once (None if it has none): a callable taking its
        MessageResult, or a timed callback (fn, arg) (`MessageFabric.timed_callbacks`)."""
        return self._on_done.pop(msg_id, None)

    def result(self, msg_id: int) -> MessageResult:
        end_s = self.end_s[msg_id]
        assert end_s is not None
        return MessageResult(msg_id, self.src[msg_id], self.dst[msg_id], self.size_bytes[msg_id],
                             self.start_s[msg_id], end_s, self.ideal_s[msg_id], self.tag[msg_id])


class DeliveredMessages(Sequence[MessageResult]):
    """The results of delivered messages `ids` of a MessageLog, in that order, each built when it
    is read (a list of hundreds of thousands of result objects would be built for a report that
    reads each once). Entries never change: a delivered message's fields are final."""

    __slots__ = ("_log", "_ids")

    def __init__(self, log: MessageLog, ids: list[int]) -> None:
        self._log = log
        self._ids = ids

    def __len__(self) -> int:
        return len(self._ids)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self._log.result(mid) for mid in self._ids[index]]
        return self._log.result(self._ids[index])

    def __iter__(self) -> Iterator[MessageResult]:
        result = self._log.result
        return (result(mid) for mid in self._ids)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return list(self) == list(other)

    def __repr__(self) -> str:
        return f"DeliveredMessages({len(self)} messages)"

    def sizes_and_slowdowns(self, tag: Any) -> tuple[list[int], list[float]]:
        """(size_bytes, slowdown) of the messages tagged `tag`, in this order, as two columns:
        what reading each message's `size_bytes` and `slowdown` gives, without the objects."""
        log = self._log
        tags, size_of, start_of, end_of, ideal_of = (log.tag, log.size_bytes, log.start_s,
                                                     log.end_s, log.ideal_s)
        sizes: list[int] = []
        slowdowns: list[float] = []
        for mid in self._ids:
            if tags[mid] == tag:
                sizes.append(size_of[mid])
                ideal = ideal_of[mid]
                slowdowns.append((end_of[mid] - start_of[mid]) / ideal if ideal > 0 else 1.0)
        return sizes, slowdowns


class MessageFabric:
    """What the backends that plan whole messages share (analytical, flow): the topology and
    settings, ECMP salts and each queue pair's cached route, the clock, and every message
    accepted (`_log`, ids counting from 0 in send order). Subclasses queue the id `_accept`
    returns and append delivered ids to `_done`."""

    timed_callbacks = True
    """`send` takes, as `on_done`, either a callable given the delivered message's MessageResult or
    a pair (fn, arg), called fn(arg, end_s, ideal_s) without building the result (the step DAGs'
    transfers: hundreds of thousands in a run)."""

    def __init__(self, topology: Topology, settings: FabricSettings | None, seed: int) -> None:
        self.topology = topology
        self.settings = settings or FabricSettings()
        self._salts = default_salts(topology, seed)
        self._routes: dict = {}
        self._now = 0.0
        self._seq = itertools.count()
        self._log = MessageLog()
        self._done: list[int] = []               # delivered message ids, in delivery order
        self._running = False

    @property
    def now_s(self) -> float:
        return self._now

    def ideal_s(self, msg_id: int) -> float:
        """Message `msg_id`'s completion time alone on an idle network along its path."""
        return self._log.ideal_s[msg_id]

    def _results(self) -> DeliveredMessages:
        """Every message delivered so far, in delivery order."""
        return DeliveredMessages(self._log, list(self._done))

    def send_timed(self, src: int, dst: int, size_bytes: int, at_s: float, fn: Callable,
                   arg: Any, flow_key: int, tag: Any = None) -> float:
        """`send(src, dst, size_bytes, at_s=at_s, tag=tag, on_done=(fn, arg),
        flow_key=flow_key)` (a timed callback, `timed_callbacks`); returns the message's ideal
        time instead of its id."""
        mid = self.send(src, dst, size_bytes, at_s=at_s, tag=tag, on_done=(fn, arg),
                        flow_key=flow_key)
        return self._log.ideal_s[mid]

    def _accept(self, src: int, dst: int, size_bytes: int, at_s: float | None, tag: Any,
                on_done: OnDone | None, flow_key: int | None) -> int:
        """Check a `send` against the clock, plan the message and log it; returns its id."""
        start = self._now if at_s is None else float(at_s)
        if start < self._now:
            raise ValueError(f"at_s {start} is before the fabric's clock {self._now}")
        log = self._log
        src, dst, size_bytes, route, wire, ideal = _plan(self.topology, self._salts, len(log),
                                                         src, dst, size_bytes, flow_key,
                                                         self._routes)
        return log.add(src, dst, size_bytes, start, route, wire, ideal, tag, on_done)


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
        log = self._log
        n = len(mids)
        wire = np.fromiter(map(log.wire_bytes.__getitem__, mids), dtype=np.int64, count=n)
        paths = list(map(log.path.__getitem__, mids))
        num_links = np.fromiter(map(len, paths), dtype=np.int64, count=n)
        total = int(num_links.sum())
        links = np.fromiter(itertools.chain.from_iterable(paths), dtype=np.int64, count=total)
        last_span = first_span + total
        begin = np.array(self._span_begin[first_span:last_span], dtype=float)
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
                           utilization=util)
