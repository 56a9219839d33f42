"""The study file: a base configuration, a search space, objectives, SLOs and how to run the search."""

from __future__ import annotations

import re
from pathlib import Path
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dse.space import SearchSpace, load_space
from simcore import metric_catalog
from simcore.config import parse_config
from simcore.errors import ConfigError, away_from_default, format_validation_error
from simcore.loading import load_yaml

_FROZEN = ConfigDict(extra="forbid", frozen=True)
_CONSTRAINT_RE = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*(<=|>=|<|>)\s*([-+0-9.eE]+)\s*$")


class Objective(BaseModel):
    """One metric of the result to optimise."""

    model_config = _FROZEN
    metric: str = Field(description="A numeric key of the simulate result, e.g. p99_ttft_ms, "
                        "output_throughput_per_gpu, output_tokens_per_dollar.")
    direction: Literal["minimize", "maximize"] = Field(description="Which way is better; it "
                                                       "must agree with the metric's own, where "
                                                       "it has one (simcore.metric_catalog).")

    @model_validator(mode="after")
    def _direction_agrees(self) -> "Objective":
        m = metric_catalog.lookup(self.metric)
        if m is not None and m.better not in (None, self.direction):
            side = "lower" if m.better == "minimize" else "higher"
            raise ValueError(f"direction: {self.direction} {self.metric} would search for the "
                             f"worst configurations ({side} {self.metric} is better); use "
                             f"{m.better}")
        return self


class Constraint(BaseModel):
    """An SLO or limit a configuration must meet to count as feasible: `metric op value`."""

    model_config = _FROZEN
    metric: str = Field(description="A numeric key of the simulate result.")
    op: Literal["<=", "<", ">=", ">"] = Field(description="Comparison.")
    value: float = Field(allow_inf_nan=False, description="Threshold (finite).")

    def violation(self, x: float) -> float:
        """Optuna's constraint value: minus the slack (<= 0) when met, the shortfall (> 0) if not."""
        gap = x - self.value if self.op in ("<=", "<") else self.value - x
        if self.met(x):
            return min(gap, 0.0)
        return max(gap, 1e-9)

    def relative_slack(self, x: float) -> float:
        """How far `x` is inside the bound, as a fraction of the bound (negative: outside)."""
        gap = self.value - x if self.op in ("<=", "<") else x - self.value
        return gap / abs(self.value) if self.value else gap

    def met(self, x: float) -> bool:
        return {"<=": x <= self.value, "<": x < self.value, ">=": x >= self.value,
                ">": x > self.value}[self.op]

    def __str__(self) -> str:
        return f"{self.metric} {self.op} {self.value:g}"


class Budget(BaseModel):
    """When the search stops: whichever limit comes first."""

    model_config = _FROZEN
    n_trials: int = Field(40, ge=1, description="Trials to run (the baseline included).")
    timeout_s: float | None = Field(None, gt=0, description="Wall-clock limit of the search; "
                                    "trials running then are finished first.")


class Sampler(BaseModel):
    """Which Optuna sampler proposes configurations."""

    model_config = _FROZEN
    kind: Literal["tpe", "nsga2", "nsga3", "gp", "random", "grid"] = Field(
        "tpe", description="tpe: multivariate TPE (default); nsga2/nsga3: genetic; gp: Gaussian "
        "process (needs torch); random and grid: baselines.")
    seed: int = Field(0, ge=0, le=2**32 - 1, description="Sampler seed: same seed, same trials "
                      "(0 to 2^32 - 1).")
    n_startup_trials: int = Field(10, ge=0, description="tpe/gp: random trials before the model "
                                  "takes over.")
    population_size: int = Field(20, ge=2, description="nsga2/nsga3: population per generation.")

    @model_validator(mode="after")
    def _check_reads(self) -> "Sampler":
        if away_from_default(self, "n_startup_trials") and self.kind not in ("tpe", "gp"):
            raise ValueError(f"n_startup_trials: only read by the tpe and gp samplers, not "
                             f"{self.kind}")
        if away_from_default(self, "population_size") and self.kind not in ("nsga2", "nsga3"):
            raise ValueError(f"population_size: only read by the nsga2 and nsga3 samplers, not "
                             f"{self.kind}")
        return self


class Fidelity(BaseModel):
    """Screen cheaply, then re-run the best candidates at a higher fidelity."""

    model_config = _FROZEN
    screen: dict[str, Any] = Field(default_factory=dict, description="Overrides (dotted paths) "
                                   "applied to every trial, e.g. {workload.num_prompts: 200}.")
    confirm: dict[str, Any] | None = Field(None, description="Overrides for the confirmation "
                                           "re-runs (None: no confirmation stage).")
    confirm_top_k: int = Field(5, ge=1, description="How many of the best screened "
                               "configurations (by non-dominated rank) to re-run.")

    @model_validator(mode="after")
    def _check_confirm(self) -> "Fidelity":
        if away_from_default(self, "confirm_top_k") and self.confirm is None:
            raise ValueError("confirm_top_k: has no effect without confirm (no confirmation "
                             "stage)")
        return self


class Execution(BaseModel):
    """Where trials run."""

    model_config = _FROZEN
    workers: int | None = Field(None, ge=1, description="Trials simulated at once (Ray tasks). "
                               "None: one per CPU this process may use (a local Ray), or the "
                               "CPUs of the cluster at ray_address. With `deterministic`, the "
                               "trials a seed gives depend on it: set it to repeat a search on "
                               "another machine.")
    ray_address: str | None = Field(None, description="Join this Ray cluster (e.g. 'auto' or "
                                    "'ray://host:10001'); None starts a local Ray.")
    trial_timeout_s: float = Field(300, gt=0, description="A trial running longer is stopped "
                                   "and recorded as failed.")
    deterministic: bool = Field(True, description="Ask and tell in batches of `workers`, so the "
                                "same seed gives the same trials whatever the timing.")
    connect_timeout_s: float = Field(10, gt=0, description="With ray_address: how long to wait "
                                     "for the cluster to answer before giving up.")
    ship_to_workers: Literal["files", "files_and_packages", "none"] = Field(
        "files", description="With ray_address, what a Ray runtime_env sends the cluster's "
        "workers (dse/ship.py): files = simcore, dse and the data files the base, a categorical "
        "parameter or a fidelity override names; files_and_packages = also the project's "
        "requirements, pip-installed on each node (Ray needs virtualenv there); none = every "
        "node has the same virtualenv and the files at the same paths.")

    @model_validator(mode="after")
    def _check_cluster_settings(self) -> "Execution":
        if self.ray_address is None:
            inert = sorted({"connect_timeout_s", "ship_to_workers"} & self.model_fields_set)
            if inert:
                raise ValueError(f"{inert[0]} has no effect without ray_address (a local Ray "
                                 f"runs on this machine)")
        return self


class Report(BaseModel):
    """What the search writes at the end."""

    model_config = _FROZEN
    dir: str | None = Field(None, description="Output folder (default: reports/<study name>).")
    formats: tuple[Literal["html", "md", "csv", "json"], ...] = Field(
        ("html", "md", "csv", "json"), description="Report files to write.")


class Cost(BaseModel):
    """Prices behind the per-cost metrics."""

    model_config = _FROZEN
    usd_per_gpu_hour: float = Field(2.5, gt=0, description="Price of one GPU-hour (of any GPU "
                                    "usd_per_gpu_hour_by_gpu does not price).")
    usd_per_gpu_hour_by_gpu: dict[str, Annotated[float, Field(gt=0)]] = Field(
        default_factory=dict, description="Price of one GPU-hour by catalog GPU name, e.g. "
        "{H100-SXM: 2.5, H200: 3.5}: a configuration's hourly cost is the sum over its GPUs "
        "(prefill and decode instances on GPUs of their own priced each at their own).")

    @field_validator("usd_per_gpu_hour_by_gpu")
    @classmethod
    def _known_gpus(cls, prices: dict[str, float]) -> dict[str, float]:
        from simcore.hardware import get_gpu

        return {get_gpu(name).name: price for name, price in prices.items()}

    def hourly_usd(self, gpus_by_type: Mapping[str, int]) -> float:
        """The price of one hour of these GPUs (catalog name -> count)."""
        return hourly_usd(gpus_by_type, self.usd_per_gpu_hour, self.usd_per_gpu_hour_by_gpu)


def hourly_usd(gpus_by_type: Mapping[str, int], usd_per_gpu_hour: float,
               by_gpu: Mapping[str, float] | None = None) -> float:
    """Sum over the GPU types of count x price (by_gpu's price, else usd_per_gpu_hour)."""
    by_gpu = by_gpu or {}
    return sum(n * by_gpu.get(gpu, usd_per_gpu_hour) for gpu, n in gpus_by_type.items())


class StudyConfig(BaseModel):
    """A whole `dse search` input."""

    model_config = _FROZEN
    name: str = Field(description="Study name (in the storage and the report).")
    base: dict[str, Any] = Field(description="The simulate configuration every trial starts "
                                 "from (inline, or a path to a `dse simulate` YAML).")
    space: SearchSpace = Field(description="What may vary (inline, or a search_spaces/*.yaml "
                               "path).")
    objectives: tuple[Objective, ...] = Field(min_length=1, description="What matters.")
    constraints: tuple[Constraint, ...] = Field((), description="What must hold (SLOs), as "
                                                "'p99_tpot_ms <= 50' or a mapping.")
    budget: Budget = Field(default_factory=Budget, description="When to stop.")
    sampler: Sampler = Field(default_factory=Sampler, description="How to propose.")
    fidelity: Fidelity = Field(default_factory=Fidelity, description="Screening and "
                               "confirmation.")
    execution: Execution = Field(default_factory=Execution, description="Where trials run.")
    storage: str | None = Field(None, description="Optuna storage URL: sqlite:///path.db "
                                "(default: <report dir>/study.db), a JournalStorage file as "
                                "journal:///path.log, or an RDB URL (postgresql://...); "
                                "relative file paths resolve against the study file.")
    report: Report = Field(default_factory=Report, description="Report outputs.")
    cost: Cost = Field(default_factory=Cost, description="Prices for per-cost metrics.")
    baseline: bool = Field(True, description="Enqueue the base configuration itself as the "
                           "first trial.")
    base_dir: str = Field(".", description="Folder relative paths resolve against (the study "
                          "file's).")

    @field_validator("constraints", mode="before")
    @classmethod
    def _parse_constraints(cls, v: Any) -> Any:
        if not isinstance(v, (list, tuple)):
            return v
        out = []
        for i, c in enumerate(v):
            if isinstance(c, str):
                m = _CONSTRAINT_RE.match(c)
                if not m:
                    raise ValueError(f"{c!r} is not 'metric <= value' (ops <=, <, >=, >)")
                try:
                    value = float(m.group(3))
                except ValueError:
                    raise ValueError(f"{c!r}: {m.group(3)!r} is not a number") from None
                out.append({"metric": m.group(1), "op": m.group(2), "value": value})
            else:
                out.append(c)
        return out

    @model_validator(mode="after")
    def _check(self) -> "StudyConfig":
        names = [o.metric for o in self.objectives]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"objectives: {', '.join(twice)} is listed twice")
        seen = [(c.metric, c.op, c.value) for c in self.constraints]
        again = next((c for c in seen if seen.count(c) > 1), None)
        if again:
            raise ValueError(f"constraints: {again[0]} {again[1]} {again[2]:g} is listed twice")
        return self

    @property
    def report_dir(self) -> Path:
        d = Path(self.report.dir) if self.report.dir else Path("reports") / self.name
        return (d if d.is_absolute() else Path(self.base_dir) / d).resolve()

    @property
    def storage_url(self) -> str:
        """The Optuna storage URL; a relative sqlite or journal path resolves against base_dir."""
        if self.storage:
            return _resolve_storage(self.storage, Path(self.base_dir))
        return f"sqlite:///{(self.report_dir / 'study.db').resolve()}"


def _resolve_storage(url: str, base_dir: Path) -> str:
    for scheme in ("sqlite:///", "journal://"):
        if url.startswith(scheme):
            path = url[len(scheme):]
            if path and path != ":memory:" and not Path(path).is_absolute():
                return f"{scheme}{(base_dir / path).resolve()}"
    return url


def load_study(path: str | Path) -> StudyConfig:
    """Load a study file; `base` and `space` may be paths relative to it."""
    path = Path(path)
    data = load_yaml(path)
    return parse_study(data, source=str(path), base_dir=path.resolve().parent)


def parse_study(data: Any, *, source: str = "study", base_dir: Path | None = None) -> StudyConfig:
    """Validate a study mapping; relative paths resolve against `base_dir`."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of settings")
    base_dir = base_dir or Path(".").resolve()
    data = dict(data)
    base = data.get("base")
    if isinstance(base, str):
        bpath = Path(base) if Path(base).is_absolute() else base_dir / base
        try:
            loaded = load_yaml(bpath)
        except ConfigError as err:
            raise ConfigError(f"{source}: base: {err}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"{bpath}: the top level must be a mapping of settings")
        loaded.setdefault("base_dir", str(bpath.resolve().parent))
        data["base"] = loaded
    elif isinstance(base, dict):
        data["base"] = {**base, "base_dir": base.get("base_dir", str(base_dir))}
    if "space" in data and not isinstance(data["space"], SearchSpace):
        data["space"] = load_space(data["space"], f"{source}: space", base_dir)
    data.setdefault("base_dir", str(base_dir))
    try:
        study = StudyConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(f"{source}: {format_validation_error(err, StudyConfig)}") from None
    # The base must itself be a valid simulate config.
    parse_config(study.base, source=f"{source}: base")
    return study
