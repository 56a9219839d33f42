"""Kernel profiles: measured times of vLLM's own kernels on one GPU (GEMMs by dtype, context and
decode attention, MLA attention modules, fused MoE, all-reduce), stored as grids of shapes, and
their lookups.

A kernel profile is JSON (gzipped when shipped), `{"format": "simcore-kernel-profile",
"version": 1, ...}` (`KernelProfileData`). Beside the per-op curves of a calibration profile
(`simcore.calibration.profile`, fitted on Vidur's measurements), it covers every op of a dense or
MoE transformer's step that a GPU runs as a measured kernel:

- `gemm`: per weight dtype (bf16, fp8 per-tensor, fp8 block-scaled, nvfp4, ...) one grid of
  times over (m rows, n output features, k input features); a linear layer of any shape is
  interpolated in log-log space (`simcore.calibration.grid.LogGrid`), beyond the largest n or k
  in proportion to it.
- `attention`: per phase (context: prompts of `seq` tokens, no cached prefix; generation: one
  query token over `seq` cached tokens), KV-cache dtype and per-GPU head shape (query heads, KV
  heads, head dim), a grid of times over (batch, seq).
- `moe`: per dtype, MoE shape (hidden, intermediate, top-k, experts, TP and EP of the experts)
  and routing (`MOE_ROUTINGS`: tokens spread evenly over the experts, or expert popularity
  following a power law) the fused-MoE layer's time against the tokens entering it.
- `all_reduce`: per group size and mode (inside a CUDA graph, or eager) the time against the
  number of 16-bit elements reduced.
- `all_gather`: NCCL's all-gather per group size, the time against the 16-bit elements gathered
  (the whole output).
- `memory`: a memory-bound vLLM kernel (one pass reading and writing activations) as time
  against the bytes it moves: what a step-time model times the passes the database never
  measured (norms, rotary, activations, the sampler's passes over the logits) by.
- `mla`: vLLM's whole MLA attention module (DeepSeek-V3's layer: down- and up-projections,
  latent norms, rotary, attention, output projection) per phase, KV-cache dtype, weight dtype and
  query heads per GPU, a grid of times over (batch, seq) (`simcore.calibration.mla`).

Every grid was fitted without some of its axis values (the `held_out` lists), and `errors` holds
the relative error of predicting the measured times at those values from the rest: the error of
interpolating across a gap twice the measured spacing, an upper estimate of interpolating inside
the shipped grid.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from simcore.calibration.curves import KnotCurve
from simcore.calibration.grid import LogGrid, check_axis as _check_axis, check_batch_seq
from simcore.calibration.mla import MlaTable
from simcore.calibration.profile import ErrorStats, US_PER_S, dumps_profile, validate_profile
from simcore.errors import ConfigError

FORMAT = "simcore-kernel-profile"
"""The `format` field every kernel profile carries."""

VERSION = 1
"""The kernel profile format version this module reads and writes."""

_FROZEN = ConfigDict(extra="forbid", frozen=True)

GEMM_CAPS = (1.0, 1.0, 1.0)
"""Log-log slope caps of the GEMM grid above its last m, n and k: time grows at most linearly."""

GEMM_FLOORS = (0.0, 1.0, 1.0)
"""And the floors: above the last n or k measured, time grows with the weights, linearly."""

DECODE_CAPS = (1.0, 1.0)
"""Generation attention above its last batch and sequence length: linear (memory-bound)."""

HOST_BOUND_RATIO = 3.0
"""A GEMM table whose times at small m exceed bf16's by this factor (in median over its shapes)
measured the host's launch path, not the kernel: AIConfigurator's fp8 block-scaled GEMMs
take a flat ~90 us (H100, H200) or ~180 us (B200) from m = 1 to m = 4096, 6-20x bf16's, where
vLLM runs them inside CUDA graphs."""

CONTEXT_CAPS = (1.0, 2.0)
"""Context attention above its last batch (linear) and prompt length (causal pairs: quadratic)."""


def _check_curve(axis_name: str, axis: list, time_us: list, what: str) -> None:
    """A 1-D curve's axis increases and holds one positive time per `what`."""
    _check_axis(axis_name, axis)
    if len(time_us) != len(axis) or min(time_us) <= 0:
        raise ValueError(f"time_us must hold one positive time per {what}")


def _grid_values(flat: list, shape: tuple[int, ...]) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in flat], dtype=float).reshape(shape) \
        / US_PER_S


class GemmTable(BaseModel):
    """One GEMM kernel's times over (m, n, k), C-order, microseconds; null where not measured."""

    model_config = _FROZEN

    dtype: str = Field(description="Weight dtype of the GEMM: bf16, fp8 (per-tensor scales), "
                       "fp8_block (128x128 block scales), nvfp4, int4_wo, ...")
    kernel: str = Field(description="The kernel vLLM ran, as the measurements name it.")
    m: list[int] = Field(description="Rows (tokens) measured.")
    n: list[int] = Field(description="Output features measured.")
    k: list[int] = Field(description="Input features measured.")
    time_us: list[float | None] = Field(description="len(m) x len(n) x len(k) times, C-order.")
    held_out: dict[str, list[int]] = Field(description="Axis values left out of this grid: "
                                           "{'m': [...], 'n': [...], 'k': [...]}.")

    @model_validator(mode="after")
    def _check(self) -> "GemmTable":
        for a in ("m", "n", "k"):
            _check_axis(a, getattr(self, a))
        if len(self.time_us) != len(self.m) * len(self.n) * len(self.k):
            raise ValueError("time_us must hold len(m) x len(n) x len(k) values")
        return self


class AttentionTable(BaseModel):
    """One attention kernel at one per-GPU head shape: times over (batch, seq), microseconds."""

    model_config = _FROZEN

    phase: Literal["context", "generation"] = Field(
        description="context: each sequence a prompt of `seq` tokens with no cached prefix; "
        "generation: one new token per sequence attending to `seq` tokens in the KV cache.")
    kv_cache_dtype: str = Field(description="KV-cache dtype: bf16 or fp8.")
    kernel: str = Field(description="The attention backend vLLM ran.")
    num_heads: int = Field(ge=1, description="Query heads per GPU.")
    num_kv_heads: int = Field(ge=1, description="Key-value heads per GPU.")
    head_dim: int = Field(ge=1, description="Head dimension.")
    window: int = Field(0, ge=0, description="Sliding window the kernel attended over (keys "
                        "per query, the query's own included); 0 for full attention.")
    batch: list[int] = Field(description="Sequences per call measured.")
    seq: list[int] = Field(description="Tokens per sequence measured (prompt length, or KV "
                           "length including the new token).")
    time_us: list[float | None] = Field(description="len(batch) x len(seq) times, C-order.")
    held_out: dict[str, list[int]] = Field(description="Axis values left out: {'batch': [...], "
                                           "'seq': [...]}.")

    @model_validator(mode="after")
    def _check(self) -> "AttentionTable":
        check_batch_seq(self.batch, self.seq, self.time_us)
        return self


MOE_ROUTINGS = ("balanced", "power_law_1.01", "power_law_1.2")
"""How the measured fused-MoE tables route tokens to experts (AIConfigurator's `distribution`
column): `balanced`, every expert gets the same share of the tokens' top-k slots; `power_law_A`,
expert loads drawn from a power law of exponent A (1.2 more skewed than 1.01), so a few experts
take most tokens: fewer distinct experts, hence fewer weights read, in a small batch, and a
longest expert queue, hence more time, in a large one."""


class MoeCurve(BaseModel):
    """One fused-MoE layer (router excluded) at one shape: time against tokens, microseconds."""

    model_config = _FROZEN

    dtype: str = Field(description="Expert weight dtype.")
    routing: Literal["balanced", "power_law_1.01", "power_law_1.2"] = Field(
        "balanced", description="How the measurement routed tokens to experts (MOE_ROUTINGS).")
    kernel: str = Field(description="The fused-MoE kernel vLLM ran.")
    hidden: int = Field(ge=1, description="Model width.")
    inter: int = Field(ge=1, description="Expert intermediate width (whole, before TP).")
    topk: int = Field(ge=1, description="Experts per token.")
    num_experts: int = Field(ge=1, description="Routed experts in the layer (whole model).")
    tp: int = Field(ge=1, description="Tensor parallelism of the experts.")
    ep: int = Field(ge=1, description="Expert parallelism.")
    num_tokens: list[int] = Field(description="Tokens entering the layer on one GPU.")
    time_us: list[float] = Field(description="Time at each token count, microseconds.")
    held_out_num_tokens: list[int] = Field(description="Token counts left out.")

    @model_validator(mode="after")
    def _check(self) -> "MoeCurve":
        _check_curve("num_tokens", self.num_tokens, self.time_us, "token count")
        return self


class CommCurve(BaseModel):
    """A collective over one group of GPUs in one node: time against elements."""

    model_config = _FROZEN

    collective: Literal["all_reduce", "all_gather"] = Field(description="The collective.")
    mode: Literal["graph", "eager", "nccl"] = Field(
        description="vLLM's all-reduce inside a captured CUDA graph or launched eagerly, or "
                    "NCCL's own collective.")
    num_gpus: int = Field(ge=2, description="GPUs in the group.")
    elements: list[int] = Field(description="16-bit elements reduced, or gathered (the whole "
                                "output of an all-gather).")
    time_us: list[float] = Field(description="Time at each size, microseconds.")
    held_out_elements: list[int] = Field(description="Sizes left out.")

    @model_validator(mode="after")
    def _check(self) -> "CommCurve":
        _check_curve("elements", self.elements, self.time_us, "size")
        return self


class MemoryCurve(BaseModel):
    """A memory-bound kernel: time against the bytes it reads and writes, microseconds."""

    model_config = _FROZEN

    kernel: str = Field(description="The kernel measured.")
    bytes_per_element: float = Field(gt=0, description="Bytes it moves per element of its "
                                     "input (read and written).")
    bytes: list[int] = Field(description="Bytes moved (bin medians of the measured shapes).")
    time_us: list[float] = Field(description="Median time at each size, microseconds.")
    held_out_bytes: list[int] = Field(description="Sizes left out.")

    @model_validator(mode="after")
    def _check(self) -> "MemoryCurve":
        _check_curve("bytes", self.bytes, self.time_us, "size")
        return self


class KernelSource(BaseModel):
    """One measurement file read."""

    model_config = _FROZEN

    path: str = Field(description="Path inside the source package's data folder.")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="sha256 of the file's bytes.")
    rows: int = Field(ge=0, description="Rows read.")
    framework_version: str = Field(description="vLLM (or NCCL) version it was measured with.")


class KernelProvenance(BaseModel):
    """Where the numbers come from and how they were fitted."""

    model_config = _FROZEN

    source: str = Field(description="The measurements: origin, package version, licence.")
    package: str = Field(description="Package the data was read from.")
    package_version: str = Field(description="Its version.")
    system: str = Field(description="The measurement system's name in the package.")
    device: str = Field(description="The GPU as the measurements name it.")
    files: list[KernelSource] = Field(description="Every file read, with its sha256.")
    holdout: str = Field(description="The hold-out rule in words.")
    seed: int = Field(ge=0, description="Seed of the hold-out draw.")
    method: str = Field(description="The fitting method in words.")


class KernelProfileData(BaseModel):
    """The contents of a kernel profile file (format version 1)."""

    model_config = _FROZEN

    format: Literal["simcore-kernel-profile"] = Field(description="File kind marker.")
    version: Literal[1] = Field(description="Format version.")
    profile_id: str = Field(min_length=1, description="Name of this profile.")
    gpu: str = Field(description="GPU name in the catalog (simcore/data/gpus.yaml).")
    provenance: KernelProvenance = Field(description="Measurements and fitting.")
    gemm: list[GemmTable] = Field(description="GEMM grids, one per dtype.")
    attention: list[AttentionTable] = Field(description="Attention grids.")
    moe: list[MoeCurve] = Field(description="Fused-MoE curves.")
    all_reduce: list[CommCurve] = Field(description="All-reduce curves.")
    all_gather: list[CommCurve] = Field(default_factory=list,
                                        description="NCCL all-gather curves.")
    memory: list[MemoryCurve] = Field(default_factory=list,
                                      description="Memory-bound kernel curves.")
    mla: list[MlaTable] = Field(default_factory=list,
                                description="MLA attention module grids.")
    errors: dict[str, ErrorStats] = Field(description="Held-out relative errors per table "
                                          "family: 'gemm/<dtype>', 'attention/<phase>/<kv "
                                          "dtype>', 'mla/<phase>/<kv dtype>/<weight dtype>', "
                                          "'moe/<dtype>' (balanced routing), "
                                          "'moe/<dtype>/<routing>', 'all_reduce/<mode>', "
                                          "'all_gather/nccl', 'memory/<kernel>'.")


def _gemm_grid(t: GemmTable) -> LogGrid:
    return LogGrid([t.m, t.n, t.k], _grid_values(t.time_us, (len(t.m), len(t.n), len(t.k))),
                   GEMM_CAPS, GEMM_FLOORS)


def _attention_grid(t: AttentionTable) -> LogGrid:
    caps = CONTEXT_CAPS if t.phase == "context" else DECODE_CAPS
    return LogGrid([t.batch, t.seq], _grid_values(t.time_us, (len(t.batch), len(t.seq))), caps)


def _mla_grid(t: MlaTable) -> LogGrid:
    return LogGrid([t.batch, t.seq], _grid_values(t.time_us, (len(t.batch), len(t.seq))), t.caps)


def _moe_curve(c: MoeCurve) -> KnotCurve:
    return KnotCurve(c.num_tokens, np.asarray(c.time_us) / US_PER_S, log_log=True)


def _elements_curve(c: CommCurve) -> KnotCurve:
    return KnotCurve(c.elements, np.asarray(c.time_us) / US_PER_S, log_log=True)


class _Built:
    """A read-only mapping from keys to tables whose values are built from the tables on first
    lookup (and kept): iteration and membership see the keys, lookups the built objects."""

    __slots__ = ("_tables", "_build", "_built")

    def __init__(self, tables: dict, build):
        self._tables = tables
        self._build = build
        self._built: dict = {}

    def get(self, key, default=None):
        got = self._built.get(key)
        if got is None:
            table = self._tables.get(key)
            if table is None:
                return default
            got = self._built[key] = self._build(table)
        return got

    def __getitem__(self, key):
        got = self.get(key)
        if got is None:
            raise KeyError(key)
        return got

    def __contains__(self, key) -> bool:
        return key in self._tables

    def __iter__(self):
        return iter(self._tables)

    def __len__(self) -> int:
        return len(self._tables)


class KernelProfile:
    """A validated kernel profile with its grids built for lookups (each on its first); immutable.

    Lookups return None where the profile has nothing for the asked kernel, shape or dtype: the
    caller times that op otherwise and says so."""

    def __init__(self, data: KernelProfileData, *, source: str = "profile"):
        self.data = data
        self.source = source
        self._digest: str | None = None
        # The grids and curves are built from their tables on first lookup: a profile holds
        # hundreds of them (every head shape, MoE shape and dtype measured) and a run looks up
        # a few.
        self._gemm = _Built({t.dtype: t for t in data.gemm}, _gemm_grid)
        self._gemm_m = {t.dtype: t.m for t in data.gemm}
        self._host_ratio: dict[str, float | None] = {}
        self._attn = _Built({(t.phase, t.kv_cache_dtype, t.num_heads, t.num_kv_heads, t.head_dim,
                              t.window): t for t in data.attention}, _attention_grid)
        self._moe = _Built({(c.dtype, c.hidden, c.inter, c.topk, c.num_experts, c.tp, c.ep,
                             c.routing): c for c in data.moe}, _moe_curve)
        self._ar = _Built({(c.mode, c.num_gpus): c for c in data.all_reduce}, _elements_curve)
        self._ag = _Built({c.num_gpus: c for c in data.all_gather}, _elements_curve)
        self._mem = [(c.kernel, KnotCurve(c.bytes, np.asarray(c.time_us) / US_PER_S,
                                          log_log=True)) for c in data.memory]
        self._mla = _Built({(t.phase, t.kv_cache_dtype, t.gemm_dtype, t.num_heads, t.shape): t
                            for t in data.mla}, _mla_grid)

    # ---- files ------------------------------------------------------------------------------

    @classmethod
    def load(cls, path: str | Path) -> "KernelProfile":
        """Read and validate a kernel profile file (.json or .json.gz)."""
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"{path}: no such profile file")
        try:
            raw = path.read_bytes()
            if path.name.endswith(".gz"):
                raw = gzip.decompress(raw)
            parsed = json.loads(raw.decode("utf-8"))
        except (OSError, EOFError, gzip.BadGzipFile) as e:
            raise ConfigError(f"{path}: cannot be read ({e})") from None
        except UnicodeDecodeError as e:
            raise ConfigError(f"{path}: not UTF-8 text (byte {e.start})") from None
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: not JSON (line {e.lineno}: {e.msg})") from None
        return cls.from_dict(parsed, source=str(path))

    @classmethod
    def from_dict(cls, raw: Any, *, source: str = "profile") -> "KernelProfile":
        """Validate the parsed contents of a kernel profile file."""
        data = validate_profile(raw, KernelProfileData, source=source, fmt=FORMAT,
                                version=VERSION, what="kernel profile")
        return cls(data, source=source)

    def to_json(self) -> str:
        """The profile's JSON text (deterministic)."""
        return dumps_profile(self.data.model_dump(mode="json"))

    def save(self, path: str | Path) -> None:
        """Write the profile (gzipped, with no timestamp, when the name ends in .gz)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        text = self.to_json().encode()
        if path.name.endswith(".gz"):
            text = gzip.compress(text, compresslevel=9, mtime=0)
        path.write_bytes(text)

    # ---- lookups ----------------------------------------------------------------------------

    @property
    def profile_id(self) -> str:
        return self.data.profile_id

    @property
    def digest(self) -> str:
        """The first 16 hex digits of the sha256 of the profile's JSON text (computed once)."""
        if self._digest is None:
            self._digest = _digest_of(self.to_json().encode())
        return self._digest

    @property
    def gpu(self) -> str:
        return self.data.gpu

    def gemm_dtypes(self) -> list[str]:
        """Weight dtypes with a GEMM grid."""
        return sorted(self._gemm)

    def gemm_time_s(self, dtype: str, m: float, n: int, k: int) -> float | None:
        """Time of an (m x k) @ (k x n) GEMM with weights in `dtype`, seconds."""
        g = self._gemm.get(dtype)
        return None if g is None else g(m, n, k)

    def host_bound_ratio(self, dtype: str) -> float | None:
        """How many times bf16's time a `dtype` GEMM takes at small m (up to 64 rows), in median
        over the shapes both measured; None without both tables. A ratio far above 1 means the
        small-m times are the host's launch path measured outside a CUDA graph, not the kernel
        (`HOST_BOUND_RATIO`)."""
        if dtype not in self._host_ratio:
            mine = next((t for t in self.data.gemm if t.dtype == dtype), None)
            ref = self._gemm.get("bf16")
            ratio = None
            if mine is not None and ref is not None and dtype != "bf16":
                pairs = [(self._gemm[dtype](m, n, k), ref(m, n, k))
                         for m in mine.m if m <= 64 for n in mine.n for k in mine.k]
                ratios = [a / b for a, b in pairs if a is not None and b]
                ratio = float(np.median(ratios)) if ratios else None
            self._host_ratio[dtype] = ratio
        return self._host_ratio[dtype]

    def gemm_curve(self, dtype: str, n: int, k: int) -> KnotCurve | None:
        """The GEMM of per-GPU shape (k -> n) as a curve over rows m (the grid's m values,
        interpolated in n and k once): what a step-time model keeps for one linear layer."""
        g = self._gemm.get(dtype)
        if g is None:
            return None
        ms = self._gemm_m[dtype]
        ts = [g(m, n, k) for m in ms]
        if any(t is None for t in ts):
            return None
        return KnotCurve(ms, ts, log_log=True)

    def attention_grid(self, phase: str, kv_cache_dtype: str, num_heads: int,
                       num_kv_heads: int, head_dim: int, window: int = 0) -> LogGrid | None:
        """The measured (batch, seq) grid of attention at this per-GPU head shape (over a
        sliding `window`, 0 for full attention), or None."""
        return self._attn.get((phase, kv_cache_dtype, num_heads, num_kv_heads, head_dim, window))

    def attention_kernels(self) -> set[str]:
        """The attention kernels the profile's tables measured (AIConfigurator's names)."""
        return {t.kernel for t in self._attn._tables.values()}

    def attention_kernel(self, phase: str, kv_cache_dtype: str, num_heads: int,
                         num_kv_heads: int, head_dim: int, window: int = 0) -> str | None:
        """The kernel that measured `attention_grid`'s table of these arguments, or None."""
        t = self._attn._tables.get((phase, kv_cache_dtype, num_heads, num_kv_heads, head_dim,
                                    window))
        return None if t is None else t.kernel

    def attention_shapes(self, phase: str, kv_cache_dtype: str) -> list[tuple[int, int, int]]:
        """(num_heads, num_kv_heads, head_dim) measured for `phase` and KV dtype."""
        return sorted(k[2:5] for k in self._attn
                      if k[0] == phase and k[1] == kv_cache_dtype and not k[5])

    def moe_curve(self, dtype: str, hidden: int, inter: int, topk: int, num_experts: int,
                  tp: int, ep: int, routing: str = "balanced") -> KnotCurve | None:
        """The fused-MoE layer's time against tokens at this shape and routing, or None."""
        return self._moe.get((dtype, hidden, inter, topk, num_experts, tp, ep, routing))

    def moe_kernel(self, key: tuple) -> str | None:
        """The kernel vLLM ran for the fused-MoE table `key` (`moe_keys`), or None."""
        table = self._moe._tables.get(key)
        return None if table is None else table.kernel

    def moe_keys(self) -> list[tuple]:
        """The fused-MoE tables' keys: (dtype, hidden, inter, topk, experts, tp, ep,
        routing)."""
        return list(self._moe)

    def moe_routings(self) -> tuple[str, ...]:
        """The routings the profile's fused-MoE tables were measured with, in MOE_ROUTINGS
        order."""
        have = {k[-1] for k in self._moe}
        return tuple(r for r in MOE_ROUTINGS if r in have)

    def all_reduce_curve(self, num_gpus: int, mode: str = "graph") -> KnotCurve | None:
        """All-reduce time against 16-bit elements over `num_gpus` GPUs of a node, or None."""
        return self._ar.get((mode, num_gpus))

    def all_gather_curve(self, num_gpus: int) -> KnotCurve | None:
        """NCCL all-gather time against the 16-bit elements gathered over `num_gpus` GPUs of a
        node, or None."""
        return self._ag.get(num_gpus)

    def memory_curve(self) -> tuple[str, KnotCurve] | None:
        """(kernel name, time against bytes moved) of the profile's memory-bound kernel, or
        None."""
        return self._mem[0] if self._mem else None

    def mla_grid(self, phase: str, kv_cache_dtype: str, gemm_dtype: str, num_heads: int,
                 shape: tuple[int, ...]) -> LogGrid | None:
        """The measured (batch, seq) grid of the MLA attention module at this phase, KV-cache
        dtype, weight dtype, query heads per GPU and layer shape (`simcore.calibration.mla.
        module_shape`), or None."""
        return self._mla.get((phase, kv_cache_dtype, gemm_dtype, num_heads, tuple(shape)))

    def mla_keys(self) -> list[tuple]:
        """(phase, KV dtype, weight dtype, heads per GPU, layer shape) of every MLA module
        grid."""
        return sorted(self._mla)

    def error_bound(self, family: str) -> float | None:
        """The 90th-percentile held-out relative error of a table family ('gemm/bf16',
        'attention/generation/bf16', 'mla/context/fp8/fp8_block', 'moe/fp8',
        'all_reduce/graph'), or None."""
        s = self.data.errors.get(family)
        return None if s is None else s.p90


def is_kernel_profile_file(path: Path) -> bool:
    """Whether a profile file is a kernel profile (by name: *.json.gz, or a JSON file whose
    format field says so)."""
    if path.name.endswith(".json.gz"):
        return True
    try:
        head = path.read_text(encoding="utf-8", errors="replace")[:200]
    except OSError:
        return False
    return f'"{FORMAT}"' in head


_FOLDER = ("data", "profiles")


def shipped_kernel_profile_ids() -> list[str]:
    """Ids of the kernel profiles shipped in simcore/data/profiles (*.json.gz)."""
    folder = resources.files("simcore").joinpath(*_FOLDER)
    return sorted(p.name.removesuffix(".json.gz") for p in folder.iterdir()
                  if p.name.endswith(".json.gz"))


@lru_cache(maxsize=None)
def shipped_kernel_profile(profile_id: str) -> KernelProfile:
    """A kernel profile shipped in simcore/data/profiles, e.g. "h100-aiconfigurator" (read
    once)."""
    known = shipped_kernel_profile_ids()
    if profile_id not in known:
        raise ConfigError(f"unknown kernel profile {profile_id!r}; shipped: {', '.join(known)}")
    raw = (resources.files("simcore").joinpath(*_FOLDER, f"{profile_id}.json.gz")).read_bytes()
    text = gzip.decompress(raw)
    profile = KernelProfile.from_dict(json.loads(text), source=f"{profile_id}.json.gz")
    # A shipped profile's file is the profile's JSON text, written by `save`: its digest is that
    # of the file's bytes, with no need to write the text again.
    profile._digest = _digest_of(text)
    return profile


def _digest_of(text: bytes) -> str:
    return hashlib.sha256(text).hexdigest()[:16]


def relative_errors(predicted: list[float | None], measured: list[float]) -> list[float]:
    """|p - m| / m for each pair with a prediction (None predictions are skipped)."""
    return [abs(p - m) / m for p, m in zip(predicted, measured)
            if p is not None and m > 0 and math.isfinite(p)]
