"""Reading the report's runs from storage: one Optuna trial becomes a `Measurement` (its
metrics, feasibility and the reasons against it, its declared uncertainty and stored envelopes)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dse.report import Measurement, _fmt, _number
from dse.study import Constraint

if TYPE_CHECKING:
    import optuna



def _relative_uncertainty(metrics: dict[str, float]) -> float | None:
    """The step-time uncertainty a run's result declares (`step_time_relative_uncertainty`,
    which every scored trial's metrics carry); None for a trial with no result."""
    return metrics["step_time_relative_uncertainty"] if metrics else None


def _mentions(reasons: Sequence[str], key: str) -> bool:
    """Whether a reason already speaks of this constraint ('p99_tpot_ms <= 50') or metric."""
    metric = key.split()[0] if key.split() else key
    return any(key in r or metric in r for r in reasons)


def named_constraints(trial: optuna.trial.FrozenTrial) -> dict[str, float]:
    """The trial's constraint values by SLO text; the same values stored again as a list for
    optuna-dashboard (which Optuna reads back under the keys "0", "1", ...) are left out."""
    c = trial.constraints
    named = {k: float(v) for k, v in c.items() if not k.isdigit()}
    return named or {k: float(v) for k, v in c.items()}


def measurement(trial: optuna.trial.FrozenTrial, study_name: str,
                 constraints: Sequence[Constraint], default_fidelity: str) -> Measurement:
    a = trial.user_attrs
    metrics = {k: float(v) for k, v in (a.get("metrics") or {}).items()
               if _number(v) is not None}
    summary = {k: float(v) for k, v in (a.get("summary") or {}).items()
               if _number(v) is not None}
    state = trial.state.name
    reasons = [str(r) for r in (a.get("violations") or [])]
    cvalues = named_constraints(trial)
    if state == "COMPLETE":
        feasible = a.get("feasible", True) is not False
        for c in constraints:
            x = metrics.get(c.metric, summary.get(c.metric))
            if x is not None and not c.met(x):
                feasible = False
                if not _mentions(reasons, c.metric):
                    reasons.append(f"{c} not met ({c.metric} = {_fmt(x)})")
        for key, v in cvalues.items():
            if v > 0:
                feasible = False
                if not _mentions(reasons, key):
                    reasons.append(f"constraint {key} violated by {_fmt(v)}")
        if not feasible and not reasons:
            reasons.append("marked infeasible by the runner")
    else:
        feasible = False
        for key in ("infeasible_reason", "failure_reason"):
            if a.get(key):
                reasons.append(str(a[key]))
        if not reasons:
            reasons.append({"RUNNING": "still running, or left running by an interrupted search",
                            "WAITING": "queued, not yet run",
                            "PRUNED": "pruned"}.get(state, "failed (no reason recorded)"))
    expl = a.get("explanation")
    return Measurement(
        study_name=study_name, number=trial.number,
        fidelity=str(a.get("fidelity") or default_fidelity), state=state,
        values=tuple(float(x) for x in trial.values) if trial.values is not None else None,
        metrics=metrics, summary=summary, feasible=feasible,
        reasons=tuple(dict.fromkeys(reasons)), constraint_values=cvalues,
        explanation=expl if isinstance(expl, dict) else None,
        profile=a.get("profile"), calibrated=a.get("calibrated"),
        relative_uncertainty=_relative_uncertainty(metrics),
        envelopes=_envelopes(a.get("envelopes")), envelope_method=a.get("envelope_method"))


def _envelopes(raw: Any) -> dict[str, tuple[float, float]]:
    """A trial's stored envelopes, keeping only well-formed (low, high) pairs."""
    out: dict[str, tuple[float, float]] = {}
    if isinstance(raw, dict):
        for k, v in raw.items():
            if isinstance(v, (list, tuple)) and len(v) == 2 and all(_number(x) is not None
                                                                     for x in v):
                out[str(k)] = (float(v[0]), float(v[1]))
    return out
