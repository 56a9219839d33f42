"""What keeps the report's Pareto part small and honest: configurations the model cannot tell
apart are one row, and a confirmation that contradicts its screening run says why.

- `pareto_groups(report)`: the Pareto set, best first on the first objective, in groups whose
  members' envelopes overlap the group's first member on every objective (the model's own error
  cannot order them). Each group is one card; beyond `MAX_CARDS` groups the rest are a table.
- `discrepancies(report)`: per confirmed configuration, each objective whose confirmation value
  falls outside its screening run's envelope, with the likely cause: a screening run at or over
  capacity (its queue grew, so its latency percentiles measured its length) or, otherwise, the
  different number of requests of the two runs.
- `overlap_figure(report)`: the pairwise envelope overlaps of the Pareto set as one heatmap
  (objectives whose envelopes overlap, per pair) instead of a row per pair.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from simcore.saturation import GROWTH_TOLERANCE

if TYPE_CHECKING:
    from dse.report import Configuration, StudyReport

MAX_CARDS = 7
"""Pareto groups shown as cards; the rest are listed in a table."""


def _overlap(a: tuple[float, float] | None, b: tuple[float, float] | None) -> bool:
    return a is not None and b is not None and a[0] <= b[1] and b[0] <= a[1]


def indistinguishable(report: StudyReport, a: Configuration, b: Configuration) -> bool:
    """Whether every objective's envelopes of the two (most trusted runs) overlap."""
    return all(_overlap(a.latest.envelope(o.metric), b.latest.envelope(o.metric))
               for o in report.objectives)


def pareto_groups(report: StudyReport) -> list[list[Configuration]]:
    """The Pareto set in groups of configurations the envelopes cannot order (see above)."""
    groups: list[list[Configuration]] = []
    for c in report.pareto:
        for g in groups:
            if indistinguishable(report, g[0], c):
                g.append(c)
                break
        else:
            groups.append([c])
    return groups


def discrepancies(report: StudyReport) -> dict[int, list[str]]:
    """Per confirmed configuration, the objectives its confirmation moved beyond the screening
    envelope, each with its likely cause."""
    out: dict[int, list[str]] = {}
    for c in report.configurations:
        if not c.confirmed:
            continue
        notes = []
        for o in report.objectives:
            s, k = c.screen.value_of(o.metric), c.confirm.value_of(o.metric)
            env = c.screen.envelope(o.metric)
            if s is None or k is None or env is None or env[0] <= k <= env[1]:
                continue
            ratio = f"{k / s:.2g}x" if s else "changed"
            notes.append(f"{o.metric} at the confirmation is {ratio} its screening value, "
                         f"beyond the screening envelope: {_cause(c)}")
        if notes:
            out[c.number] = notes
    return out


def _cause(c: Configuration) -> str:
    growth = c.screen.value_of("queue_growth_rps")
    offered = c.screen.value_of("offered_request_rate")
    n_screen, n_confirm = c.screen.value_of("num_requests"), c.confirm.value_of("num_requests")
    runs = (f" ({n_screen:,.0f} vs {n_confirm:,.0f} requests)"
            if n_screen is not None and n_confirm is not None else "")
    if growth is not None and offered and growth > GROWTH_TOLERANCE * offered:
        return (f"screened at or over capacity (its queue grew {growth:.3g} req/s of "
                f"{offered:.3g} offered), so its latency percentiles grew with the run's "
                f"length{runs}")
    return f"the two runs differ in length and requests{runs}"


def overlap_figure(report: StudyReport) -> Any:
    """A heatmap of the Pareto pairs: how many objectives' envelopes overlap; None for fewer
    than two Pareto configurations."""
    import plotly.graph_objects as go

    pareto = report.pareto
    if len(pareto) < 2:
        return None
    n_obj = len(report.objectives)
    labels = [f"#{c.number}" for c in pareto]
    z = [[sum(_overlap(a.latest.envelope(o.metric), b.latest.envelope(o.metric))
              for o in report.objectives) if a is not b else None for b in pareto]
         for a in pareto]
    fig = go.Figure(go.Heatmap(z=z, x=labels, y=labels, zmin=0, zmax=n_obj,
                               colorscale="Blues", colorbar={"title": "objectives"},
                               hovertemplate="%{y} vs %{x}: %{z} overlapping<extra></extra>"))
    side = min(700, 120 + 28 * len(pareto))
    fig.update_layout(height=side, width=side + 120, margin={"l": 60, "r": 20, "t": 20, "b": 60},
                      yaxis={"autorange": "reversed"})
    return fig
