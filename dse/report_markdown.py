"""The report rendered as Markdown: no plots, for terminals, pull requests and wikis."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from dse.report import StudyReport, _fmt, setting_text
from dse.report_groups import MAX_CARDS, discrepancies, pareto_groups, ranked_pareto
from dse.report_pairs import left_out_text, pair_rows
from dse.report_render import (ALSO, _chance_text, _confirmed_rows, _explanation_parts,
                               _fidelity_text, _metric_cells, _metric_rows, _overlap_sentence,
                               _param_diff, _params_text, _profile_text, _summary_lines)


def _md(x: Any) -> str:
    """A table-safe Markdown cell. Markdown passes raw HTML through, so anything that could open
    a tag is escaped; a bare `<=` stays readable."""
    s = _fmt(x) if not isinstance(x, str) else x
    s = re.sub(r"<(?=[A-Za-z/!?])", "&lt;", s)
    return s.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _bold(s: str, on: bool) -> str:
    return f"**{s}**" if on else s


def _md_table(head: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    out = ["| " + " | ".join(_md(h) for h in head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(_md(x) for x in r) + " |" for r in rows]
    return out + [""]


def _recommendation_md(report: StudyReport) -> list[str]:
    r = report.recommendation
    if r is None:
        return ["## Recommendation", "", _md(report.no_recommendation()), ""]
    lines = r.lines()
    out = [f"## {_md(lines[0])}", ""]
    for x in lines[1:]:
        if x.startswith("Launch: "):
            out += ["```bash", r.launch, "```", ""]
        else:
            out += [_md(x), ""]
    return out


def _pairs_md(report: StudyReport) -> list[str]:
    """The pairwise chances of doing better, one small table per objective."""
    pairs = report.pairs
    numbers = [c.number for c in ranked_pareto(report) if pairs is not None and c.number in pairs]
    if len(numbers) < 2:
        return []
    out = ["### Chance of doing better, pairwise", "",
           f"Per pair of Pareto configurations (in the cards' order), the chance that the row's "
           f"does better than the column's over {pairs.draws} draws of the step-time errors, "
           f"shared by those on one profile, at the {pairs.fidelity} fidelity. Near 50% the "
           "model's own error cannot order the two."
           + (f" {left_out_text(pairs)}." if pairs.left_out else ""), ""]
    for m in pairs.metrics:
        out += [f"**{_md(m)}**", ""]
        out += _md_table(["row better than", *(f"#{n}" for n in numbers)],
                         pair_rows(pairs, numbers, m))
    return out


def render_markdown(report: StudyReport) -> str:
    """The report without plots, for terminals, pull requests and wikis."""
    names = [o.metric for o in report.objectives]
    overlaps = report.envelope_overlaps()
    line1, line2 = _summary_lines(report)
    lines = [f"# Study {_md(report.study_name)}", "",
             f"Storage {_md(report.storage)}, generated {report.generated_at}.", "",
             *_recommendation_md(report),
             *(["## Aggregated against disaggregated serving", "",
                _md(report.serving.sentence()), ""] if report.serving is not None else []),
             _md(line1), "", _md(line2), "",
             f"## Pareto configurations ({len(report.pareto)})", ""]
    if not report.pareto:
        lines += ["No feasible configuration: there is no Pareto set.", ""]
    groups = pareto_groups(report)
    flags = discrepancies(report)
    for g in groups[:MAX_CARDS]:
        c = g[0]
        lines += [f"### Trial #{c.number}" + (" (baseline)" if c.baseline else ""), "",
                  f"Measured at: {_md(_fidelity_text(c))}.", ""]
        chance = _chance_text(report, c)
        if chance:
            lines += [_md(chance), ""]
        if g[1:]:
            lines += [f"{ALSO} " + ", ".join(
                f"#{o.number} ({_md(_params_text(o))})" for o in g[1:]) + ".", ""]
        lines += [f"**{_md(f)}.**" for f in flags.get(c.number, [])] + (
            [""] if c.number in flags else [])
        prof = _profile_text(c.screen)
        if prof:
            lines += [f"Profile: {_md(prof)}", ""]
        diff = _param_diff(report, c)
        if diff:
            has_base = report.baseline is not None and report.baseline is not c
            lines += _md_table(
                ["parameter", "value"] + ([f"baseline #{report.baseline.number}"]
                                          if has_base else []),
                ([_bold(n, ch), _bold(setting_text(v), ch)]
                 + ([setting_text(bv) if bv is not None else "—"] if has_base else [])
                 for n, v, bv, ch in diff))
        head, mrows = _metric_rows(report, c)
        lines += _md_table(head, (_metric_cells(head, r) for r in mrows))
        ov = _overlap_sentence(c, overlaps)
        if ov:
            lines += [f"Its envelope {_md(ov)}.", ""]
        bottleneck, sentences, _ = _explanation_parts(c)
        measured = report.causes.get(c.number, ())
        if measured:
            lines += ["**Measured by intervention:**", ""] + [f"- {_md(x)}" for x in measured]
            lines += [""]
        if bottleneck:
            lines += [f"**Limited by:** {_md(bottleneck)}", ""]
        if sentences:
            lines += [_md(sentences), ""]
        if c.confirm is not None and not c.confirm.complete:
            lines += [f"Confirmation run {c.confirm.state.lower()}: "
                      f"{_md('; '.join(c.confirm.reasons))}", ""]
    rest = [c for g in groups[MAX_CARDS:] for c in g]
    if rest:
        lines += [f"### More Pareto configurations ({len(rest)})", ""]
        lines += _md_table(["trial", *names], ([f"#{c.number}", *c.values] for c in rest))
    lines += _pairs_md(report)
    if report.confirmed:
        lines += [f"## Confirmed configurations ({len(report.confirmed)})", ""]
        lines += _md_table(["trial", "rank", "confirm rank", "state", *names, "verdict"],
                           _confirmed_rows(report))
    params = sorted({p for c in report.configurations for p in c.params})
    lines += [f"## Feasible configurations ({len(report.feasible)})", ""]
    lines += _md_table(["trial", "rank", "fidelity", *names, *params],
                       ([f"#{c.number}", c.rank, c.fidelity, *c.values,
                         *(c.params.get(p, "") for p in params)] for c in report.feasible))
    lines += [f"## Infeasible and failed configurations ({len(report.not_feasible)})", ""]
    lines += _md_table(["trial", "state", "fidelity", "reasons"],
                       ([f"#{c.number}", c.screen.state.lower(), c.fidelity,
                         "; ".join(c.reasons)] for c in report.not_feasible))
    lines += ["## Notes", ""] + [f"- {_md(n)}" for n in report.notes] + [""]
    return "\n".join(lines)
