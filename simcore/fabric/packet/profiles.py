"""What a fabric profile means port by port for the packet backend, and the knobs only the packet
backend has.

The profiles themselves (RoCEv2: PFC + ECN + DCQCN; InfiniBand: credit-based lossless links;
Slingshot-like: credits, adaptive routing, ECN) are `simcore.fabric.settings.FabricSettings`;
`roce_v2`, `infiniband` and `slingshot` build them with overrides. `resolve` turns a topology and
settings into the per-link and per-switch numbers the kernel runs on: ECN thresholds scaled to
each link's rate, PFC headroom and pause time per port, credit buffers, lossy buffer limits.

Reading of the settings: under PFC, `pfc.shared_buffer_bytes` is each switch's shared pool and
every ingress port's headroom is reserved, per lossless class, on top of it (control frames
travel on a strict-priority class that is never paused). Drop-tail limits apply at switch egress
ports to lossy classes only: every class on lossy fabrics, the classes outside
`traffic_classes.lossless` under PFC (a host's NIC queue is unbounded). Under credits, each
switch ingress port advertises its buffer per virtual lane (class); hosts drain theirs at line
rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from simcore.errors import ConfigError
from simcore.fabric.ecmp import default_salts
from simcore.fabric.settings import FabricSettings
from simcore.fabric.topology import HOST, Topology
from simcore.fabric.utilization import max_intervals
from simcore.fabric.packet.state import (CF_ACKN, CF_ALPHA, CF_AR, CF_ARTH, CF_CC, CF_CTRL, CF_FC,
                                         CF_HBIN, CF_HDR, CF_LOSSLESS, CF_NHOST, CF_PAY, CF_REL,
                                         CF_RTO, CF_SMP, CF_SMPMAX, CF_WIN, CF_XON, FC_CREDIT,
                                         FC_NONE, FC_PFC,
                                         NUM_CFG, NUM_CLASSES)

PAUSE_QUANTUM_BITS = 512
"""IEEE 802.1Qbb: one pause quantum is 512 bit times of the link."""

UNLIMITED_CREDITS = 1 << 62
"""Credits of a link into a host: a NIC drains its receive buffer at line rate."""

MAX_ADAPTIVE_ENTRIES = 1 << 23
"""Most (node, host) entries of adaptive routing's port table: built in Python at about 1.7 s a
million (a star of 2,900 hosts; a fat-tree of k=62 would need 3.8 billion)."""
MAX_HISTOGRAM_BINS = 1024
"""Most bins of a port's queue-occupancy histogram when their number is left to the backend."""


@dataclass(frozen=True, slots=True)
class PacketSettings:
    """Knobs of the packet backend that FabricSettings does not carry (defaults suit all profiles).
    """

    control_frame_bytes: int = 64
    """On-wire size of ACK, NACK, CNP and PAUSE frames."""
    ack_every_packets: int = 4
    """The reliable transport's receiver ACKs every this many in-order packets, and every
    message's end."""
    window_packets: int | None = None
    """Most unacknowledged packets per queue pair under the reliable transport (None: no limit,
    as RoCE); without one there are no acknowledgements and no window (selective repeat may
    resend a lost packet past a full window)."""
    reliable: bool | None = None
    """A reliable transport (ACKs, NACKs, a retransmission timeout) on every class; None: exactly
    when the fabric is lossy (no PFC, no credits), and on the lossy classes under PFC. Lossless
    fabrics then skip ACK traffic."""
    retransmission: str = "go_back_n"
    """The reliable transport of messages sent without a `transport` of their own: go_back_n
    (resend from the first lost packet on) or selective_repeat (the receiver keeps packets past
    a gap; only the lost ones are resent)."""
    lossy_buffer_bytes: int | None = None
    """Egress buffer of a switch port on a lossy fabric where the topology leaves the link's
    buffer_bytes unset (None: unbounded)."""
    adaptive_threshold_bytes: int | None = None
    """Adaptive routing keeps the hashed port unless another equal-cost port has this many bytes
    less queued (None: one MTU)."""
    queue_histogram_bins: int | None = None
    """Bins of the queue-occupancy histogram, the last collecting everything above; None: enough
    to cover the most a port can hold (its lossy buffer; its switch's buffer under PFC or
    credits), at most MAX_HISTOGRAM_BINS."""

    def __post_init__(self) -> None:
        for name in ("control_frame_bytes", "ack_every_packets"):
            if getattr(self, name) < 1:
                raise ConfigError(f"packet.{name} must be at least 1, got {getattr(self, name)}")
        for name in ("window_packets", "lossy_buffer_bytes", "queue_histogram_bins"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"packet.{name} must be at least 1 or null, got {value}")
        if self.retransmission not in ("go_back_n", "selective_repeat"):
            raise ConfigError(f"packet.retransmission must be go_back_n or selective_repeat, got "
                              f"{self.retransmission!r}")
        if self.adaptive_threshold_bytes is not None and self.adaptive_threshold_bytes < 0:
            raise ConfigError(f"packet.adaptive_threshold_bytes must be non-negative, got "
                              f"{self.adaptive_threshold_bytes}")


def roce_v2(**overrides: Any) -> FabricSettings:
    """RoCEv2: PFC, ECN marking and DCQCN (FabricSettings fields as overrides)."""
    return FabricSettings(profile="roce", **overrides)


def infiniband(**overrides: Any) -> FabricSettings:
    """InfiniBand: credit-based lossless links per virtual lane."""
    return FabricSettings(profile="infiniband", **overrides)


def slingshot(**overrides: Any) -> FabricSettings:
    """Slingshot-like: credit-based links, adaptive routing on queue depth, ECN marking."""
    return FabricSettings(profile="slingshot", **overrides)


@dataclass(frozen=True)
class Plan:
    """Everything `load_topology` copies into the kernel, as arrays over nodes and links."""

    host: np.ndarray
    host_index: np.ndarray
    salt: np.ndarray
    pool: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    rev: np.ndarray
    rate: np.ndarray
    delay: np.ndarray
    cap: np.ndarray
    ecn: np.ndarray
    kmin: np.ndarray
    kmax: np.ndarray
    pmax: np.ndarray
    headroom: np.ndarray
    pause_s: np.ndarray
    credits: np.ndarray
    nh_off: np.ndarray
    nh_links: np.ndarray
    cfg: np.ndarray
    num_hist: int

    def kernel_args(self) -> tuple:
        return (self.host, self.host_index, self.salt, self.pool, self.src,
                self.dst, self.rev, self.rate, self.delay, self.cap, self.ecn, self.kmin,
                self.kmax, self.pmax, self.headroom, self.pause_s, self.credits, self.nh_off,
                self.nh_links, self.cfg)


def reverse_links(topology: Topology) -> list[int]:
    """For every link, the other direction of its cable (parallel cables pair up in order)."""
    unmatched: dict[tuple[int, int], list[int]] = {}
    rev = [-1] * len(topology.links)
    for lk in topology.links:
        waiting = unmatched.get((lk.dst, lk.src))
        if waiting:
            other = waiting.pop(0)
            rev[lk.index], rev[other] = other, lk.index
        else:
            unmatched.setdefault((lk.src, lk.dst), []).append(lk.index)
    if -1 in rev:
        li = rev.index(-1)
        raise ConfigError(f"topology {topology.name}: link {li} has no link in the opposite "
                          f"direction")
    return rev


def pfc_headroom_bytes(settings: FabricSettings, rate_bps: float, delay_s: float, mtu: int,
                       control_bytes: int) -> int:
    """Headroom of an ingress port: the configured value, or the settings' formula raised to what
    the port can receive after deciding XOFF in the worst case here (the XOFF waits for a frame
    on the reverse link, travels d; the sender finishes its frame in flight; another d back):
    2 d C + 3 MTU + one control frame."""
    if settings.pfc.headroom_bytes is not None:
        return int(settings.pfc.headroom_bytes)
    formula = settings.pfc.headroom_for(rate_bps, delay_s, mtu)
    floor = 2 * delay_s * rate_bps / 8 + 3 * mtu + control_bytes
    return int(np.ceil(max(formula, floor)))


def resolve(topology: Topology, settings: FabricSettings, packet: PacketSettings,
            seed: int) -> Plan:
    """The kernel's view of `topology` under `settings` (see the module docstring)."""
    nodes, links = topology.nodes, topology.links
    num_nodes, num_links = len(nodes), len(links)
    mtu, header = topology.mtu_bytes, topology.header_bytes
    if header >= mtu:
        raise ConfigError(f"topology {topology.name}: header_bytes ({header}) must be below "
                          f"mtu_bytes ({mtu})")
    host = np.array([nd.kind == HOST for nd in nodes], dtype=np.int64)
    hosts = topology.hosts
    host_index = np.full(num_nodes, -1, dtype=np.int64)
    host_index[hosts] = np.arange(len(hosts))
    salt = np.array(default_salts(topology, seed), dtype=np.uint64).view(np.int64)

    if settings.pfc.enabled:
        fc = FC_PFC
    elif settings.credit.enabled:
        fc = FC_CREDIT
    else:
        fc = FC_NONE
    src = np.array([lk.src for lk in links], dtype=np.int64)
    dst = np.array([lk.dst for lk in links], dtype=np.int64)
    rev = np.array(reverse_links(topology), dtype=np.int64)
    rate = np.array([lk.rate_bps / 8 for lk in links])
    delay = np.array([lk.delay_s for lk in links])
    cap = np.full(num_links, -1, dtype=np.int64)
    ecn = np.zeros(num_links, dtype=np.int64)
    kmin = np.zeros(num_links)
    kmax = np.zeros(num_links)
    pmax = np.zeros(num_links)
    headroom = np.zeros(num_links, dtype=np.int64)
    pause_s = np.zeros(num_links)
    credits = np.full(num_links, UNLIMITED_CREDITS, dtype=np.int64)
    pool = np.zeros(num_nodes, dtype=np.int64)
    for lk in links:
        i = lk.index
        from_switch = not host[lk.src]
        if from_switch and fc == FC_NONE:
            buf = lk.buffer_bytes if lk.buffer_bytes is not None else packet.lossy_buffer_bytes
            cap[i] = -1 if buf is None else int(buf)
        if settings.discipline(i) == "ecn" and (from_switch or i in settings.link_disciplines):
            ecn[i] = 1
            kmin[i], kmax[i] = settings.ecn.thresholds_bytes(lk.rate_bps)
            pmax[i] = settings.ecn.pmax
        pause_s[i] = settings.pfc.pause_quanta * PAUSE_QUANTUM_BITS / lk.rate_bps
        if not host[lk.dst]:
            headroom[i] = pfc_headroom_bytes(settings, lk.rate_bps, lk.delay_s, mtu,
                                             packet.control_frame_bytes)
            if fc == FC_CREDIT:
                buf = settings.credit.buffer_bytes or lk.buffer_bytes
                if buf is None:
                    buf = 2 * lk.rate_bps / 8 * lk.delay_s + 2 * mtu
                if buf < mtu:
                    raise ConfigError(f"credit buffer of link {i} ({buf:g} bytes) is smaller "
                                      f"than one MTU ({mtu} bytes): nothing could be sent")
                credits[i] = int(buf)
    if fc == FC_PFC:
        pool[host == 0] = int(settings.pfc.shared_buffer_bytes)
    num_hist = packet.queue_histogram_bins or _histogram_bins(
        topology, fc, cap, headroom, credits, settings)
    if fc == FC_NONE:
        lossless = 0
    elif fc == FC_CREDIT:
        lossless = (1 << NUM_CLASSES) - 1
    else:
        lossless = settings.traffic_classes.lossless_mask()
        if lossless != (1 << NUM_CLASSES) - 1:
            # Classes outside PFC meet drop-tail at switch egress, as on a lossy fabric.
            for lk in links:
                if not host[lk.src]:
                    buf = (lk.buffer_bytes if lk.buffer_bytes is not None
                           else packet.lossy_buffer_bytes)
                    cap[lk.index] = -1 if buf is None else int(buf)

    num_hosts = len(hosts)
    adaptive = settings.routing == "adaptive"
    # Adaptive routing's table of equal-cost ports per node and destination host (only it
    # reads one): built in Python, node by node.
    if adaptive and num_nodes * num_hosts > MAX_ADAPTIVE_ENTRIES:
        raise ConfigError(
            f"routing: adaptive routing (the settings' routing, or its profile's) on the packet "
            f"backend keeps the ports "
            f"toward every host at every node, {num_nodes:,} x {num_hosts:,} entries here, past "
            f"the {MAX_ADAPTIVE_ENTRIES:,} it builds; use ecmp routing, or the flow or "
            f"analytical backend")
    nh_off = np.zeros((num_nodes * num_hosts if adaptive else 0) + 1, dtype=np.int64)
    nh_links: list[int] = []
    if adaptive:
        for n in range(num_nodes):
            for j, h in enumerate(hosts):
                nh_links.extend(topology.hops(n, h))
                nh_off[n * num_hosts + j + 1] = len(nh_links)
    threshold = (packet.adaptive_threshold_bytes if packet.adaptive_threshold_bytes is not None
                 else mtu)
    reliable = packet.reliable if packet.reliable is not None else fc == FC_NONE

    cfg = np.zeros(NUM_CFG)
    cfg[CF_FC] = fc
    cfg[CF_REL] = float(reliable)
    cfg[CF_AR] = float(adaptive)
    cfg[CF_CC] = float(settings.dcqcn.enabled)
    cfg[CF_PAY] = mtu - header
    cfg[CF_HDR] = header
    cfg[CF_CTRL] = packet.control_frame_bytes
    cfg[CF_ACKN] = packet.ack_every_packets
    cfg[CF_RTO] = settings.retransmit_timeout_s
    cfg[CF_WIN] = (packet.window_packets or 0) if reliable else 0   # no ACKs: nothing to count
    cfg[CF_ALPHA] = settings.pfc.alpha
    cfg[CF_XON] = settings.pfc.xon_offset_bytes
    cfg[CF_HBIN] = settings.queue_histogram_bin_bytes
    cfg[CF_ARTH] = threshold
    cfg[CF_SMP] = settings.sample_interval_s
    cfg[CF_SMPMAX] = max_intervals(num_links)
    cfg[CF_NHOST] = num_hosts
    cfg[CF_LOSSLESS] = lossless
    return Plan(host, host_index, salt, pool, src, dst, rev, rate, delay, cap, ecn,
                kmin, kmax, pmax, headroom, pause_s, credits, nh_off,
                np.array(nh_links or [0], dtype=np.int64), cfg, num_hist)


def _histogram_bins(topology: Topology, fc: int, cap: np.ndarray, headroom: np.ndarray,
                    credits: np.ndarray, settings: FabricSettings) -> int:
    """Histogram bins enough for the fullest queue a switch port can reach (capped)."""
    bound = 0
    if fc == FC_NONE:
        from_switch = [i for i, lk in enumerate(topology.links)
                       if topology.nodes[lk.src].kind != HOST]
        caps = cap[from_switch]
        bound = int(caps.max()) if len(caps) and (caps >= 0).all() else 0
    else:
        in_links: list[list[int]] = [[] for _ in topology.nodes]
        for lk in topology.links:
            in_links[lk.dst].append(lk.index)
        for n, node in enumerate(topology.nodes):
            if node.kind == HOST:
                continue
            ins = in_links[n]
            if fc == FC_PFC:
                held = settings.pfc.shared_buffer_bytes + int(headroom[ins].sum())
            else:
                held = int(credits[ins].sum())
            bound = max(bound, held)
    if bound <= 0:
        return MAX_HISTOGRAM_BINS
    return int(min(MAX_HISTOGRAM_BINS, math.ceil(bound / settings.queue_histogram_bin_bytes) + 1))
