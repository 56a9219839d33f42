"""Plain-text rendering of a fabric scenario's result (what `dse fabric` prints)."""

from __future__ import annotations

import textwrap
from typing import Any

_LINE = 64
_TOP_LINKS = 5


def _title(text: str, fill: str = "=") -> str:
    return f"{text:{fill}^{_LINE}}"


def _row(label: str, value: Any) -> str:
    if isinstance(value, float):
        value = f"{value:.3f}"
    label = f"{label:<40}"
    return f"{label}{value!s:>{max(1, _LINE - len(label))}}"


def _us(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e6:.2f}"


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def render_fabric_summary(result: dict[str, Any]) -> str:
    """Headline figures of a `run_scenario` result: completion times, busiest links and queues,
    congestion signals, losses and the byte balance."""
    flows, topo = result["flows"], result["topology"]
    lines = [_title(" Fabric scenario result (simulated) ")]
    lines += [
        _row("Scenario:", result["scenario"]),
        _row("Backend / profile:", f"{result['backend']} / {result['profile']}"),
        _row("Topology:", f"{topo['kind']}, {topo['num_hosts']} hosts, "
                          f"{topo['num_switches']} switches"),
        _row("Simulated time (us):", _us(result["duration_s"])),
        _row("Messages completed / sent:", f"{flows['num_completed']} / {flows['num_messages']}"),
    ]
    model = result.get("model")
    if model:
        lines += textwrap.wrap(f"Model: {model}", _LINE)
    ignored = result.get("ignored_settings")
    if ignored:
        lines += textwrap.wrap(f"Ignored at fidelity {result['backend']} (read by the packet "
                               f"backend only): {', '.join(ignored)}", _LINE)
    inert = result.get("inert_settings")
    if inert:
        lines += textwrap.wrap(f"No effect (their feature is off, or the fabric never drops): "
                               f"{', '.join(inert)}", _LINE)
    lines.append(_title(" Flow completion ", "-"))
    fct, slow = flows["fct_s"], flows["slowdown"]
    lines += [
        _row("FCT mean / p50 / p99 (us):", f"{_us(fct['mean'])} / {_us(fct['p50'])} / "
                                           f"{_us(fct['p99'])}"),
        _row("FCT max (us):", _us(fct["max"])),
        _row("Slowdown p50 / p99 / max:", f"{_ratio(slow['p50'])} / {_ratio(slow['p99'])} / "
                                          f"{_ratio(slow['max'])}"),
    ]
    if len(flows["per_traffic"]) > 1:
        for t in flows["per_traffic"]:
            lines.append(_row(f"  traffic {t['traffic']} ({t['kind']}) p99 FCT (us):",
                              _us(t["fct_s"]["p99"])))
    lines.append(_title(" Busiest links (utilization mean / max) ", "-"))
    widened = result["utilization_over_time"].get("sampled_every_s")
    if widened is not None:
        lines += textwrap.wrap(f"The max is over samples of {widened:.3g} s: the run was too long "
                               f"to hold them at settings.sample_interval_s, which was doubled "
                               f"until it could.", _LINE)
    busiest = sorted(result["links"], key=lambda lk: -lk["utilization_mean"])[:_TOP_LINKS]
    for lk in busiest:
        lines.append(_row(f"  {lk['name']} ({lk['rate_gbps']:g} Gb/s)",
                          f"{lk['utilization_mean']:.2f} / {lk['utilization_max']:.2f}"))
    queued = [lk for lk in result["links"] if lk["queue_max_bytes"] > 0]
    if queued:
        lines.append(_title(" Deepest queues (max / mean) ", "-"))
        for lk in sorted(queued, key=lambda lk: -lk["queue_max_bytes"])[:_TOP_LINKS]:
            lines.append(_row(f"  {lk['name']}", f"{_bytes(lk['queue_max_bytes'])} / "
                                                 f"{_bytes(lk['queue_mean_bytes'])}"))
    c, loss, b = result["congestion"], result["losses"], result["bytes"]
    lines.append(_title(" Congestion and losses ", "-"))
    lines += [
        _row("ECN marks / CNPs / DCQCN rate cuts:", f"{c['ecn_marks']} / {c['cnps']} / "
                                                    f"{c['dcqcn_rate_cuts']}"),
        _row("PFC pause frames / ports paused:", f"{c['pfc_pause_frames']} / "
                                                 f"{c['num_ports_paused']}"),
        _row("PFC paused time, all ports (us):", _us(c["pfc_paused_s"])),
        _row("Drops / retransmits:", f"{loss['drops']} / {loss['retransmits']}"),
    ]
    lines.append(_title(" Bytes ", "-"))
    lines += [
        _row("Payload sent / delivered:", f"{_bytes(b['sent'])} / {_bytes(b['delivered'])}"),
        _row("Dropped / in flight:", f"{_bytes(b['dropped'])} / {_bytes(b['in_flight'])}"),
        _row("Bytes conserved:",
             "yes" if b["conserved"] else "NO"),
    ]
    lines.append("=" * _LINE)
    return "\n".join(lines)
