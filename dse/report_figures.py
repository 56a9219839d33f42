"""The report's plots: Pareto front, hypervolume history, parallel coordinates, importance."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from itertools import combinations
from typing import TYPE_CHECKING, Any

from dse.report import REFERENCE_MARGIN, StudyReport, _fmt, _optuna_quiet

if TYPE_CHECKING:
    import plotly.graph_objects as go

# ---------------------------------------------------------------------------------------------
# Figures

@dataclass(frozen=True)
class Figure:
    """One plot of the page, or the note saying why it is absent."""

    title: str
    figure: Any | None     # plotly.graph_objects.Figure
    note: str = ""


def _quiet(fn: Callable[[], go.Figure]) -> go.Figure:
    """Run a plotting call without Optuna's log lines and its evaluators' advisory warnings."""
    with _optuna_quiet(), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return fn()


def figures(report: StudyReport) -> list[Figure]:
    """The page's plots: Pareto front, hypervolume history, parallel coordinates, importance."""
    from optuna import visualization as vis

    study = report.view
    names = [o.metric for o in report.objectives]
    n_obj = len(names)
    out: list[Figure] = []
    n_complete = sum(1 for c in report.configurations if c.screen.complete)

    if n_obj == 1:
        out.append(Figure("Objective history",
                          _quiet(lambda: vis.plot_optimization_history(study, target_name=names[0]))
                          if n_complete else None,
                          "One objective: the Pareto set is the best feasible value."))
    elif not n_complete:
        out.append(Figure("Pareto front", None, "No trial completed."))
    elif n_obj in (2, 3):
        out.append(Figure("Pareto front", _quiet(
            lambda: vis.plot_pareto_front(study, target_names=names)),
            "Grey: infeasible configurations; blue: feasible; red ('Best Trial'): the Pareto "
            "set. Shades give the trial number."))
    else:
        for i, j in combinations(range(n_obj), 2):
            out.append(Figure(f"Pareto front: {names[i]} vs {names[j]}", _quiet(
                lambda i=i, j=j: vis.plot_pareto_front(
                    study, target_names=[names[i], names[j]],
                    targets=lambda t: (t.values[i], t.values[j]))),
                "Pareto set over all objectives, projected on two."))

    if n_obj > 1:
        if report.reference_point is None:
            out.append(Figure("Hypervolume history", None, "No feasible configuration."))
        else:
            fig = _quiet(lambda: vis.plot_hypervolume_history(study, report.reference_point))
            ref = ", ".join(f"{n} {_fmt(x)}" for n, x in zip(names, report.reference_point))
            final = fig.data[0].y[-1] if fig.data and len(fig.data[0].y) else 0.0
            out.append(Figure("Hypervolume history", fig,
                              f"Reference point: {ref} (worst feasible values, "
                              f"{REFERENCE_MARGIN:.0%} of the range further out). Final "
                              f"hypervolume {_fmt(float(final))}."))

    params = sorted({p for c in report.configurations for p in c.params})
    for i, o in enumerate(report.objectives):
        title = f"Parallel coordinates: {o.metric}" if n_obj > 1 else "Parallel coordinates"
        if not params or not n_complete:
            out.append(Figure(title, None, "No completed trial with parameters."))
            continue
        out.append(Figure(title, _quiet(lambda i=i, o=o: vis.plot_parallel_coordinate(
            study, target=lambda t: t.values[i], target_name=o.metric)),
            "Dotted lines are infeasible configurations."))

    out.append(_importance_figure(report, params, n_complete))
    return out


_MIN_TRIALS_FOR_IMPORTANCE = 4


def _importance_figure(report: StudyReport, params: list[str], n_complete: int) -> Figure:
    """Optuna's parameter importance per objective, or a note when it cannot be computed.

    The importances are Optuna's (`get_param_importances`); the bars are drawn here so that all
    objectives share one chart.
    """
    import plotly.graph_objects as go
    from optuna.importance import get_param_importances

    title = "Parameter importance"
    if n_complete < _MIN_TRIALS_FOR_IMPORTANCE or not params:
        return Figure(title, None, f"Needs at least {_MIN_TRIALS_FOR_IMPORTANCE} completed "
                      f"trials with varying parameters ({n_complete} completed).")
    fig = go.Figure()
    failed = []
    for i, o in enumerate(report.objectives):
        # Optuna's evaluator ranks parameters for reaching low target values.
        sign = 1.0 if o.direction == "minimize" else -1.0
        try:
            imp = _quiet(lambda i=i, sign=sign: get_param_importances(
                report.view, target=lambda t: sign * t.values[i]))
        except (ValueError, RuntimeError, ZeroDivisionError) as err:
            failed.append(f"{o.metric}: {err}")
            continue
        if not imp:
            failed.append(f"{o.metric}: no parameter varies")
            continue
        names = list(imp)[::-1]
        fig.add_trace(go.Bar(x=[imp[n] for n in names], y=names, orientation="h",
                             name=o.metric))
    if not fig.data:
        return Figure(title, None, "Could not be computed: " + "; ".join(failed))
    fig.update_layout(title="Parameter importance", xaxis_title="importance",
                      barmode="group", height=max(320, 60 + 40 * len(params) * len(fig.data)))
    note = "Optuna's default importance evaluator, per objective (sign-adjusted for maximised " \
           "objectives)."
    if failed:
        note += " Not computed for " + "; ".join(failed) + "."
    return Figure(title, fig, note)
