"""Fabric settings: a named profile (RoCEv2, InfiniBand, Slingshot-like) with every parameter of
packet framing, ECN marking, PFC, credit flow control, DCQCN, routing, retransmission and
measurement overridable. After validation every field holds a concrete value, except the DCQCN
overrides: those left null take the variant's published value, scaled to each NIC's line rate
(`DcqcnSettings.params`).

Only the packet backend reads most of these; the flow and analytical backends read the packet
framing and `sample_interval_s` alone (`simcore.fabric.fidelity` lists which backend reads what,
so a run can say which settings it ignored). Packet framing (`mtu_bytes`, `header_bytes`) is
handed to the topology builder, so backends read it from the `Topology`.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, field_validator,
                      model_validator)

from simcore.errors import ConfigError, Number, WholeNumber

if TYPE_CHECKING:
    from simcore.fabric.dcqcn import DcqcnParams

_FROZEN = ConfigDict(extra="forbid", frozen=True)

Profile = Literal["roce", "infiniband", "slingshot"]
Discipline = Literal["drop_tail", "ecn"]

def _whole_number(value: Any) -> Any:
    """Accept 1e6 (YAML reads it as a string) or 1000000.0 where a whole number is expected."""
    if isinstance(value, str):
        try:
            value = float(value.replace("_", ""))
        except ValueError:
            return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


Bytes = Annotated[WholeNumber, BeforeValidator(_whole_number)]
"""A byte count: a whole number, also written as an integral float or a string with
underscores (1e5, "100_000"); true and false refused."""


MAX_TIME_S = 1e6
"""Latest time a fabric input may name (a message's or a source's start and stop, a run's
duration), seconds: about 12 days, inside the packet backend's clock (picoseconds in 64 bits,
to about 53 days)."""
MAX_DELAY_S = 1.0
"""Longest propagation delay of a link, seconds (a geostationary satellite hop takes about
0.25 s)."""
MIN_RATE_GBPS = 1e-3
"""Slowest link, Gb/s (1 Mb/s): a frame of 4 KB takes 33 ms; slower links (a derived uplink of
an oversubscription of 10^12, a NIC of 1 b/s) leave a run that holds its messages for ever."""
MIN_OVERSUBSCRIPTION = 0.01
"""Smallest oversubscription of a leaf's uplinks (uplinks of a hundred times its hosts'
bandwidth)."""
MAX_OVERSUBSCRIPTION = 1e3
"""Largest oversubscription of a leaf's uplinks (a thousand times its hosts' bandwidth over its
uplinks' is past any fabric built)."""
Oversubscription = Annotated[Number, Field(ge=MIN_OVERSUBSCRIPTION, le=MAX_OVERSUBSCRIPTION)]
"""A leaf's downlink over uplink bandwidth, in a scenario's topology and a cluster's network
alike."""
OVERSUBSCRIPTION_RANGE = f"{MIN_OVERSUBSCRIPTION:g} to {MAX_OVERSUBSCRIPTION:,.0f}"
"""The bounds of Oversubscription as the fields' descriptions give them."""
MAX_RATE_GBPS = 1e5
"""Fastest link or source, Gb/s (100 Tb/s, past any link built): the packet backend times a frame
in whole picoseconds, and a 64-byte frame takes 5 of them at this rate."""


class _Frozen(BaseModel):
    """Base of the fabric's configuration models (scenario files, a cluster's network):
    immutable, unknown keys rejected."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class _Buffered(_Frozen):
    """An egress-queue capacity given in bytes or in packets (of one MTU each), or unbounded.

    Either way it is a limit in bytes of frames as they go on the wire, headers included: a data
    frame counts its payload plus `header_bytes` (for RoCEv2 Ethernet, IP, UDP, BTH, ICRC and
    FCS; preamble and inter-frame gap are not modelled, on the wire or in a queue), and
    `buffer_packets` N is N x `mtu_bytes`, N full-size frames, headers included (more frames
    when they are shorter). The queue holds the data frames waiting and the one being sent (a
    frame keeps its buffer until its last bit has left); control frames (ACK, NACK, CNP, PAUSE)
    have a queue of their own and do not count. A lossy frame is refused when the bytes queued
    plus its own would exceed the capacity. Read by the packet backend only.
    """

    buffer_bytes: Bytes | None = Field(None, gt=0, description="Egress-queue capacity per link in "
                                       "bytes of frames on the wire, headers included; leave out "
                                       "(and buffer_packets) for unbounded.")
    buffer_packets: WholeNumber | None = Field(
        None, gt=0, description="Egress-queue capacity per link in full-size packets: "
        "buffer_packets x mtu_bytes bytes of frames, headers included.")

    @model_validator(mode="after")
    def _one_unit(self) -> _Buffered:
        if self.buffer_bytes is not None and self.buffer_packets is not None:
            raise ValueError("give buffer_bytes or buffer_packets, not both")
        return self

    def buffer(self, mtu_bytes: int) -> int | None:
        if self.buffer_packets is not None:
            return self.buffer_packets * mtu_bytes
        return self.buffer_bytes


ECN_SCALE_BPS = 25e9
"""ECN thresholds given per 25 Gb/s of link rate scale linearly with the link's rate."""

PROFILE_DEFAULTS: dict[str, dict[str, Any]] = {
    # RoCEv2: Ethernet 14 + IPv4 20 + UDP 8 + BTH 12 + ICRC 4 + FCS 4 = 62 header bytes; lossless
    # through PFC, ECN marking at switches, DCQCN at the NICs.
    "roce": {"mtu_bytes": 4096, "header_bytes": 62, "routing": "ecmp",
             "ecn": {"enabled": True}, "pfc": {"enabled": True},
             "credit": {"enabled": False}, "dcqcn": {"enabled": True, "variant": "mellanox"}},
    # InfiniBand: LRH 8 + BTH 12 + ICRC 4 + VCRC 2 = 26 header bytes; lossless through credit-based
    # link-level flow control; congestion control (FECN/BECN) off as on most fabrics by default.
    "infiniband": {"mtu_bytes": 4096, "header_bytes": 26, "routing": "ecmp",
                   "ecn": {"enabled": False}, "pfc": {"enabled": False},
                   "credit": {"enabled": True}, "dcqcn": {"enabled": False}},
    # Slingshot-like: Ethernet framing with a reduced header, credit-based lossless links,
    # adaptive routing on queue depth, ECN marking; its own congestion control is not modelled.
    "slingshot": {"mtu_bytes": 4096, "header_bytes": 40, "routing": "adaptive",
                  "ecn": {"enabled": True}, "pfc": {"enabled": False},
                  "credit": {"enabled": True}, "dcqcn": {"enabled": False}},
}


class EcnSettings(BaseModel):
    """RED/ECN marking at switch egress queues on instantaneous queue bytes q: probability 0 for
    q <= Kmin, Pmax (q - Kmin) / (Kmax - Kmin) up to Kmax, 1 above (RED's marking curve on the
    instantaneous queue, as DCQCN uses it: Zhu et al., SIGCOMM 2015, section 3.1).

    q is what an arriving data frame finds in its egress queue, before it is added: the bytes of
    the data frames of every class waiting there and of the one being sent, each counted as on
    the wire, payload plus `header_bytes` (no preamble or inter-frame gap); control frames do not
    count. Kmin and Kmax are in the same bytes, as are the buffer limits (`buffer_bytes`,
    `buffer_packets` x `mtu_bytes`)."""

    model_config = _FROZEN

    enabled: bool = Field(True, description="Mark packets at egress queues (queues without it are "
                          "drop-tail).")
    kmin_bytes: WholeNumber | None = Field(
        None, gt=0, description="Kmin in bytes for every link; null: kmin_bytes_per_25gbps scaled "
        "to the link's rate.")
    kmax_bytes: WholeNumber | None = Field(
        None, gt=0, description="Kmax in bytes for every link; null: kmax_bytes_per_25gbps scaled "
        "to the link's rate.")
    kmin_bytes_per_25gbps: WholeNumber = Field(
        100_000, gt=0, description="Kmin per 25 Gb/s of link rate (100 KB at 25G, 400 KB at 100G: "
        "HPCC / Alibaba values).")
    kmax_bytes_per_25gbps: WholeNumber = Field(
        400_000, gt=0, description="Kmax per 25 Gb/s of link rate (400 KB at 25G, 1.6 MB at "
        "100G).")
    pmax: Number = Field(0.2, gt=0, le=1, description="Marking probability at Kmax.")

    @model_validator(mode="after")
    def _ordered(self) -> EcnSettings:
        if self.kmin_bytes is not None and self.kmax_bytes is not None:
            if self.kmin_bytes >= self.kmax_bytes:
                raise ValueError(f"kmin_bytes ({self.kmin_bytes}) must be below kmax_bytes "
                                 f"({self.kmax_bytes})")
        if self.kmin_bytes_per_25gbps >= self.kmax_bytes_per_25gbps:
            raise ValueError("kmin_bytes_per_25gbps must be below kmax_bytes_per_25gbps")
        return self

    def thresholds_bytes(self, rate_bps: float) -> tuple[float, float]:
        """(Kmin, Kmax) in bytes for a link of `rate_bps`."""
        scale = rate_bps / ECN_SCALE_BPS
        kmin = self.kmin_bytes_per_25gbps * scale if self.kmin_bytes is None else self.kmin_bytes
        kmax = self.kmax_bytes_per_25gbps * scale if self.kmax_bytes is None else self.kmax_bytes
        if kmin >= kmax:
            raise ValueError(f"ECN thresholds at {rate_bps / 1e9:g} Gb/s: Kmin {kmin:g} bytes is "
                             f"not below Kmax {kmax:g} bytes")
        return float(kmin), float(kmax)


class PfcSettings(BaseModel):
    """IEEE 802.1Qbb priority flow control per ingress port and priority: XOFF when the port's
    shared-buffer use passes T = alpha x (free shared buffer) or headroom is in use, XON when back
    under T - xon_offset_bytes (the dynamic threshold of Choudhury and Hahne, "Dynamic queue length
    thresholds for shared-memory packet switches", IEEE/ACM ToN 1998, as shared-buffer switches
    apply it to PFC; pause quanta of 512 bit times per IEEE 802.1Qbb)."""

    model_config = _FROZEN

    enabled: bool = Field(True, description="Lossless operation through PAUSE frames; off: lossy, "
                          "drops at full buffers and go-back-N retransmission.")
    alpha: Number = Field(
        0.125, gt=0, description="Dynamic-threshold factor: XOFF threshold = alpha x free shared "
        "buffer (1/8 at NIC-rate ports).")
    shared_buffer_bytes: WholeNumber = Field(
        32_000_000, gt=0, description="Shared packet buffer of each switch, bytes.")
    headroom_bytes: WholeNumber | None = Field(
        None, gt=0, description="Headroom per ingress port; null: 2 x link RTT x rate + 2 MTU, "
        "per link.")
    xon_offset_bytes: WholeNumber = Field(
        8192, ge=0, description="XON is sent when the port's use falls this far below the XOFF "
        "threshold.")
    pause_quanta: WholeNumber = Field(
        65535, gt=0, le=65535, description="Pause time carried by an XOFF frame, in quanta of 512 "
        "bit times.")

    def headroom_for(self, rate_bps: float, delay_s: float, mtu_bytes: int) -> float:
        """Headroom in bytes at an ingress port fed by a link of `rate_bps` and `delay_s`."""
        if self.headroom_bytes is not None:
            return float(self.headroom_bytes)
        return 2 * (2 * delay_s) * rate_bps / 8 + 2 * mtu_bytes


class CreditSettings(BaseModel):
    """Credit-based link-level flow control (InfiniBand, Slingshot): a sender transmits only
    against buffer the receiver has advertised, so links never drop."""

    model_config = _FROZEN

    enabled: bool = Field(False, description="Lossless operation through credits.")
    buffer_bytes: WholeNumber | None = Field(
        None, gt=0, description="Receive buffer advertised per port (per virtual lane); null: the "
        "link's buffer_bytes, or 2 x bandwidth-delay product + 2 MTU when that is unbounded.")


class TrafficClassSettings(BaseModel):
    """Traffic classes 0..7 (802.1p priorities; InfiniBand virtual lanes): which are lossless and
    how an egress port picks among them.

    Scheduling is strict priority: control frames first, then the highest-numbered class that
    has a frame and is neither paused nor short of credits (7 highest). A class that is paused or
    out of credits never holds back another. Under PFC, only the classes in `lossless` are
    paused (PFC accounting per ingress port and class) and the others meet drop-tail at switch
    egress; under credits every class is a virtual lane with its own credits, hence lossless;
    without flow control every class is lossy."""

    model_config = _FROZEN

    lossless: tuple[WholeNumber, ...] = Field(
        tuple(range(8)), description="Classes PFC keeps lossless (its enabled priorities); the "
        "others may drop and run go-back-N.")
    scheduler: Literal["strict_priority"] = Field("strict_priority", description="How egress "
                                                  "ports share the link among classes: strict "
                                                  "priority, higher class first.")

    @field_validator("lossless")
    @classmethod
    def _classes(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        bad = [c for c in value if not 0 <= c <= 7]
        if bad:
            raise ValueError(f"traffic classes are 0..7, got {bad}")
        return tuple(sorted(set(value)))

    def lossless_mask(self) -> int:
        """Bit c set for each lossless class c."""
        return sum(1 << c for c in self.lossless)


class DcqcnSettings(BaseModel):
    """DCQCN congestion control: the notification point (receiver) sends at most one CNP per flow
    per cnp_interval_s on ECN-marked packets; the reaction point (sender NIC) cuts and recovers its
    rate (Zhu et al., SIGCOMM 2015, section 3). The variant's parameters come from `DcqcnParams.paper` or
    `DcqcnParams.mellanox` (rates and byte counter scaled to each NIC's line rate); every field
    given here overrides one of them, as an absolute value."""

    model_config = _FROZEN

    enabled: bool = Field(True, description="Run DCQCN at the NICs (needs ECN marking).")
    variant: Literal["paper", "mellanox"] = Field(
        "mellanox", description="paper: the SIGCOMM 2015 semantics; mellanox: NIC-firmware "
        "timers.")
    g: Number | None = Field(None, gt=0, le=1, description="EWMA gain of alpha.")
    alpha_timer_s: Number | None = Field(
        None, gt=0, description="K: alpha decays every K without a cut.")
    rate_decrease_min_interval_s: Number | None = Field(
        None, ge=0, description="Shortest time between two rate cuts.")
    increase_timer_s: Number | None = Field(
        None, gt=0, description="T: period of timer rate-increase events.")
    byte_counter_bytes: WholeNumber | None = Field(
        None, ge=0, description="B: bytes per byte-counter rate-increase event; 0 turns the byte "
        "counter off.")
    fast_recovery_steps: WholeNumber | None = Field(
        None, ge=0, description="F: fast-recovery steps after a cut.")
    rate_ai_gbps: Number | None = Field(
        None, ge=0, description="R_AI: additive-increase step, Gb/s.")
    rate_hai_gbps: Number | None = Field(
        None, ge=0, description="R_HAI: hyper-increase step, Gb/s.")
    min_rate_gbps: Number | None = Field(None, gt=0,
                                         description="Floor of the current rate, Gb/s.")
    initial_alpha: Number | None = Field(
        None, ge=0, le=1, description="Alpha used by the first cut.")
    clamp_target_rate_on_cut: bool | None = Field(None, description="Every cut sets the target "
                                                  "rate to the current rate (paper) or only after "
                                                  "an increase event (Mellanox firmware).")
    cnp_interval_s: Number = Field(
        50e-6, gt=0, description="Notification point: at most one CNP per flow per this interval.")

    @model_validator(mode="after")
    def _buildable(self) -> DcqcnSettings:
        try:
            self.params(1e12)
        except ConfigError as e:
            raise ValueError(str(e).removeprefix("dcqcn.")) from None
        return self

    def params(self, line_rate_bps: float) -> DcqcnParams:
        """The reaction point's DcqcnParams for a NIC of `line_rate_bps`: the variant's
        constructor, then the overrides given here."""
        from simcore.fabric.dcqcn import DcqcnParams

        base = (DcqcnParams.paper if self.variant == "paper" else DcqcnParams.mellanox)(
            line_rate_bps)
        overrides: dict[str, Any] = {}
        for name in ("g", "alpha_timer_s", "rate_decrease_min_interval_s", "increase_timer_s",
                     "fast_recovery_steps", "initial_alpha", "clamp_target_rate_on_cut"):
            if getattr(self, name) is not None:
                overrides[name] = getattr(self, name)
        for name in ("rate_ai", "rate_hai"):
            if getattr(self, f"{name}_gbps") is not None:
                overrides[f"{name}_bps"] = getattr(self, f"{name}_gbps") * 1e9
        if self.min_rate_gbps is not None:
            # One floor for every NIC: a NIC slower than it runs at its line rate.
            overrides["min_rate_bps"] = min(self.min_rate_gbps * 1e9, line_rate_bps)
        if self.byte_counter_bytes is not None:
            overrides["byte_counter_bytes"] = self.byte_counter_bytes or None
        return dataclasses.replace(base, **overrides) if overrides else base


class FabricSettings(BaseModel):
    """Everything a fabric backend needs besides the topology, with a profile's defaults filled in
    wherever the scenario is silent (nested sections merge key by key). Immutable once built.

    Invariants: at most one of PFC and credit flow control; DCQCN only with ECN marking;
    header_bytes < mtu_bytes.
    """

    model_config = _FROZEN

    profile: Profile = Field("roce", description="Preset the other fields default from: roce "
                             "(PFC + ECN + DCQCN), infiniband (credit-based, lossless), slingshot "
                             "(credit-based, adaptive routing, ECN).")
    mtu_bytes: WholeNumber = Field(
        gt=0, description="Largest packet on the wire, headers included, bytes.")
    header_bytes: WholeNumber = Field(
        ge=0, description="Header bytes per packet; payload per packet is mtu_bytes - "
        "header_bytes.")
    routing: Literal["ecmp", "adaptive"] = Field(description="ecmp: per-switch 5-tuple hash; "
                                                 "adaptive: least-queued equal-cost next hop "
                                                 "(packet backend only; the others use ECMP).")
    ecn: EcnSettings = Field(description="RED/ECN marking at switch egress queues.")
    pfc: PfcSettings = Field(description="Priority flow control.")
    credit: CreditSettings = Field(description="Credit-based link-level flow control.")
    dcqcn: DcqcnSettings = Field(description="DCQCN congestion control at the NICs.")
    traffic_classes: TrafficClassSettings = Field(
        default_factory=TrafficClassSettings, description="Lossless classes and the scheduler "
        "among classes (packet backend; the others carry every class alike).")
    retransmit_timeout_s: Number = Field(
        100e-6, gt=0, description="Retransmission timeout of the reliable transport (go-back-N or "
        "selective repeat) when the fabric is lossy (fixed, no back-off; 1,000 timeouts in a row "
        "without an acknowledgement stop the run with an error).")
    link_disciplines: dict[int, Discipline] = Field(
        default_factory=dict, description="Egress-queue discipline per link index, overriding "
        "ecn.enabled for those links (an explicit topology's per-link `discipline` fills it).")
    sample_interval_s: Number = Field(
        10e-6, gt=0, allow_inf_nan=False, description="Interval of the link-utilization time "
        "series.")
    queue_histogram_bin_bytes: WholeNumber = Field(
        gt=0, description="Width of the queue-occupancy histogram bins, bytes; left out or null: "
        "one MTU.")

    @model_validator(mode="before")
    @classmethod
    def _profile_defaults(cls, data: Any) -> Any:
        if data is None:
            data = {}
        if not isinstance(data, dict):
            return data
        profile = data.get("profile", "roce")
        base = PROFILE_DEFAULTS.get(profile) if isinstance(profile, str) else None
        if base is None:
            return data
        merged = copy.deepcopy(base)
        for key, value in data.items():
            if isinstance(value, dict) and isinstance(merged.get(key), dict):
                merged[key] = {**merged[key], **value}
            else:
                merged[key] = value
        if merged.get("queue_histogram_bin_bytes") is None:
            merged["queue_histogram_bin_bytes"] = merged.get("mtu_bytes")
        return merged

    @model_validator(mode="after")
    def _consistent(self) -> FabricSettings:
        if self.header_bytes >= self.mtu_bytes:
            raise ValueError(f"header_bytes ({self.header_bytes}) must be below mtu_bytes "
                             f"({self.mtu_bytes})")
        if self.pfc.enabled and self.credit.enabled:
            raise ValueError("pfc and credit flow control are alternatives; enable at most one")
        marking = self.ecn.enabled or "ecn" in self.link_disciplines.values()
        if self.dcqcn.enabled and not marking:
            raise ValueError("dcqcn needs ECN marking; enable ecn or disable dcqcn")
        return self

    @property
    def payload_bytes(self) -> int:
        """Payload bytes a full packet carries."""
        return self.mtu_bytes - self.header_bytes

    @property
    def lossless(self) -> bool:
        """True when link-level flow control (PFC or credits) prevents drops."""
        return self.pfc.enabled or self.credit.enabled

    def discipline(self, link_index: int) -> Discipline:
        """The egress-queue discipline of a link: its override, else ECN when marking is on."""
        return self.link_disciplines.get(link_index, "ecn" if self.ecn.enabled else "drop_tail")
