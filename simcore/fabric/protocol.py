"""The one protocol every fabric backend implements (send a message, be called back when it is
delivered) and the measurements every backend reports in the same fields."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from simcore.fabric.topology import Topology


class MessageResult(NamedTuple):
    """A delivered message: when it was handed to the sender's NIC and when its last byte arrived.

    `ideal_s` is its completion time alone on an idle network along its path (the analytical
    backend's answer where it waits on no link), so `slowdown` = fct_s / ideal_s >= 1 up to
    rounding. A named tuple (an immutable value, as a frozen dataclass, at a quarter of the cost
    to build: a serving run's report builds one per message, hundreds of thousands).
    """

    msg_id: int
    src: int
    dst: int
    size_bytes: int
    start_s: float
    end_s: float
    ideal_s: float
    tag: Any = None

    @property
    def fct_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def slowdown(self) -> float:
        return self.fct_s / self.ideal_s if self.ideal_s > 0 else 1.0


@dataclass
class LinkStats:
    """What one directed link saw. Queue figures are of its egress queue at the source node."""

    bytes_sent: int = 0             # on the wire, headers included
    busy_s: float = 0.0             # time spent serialising
    max_queue_bytes: int = 0
    queue_byte_s: float = 0.0       # integral of queue bytes over time (mean = / duration)
    ecn_marks: int = 0
    drops: int = 0
    pfc_pause_frames: int = 0       # PAUSE (XOFF) frames this link's receiver sent upstream
    paused_s: float = 0.0           # time this link's transmitter was paused by PFC
    # The same two per traffic class 0..7 (empty where a backend has no classes).
    pfc_pause_frames_by_class: list[int] = field(default_factory=list)
    paused_s_by_class: list[float] = field(default_factory=list)


@dataclass
class FabricStats:
    """A run's measurements, the same fields from every backend (zeros where a backend has no
    such mechanism, e.g. no ECN marks from the flow backend).

    Byte conservation: payload_sent = payload_delivered + payload_dropped_unrecovered +
    payload_in_flight; `check_conservation()` verifies it at the end of a run.
    """

    messages: Sequence[MessageResult] = field(default_factory=list)   # in delivery order
    links: list[LinkStats] = field(default_factory=list)
    duration_s: float = 0.0
    payload_sent_bytes: int = 0
    payload_delivered_bytes: int = 0
    payload_dropped_bytes: int = 0
    payload_in_flight_bytes: int = 0
    retransmitted_bytes: int = 0
    num_drops: int = 0
    num_retransmits: int = 0
    num_ecn_marks: int = 0
    num_cnps: int = 0
    num_rate_cuts: int = 0
    num_pfc_pause_frames: int = 0
    utilization_t_s: list[float] = field(default_factory=list)
    utilization: list[list[float]] = field(default_factory=list)   # per sample, per link
    # The samples' interval: the settings' sample_interval_s, doubled as often as a long run
    # needed to hold its samples (`simcore.fabric.utilization.MAX_SAMPLE_VALUES`); 0: the
    # settings' own.
    utilization_interval_s: float = 0.0
    queue_histogram_bytes: dict[int, list[int]] = field(default_factory=dict)  # link -> bins
    # Ids of unreliable (datagram) messages that lost a packet, hence never delivered; only the
    # packet backend drops packets.
    lost_message_ids: list[int] = field(default_factory=list)

    def check_conservation(self) -> None:
        """Raise AssertionError unless every payload byte sent is accounted for."""
        accounted = (self.payload_delivered_bytes + self.payload_dropped_bytes
                     + self.payload_in_flight_bytes)
        if self.payload_sent_bytes != accounted:
            raise AssertionError(f"bytes not conserved: sent {self.payload_sent_bytes}, delivered "
                                 f"{self.payload_delivered_bytes} + dropped "
                                 f"{self.payload_dropped_bytes} + in flight "
                                 f"{self.payload_in_flight_bytes}")


OnDone = Callable[[MessageResult], None]


class Fabric(Protocol):
    """A network that moves messages between hosts of a Topology on its own virtual clock.

    Lifecycle: `send` messages (now or at a future time), then `run(until_s)` processes every
    event up to and including `until_s` (None: until idle) and returns the clock. A SimPy
    driver keeps it in lock-step by running it to `min(env.now, next_event_s())`. Callbacks
    (`on_done`) fire from inside `run`, in time order, when a message's last byte arrives.
    """

    topology: Topology

    @property
    def now_s(self) -> float: ...

    def send(self, src: int, dst: int, size_bytes: int, *, at_s: float | None = None,
             tag: Any = None, on_done: OnDone | None = None, flow_key: int | None = None,
             traffic_class: int = 0) -> int:
        """Queue a message; returns its id. `flow_key` (default: the message id) feeds ECMP;
        `traffic_class` (0..7) picks its priority where the backend models classes."""
        ...

    def ideal_s(self, msg_id: int) -> float:
        """A sent message's completion time alone on an idle network along its path."""
        ...

    def next_event_s(self) -> float:
        """Time of the next pending event (inf when idle)."""
        ...

    def run(self, until_s: float | None = None, *,
            stop: Callable[[], bool] | None = None) -> float:
        """Process events up to until_s; `stop`, checked after each completion callback, ends
        the run early (at that callback's time) when it returns true."""
        ...

    def stats(self) -> FabricStats: ...
