"""Which fabric settings each backend reads, so a run can say which of its settings had no effect.

The packet backend reads every field of `FabricSettings` (`simcore.fabric.packet.profiles.resolve`
turns them into per-port numbers; `PacketFabric` runs DCQCN and the traffic classes) and the
egress buffers of the topology. The flow backend (max-min fair sharing of link rates) and the
analytical backend (messages serialised first come, first served on each link) read only the
packet framing, through the `Topology`, and the utilization sample interval: they have no
queues, so marking, flow control, congestion control, adaptive routing, retransmission and buffer
sizes cannot change their results. No setting is read by the flow backend alone.

`MODEL` says in words what each backend computes and what it leaves out; fabric scenario results
(`simcore.fabric.run`) and cluster results (`simcore.cluster.config`) state it.
"""

from __future__ import annotations

from pydantic import BaseModel

from simcore.fabric.settings import FabricSettings

PACKET_ONLY_SETTINGS = ("routing", "ecn", "pfc", "credit", "dcqcn", "traffic_classes",
                        "retransmit_timeout_s", "link_disciplines", "queue_histogram_bin_bytes")
"""Fields of FabricSettings that only the packet backend reads."""

PACKET_ONLY_TOPOLOGY = ("buffer_bytes", "buffer_packets", "discipline")
"""Fields of a topology (or an explicit cable) that only the packet backend reads: egress-queue
capacity and queue discipline."""

BACKENDS = ("packet", "flow", "analytical")

MODEL = {
    "analytical": "messages serialised first come, first served on each link of their paths, "
                  "each link on its own (ignored: queueing dynamics beyond that serialisation, "
                  "fair sharing, congestion control, losses, buffers, ECN, PFC, DCQCN, adaptive "
                  "routing and traffic classes, which the packet backend reads)",
    "flow": "max-min fair sharing of link rates (ignored: queues, buffers, losses, ECN, PFC, "
            "DCQCN, adaptive routing and traffic classes, which the packet backend reads)",
    "packet": "packets through switch queues with the profile's marking, flow control, "
              "congestion control and routing",
}
"""What each backend computes and what it ignores, in words."""


def backends_ignoring(path: str) -> tuple[str, ...]:
    """The backends that do not read the setting at `path`, a dotted path inside FabricSettings
    (e.g. "dcqcn.cnp_interval_s"); () for a setting every backend reads, such as the framing."""
    head = path.split(".", 1)[0]
    return ("flow", "analytical") if head in PACKET_ONLY_SETTINGS else ()


def changed_settings(settings: FabricSettings) -> list[str]:
    """Dotted paths of the fields of `settings` whose value differs from its profile's default,
    leaf by leaf (a nested section is listed by the fields changed inside it)."""
    # The histogram's bin width defaults to one MTU, whatever the MTU is.
    default = FabricSettings(profile=settings.profile).model_copy(
        update={"queue_histogram_bin_bytes": settings.mtu_bytes})
    out: list[str] = []
    _diff(settings, default, "", out)
    return out


def _diff(value: BaseModel, default: BaseModel, prefix: str, out: list[str]) -> None:
    for name in type(value).model_fields:
        a, b = getattr(value, name), getattr(default, name)
        if isinstance(a, BaseModel) and type(a) is type(b):
            _diff(a, b, f"{prefix}{name}.", out)
        elif a != b:
            out.append(prefix + name)


FEATURES = ("ecn", "pfc", "credit", "dcqcn")
"""The sections of the fabric settings switched by their `enabled` field."""


def off_feature_settings(settings: FabricSettings) -> list[str]:
    """The settings set away from their profile's defaults that no backend reads here: inside
    a feature switched off (ecn, pfc, credit or dcqcn with enabled false), and the
    retransmission timeout on a fabric that never drops (credits, or PFC over every traffic
    class). Dotted paths inside FabricSettings, in field order."""
    never_drops = settings.credit.enabled or (settings.pfc.enabled
                                              and len(set(settings.traffic_classes.lossless)) == 8)
    out = []
    for p in changed_settings(settings):
        head, _, rest = p.partition(".")
        if head in FEATURES and rest and rest != "enabled" and not getattr(settings, head).enabled:
            out.append(p)
        elif p == "retransmit_timeout_s" and never_drops:
            out.append(p)
    return out


def unread_settings(backend: str, settings: FabricSettings) -> list[str]:
    """The settings set away from their profile's defaults that `backend` does not read, as
    dotted paths inside FabricSettings, in field order."""
    return [p for p in changed_settings(settings) if backend in backends_ignoring(p)]


def unread_topology(backend: str, topology: BaseModel) -> list[str]:
    """The fields of a topology spec that are set and that `backend` does not read (its buffer
    sizes on the flow and analytical backends), as names of that spec."""
    if backend == "packet":
        return []
    return [name for name in PACKET_ONLY_TOPOLOGY
            if name in type(topology).model_fields
            and getattr(topology, name) not in (None, "default")]
