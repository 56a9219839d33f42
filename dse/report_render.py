"""The report rendered: a self-contained HTML page, Markdown, CSV and JSON."""

from __future__ import annotations

import csv
import html
import io
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from dse.report import Configuration, Measurement, StudyReport, _fmt, envelope, setting_text
from dse.report_figures import Figure, figures
from dse.report_groups import (MAX_CARDS, discrepancies, overlap_figure, pareto_groups,
                               ranked_pareto)
from dse.report_pairs import left_out_text, pairs_figure

# ---------------------------------------------------------------------------------------------
# Formatting helpers

def _json_safe(x: Any) -> Any:
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    if isinstance(x, (str, int, bool)) or x is None:
        return x
    return str(x)


def _param_diff(report: StudyReport, c: Configuration) -> list[tuple[str, Any, Any, bool]]:
    """(name, value, baseline value, changed) for each parameter of `c`."""
    base = report.baseline
    out = []
    for name in sorted(c.params):
        bv = base.params.get(name) if base is not None else None
        changed = base is not None and (name not in base.params or bv != c.params[name])
        out.append((name, c.params[name], bv, changed))
    return out


@dataclass(frozen=True)
class _MetricRow:
    metric: str
    screen: float | None
    envelope: tuple[float, float] | None
    confirm: float | None
    confirm_envelope: tuple[float, float] | None
    baseline: float | None


def _metric_rows(report: StudyReport, c: Configuration) -> tuple[list[str], list[_MetricRow]]:
    """A card's metric table: the column heads and, per headline metric, the screen value, its
    envelope, the confirmation value and the baseline's screen value (columns only when some
    row has them)."""
    base = report.baseline if report.baseline is not c else None
    rows = []
    for name in report.headline_metrics(c):
        v = c.screen.value_of(name)
        cv = c.confirm.value_of(name) if c.confirmed else None
        if v is None and cv is None:
            continue
        rows.append(_MetricRow(
            name, v, envelope(name, v, c.screen.relative_uncertainty) if v is not None else None,
            cv, c.confirm.envelopes.get(name) if c.confirmed else None,
            base.screen.value_of(name) if base is not None else None))
    head = ["metric", "screen", "envelope"]
    if any(r.confirm is not None for r in rows):
        head.append("confirm")
    if any(r.confirm_envelope is not None for r in rows):
        head.append("confirm envelope")
    if any(r.baseline is not None for r in rows):
        head.append(f"baseline #{base.number}")
    return head, rows


def _metric_cells(head: list[str], r: _MetricRow) -> list[Any]:
    cells: list[Any] = [r.metric, r.screen, _env_text(r.envelope)]
    if "confirm" in head:
        cells.append(r.confirm)
    if "confirm envelope" in head:
        cells.append(_env_text(r.confirm_envelope))
    if len(head) > len(cells):
        cells.append(r.baseline)
    return cells


def _env_text(env: tuple[float, float] | None) -> str:
    return f"{_fmt(env[0])} – {_fmt(env[1])}" if env else ""


def _overlap_sentence(c: Configuration, overlaps: list[dict[str, Any]]) -> str | None:
    """How c's envelope relates to the other Pareto configurations', grouped."""
    full, none, partial = [], [], []
    for o in overlaps:
        if c.number not in (o["a"], o["b"]):
            continue
        other = f"#{o['b'] if o['a'] == c.number else o['a']}"
        if not o["separate"]:
            full.append(other)
        elif not o["overlapping"]:
            none.append(other)
        else:
            partial.append(f"{other}'s on {', '.join(o['overlapping'])} only")
    parts = ([f"overlaps those of {', '.join(full)} on every objective"] if full else []) \
        + ([f"overlaps {'; '.join(partial)}"] if partial else []) \
        + ([f"is apart from those of {', '.join(none)}"] if none else [])
    return "; ".join(parts) if parts else None


def _fidelity_text(c: Configuration) -> str:
    s = f"screen (trial #{c.screen.number})"
    if c.confirm is None:
        return s
    state = "" if c.confirm.complete else f", {c.confirm.state.lower()}"
    rank = f", rank {c.confirm_rank} among the confirmed" if c.confirm_rank else ""
    return f"{s}; confirm (trial #{c.confirm.number} of {c.confirm.study_name}{state}{rank})"


def _profile_text(m: Measurement) -> str | None:
    if m.profile is None and m.relative_uncertainty is None:
        return None
    label = {True: "calibrated", False: "uncalibrated reference profile"}.get(m.calibrated, "")
    bits = [b for b in (label, f"±{m.relative_uncertainty:.0%}"
                        if m.relative_uncertainty else "") if b]
    return f"{m.profile or 'profile'}" + (f" ({', '.join(bits)})" if bits else "")


def _explanation_parts(c: Configuration) -> tuple[str | None, str | None, list[str]]:
    """(bottleneck, sentences, assumptions) of the most trusted run's explanation."""
    e = c.explanation or {}
    bottleneck = str(e["bottleneck"]).replace("_", " ") if e.get("bottleneck") else None
    s = e.get("sentences")
    sentences = (" ".join(map(str, s)) if isinstance(s, list) else str(s)) if s else None
    if sentences and c.confirmed and c.confirm.explanation:
        sentences = f"At confirm fidelity: {sentences}"
    return bottleneck, sentences, [str(a) for a in e.get("assumptions") or []]


def _summary_lines(report: StudyReport) -> tuple[str, str]:
    objectives = ", ".join(f"{o.metric} ({o.direction})" for o in report.objectives)
    slos = ", ".join(str(c) for c in report.constraints) or "none"
    n = report.counts()
    return (f"Objectives: {objectives}. SLOs: {slos}.",
            f"{n['trials']} trials, {n['feasible']} feasible, {n['pareto']} in the Pareto set, "
            f"{n['confirmed']} confirmed.")


# ---------------------------------------------------------------------------------------------
# HTML

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;
max-width:1200px;padding:0 1rem;color:#1d2330;line-height:1.4}
h1{font-size:1.6rem}h2{margin-top:2.2rem;border-bottom:1px solid #ccd;padding-bottom:.2rem}
table{border-collapse:collapse;margin:.5rem 0;font-size:.9rem}
td,th{border:1px solid #d5d9e0;padding:.25rem .5rem;text-align:left;vertical-align:top}
th{background:#f1f3f7}td.num{text-align:right;font-variant-numeric:tabular-nums}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(540px,1fr));gap:1rem}
.card{border:1px solid #c5ccd8;border-radius:6px;padding:.8rem 1rem;background:#fbfcfe;overflow-x:auto;min-width:0}
.card h3{margin:.1rem 0 .4rem}.changed{font-weight:600;color:#8a3b00}
.badge{display:inline-block;border-radius:4px;padding:0 .4rem;font-size:.8rem;
background:#e3e8f2;margin-right:.3rem}.badge.confirm{background:#d7f0dc}
.note{color:#555;font-size:.88rem}.bad{color:#a00}
.decision{border:2px solid #2a6f3a;border-radius:6px;padding:.4rem 1rem;background:#f3fbf4}
.decision h2{border:0;margin-top:.4rem}pre{white-space:pre-wrap;background:#eef1f5;padding:.5rem}
"""


def _e(x: Any) -> str:
    """Escaped HTML text of a value (numbers formatted)."""
    return html.escape(x if isinstance(x, str) else _fmt(x), quote=True)


def _table(head: Sequence[str], rows: Iterable[Sequence[str]], num: Sequence[bool] = ()) -> str:
    """An HTML table; `rows` hold ready (escaped) cell HTML, `num` marks right-aligned columns."""
    out = ["<table><thead><tr>", *(f"<th>{_e(h)}</th>" for h in head), "</tr></thead><tbody>"]
    for r in rows:
        out.append("<tr>" + "".join(
            f'<td{" class=num" if i < len(num) and num[i] else ""}>{cell}</td>'
            for i, cell in enumerate(r)) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _card_html(report: StudyReport, c: Configuration, overlaps: list[dict[str, Any]], *,
               also: Sequence[Configuration] = (), flags: Sequence[str] | None = None) -> str:
    badges = [f'<span class="badge">screen #{c.screen.number}</span>']
    if c.confirm is not None:
        cls = "badge confirm" if c.confirm.complete else "badge"
        state = "" if c.confirm.complete else " " + c.confirm.state.lower()
        badges.append(f'<span class="{cls}">confirm #{c.confirm.number}{_e(state)}</span>')
    if c.baseline:
        badges.append('<span class="badge">baseline</span>')
    parts = [f'<div class="card" id="trial-{c.number}"><h3>Trial #{c.number}</h3>',
             "<div>" + "".join(badges) + "</div>",
             f"<p>Measured at: {_e(_fidelity_text(c))}.</p>"]
    prof = _profile_text(c.screen)
    if prof:
        parts.append(f'<p class="note">Profile: {_e(prof)}</p>')

    diff = _param_diff(report, c)
    if diff:
        has_base = report.baseline is not None and report.baseline is not c
        rows = []
        for name, v, bv, changed in diff:
            wrap = (lambda s: f'<span class="changed">{s}</span>') if changed else (lambda s: s)
            rows.append([wrap(_e(name)), wrap(_e(setting_text(v)))]
                        + ([_e(setting_text(bv)) if bv is not None else "—"] if has_base
                           else []))
        head = ["parameter", "value"] + ([f"baseline #{report.baseline.number}"]
                                         if has_base else [])
        parts.append("<h4>Parameters</h4>" + _table(head, rows))

    head, mrows = _metric_rows(report, c)
    parts.append("<h4>Metrics</h4>" + _table(
        head, ([_e(x) for x in _metric_cells(head, r)] for r in mrows),
        [False] + [True] * (len(head) - 1)))
    ov = _overlap_sentence(c, overlaps)
    if ov:
        parts.append(f'<p class="note">Its envelope {_e(ov)}.</p>')
    chance = _chance_text(report, c)
    if chance:
        parts.append(f'<p class="note">{_e(chance)}</p>')
    if also:
        parts.append(f'<p class="note">{ALSO} '
                     + ", ".join(f'#{o.number} ({_e(_params_text(o))})' for o in also)
                     + ".</p>")
    for flag in flags or ():
        parts.append(f'<p class="note bad">{_e(flag)}.</p>')

    bottleneck, sentences, assumptions = _explanation_parts(c)
    measured = report.causes.get(c.number, ())
    if measured:
        parts.append("<p><b>Measured by intervention:</b></p><ul>"
                     + "".join(f"<li>{_e(x)}</li>" for x in measured) + "</ul>")
    if bottleneck:
        parts.append(f"<p><b>Limited by:</b> {_e(bottleneck)}</p>")
    if sentences:
        parts.append(f"<p>{_e(sentences)}</p>")
    if assumptions:
        parts.append("<details><summary>Assumptions</summary><ul>"
                     + "".join(f"<li>{_e(a)}</li>" for a in assumptions) + "</ul></details>")
    if c.confirm is not None and not c.confirm.complete:
        parts.append(f'<p class="note bad">Confirmation run {_e(c.confirm.state.lower())}: '
                     f'{_e("; ".join(c.confirm.reasons))}</p>')
    parts.append("</div>")
    return "".join(parts)


ALSO = "Not told apart from it on any objective, also:"
"""What a card says before the configurations it holds besides its first."""


def _chance_text(report: StudyReport, c: Configuration) -> str | None:
    """The card's standing in the pairwise matrix: its mean chance of doing better than the
    other compared Pareto configurations on the first objective (what orders the cards)."""
    pairs = report.pairs
    if pairs is None or c.number not in pairs:
        return None
    among = [x.number for x in report.pareto if x.number in pairs]
    score = pairs.score(c.number, among)
    if score is None:
        return None
    return (f"Mean chance of doing better than the other {len(among) - 1} compared Pareto "
            f"configurations on {pairs.metrics[0]}, over {pairs.draws} draws of the step-time "
            f"errors at the {pairs.fidelity} fidelity: {score:.0%}.")


def _params_text(c: Configuration) -> str:
    return ", ".join(f"{k} = {v}" for k, v in c.params.items())


def _confirmed_rows(report: StudyReport) -> list[list[Any]]:
    """trial, screen rank, confirm rank, state, confirm values..., verdict."""
    rows = []
    for c in report.confirmed:
        m = c.confirm
        vals = list(m.values) if m.values is not None else [None] * len(report.objectives)
        verdict = "feasible" if c.feasible else "; ".join(c.reasons) or "infeasible"
        rows.append([f"#{c.number}", c.rank, c.confirm_rank, m.state.lower(), *vals, verdict])
    return rows


def _recommendation_html(report: StudyReport) -> list[str]:
    """The decision, first on the page: the recommended configuration, why, its margins, its
    launch line, its headroom and the runner-up; what limits it folds open below."""
    r = report.recommendation
    if r is None:
        return ['<section class="decision" id="recommendation"><h2>Recommendation</h2>'
                f'<p class="bad">{_e(report.no_recommendation())}</p>'
                "</section>"]
    lines = r.lines()
    margins = next(x for x in lines if x.startswith("Margins to the SLOs: "))
    slos = next((x for x in lines if x.startswith("The study declares no SLO")), None)
    out = [f"<h2>{_e(lines[0])}</h2>", f"<p>{_e(r.why)}</p>"]
    if slos:
        out.append(f"<p>{_e(slos)}</p>")
    out.append(f'<p class="margins">{_e(margins)}</p>')
    if r.launch:
        out.append(f'<pre class="launch">{_e(r.launch)}</pre>')
    elif r.launch_error:
        out.append(f"<p>No launch command: {_e(r.launch_error)}</p>")
    out += [f"<p>{_e(x)}</p>" for x in (r.headroom, r.trade_off) if x]
    if r.causes:
        out.append("<details><summary>What limits it (each resource relaxed and re-run)"
                   "</summary>" + "".join(f"<p>{_e(x)}</p>" for x in r.causes) + "</details>")
    return ['<section class="decision" id="recommendation">' + "".join(out) + "</section>"]


def render_html(report: StudyReport) -> str:
    """The self-contained page: plotly.js is inlined once, so it opens offline."""
    from plotly.offline import get_plotlyjs

    names = [o.metric for o in report.objectives]
    overlaps = report.envelope_overlaps()
    line1, line2 = _summary_lines(report)
    out = ['<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
           f"<title>{_e(report.study_name)}: study report</title>",
           f"<style>{_CSS}</style>",
           f'<script type="text/javascript">{get_plotlyjs()}</script></head><body>',
           f"<h1>Study {_e(report.study_name)}</h1>", *_recommendation_html(report),
           *([f'<section id="serving"><h2>Aggregated against disaggregated serving</h2>'
              f"<p>{_e(report.serving.sentence())}</p></section>"]
             if report.serving is not None else []),
           f"<p>{_e(line1)}</p>", f"<p>{_e(line2)}</p>",
           f'<p class="note">Storage {_e(report.storage)} · generated {_e(report.generated_at)}'
           "</p>"]

    def fig_html(f: Figure) -> str:
        body = (f.figure.to_html(full_html=False, include_plotlyjs=False,
                                 default_height=f.figure.layout.height or 480,
                                 config={"displaylogo": False}) if f.figure is not None else "")
        note = f'<p class="note">{_e(f.note)}</p>' if f.note else ""
        return f"<section><h3>{_e(f.title)}</h3>{note}{body}</section>"

    figs = figures(report)
    front = [f for f in figs
             if f.title.startswith("Pareto front") or f.title == "Objective history"]
    out.append("<h2>Pareto front</h2>")
    out += [fig_html(f) for f in front]

    groups = pareto_groups(report)
    flags = discrepancies(report)
    out.append(f"<h2>Pareto configurations ({len(report.pareto)}, {len(groups)} told "
               f"apart)</h2>")
    if report.pareto:
        out.append('<div class="cards">')
        out += [_card_html(report, g[0], overlaps, also=g[1:], flags=flags.get(g[0].number))
                for g in groups[:MAX_CARDS]]
        out.append("</div>")
        rest = [c for g in groups[MAX_CARDS:] for c in g]
        if rest:
            out.append(f"<h3>More Pareto configurations ({len(rest)})</h3>")
            out.append(_table(["trial", *names], (
                [f"#{c.number}", *(_e(v) for v in c.values)] for c in rest),
                [False] + [True] * len(names)))
    else:
        out.append("<p>No feasible configuration: there is no Pareto set.</p>")
    pairs = report.pairs
    matrix = (pairs_figure(pairs, [c.number for c in ranked_pareto(report)])
              if pairs is not None else None)
    heat = overlap_figure(report) if matrix is None else None
    if matrix is not None:
        out.append(fig_html(Figure(
            "Chance of doing better, pairwise", matrix,
            f"Per pair of Pareto configurations (in the cards' order), the chance that the row's "
            f"does better than the column's over {pairs.draws} draws of the step-time errors, "
            f"shared by those on one profile, at the {pairs.fidelity} fidelity; choose the "
            "objective above the plot. Near 50% the model's own error cannot order the two."
            + (f" {left_out_text(pairs)}." if pairs.left_out else ""))))
    if heat is not None:
        out.append(fig_html(Figure(
            "Envelope overlaps between Pareto configurations", heat,
            "Per pair, how many objectives' envelopes overlap: at the maximum the model's own "
            "error cannot order the two; at 0 every objective separates them.")))
    if report.confirmed:
        out.append(f"<h2>Confirmed configurations ({len(report.confirmed)})</h2>")
        out.append(_table(["trial", "rank", "confirm rank", "state", *names, "verdict"],
                          ([_e(x) for x in row] for row in _confirmed_rows(report)),
                          [False, True, True, False] + [True] * len(names)))

    out.append("<h2>Search</h2>")
    out += [fig_html(f) for f in figs if f not in front]

    params = sorted({p for c in report.configurations for p in c.params})
    out.append(f"<h2>Feasible configurations ({len(report.feasible)})</h2>")
    out.append(_table(["trial", "rank", "fidelity", *names, *params], (
        [f'<a href="#trial-{c.number}">#{c.number}</a>' if c.rank == 1 else f"#{c.number}",
         _e(c.rank), _e(c.fidelity), *(_e(v) for v in c.values),
         *(_e(c.params.get(p, "")) for p in params)] for c in report.feasible),
        [False, True, False] + [True] * len(names)))

    out.append(f"<h2>Infeasible and failed configurations ({len(report.not_feasible)})</h2>")
    if report.not_feasible:
        out.append(_table(["trial", "state", "fidelity", "reasons", *params], (
            [f"#{c.number}", _e(c.screen.state.lower()), _e(c.fidelity),
             "<br>".join(_e(r) for r in c.reasons), *(_e(c.params.get(p, "")) for p in params)]
            for c in report.not_feasible)))
    else:
        out.append("<p>None.</p>")

    out.append("<h2>Notes</h2><ul>" + "".join(f"<li>{_e(n)}</li>" for n in report.notes)
               + "</ul></body></html>")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# CSV and JSON

def render_csv(report: StudyReport) -> str:
    """One row per trial of the study: state, fidelity, ranks, feasibility, params, values,
    metrics and reasons.

    Columns follow Optuna's trials_dataframe naming: params_<name>, values_<objective> (screen),
    metrics_<name> (screen); confirm_<objective> holds a confirmation run's values.
    """
    names = [o.metric for o in report.objectives]
    params = sorted({p for c in report.configurations for p in c.params})
    metrics = sorted({k for c in report.configurations for k in c.screen.metrics})
    head = (["number", "state", "fidelity", "rank", "confirm_rank", "feasible", "baseline",
             "confirm_trial"] + [f"params_{p}" for p in params]
            + [f"values_{n}" for n in names] + [f"confirm_{n}" for n in names]
            + [f"metrics_{k}" for k in metrics] + ["reasons"])

    def nums(values: tuple[float, ...] | None) -> list[str]:
        return [repr(v) for v in values] if values is not None else [""] * len(names)

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(head)
    for c in report.configurations:
        w.writerow([c.number, c.screen.state, c.fidelity, c.rank or "", c.confirm_rank or "",
                    c.feasible, c.baseline, c.confirm.number if c.confirm is not None else ""]
                   + [c.params.get(p, "") for p in params]
                   + nums(c.values) + nums(c.confirm.values if c.confirmed else None)
                   + [repr(c.screen.metrics[k]) if k in c.screen.metrics else "" for k in metrics]
                   + ["; ".join(c.reasons)])
    return buf.getvalue()


def report_json(report: StudyReport) -> dict[str, Any]:
    """Everything in the report as plain data (non-finite numbers become null)."""
    objective_names = [o.metric for o in report.objectives]
    configs = []
    for c in report.configurations:
        envs = {}
        for name in report.headline_metrics(c):
            v = c.screen.value_of(name)
            env = envelope(name, v, c.screen.relative_uncertainty) if v is not None else None
            if env is not None:
                envs[name] = list(env)
        configs.append({
            "number": c.number, "rank": c.rank, "confirm_rank": c.confirm_rank,
            "feasible": c.feasible, "baseline": c.baseline, "state": c.screen.state,
            "fidelity": c.fidelity, "params": c.params,
            "values": dict(zip(objective_names, c.values)) if c.values is not None else None,
            "confirm_values": dict(zip(objective_names, c.confirm.values))
            if c.confirmed else None,
            "confirm_envelopes": {k: list(v) for k, v in c.confirm.envelopes.items()}
            if c.confirmed else None,
            "envelopes": envs, "reasons": list(c.reasons), "explanation": c.explanation,
            "screen": c.screen.as_dict(),
            "confirm": c.confirm.as_dict() if c.confirm is not None else None,
        })
    return _json_safe({
        "study": report.study_name, "storage": report.storage,
        "generated_at": report.generated_at,
        "objectives": [{"metric": o.metric, "direction": o.direction} for o in report.objectives],
        "constraints": [{"metric": c.metric, "op": c.op, "value": c.value, "text": str(c)}
                        for c in report.constraints],
        "counts": report.counts(), "pareto": [c.number for c in report.pareto],
        "hypervolume_reference_point": list(report.reference_point)
        if report.reference_point else None,
        "envelope_overlaps": report.envelope_overlaps(), "notes": list(report.notes),
        "recommendation": (report.recommendation.as_dict()
                           if report.recommendation is not None else None),
        "causes": {str(k): list(v) for k, v in report.causes.items()},
        "pairwise": report.pairs.as_dict() if report.pairs is not None else None,
        "serving_comparison": (report.serving.as_dict() if report.serving is not None
                               else None),
        "trials": configs,
    })



def render_markdown(report: StudyReport) -> str:
    """The report without plots, for terminals, pull requests and wikis (`dse.report_markdown`)."""
    from dse.report_markdown import render_markdown as render

    return render(report)
