"""Pairwise comparisons under the model's own error: for every pair of Pareto configurations and
every objective, the chance that one does better than the other.

The op-class errors of the step-time model (`simcore.uncertainty`) are systematic and shared by
every configuration on the same profile: a GEMM that runs 10% slower than modelled is slower for
all of them. Their absolute envelopes are wide (the quickstart's p99 TTFT spans two orders of
magnitude at ±35%) while the comparison between two configurations is much tighter. So
`pair_matrix` re-runs each configuration once per draw of those errors, `PAIR_DRAWS` draws:

- a draw is one `op_scale` mapping (`simcore.uncertainty.perturbations`, method "samples"),
  the same for every configuration on one profile (common random numbers) and independent
  across profiles. A profile's draws use the widest bound any of its members declares per op
  class, and the seed of its first member's configuration plus the profile's index (in order of
  first appearance): the study's seed, as for the recommendation's own comparison with its
  runner-up;
- all run at one fidelity (`dse.recommend.fidelity_config`), so that a pair compares like
  with like: the confirmation's when every compared configuration was confirmed, else the
  screening one, where every configuration was measured and the Pareto set is ranked (a
  confirmation of 2,000 requests against a screen of 600 would compare run lengths, not
  configurations). Each configuration runs once per draw, however many pairs it is part of;
- `PairMatrix.p(a, b, metric)`: on one profile, the fraction of draws in which `a` does better
  than `b` on `metric` (in the objective's direction; a tie counts half); across profiles, where
  the draws are independent, the fraction of all draw-against-draw combinations. Either way
  p(a, b) + p(b, a) = 1. `PairMatrix.gap(a, b, metric)`: their median relative difference
  over the same draws (or combinations), which the seed-to-seed spread is compared with.

`compare_front` covers the Pareto set best first on the first objective, up to `PAIR_LIMIT`
configurations, plus the recommendation and its runner-up when the matrix runs at the fidelity
their numbers come from (their trade-off sentence then reads its chances from the same runs;
otherwise `dse.recommend.beat_probabilities` draws the two apart, at theirs); the Pareto
configurations past the limit are kept as `left_out` and the report says so. How the matrix merges and orders the cards: `dse.report_groups`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dse.report import Configuration, StudyReport
    from dse.study import StudyConfig

PAIR_DRAWS = 6
"""Draws of the op-class errors every compared configuration is run under."""
PAIR_LIMIT = 12
"""Pareto configurations compared pairwise (best first on the first objective)."""
SEPARATES = 0.75
"""An objective can separate two configurations only when the chance that one does better lies
outside [1 - SEPARATES, SEPARATES]."""


@dataclass(frozen=True)
class PairMatrix:
    """Configurations re-run over shared draws of the op-class errors, and what follows."""

    numbers: tuple[int, ...]
    """Trial numbers of the configurations run, in the order they were drawn."""
    metrics: tuple[str, ...]
    directions: tuple[str, ...]
    draws: int
    seeds: dict[str, int]
    """Per profile, the seed of its draws."""
    profiles: dict[int, str]
    """Per configuration, the profile whose draws it shares."""
    runs: dict[int, tuple[dict[str, float], ...]] = field(repr=False)
    """Per configuration, its objective values under each draw."""
    left_out: tuple[int, ...] = ()
    """Pareto configurations past `PAIR_LIMIT`, not compared."""
    failed: tuple[int, ...] = ()
    """Configurations that could not be simulated."""
    fidelity: str = "screening"
    """The fidelity every configuration ran at: "screening" or "confirmation"."""

    def __contains__(self, number: object) -> bool:
        return number in self.runs

    def _draws(self, a: int, b: int, metric: str) -> list[tuple[float, float]] | None:
        """(a's value, b's value) per draw on one profile, per combination of draws across
        profiles; None when either was not run or a draw lacks the metric."""
        ra, rb = self.runs.get(a), self.runs.get(b)
        if ra is None or rb is None or metric not in self.metrics:
            return None
        xs, ys = [r.get(metric) for r in ra], [r.get(metric) for r in rb]
        if not all(v is not None and math.isfinite(v) for v in xs + ys):
            return None
        if self.profiles[a] == self.profiles[b]:
            return list(zip(xs, ys))
        return [(x, y) for x in xs for y in ys]

    def p(self, a: int, b: int, metric: str) -> float | None:
        """The chance that `a` does better than `b` on `metric` (see the module docstring);
        None when either was not run or a draw lacks the metric."""
        pairs = self._draws(a, b, metric)
        if pairs is None:
            return None
        minimize = self.directions[self.metrics.index(metric)] == "minimize"
        score = sum(0.5 if x == y else float(x < y if minimize else x > y) for x, y in pairs)
        return score / len(pairs)

    def gap(self, a: int, b: int, metric: str) -> float | None:
        """How far apart the two are on `metric` under the same draws: the median over the draws
        of their difference relative to the larger value; None as for `p`."""
        pairs = self._draws(a, b, metric)
        if pairs is None:
            return None
        rel = sorted(abs(x - y) / max(abs(x), abs(y)) if x != y else 0.0 for x, y in pairs)
        n = len(rel)
        return rel[n // 2] if n % 2 else (rel[n // 2 - 1] + rel[n // 2]) / 2

    def beats(self, a: int, b: int) -> dict[str, float]:
        """Per objective, the chance that `a` does better than `b`."""
        return {m: p for m in self.metrics if (p := self.p(a, b, m)) is not None}

    def shared(self, a: int, b: int) -> bool:
        """Whether the two were run under the same draws (the same profile)."""
        return a in self and b in self and self.profiles[a] == self.profiles[b]

    def score(self, number: int, among: Sequence[int]) -> float | None:
        """Mean chance that `number` does better than each other of `among` on the first
        objective; None when it has no comparison."""
        ps = [p for b in among if b != number
              and (p := self.p(number, b, self.metrics[0])) is not None]
        return sum(ps) / len(ps) if ps else None

    def as_dict(self) -> dict[str, Any]:
        """The matrix as plain data: p[metric][i][j] is the chance that configs[i] does better
        than configs[j] (null on the diagonal)."""
        n = self.numbers
        return {"configs": list(n), "objectives": [{"metric": m, "direction": d}
                                                   for m, d in zip(self.metrics, self.directions)],
                "draws": self.draws, "fidelity": self.fidelity, "seeds": dict(self.seeds),
                "profiles": {str(k): v for k, v in self.profiles.items()},
                "threshold": SEPARATES,
                "p": {m: [[self.p(a, b, m) if a != b else None for b in n] for a in n]
                      for m in self.metrics},
                "left_out": list(self.left_out), "failed": list(self.failed)}


def pair_matrix(study: StudyConfig | None, report: StudyReport,
                configs: Sequence[Configuration], draws: int = PAIR_DRAWS, *,
                left_out: Sequence[int] = ()) -> PairMatrix | None:
    """`configs` re-run over `draws` draws of the op-class errors at one fidelity (see the
    module docstring); None without a study or when none of them can be simulated."""
    if study is None:
        return None
    from dse.evaluate import result_metrics
    from dse.recommend import fidelity_config
    from simcore.errors import ConfigError
    from simcore.setup import build_deployment
    from simcore.simulate import simulate
    from simcore.uncertainty import perturbations

    first: dict[int, Configuration] = {}
    for c in configs:
        first.setdefault(c.number, c)
    unique = list(first.values())
    screen = not confirmed_fidelity(study, unique)
    failed: list[int] = []
    members: list[tuple[Configuration, Any, str]] = []
    bounds: dict[str, dict[str, float]] = {}
    seeds: dict[str, int] = {}
    for c in unique:
        cfg = fidelity_config(study, c, screen=screen)
        try:
            own = build_deployment(cfg).step_model.op_error_bounds() if cfg is not None else None
        except ConfigError:
            own = None
        if own is None:
            failed.append(c.number)
            continue
        profile = (c.screen if screen else c.latest).profile or f"trial #{c.number}"
        seeds.setdefault(profile, cfg.seed + len(seeds))
        wide = bounds.setdefault(profile, {})
        for k, b in own.items():
            wide[k] = max(b, wide.get(k, 0.0))
        members.append((c, cfg, profile))
    scales = {p: perturbations(bounds[p], "samples", draws, seeds[p]) for p in bounds}
    metrics = tuple(o.metric for o in report.objectives)
    runs: dict[int, tuple[dict[str, float], ...]] = {}
    for c, cfg, profile in members:
        try:
            results = [result_metrics(simulate(cfg, op_scale=s), study.cost.usd_per_gpu_hour,
                                      study.cost.usd_per_gpu_hour_by_gpu)
                       for s in scales[profile]]
        except ConfigError:
            failed.append(c.number)
            continue
        runs[c.number] = tuple({m: float(r[m]) for m in metrics if m in r} for r in results)
    if not runs:
        return None
    profiles = {c.number: p for c, _, p in members if c.number in runs}
    return PairMatrix(
        numbers=tuple(n for n in (c.number for c in unique) if n in runs), metrics=metrics,
        directions=tuple(o.direction for o in report.objectives), draws=draws,
        seeds={p: s for p, s in seeds.items() if p in profiles.values()}, profiles=profiles,
        runs=runs, left_out=tuple(left_out), failed=tuple(failed),
        fidelity="screening" if screen else "confirmation")


def confirmed_fidelity(study: StudyConfig, configs: Sequence[Configuration]) -> bool:
    """Whether `configs` are compared at the confirmation fidelity: all of them confirmed."""
    return study.fidelity.confirm is not None and all(c.confirmed for c in configs)


def compare_front(study: StudyConfig | None, report: StudyReport,
                  finalists: Sequence[Configuration] = ()) -> PairMatrix | None:
    """The matrix of the report's Pareto configurations, the confirmed ones when the study
    confirmed two or more (at the confirmation's fidelity, where the recommendation is judged),
    else all of them (at the screening's), the first `PAIR_LIMIT` of them, and `finalists` (the
    recommendation and its runner-up, drawn first) when the matrix runs at the fidelity their
    numbers come from (else their comparison is drawn apart, at theirs)."""
    if study is None:
        return None
    pareto = report.pareto
    confirmed = [c for c in pareto if c.confirmed]
    front = (confirmed if len(confirmed) >= 2 else pareto)[:PAIR_LIMIT]
    basis = all(c.confirmed for c in finalists)
    if confirmed_fidelity(study, [*front, *finalists]) != basis:
        finalists = [c for c in finalists if c.number in {x.number for x in front}]
    compared = {c.number for c in [*finalists, *front]}
    return pair_matrix(study, report, [*finalists, *front],
                       left_out=[c.number for c in pareto if c.number not in compared])


def pairs_note(pairs: PairMatrix, noise: dict[str, float], first: str, how: str = "") -> str:
    """The report's note on how the cards were compared, grouped and ordered (`how`: how the
    seed-to-seed spread `noise` was measured)."""
    spread = (" and, over the draws, they differ (median) by more than its seed-to-seed "
              "spread (" + ", ".join(f"{k} {v:.1%}" for k, v in noise.items()) + f"{how})"
              ) if noise else ""
    out = (f"Pareto configurations are compared pairwise over {pairs.draws} draws of the "
           "step-time errors, the same draws for every configuration on one profile (common "
           "random numbers: a kernel slower than modelled is slower for all of them), all at "
           f"the {pairs.fidelity} fidelity: per pair and objective, the chance that one does "
           "better (a tie counts half). An objective separates two configurations when that "
           f"chance is above {SEPARATES:.0%} one way{spread}; one card holds those that no "
           "objective separates, and the cards are ordered by each one's mean chance of doing "
           f"better than the others on {first}.")
    if pairs.left_out:
        out += (f" {left_out_text(pairs)}, only grouped by the seed-to-seed spread and the "
                "envelopes.")
    if pairs.failed:
        out += (" Not compared (could not be simulated): "
                + ", ".join(f"#{x}" for x in pairs.failed) + ".")
    return out


def left_out_text(pairs: PairMatrix) -> str:
    """Which Pareto configurations the matrix leaves out, and why, in one clause."""
    n = len(pairs.left_out)
    if pairs.fidelity == "confirmation":
        return (f"{n} Pareto configuration{'s' if n > 1 else ''} not confirmed "
                f"{'are' if n > 1 else 'is'} not compared (only the confirmed ones are, at most "
                f"{PAIR_LIMIT}, at the fidelity the recommendation is judged at)")
    return (f"{n} Pareto configuration{'s' if n > 1 else ''} past the first {PAIR_LIMIT} "
            f"{'are' if n > 1 else 'is'} not compared")


def pair_rows(pairs: PairMatrix, numbers: Sequence[int], metric: str) -> list[list[str]]:
    """Rows of a table of `metric`: per configuration, the chance that it does better than each
    of `numbers` (a dash on the diagonal)."""
    rows = []
    for a in numbers:
        cells = []
        for b in numbers:
            p = pairs.p(a, b, metric) if a != b else None
            cells.append("—" if p is None else f"{p:.0%}")
        rows.append([f"#{a}", *cells])
    return rows


def pairs_figure(pairs: PairMatrix, numbers: Sequence[int]) -> Any:
    """A heatmap per objective (a selector switches between them) of the chance that the row's
    configuration does better than the column's; None for fewer than two configurations."""
    import plotly.graph_objects as go

    numbers = [n for n in numbers if n in pairs]
    if len(numbers) < 2:
        return None
    labels = [f"#{n}" for n in numbers]
    fig = go.Figure()
    for k, m in enumerate(pairs.metrics):
        z = [[pairs.p(a, b, m) if a != b else None for b in numbers] for a in numbers]
        text = [["" if v is None else f"{v:.0%}" for v in row] for row in z]
        fig.add_trace(go.Heatmap(
            z=z, x=labels, y=labels, zmin=0, zmax=1, zmid=0.5, colorscale="RdBu",
            text=text, texttemplate="%{text}", visible=k == 0, name=m,
            colorbar={"title": "P(row better)", "tickformat": ".0%"},
            hovertemplate=f"P(%{{y}} does better than %{{x}} on {m}) = %{{z:.0%}}"
                          "<extra></extra>"))
    if len(pairs.metrics) > 1:
        fig.update_layout(updatemenus=[{
            "type": "dropdown", "x": 0, "y": 1.12, "xanchor": "left", "showactive": True,
            "buttons": [{"label": m, "method": "update",
                         "args": [{"visible": [i == k for i in range(len(pairs.metrics))]}]}
                        for k, m in enumerate(pairs.metrics)]}])
    side = min(720, 140 + 34 * len(numbers))
    fig.update_layout(height=side, width=side + 140,
                      margin={"l": 60, "r": 20, "t": 50, "b": 60},
                      yaxis={"autorange": "reversed"})
    return fig
