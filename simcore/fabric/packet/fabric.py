"""The packet-level fabric: every packet of every message crosses every link of its path as a
store-and-forward frame, through egress queues, switches (ECMP or adaptive routing, PFC or
credits) and NICs (segmentation, pacing, go-back-N or selective repeat, unreliable datagrams,
DCQCN), on a virtual clock of its own.

The data plane runs in the compiled kernel (`events.run_events`); this class is its Python face:
it validates and registers messages and traffic sources, answers the kernel's requests (message
callbacks, DCQCN's notification and reaction points, which are Python objects), and reads the
measurements back.
"""

from __future__ import annotations

from collections.abc import Callable

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from simcore.errors import ConfigError
from simcore.fabric.messages import num_packets, plan_message
from simcore.fabric.ecmp import default_salts, flow_hash, path, source_port
from simcore.fabric.packet import api, events, nic, stats
from simcore.fabric.packet.clock import HORIZON_S
from simcore.fabric.packet.profiles import PacketSettings, resolve
from simcore.fabric.packet.state import C_STALL as STALL_COUNTER
from simcore.fabric.packet.state import (CF_LOSSLESS, CF_REL, NUM_CLASSES, REL_GBN, REL_NONE,
                                         REL_SR, new_state)
from simcore.fabric.protocol import FabricStats, MessageResult, OnDone
from simcore.fabric.settings import FabricSettings
from simcore.fabric.topology import HOST, Topology


TRANSPORTS = ("go_back_n", "selective_repeat", "datagram")
"""How a message's packets travel: reliably, lost packets resent by go-back-N or by selective
repeat where its class may drop (a lossless class needs neither: no ACKs); or as unreliable
datagrams, each packet sent once, never acknowledged or resent."""

_REL = {"go_back_n": REL_GBN, "selective_repeat": REL_SR}


def _check_class(traffic_class: int) -> None:
    if not (isinstance(traffic_class, (int, np.integer)) and 0 <= traffic_class < NUM_CLASSES):
        raise ValueError(f"traffic_class must be in 0..{NUM_CLASSES - 1}, got {traffic_class!r}")


@dataclass(slots=True)
class _Message:
    msg_id: int
    src: int
    dst: int
    size_bytes: int
    start_s: float
    ideal_s: float
    tag: Any
    on_done: OnDone | None


class PacketFabric:
    """A packet-level simulation of `topology` under `settings` (FabricSettings; the RoCEv2
    profile by default) and the packet-only knobs `packet`; `seed` fixes ECMP salts and every
    random draw (ECN marking, Poisson sources).

    Lifecycle: `send` messages and `add_source` datagram sources, `run` to a time or until idle
    (callbacks fire inside, in time order, and may send more), read `stats()` at any point.
    Message ids count from 0 in `send` order; flows with the same (src, dst, flow_key) share one
    queue pair and deliver in order. A message sent with `transport="datagram"` that loses a
    packet is never delivered (`lost_message_ids`). Not re-entrant: a callback must not call
    `run`.
    """

    def __init__(self, topology: Topology, settings: FabricSettings | None = None, *,
                 seed: int = 0, packet: PacketSettings | None = None) -> None:
        self.topology = topology
        self.settings = settings if settings is not None else FabricSettings()
        self.packet = packet if packet is not None else PacketSettings()
        self.seed = seed
        self._salts = default_salts(topology, seed)
        self._routes: dict = {}
        plan = resolve(topology, self.settings, self.packet, seed)
        self._rng = np.random.default_rng(seed)
        self._st = new_state(len(topology.nodes), len(topology.links), plan.num_hist,
                             len(plan.nh_off) - 1, self._rng)
        api.load_topology(self._st, *plan.kernel_args())
        self._reliable = bool(plan.cfg[CF_REL])
        self._lossless = int(plan.cfg[CF_LOSSLESS])
        self._flows: dict[tuple[int, int, int, int], int] = {}
        self._flow_ends: list[tuple[int, int, int]] = []     # (src, dst, flow_key) per flow
        self._flow_line_bps: list[float] = []                # rate of each flow's first link
        self._messages: list[_Message] = []
        self._sources: list[int] = []                        # flow of each source
        self._reaction_points: dict[int, Any] = {}
        self._notification_points: dict[int, Any] = {}
        self._dcqcn = None
        self._now = 0.0
        self._num_callbacks = 0          # completion callbacks fired so far
        self._running = False

    # ---- the Fabric protocol -----------------------------------------------------------------

    @property
    def now_s(self) -> float:
        return self._now

    def send(self, src: int, dst: int, size_bytes: int, *, at_s: float | None = None,
             tag: Any = None, on_done: OnDone | None = None, flow_key: int | None = None,
             traffic_class: int = 0, transport: str | None = None) -> int:
        """Queue a message of `size_bytes` payload from host src to host dst at at_s (now when
        None) in `traffic_class` (0..7); returns its id. `flow_key` (default: the id) names its
        queue pair (one per class and transport) and feeds ECMP. `transport` (TRANSPORTS;
        default `packet.retransmission`): go_back_n, selective_repeat, or datagram (unreliable:
        no ACKs, no retransmission, no congestion control).
        """
        _check_class(traffic_class)
        transport = self.packet.retransmission if transport is None else transport
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}, got "
                             f"{transport!r}")
        start = self._now if at_s is None else float(at_s)
        if start < self._now:
            raise ValueError(f"at_s {start} is before the fabric's clock {self._now}")
        msg_id = len(self._messages)
        key = msg_id if flow_key is None else flow_key
        rec = plan_message(self.topology, self._salts, msg_id, src, dst, size_bytes, start,
                           tag=tag, on_done=on_done, flow_key=key,
                           routes=self._routes if flow_key is not None else None)
        f = self._flow(rec.src, rec.dst, key, traffic_class, datagram=False, route=rec.path,
                       transport=transport)
        npk = num_packets(rec.size_bytes, self.topology.mtu_bytes, self.topology.header_bytes)
        self._messages.append(_Message(msg_id, rec.src, rec.dst, rec.size_bytes, start,
                                       rec.ideal_s, tag, on_done))
        m = api.add_message(self._st, f, rec.size_bytes, npk, start, int(on_done is not None))
        assert m == msg_id
        self._serve_requests()
        return msg_id

    def ideal_s(self, msg_id: int) -> float:
        """Message `msg_id`'s completion time alone on an idle network along its path."""
        return self._messages[msg_id].ideal_s

    def next_event_s(self) -> float:
        return float(api.next_time(self._st))

    def run(self, until_s: float | None = None, *,
            stop: Callable[[], bool] | None = None) -> float:
        """Process every event up to and including until_s (None: until nothing is left);
        returns the clock. `stop`: checked after each completion callback; when it returns
        true, return at once (the clock stays at that callback's time)."""
        if self._running:
            raise RuntimeError("run() was called from inside a completion callback")
        limit = math.inf if until_s is None else float(until_s)
        if HORIZON_S <= limit < math.inf:
            raise ConfigError(f"the run passed the end of the packet fabric's clock "
                              f"({HORIZON_S:.3g} s, about 53 days: picoseconds in 64 bits); "
                              f"use the flow or analytical fabric for a run this long")
        self._running = True
        try:
            while True:
                why = api.run_events(self._st, limit)
                self._now = max(self._now, float(api.read_clock(self._st)))
                if why == events.STALLED:
                    raise self._stalled()
                if why != events.REQUESTS:
                    break
                fired = self._num_callbacks
                self._serve_requests()
                if stop is not None and self._num_callbacks != fired and stop():
                    return self._now
            if until_s is not None and limit > self._now:
                self._now = limit
                api.set_clock(self._st, limit)
        finally:
            self._running = False
        return self._now

    def _stalled(self) -> ConfigError:
        """The error of a queue pair that timed out `nic.STALL_TIMEOUTS` times in a row."""
        f = int(api.read_counters(self._st)[STALL_COUNTER]) - 1
        src, dst, key = self._flow_ends[f]
        nodes = self.topology.nodes
        scheme = next((ident[4] for ident, g in self._flows.items()
                       if g == f and len(ident) > 4), "go_back_n")
        return ConfigError(
            f"fabric: the {scheme} queue pair {nodes[src].name} -> {nodes[dst].name} (flow key "
            f"{key}) timed out {nic.STALL_TIMEOUTS} times in a row without an acknowledgement "
            f"by {self._now * 1e6:.0f} us: its retransmissions never get through (e.g. "
            "go-back-N resending its whole window into a drop-tail queue still full of the "
            "previous round); bound packet.window_packets, make the class lossless (PFC), "
            "enable DCQCN, or lengthen retransmit_timeout_s")

    def stats(self) -> FabricStats:
        """Measurements as of now (see simcore.fabric.packet.stats for the byte accounting)."""
        return stats.build_stats(self._st, self._now, self.message_results(),
                                 self.settings.sample_interval_s, self.num_rate_cuts(),
                                 self.lost_message_ids())

    # ---- beyond the protocol -----------------------------------------------------------------

    def add_source(self, src: int, dst: int, payload_bytes: int, *, rate_bps: float,
                   stop_s: float, start_s: float = 0.0, poisson: bool = False,
                   flow_key: int | None = None, traffic_class: int = 0) -> int:
        """A datagram source: packets of `payload_bytes` from host src to host dst at `rate_bps`
        of wire bytes (constant spacing, or exponential gaps with that mean when `poisson`) from
        start_s until stop_s, in `traffic_class`. No reliability, no congestion control. Returns
        its index."""
        _check_class(traffic_class)
        if not 0 < payload_bytes <= self._payload_bytes:
            raise ValueError(f"payload_bytes must be in 1..{self._payload_bytes}, got "
                             f"{payload_bytes}")
        if not rate_bps > 0:
            raise ValueError(f"rate_bps must be positive, got {rate_bps}")
        self._check_hosts(src, dst)
        index = len(self._sources)
        key = -1 - index if flow_key is None else flow_key
        f = self._flow(src, dst, key, traffic_class, datagram=True)
        self._sources.append(f)
        gap = (payload_bytes + self.topology.header_bytes) * 8 / rate_bps
        api.add_source(self._st, f, payload_bytes, gap, int(poisson), max(start_s, self._now),
                       stop_s)
        return index

    def source_delivered_bytes(self, index: int) -> int:
        """Payload bytes source `index` has delivered so far."""
        return int(api.read_flow_datagram_bytes(self._st, self._sources[index]))

    def lost_message_ids(self) -> list[int]:
        """Ids of datagram messages that lost a packet (never delivered), in id order."""
        _, end = api.read_messages(self._st)
        return np.flatnonzero(end == -2.0).tolist()

    def message_results(self) -> list[MessageResult]:
        """Delivered messages, in the order their last bytes arrived."""
        _, end = api.read_messages(self._st)
        done = np.flatnonzero(end >= 0)
        order = done[np.lexsort((done, end[done]))]
        return [self._result(int(m), float(end[m])) for m in order]

    def counters(self) -> dict[str, int]:
        """The kernel's counters: events, packet_hops (data frames put on links), frames,
        drops, retransmits, timeouts, ..."""
        cnt = api.read_counters(self._st)
        return {name: int(cnt[i]) for name, i in stats.COUNTERS.items()}

    def queue_bytes(self) -> list[int]:
        """Bytes each link's egress queue holds now (data waiting plus the frame on the wire)."""
        return [int(q) for q in api.read_queue_bytes(self._st)]

    def switch_buffer_peak_bytes(self) -> dict[int, int]:
        """Most buffer each switch held at once (bytes)."""
        peaks = api.read_switch_peaks(self._st)
        return {n: int(peaks[n]) for n in range(len(peaks)) if self.topology.nodes[n].kind != HOST}

    def num_rate_cuts(self) -> int:
        return sum(rp.num_cuts for rp in self._reaction_points.values())

    # ---- internals ---------------------------------------------------------------------------

    @property
    def _payload_bytes(self) -> int:
        return self.topology.mtu_bytes - self.topology.header_bytes

    def _check_hosts(self, src: int, dst: int) -> None:
        n = len(self.topology.nodes)
        for role, node in (("src", src), ("dst", dst)):
            if not (isinstance(node, (int, np.integer)) and 0 <= node < n
                    and self.topology.nodes[node].kind == HOST):
                raise ValueError(f"{role} must be the index of a host of topology "
                                 f"{self.topology.name}, got {node!r}")
        if src == dst:
            raise ValueError(f"a flow needs two different hosts, got {src} -> {dst}")

    def _flow(self, src: int, dst: int, key: int, traffic_class: int, *, datagram: bool,
              route: tuple[int, ...] | None = None, transport: str = "go_back_n") -> int:
        """The queue pair of (src, dst, key, traffic_class) for a source (`datagram`) or for
        messages of `transport`, created on first use with its ECMP paths (`route`: the data
        path when the caller already has it); reliable messages run their retransmission
        scheme when the fabric is reliable or their class may drop."""
        ident: tuple = (src, dst, key, traffic_class)
        if datagram or transport != "go_back_n":
            ident += ("source" if datagram else transport,)
        f = self._flows.get(ident)
        if f is not None:
            return f
        topo = self.topology
        fhash = flow_hash(src, dst, source_port(key))
        if route is None:
            route = tuple(path(topo, src, dst, fhash, self._salts))
        fwd = np.array(route, dtype=np.int64)
        back = np.array(path(topo, dst, src, flow_hash(dst, src, source_port(key)), self._salts),
                        dtype=np.int64)
        bits = int(np.array([fhash], dtype=np.uint64).view(np.int64)[0])
        line_bps = topo.links[int(fwd[0])].rate_bps
        unreliable = datagram or transport == "datagram"
        cc = int(self.settings.dcqcn.enabled and not unreliable)
        rel = REL_NONE
        if not unreliable and (self._reliable or not self._lossless >> traffic_class & 1):
            rel = _REL[transport]
        f = api.add_flow(self._st, src, dst, fwd, back, bits, line_bps / 8, cc, int(datagram),
                         traffic_class, rel)
        self._flows[ident] = f
        self._flow_ends.append((src, dst, key))
        self._flow_line_bps.append(line_bps)
        return f

    def _result(self, m: int, end_s: float) -> MessageResult:
        rec = self._messages[m]
        return MessageResult(rec.msg_id, rec.src, rec.dst, rec.size_bytes, rec.start_s, end_s,
                             rec.ideal_s, rec.tag)

    def _serve_requests(self) -> None:
        """Answer the kernel's requests, in order, at the kernel's current time (answers may
        raise new ones: keep going until none are left)."""
        st = self._st
        while True:
            kinds, args = api.take_outbox(st)
            if len(kinds) == 0:
                return
            now = float(api.read_clock(st))
            for kind, a in zip(kinds.tolist(), args.tolist()):
                if kind == nic.O_DONE:
                    rec = self._messages[a]
                    self._num_callbacks += 1
                    rec.on_done(self._result(a, now))
                elif kind == nic.O_NP:
                    src, dst, key = self._flow_ends[a]
                    point = self._notification_point(dst)
                    if point.on_ecn_marked_packet(a, now):
                        api.send_cnp(st, a, now + point.cnp_interval_s, now)
                else:
                    rp = self._reaction_point(a)
                    rp.on_bytes_sent(int(api.take_sent_bytes(st, a)), now)
                    if kind == nic.O_CNP:
                        rp.on_cnp(now)
                    else:
                        rp.advance(now)
                    budget = rp.params.byte_counter_bytes
                    left = (budget - rp.bytes_since_byte_event
                            if budget is not None and rp.is_rate_limited else -1)
                    api.set_flow_rate(st, a, rp.rate_bps / 8, rp.next_event_s(), left)

    def _dcqcn_module(self):
        if self._dcqcn is None:
            from simcore.fabric import dcqcn
            self._dcqcn = dcqcn
        return self._dcqcn

    def _notification_point(self, host: int):
        point = self._notification_points.get(host)
        if point is None:
            point = self._dcqcn_module().NotificationPoint(self.settings.dcqcn.cnp_interval_s)
            self._notification_points[host] = point
        return point

    def _reaction_point(self, f: int):
        rp = self._reaction_points.get(f)
        if rp is None:
            rp = self._dcqcn_module().ReactionPoint(self._dcqcn_params(f),
                                                    float(api.read_clock(self._st)))
            self._reaction_points[f] = rp
        return rp

    def _dcqcn_params(self, f: int):
        return self.settings.dcqcn.params(self._flow_line_bps[f])
