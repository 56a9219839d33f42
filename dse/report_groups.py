"""What keeps the report's Pareto part small and honest: configurations the model cannot tell
apart are one row, and a confirmation that contradicts its screening run says why.

- `pareto_groups(report)`: the Pareto set, best first on the first objective, in groups whose
  members no objective tells apart from the group's first member (`indistinguishable`: paired
  on a shared profile, within the seed-to-seed spread `measure_noise` finds; by envelopes
  across profiles). Each group is one card; beyond `MAX_CARDS` groups the rest are a table.
- `discrepancies(report)`: per confirmed configuration, each objective whose confirmation value
  falls outside its screening run's envelope, with the likely cause: a screening run at or over
  capacity (its queue grew, so its latency percentiles measured its length) or, otherwise, the
  different number of requests of the two runs.
- `overlap_figure(report)`: the pairwise envelope overlaps of the Pareto set as one heatmap
  (objectives whose envelopes overlap, per pair) instead of a row per pair.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dse.report import overlap
from simcore.saturation import GROWTH_TOLERANCE

if TYPE_CHECKING:
    from dse.report import Configuration, StudyReport

MAX_CARDS = 7
"""Pareto groups shown as cards; the rest are listed in a table."""


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


def indistinguishable(report: StudyReport, a: Configuration, b: Configuration) -> bool:
    """Whether no objective tells the two apart (most trusted runs).

    On the same step-time profile the op-class error is shared, so they are compared paired: an
    objective tells them apart when they differ by more than its seed-to-seed spread
    (`StudyReport.noise`) and, where both have perturbed re-runs, the order holds at both ends
    of the envelope. On different profiles the errors are independent: their envelopes must be
    disjoint."""
    ma, mb = a.latest, b.latest
    paired = ma.profile is not None and ma.profile == mb.profile
    for o in report.objectives:
        va, vb = ma.value_of(o.metric), mb.value_of(o.metric)
        if va is None or vb is None:
            continue
        if not paired:
            if not overlap(ma.envelope(o.metric), mb.envelope(o.metric)):
                return False
            continue
        tol = report.noise.get(o.metric, 0.0)
        if abs(va - vb) <= tol * max(abs(va), abs(vb)):
            continue
        ea, eb = ma.envelopes.get(o.metric), mb.envelopes.get(o.metric)
        order = _sign(va - vb)
        if ea and eb and (_sign(ea[0] - eb[0]) != order or _sign(ea[1] - eb[1]) != order):
            continue
        return False
    return True


NOISE_SEEDS = 4
"""Extra workload draws that measure each objective's seed-to-seed spread."""


def measure_noise(study, report: StudyReport) -> dict[str, float]:
    """Each objective's seed-to-seed spread (coefficient of variation over the nominal seed and
    `NOISE_SEEDS` more) of the best configuration at the screening fidelity: how much a
    different draw of the same workload moves it. {} when it cannot be simulated."""
    import numpy as np

    from dse.evaluate import result_metrics
    from dse.recommend import fidelity_config
    from simcore.errors import ConfigError
    from simcore.simulate import simulate

    if not report.pareto:
        return {}
    cfg = fidelity_config(study, report.pareto[0], screen=True)
    if cfg is None:
        return {}
    runs = []
    try:
        for k in range(NOISE_SEEDS + 1):
            r = simulate(cfg.model_copy(update={"seed": cfg.seed + k}))
            runs.append(result_metrics(r, study.cost.usd_per_gpu_hour))
    except ConfigError:
        return {}
    out = {}
    for o in report.objectives:
        v = np.array([m[o.metric] for m in runs if o.metric in m], dtype=float)
        if v.size == len(runs) and abs(v.mean()) > 0:
            out[o.metric] = float(v.std() / abs(v.mean()))
    return out


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
    z = [[sum(overlap(a.latest.envelope(o.metric), b.latest.envelope(o.metric))
              for o in report.objectives) if a is not b else None for b in pareto]
         for a in pareto]
    fig = go.Figure(go.Heatmap(z=z, x=labels, y=labels, zmin=0, zmax=n_obj,
                               colorscale="Blues", colorbar={"title": "objectives"},
                               hovertemplate="%{y} vs %{x}: %{z} overlapping<extra></extra>"))
    side = min(700, 120 + 28 * len(pareto))
    fig.update_layout(height=side, width=side + 120, margin={"l": 60, "r": 20, "t": 20, "b": 60},
                      yaxis={"autorange": "reversed"})
    return fig
