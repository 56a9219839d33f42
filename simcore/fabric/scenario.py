"""A standalone fabric scenario (`dse fabric SCENARIO.yaml`): a topology, fabric settings and
traffic, validated at the edge and expanded into the messages a backend is sent."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import numpy as np
from pydantic import Field, ValidationError, field_validator, model_validator

from simcore.errors import (ConfigError, Number, WholeNumber, away_from_default,
                            format_validation_error)
from simcore.fabric import topology as topo
from simcore.fabric.settings import (MAX_DELAY_S, MAX_RATE_GBPS, MAX_TIME_S, MIN_RATE_GBPS,
                                     OVERSUBSCRIPTION_RANGE, Bytes, Discipline, FabricSettings,
                                     Oversubscription, _Buffered, _Frozen)
from simcore.fabric.topology import HOST, Topology, check_rates, check_size

MAX_MESSAGES = 2_000_000
"""Most messages one scenario may expand to (a CBR or Poisson source over a long time is the usual
way to hit it); beyond it the run would not fit in memory or time."""

_Rate = Annotated[Number, Field(le=MAX_RATE_GBPS)]
_LinkRate = Annotated[Number, Field(ge=MIN_RATE_GBPS, le=MAX_RATE_GBPS)]
"""A link's rate (a source's may be slower)."""
_Time = Annotated[Number, Field(le=MAX_TIME_S)]
_Delay = Annotated[Number, Field(le=MAX_DELAY_S)]


class DumbbellTopology(_Buffered):
    """Left hosts -- switch L == bottleneck == switch R -- right hosts (hosts L0.., R0..)."""

    kind: Literal["dumbbell"] = Field(description="Topology variant tag.")
    num_left: WholeNumber = Field(ge=1, description="Hosts on the left switch.")
    num_right: WholeNumber = Field(ge=1, description="Hosts on the right switch.")
    rate_gbps: _LinkRate = Field(description="Host link rate, Gb/s.")
    delay_s: _Delay = Field(gt=0, description="Propagation delay of every link, seconds.")
    bottleneck_rate_gbps: _LinkRate | None = Field(None, description="Rate of the switch-to-"
                                                   "switch link, Gb/s; default rate_gbps.")


class StarTopology(_Buffered):
    """Hosts h0.. on one switch (the incast topology)."""

    kind: Literal["star"] = Field(description="Topology variant tag.")
    num_hosts: WholeNumber = Field(ge=2, description="Hosts on the switch.")
    rate_gbps: _LinkRate = Field(description="Link rate, Gb/s.")
    delay_s: _Delay = Field(gt=0, description="Propagation delay of every link, seconds.")


class LeafSpineTopology(_Buffered):
    """2-tier Clos: every leaf connects to every spine; hosts h0.. in leaf order."""

    kind: Literal["leaf_spine"] = Field(description="Topology variant tag.")
    num_leaves: WholeNumber = Field(ge=1, description="Leaf (ToR) switches.")
    hosts_per_leaf: WholeNumber = Field(ge=1, description="Hosts under each leaf.")
    num_spines: WholeNumber = Field(ge=1, description="Spine switches.")
    host_rate_gbps: _LinkRate = Field(description="Host link rate, Gb/s.")
    delay_s: _Delay = Field(gt=0, description="Propagation delay of every link, seconds.")
    oversubscription: Oversubscription = Field(
        1.0, description="Host bandwidth over uplink bandwidth per leaf "
        f"({OVERSUBSCRIPTION_RANGE}); sets the uplink rate unless spine_rate_gbps does.")
    spine_rate_gbps: _LinkRate | None = Field(None, description="Rate of each leaf-spine link, "
                                              "Gb/s; default from oversubscription.")

    @model_validator(mode="after")
    def _one_uplink_rate(self) -> LeafSpineTopology:
        if self.spine_rate_gbps is not None and away_from_default(self, "oversubscription"):
            raise ValueError("oversubscription has no effect beside spine_rate_gbps, which sets "
                             "the leaf-spine links' rate; give one of them")
        return self


class FatTreeTopology(_Buffered):
    """3-tier k-ary fat-tree: k^3/4 hosts h0.., full bisection bandwidth."""

    kind: Literal["fat_tree"] = Field(description="Topology variant tag.")
    k: WholeNumber = Field(
        ge=2, description="Switch radix (even): k pods of k/2 edge and k/2 aggregation switches, "
        "(k/2)^2 cores.")
    rate_gbps: _LinkRate = Field(description="Rate of every link, Gb/s.")
    delay_s: _Delay = Field(gt=0, description="Propagation delay of every link, seconds.")


class RailOptimizedTopology(_Buffered):
    """GPU i of every node on rail switch i, GPUs of a node on one NVSwitch (hosts n{node}g{gpu});
    cross-rail traffic relays over NVLink (PXN) unless spines join the rails."""

    kind: Literal["rail_optimized"] = Field(description="Topology variant tag.")
    num_nodes: WholeNumber = Field(ge=1, description="Servers.")
    gpus_per_node: WholeNumber = Field(ge=1, description="GPUs (and rails) per server.")
    nic_rate_gbps: _LinkRate = Field(description="NIC link rate per GPU, Gb/s.")
    nvlink_rate_gbps: _LinkRate = Field(description="NVLink rate per GPU, Gb/s.")
    delay_s: _Delay = Field(gt=0, description="Propagation delay of NIC and spine links, seconds.")
    nvlink_delay_s: _Delay = Field(1e-6, gt=0, description="Latency of an NVLink hop, seconds.")
    num_spines: WholeNumber = Field(
        0, ge=0, description="Spines joining the rail switches; 0: none.")
    oversubscription: Oversubscription = Field(1.0, description="Rail-to-spine "
                                               f"oversubscription ({OVERSUBSCRIPTION_RANGE}).")
    pcie_rate_gbps: _LinkRate | None = Field(None, description="If set, each GPU reaches its "
                                             "NIC over a PCIe link of this rate, Gb/s.")
    pcie_delay_s: _Delay = Field(1e-6, gt=0, description="Latency of the PCIe hop, seconds.")

    @model_validator(mode="after")
    def _read(self) -> RailOptimizedTopology:
        if self.num_spines == 0 and away_from_default(self, "oversubscription"):
            raise ValueError("oversubscription has no effect without spines (num_spines 0): it "
                             "sets the rail-to-spine links' rate; remove it")
        if self.pcie_rate_gbps is None and away_from_default(self, "pcie_delay_s"):
            raise ValueError("pcie_delay_s has no effect without pcie_rate_gbps (no PCIe hop "
                             "between a GPU and its NIC); remove it, or set pcie_rate_gbps")
        return self


class ExplicitNode(_Frozen):
    """One node of an explicit topology."""

    name: str = Field(min_length=1, description="Unique name, used by links and traffic.")
    kind: Literal["host", "switch"] = Field(description="host: sends and receives; switch: "
                                            "forwards.")


class ExplicitLink(_Buffered):
    """One cable of an explicit topology: a link in each direction with the same settings."""

    a: str = Field(description="Name of one end.")
    b: str = Field(description="Name of the other end.")
    rate_gbps: _LinkRate = Field(description="Rate of each direction, Gb/s.")
    delay_s: _Delay = Field(gt=0, description="Propagation delay, seconds.")
    kind: str = Field("fabric", description="Medium label for reports (fabric, nvlink, pcie...).")
    discipline: Literal["default", "drop_tail", "ecn"] = Field(
        "default", description="Egress-queue discipline at both ends: drop_tail, ecn (RED/ECN "
        "marking), or default (ecn when settings.ecn.enabled).")

    @model_validator(mode="after")
    def _two_ends(self) -> ExplicitLink:
        if self.a == self.b:
            raise ValueError(f"a and b are both {self.a!r}: a cable joins two nodes")
        return self


class ExplicitTopology(_Frozen):
    """Nodes and cables given one by one."""

    kind: Literal["explicit"] = Field(description="Topology variant tag.")
    nodes: list[ExplicitNode] = Field(min_length=2, description="Hosts and switches.")
    links: list[ExplicitLink] = Field(min_length=1, description="Cables between named nodes.")


TopologySpec = Annotated[Union[DumbbellTopology, StarTopology, LeafSpineTopology,
                               FatTreeTopology, RailOptimizedTopology, ExplicitTopology],
                         Field(discriminator="kind")]

HostSet = Union[Literal["all"], list[str]]


Transport = Literal["go_back_n", "selective_repeat", "datagram"]

_RESENT = ("How lost packets are resent where its class may drop (no PFC or credits, or a class "
           "outside traffic_classes.lossless): go_back_n (from the first lost packet on) or "
           "selective_repeat (only the lost ones)")


class _Traffic(_Frozen):
    """Fields every traffic entry has."""

    traffic_class: WholeNumber = Field(
        0, ge=0, le=7, description="Priority (traffic class, InfiniBand virtual lane) its packets "
        "travel in; the packet backend only.")
    transport: Transport = Field("go_back_n", description=_RESENT + "; the packet backend only "
                                 "(the others lose nothing). datagram is for cbr and poisson "
                                 "sources.")

    @field_validator("transport")
    @classmethod
    def _datagrams_from_sources(cls, value: str) -> str:
        if value == "datagram" and not issubclass(cls, _Source):
            raise ValueError("datagram is for cbr and poisson sources (one-packet datagrams); "
                             "use go_back_n or selective_repeat")
        return value


class _Source(_Traffic):
    """Fields of a packet source (CBR, Poisson), whose packets may also travel as unreliable
    datagrams: the packet backend hands each to its NIC at its time, sends it once and never
    acknowledges it; one that a full queue drops is lost, and reported so."""

    transport: Transport = Field("go_back_n", description=_RESENT + "; or datagram: unreliable, "
                                 "like UDP or InfiniBand UD: each packet sent once, at the "
                                 "source's times, with no ACKs, retransmission or congestion "
                                 "control, a dropped one lost. The packet backend only: flow and "
                                 "analytical carry every datagram as a one-packet message and "
                                 "lose none.")


class MessageTraffic(_Traffic):
    """One message."""

    kind: Literal["message"] = Field(description="Traffic variant tag.")
    src: str = Field(description="Sending host.")
    dst: str = Field(description="Receiving host.")
    size_bytes: Bytes = Field(ge=0, description="Payload bytes.")
    at_s: _Time = Field(0.0, ge=0, description="When it is handed to the sender's NIC, seconds.")


class CbrTraffic(_Source):
    """A constant-bit-rate source: one-packet messages (or datagrams) of payload_bytes, evenly
    spaced so the packets (headers included) occupy rate_gbps, from start_s until before
    stop_s."""

    kind: Literal["cbr"] = Field(description="Traffic variant tag.")
    src: str = Field(description="Sending host.")
    dst: str = Field(description="Receiving host.")
    rate_gbps: _Rate = Field(gt=0, description="On-wire rate of the packet train (payload + "
                             "headers), Gb/s.")
    payload_bytes: Bytes = Field(gt=0, description="Payload per packet; at most mtu_bytes - "
                                 "header_bytes.")
    start_s: _Time = Field(0.0, ge=0, description="First packet, seconds.")
    stop_s: _Time = Field(gt=0, description="No packet at or after this time, seconds.")

    @model_validator(mode="after")
    def _window(self) -> CbrTraffic:
        if self.stop_s <= self.start_s:
            raise ValueError(f"stop_s ({self.stop_s}) must be after start_s ({self.start_s})")
        return self


class AllToAllTraffic(_Traffic):
    """Every host of the set sends size_bytes to every other, all at at_s."""

    kind: Literal["all_to_all"] = Field(description="Traffic variant tag.")
    hosts: HostSet = Field("all", description="Participating hosts, or all.")
    size_bytes: Bytes = Field(ge=0, description="Payload bytes per ordered pair.")
    at_s: _Time = Field(0.0, ge=0, description="Start time, seconds.")


class IncastTraffic(_Traffic):
    """N senders each send size_bytes to one receiver at at_s."""

    kind: Literal["incast"] = Field(description="Traffic variant tag.")
    senders: HostSet = Field("all", description="Sending hosts, or all (every host but the "
                             "receiver).")
    receiver: str = Field(description="The receiving host.")
    size_bytes: Bytes = Field(ge=0, description="Payload bytes per sender.")
    at_s: _Time = Field(0.0, ge=0, description="Start time, seconds.")


class PermutationTraffic(_Traffic):
    """Each host of the set sends size_bytes to another, a random derangement drawn from the
    scenario seed (no host sends to itself, every host receives once)."""

    kind: Literal["permutation"] = Field(description="Traffic variant tag.")
    hosts: HostSet = Field("all", description="Participating hosts, or all.")
    size_bytes: Bytes = Field(ge=0, description="Payload bytes per sender.")
    at_s: _Time = Field(0.0, ge=0, description="Start time, seconds.")


class PoissonTraffic(_Source):
    """A Poisson packet source: one-packet messages (or datagrams) of payload_bytes with
    exponential gaps of mean 1 / rate_pps, from start_s for duration_s (drawn from the scenario
    seed)."""

    kind: Literal["poisson"] = Field(description="Traffic variant tag.")
    src: str = Field(description="Sending host.")
    dst: str = Field(description="Receiving host.")
    rate_pps: Number = Field(gt=0, description="Mean packets per second.")
    payload_bytes: Bytes = Field(gt=0, description="Payload per packet; at most mtu_bytes - "
                                 "header_bytes.")
    start_s: _Time = Field(0.0, ge=0, description="When the source starts, seconds.")
    duration_s: _Time = Field(gt=0, description="How long it sends, seconds.")


TrafficSpec = Annotated[Union[MessageTraffic, CbrTraffic, AllToAllTraffic, IncastTraffic,
                              PermutationTraffic, PoissonTraffic], Field(discriminator="kind")]


class Scenario(_Frozen):
    """A whole `dse fabric` input: which network, with which settings, under what traffic."""

    name: str = Field("fabric scenario", description="A label carried into the results.")
    seed: WholeNumber = Field(
        0, ge=0, description="Seed of every random choice (ECMP salts, permutations, Poisson "
        "gaps, ECN marking); same seed, same result.")
    backend: Literal["packet", "flow", "analytical"] = Field(
        "packet", description="Backend used unless the command line picks one: packet (queues, "
        "ECN, PFC, DCQCN), flow (max-min fair sharing) or analytical (messages serialised "
        "first come, first served on shared links).")
    duration_s: _Time | None = Field(None, gt=0, description="Stop the run at this time; "
                                     "messages still in flight are reported as such. Default: "
                                     "run until every message is delivered.")
    topology: TopologySpec = Field(description="The network: a builder and its parameters, or "
                                   "explicit nodes and links.")
    settings: FabricSettings = Field(default_factory=FabricSettings, description="Profile and "
                                     "overrides: framing, ECN, PFC, credits, DCQCN, routing, "
                                     "measurement.")
    traffic: list[TrafficSpec] = Field(min_length=1, description="What the hosts send.")

    @model_validator(mode="before")
    @classmethod
    def _settings_present(cls, data: Any) -> Any:
        # An empty `settings:` in YAML reads as null: take it as "the profile's defaults".
        if isinstance(data, dict) and "settings" in data and data["settings"] is None:
            data = {**data, "settings": {}}
        return data


@dataclass(frozen=True, slots=True)
class PlannedMessage:
    """One message a scenario sends: `flow_key` picks its ECMP path (and, in the packet backend,
    its queue pair); the messages of one CBR or Poisson source share it. `item` is the index of
    the traffic entry it came from, `traffic_class` and `transport` that entry's."""

    src: int
    dst: int
    size_bytes: int
    at_s: float
    flow_key: int
    item: int
    traffic_class: int = 0
    transport: str = "go_back_n"


def load_scenario(source: str | Path | Mapping[str, Any] | Scenario, *,
                  name: str | None = None) -> Scenario:
    """A validated Scenario from a YAML file, a mapping or a Scenario; bad input raises
    ConfigError with one sentence naming the file and field."""
    from simcore.loading import load_yaml

    if isinstance(source, Scenario):
        return source
    if isinstance(source, Mapping):
        data, where = dict(source), name or "scenario"
    else:
        data, where = load_yaml(source), name or str(source)
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: the top level must be a mapping with topology, settings "
                          f"and traffic")
    try:
        return Scenario.model_validate(data)
    except ValidationError as err:
        raise ConfigError(f"{where}: {format_validation_error(err, Scenario)}") from None


def topology_size(spec) -> tuple[int, int]:
    """(nodes, cables) the topology `spec` builds: hosts and switches, and bidirectional
    cables."""
    match spec:
        case DumbbellTopology():
            return spec.num_left + spec.num_right + 2, spec.num_left + spec.num_right + 1
        case StarTopology():
            return spec.num_hosts + 1, spec.num_hosts
        case LeafSpineTopology():
            return (spec.num_spines + spec.num_leaves * (1 + spec.hosts_per_leaf),
                    spec.num_leaves * (spec.hosts_per_leaf + spec.num_spines))
        case FatTreeTopology():
            return topo.fat_tree_size(spec.k)
        case RailOptimizedTopology():
            per_gpu = 2 if spec.pcie_rate_gbps else 1
            gpus = spec.num_nodes * spec.gpus_per_node
            return (spec.gpus_per_node + spec.num_nodes + per_gpu * gpus + spec.num_spines,
                    (1 + per_gpu) * gpus + spec.gpus_per_node * spec.num_spines)
        case ExplicitTopology():
            return len(spec.nodes), len(spec.links)
    raise AssertionError(f"unhandled topology kind {spec.kind}")


def build_topology(scenario: Scenario, *, where: str = "scenario") -> Topology:
    """The scenario's Topology, framed with the settings' MTU and header size; one past
    `simcore.fabric.topology.MAX_NODES` nodes or `MAX_CABLES` cables is refused before it is
    built."""
    spec, s = scenario.topology, scenario.settings
    check_size(*topology_size(spec), f"{where}: topology: the {spec.kind}")
    built = _build(spec, s, where)
    check_rates(built, f"{where}: topology: its {spec.kind} builder")
    return built


def _build(spec, s: FabricSettings, where: str) -> Topology:
    frame = {"mtu_bytes": s.mtu_bytes, "header_bytes": s.header_bytes}
    gbps = 1e9
    try:
        match spec:
            case DumbbellTopology():
                bottleneck = spec.bottleneck_rate_gbps
                return topo.dumbbell(spec.num_left, spec.num_right, rate_bps=spec.rate_gbps * gbps,
                                     delay_s=spec.delay_s,
                                     bottleneck_rate_bps=bottleneck * gbps if bottleneck else None,
                                     buffer_bytes=spec.buffer(s.mtu_bytes), **frame)
            case StarTopology():
                return topo.star(spec.num_hosts, rate_bps=spec.rate_gbps * gbps,
                                 delay_s=spec.delay_s, buffer_bytes=spec.buffer(s.mtu_bytes),
                                 **frame)
            case LeafSpineTopology():
                spine = spec.spine_rate_gbps
                return topo.leaf_spine(spec.num_leaves, spec.hosts_per_leaf, spec.num_spines,
                                       host_rate_bps=spec.host_rate_gbps * gbps,
                                       delay_s=spec.delay_s,
                                       oversubscription=spec.oversubscription,
                                       spine_rate_bps=spine * gbps if spine else None,
                                       buffer_bytes=spec.buffer(s.mtu_bytes), **frame)
            case FatTreeTopology():
                return topo.fat_tree(spec.k, rate_bps=spec.rate_gbps * gbps, delay_s=spec.delay_s,
                                     buffer_bytes=spec.buffer(s.mtu_bytes), **frame)
            case RailOptimizedTopology():
                return topo.rail_optimized(spec.num_nodes, spec.gpus_per_node,
                                           nic_rate_bps=spec.nic_rate_gbps * gbps,
                                           nvlink_rate_bps=spec.nvlink_rate_gbps * gbps,
                                           delay_s=spec.delay_s,
                                           nvlink_delay_s=spec.nvlink_delay_s,
                                           num_spines=spec.num_spines,
                                           oversubscription=spec.oversubscription,
                                           pcie_rate_bps=(spec.pcie_rate_gbps * gbps
                                                          if spec.pcie_rate_gbps else None),
                                           pcie_delay_s=spec.pcie_delay_s,
                                           buffer_bytes=spec.buffer(s.mtu_bytes), **frame)
            case ExplicitTopology():
                cables = [{"a": c.a, "b": c.b, "rate_bps": c.rate_gbps * gbps,
                           "delay_s": c.delay_s, "buffer_bytes": c.buffer(s.mtu_bytes),
                           "kind": c.kind} for c in spec.links]
                return topo.explicit([(n.name, n.kind) for n in spec.nodes], cables, **frame)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    raise AssertionError(f"unhandled topology kind {spec.kind}")


def resolved_settings(scenario: Scenario, topology: Topology) -> FabricSettings:
    """The scenario's settings with an explicit topology's per-link disciplines filled in; a
    link index of settings.link_disciplines the topology does not have is refused."""
    num_links = len(topology.links)
    for li in scenario.settings.link_disciplines:
        if not 0 <= li < num_links:
            raise ConfigError(f"settings.link_disciplines: no link {li} (the topology's links "
                              f"are 0 to {num_links - 1})")
    spec = scenario.topology
    if not isinstance(spec, ExplicitTopology):
        return scenario.settings
    disciplines: dict[int, Discipline] = dict(scenario.settings.link_disciplines)
    for i, cable in enumerate(spec.links):
        if cable.discipline == "default":
            continue
        # The builder lays each cable down as links 2i (a -> b) and 2i + 1 (b -> a).
        ends = {topology.nodes[topology.links[li].src].name for li in (2 * i, 2 * i + 1)}
        assert ends == {cable.a, cable.b}, "explicit cables and links are out of step"
        for li in (2 * i, 2 * i + 1):
            disciplines[li] = cable.discipline
    return scenario.settings.model_copy(update={"link_disciplines": disciplines})


class _Hosts:
    """Host names of a topology, resolved with errors that name the traffic field."""

    def __init__(self, topology: Topology, where: str) -> None:
        self.topology = topology
        self.where = where
        self.index = {nd.name: nd.index for nd in topology.nodes}
        self.all = topology.hosts

    def one(self, name: str, field: str) -> int:
        i = self.index.get(name)
        if i is None:
            names = [self.topology.nodes[h].name for h in self.all]
            shown = ", ".join(names[:4]) + (f", ... {names[-1]}" if len(names) > 4 else "")
            raise ConfigError(f"{self.where}.{field}: no host named {name!r} (hosts: {shown})")
        if self.topology.nodes[i].kind != HOST:
            raise ConfigError(f"{self.where}.{field}: {name!r} is a switch, not a host")
        return i

    def many(self, names: Literal["all"] | list[str], field: str) -> list[int]:
        if names == "all":
            return list(self.all)
        out = [self.one(n, f"{field}[{k}]") for k, n in enumerate(names)]
        if len(set(out)) != len(out):
            raise ConfigError(f"{self.where}.{field}: a host is listed twice")
        return out


def _one_packet(payload_bytes: int, topology: Topology, where: str) -> None:
    limit = topology.mtu_bytes - topology.header_bytes
    if payload_bytes > limit:
        raise ConfigError(f"{where}.payload_bytes: {payload_bytes} does not fit one packet (at "
                          f"most mtu_bytes - header_bytes = {limit})")


def expand_traffic(scenario: Scenario, topology: Topology, *,
                   where: str = "scenario") -> list[PlannedMessage]:
    """Every message the scenario sends, ordered by send time (then traffic entry, then order
    within it); a message's position is the id backends give it."""
    raw: list[tuple[float, int, int, int, int, int]] = []   # at, item, seq, src, dst, size
    trains: set[int] = set()
    for i, item in enumerate(scenario.traffic):
        hosts = _Hosts(topology, f"{where}: traffic[{i}]")
        rng = np.random.default_rng([scenario.seed, i])
        pairs: list[tuple[float, int, int, int]] = []     # at, src, dst, size
        match item:
            case MessageTraffic():
                src, dst = hosts.one(item.src, "src"), hosts.one(item.dst, "dst")
                if src == dst:
                    raise ConfigError(f"{hosts.where}.dst: must differ from src")
                pairs.append((item.at_s, src, dst, item.size_bytes))
            case CbrTraffic() | PoissonTraffic():
                src, dst = hosts.one(item.src, "src"), hosts.one(item.dst, "dst")
                if src == dst:
                    raise ConfigError(f"{hosts.where}.dst: must differ from src")
                _one_packet(item.payload_bytes, topology, hosts.where)
                if isinstance(item, CbrTraffic):
                    times = _cbr_times(item, topology, hosts.where)
                else:
                    times = _poisson_times(item, rng, hosts.where)
                pairs.extend((float(t), src, dst, item.payload_bytes) for t in times)
                trains.add(i)
            case AllToAllTraffic():
                members = hosts.many(item.hosts, "hosts")
                if len(members) < 2:
                    raise ConfigError(f"{hosts.where}.hosts: an all-to-all needs two hosts")
                if len(raw) + len(members) * (len(members) - 1) > MAX_MESSAGES:
                    raise ConfigError(f"{where}: traffic[{i}]: an all-to-all of {len(members):,} "
                                      f"hosts is {len(members) * (len(members) - 1):,} "
                                      f"messages, more than the {MAX_MESSAGES:,} a scenario may "
                                      f"send")
                pairs.extend((item.at_s, s, d, item.size_bytes)
                             for s in members for d in members if s != d)
            case IncastTraffic():
                receiver = hosts.one(item.receiver, "receiver")
                senders = hosts.many(item.senders, "senders")
                if item.senders == "all":
                    senders = [h for h in senders if h != receiver]
                elif receiver in senders:
                    raise ConfigError(f"{hosts.where}.senders: the receiver cannot be a sender")
                if not senders:
                    raise ConfigError(f"{hosts.where}.senders: an incast needs a sender")
                pairs.extend((item.at_s, s, receiver, item.size_bytes) for s in senders)
            case PermutationTraffic():
                members = hosts.many(item.hosts, "hosts")
                if len(members) < 2:
                    raise ConfigError(f"{hosts.where}.hosts: a permutation needs two hosts")
                perm = _derangement(len(members), rng)
                pairs.extend((item.at_s, members[k], members[int(perm[k])], item.size_bytes)
                             for k in range(len(members)))
        if len(raw) + len(pairs) > MAX_MESSAGES:
            raise ConfigError(f"{where}: traffic[{i}]: the scenario expands to more than "
                              f"{MAX_MESSAGES:,} messages; shorten it or lower its rate")
        raw.extend((at, i, seq, s, d, size) for seq, (at, s, d, size) in enumerate(pairs))
    raw.sort(key=lambda r: (r[0], r[1], r[2]))
    first_of_train: dict[int, int] = {}
    out = []
    for k, (at, i, _, s, d, size) in enumerate(raw):
        key = first_of_train.setdefault(i, k) if i in trains else k
        entry = scenario.traffic[i]
        out.append(PlannedMessage(s, d, size, at, key, i, entry.traffic_class, entry.transport))
    return out


def _cbr_times(item: CbrTraffic, topology: Topology, where: str) -> np.ndarray:
    packet_bits = (item.payload_bytes + topology.header_bytes) * 8
    gap = packet_bits / (item.rate_gbps * 1e9)
    count = math.ceil((item.stop_s - item.start_s) / gap)
    if count > MAX_MESSAGES:
        raise ConfigError(f"{where}: the source sends {count:,} packets, more than "
                          f"{MAX_MESSAGES:,}; shorten it or lower its rate")
    times = item.start_s + np.arange(count) * gap
    return times[times < item.stop_s]


def _poisson_times(item: PoissonTraffic, rng: np.random.Generator, where: str) -> np.ndarray:
    expected = item.rate_pps * item.duration_s
    if expected > MAX_MESSAGES:
        raise ConfigError(f"{where}: the source sends about {expected:,.0f} packets, more than "
                          f"{MAX_MESSAGES:,}; shorten it or lower its rate")
    chunks = []
    t = item.start_s
    end = item.start_s + item.duration_s
    batch = max(16, int(expected * 1.1) + 16)
    while t < end:
        arrivals = t + np.cumsum(rng.exponential(1.0 / item.rate_pps, batch))
        chunks.append(arrivals)
        t = float(arrivals[-1])
    times = np.concatenate(chunks)
    return times[times < end]


def _derangement(n: int, rng: np.random.Generator) -> np.ndarray:
    """A uniformly random permutation with no fixed point (rejection; about e draws)."""
    while True:
        perm = rng.permutation(n)
        if not np.any(perm == np.arange(n)):
            return perm
