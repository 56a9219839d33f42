"""Fit a kernel profile from NVIDIA AIConfigurator's database of kernels measured with vLLM.

The package `aiconfigurator-core` (Apache-2.0) ships, per system, parquet tables of kernel
latencies measured inside vLLM's own backends:
`aiconfigurator_core/systems/data/<system>/<op>/vllm/<version>/*.parquet`. Only those tables are
read here (never the package's estimator code): GEMMs (`gemm_perf`), context and generation
attention (`context_attention_perf`, `generation_attention_perf`), vLLM's whole MLA attention
module (`mla_context_module_perf`, `mla_generation_module_perf`: `simcore.calibration.mla`),
fused MoE (`moe_perf`) and vLLM's all-reduce (`custom_allreduce_perf`), vLLM's fp8 activation
quantization (`quantize/.../scale_matrix_perf`: one memory-bound pass, bf16 read and fp8 written)
and, from
the NCCL tables measured beside them (`comm/nccl/<version>/nccl_perf`), NCCL's all-gather in
16-bit elements. Latencies there are milliseconds per call (one layer); collective sizes are
16-bit elements (an all-gather's, the whole output).

Per table, of the newest vLLM version measured on the system:
- one kernel per dtype (or per dtype and MoE shape): the one with the most rows, the kernel vLLM
  ran by default in the campaign (MLA modules: per cell the backend vLLM chose, on its default
  16-bit prefill-query path);
- the median latency of repeated rows, on the product grid of the measured axis values;
- a seeded 15% of each axis's interior values held out: the grid is fitted without them, and the
  relative error of predicting the measured times there (`LogGrid` interpolation) is the
  table's declared error;
- the missing cells past a line's last measured cell extrapolated in log-log space with the
  line's last slope (decode attention is measured up to a KV-memory limit: larger batches at long
  sequences grow linearly).

One table has a second framework's measurements: vLLM's Marlin fused-MoE kernel (4-bit weights,
16-bit activations: how vLLM runs int4 experts, and MXFP4 experts on GPUs without FP4 tensor
cores) is the kernel SGLang runs for them too, and AIConfigurator measured it in SGLang at shapes
vLLM's campaign did not (`moe/sglang/<version>/moe_perf`; on A100 only there). Where a system's
vLLM table lacks a Marlin shape SGLang measured, the profile takes SGLang's curve (the newest
SGLang version measuring it; the curve's kernel named as SGLang names it), and where both
measured one without expert parallelism, their disagreement is the family
`moe/marlin/sglang_vs_vllm`: SGLang's time taken as vLLM's at the same tokens (H100 and H200:
6-7% in median, 23-25% at the 90th percentile).

`fit_system` returns the profile; `dse calibrate --from-aiconfigurator SYSTEM` writes it.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from simcore.calibration.grid import LogGrid, fill_along
from simcore.calibration.kernels import (
    CONTEXT_CAPS, DECODE_CAPS, FORMAT, GEMM_CAPS, GEMM_FLOORS, VERSION, KernelProfile,
    MOE_ROUTINGS, KernelProfileData, relative_errors)
from simcore.calibration.mla import fit_mla
from simcore.calibration.profile import ErrorStats
from simcore.errors import ConfigError
from simcore.loading import file_sha256

PACKAGE = "aiconfigurator-core"
MODULE = "aiconfigurator_core"

SYSTEMS: dict[str, str] = {
    "h100_sxm": "H100-SXM",
    "h200_sxm": "H200",
    "b200_sxm": "B200",
    "b300_sxm": "B300",
    "gb200": "GB200",
    "a100_sxm": "A100-80GB",
    "l40s": "L40S",
}
"""AIConfigurator system -> GPU catalog name, for the systems with vLLM measurements and a
catalog entry."""

DTYPES = {"bfloat16": "bf16", "float16": "fp16", "fp8": "fp8", "fp8_block": "fp8_block",
          "nvfp4": "nvfp4", "int4_wo": "int4_wo", "w4a16_mxfp4": "mxfp4_w4a16",
          "w4a4_mxfp4": "mxfp4"}
"""The measurements' dtype names -> the profile's."""

HOLDOUT_FRACTION = 0.15
DEFAULT_SEED = 0
_SIG = 4
"""Significant digits kept of each time (the measurements' run-to-run spread is larger)."""


def _round(x: float) -> float:
    return float(f"{x:.{_SIG}g}")


def data_root() -> Path:
    """The installed package's `systems/data` folder; ConfigError when it is not installed."""
    spec = importlib.util.find_spec(MODULE)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"--from-aiconfigurator: the package {PACKAGE} is not installed "
                          f"(pip install {PACKAGE} pyarrow, or pip install -e '.[aiconfigurator]')")
    root = Path(list(spec.submodule_search_locations)[0]) / "systems" / "data"
    if not root.is_dir():
        raise ConfigError(f"--from-aiconfigurator: {root} is missing from the installed "
                          f"{PACKAGE}")
    return root


def package_version() -> str:
    try:
        return importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def available_systems(root: Path | None = None) -> list[str]:
    """Systems of the installed package with vLLM GEMM measurements."""
    root = root or data_root()
    return sorted(p.name for p in root.iterdir() if (p / "gemm" / "vllm").is_dir())


def _version_key(v: str) -> tuple:
    out = []
    for part in v.split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits) if digits else -1)
    return tuple(out)


@dataclass
class _Reader:
    root: Path
    system: str

    def __post_init__(self):
        self.files: list[dict] = []
        self.device = "unknown"     # the GPU as the first table read names it

    def table(self, op: str, name: str, framework: str = "vllm"):
        """The newest version's `name` table of `op` measured with `framework` (vLLM, or NCCL
        for its own collectives), or None."""
        versions = self.versions(op, name, framework)
        return self.read(versions[-1] / name) if versions else None

    def versions(self, op: str, name: str, framework: str) -> list[Path]:
        """The folders of every version with a `name` table of `op` measured with
        `framework`, oldest first."""
        base = self.root / self.system / op / framework
        if not base.is_dir():
            return []
        return sorted((p for p in base.iterdir() if (p / name).is_file()),
                      key=lambda p: _version_key(p.name))

    def read(self, path: Path, keep=None):
        """The table at `path`; recorded in the provenance (`keep(df)`, where given, picks the
        rows read: a file none of whose rows are kept is neither returned nor recorded)."""
        import pandas as pd

        try:
            df = pd.read_parquet(path)
        except ImportError as e:
            raise ConfigError(f"--from-aiconfigurator: reading parquet needs pyarrow ({e})") \
                from None
        if keep is not None:
            df = df[keep(df)]
            if not len(df):
                return None
        self.files.append({"path": str(path.relative_to(self.root)), "sha256": file_sha256(path),
                           "rows": int(len(df)), "framework_version": path.parent.name})
        if len(self.files) == 1 and "device" in df.columns and len(df):
            self.device = str(df["device"].iloc[0])
        return df


def _holdout(values, rng: np.random.Generator) -> list:
    """A seeded share of the interior values of an axis (never its ends)."""
    values = sorted(values)
    interior = values[1:-1]
    n = int(round(HOLDOUT_FRACTION * len(interior)))
    if n == 0:
        return []
    return sorted(rng.choice(interior, size=n, replace=False).tolist())


def _stats(errors: list[float], n_train: int) -> ErrorStats:
    if not errors:
        return ErrorStats(n_train=n_train, n=0, median=None, p90=None, p99=None, max=None)
    e = np.asarray(errors)
    return ErrorStats(n_train=n_train, n=len(e), median=float(np.median(e)),
                      p90=float(np.quantile(e, 0.9)), p99=float(np.quantile(e, 0.99)),
                      max=float(e.max()))


def _grid(df, axes: list[str]) -> tuple[list[list[int]], np.ndarray]:
    """Median latency (seconds) on the product of each axis's measured values, NaN elsewhere."""
    med = df.groupby(axes)["latency"].median()
    ax_vals = [sorted(int(v) for v in df[a].unique()) for a in axes]
    arr = np.full([len(v) for v in ax_vals], np.nan)
    index = [{v: i for i, v in enumerate(vals)} for vals in ax_vals]
    for key, lat in med.items():
        key = key if isinstance(key, tuple) else (key,)
        arr[tuple(index[d][int(k)] for d, k in enumerate(key))] = lat / 1e3
    return ax_vals, arr


def _fit_grid(ax_vals, arr, held: list[list[int]], caps, fill: list[int], floors=None):
    """(train axes, train values filled, errors on held-out measured cells)."""
    keep = [[i for i, v in enumerate(vals) if v not in set(h)] for vals, h in zip(ax_vals, held)]
    train = arr[np.ix_(*keep)]
    train_axes = [[ax_vals[d][i] for i in keep[d]] for d in range(len(ax_vals))]
    for d in fill:
        train = fill_along(train, np.asarray(train_axes[d]), d, caps[d])
    grid = LogGrid(train_axes, train, caps, floors)
    held_sets = [set(h) for h in held]
    pred, meas = [], []
    for idx in zip(*np.nonzero(np.isfinite(arr))):
        point = [ax_vals[d][i] for d, i in enumerate(idx)]
        if not any(p in held_sets[d] for d, p in enumerate(point)):
            continue
        pred.append(grid(*point))
        meas.append(arr[idx])
    n_train = int(np.isfinite(arr[np.ix_(*keep)]).sum())
    return train_axes, train, relative_errors(pred, meas), n_train


def _flat_us(arr: np.ndarray) -> list:
    return [None if not np.isfinite(v) else _round(v * 1e6) for v in arr.ravel().tolist()]


def _pick_kernel(df, by: list[str]) -> "object":
    """Rows of the kernel with the most rows within each group of `by`."""
    counts = df.groupby(by + ["kernel_source"]).size().reset_index(name="rows")
    best = counts.sort_values(by + ["rows", "kernel_source"], ascending=[True] * len(by)
                              + [False, True]).drop_duplicates(by)
    return df.merge(best[by + ["kernel_source"]], on=by + ["kernel_source"])


def _gemm(reader: _Reader, rng, errors) -> list[dict]:
    df = reader.table("gemm", "gemm_perf.parquet")
    if df is None:
        return []
    out = []
    df = _pick_kernel(df, ["gemm_dtype"])
    for raw_dtype, grp in sorted(df.groupby("gemm_dtype"), key=lambda x: x[0]):
        dtype = DTYPES.get(raw_dtype, raw_dtype)
        ax_vals, arr = _grid(grp, ["m", "n", "k"])
        held = [_holdout(v, rng) for v in ax_vals]
        axes, train, errs, n_train = _fit_grid(ax_vals, arr, held, GEMM_CAPS, fill=[0],
                                                 floors=GEMM_FLOORS)
        errors[f"gemm/{dtype}"] = _stats(errs, n_train)
        out.append({"dtype": dtype, "kernel": str(grp["kernel_source"].iloc[0]),
                    "m": axes[0], "n": axes[1], "k": axes[2], "time_us": _flat_us(train),
                    "held_out": {"m": held[0], "n": held[1], "k": held[2]}})
    return out


def _attention(reader: _Reader, rng, errors, window_rng) -> list[dict]:
    """Attention grids per phase, KV-cache dtype, head shape and window (0: full attention);
    the full-attention grids hold out with `rng`, the sliding-window ones with `window_rng` (so
    adding them left every other table's draws as they were)."""
    out = []
    for phase, name, caps in (("context", "context_attention_perf.parquet", CONTEXT_CAPS),
                              ("generation", "generation_attention_perf.parquet", DECODE_CAPS)):
        table = reader.table("attention", name)
        if table is None:
            continue
        for col, default in (("window_size", 0), ("beam_width", 1), ("step", 0)):
            if col not in table.columns:       # older tables: full attention, no beams
                table[col] = default
        table = table[table["beam_width"] == 1]
        for window in sorted(int(w) for w in table["window_size"].unique()):
            df = table[table["window_size"] == window].copy()
            draw = rng if window == 0 else window_rng
            df["seq"] = df["isl"] + df["step"] if phase == "generation" else df["isl"]
            df = _pick_kernel(df, ["kv_cache_dtype"])
            held = [_holdout(df["batch_size"].unique(), draw),
                    _holdout(df["seq"].unique(), draw)]
            for raw_kv, by_kv in sorted(df.groupby("kv_cache_dtype"), key=lambda x: x[0]):
                kv = DTYPES.get(raw_kv, raw_kv)
                errs_all: list[float] = []
                n_all = 0
                for (h, kvh, hd), grp in sorted(by_kv.groupby(
                        ["num_heads", "num_key_value_heads", "head_dim"])):
                    ax_vals, arr = _grid(grp, ["batch_size", "seq"])
                    if len(ax_vals[0]) < 2 or len(ax_vals[1]) < 2:
                        continue
                    fill = [0] if phase == "generation" else [1, 0]
                    axes, train, errs, n_train = _fit_grid(ax_vals, arr, held, caps, fill=fill)
                    if not np.isfinite(train).any():
                        continue
                    errs_all += errs
                    n_all += n_train
                    out.append({"phase": phase, "kv_cache_dtype": kv,
                                "kernel": str(grp["kernel_source"].iloc[0]),
                                "num_heads": int(h), "num_kv_heads": int(kvh),
                                "head_dim": int(hd), "window": window,
                                "batch": axes[0], "seq": axes[1], "time_us": _flat_us(train),
                                "held_out": {"batch": held[0], "seq": held[1]}})
                if n_all:
                    family = f"attention/{phase}/{kv}" + (f"/window{window}" if window else "")
                    errors[family] = _stats(errs_all, n_all)
    return out


def _curve_fit(x: list[int], t_s: list[float], rng) -> tuple[list[int], list[float], list[int],
                                                               list[float]]:
    """A 1-D log-log curve without a seeded share of its interior points, and its errors."""
    from simcore.calibration.curves import KnotCurve

    held = set(_holdout(x, rng))
    tx = [v for v in x if v not in held]
    ty = [t for v, t in zip(x, t_s) if v not in held]
    curve = KnotCurve(tx, ty, log_log=True)
    errs = relative_errors([curve(v) for v in x if v in held],
                           [t for v, t in zip(x, t_s) if v in held])
    return tx, ty, sorted(held), errs


MARLIN_DTYPES = ("int4_wo", "w4a16_mxfp4")
"""The fused-MoE tables (the measurements' names) whose Marlin rows SGLang's measurements fill."""

_MOE_SHAPE = ["moe_dtype", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size",
              "moe_ep_size", "distribution"]


def _is_marlin(df):
    """Rows of vLLM's Marlin fused-MoE kernel (as either framework names it) in its tables."""
    return df["moe_dtype"].isin(MARLIN_DTYPES) & df["kernel_source"].str.contains("marlin")


def _sglang_marlin(reader: _Reader) -> list:
    """SGLang's Marlin fused-MoE rows of each SGLang version on the system, newest first (the
    files recorded with the rows read)."""
    keep = lambda df: _is_marlin(df) & df["distribution"].isin(MOE_ROUTINGS)  # noqa: E731
    out = []
    for folder in reversed(reader.versions("moe", "moe_perf.parquet", "sglang")):
        df = reader.read(folder / "moe_perf.parquet", keep)
        if df is not None:
            out.append(df)
    return out


def _moe(reader: _Reader, rng, errors, skewed_rng, second_rng) -> list[dict]:
    """Fused-MoE curves per dtype, shape and routing; the balanced ones hold out with `rng`, the
    power-law ones with `skewed_rng`, SGLang's Marlin curves (`_sglang_marlin`) with
    `second_rng` (so adding them left every other table's draws as they were)."""
    df = reader.table("moe", "moe_perf.parquet")
    if df is None:
        return []
    df = df[df["distribution"].isin(MOE_ROUTINGS)]
    shape = _MOE_SHAPE
    df = _pick_kernel(df, shape)
    out = []
    errs: dict[str, list[float]] = {}
    n_train: dict[str, int] = {}
    order = {r: i for i, r in enumerate(MOE_ROUTINGS)}

    def curves(table, draw):
        for key, grp in sorted(table.groupby(shape), key=lambda x: (order[x[0][-1]], x[0][:-1])):
            med = grp.groupby("num_tokens")["latency"].median()
            x = [int(v) for v in med.index]
            t = [float(v) / 1e3 for v in med.values]
            if len(x) < 3 or min(t) <= 0:
                continue
            dtype, routing = DTYPES.get(key[0], key[0]), str(key[-1])
            family = dtype if routing == "balanced" else f"{dtype}/{routing}"
            tx, ty, held, e = _curve_fit(x, t, draw(routing))
            errs.setdefault(family, []).extend(e)
            n_train[family] = n_train.get(family, 0) + len(tx)
            out.append({"dtype": dtype, "routing": routing,
                        "kernel": str(grp["kernel_source"].iloc[0]),
                        "hidden": int(key[1]), "inter": int(key[2]), "topk": int(key[3]),
                        "num_experts": int(key[4]), "tp": int(key[5]), "ep": int(key[6]),
                        "num_tokens": tx, "time_us": [_round(v * 1e6) for v in ty],
                        "held_out_num_tokens": held})

    curves(df, lambda routing: rng if routing == "balanced" else skewed_rng)
    sglang = _sglang_marlin(reader)
    if sglang:
        # Each shape vLLM's table lacks, from the newest SGLang version that measured it.
        taken = {tuple(k) for k, _ in df.groupby(shape)}
        rows = []
        for table in sglang:
            for k, grp in _pick_kernel(table, shape).groupby(shape):
                if tuple(k) not in taken:
                    taken.add(tuple(k))
                    rows.append(grp)
        if rows:
            import pandas as pd

            curves(pd.concat(rows), lambda routing: second_rng)
        _marlin_disagreement(df, sglang, errors)
    for family, e in errs.items():
        errors[f"moe/{family}"] = _stats(e, n_train[family])
    return out


def _marlin_disagreement(vllm, sglang: list, errors) -> None:
    """Where vLLM's table (`vllm`) and an SGLang one (`sglang`, newest first) both measured
    Marlin at a shape without expert parallelism, SGLang's median time taken as vLLM's at each
    token count both measured (the newest SGLang version's, where several did):
    `errors["moe/marlin/sglang_vs_vllm"]`, n_train the curves compared."""
    key = [*_MOE_SHAPE, "num_tokens"]
    # Without expert parallelism: the curves the step model times experts by.
    ours = vllm[_is_marlin(vllm) & (vllm["moe_ep_size"] == 1)].groupby(key)["latency"].median()
    errs: list[float] = []
    shapes: set = set()
    seen: set = set()
    for table in sglang:
        theirs = table.groupby(key)["latency"].median()
        for k in ours.index.intersection(theirs.index):
            if k not in seen:
                seen.add(k)
                shapes.add(k[:-1])
                errs.append(abs(float(theirs[k]) / float(ours[k]) - 1.0))
    if errs:
        errors["moe/marlin/sglang_vs_vllm"] = _stats(errs, len(shapes))


def _all_reduce(reader: _Reader, rng, errors) -> list[dict]:
    df = reader.table("comm", "custom_allreduce_perf.parquet")
    if df is None:
        return []
    out = []
    errs: dict[str, list[float]] = {}
    n_train: dict[str, int] = {}
    for (backend, n), grp in sorted(df.groupby(["backend", "num_gpus"])):
        mode = "graph" if "graph" in backend else "eager"
        med = grp.groupby("message_size")["latency"].median()
        x = [int(v) for v in med.index]
        t = [float(v) / 1e3 for v in med.values]
        tx, ty, held, e = _curve_fit(x, t, rng)
        errs.setdefault(mode, []).extend(e)
        n_train[mode] = n_train.get(mode, 0) + len(tx)
        out.append({"collective": "all_reduce", "mode": mode, "num_gpus": int(n),
                    "elements": tx, "time_us": [_round(v * 1e6) for v in ty],
                    "held_out_elements": held})
    for mode, e in errs.items():
        errors[f"all_reduce/{mode}"] = _stats(e, n_train[mode])
    return out


def _all_gather(reader: _Reader, rng, errors) -> list[dict]:
    df = reader.table("comm", "nccl_perf.parquet", framework="nccl")
    if df is None:
        return []
    df = df[(df["op_name"] == "all_gather") & (df["nccl_dtype"] == "half")]
    out, errs, n_train = [], [], 0
    for n, grp in sorted(df.groupby("num_gpus")):
        med = grp.groupby("message_size")["latency"].median()
        x = [int(v) for v in med.index]
        t = [float(v) / 1e3 for v in med.values]
        if len(x) < 3 or min(t) <= 0:
            continue
        tx, ty, held, e = _curve_fit(x, t, rng)
        errs.extend(e)
        n_train += len(tx)
        out.append({"collective": "all_gather", "mode": "nccl", "num_gpus": int(n),
                    "elements": tx, "time_us": [_round(v * 1e6) for v in ty],
                    "held_out_elements": held})
    if out:
        errors["all_gather/nccl"] = _stats(errs, n_train)
    return out


MEMORY_BINS_PER_OCTAVE = 4
"""Sizes of the memory-bound kernel's measured shapes are pooled in bins of a quarter octave."""


def _memory(reader: _Reader, rng, errors) -> list[dict]:
    """vLLM's static fp8 quantization (read m x k bf16, write m x k fp8: 3 bytes per element) as
    time against bytes moved: per quarter-octave bin of sizes the median size and the median
    latency, made non-decreasing (a larger pass never takes less time)."""
    df = reader.table("quantize", "scale_matrix_perf.parquet")
    if df is None or df.empty:
        return []
    counts = df["kernel_source"].value_counts()
    kernel = str(min(k for k, c in counts.items() if c == counts.max()))
    df = df[df["kernel_source"] == kernel]
    size = 3.0 * df["m"].astype(float) * df["k"].astype(float)
    bins = np.round(np.log2(size) * MEMORY_BINS_PER_OCTAVE)
    g = df.assign(bytes=size, bin=bins).groupby("bin")
    x = [int(round(v)) for v in g["bytes"].median().values]
    t = np.maximum.accumulate(g["latency"].median().values / 1e3).tolist()
    tx, ty, held, e = _curve_fit(x, t, rng)
    errors[f"memory/{kernel}"] = _stats(e, len(tx))
    return [{"kernel": kernel, "bytes_per_element": 3.0, "bytes": tx,
             "time_us": [_round(v * 1e6) for v in ty], "held_out_bytes": held}]


def fit_system(system: str, *, seed: int = DEFAULT_SEED, root: Path | None = None,
               gpu: str | None = None, profile_id: str | None = None) -> KernelProfile:
    """The kernel profile of one AIConfigurator system (e.g. "h100_sxm"), fitted from the
    installed package's vLLM tables."""
    root = root or data_root()
    if not (root / system).is_dir():
        raise ConfigError(f"--from-aiconfigurator: no system {system!r} in {PACKAGE} "
                          f"(systems with vLLM measurements: "
                          f"{', '.join(available_systems(root))})")
    known = SYSTEMS.get(system)
    if gpu is not None and known is not None and gpu != known:
        raise ConfigError(f"--gpu: {system!r} is measured on the {known}; --gpu names the "
                          f"catalog GPU only of a system the list does not know "
                          f"({', '.join(SYSTEMS)})")
    gpu = gpu or known
    if gpu is None:
        raise ConfigError(f"--from-aiconfigurator: {system!r} has no GPU in the catalog; name "
                          f"it with --gpu (known systems: {', '.join(SYSTEMS)})")
    reader = _Reader(root, system)
    rng = np.random.default_rng(seed)
    errors: dict[str, ErrorStats] = {}
    gemm = _gemm(reader, rng, errors)
    if not gemm:
        raise ConfigError(f"--from-aiconfigurator: {system!r} has no vLLM GEMM measurements")
    attention = _attention(reader, rng, errors, np.random.default_rng([seed, 2]))
    moe = _moe(reader, rng, errors, np.random.default_rng([seed, 1]),
               np.random.default_rng([seed, 3]))
    ar = _all_reduce(reader, rng, errors)
    ag = _all_gather(reader, rng, errors)
    memory = _memory(reader, rng, errors)
    mla = fit_mla(reader, rng, errors)      # last: the others' hold-out draws stay the same
    version = package_version()
    data = {
        "format": FORMAT, "version": VERSION,
        "profile_id": profile_id or f"{gpu.lower()}-aiconfigurator",
        "gpu": gpu,
        "provenance": {
            "source": f"NVIDIA AIConfigurator's kernel database ({PACKAGE} {version}, "
                      "Apache-2.0): kernels measured inside vLLM's own backends",
            "package": PACKAGE, "package_version": version, "system": system,
            "device": reader.device, "files": reader.files,
            "holdout": f"{HOLDOUT_FRACTION:.0%} of each axis's interior values (never its "
                       "ends), drawn once per table family, left out of the grid; errors are "
                       "on the measured cells at those values",
            "seed": seed,
            "method": "median latency per grid cell; multilinear interpolation of log time in "
                      "log shape; missing cells past a line's last measurement extrapolated "
                      "with its last log-log slope (capped: linear in rows, batch and KV "
                      "length, quadratic in prompt length)"},
        "gemm": gemm, "attention": attention, "moe": moe, "all_reduce": ar,
        "all_gather": ag, "memory": memory, "mla": mla,
        "errors": {k: v.model_dump() for k, v in sorted(errors.items())},
    }
    return KernelProfile(KernelProfileData.model_validate(data), source=f"{system} (fitted)")
