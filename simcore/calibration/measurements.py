"""Measurement tables from vidur-layout profiling CSVs: one tidy row per timed op or collective.

The layout is vidur's (microsoft/vidur, `data/profiling`):

- `compute/<gpu>/<org>/<model>/mlp.csv`: one row per (num_tokens, num_tensor_parallel_workers)
  profiling run of one transformer layer's non-attention ops, times in milliseconds in
  `time_stats.<op>.{min,max,mean,median,std}`, model shape in `n_head`, `n_kv_head`, `n_embd`,
  `n_expanded_embd`, `vocab_size`, `use_gated_mlp`. Ops a model lacks have no columns (phi-2
  has no `post_attention_layernorm`).
- `network/<node>/{all_reduce,send_recv}.csv`: one row per (size, num_workers,
  devices_per_node) NCCL run, times in milliseconds in `time_stats.<collective>.*`, `size` in
  bytes (vidur records elements x 2, fp16).

Each compute row carries the per-GPU shape the op ran on after tensor-parallel sharding, so
fits can key ops by shape instead of by model name: GEMMs by (in_features, out_features), the
elementwise ops by the widths they touch. vidur's `mlp_up_proj` is the fused gate+up GEMM for
gated MLPs (2 x n_expanded_embd outputs before sharding), which its times confirm (about twice
`mlp_down_proj`'s).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from simcore.calibration.ops import COLLECTIVES, COMPUTE_OPS
from simcore.errors import ConfigError
from simcore.loading import file_sha256, not_utf8
from simcore.units import MS

COMPUTE_COLUMNS = ("gpu", "model", "op", "num_tokens", "tp", "hidden", "vocab_per_gpu",
                   "q_features", "kv_features", "ffn_features", "gated", "in_features",
                   "out_features", "time_s", "file", "row")
"""Columns of a compute measurement table. Widths are per GPU (after TP sharding): `hidden` =
n_embd (not sharded), `vocab_per_gpu` = vocab_size / tp, `q_features` / `kv_features` = query /
key-value heads per GPU x head_dim, `ffn_features` = n_expanded_embd / tp; `gated` = gated MLP;
`in_features` / `out_features` = the GEMM's per-GPU shape (0 for non-GEMM ops); `time_s` = the
median of vidur's timed repetitions; `file` / `row` = where the row comes from (row = 0-based
data row in the file, i.e. line row + 2). Errors name lines the same way."""

COLLECTIVE_COLUMNS = ("node", "collective", "size_bytes", "num_workers", "devices_per_node",
                      "time_s", "file", "row")
"""Columns of a collective measurement table: `node` = vidur's node kind (directory name, e.g.
"a100_dgx"), `devices_per_node` = workers per node in the run (num_workers / devices_per_node
nodes take part), `time_s` = median NCCL kernel time."""

_SHAPE_COLUMNS = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size",
                  "use_gated_mlp", "num_tokens", "num_tensor_parallel_workers")
_COLLECTIVE_INPUT_COLUMNS = ("size", "num_workers", "devices_per_node")


@dataclass(frozen=True, slots=True)
class SourceFile:
    """One measurement file a table was read from, identified by content."""

    path: str
    """The path as given (resolved to an absolute path)."""
    sha256: str
    """Hex sha256 of the file's bytes."""
    kind: str
    """"compute" or "collective"."""
    label: str
    """What the file measures: "<gpu>/<org>/<model>" for compute, "<node>/<collective>" else."""


@dataclass(frozen=True)
class Measurements:
    """Everything read from a set of measurement files; the tables are never modified."""

    compute: pd.DataFrame
    """Compute rows, columns `COMPUTE_COLUMNS`."""
    collectives: pd.DataFrame
    """Collective rows, columns `COLLECTIVE_COLUMNS`."""
    files: tuple[SourceFile, ...]
    """The files read, sorted by label."""


def _read_csv(path: Path) -> pd.DataFrame:
    try:
        table = pd.read_csv(path)
    except FileNotFoundError:
        raise ConfigError(f"{path}: measurement file not found") from None
    except UnicodeDecodeError:
        raise not_utf8(path) from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        raise ConfigError(f"{path}: not a readable CSV file ({str(e).splitlines()[0]})") from None
    if table.empty:
        raise ConfigError(f"{path}: no measurement rows (a header only)")
    return table


def _numeric(table: pd.DataFrame, column: str, path: Path, *, positive: bool = True) -> np.ndarray:
    """Column `column` as float64, ConfigError naming file, column and first bad row otherwise."""
    if column not in table.columns:
        raise ConfigError(f"{path}: missing column {column!r}")
    if table[column].dtype == bool:     # true/false read as 1 and 0
        raise ConfigError(f"{path}: line 2 column {column!r} has "
                          f"{table[column].iloc[0]!r}, expected a number")
    values = pd.to_numeric(table[column], errors="coerce").to_numpy(dtype=float)
    bad = ~np.isfinite(values) | ((values <= 0) if positive else (values < 0))
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise ConfigError(f"{path}: line {row + 2} column {column!r} has "
                          f"{table[column].iloc[row]!r}, expected a "
                          f"{'positive' if positive else 'non-negative'} number")
    return values


def _integers(table: pd.DataFrame, column: str, path: Path) -> np.ndarray:
    values = _numeric(table, column, path)
    if (values != np.round(values)).any():
        row = int(np.flatnonzero(values != np.round(values))[0])
        raise ConfigError(f"{path}: line {row + 2} column {column!r} has {values[row]!r}, "
                          f"expected an integer")
    return values.astype(np.int64)


def _booleans(table: pd.DataFrame, column: str, path: Path) -> np.ndarray:
    if column not in table.columns:
        raise ConfigError(f"{path}: missing column {column!r}")
    text = table[column].astype(str).str.strip().str.lower()
    known = text.isin(("true", "false", "1", "0"))
    if not known.all():
        row = int(np.flatnonzero(~known.to_numpy())[0])
        raise ConfigError(f"{path}: line {row + 2} column {column!r} has "
                          f"{table[column].iloc[row]!r}, expected True or False")
    return text.isin(("true", "1")).to_numpy()


def _layout_parts(path: Path, anchor: str, depth: int) -> tuple[str, ...] | None:
    """The `depth` directory names after `anchor` in `path`, or None outside that layout."""
    parts = path.parts
    for i in range(len(parts) - 1, -1, -1):
        if parts[i] == anchor and len(parts) > i + depth:
            return parts[i + 1:i + 1 + depth]
    return None


def read_compute_csv(path: str | Path, *, gpu: str | None = None,
                     model: str | None = None) -> pd.DataFrame:
    """The compute rows of one vidur `mlp.csv`, columns `COMPUTE_COLUMNS`.

    `gpu` and `model` default to the directory names of the vidur layout
    (`compute/<gpu>/<org>/<model>/mlp.csv`); outside that layout they must be given. Ops without
    a `time_stats.<op>.median` column are absent; one op with some stats but no median, a missing
    shape column, or a non-numeric value is a ConfigError naming the file and column.
    """
    path = Path(path).resolve()
    parts = _layout_parts(path, "compute", 3)
    gpu = gpu or (parts[0] if parts else None)
    model = model or ("/".join(parts[1:]) if parts else None)
    if gpu is None or model is None:
        raise ConfigError(f"{path}: not in vidur's compute/<gpu>/<org>/<model>/ layout; "
                          f"name the GPU and model explicitly")
    table = _read_csv(path)
    ops = [op for op in COMPUTE_OPS
           if any(c.startswith(f"time_stats.{op}.") for c in table.columns)]
    for op in ops:
        if f"time_stats.{op}.median" not in table.columns:
            raise ConfigError(f"{path}: missing column 'time_stats.{op}.median'")
    if not ops:
        raise ConfigError(f"{path}: no 'time_stats.<op>.median' column for any of "
                          f"{', '.join(COMPUTE_OPS)}")
    n_head, n_kv_head, n_embd, n_ffn, vocab, num_tokens, tp = (
        _integers(table, c, path) for c in _SHAPE_COLUMNS if c != "use_gated_mlp")
    gated = _booleans(table, "use_gated_mlp", path)
    for name, numerator, denominator in (("n_embd / n_head", n_embd, n_head),
                                         ("n_head / tensor parallel", n_head, tp),
                                         ("n_kv_head / tensor parallel", n_kv_head, tp),
                                         ("n_expanded_embd / tensor parallel", n_ffn, tp)):
        if (numerator % denominator).any():
            row = int(np.flatnonzero(numerator % denominator)[0])
            raise ConfigError(f"{path}: line {row + 2}: {name} is not a whole number")
    head_dim = n_embd // n_head
    q_features = n_head // tp * head_dim
    kv_features = n_kv_head // tp * head_dim
    ffn_features = n_ffn // tp
    gemm_shapes = {
        "attn_pre_proj": (n_embd, q_features + 2 * kv_features),
        "attn_post_proj": (q_features, n_embd),
        "mlp_up_proj": (n_embd, np.where(gated, 2, 1) * ffn_features),
        "mlp_down_proj": (ffn_features, n_embd),
    }
    zero = np.zeros(len(table), dtype=np.int64)
    frames = []
    for op in ops:
        column = f"time_stats.{op}.median"
        time_s = pd.to_numeric(table[column], errors="coerce").to_numpy(dtype=float) * MS
        bad = ~np.isfinite(time_s) | (time_s <= 0)
        if bad.all():
            continue
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise ConfigError(f"{path}: line {row + 2} column {column!r} has "
                              f"{table[column].iloc[row]!r}, expected a positive number")
        in_features, out_features = gemm_shapes.get(op, (zero, zero))
        frames.append(pd.DataFrame({
            "gpu": gpu, "model": model, "op": op, "num_tokens": num_tokens, "tp": tp,
            "hidden": n_embd, "vocab_per_gpu": vocab // tp, "q_features": q_features,
            "kv_features": kv_features, "ffn_features": ffn_features, "gated": gated,
            "in_features": np.asarray(in_features, dtype=np.int64),
            "out_features": np.asarray(out_features, dtype=np.int64),
            "time_s": time_s, "file": str(path), "row": np.arange(len(table), dtype=np.int64)}))
    if not frames:
        raise ConfigError(f"{path}: no positive time in any 'time_stats.<op>.median' column")
    return pd.concat(frames, ignore_index=True)


def read_collective_csv(path: str | Path, *, node: str | None = None) -> pd.DataFrame:
    """The rows of one vidur collective CSV, columns `COLLECTIVE_COLUMNS`.

    `node` defaults to the directory name (`network/<node>/<collective>.csv`); the collective is
    read from the `collective` column, else from the file name. Missing columns and non-numeric
    values are a ConfigError naming the file and column.
    """
    path = Path(path).resolve()
    node = node or path.parent.name
    table = _read_csv(path)
    if "collective" in table.columns:
        names = table["collective"].astype(str).str.strip()
    else:
        names = pd.Series(path.stem, index=table.index)
    unknown = ~names.isin(COLLECTIVES)
    if unknown.any():
        row = int(np.flatnonzero(unknown.to_numpy())[0])
        raise ConfigError(f"{path}: line {row + 2} column 'collective' has {names.iloc[row]!r}, "
                          f"expected one of {', '.join(COLLECTIVES)}")
    size, num_workers, devices_per_node = (_integers(table, c, path)
                                           for c in _COLLECTIVE_INPUT_COLUMNS)
    time_s = np.empty(len(table))
    for collective in names.unique():
        column = f"time_stats.{collective}.median"
        rows = (names == collective).to_numpy()
        time_s[rows] = _numeric(table, column, path)[rows] * MS
    return pd.DataFrame({
        "node": node, "collective": names.to_numpy(dtype=object), "size_bytes": size,
        "num_workers": num_workers, "devices_per_node": devices_per_node, "time_s": time_s,
        "file": str(path), "row": np.arange(len(table), dtype=np.int64)})


def find_measurement_files(paths: list[str | Path]) -> list[tuple[Path, str]]:
    """The measurement files under `paths` (files or directories, searched recursively), each
    with its kind ("compute" for `mlp.csv`, "collective" for `all_reduce.csv` / `send_recv.csv`),
    sorted by path. A path that does not exist, or a directory holding none, is a ConfigError."""
    found: dict[Path, str] = {}
    for given in paths:
        path = Path(given).resolve()
        if path.is_dir():
            files = sorted(p for p in path.rglob("*.csv") if _kind(p) is not None)
            if not files:
                raise ConfigError(f"{given}: no measurement files (mlp.csv, all_reduce.csv, "
                                  f"send_recv.csv) under this directory")
        elif path.is_file():
            if _kind(path) is None:
                raise ConfigError(f"{given}: not a measurement file; expected mlp.csv, "
                                  f"all_reduce.csv or send_recv.csv")
            files = [path]
        else:
            raise ConfigError(f"{given}: no such file or directory")
        for f in files:
            found[f] = _kind(f)
    return sorted(found.items())


def _kind(path: Path) -> str | None:
    if path.name == "mlp.csv":
        return "compute"
    if path.stem in COLLECTIVES:
        return "collective"
    return None


def load_measurements(paths: list[str | Path], *, gpu: str | None = None) -> Measurements:
    """Read every measurement file under `paths`. With `gpu` (vidur's directory name, e.g.
    "a100"), compute files of other GPUs are skipped; collective files are all kept."""
    compute, collectives, files = [], [], []
    for path, kind in find_measurement_files(paths):
        if kind == "compute":
            table = read_compute_csv(path)
            if gpu is not None and table["gpu"].iloc[0] != gpu:
                continue
            compute.append(table)
            label = f"{table['gpu'].iloc[0]}/{table['model'].iloc[0]}"
        else:
            table = read_collective_csv(path)
            collectives.append(table)
            label = f"{table['node'].iloc[0]}/{path.stem}"
        files.append(SourceFile(str(path), file_sha256(path), kind, label))
    empty_compute = pd.DataFrame({c: [] for c in COMPUTE_COLUMNS})
    empty_collectives = pd.DataFrame({c: [] for c in COLLECTIVE_COLUMNS})
    return Measurements(
        compute=pd.concat(compute, ignore_index=True) if compute else empty_compute,
        collectives=pd.concat(collectives, ignore_index=True) if collectives else empty_collectives,
        files=tuple(sorted(files, key=lambda f: (f.kind, f.label))))
