"""Searched parameters that cannot change a trial's result at the fidelity its stage runs: a
setting only the packet fabric reads, searched while a stage runs on the flow or analytical
fabric, gives that stage the same result whatever its value (see `simcore.fabric.fidelity`).

A study screens at one fidelity and may confirm at another (`fidelity.screen`, `fidelity.confirm`
overrides on the base). The report lists, per such parameter, the stages and fabrics at which it
had no effect; `dse search` refuses a parameter that has no effect at every stage, since every
trial spent on its values would be wasted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dse.space import CategoricalParam, apply
from simcore.cluster.config import FabricConfig, backends_ignoring_path, why_ignored
from simcore.errors import ConfigError

if TYPE_CHECKING:
    from dse.study import StudyConfig

BACKEND_PATH = "cluster.fabric.backend"


def stage_backends(study: StudyConfig) -> dict[str, tuple[str, ...]]:
    """The fabric backends each stage of `study` runs its trials on, {"screen": (...),
    "confirm": (...)} (no "confirm" without a confirmation stage); {} when the base has no
    cluster section. A searched backend gives every choice."""
    searched = study.space.parameters.get(BACKEND_PATH)
    stages: dict[str, dict[str, Any]] = {"screen": study.fidelity.screen}
    if study.fidelity.confirm is not None:
        stages["confirm"] = study.fidelity.confirm
    out: dict[str, tuple[str, ...]] = {}
    for stage, overrides in stages.items():
        cluster = apply(study.base, dict(overrides)).get("cluster")
        if not isinstance(cluster, dict):
            continue
        if isinstance(searched, CategoricalParam):
            out[stage] = tuple(str(c) for c in searched.choices)
        else:
            fabric = cluster.get("fabric") or {}
            out[stage] = (str(fabric.get("backend",
                                         FabricConfig.model_fields["backend"].default)),)
    return out


def inert_parameters(study: StudyConfig) -> dict[str, list[tuple[str, str]]]:
    """Searched parameter -> the (stage, backend) pairs at which it has no effect, for the
    parameters that have none somewhere, in space order."""
    backends = stage_backends(study)
    out: dict[str, list[tuple[str, str]]] = {}
    for path in study.space.parameters:
        ignoring = backends_ignoring_path(path)
        pairs = [(stage, b) for stage, bs in backends.items() for b in bs if b in ignoring]
        if pairs:
            out[path] = pairs
    return out


def _where(pairs: list[tuple[str, str]]) -> str:
    stages: dict[str, list[str]] = {}
    for stage, backend in pairs:
        stages.setdefault(stage, []).append(backend)
    return "; ".join(f"{'screening' if s == 'screen' else 'confirmation'} on the "
                     f"{' or '.join(bs)} fabric" for s, bs in stages.items())


def inert_notes(study: StudyConfig) -> list[str]:
    """One report note per searched parameter that had no effect at some fidelity."""
    return [f"Searched parameter {path} had no effect at the fidelity of {_where(pairs)} "
            f"({why_ignored(path)}): those trials gave the same result whatever its value."
            for path, pairs in inert_parameters(study).items()]


def check_parameters_have_effect(study: StudyConfig) -> None:
    """Raise ConfigError naming the first searched parameter that has no effect at any stage
    of the study (every trial spent on its values would be wasted)."""
    total = sum(len(bs) for bs in stage_backends(study).values())
    for path, pairs in inert_parameters(study).items():
        if len(pairs) == total:
            raise ConfigError(f"space.parameters.{path}: has no effect at any fidelity this "
                              f"study runs ({_where(pairs)}: {why_ignored(path)}); do not "
                              f"search it, or run a stage on a fabric that reads it")
