"""Running a fabric scenario on a chosen backend and gathering its measurements into one JSON-able
result: flow completion times and slowdowns, link utilization, queue occupancy, congestion
signals (ECN, CNPs, DCQCN cuts, PFC), losses, and the byte-conservation check."""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from simcore.errors import ConfigError
from simcore.fabric.fidelity import (BACKENDS, MODEL, off_feature_settings, unread_settings,
                                     unread_topology)
from simcore.fabric.messages import num_packets
from simcore.fabric.protocol import Fabric, FabricStats, MessageResult
from simcore.fabric.scenario import (PlannedMessage, Scenario, build_topology, expand_traffic,
                                     load_scenario, resolved_settings)
from simcore.fabric.settings import FabricSettings
from simcore.fabric.topology import HOST, Topology

PERCENTILES = (50, 90, 99)
MAX_SERIES_POINTS = 200
"""Utilization time series are averaged down to at most this many points per link."""
MAX_PACKETS = 100_000_000
"""Most packets a scenario's messages may be cut into for the packet backend, which simulates
each one (about a million a CPU second on a dumbbell, so some minutes), unless the scenario stops
the run at a `duration_s`."""
MAX_LISTED_MESSAGES = 10_000
"""Per-message records are listed when there are at most this many (unless asked otherwise)."""


def make_fabric(backend: str, topology: Topology, settings: FabricSettings, *,
                seed: int, compiled: bool = False) -> Fabric:
    """Build a backend by name; every backend takes (topology, settings, *, seed). `compiled`:
    the analytical backend's compiled form where numba is installed, which also runs step DAGs
    (`simcore.fabric.analytical_compiled`; the same results)."""
    match backend:
        case "analytical":
            from simcore.compiled import import_numba
            if compiled and import_numba() is not None:
                from simcore.fabric.analytical_compiled import CompiledAnalyticalFabric
                return CompiledAnalyticalFabric(topology, settings, seed=seed)
            from simcore.fabric.analytical import AnalyticalFabric
            return AnalyticalFabric(topology, settings, seed=seed)
        case "flow":
            from simcore.fabric.flow import FlowFabric
            return FlowFabric(topology, settings, seed=seed)
        case "packet":
            if importlib.util.find_spec("simcore.fabric.packet") is None:
                raise ConfigError("backend: the packet backend is not available; use flow or "
                                  "analytical")
            from simcore.fabric import packet
            cls = getattr(packet, "PacketFabric", None)
            if cls is None:
                raise ConfigError("backend: the packet backend is not available; use flow or "
                                  "analytical")
            return cls(topology, settings, seed=seed)
    raise ConfigError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")


def run_scenario(scenario: str | Path | Mapping[str, Any] | Scenario, backend: str | None = None,
                 *, seed: int | None = None, include_messages: bool | None = None,
                 check_conservation: bool = True) -> dict[str, Any]:
    """Build the scenario's topology and backend, send its traffic, run it and measure.

    `backend` (packet, flow, analytical) overrides the scenario's; `seed` overrides its seed.
    `include_messages`: list every message (default: when there are at most 10,000). Raises
    ConfigError for bad input and AssertionError if bytes are not conserved (a backend bug).
    """
    where = str(scenario) if isinstance(scenario, (str, Path)) else "scenario"
    sc = load_scenario(scenario)
    if seed is not None:
        if seed < 0:
            raise ConfigError(f"--seed must be a non-negative integer, got {seed}")
        sc = sc.model_copy(update={"seed": seed})
    name = backend or sc.backend
    if name not in BACKENDS:
        raise ConfigError(f"backend must be one of {', '.join(BACKENDS)}, got {name!r}")
    topology = build_topology(sc, where=where)
    settings = resolved_settings(sc, topology)
    planned = expand_traffic(sc, topology, where=where)
    if name == "packet" and sc.duration_s is None:
        payload = topology.mtu_bytes - topology.header_bytes
        packets = sum(num_packets(m.size_bytes, topology.mtu_bytes, topology.header_bytes)
                      for m in planned)
        if packets > MAX_PACKETS:
            raise ConfigError(
                f"{where}: traffic: the packet backend simulates every packet, and these "
                f"messages are {packets:,} packets of {payload} payload bytes, past the "
                f"{MAX_PACKETS:,} it takes (some minutes); use the flow or analytical backend, "
                f"send less, or stop the run at a duration_s")
    fabric = make_fabric(name, topology, settings, seed=sc.seed)
    for msg in planned:
        # Only the packet backend loses packets, so only it tells the transports apart.
        transport = ({"transport": msg.transport}
                     if name == "packet" and msg.transport != "go_back_n" else {})
        fabric.send(msg.src, msg.dst, msg.size_bytes, at_s=msg.at_s, tag=msg.item,
                    flow_key=msg.flow_key, traffic_class=msg.traffic_class, **transport)
    fabric.run(sc.duration_s)
    stats = fabric.stats()
    if name == "packet":
        _check_clock(stats, planned, where, sc.duration_s)
    conserved = True
    try:
        stats.check_conservation()
    except AssertionError:
        conserved = False
        if check_conservation:
            raise
    return summarize(sc, name, topology, planned, stats, conserved=conserved,
                     include_messages=include_messages)


def _check_clock(stats: FabricStats, planned: list[PlannedMessage], where: str,
                 duration_s: float | None) -> None:
    """Refuse a packet run that ran into the end of the backend's clock with messages left,
    whose events past it never happen (`simcore.fabric.packet.clock.HORIZON_S`; a scenario's
    own `duration_s` is under a quarter of it): one that reached it, or one without a
    `duration_s` that ended with messages neither delivered nor lost (its next event lay past
    the clock)."""
    from simcore.fabric.packet.clock import HORIZON_S

    left = len(planned) - len(stats.messages) - len(stats.lost_message_ids)
    if left > 0 and (duration_s is None or stats.duration_s >= 0.9 * HORIZON_S):
        raise ConfigError(
            f"{where}: the run reached the end of the packet backend's clock ({HORIZON_S:.3g} s: "
            f"picoseconds in 64 bits) with {len(stats.messages):,} of {len(planned):,} messages "
            f"delivered; its links are too slow for its traffic at this fidelity: use the flow "
            f"or analytical backend")


def distribution(values: list[float] | np.ndarray) -> dict[str, float | None]:
    """Mean, percentiles and max of a sample (None throughout when it is empty)."""
    keys = ["mean"] + [f"p{p}" for p in PERCENTILES] + ["max"]
    if len(values) == 0:
        return dict.fromkeys(keys)
    arr = np.asarray(values, dtype=float)
    out = {"mean": float(arr.mean())}
    for p, v in zip(PERCENTILES, np.percentile(arr, PERCENTILES)):
        out[f"p{p}"] = float(v)
    out["max"] = float(arr.max())
    return out


def _coarsen(t_s: list[float], util: np.ndarray, interval_s: float
             ) -> tuple[list[float], float, np.ndarray]:
    """Average adjacent samples so there are at most MAX_SERIES_POINTS (util: samples x links)."""
    n = len(t_s)
    if n <= MAX_SERIES_POINTS:
        return list(t_s), interval_s, util
    factor = math.ceil(n / MAX_SERIES_POINTS)
    m = math.ceil(n / factor)
    padded = np.full((m * factor, util.shape[1]), np.nan)
    padded[:n] = util
    merged = np.nanmean(padded.reshape(m, factor, -1), axis=1)
    return [t_s[k * factor] for k in range(m)], interval_s * factor, merged


def _messages_block(results: list[MessageResult], planned: list[PlannedMessage],
                    scenario: Scenario, topology: Topology, listed: bool,
                    lost_ids: list[int] | None = None) -> dict[str, Any]:
    fct = [r.fct_s for r in results]
    slowdown = [r.slowdown for r in results]
    by_item: dict[int, list[MessageResult]] = {}
    for r in results:
        by_item.setdefault(r.tag, []).append(r)
    planned_per_item: dict[int, int] = {}
    for p in planned:
        planned_per_item[p.item] = planned_per_item.get(p.item, 0) + 1
    lost_per_item: dict[int, int] = {}
    for m in lost_ids or ():
        lost_per_item[planned[m].item] = lost_per_item.get(planned[m].item, 0) + 1
    per_traffic = []
    for i, item in enumerate(scenario.traffic):
        done = by_item.get(i, [])
        entry = {"traffic": i, "kind": item.kind, "num_messages": planned_per_item.get(i, 0),
                 "num_completed": len(done), "fct_s": distribution([r.fct_s for r in done]),
                 "slowdown": distribution([r.slowdown for r in done])}
        if item.transport != "go_back_n":
            entry["transport"] = item.transport
        if item.transport == "datagram":
            # A datagram is lost when a switch dropped it; one neither delivered nor lost was
            # still in flight (or not yet sent) when the run stopped.
            lost = lost_per_item.get(i, 0)
            entry["num_lost"] = lost
            entry["loss_rate"] = lost / entry["num_messages"] if entry["num_messages"] else 0.0
            entry["delivered_bytes"] = sum(r.size_bytes for r in done)
        per_traffic.append(entry)
    block: dict[str, Any] = {"num_messages": len(planned), "num_completed": len(results),
                             "num_incomplete": len(planned) - len(results),
                             "fct_s": distribution(fct), "slowdown": distribution(slowdown),
                             "per_traffic": per_traffic}
    if listed:
        names = [nd.name for nd in topology.nodes]
        block["messages"] = [{"id": r.msg_id, "src": names[r.src], "dst": names[r.dst],
                              "size_bytes": r.size_bytes, "start_s": r.start_s,
                              "end_s": r.end_s, "fct_s": r.fct_s, "ideal_s": r.ideal_s,
                              "slowdown": r.slowdown, "traffic": r.tag}
                             for r in sorted(results, key=lambda r: r.msg_id)]
    return block


def ignored_settings(scenario: Scenario, backend: str) -> list[str]:
    """The scenario's settings, set away from their defaults, that `backend` does not read, as
    dotted paths of the scenario file (e.g. settings.pfc.shared_buffer_bytes)."""
    out = [f"settings.{p}" for p in unread_settings(backend, scenario.settings)]
    spec = scenario.topology
    cables = getattr(spec, "links", None)
    if cables is None:
        out += [f"topology.{p}" for p in unread_topology(backend, spec)]
    else:
        out += [f"topology.links[{i}].{p}" for i, cable in enumerate(cables)
                for p in unread_topology(backend, cable)]
    if backend != "packet":
        out += [f"traffic[{i}].traffic_class" for i, t in enumerate(scenario.traffic)
                if t.traffic_class]
        out += [f"traffic[{i}].transport" for i, t in enumerate(scenario.traffic)
                if t.transport != "go_back_n"]
    return out


def summarize(scenario: Scenario, backend: str, topology: Topology,
              planned: list[PlannedMessage], stats: FabricStats, *, conserved: bool = True,
              include_messages: bool | None = None) -> dict[str, Any]:
    """The JSON-able result of a run (see run_scenario); `model` says what the backend computes
    and what it ignores, `ignored_settings` lists the settings that had no effect at this
    backend's fidelity."""
    duration = stats.duration_s
    names = [nd.name for nd in topology.nodes]
    settings = scenario.settings
    util = np.asarray(stats.utilization, dtype=float).reshape(len(stats.utilization_t_s),
                                                              len(topology.links))
    sampled = stats.utilization_interval_s or settings.sample_interval_s
    t_s, interval, series = _coarsen(stats.utilization_t_s, util, sampled)
    over_time = {"interval_s": interval, "t_s": t_s, "per_link": series.T.tolist()}
    if sampled > settings.sample_interval_s:
        # A run too long for its samples at the configured interval (MAX_SAMPLE_VALUES).
        over_time["sampled_every_s"] = sampled
    bin_bytes = settings.queue_histogram_bin_bytes
    links = []
    for li, (link, ls) in enumerate(zip(topology.links, stats.links)):
        hist = stats.queue_histogram_bytes.get(li)
        links.append({
            "link": li, "name": f"{names[link.src]}->{names[link.dst]}", "kind": link.kind,
            "rate_gbps": link.rate_bps / 1e9, "bytes_sent": ls.bytes_sent, "busy_s": ls.busy_s,
            "utilization_mean": ls.busy_s / duration if duration > 0 else 0.0,
            "utilization_max": float(util[:, li].max()) if len(util) else 0.0,
            "queue_max_bytes": ls.max_queue_bytes,
            "queue_mean_bytes": ls.queue_byte_s / duration if duration > 0 else 0.0,
            "queue_histogram": ({"bin_bytes": bin_bytes, "counts": list(hist)}
                                if hist is not None else None),
            "ecn_marks": ls.ecn_marks, "drops": ls.drops,
            "pfc_pause_frames": ls.pfc_pause_frames, "paused_s": ls.paused_s,
            "pfc_pause_frames_by_class": ls.pfc_pause_frames_by_class,
            "paused_s_by_class": ls.paused_s_by_class})
    listed = (len(stats.messages) <= MAX_LISTED_MESSAGES if include_messages is None
              else include_messages)
    num_hosts = sum(1 for nd in topology.nodes if nd.kind == HOST)
    return {
        "scenario": scenario.name,
        "backend": backend,
        "seed": scenario.seed,
        "profile": settings.profile,
        "model": f"{backend} fabric: {MODEL[backend]}",
        "ignored_settings": ignored_settings(scenario, backend),
        "inert_settings": [f"settings.{p}" for p in off_feature_settings(scenario.settings)],
        "topology": {"kind": scenario.topology.kind, "num_hosts": num_hosts,
                     "num_switches": len(topology.nodes) - num_hosts,
                     "num_links": len(topology.links), "mtu_bytes": topology.mtu_bytes,
                     "header_bytes": topology.header_bytes},
        "duration_s": duration,
        "flows": _messages_block(stats.messages, planned, scenario, topology, listed,
                                 stats.lost_message_ids),
        "links": links,
        "utilization_over_time": over_time,
        "congestion": {"ecn_marks": stats.num_ecn_marks, "cnps": stats.num_cnps,
                       "dcqcn_rate_cuts": stats.num_rate_cuts,
                       "pfc_pause_frames": stats.num_pfc_pause_frames,
                       "pfc_paused_s": sum(ls.paused_s for ls in stats.links),
                       "num_ports_paused": sum(1 for ls in stats.links if ls.paused_s > 0)},
        "losses": {"drops": stats.num_drops, "dropped_bytes": stats.payload_dropped_bytes,
                   "retransmits": stats.num_retransmits,
                   "retransmitted_bytes": stats.retransmitted_bytes,
                   **({"datagrams_lost": len(stats.lost_message_ids)}
                      if any(t.transport == "datagram" for t in scenario.traffic) else {})},
        "bytes": {"planned": sum(p.size_bytes for p in planned),
                  "sent": stats.payload_sent_bytes, "delivered": stats.payload_delivered_bytes,
                  "dropped": stats.payload_dropped_bytes,
                  "in_flight": stats.payload_in_flight_bytes, "conserved": conserved},
    }
