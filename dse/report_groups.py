"""What keeps the report's Pareto part small and honest: configurations the model cannot tell
apart are one card, the cards are ordered by their chances against each other, and a
confirmation that contradicts its screening run says why.

- `pareto_groups(report)`: the Pareto set (`ranked_pareto`) in groups whose members no
  objective tells apart from the group's first member (`indistinguishable`). Each group is one
  card; beyond `MAX_CARDS` groups the rest are a table.
- `indistinguishable(a, b)`: when both are in the report's pairwise matrix
  (`dse.report_pairs`, runs over shared draws of the step-time errors), an objective tells them
  apart only when both tests say so: the chance that one does better lies outside
  [1 - SEPARATES, SEPARATES], and their median relative difference over the draws exceeds
  its seed-to-seed spread (`measure_noise`), so both tests read the same runs. The two see
  different uncertainty: the draws share one workload, so they cannot see the workload's own
  seed noise, and the seed spread knows nothing of the model's error; a difference that
  survives only one of them is not one to choose on. So the merge is "either test says
  indistinguishable", taken per objective: an objective separates two configurations only
  when its difference survives both, and they share a card when no objective separates them.
  Without the matrix (past its limit, or no study to re-run): on a shared profile, paired,
  within the seed spread or with the order flipping at either end of the envelopes; across
  profiles, by overlapping envelopes.
- `ranked_pareto(report)`: the cards' order. Configurations in the matrix come first, by their
  mean chance of doing better than each other Pareto configuration in it on the first
  objective (the primary one, the one the Pareto set and the recommendation are ordered by;
  ties by its nominal value), then the rest by their nominal first-objective value.
- `discrepancies(report)`: per confirmed configuration, each objective whose confirmation value
  falls outside its screening run's envelope, with the likely cause: a screening run at or over
  capacity (its queue grew, so its latency percentiles measured its length) or, otherwise, the
  different number of requests of the two runs.
- `overlap_figure(report)`: the pairwise envelope overlaps of the Pareto set as one heatmap
  (objectives whose envelopes overlap, per pair), shown when there is no pairwise matrix.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dse.report import overlap
from dse.report_pairs import SEPARATES
from simcore.saturation import GROWTH_TOLERANCE

if TYPE_CHECKING:
    from dse.report import Configuration, StudyReport

MAX_CARDS = 7
"""Pareto groups shown as cards; the rest are listed in a table."""


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


def indistinguishable(report: StudyReport, a: Configuration, b: Configuration) -> bool:
    """Whether no objective tells the two apart (see the module docstring)."""
    return not any(_separates(report, a, b, o.metric) for o in report.objectives)


def _separates(report: StudyReport, a: Configuration, b: Configuration, metric: str) -> bool:
    """Whether `metric` tells the two apart.

    In the pairwise matrix: the chance that one does better is outside [1 - SEPARATES,
    SEPARATES] and their median relative difference over the draws (`PairMatrix.gap`) exceeds
    the seed-to-seed spread (`StudyReport.noise`). Otherwise (most trusted runs), on the same
    step-time profile, where the op-class error is shared, they are compared paired: they
    differ by more than the spread and, where both have perturbed re-runs, the order holds at
    both ends of the envelope. On different profiles the errors are independent: their
    envelopes must be disjoint."""
    pairs = report.pairs
    tol = report.noise.get(metric, 0.0)
    p = pairs.p(a.number, b.number, metric) if pairs is not None else None
    if p is not None:
        gap = pairs.gap(a.number, b.number, metric)
        return gap > tol and not 1 - SEPARATES <= p <= SEPARATES
    ma, mb = a.latest, b.latest
    va, vb = ma.value_of(metric), mb.value_of(metric)
    if va is None or vb is None:
        return False
    if ma.profile is None or ma.profile != mb.profile:
        return not overlap(ma.envelope(metric), mb.envelope(metric))
    if abs(va - vb) <= tol * max(abs(va), abs(vb)):
        return False
    ea, eb = ma.envelopes.get(metric), mb.envelopes.get(metric)
    order = _sign(va - vb)
    return not (ea and eb and (_sign(ea[0] - eb[0]) != order or _sign(ea[1] - eb[1]) != order))


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
            runs.append(result_metrics(r, study.cost.usd_per_gpu_hour,
                                       study.cost.usd_per_gpu_hour_by_gpu))
    except ConfigError:
        return {}
    out = {}
    for o in report.objectives:
        v = np.array([m[o.metric] for m in runs if o.metric in m], dtype=float)
        if v.size == len(runs) and abs(v.mean()) > 0:
            out[o.metric] = float(v.std() / abs(v.mean()))
    return out


def ranked_pareto(report: StudyReport) -> list[Configuration]:
    """The Pareto set in the cards' order (see the module docstring)."""
    pareto = report.pareto
    pairs = report.pairs
    if pairs is None:
        return pareto
    among = [c.number for c in pareto if c.number in pairs]
    score = {n: pairs.score(n, among) for n in among}
    place = {c.number: i for i, c in enumerate(pareto)}

    def key(c: Configuration) -> tuple:
        s = score.get(c.number)
        return (s is None, -(s or 0.0), place[c.number])

    return sorted(pareto, key=key)


def pareto_groups(report: StudyReport) -> list[list[Configuration]]:
    """The Pareto set in groups no objective tells apart, in the cards' order (see above)."""
    groups: list[list[Configuration]] = []
    for c in ranked_pareto(report):
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
