"""The decision a study report opens with: the configuration to deploy, why, and the runner-up.

`recommend(report, study)` picks, among the report's feasible configurations that meet every
SLO on their most trusted run (the confirmation when it completed, else the screen), the best on
the study's first objective, confirmed configurations before screened-only ones. The SLOs are
the study's constraints; a study without any is judged against `dse.capacity.DEFAULT_SLOS` (on
TTFT and TPOT), and the recommendation says so. With it:

- its margin to each SLO (how far below the bound, as a fraction of it) and, when its run
  measured one, its headroom to the throughput capacity (`simcore.saturation.headroom`);
- the runner-up (the next by the same rule whose numbers differ; configurations measured the
  same, e.g. by a setting that did not matter, are named as equivalent) and the trade-off
  between them in one sentence, with the chance that the recommendation does better on each
  objective over draws of the step-time errors shared by both, read from the report's pairwise
  matrix (`dse.report_pairs`) when it ran both at the fidelity their numbers come from, else
  drawn for the two alone (`beat_probabilities`); when neither can be simulated, saying
  whether the two are within each other's envelope on the first objective (the numbers alone
  then do not settle the order);
- the `vllm serve` command that launches it, and its whole launch plan (`dse.launch`), which
  the report writes beside itself as `launch.md`;
- what limits it, measured (`dse.counterfactual`): each candidate resource relaxed x2 and the
  configuration re-simulated at the fidelity its numbers come from, the first causes by their
  effect on the study's objectives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dse.capacity import DEFAULT_SLOS, parse_slos
from dse.report_pairs import PAIR_DRAWS, pair_matrix
from dse.study import Constraint

if TYPE_CHECKING:
    from dse.report import Configuration, StudyReport
    from dse.study import StudyConfig


@dataclass(frozen=True)
class Recommendation:
    """The recommended configuration of a study and what backs it."""

    number: int
    params: dict[str, Any]
    basis: str
    """"confirmation" or "screening": the run its numbers come from."""
    slos: tuple[Constraint, ...]
    default_slos: bool
    margins: dict[str, float]
    why: str
    headroom: str | None
    runner_up: int | None
    trade_off: str | None
    launch: str | None
    launch_error: str | None = None
    launch_plan: str | None = None
    """The whole launch plan (`dse.launch`, Markdown), written beside the report."""
    causes: tuple[str, ...] = ()
    """What limits it, measured: the first causes of `dse.counterfactual` on the study's
    objectives, each a resource relaxed x2 and re-simulated."""

    def lines(self) -> list[str]:
        """The recommendation as plain lines (the terminal and the Markdown report)."""
        params = ", ".join(f"{k} = {v}" for k, v in self.params.items()) or "the base"
        out = [f"Recommended: trial #{self.number} ({params})", self.why]
        if self.default_slos:
            out.append("The study declares no SLO: judged against the default SLOs "
                       f"{', '.join(DEFAULT_SLOS)}.")
        out.append("Margins to the SLOs: " + ", ".join(
            f"{m} {v:+.0%}" for m, v in self.margins.items()) + ".")
        if self.headroom:
            out.append(self.headroom)
        if self.trade_off:
            out.append(self.trade_off)
        out += list(self.causes)
        if self.launch:
            out.append(f"Launch: {self.launch}")
        elif self.launch_error:
            out.append(f"No launch command: {self.launch_error}")
        return out

    def as_dict(self) -> dict[str, Any]:
        return {"trial": self.number, "params": self.params, "basis": self.basis,
                "slos": [str(c) for c in self.slos], "default_slos": self.default_slos,
                "margins": self.margins, "why": self.why, "headroom": self.headroom,
                "runner_up": self.runner_up, "trade_off": self.trade_off,
                "launch": self.launch, "launch_error": self.launch_error,
                "causes": list(self.causes)}


def _meets(c: Configuration, slos: tuple[Constraint, ...]) -> bool:
    m = c.latest
    return all((v := m.value_of(s.metric)) is not None and s.met(v) for s in slos)


def _value(c: Configuration, metric: str) -> float | None:
    return c.latest.value_of(metric)


def _relative(a: float, b: float) -> str:
    """How much a differs from b, as a percentage of b."""
    return f"{abs(a - b) / abs(b):.0%}" if b else "n/a"


def fidelity_config(study: StudyConfig, c: Configuration, *, screen: bool = False):
    """The configuration as its numbers were measured: the study's base with its parameters and
    the confirmation's overrides when its confirmation completed, else the screen's (`screen`
    takes the screen's always); None when it cannot be deployed."""
    from dse.evaluate import EvalSpec, _check

    f = study.fidelity
    confirm = c.confirmed and f.confirm is not None and not screen
    return _check(study.base, c.params, (f.confirm if confirm else f.screen) or {},
                  EvalSpec.of(study))[0]


BEAT_SAMPLES = PAIR_DRAWS
"""Draws of the op-class errors that compare the recommendation with its runner-up."""


def beat_probabilities(study: StudyConfig | None, report: StudyReport, best: Configuration,
                       other: Configuration, samples: int = BEAT_SAMPLES
                       ) -> dict[str, float] | None:
    """Per objective, the chance that `best` does better than `other` over `samples` draws of
    the op-class errors (a tie counts half), both run at the fidelity their numbers come from:
    the two-configuration case of `dse.report_pairs.pair_matrix` (on one profile the two share
    each draw, common random numbers; on different profiles the draws are independent). None
    when either cannot be simulated."""
    m = pair_matrix(study, report, [best, other], samples)
    if m is None or best.number not in m or other.number not in m:
        return None
    return m.beats(best.number, other.number)


def _trade_off(report: StudyReport, best: Configuration, other: Configuration,
               beats: dict[str, float] | None = None, draws: int = BEAT_SAMPLES,
               fidelity: str | None = None) -> str:
    parts = []
    for i, o in enumerate(report.objectives):
        a, b = _value(other, o.metric), _value(best, o.metric)
        if a is None or b is None or a == b:
            continue
        better = a < b if o.direction == "minimize" else a > b
        if b and abs(a - b) / abs(b) < 0.005:
            parts.append(f"{o.metric} about the same")
            continue
        parts.append(f"{o.metric} {_relative(a, b)} {'better' if better else 'worse'}")
    said = "; ".join(parts) if parts else "the same objective values"
    if beats:
        shared = best.latest.profile is not None and best.latest.profile == other.latest.profile
        how = "shared by both" if shared else "drawn independently for each"
        at = f", at the {fidelity} fidelity" if fidelity else ""
        tail = (f" Chance that #{best.number} does better, over {draws} draws of the "
                f"step-time errors {how}{at}: "
                + ", ".join(f"{m} {p:.0%}" for m, p in beats.items()) + ".")
    else:
        from dse.report import overlap

        first = report.objectives[0].metric
        tail = (f" Their {first} envelopes overlap: within the model's error the two are not "
                f"told apart on it."
                if overlap(best.latest.envelope(first), other.latest.envelope(first)) else "")
    return f"Runner-up: trial #{other.number}, {said}.{tail}"


CAUSES_SHOWN = 3


def causes(study: StudyConfig | None, c: Configuration, report: StudyReport, *,
           screen: bool = False) -> tuple[str, ...]:
    """The configuration's limiting resources ranked by intervention on the study's objectives
    (those a single run reports), at the fidelity its numbers come from (at the screening one
    with `screen`, the cheaper); () when it cannot be simulated."""
    if study is None:
        return ()
    from dse.counterfactual import counterfactuals, default_objectives
    from dse.evaluate import result_metrics
    from simcore.errors import ConfigError
    from simcore.simulate import simulate

    cfg = fidelity_config(study, c, screen=screen)
    if cfg is None:
        return ()

    def metrics(r: dict) -> dict:
        return result_metrics(r, study.cost.usd_per_gpu_hour, study.cost.usd_per_gpu_hour_by_gpu)

    try:
        base = simulate(cfg)
        known = metrics(base)
        objectives = ([o for o in report.objectives if o.metric in known]
                      or default_objectives(base))
        effects = counterfactuals(cfg, objectives, base=base, metrics_of=metrics)
    except ConfigError:
        return ()
    shown = [e for e in effects if e.score > 0][:CAUSES_SHOWN]
    if not shown:
        return ("Relaxing any one resource x2 improves none of the objectives: nothing single "
                "limits it.",)
    return tuple(f"Limited {'first' if k == 0 else 'next'} by {e.label} (measured: "
                 f"{e.sentence()})." for k, e in enumerate(shown))


def _launch(study: StudyConfig | None, c: Configuration
            ) -> tuple[str | None, str | None, str | None]:
    """(the `vllm serve` line of a configuration, None, its whole launch plan), or
    (None, why not, None)."""
    if study is None:
        return None, "the study's base is not known here", None
    from dse.evaluate import EvalSpec, _check
    from dse.launch import launch_plan, serve_command_line

    cfg, reason = _check(study.base, c.params, {}, EvalSpec.of(study))
    if cfg is None:
        return None, reason, None
    try:
        return serve_command_line(cfg), None, launch_plan(cfg).render()
    except Exception as err:  # a launch problem must not cost the report its decision
        return None, (str(err).splitlines()[0] if str(err) else type(err).__name__), None


def _choices(report: StudyReport) -> tuple:
    """(the SLOs, the pool: confirmed configurations meeting them, else all meeting them, the
    pool ranked on the first objective, those measured the same as the first, the runner-up)."""
    slos = tuple(report.constraints) or parse_slos(None)
    ok = [c for c in report.feasible if _meets(c, slos)]
    pool = [c for c in ok if c.confirmed] or ok
    first = report.objectives[0]
    sign = 1.0 if first.direction == "minimize" else -1.0
    ranked = sorted(pool, key=lambda c: (sign * _value(c, first.metric), c.number))
    if not ranked:
        return slos, pool, ranked, [], None

    def numbers(c: Configuration) -> tuple:
        return tuple(_value(c, o.metric) for o in report.objectives)

    # Configurations with the very same numbers (settings that did not matter here) are the
    # same choice; the runner-up is the next that differs.
    best = ranked[0]
    same = [c for c in ranked[1:] if numbers(c) == numbers(best)]
    runner = next((c for c in ranked[1:] if numbers(c) != numbers(best)), None)
    return slos, pool, ranked, same, runner


def finalists(report: StudyReport) -> list[Configuration]:
    """The configuration `recommend` picks and its runner-up, when there are such."""
    _, _, ranked, _, runner = _choices(report)
    return ranked[:1] + ([runner] if runner is not None else [])


def recommend(report: StudyReport, study: StudyConfig | None = None) -> Recommendation | None:
    """The configuration to deploy (see the module docstring); None when none meets the SLOs."""
    slos, pool, ranked, same, runner = _choices(report)
    if not ranked:
        return None
    best = ranked[0]
    confirmed = best.confirmed
    first = report.objectives[0]
    margins = {s.metric: s.relative_slack(best.latest.value_of(s.metric)) for s in slos}
    tightest = min(margins, key=margins.get)
    basis = "confirmation" if best.confirmed else "screening"
    many = len(pool) != 1
    why = (f"It is the best on {first.metric} ({_value(best, first.metric):,.4g}) among the "
           f"{len(pool)} {'confirmed ' if confirmed else ''}configuration"
           f"{'s that meet' if many else ' that meets'} every SLO at the {basis} fidelity; "
           f"its tightest SLO is {tightest} ({margins[tightest]:.0%} inside the bound).")
    n_confirmed = sum(1 for c in report.configurations if c.confirmed)
    if not confirmed and n_confirmed:
        why += (f" None of the {n_confirmed} confirmed configuration"
                f"{'s meets' if n_confirmed != 1 else ' meets'} every SLO at the confirmation "
                "fidelity, and this one was only screened: confirm it (a larger "
                "fidelity.confirm_top_k) before deploying it.")
    if same:
        why += (" Measured the same: " + ", ".join(
            f"#{c.number} ({', '.join(f'{k} = {v}' for k, v in c.params.items())})"
            for c in same[:3]) + (f" and {len(same) - 3} more" if len(same) > 3 else "") + ".")
    expl = best.explanation or {}
    headroom = None
    if expl.get("load_state") and expl.get("sentences"):
        headroom = expl["sentences"][0]
    trade_off = None
    if runner is not None:
        pairs = report.pairs
        both = "confirmation" if best.confirmed and runner.confirmed else "screening"
        if (pairs is not None and best.number in pairs and runner.number in pairs
                and pairs.fidelity == both):
            beats, draws = pairs.beats(best.number, runner.number), pairs.draws
        else:
            beats, draws = beat_probabilities(study, report, best, runner), BEAT_SAMPLES
        trade_off = _trade_off(report, best, runner, beats, draws, both)
    launch, launch_error, plan = _launch(study, best)
    return Recommendation(
        number=best.number, params=dict(best.params), basis=basis, slos=slos,
        default_slos=not report.constraints, margins=margins, why=why, headroom=headroom,
        runner_up=runner.number if runner else None, trade_off=trade_off,
        launch=launch, launch_error=launch_error, launch_plan=plan,
        causes=causes(study, best, report))


def decide(report: StudyReport, study: StudyConfig) -> StudyReport:
    """The report with what needs the study's base: each objective's seed-to-seed spread and
    the pairwise matrix of the Pareto configurations over shared draws of the step-time errors
    (which group and order the Pareto cards), the recommendation, and every card's causes by
    intervention."""
    from dataclasses import replace

    from dse.report_groups import MAX_CARDS, NOISE_SEEDS, measure_noise, pareto_groups
    from dse.report_pairs import compare_front, pairs_note

    noise = measure_noise(study, report)
    spread = f", over {NOISE_SEEDS + 1} workload draws of the best at the screening fidelity"
    if noise:
        report = replace(report, noise=noise)
    pairs = compare_front(study, report, finalists(report))
    if pairs is not None:
        report = replace(report, pairs=pairs, notes=report.notes + (
            pairs_note(pairs, noise, report.objectives[0].metric, spread),))
    elif noise:
        report = replace(report, notes=report.notes + (
            "Pareto configurations on one profile are compared paired (the step-time error is "
            "shared): one card holds those that differ on no objective by more than its "
            "seed-to-seed spread (" + ", ".join(f"{k} {v:.1%}" for k, v in noise.items())
            + f"{spread}) or whose order flips at either end of their envelopes.",))
    rec = recommend(report, study)
    heads = [g[0] for g in pareto_groups(report)[:MAX_CARDS]]
    measured = {c.number: (rec.causes if rec is not None and c.number == rec.number
                           else causes(study, c, report, screen=True)) for c in heads}
    return replace(report, recommendation=rec, causes=measured)
