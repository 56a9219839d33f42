"""Calibration profiles: the versioned file of fitted per-op curves for one GPU, and its lookups.

A profile file is JSON, `{"format": "simcore-calibration-profile", "version": 1, ...}`
(`ProfileData`). It holds, for one GPU:

- token curves: per op and per-GPU shape key (GEMMs by (in_features, out_features), elementwise
  ops by the widths they touch, see `OP_KEY_FIELDS`), the op's time against the number of tokens
  in the batch as monotone piecewise-linear knots. Between knots: linear interpolation; below the
  first knot: the first knot's time; beyond the last knot: time in proportion to tokens (the
  last knot's throughput), which is how GEMMs and memory-bound passes scale at large batches.
- shape-generic fallbacks for shapes never measured: GEMMs from the nearest measured shapes
  rescaled by a fitted cost model (`GenericGemm`), elementwise ops from one curve of time
  against elements (tokens x width) per op.
- collective curves: per (collective, num_workers, devices_per_node) the time against message
  size, interpolated in log-log; beyond the last knot, in proportion to size. Also an
  alpha-beta fit (alpha + size / bandwidth) per curve.
- provenance (files and sha256, the hold-out rule and seed, the held-out x values of every
  curve), the held-out error statistics per op (`ErrorModel`), and the valid ranges.

`CalibrationProfile` wraps a validated `ProfileData` with curves (`simcore.calibration.curves`)
built once, so lookups per simulated step cost a few microseconds.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from simcore.calibration.curves import GemmFallback, KnotCurve
from simcore.calibration.ops import (
    ELEMENTWISE_WIDTH, GEMM_FAMILY, GEMM_OPS, OP_KEY_FIELDS, family)
from simcore.errors import ConfigError
from simcore.loading import read_text
from simcore.units import GB

FORMAT = "simcore-calibration-profile"
"""The `format` field every profile file carries."""

VERSION = 1
"""The profile format version this module reads and writes."""

_FROZEN = ConfigDict(extra="forbid", frozen=True)


US_PER_S = 1e6
"""Profile files store times in microseconds."""


def s_from_us(us) -> np.ndarray:
    """Microseconds (the file's unit) -> seconds."""
    return np.asarray(us, dtype=float) / US_PER_S


class ErrorStats(BaseModel):
    """Relative errors |predicted - measured| / measured of one group of rows that were not used
    to fit the prediction; statistics are None when there are no such rows."""

    model_config = _FROZEN

    n_train: int = Field(ge=0, description="Rows the predicting curves were fitted on.")
    n: int = Field(ge=0, description="Rows the errors were measured on.")
    median: float | None = Field(description="Median relative error.")
    p90: float | None = Field(description="90th percentile relative error.")
    p99: float | None = Field(description="99th percentile relative error.")
    max: float | None = Field(description="Largest relative error.")


class ErrorModel(BaseModel):
    """The profile's declared errors, measured on rows left out of each fit."""

    model_config = _FROZEN

    ops: dict[str, ErrorStats] = Field(description="Measured curves on held-out rows, by vidur "
                                       "op name, plus 'gemm' (all GEMM ops) and 'all' (every op).")
    collectives: dict[str, ErrorStats] = Field(description="Collective curves on held-out rows, "
                                               "by collective.")
    alpha_beta: dict[str, ErrorStats] = Field(description="The alpha-beta fits on the same "
                                              "held-out rows, by collective.")
    generic: dict[str, ErrorStats] = Field(description="Shape-generic fallbacks on held-out "
                                           "shapes (leave one source model out: every row of a "
                                           "model, predicted without any shape it has), by op "
                                           "name ('gemm' for the GEMM fallback).")
    generic_by_model: dict[str, dict[str, float]] = Field(
        default_factory=dict, description="Median relative error of each generic fallback per "
        "left-out model: {op: {model: median}}.")


class SourceRecord(BaseModel):
    """One measurement file the profile was fitted on."""

    model_config = _FROZEN

    path: str = Field(description="Path inside the measurement tree (from `profiling/` for "
                      "vidur's layout).")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="sha256 of the file's bytes.")
    kind: Literal["compute", "collective"] = Field(description="What the file measures.")
    label: str = Field(description="'<gpu>/<org>/<model>' or '<node>/<collective>'.")


class HoldoutRecord(BaseModel):
    """Which rows were left out of the fit, so that the split can be rebuilt exactly."""

    model_config = _FROZEN

    rule: str = Field(description="The hold-out rule in words.")
    fraction: float = Field(ge=0, lt=1, description="Fraction of each curve's distinct x values "
                            "held out.")
    seed: int = Field(ge=0, description="Seed of the numpy Generators that chose them.")


class Provenance(BaseModel):
    """Where the profile's numbers come from and how they were fitted."""

    model_config = _FROZEN

    source: str = Field(description="The measurements: origin, version, license.")
    files: list[SourceRecord] = Field(description="Every file read, with its sha256.")
    holdout: HoldoutRecord = Field(description="The train/held-out split.")
    knot_tolerance: float = Field(ge=0, description="Largest relative deviation allowed when "
                                  "dropping knots of a fitted curve.")
    method: str = Field(description="The fitting method in words.")


class Backend(BaseModel):
    """The software the measurements ran on, as far as it is known."""

    model_config = _FROZEN

    compute: str = Field(description="Kernels that ran the compute ops.")
    communication: str = Field(description="Library and settings of the collectives.")
    versions: str = Field(description="Library versions, or 'unknown'.")


def _check_knots(x: list, y: list, x_name: str) -> None:
    if len(x) != len(y) or not x:
        raise ValueError(f"{x_name} and time_us must be non-empty and of equal length")
    if any(b <= a for a, b in zip(x, x[1:])) or x[0] <= 0:
        raise ValueError(f"{x_name} must be positive and strictly increasing")
    if any(b < a for a, b in zip(y, y[1:])) or y[0] <= 0:
        raise ValueError("time_us must be positive and non-decreasing")


class TokenCurve(BaseModel):
    """One op family at one per-GPU shape: time against tokens in the batch, monotone knots."""

    model_config = _FROZEN

    op: str = Field(description="Curve family: 'gemm' or an elementwise op name.")
    key: dict[str, int] = Field(description="The shape key (fields of OP_KEY_FIELDS[op]).")
    num_tokens: list[int] = Field(description="Knot positions, tokens in the batch.")
    time_us: list[float] = Field(description="Op time at each knot, microseconds.")
    held_out_num_tokens: list[int] = Field(description="Token counts whose rows were held out.")
    tp: list[int] = Field(description="Tensor-parallel degrees the rows were measured at.")
    models: list[str] = Field(description="Source models the rows come from.")
    ops: list[str] = Field(description="vidur op names the rows come from.")
    n_train: int = Field(ge=1, description="Rows fitted.")
    n_held_out: int = Field(ge=0, description="Rows held out.")

    @model_validator(mode="after")
    def _check(self) -> "TokenCurve":
        if self.op not in OP_KEY_FIELDS:
            raise ValueError(f"unknown op family {self.op!r}; known: {', '.join(OP_KEY_FIELDS)}")
        if tuple(self.key) != OP_KEY_FIELDS[self.op]:
            raise ValueError(f"key of {self.op!r} must have fields {list(OP_KEY_FIELDS[self.op])}")
        _check_knots(self.num_tokens, self.time_us, "num_tokens")
        return self


class ElementCurve(BaseModel):
    """The generic fallback of one elementwise op: time against elements (tokens x width)."""

    model_config = _FROZEN

    op: str = Field(description="Elementwise op name.")
    gated: int | None = Field(description="For mlp_act: 1 gated, 0 plain; else None.")
    elements: list[int] = Field(description="Knot positions, tokens x width.")
    time_us: list[float] = Field(description="Op time at each knot, microseconds.")

    @model_validator(mode="after")
    def _check(self) -> "ElementCurve":
        if self.op not in ELEMENTWISE_WIDTH:
            raise ValueError(f"unknown elementwise op {self.op!r}")
        _check_knots(self.elements, self.time_us, "elements")
        return self


class GenericGemm(BaseModel):
    """The fallback for GEMM shapes without a curve.

    time(m, k, n) = geometric mean over the `neighbors` measured shapes nearest in (log k, log n),
    weighted by 1 / (distance + 0.05)^2, of each neighbour's curve at m tokens times
    cost(m, k, n) / cost(m, k', n'), where cost(m, k, n) = c0 + c1 k n + c2 m (k + n) + c3 m k n
    (a fixed time, weight reads, activation reads and writes, multiply-adds) is fitted to all
    training GEMM rows by relative least squares with non-negative coefficients."""

    model_config = _FROZEN

    cost_coefficients_s: list[float] = Field(min_length=4, max_length=4, description="c0..c3, "
                                             "seconds per unit.")
    neighbors: int = Field(ge=1, description="Measured shapes combined per prediction.")


class CollectiveCurve(BaseModel):
    """One collective at one (num_workers, devices_per_node): time against message size."""

    model_config = _FROZEN

    collective: str = Field(description="'all_reduce' or 'send_recv'.")
    num_workers: int = Field(ge=2, description="GPUs taking part.")
    devices_per_node: int = Field(ge=1, description="Of them, GPUs per node.")
    size_bytes: list[int] = Field(description="Knot positions, message size in bytes.")
    time_us: list[float] = Field(description="Time at each knot, microseconds.")
    held_out_size_bytes: list[int] = Field(description="Sizes whose rows were held out.")
    alpha_us: float = Field(ge=0, description="Alpha-beta fit: fixed latency, microseconds.")
    bandwidth_gb_per_s: float = Field(gt=0, description="Alpha-beta fit: effective bandwidth, "
                                      "1e9 bytes/s (size / (time - alpha)).")
    n_train: int = Field(ge=1, description="Rows fitted.")
    n_held_out: int = Field(ge=0, description="Rows held out.")

    @model_validator(mode="after")
    def _check(self) -> "CollectiveCurve":
        _check_knots(self.size_bytes, self.time_us, "size_bytes")
        return self


class ValidRange(BaseModel):
    """The batch shapes and message sizes the measurements cover."""

    model_config = _FROZEN

    num_tokens_min: int | None = Field(description="Fewest tokens of any fitted compute row.")
    num_tokens_max: int | None = Field(description="Most tokens of any fitted compute row.")
    tp: list[int] = Field(description="Tensor-parallel degrees measured.")
    collective_size_bytes_min: int | None = Field(description="Smallest message measured.")
    collective_size_bytes_max: int | None = Field(description="Largest message measured.")
    collective_num_workers: list[int] = Field(description="Group sizes measured.")


class ProfileData(BaseModel):
    """The contents of a profile file (format version 1)."""

    model_config = _FROZEN

    format: Literal["simcore-calibration-profile"] = Field(description="File kind marker.")
    version: Literal[1] = Field(description="Format version.")
    profile_id: str = Field(min_length=1, description="Name of this profile.")
    gpu: str = Field(description="GPU name in the catalog (simcore/data/gpus.yaml).")
    source_gpu: str = Field(description="The GPU's name in the measurements.")
    node: str | None = Field(description="Node kind the collectives were measured on.")
    dtype: str = Field(description="Data type of the measured ops.")
    backend: Backend = Field(description="Kernels and libraries measured.")
    provenance: Provenance = Field(description="Measurements and fitting method.")
    key_fields: dict[str, list[str]] = Field(description="Shape key fields per curve family.")
    valid_range: ValidRange = Field(description="What the measurements cover.")
    errors: ErrorModel = Field(description="Held-out errors per op.")
    curves: list[TokenCurve] = Field(description="Measured token curves.")
    generic_gemm: GenericGemm | None = Field(description="GEMM fallback for unmeasured shapes.")
    generic_elementwise: list[ElementCurve] = Field(description="Elementwise fallbacks.")
    collectives: list[CollectiveCurve] = Field(description="Collective curves.")


def _first_error(err: ValidationError, what: str = "version-1 profile") -> str:
    e = err.errors()[0]
    loc = ".".join(str(p) for p in e["loc"])
    msg = e["msg"].removeprefix("Value error, ")
    if e["type"] == "extra_forbidden":
        msg = f"is not a field of a {what}"
    elif e["type"] == "missing":
        msg = "is required"
    return f"field {loc!r}: {msg}" if loc else msg


def validate_profile(raw: Any, model: type[BaseModel], *, source: str, fmt: str, version: int,
                     what: str) -> BaseModel:
    """The parsed contents of a profile file of format `fmt` validated as `model`: one
    ConfigError naming the source and the first bad field otherwise. `what` names the kind in
    messages ("profile", "kernel profile")."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: a profile must be a JSON object")
    if raw.get("format") != fmt:
        raise ConfigError(f"{source}: field 'format' is {raw.get('format')!r}, "
                          f"expected {fmt!r}")
    if raw.get("version") != version:
        raise ConfigError(f"{source}: field 'version' is {raw.get('version')!r}; this "
                          f"simcore reads version {version} {what}s")
    try:
        return model.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(f"{source}: {_first_error(err, f'version-{version} {what}')}") \
            from None


def _shape_key(op: str, shape: dict[str, Any]) -> tuple[int, ...]:
    fields = OP_KEY_FIELDS.get(family(op))
    if fields is None:
        known = ", ".join(GEMM_OPS + tuple(ELEMENTWISE_WIDTH))
        raise ConfigError(f"unknown op {op!r}; known: {known}")
    try:
        return tuple(int(shape[f]) for f in fields)
    except KeyError as e:
        raise ConfigError(f"op {op!r} is looked up by {', '.join(fields)}; "
                          f"{e.args[0]!r} is missing") from None


class CalibrationProfile:
    """A validated profile with its curves as arrays, for lookups during a simulation.

    Immutable after construction: `data` is the frozen file contents and every query reads
    curves built here; the only state that changes is the GEMM fallback's memo of each
    unmeasured shape's nearest measured shapes."""

    def __init__(self, data: ProfileData, *, source: str = "profile"):
        self.data = data
        self.source = source
        self._curves: dict[tuple[str, tuple[int, ...]], KnotCurve] = {}
        self._ranges: dict[tuple[str, tuple[int, ...]], tuple[int, int]] = {}
        for c in data.curves:
            key = (c.op, tuple(c.key.values()))
            self._curves[key] = KnotCurve(c.num_tokens, s_from_us(c.time_us))
            self._ranges[key] = (c.num_tokens[0], c.num_tokens[-1])
        self._elementwise = {(e.op, e.gated): KnotCurve(e.elements, s_from_us(e.time_us))
                             for e in data.generic_elementwise}
        self._collectives = {
            (c.collective, c.num_workers, c.devices_per_node): (
                KnotCurve(c.size_bytes, s_from_us(c.time_us), log_log=True),
                c.alpha_us / US_PER_S, c.bandwidth_gb_per_s * GB)
            for c in data.collectives}
        gemm = [(k, v) for k, v in self._curves.items() if k[0] == GEMM_FAMILY]
        g = data.generic_gemm
        self._gemm_fallback = None if g is None or not gemm else GemmFallback(
            [k[1] for k, _ in gemm], [v for _, v in gemm], g.cost_coefficients_s, g.neighbors)

    # ---- files ------------------------------------------------------------------------------

    @classmethod
    def load(cls, path: str | Path) -> "CalibrationProfile":
        """Read and validate a profile file; one ConfigError naming the file and field else."""
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"{path}: no such profile file")
        try:
            raw = json.loads(read_text(path))
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: not JSON (line {e.lineno}: {e.msg})") from None
        return cls.from_dict(raw, source=str(path))

    @classmethod
    def from_dict(cls, raw: Any, *, source: str = "profile") -> "CalibrationProfile":
        """Validate the parsed contents of a profile file."""
        data = validate_profile(raw, ProfileData, source=source, fmt=FORMAT, version=VERSION,
                                what="profile")
        return cls(data, source=source)

    def to_json(self) -> str:
        """The profile file's text (deterministic: same data, same bytes)."""
        return dumps_profile(self.data.model_dump(mode="json"))

    def save(self, path: str | Path) -> None:
        """Write the profile file (parent folders created)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json())

    # ---- compute ----------------------------------------------------------------------------

    @property
    def profile_id(self) -> str:
        """The profile's name."""
        return self.data.profile_id

    @property
    def gpu(self) -> str:
        """Catalog name of the GPU."""
        return self.data.gpu

    def curve(self, op: str, **shape: int) -> KnotCurve | None:
        """The measured curve of `op` at `shape` (the fields of `OP_KEY_FIELDS[family(op)]`), or
        None when that shape was not measured. Callers that time the same op every step can keep
        the curve and call it with the token count."""
        return self._curves.get((family(op), _shape_key(op, shape)))

    def op_time_s(self, op: str, num_tokens: int, **shape: int) -> float | None:
        """Measured time of `op` (a vidur op name, or "gemm") for a batch of `num_tokens` tokens
        at `shape`, seconds; None when the shape was not measured.

        Examples: op_time_s("mlp_down_proj", 512, in_features=11008, out_features=4096),
        op_time_s("input_layernorm", 512, hidden=4096)."""
        c = self._curves.get((family(op), _shape_key(op, shape)))
        return None if c is None else c(num_tokens)

    def gemm_time_s(self, in_features: int, out_features: int,
                    num_tokens: int) -> tuple[float, str] | None:
        """Time of a GEMM of per-GPU shape (in_features -> out_features) over `num_tokens` rows,
        seconds, and where it comes from: "measured" (a curve of that shape) or "generic" (the
        fallback, see `relative_error("gemm", "generic")`); None when the profile has no GEMMs."""
        c = self._curves.get((GEMM_FAMILY, (in_features, out_features)))
        if c is not None:
            return c(num_tokens), "measured"
        if self._gemm_fallback is None:
            return None
        return self._gemm_fallback.time_s(in_features, out_features, num_tokens), "generic"

    def elementwise_time_s(self, op: str, num_tokens: int,
                           **shape: int) -> tuple[float, str] | None:
        """Time of an elementwise op at `shape`, seconds, and "measured" or "generic" (the op's
        curve against tokens x width); None when the profile has neither."""
        if op not in ELEMENTWISE_WIDTH:
            raise ConfigError(f"{op!r} is not an elementwise op; one of "
                              f"{', '.join(ELEMENTWISE_WIDTH)}")
        key = _shape_key(op, shape)
        c = self._curves.get((op, key))
        if c is not None:
            return c(num_tokens), "measured"
        width = sum(int(shape[f]) for f in ELEMENTWISE_WIDTH[op])
        gated = int(shape["gated"]) if "gated" in OP_KEY_FIELDS[op] else None
        generic = self._elementwise.get((op, gated))
        if generic is None:
            return None
        return generic(num_tokens * width), "generic"

    def valid_range(self, op: str, **shape: int) -> tuple[int, int] | None:
        """(fewest, most) tokens measured for `op` at `shape`; None when not measured."""
        return self._ranges.get((family(op), _shape_key(op, shape)))

    def in_range(self, op: str, num_tokens: int, **shape: int) -> bool:
        """Whether `num_tokens` lies within the measured tokens of `op` at `shape` (False when the
        shape was not measured: the answer would come from a fallback or an extrapolation)."""
        r = self.valid_range(op, **shape)
        return r is not None and r[0] <= num_tokens <= r[1]

    def measured_shapes(self, op: str) -> list[dict[str, int]]:
        """The shape keys measured for `op`'s family."""
        fam = family(op)
        return [c.key for c in self.data.curves if c.op == fam]

    # ---- communication ----------------------------------------------------------------------

    def collective_time_s(self, collective: str, size_bytes: float, num_workers: int,
                          devices_per_node: int | None = None) -> float | None:
        """Measured time of `collective` ("all_reduce", "send_recv") of `size_bytes` over
        `num_workers` GPUs with `devices_per_node` of them per node (default: all in one node),
        seconds; None when that group was not measured."""
        found = self._collectives.get((collective, num_workers, devices_per_node or num_workers))
        return None if found is None else found[0](size_bytes)

    def collective_alpha_beta(self, collective: str, num_workers: int,
                              devices_per_node: int | None = None) -> tuple[float, float] | None:
        """(alpha seconds, bandwidth bytes/s) of the alpha-beta fit of a measured group."""
        found = self._collectives.get((collective, num_workers, devices_per_node or num_workers))
        return None if found is None else found[1:]

    def collective_groups(self) -> list[tuple[str, int, int]]:
        """(collective, num_workers, devices_per_node) of every measured group."""
        return sorted(self._collectives)

    # ---- errors -----------------------------------------------------------------------------

    def error_stats(self, op: str, source: str = "measured") -> ErrorStats | None:
        """Held-out error statistics of `op` (a vidur op name, "gemm", "all", or a collective)
        from `source` "measured" (curves), "generic" (fallbacks on held-out shapes; every GEMM op
        shares the "gemm" fallback's) or "alpha_beta" (collectives); None when the profile has
        none."""
        e = self.data.errors
        if source == "generic":
            op = family(op)
        table = {"measured": {**e.ops, **e.collectives}, "generic": e.generic,
                 "alpha_beta": e.alpha_beta}.get(source)
        if table is None:
            raise ConfigError(f"unknown error source {source!r}; one of measured, generic, "
                              f"alpha_beta")
        return table.get(op)

    def relative_error(self, op: str, source: str = "measured") -> float | None:
        """Declared relative error bound of `op` from `source` (see `error_stats`): the 90th
        percentile held-out relative error; None when nothing was held out."""
        s = self.error_stats(op, source)
        return None if s is None else s.p90


def _is_leaf(value: Any) -> bool:
    """A scalar, or a list or mapping of scalars: written on one line."""
    if isinstance(value, dict):
        return all(not isinstance(v, (dict, list)) for v in value.values())
    if isinstance(value, list):
        return all(not isinstance(v, (dict, list)) for v in value)
    return True


_compact = json.JSONEncoder(separators=(",", ":")).encode
"""`json.dumps(value, separators=(",", ":"))`, its encoder made once."""

_key = json.JSONEncoder().encode
"""`json.dumps(key)`, likewise."""


def _dump(value: Any, indent: int) -> str:
    if isinstance(value, dict) and not all(_is_leaf(v) for v in value.values()):
        pad = " " * indent
        items = [f"{pad} {_key(k)}: {_dump(v, indent + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(value, list) and not all(_is_leaf(v) for v in value):
        pad = " " * indent
        items = [f"{pad} {_dump(v, indent + 1)}" for v in value]
        return "[\n" + ",\n".join(items) + "\n" + pad + "]"
    return _compact(value)


def dumps_profile(data: dict) -> str:
    """Profile JSON with one line per curve and numeric lists inline (small files, readable
    diffs)."""
    return _dump(data, 0) + "\n"


def shipped_profile_ids() -> list[str]:
    """Ids of the profiles shipped in simcore/data/profiles."""
    folder = resources.files("simcore") / "data" / "profiles"
    return sorted(p.name.removesuffix(".json") for p in folder.iterdir()
                  if p.name.endswith(".json"))


@lru_cache(maxsize=None)
def shipped_profile(profile_id: str) -> CalibrationProfile:
    """A profile shipped in simcore/data/profiles, e.g. "h100-vidur" (read once)."""
    known = shipped_profile_ids()
    if profile_id not in known:
        raise ConfigError(f"unknown calibration profile {profile_id!r}; shipped: "
                          f"{', '.join(known)}")
    text = (resources.files("simcore") / "data" / "profiles" / f"{profile_id}.json").read_text()
    return CalibrationProfile.from_dict(json.loads(text), source=f"{profile_id}.json")
