"""A search space: parameters named by dotted paths into the simulate config, with conditions.

A space file (YAML) looks like:

    parameters:
      engine.max_num_seqs: {type: int, low: 16, high: 512, log: true}
      engine.max_num_batched_tokens: {type: categorical, choices: [2048, 4096, 8192]}
      parallelism.tensor_parallel_size: {type: categorical, choices: [1, 2, 4, 8]}
      parallelism.enable_expert_parallel: {type: categorical, choices: [false, true], when: moe}
    num_gpus: 8            # optional: TP x PP x DP must equal this; if DP is not a parameter,
                           # each configuration gets DP = num_gpus / (TP x PP)

A parameter's `when` names a condition on the base configuration (`moe`, `dense`, `mla`) under
which it exists at all; otherwise the base value stands.

Aggregated against disaggregated serving is one more dimension, `serving`:

    serving: [aggregated, disaggregated]
    parameters:
      parallelism.tensor_parallel_size: {type: categorical, choices: [2, 4, 8], when: aggregated}
      parallelism.prefill_decode.num_prefill_instances: {type: int, low: 1, high: 4,
                                                         when: disaggregated}
      parallelism.prefill_decode.prefill_tensor_parallel_size: {type: categorical,
                                                                choices: [2, 4, 8],
                                                                when: disaggregated}
      parallelism.prefill_decode.decode_tensor_parallel_size: {type: categorical,
                                                               choices: [4, 8],
                                                               when: disaggregated}
    num_gpus: 16

Each trial first draws `serving` (a categorical parameter of that name), then the parameters
without a serving condition and those whose `when` is the mode drawn. An aggregated trial runs
the base without `parallelism.prefill_decode`; a disaggregated one with it (DP 1). With
`num_gpus`, an aggregated trial derives DP as above, a disaggregated one, unless
`num_decode_instances` is searched, the decode instances as the GPUs the prefill instances
leave over TP x PP of a decode instance; `max_gpus` instead bounds the GPUs from above.
"""

from __future__ import annotations

import copy
import math
import itertools
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator,
                      model_validator)

from simcore.errors import ConfigError, format_validation_error, show

_FROZEN = ConfigDict(extra="forbid", frozen=True)
Condition = Literal["moe", "dense", "mla", "aggregated", "disaggregated"]
SERVING = "serving"
"""The name of the serving-mode parameter (`SearchSpace.serving`)."""
SERVING_MODES = ("aggregated", "disaggregated")
PD_PATH = "parallelism.prefill_decode"
DECODE_COUNT_PATH = "parallelism.prefill_decode.num_decode_instances"


class IntParam(BaseModel):
    """An integer in [low, high], optionally on a log scale or a step grid."""

    model_config = _FROZEN
    type: Literal["int"] = Field(description="Integer parameter.")
    low: int = Field(description="Smallest value.")
    high: int = Field(description="Largest value.")
    step: int = Field(1, ge=1, description="Grid step from low.")
    log: bool = Field(False, description="Sample on a log scale (step must be 1).")
    when: Condition | None = Field(None, description="Exists only for models of this kind.")

    @model_validator(mode="after")
    def _check(self) -> "IntParam":
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) is below low ({self.low})")
        if self.log and (self.low < 1 or self.step != 1):
            raise ValueError("a log-scale int needs low >= 1 and step 1")
        return self


def on_grid(value: float, low: float, step: float) -> bool:
    """Whether `value` is on the grid of `step` from `low`, as Optuna's FloatDistribution judges
    it (within 1e-8 of a step)."""
    k = (value - low) / step
    return abs(k - round(k)) < 1e-8


class FloatParam(BaseModel):
    """A real number in [low, high], optionally on a log scale or a step grid."""

    model_config = _FROZEN
    type: Literal["float"] = Field(description="Real parameter.")
    low: float = Field(description="Smallest value.")
    high: float = Field(description="Largest value.")
    step: float | None = Field(None, gt=0, description="Grid step from low (None: continuous).")
    log: bool = Field(False, description="Sample on a log scale (no step).")
    when: Condition | None = Field(None, description="Exists only for models of this kind.")

    @model_validator(mode="after")
    def _check(self) -> "FloatParam":
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) is below low ({self.low})")
        if self.log and (self.low <= 0 or self.step is not None):
            raise ValueError("a log-scale float needs low > 0 and no step")
        if self.step is not None and not on_grid(self.high, self.low, self.step):
            raise ValueError(f"step ({self.step:g}) does not divide high - low "
                             f"({self.high:g} - {self.low:g}): the grid would stop short of high")
        return self


class CategoricalParam(BaseModel):
    """One of a list of values (numbers, strings, booleans or null)."""

    model_config = _FROZEN
    type: Literal["categorical"] = Field(description="Categorical parameter.")
    choices: tuple[int | float | str | bool | None, ...] = Field(min_length=1,
                                                                 description="The values.")
    when: Condition | None = Field(None, description="Exists only for models of this kind.")

    @field_validator("choices", mode="before")
    @classmethod
    def _single_values(cls, value: Any) -> Any:
        # Optuna's suggest_categorical takes None, bool, int, float and str only.
        if isinstance(value, (list, tuple)):
            nested = [v for v in value if isinstance(v, (list, tuple, dict))]
            if nested:
                raise ValueError(f"each choice must be a single number, text, true/false or "
                                 f"null (Optuna's categorical parameters take no lists or "
                                 f"mappings), got {show(nested[0])}")
        return value


Param = Annotated[IntParam | FloatParam | CategoricalParam, Field(discriminator="type")]


class SearchSpace(BaseModel):
    """The parameters a study may vary, by dotted config path."""

    model_config = _FROZEN
    parameters: dict[str, Param] = Field(min_length=1, description="Dotted config path -> "
                                         "parameter declaration.")
    num_gpus: int | None = Field(None, ge=1, description="If set, TP x PP x DP must equal this "
                                 "(every configuration uses the whole cluster); when DP is not a "
                                 "parameter it is derived as num_gpus / (TP x PP).")
    max_gpus: int | None = Field(None, ge=1, description="If set, a configuration may use at "
                                 "most this many GPUs (nothing is derived from it).")
    serving: tuple[Literal["aggregated", "disaggregated"], ...] | None = Field(
        None, min_length=1, description="Search the serving mode too: aggregated (every "
        "instance runs prompts and generates) and/or disaggregated (prefill and decode "
        "instances, parallelism.prefill_decode; needs a cluster section). Parameters with "
        "`when: aggregated` or `when: disaggregated` exist only in trials of that mode.")

    @model_validator(mode="after")
    def _check_serving(self) -> "SearchSpace":
        if self.serving is not None and len(set(self.serving)) != len(self.serving):
            raise ValueError(f"serving: a mode is listed twice ({list(self.serving)})")
        for path, p in self.parameters.items():
            if p.when in SERVING_MODES and p.when not in (self.serving or ()):
                raise ValueError(f"parameters.{path}: when: {p.when} needs serving to list "
                                 f"{p.when}")
            if (self.serving is not None and path.startswith(PD_PATH + ".")
                    and p.when != "disaggregated"):
                raise ValueError(f"parameters.{path}: with serving searched, a prefill/decode "
                                 "parameter needs when: disaggregated")
        if self.num_gpus is not None and self.max_gpus is not None:
            raise ValueError("set num_gpus (exactly) or max_gpus (at most), not both")
        return self

    def active(self, base: dict) -> dict[str, Param]:
        """The parameters that exist for this base configuration (conditions resolved); with
        `serving`, the mode parameter first and every mode's parameters."""
        kinds = model_kinds(base) | set(self.serving or ())
        out: dict[str, Param] = {}
        if self.serving is not None:
            out[SERVING] = CategoricalParam(type="categorical", choices=self.serving)
        out.update({k: p for k, p in self.parameters.items()
                    if p.when is None or p.when in kinds})
        return out

    def suggest(self, trial, base: dict) -> dict[str, Any]:
        """Ask an Optuna trial for every active parameter; returns path -> value. With
        `serving`, the mode is asked first and only its parameters after it."""
        values: dict[str, Any] = {}
        mode = None
        for path, p in self.active(base).items():
            if path == SERVING:
                mode = values[path] = trial.suggest_categorical(path, list(p.choices))
                continue
            if p.when in SERVING_MODES and p.when != mode:
                continue
            if isinstance(p, IntParam):
                values[path] = trial.suggest_int(path, p.low, p.high, step=p.step, log=p.log)
            elif isinstance(p, FloatParam):
                values[path] = trial.suggest_float(path, p.low, p.high, step=p.step, log=p.log)
            else:
                values[path] = trial.suggest_categorical(path, list(p.choices))
        return values

    def grid(self, base: dict) -> dict[str, list]:
        """Every value of every active parameter (for the grid sampler); floats need a step."""
        out: dict[str, list] = {}
        for path, p in self.active(base).items():
            if isinstance(p, CategoricalParam):
                out[path] = list(p.choices)
            elif isinstance(p, IntParam):
                if p.log:
                    # Doublings from low, and high itself where they stop short of it.
                    vals, v = [], p.low
                    while v <= p.high:
                        vals.append(v)
                        v *= 2
                    out[path] = vals + ([p.high] if vals[-1] != p.high else [])
                else:
                    out[path] = list(range(p.low, p.high + 1, p.step))
            else:
                if p.step is None:
                    raise ConfigError(f"space.parameters.{path}: the grid sampler needs a step "
                                      f"for float parameters")
                n = int(round((p.high - p.low) / p.step))
                out[path] = [p.low + i * p.step for i in range(n + 1)]
        return out


def grid_points(space: SearchSpace, base: dict) -> list[dict[str, Any]]:
    """Every point of the grid (`SearchSpace.grid`), each a mapping path -> value; with
    `serving`, each mode's own grid (its parameters and those of no mode) one after the other,
    not the product of both modes' parameters."""
    grid = space.grid(base)
    if space.serving is None:
        names = list(grid)
        return [dict(zip(names, combo)) for combo in itertools.product(*grid.values())]
    out: list[dict[str, Any]] = []
    for mode in space.serving:
        names = [k for k in grid if k != SERVING
                 and (space.parameters[k].when not in SERVING_MODES
                      or space.parameters[k].when == mode)]
        out += [{SERVING: mode, **dict(zip(names, combo))}
                for combo in itertools.product(*(grid[k] for k in names))]
    return out


def model_kinds(base: dict) -> set[str]:
    """Conditions that hold for the base config's model: 'moe' or 'dense', and 'mla'."""
    from simcore.model.config import ModelConfig

    try:
        mc = ModelConfig.model_validate(base.get("model", {}))
        arch = mc.resolve(base.get("base_dir"))
    except (ValidationError, ConfigError):
        return set()
    kinds = {"moe" if arch.is_moe else "dense"}
    if arch.is_mla:
        kinds.add("mla")
    return kinds


def serving_mode(base: dict) -> str:
    """The serving mode of a config mapping: disaggregated if it has prefill_decode."""
    par = base.get("parallelism")
    return ("disaggregated" if isinstance(par, dict) and par.get("prefill_decode") is not None
            else "aggregated")


def apply_serving(base: dict, values: dict[str, Any]) -> tuple[dict, dict[str, Any]]:
    """(base, values) with a `serving` value resolved: an aggregated trial drops the base's
    `parallelism.prefill_decode` and any prefill/decode value; a disaggregated one gets the
    section (DP 1, one replica) and drops a searched DP. Without `serving`, both unchanged."""
    if SERVING not in values:
        return base, values
    values = dict(values)
    mode = values.pop(SERVING)
    if mode not in SERVING_MODES:
        raise ConfigError(f"space.serving: unknown mode {mode!r} (known: "
                          f"{', '.join(SERVING_MODES)})")
    out = copy.deepcopy(base)
    par = out.setdefault("parallelism", {})
    if mode == "aggregated":
        par.pop("prefill_decode", None)
        values = {k: v for k, v in values.items() if not k.startswith(PD_PATH + ".")}
    else:
        if not isinstance(par.get("prefill_decode"), dict):
            par["prefill_decode"] = {}
        par["data_parallel_size"] = 1
        par.pop("num_replicas", None)
        values = {k: v for k, v in values.items()
                  if k not in ("parallelism.data_parallel_size", "parallelism.num_replicas")}
    return out, values


def apply(base: dict, values: dict[str, Any]) -> dict:
    """A copy of the base config mapping with each dotted path set to its value (a `serving`
    value first resolved by `apply_serving`)."""
    base, values = apply_serving(base, values)
    out = copy.deepcopy(base)
    for path, value in values.items():
        node = out
        parts = path.split(".")
        for part in parts[:-1]:
            nxt = node.get(part)
            if nxt is None:
                nxt = node[part] = {}
            elif not isinstance(nxt, dict):
                raise ConfigError(f"space.parameters.{path}: {part} is not a section of the "
                                  f"simulate config")
            node = nxt
        node[parts[-1]] = value
    return out


def check_paths(space: SearchSpace, source: str) -> None:
    """Every parameter path must name a setting of the simulate config.

    Through a union of sections (e.g. the dataset kinds) a name is accepted if any member has it;
    the trial's own validation then says whether it fits the chosen member.
    """
    from simcore.config import SimConfig

    for path in space.parameters:
        models: list[Any] = [SimConfig]
        parts = path.split(".")
        for k, part in enumerate(parts):
            fields = [m.model_fields for m in models if part in m.model_fields]
            if not fields:
                known = sorted({f for m in models for f in m.model_fields})
                raise ConfigError(f"{source}: parameters.{path}: {part!r} is not a setting "
                                  f"there (known: {', '.join(known)})")
            models = [m for f in fields for m in _pydantic_models_of(f[part].annotation)]
            if not models and k < len(parts) - 1:
                if any(_takes_mapping(f[part].annotation) for f in fields):
                    break       # a free-form mapping (e.g. speculative_config): checked per trial
                raise ConfigError(f"{source}: parameters.{path}: {part!r} is a single value, "
                                  f"not a section")
            if k == len(parts) - 1:
                infos = [f[part] for f in fields]
                if all(_is_section(i.annotation) for i in infos):
                    settings = ", ".join(sorted({n for m in models for n in m.model_fields}))
                    raise ConfigError(f"{source}: parameters.{path}: {part!r} is a section of "
                                      f"settings, not one setting (search one of them: "
                                      f"{settings})")
                _check_values(path, space.parameters[path], infos, source)


def _check_values(path: str, param: Any, infos: list[Any], source: str) -> None:
    """Refuse a value of the parameter at `path` (a categorical choice, or a range's low or high
    end) that the setting itself refuses whatever the other settings are (its type, its bounds,
    its allowed names), so that no trial is spent on it; `infos` are the setting's declarations
    (several through a union of sections: a value any of them takes passes)."""
    # (the value as the message names it, the value, what the message advises)
    unrunnable = "no trial could run it"
    if isinstance(param, CategoricalParam):
        values = [(f"the choice {show(v)}", v, unrunnable) for v in param.choices]
    else:
        values = [(f"the low end {show(param.low)}", param.low, unrunnable),
                  (f"the high end {show(param.high)}", param.high, unrunnable)]
        if isinstance(param, FloatParam) and param.high > param.low and (
                param.step is None or not float(param.step).is_integer()):
            # A value between the ends, off any whole number: a setting that takes whole
            # numbers only refuses most of what a float range draws.
            inside = round(param.low + (param.high - param.low) / math.pi, 4)
            values.append((f"a value inside the float range, {show(inside)},", inside,
                           "search it with type: int"))
    for what, value, advice in values:
        reasons = []
        for info in infos:
            try:
                TypeAdapter(Annotated[info.annotation, info]).validate_python(value)
                break
            except ValidationError as err:
                reasons.append(err.errors()[0]["msg"])
        else:
            raise ConfigError(f"{source}: parameters.{path}: {what} is refused by the setting "
                              f"({reasons[0]}); {advice}")


def _is_section(ann: Any) -> bool:
    """Whether a declaration takes a section (a model, or null) and no single value."""
    if ann is type(None):
        return True
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return True
    args = getattr(ann, "__args__", None)
    if not args or getattr(ann, "__origin__", None) is Literal:
        return False
    if getattr(ann, "__metadata__", None) is not None:      # Annotated[X, ...]
        return _is_section(args[0])
    return all(_is_section(a) for a in args) and any(a is not type(None) for a in args)


def _takes_mapping(ann: Any) -> bool:
    if ann is Any or ann is dict:
        return True
    if getattr(ann, "__origin__", None) in (dict, Mapping):
        return True
    return any(_takes_mapping(a) for a in getattr(ann, "__args__", ()) or ())


def _pydantic_models_of(ann: Any) -> list[Any]:
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return [ann]
    out: list[Any] = []
    for arg in getattr(ann, "__args__", ()) or ():
        out.extend(_pydantic_models_of(arg))
    return out


def load_space(data: Any, source: str, base_dir: Path | None = None) -> SearchSpace:
    """Validate an inline mapping, or load a space file when given a path string."""
    from simcore.loading import load_yaml

    if isinstance(data, str):
        path = Path(data)
        if base_dir is not None and not path.is_absolute():
            path = base_dir / path
        try:
            data = load_yaml(path)
        except ConfigError as err:
            raise ConfigError(f"{source}: {err}") from None
        source = str(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a search space must be a mapping with 'parameters'")
    try:
        space = SearchSpace.model_validate(data)
    except ValidationError as err:
        raise ConfigError(f"{source}: {format_validation_error(err, SearchSpace)}") from None
    check_paths(space, source)
    return space
