"""The network settings a launch plan lists for a config with a `cluster:` section: NIC line
rate, MTU, ECN marking, PFC, credit flow control and DCQCN as the simulated fabric used them,
one row each with its unit, the device it is set on and the config field it comes from.

Values are the effective ones: a profile's default where the config is silent, ECN thresholds
scaled to the NIC rate, DCQCN's variant parameters scaled to the NIC rate with the config's
overrides. NIC setting names are those of NVIDIA ConnectX firmware's DCQCN reaction point
(`rpg_*`, `rate_reduce_monitor_period`, `dce_tcp_rtt`, ...) and notification point
(`min_time_between_cnps`), the names `simcore.fabric.dcqcn` cites; firmware units differ by
version, so set the value, not the number, the tool of your NIC expects."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from simcore.cluster.config import ClusterConfig

SWITCH, NIC, BOTH = "switch", "NIC", "switch + NIC"


@dataclass(frozen=True)
class FabricRow:
    """One setting to apply to the network: what, its value and unit, where, and from which
    config field."""

    setting: str
    value: str
    unit: str
    applies_to: str
    field: str

    def as_dict(self) -> dict:
        return asdict(self)


def _num(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() else f"{x:,.6g}"


def fabric_rows(c: ClusterConfig) -> list[FabricRow]:
    """The rows for cluster section `c`, in the order they are configured: link, framing, ECN,
    flow control, DCQCN, routing."""
    s = c.fabric.settings
    net = c.network
    nic_bps = net.nic_gbps * 1e9
    f = "cluster.fabric.settings"
    rows = [FabricRow("NIC line rate", _num(net.nic_gbps), "Gb/s", NIC, "cluster.network.nic_gbps"),
            FabricRow("protocol profile", s.profile, "", BOTH, f"{f}.profile"),
            FabricRow("MTU (RDMA path MTU; the Ethernet MTU must carry it plus headers)",
                      _num(s.mtu_bytes), "bytes", BOTH, f"{f}.mtu_bytes"),
            FabricRow("header bytes per packet", _num(s.header_bytes), "bytes", BOTH,
                      f"{f}.header_bytes")]
    if net.num_storage_nodes:
        rows.append(FabricRow("storage server NIC line rate", _num(net.storage_nic_gbps), "Gb/s",
                              NIC, "cluster.network.storage_nic_gbps"))
    topo = net.topology
    buffer = topo.buffer(s.mtu_bytes)
    if buffer is not None:
        rows.append(FabricRow("egress queue capacity per port", _num(buffer), "bytes", SWITCH,
                              "cluster.network.topology.buffer_bytes"))
    rows.append(FabricRow("ECN marking (RED on the instantaneous queue)",
                          "on" if s.ecn.enabled else "off", "", SWITCH, f"{f}.ecn.enabled"))
    if s.ecn.enabled:
        kmin, kmax = s.ecn.thresholds_bytes(nic_bps)
        src = "kmin_bytes" if s.ecn.kmin_bytes is not None else "kmin_bytes_per_25gbps"
        rows.append(FabricRow(f"ECN Kmin at {net.nic_gbps:g} Gb/s ports", _num(kmin), "bytes",
                              SWITCH, f"{f}.ecn.{src}"))
        src = "kmax_bytes" if s.ecn.kmax_bytes is not None else "kmax_bytes_per_25gbps"
        rows.append(FabricRow(f"ECN Kmax at {net.nic_gbps:g} Gb/s ports", _num(kmax), "bytes",
                              SWITCH, f"{f}.ecn.{src}"))
        if s.ecn.kmin_bytes is None or s.ecn.kmax_bytes is None:
            rows.append(FabricRow("ECN Kmin / Kmax per 25 Gb/s (ports of other rates scale "
                                  "linearly)", f"{_num(s.ecn.kmin_bytes_per_25gbps)} / "
                                  f"{_num(s.ecn.kmax_bytes_per_25gbps)}", "bytes", SWITCH,
                                  f"{f}.ecn.kmin_bytes_per_25gbps, kmax_bytes_per_25gbps"))
        rows.append(FabricRow("ECN marking probability at Kmax (Pmax)", _num(s.ecn.pmax), "",
                              SWITCH, f"{f}.ecn.pmax"))
    rows.append(FabricRow("PFC (802.1Qbb)", "on" if s.pfc.enabled else "off", "", BOTH,
                          f"{f}.pfc.enabled"))
    if s.pfc.enabled:
        p = s.pfc
        headroom = p.headroom_for(nic_bps, topo.delay_s, s.mtu_bytes)
        rows += [
            FabricRow("PFC lossless priorities", ",".join(map(str, s.traffic_classes.lossless)),
                      "802.1p classes", BOTH, f"{f}.traffic_classes.lossless"),
            FabricRow("PFC XOFF dynamic threshold alpha (x free shared buffer)", _num(p.alpha),
                      "", SWITCH, f"{f}.pfc.alpha"),
            FabricRow("switch shared buffer", _num(p.shared_buffer_bytes), "bytes", SWITCH,
                      f"{f}.pfc.shared_buffer_bytes"),
            FabricRow(f"PFC headroom per ingress port at {net.nic_gbps:g} Gb/s",
                      _num(round(headroom)), "bytes", SWITCH,
                      f"{f}.pfc.headroom_bytes" if p.headroom_bytes is not None
                      else "cluster.network.topology.delay_s (2 x RTT x rate + 2 MTU)"),
            FabricRow("PFC XON offset below XOFF", _num(p.xon_offset_bytes), "bytes", SWITCH,
                      f"{f}.pfc.xon_offset_bytes"),
            FabricRow("PFC pause time per XOFF", _num(p.pause_quanta), "quanta of 512 bit times",
                      SWITCH, f"{f}.pfc.pause_quanta")]
    if s.credit.enabled:
        rows.append(FabricRow("credit-based link flow control", "on", "", BOTH,
                              f"{f}.credit.enabled"))
        if s.credit.buffer_bytes is not None:
            rows.append(FabricRow("receive buffer advertised per port", _num(
                s.credit.buffer_bytes), "bytes", BOTH, f"{f}.credit.buffer_bytes"))
    if not s.lossless:
        rows.append(FabricRow("retransmission timeout (lossy, go-back-N)",
                              _num(s.retransmit_timeout_s * 1e6), "us", NIC,
                              f"{f}.retransmit_timeout_s"))
    rows.append(FabricRow("DCQCN congestion control", "on" if s.dcqcn.enabled else "off", "",
                          NIC, f"{f}.dcqcn.enabled"))
    if s.dcqcn.enabled:
        rows += _dcqcn_rows(c)
    rows.append(FabricRow("routing", "ECMP (5-tuple hash)" if s.routing == "ecmp"
                          else "adaptive (least-queued next hop)", "", SWITCH, f"{f}.routing"))
    return rows


def _dcqcn_rows(c: ClusterConfig) -> list[FabricRow]:
    d = c.fabric.settings.dcqcn
    p = d.params(c.network.nic_gbps * 1e9)
    f = "cluster.fabric.settings.dcqcn"

    def src(name: str) -> str:
        given = getattr(d, name) is not None
        return f"{f}.{name}" if given else f"{f}.variant ({d.variant}'s value at the NIC rate)"

    byte_counter = ("off" if p.byte_counter_bytes is None else _num(p.byte_counter_bytes))
    return [
        FabricRow("DCQCN variant", d.variant, "", NIC, f"{f}.variant"),
        FabricRow("CNP interval per flow (NP min_time_between_cnps)",
                  _num(d.cnp_interval_s * 1e6), "us", NIC, f"{f}.cnp_interval_s"),
        FabricRow("alpha EWMA gain g", _num(p.g), "", NIC, src("g")),
        FabricRow("alpha update period K (RP dce_tcp_rtt)", _num(p.alpha_timer_s * 1e6), "us",
                  NIC, src("alpha_timer_s")),
        FabricRow("min time between rate cuts (RP rate_reduce_monitor_period)",
                  _num(p.rate_decrease_min_interval_s * 1e6), "us", NIC,
                  src("rate_decrease_min_interval_s")),
        FabricRow("rate-increase timer T (RP rpg_time_reset)", _num(p.increase_timer_s * 1e6),
                  "us", NIC, src("increase_timer_s")),
        FabricRow("byte counter B (RP rpg_byte_reset)", byte_counter,
                  "" if p.byte_counter_bytes is None else "bytes", NIC,
                  src("byte_counter_bytes")),
        FabricRow("fast-recovery steps F (RP rpg_threshold)", _num(p.fast_recovery_steps), "",
                  NIC, src("fast_recovery_steps")),
        FabricRow("additive increase R_AI (RP rpg_ai_rate)", _num(p.rate_ai_bps / 1e6), "Mb/s",
                  NIC, src("rate_ai_gbps")),
        FabricRow("hyper increase R_HAI (RP rpg_hai_rate)", _num(p.rate_hai_bps / 1e6), "Mb/s",
                  NIC, src("rate_hai_gbps")),
        FabricRow("minimum rate (RP rpg_min_rate)", _num(p.min_rate_bps / 1e6), "Mb/s", NIC,
                  src("min_rate_gbps")),
        FabricRow("initial alpha (RP initial_alpha_value, as a fraction)",
                  _num(p.initial_alpha), "", NIC, src("initial_alpha")),
        FabricRow("clamp target rate on every cut (RP clamp_tgt_rate)",
                  "yes" if p.clamp_target_rate_on_cut else "no", "", NIC,
                  src("clamp_target_rate_on_cut")),
    ]


def fabric_caveats(c: ClusterConfig) -> list[str]:
    """What the reader of the table should know about how the simulation used it."""
    out = []
    backend = c.fabric.backend
    if backend != "packet":
        out.append(f"cluster.fabric.backend {backend}: the simulation did not read the ECN, PFC "
                   "and DCQCN rows (only the packet fabric does); they are the profile's values, "
                   "listed so the launch names them, but the simulated result does not rest on "
                   "them")
    if c.tenant_traffic:
        out.append("cluster.tenant_traffic: the simulation added other tenants' traffic to the "
                   "fabric; it is part of the environment, not of the launch")
    return out
