"""Aggregated against disaggregated serving: the best configuration of each mode a study searched
(`serving` in its space) under the study's SLOs, on the first objective, and which wins by how
much."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dse.report import StudyReport, _fmt
from dse.space import SERVING

if TYPE_CHECKING:
    from dse.report import Configuration
    from dse.study import StudyConfig

READABLE = {"output_throughput_per_gpu": "output tokens/s per GPU",
            "output_throughput": "output tokens/s",
            "request_throughput": "requests/s",
            "request_throughput_per_gpu": "requests/s per GPU",
            "output_tokens_per_dollar": "output tokens per dollar",
            "total_token_throughput_per_gpu": "tokens/s per GPU",
            "request_goodput": "requests/s within the goodput SLOs"}
TIE = 0.005
"""A margin below this (half a percent) is reported as a tie: no mode wins."""


@dataclass(frozen=True)
class ServingSide:
    """One serving mode's trials: how many ran, how many met the SLOs, and the best of those."""

    mode: str
    num_trials: int
    num_feasible: int
    number: int | None = None
    layout: str | None = None
    value: float | None = None
    num_gpus: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "num_trials": self.num_trials,
                "num_feasible": self.num_feasible, "trial": self.number, "layout": self.layout,
                "value": self.value, "num_gpus": self.num_gpus}


@dataclass(frozen=True)
class ServingComparison:
    """The best aggregated and the best disaggregated configuration on the first objective
    (at the screening fidelity, where every trial was measured, as the ranks are), among
    those meeting every SLO; the winner and its margin (the relative difference of the
    objective, over the loser's value)."""

    metric: str
    direction: str
    slos: tuple[str, ...]
    aggregated: ServingSide
    disaggregated: ServingSide
    winner: str | None
    margin: float | None

    def sentence(self) -> str:
        within = (" within " + " and ".join(self.slos)) if self.slos else ""
        a, d = self.aggregated, self.disaggregated
        what = READABLE.get(self.metric, self.metric)
        if self.winner is not None:
            win, lose = (a, d) if self.winner == "aggregated" else (d, a)
            if self.margin is not None and self.margin < TIE:
                return (f"{win.mode.capitalize()} {win.layout} (trial #{win.number}) and the "
                        f"best {lose.mode} ({lose.layout}, trial #{lose.number}) are within "
                        f"{TIE:.1%} of each other on {what} ({_fmt(win.value)} against "
                        f"{_fmt(lose.value)}){within}.")
            more = ("more" if self.direction == "maximize" else "less")
            return (f"{win.mode.capitalize()} {win.layout} (trial #{win.number}) gives "
                    f"{self.margin:.0%} {more} {what} ({_fmt(win.value)} against "
                    f"{_fmt(lose.value)}) than the best {lose.mode}, {lose.layout} (trial "
                    f"#{lose.number}){within}.")
        parts = []
        for s in (a, d):
            if s.num_trials == 0:
                parts.append(f"no {s.mode} trial ran")
            elif s.number is None:
                parts.append(f"no {s.mode} configuration met the SLOs ({s.num_trials} "
                             f"trial{'s' if s.num_trials > 1 else ''})")
            else:
                parts.append(f"the best {s.mode} is {s.layout} (trial #{s.number}) at "
                             f"{_fmt(s.value)} {what}")
        text = "; ".join(parts)
        return text[0].upper() + text[1:] + (f"{within}." if self.slos else ".")

    def as_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "direction": self.direction, "slos": list(self.slos),
                "aggregated": self.aggregated.as_dict(),
                "disaggregated": self.disaggregated.as_dict(),
                "winner": self.winner, "margin": self.margin,
                "tie": self.margin is not None and self.margin < TIE,
                "sentence": self.sentence()}


def layout_of(cfg) -> str:
    """A configuration's GPU layout in short: `TP8 x DP2` or `2P(TP4)+1D(TP8)` (PP if > 1; a
    role's own GPU where one is declared: `2P(TP4 H100-SXM)+1D(TP8 H200)`)."""
    par = cfg.parallelism
    pp = f" x PP{par.pipeline_parallel_size}" if par.pipeline_parallel_size > 1 else ""
    pd = par.prefill_decode
    if pd is None:
        reps = f" x {par.num_replicas} replicas" if par.num_replicas > 1 else ""
        return f"TP{par.tensor_parallel_size}{pp} x DP{par.data_parallel_size}{reps}"
    parts = []
    for role, n in (("prefill", pd.num_prefill_instances), ("decode", pd.num_decode_instances)):
        gpu = par.role_gpu(role)
        parts.append(f"{n}{role[0].upper()}(TP{par.role_tensor_parallel_size(role)}{pp}"
                     f"{' ' + gpu if gpu else ''})")
    return "+".join(parts)


def _side(report: StudyReport, study: StudyConfig, mode: str,
          configs: list[Configuration]) -> ServingSide:
    from dse.evaluate import EvalSpec, _check

    ran = [c for c in configs if c.screen.complete]
    ok = [c for c in ran if c.feasible and c.values]
    if not ok:
        return ServingSide(mode, len(ran), 0)
    sign = 1.0 if report.objectives[0].direction == "minimize" else -1.0
    best = min(ok, key=lambda c: (sign * c.values[0], c.number))
    cfg, _ = _check(study.base, best.params, {}, EvalSpec.of(study))
    n = best.screen.value_of("num_gpus")
    return ServingSide(mode, len(ran), len(ok), best.number,
                       layout_of(cfg) if cfg is not None else str(best.params),
                       float(best.values[0]), int(n) if n is not None else None)


def serving_comparison(report: StudyReport, study: StudyConfig) -> ServingComparison | None:
    """The comparison of a study whose space searches both serving modes; None otherwise."""
    modes = study.space.serving or ()
    if set(modes) != {"aggregated", "disaggregated"}:
        return None
    by_mode: dict[str, list[Configuration]] = {m: [] for m in modes}
    for c in report.configurations:
        mode = c.params.get(SERVING)
        if mode in by_mode:
            by_mode[mode].append(c)
    a = _side(report, study, "aggregated", by_mode["aggregated"])
    d = _side(report, study, "disaggregated", by_mode["disaggregated"])
    o = report.objectives[0]
    winner = margin = None
    if a.value is not None and d.value is not None:
        better_d = d.value > a.value if o.direction == "maximize" else d.value < a.value
        win, lose = (d, a) if better_d else (a, d)
        winner = win.mode
        margin = abs(win.value - lose.value) / abs(lose.value) if lose.value else None
    return ServingComparison(o.metric, o.direction, tuple(str(c) for c in report.constraints),
                             a, d, winner, margin)
