"""What the fabric backends that plan whole messages share (`simcore.fabric.analytical`,
`simcore.fabric.flow`; the packet backend plans with `plan_message`): a message's packets, wire
bytes and ideal time on its ECMP path (the formula of `simcore.fabric.analytical`'s docstring),
the log of accepted messages as columns, and the clock and queue-pair routes of `MessageFabric`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from simcore.fabric.ecmp import default_salts, flow_hash, path, source_port
from simcore.fabric.protocol import MessageResult, OnDone
from simcore.fabric.settings import FabricSettings
from simcore.fabric.topology import HOST, Topology

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
        log = self._log
        return log.add(*self._planned(src, dst, size_bytes, at_s, flow_key, len(log)), tag,
                       on_done)

    def _planned(self, src: int, dst: int, size_bytes: int, at_s: float | None,
                 flow_key: int | None, msg_id: int
                 ) -> tuple[int, int, int, float, tuple[int, ...], int, float]:
        """A `send` checked against the clock and planned as message `msg_id`: (src, dst,
        size_bytes, start, route, wire bytes, ideal time)."""
        now = self.now_s
        start = now if at_s is None else float(at_s)
        if start < now:
            raise ValueError(f"at_s {start} is before the fabric's clock {now}")
        src, dst, size_bytes, route, wire, ideal = _plan(self.topology, self._salts, msg_id,
                                                         src, dst, size_bytes, flow_key,
                                                         self._routes)
        return src, dst, size_bytes, start, route, wire, ideal
