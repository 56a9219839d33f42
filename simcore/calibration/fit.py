"""Fitting a calibration profile from measurement tables: monotone curves per shape, shape-generic
fallbacks, collective curves, and their errors on rows held out of the fit.

Method (numpy only):

- Hold-out: for every curve (one op family at one shape key, or one collective group), a
  fraction of its distinct x values (token counts, message sizes) is held out, never the
  smallest or the largest, so held-out rows test interpolation inside the fitted range. The
  values are drawn without replacement by a numpy Generator seeded from (seed, sha256 of the
  curve's label), so each curve's split depends only on the seed and its own label, and the
  profile lists the held-out values of every curve.
- Token curves: the training rows' median time at each distinct token count, made
  non-decreasing by weighted isotonic regression (pool-adjacent-violators, weights = rows per
  token count), then thinned: knots whose removal moves the curve by at most `knot_tolerance`
  (relative) at every dropped knot are dropped. Shared shapes pool rows of every model and TP
  degree that ran them.
- GEMM fallback (`GenericGemm`): relative least squares of a four-term cost model, combined
  with the nearest measured shapes' curves; its error is measured leaving one source model out
  (every row of the model predicted without any curve of a shape it has).
- Elementwise fallback: per op, the same monotone fit of time against elements (tokens x width)
  pooled over all shapes, with the same leave-one-model-out error.
- Collectives: the same monotone fit against message size, thinned in log-log; plus an
  alpha-beta fit (relative least squares, non-negative) per group.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from simcore.calibration.curves import GemmFallback, KnotCurve
from simcore.calibration.measurements import Measurements, load_measurements
from simcore.calibration.ops import COMPUTE_OPS, ELEMENTWISE_WIDTH, OP_KEY_FIELDS, family
from simcore.calibration.profile import (
    FORMAT, US_PER_S, VERSION, Backend, CalibrationProfile, CollectiveCurve, ElementCurve,
    ErrorModel, ErrorStats, GenericGemm, HoldoutRecord, ProfileData, Provenance, SourceRecord,
    TokenCurve, ValidRange, s_from_us)
from simcore.errors import ConfigError
from simcore.hardware import get_gpu
from simcore.units import GB

VIDUR_GPU_NAMES = {"a100": "A100-80GB", "h100": "H100-SXM", "a40": "A40"}
"""vidur's GPU directory names -> GPU catalog names (vidur's A100 and H100 are the 80 GB SXM
parts)."""

VIDUR_BACKEND = Backend(
    compute="vidur's profiler (vidur/profiling/mlp) running Sarathi-Serve's vLLM-derived layers "
            "in fp16: GEMMs through torch linear layers (cuBLAS), RMSNorm, SiLU-and-multiply "
            "and rotary-embedding CUDA kernels; models without a gated MLP (phi-2) use torch "
            "LayerNorm and GELU and a three-way residual add. Each time is the median of 20 "
            "timed runs after 2 warm-up runs.",
    communication="NCCL through torch.distributed, without CUDA graphs; each time is the median "
                  "kernel time (Kineto) of back-to-back launches; size = elements x 2 bytes "
                  "(fp16).",
    versions="unknown")
"""What vidur's published profiles ran on, as far as its profiling code says."""

HOLDOUT_RULE = ("for each curve, round(fraction x n) of its n distinct x values (token counts or "
                "message sizes), never the smallest or largest, drawn without replacement by "
                "numpy.random.default_rng(SeedSequence([seed, first 8 bytes of sha256(curve label) "
                "as an integer])); every row at a held-out x is left out of that curve's fit.")

_METHOD = ("token curves: per-token-count median of the training rows, weighted isotonic "
           "regression (pool-adjacent-violators), knots thinned within knot_tolerance; linear "
           "between knots, flat below the first, proportional to tokens beyond the last. "
           "Collectives: the same against message size, log-log between knots, plus an "
           "alpha-beta relative least-squares fit. Fallbacks: see generic_gemm and "
           "generic_elementwise.")


@dataclass(frozen=True, slots=True)
class FitOptions:
    """How a profile is fitted."""

    holdout_fraction: float = 0.2
    """Fraction of each curve's distinct x values held out (0 = fit on everything)."""
    seed: int = 0
    """Seed of the hold-out draw."""
    knot_tolerance: float = 0.01
    """Largest relative change of a curve allowed when dropping knots."""
    gemm_neighbors: int = 4
    """Measured shapes combined by the GEMM fallback."""

    def check(self) -> None:
        if not 0 <= self.holdout_fraction < 1:
            raise ConfigError(f"holdout fraction must be in [0, 1), got {self.holdout_fraction}")
        if self.seed < 0:
            raise ConfigError(f"seed must be non-negative, got {self.seed}")
        if self.knot_tolerance < 0 or self.gemm_neighbors < 1:
            raise ConfigError("knot tolerance must be >= 0 and GEMM neighbours >= 1")


# ---- numerical pieces ----------------------------------------------------------------------

def isotonic(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The non-decreasing sequence closest to `y` in weighted least squares (pool adjacent
    violators)."""
    values: list[float] = []
    weights: list[float] = []
    counts: list[int] = []
    for yi, wi in zip(np.asarray(y, dtype=float).tolist(), np.asarray(w, dtype=float).tolist()):
        values.append(yi)
        weights.append(wi)
        counts.append(1)
        while len(values) > 1 and values[-2] > values[-1]:
            w_sum = weights[-2] + weights[-1]
            v = (values[-2] * weights[-2] + values[-1] * weights[-1]) / w_sum
            c = counts[-2] + counts[-1]
            del values[-1], weights[-1], counts[-1]
            values[-1], weights[-1], counts[-1] = v, w_sum, c
    return np.repeat(values, counts)


def thin_knots(x: np.ndarray, y: np.ndarray, tolerance: float, *,
               log_log: bool = False) -> np.ndarray:
    """Mask of the knots to keep: the ends, and recursively the knot farthest (relative) from the
    interpolation between kept knots while that distance exceeds `tolerance`."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    keep = np.zeros(len(x), dtype=bool)
    keep[[0, -1]] = True
    u, v = (np.log(x), np.log(y)) if log_log else (x, y)
    stack = [(0, len(x) - 1)]
    while stack:
        a, b = stack.pop()
        if b - a < 2:
            continue
        inner = np.interp(u[a + 1:b], [u[a], u[b]], [v[a], v[b]])
        approx = np.exp(inner) if log_log else inner
        dev = np.abs(approx - y[a + 1:b]) / y[a + 1:b]
        i = int(np.argmax(dev))
        if dev[i] > tolerance:
            j = a + 1 + i
            keep[j] = True
            stack += [(a, j), (j, b)]
    return keep


def nonneg_lstsq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares with non-negative coefficients: a coefficient that comes out negative is
    fixed at zero (the most negative first) and the fit repeated."""
    active = list(range(a.shape[1]))
    coef = np.zeros(a.shape[1])
    while active:
        sol = np.linalg.lstsq(a[:, active], b, rcond=None)[0]
        if (sol >= 0).all():
            coef[active] = sol
            return coef
        del active[int(np.argmin(sol))]
    return coef


def held_out_values(values: np.ndarray, fraction: float, seed: int, label: str) -> np.ndarray:
    """The x values of one curve to hold out (sorted), per `HOLDOUT_RULE`."""
    values = np.unique(values)
    num = min(int(round(fraction * len(values))), max(len(values) - 2, 0))
    if num == 0:
        return values[:0]
    digest = int.from_bytes(hashlib.sha256(label.encode()).digest()[:8], "little")
    rng = np.random.default_rng(np.random.SeedSequence([seed, digest]))
    return np.sort(rng.choice(values[1:-1], size=num, replace=False))


def _round(values: np.ndarray, digits: int = 5) -> list[float]:
    return [float(f"{v:.{digits}g}") for v in np.asarray(values, dtype=float).tolist()]


def _monotone_fit(x: np.ndarray, t: np.ndarray, tolerance: float, *,
                  log_log: bool = False) -> tuple[list[int], list[float]]:
    """Knots (x, time in microseconds) of the thinned isotonic fit of rows (x, t seconds)."""
    order = np.argsort(x, kind="stable")
    x, t = x[order], t[order]
    ux, start, count = np.unique(x, return_index=True, return_counts=True)
    med = np.array([np.median(t[s:s + c]) for s, c in zip(start, count)])
    fit = isotonic(med, count)
    keep = thin_knots(ux, fit, tolerance, log_log=log_log)
    return [int(v) for v in ux[keep]], _round(fit[keep] * US_PER_S)


def _stats(rel_err: np.ndarray, n_train: int) -> ErrorStats:
    e = np.asarray(rel_err, dtype=float)
    if len(e) == 0:
        return ErrorStats(n_train=n_train, n=0, median=None, p90=None, p99=None, max=None)
    q = np.quantile(e, [0.5, 0.9, 0.99])
    r = _round(np.array([*q, e.max()]), 4)
    return ErrorStats(n_train=n_train, n=len(e), median=r[0], p90=r[1], p99=r[2], max=r[3])


def _relative_error(predicted: np.ndarray, measured: np.ndarray) -> np.ndarray:
    return np.abs(predicted - measured) / measured


# ---- naming --------------------------------------------------------------------------------

def catalog_gpu_name(source_gpu: str) -> str:
    """The GPU catalog's name for a measurement directory's GPU name ("a100" -> "A100-80GB")."""
    name = VIDUR_GPU_NAMES.get(source_gpu.lower(), source_gpu)
    try:
        return get_gpu(name).name
    except ConfigError as e:
        raise ConfigError(f"measurements of GPU {source_gpu!r}: {e}") from None


def _source_gpu(compute: pd.DataFrame, gpu: str | None) -> str:
    found = sorted(compute["gpu"].unique()) if len(compute) else []
    if gpu is None:
        if len(found) != 1:
            raise ConfigError("the measurements hold compute rows of "
                              + (f"several GPUs ({', '.join(found)}); name one"
                                 if found else "no GPU (no mlp.csv file)"))
        return found[0]
    for g in found:
        if gpu.lower() in (g.lower(), VIDUR_GPU_NAMES.get(g.lower(), g).lower()):
            return g
    raise ConfigError(f"GPU {gpu!r}: no compute measurements of it; found "
                      f"{', '.join(found) or 'none'}")


def _choose_node(collectives: pd.DataFrame, source_gpu: str, node: str | None) -> str | None:
    nodes = sorted(collectives["node"].unique()) if len(collectives) else []
    if node is not None:
        if node not in nodes:
            raise ConfigError(f"node {node!r}: no collective measurements of it; found "
                              f"{', '.join(nodes) or 'none'}")
        return node
    mine = [n for n in nodes if n.lower().startswith(f"{source_gpu.lower()}_")]
    if f"{source_gpu}_dgx" in mine:
        return f"{source_gpu}_dgx"
    if len(mine) > 1:
        raise ConfigError(f"several nodes measured for {source_gpu} ({', '.join(mine)}); "
                          f"name one")
    return mine[0] if mine else None


def _record_path(path: str, root: str) -> str:
    parts = Path(path).parts
    if "profiling" in parts:
        i = len(parts) - 1 - parts[::-1].index("profiling")
        return "/".join(parts[i:])
    return Path(os.path.relpath(path, root)).as_posix()


def _key_label(fam: str, key: tuple) -> str:
    return fam + "|" + "|".join(f"{f}={v}" for f, v in zip(OP_KEY_FIELDS[fam], key))


# ---- the fit -------------------------------------------------------------------------------

def _token_curves(rows: pd.DataFrame, options: FitOptions):
    """Token curves of every (family, key), and the rows with columns `held_out` and
    `predicted_s` (the curve's prediction for held-out rows, NaN for training rows)."""
    curves: list[TokenCurve] = []
    held = np.zeros(len(rows), dtype=bool)
    predicted = np.full(len(rows), np.nan)
    rows = rows.reset_index(drop=True)
    for fam in OP_KEY_FIELDS:
        fields = list(OP_KEY_FIELDS[fam])
        sub = rows[rows["family"] == fam]
        for key, grp in sub.groupby(fields, sort=True):
            key = tuple(int(k) for k in key)
            x = grp["num_tokens"].to_numpy()
            out = held_out_values(x, options.holdout_fraction, options.seed,
                                  _key_label(fam, key))
            test = np.isin(x, out)
            train = grp[~test]
            knots_x, knots_us = _monotone_fit(train["num_tokens"].to_numpy(),
                                              train["time_s"].to_numpy(), options.knot_tolerance)
            curve = KnotCurve(knots_x, s_from_us(knots_us))
            index = grp.index.to_numpy()[test]
            held[index] = True
            predicted[index] = curve.many(x[test])
            curves.append(TokenCurve(
                op=fam, key=dict(zip(fields, key)), num_tokens=knots_x, time_us=knots_us,
                held_out_num_tokens=[int(v) for v in out],
                tp=sorted(int(v) for v in grp["tp"].unique()),
                models=sorted(grp["model"].unique()), ops=sorted(grp["op"].unique()),
                n_train=len(train), n_held_out=int(test.sum())))
    return curves, rows.assign(held_out=held, predicted_s=predicted)


def _gemm_features(m, k, n) -> np.ndarray:
    m, k, n = (np.asarray(v, dtype=float) for v in (m, k, n))
    return np.stack([np.ones_like(m), k * n, m * (k + n), m * k * n], axis=1)


def _fit_gemm_cost(rows: pd.DataFrame) -> np.ndarray:
    a = _gemm_features(rows["num_tokens"], rows["in_features"], rows["out_features"])
    t = rows["time_s"].to_numpy()
    return nonneg_lstsq(a / t[:, None], np.ones(len(t)))


def _generic_gemm(rows: pd.DataFrame, curves: list[TokenCurve], options: FitOptions):
    """The GEMM fallback's coefficients and its leave-one-model-out errors."""
    gemm = rows[rows["family"] == "gemm"]
    train = gemm[~gemm["held_out"]]
    coef = _fit_gemm_cost(train)
    shapes = [(c.key["in_features"], c.key["out_features"]) for c in curves if c.op == "gemm"]
    knots = {(c.key["in_features"], c.key["out_features"]):
             KnotCurve(c.num_tokens, s_from_us(c.time_us)) for c in curves if c.op == "gemm"}
    errors, by_model = [], {}
    for model, mine in gemm.groupby("model", sort=True):
        own = set(zip(mine["in_features"], mine["out_features"]))
        others = [s for s in shapes if s not in own]
        fold_train = train[[s not in own for s in zip(train["in_features"],
                                                      train["out_features"])]]
        if not others or fold_train.empty:
            continue
        fallback = GemmFallback(others, [knots[s] for s in others], _fit_gemm_cost(fold_train),
                                options.gemm_neighbors)
        err = []
        for (k, n), grp in mine.groupby(["in_features", "out_features"]):
            p = fallback.many(int(k), int(n), grp["num_tokens"].to_numpy())
            err.append(_relative_error(p, grp["time_s"].to_numpy()))
        err = np.concatenate(err)
        errors.append(err)
        by_model[model] = _round([np.median(err)], 4)[0]
    stats = _stats(np.concatenate(errors) if errors else [], len(train))
    return GenericGemm(cost_coefficients_s=_round(coef, 6), neighbors=options.gemm_neighbors), \
        stats, by_model


def _element_fit(rows: pd.DataFrame, tolerance: float) -> tuple[list[int], list[float]]:
    return _monotone_fit(rows["elements"].to_numpy(), rows["time_s"].to_numpy(), tolerance)


def _generic_elementwise(rows: pd.DataFrame, options: FitOptions):
    """Per elementwise op (and gated flag for mlp_act): the curve against elements, its
    leave-one-model-out errors and per-model medians."""
    curves, stats, by_model = [], {}, {}
    for op, widths in ELEMENTWISE_WIDTH.items():
        sub = rows[rows["op"] == op]
        if sub.empty:
            continue
        sub = sub.assign(elements=sub["num_tokens"] * sub[list(widths)].sum(axis=1))
        fields = list(OP_KEY_FIELDS[op])
        gated_groups = sorted(sub["gated"].unique()) if "gated" in fields else [None]
        errors, medians = [], {}
        for gated in gated_groups:
            grp = sub if gated is None else sub[sub["gated"] == gated]
            train = grp[~grp["held_out"]]
            xs, ts = _element_fit(train, options.knot_tolerance)
            curves.append(ElementCurve(op=op, gated=None if gated is None else int(gated),
                                       elements=xs, time_us=ts))
            for model, mine in grp.groupby("model", sort=True):
                own = set(map(tuple, mine[fields].to_numpy()))
                fold = train[[k not in own for k in map(tuple, train[fields].to_numpy())]]
                if fold.empty:
                    continue
                fx, ft = _element_fit(fold, options.knot_tolerance)
                p = KnotCurve(fx, s_from_us(ft)).many(mine["elements"].to_numpy())
                err = _relative_error(p, mine["time_s"].to_numpy())
                errors.append(err)
                medians[model] = _round([np.median(err)], 4)[0]
        stats[op] = _stats(np.concatenate(errors) if errors else [], int((~sub["held_out"]).sum()))
        by_model[op] = medians
    return curves, stats, by_model


def _collective_curves(rows: pd.DataFrame, node: str, options: FitOptions):
    """Curves and alpha-beta fits of every (collective, num_workers, devices_per_node) group,
    and the held-out error statistics of both, by collective."""
    curves, errors, ab_errors, n_train = [], {}, {}, {}
    for (coll, nw, dpn), grp in rows.groupby(["collective", "num_workers", "devices_per_node"],
                                             sort=True):
        x = grp["size_bytes"].to_numpy()
        t = grp["time_s"].to_numpy()
        out = held_out_values(x, options.holdout_fraction, options.seed,
                              f"{node}|{coll}|num_workers={nw}|devices_per_node={dpn}")
        test = np.isin(x, out)
        xs, ts = _monotone_fit(x[~test], t[~test], options.knot_tolerance, log_log=True)
        a = np.stack([np.ones((~test).sum()), x[~test]], axis=1) / t[~test][:, None]
        alpha, beta = nonneg_lstsq(a, np.ones((~test).sum()))
        if beta <= 0:
            alpha, beta = 0.0, float(np.median(t[~test] / x[~test]))
        curve = KnotCurve(xs, s_from_us(ts), log_log=True)
        errors.setdefault(coll, []).append(_relative_error(curve.many(x[test]), t[test]))
        ab_errors.setdefault(coll, []).append(_relative_error(alpha + beta * x[test], t[test]))
        n_train[coll] = n_train.get(coll, 0) + int((~test).sum())
        curves.append(CollectiveCurve(
            collective=coll, num_workers=int(nw), devices_per_node=int(dpn), size_bytes=xs,
            time_us=ts, held_out_size_bytes=[int(v) for v in out],
            alpha_us=_round([alpha * US_PER_S])[0], bandwidth_gb_per_s=_round([1 / beta / GB])[0],
            n_train=int((~test).sum()), n_held_out=int(test.sum())))
    stats = {c: _stats(np.concatenate(e), n_train[c]) for c, e in errors.items()}
    ab_stats = {c: _stats(np.concatenate(e), n_train[c]) for c, e in ab_errors.items()}
    return curves, stats, ab_stats


def _op_error_stats(rows: pd.DataFrame) -> dict[str, ErrorStats]:
    """Held-out error statistics per vidur op, then of all GEMM ops and of every op."""
    stats = {}
    groups = [(op, rows[rows["op"] == op]) for op in rows["op"].unique()]
    order = {op: i for i, op in enumerate(COMPUTE_OPS)}
    groups.sort(key=lambda g: order.get(g[0], len(order)))
    groups += [("gemm", rows[rows["family"] == "gemm"]), ("all", rows)]
    for name, grp in groups:
        test = grp[grp["held_out"]]
        stats[name] = _stats(_relative_error(test["predicted_s"].to_numpy(),
                                             test["time_s"].to_numpy()),
                             int((~grp["held_out"]).sum()))
    return stats


def fit_profile(measurements: Measurements, *, gpu: str | None = None, node: str | None = None,
                options: FitOptions = FitOptions(), profile_id: str | None = None,
                source: str | None = None, dtype: str = "fp16",
                backend: Backend = VIDUR_BACKEND) -> CalibrationProfile:
    """Fit the profile of one GPU from `measurements`.

    `gpu`: the GPU's measurement name ("a100") or catalog name ("A100-80GB"); default: the only
    GPU with compute rows. `node`: the node kind whose collectives go in (default:
    "<gpu>_dgx", else the only "<gpu>_*" node, else none). `source`: the measurements' origin
    for the provenance. `dtype` and `backend` describe what was measured (defaults: vidur's).
    """
    options.check()
    compute = measurements.compute
    source_gpu = _source_gpu(compute, gpu)
    gpu_name = catalog_gpu_name(source_gpu)
    node = _choose_node(measurements.collectives, source_gpu, node)
    rows = compute[compute["gpu"] == source_gpu]
    rows = rows.assign(family=[family(op) for op in rows["op"]])
    curves, rows = _token_curves(rows, options)
    generic_gemm, gemm_stats, gemm_by_model = (None, None, {})
    if (rows["family"] == "gemm").any():
        generic_gemm, gemm_stats, gemm_by_model = _generic_gemm(rows, curves, options)
    element_curves, element_stats, element_by_model = _generic_elementwise(rows, options)
    collective_rows = (measurements.collectives[measurements.collectives["node"] == node]
                       if node else measurements.collectives.iloc[:0])
    coll_curves, coll_stats, ab_stats = _collective_curves(collective_rows, node, options) \
        if len(collective_rows) else ([], {}, {})

    used = [f for f in measurements.files
            if (f.kind == "compute" and f.label.split("/")[0] == source_gpu)
            or (f.kind == "collective" and f.label.split("/")[0] == node)]
    root = os.path.commonpath([str(Path(f.path).parent) for f in used])
    records = [SourceRecord(path=_record_path(f.path, root), sha256=f.sha256, kind=f.kind,
                            label=f.label) for f in used]
    if profile_id is None:
        digest = hashlib.sha256(repr((sorted(r.sha256 for r in records), options, node))
                                .encode()).hexdigest()
        profile_id = f"{source_gpu}-{digest[:12]}"
    generic_stats = ({"gemm": gemm_stats} if gemm_stats else {}) | element_stats
    generic_by_model = ({"gemm": gemm_by_model} if gemm_by_model else {}) | element_by_model
    knots_x = [c.num_tokens for c in curves]
    data = ProfileData(
        format=FORMAT, version=VERSION, profile_id=profile_id, gpu=gpu_name,
        source_gpu=source_gpu, node=node, dtype=dtype, backend=backend,
        provenance=Provenance(
            source=source or f"{len(records)} measurement files in vidur's layout",
            files=records,
            holdout=HoldoutRecord(rule=HOLDOUT_RULE, fraction=options.holdout_fraction,
                                  seed=options.seed),
            knot_tolerance=options.knot_tolerance, method=_METHOD),
        key_fields={f: list(v) for f, v in OP_KEY_FIELDS.items()},
        valid_range=ValidRange(
            num_tokens_min=min((k[0] for k in knots_x), default=None),
            num_tokens_max=max((k[-1] for k in knots_x), default=None),
            tp=sorted({t for c in curves for t in c.tp}),
            collective_size_bytes_min=min((c.size_bytes[0] for c in coll_curves), default=None),
            collective_size_bytes_max=max((c.size_bytes[-1] for c in coll_curves), default=None),
            collective_num_workers=sorted({c.num_workers for c in coll_curves})),
        errors=ErrorModel(ops=_op_error_stats(rows), collectives=coll_stats, alpha_beta=ab_stats,
                          generic=generic_stats, generic_by_model=generic_by_model),
        curves=curves, generic_gemm=generic_gemm, generic_elementwise=element_curves,
        collectives=coll_curves)
    return CalibrationProfile(data, source=profile_id)


def fit_paths(paths: list[str | Path], *, gpu: str | None = None, node: str | None = None,
              options: FitOptions = FitOptions(), **kw) -> CalibrationProfile:
    """Read the measurement files under `paths` and fit the profile of one GPU (`fit_profile`)."""
    measurements = load_measurements(paths)
    return fit_profile(measurements, gpu=gpu, node=node, options=options, **kw)


VIDUR_SOURCE = ("microsoft/vidur (MIT License), commit 7d47513 (2024-11), data/profiling: "
                "vidur's published per-op compute profiles and NCCL collective profiles")
"""Provenance of the measurements the shipped profiles are fitted on."""

VIDUR_PROFILES = {"a100": "a100_dgx", "h100": "h100_dgx", "a40": "a40_pairwise_nvlink"}
"""Shipped profiles: vidur GPU -> the node kind whose collectives go in its profile."""


def fit_vidur_profile(vidur_root: str | Path, gpu: str,
                      options: FitOptions = FitOptions()) -> CalibrationProfile:
    """The shipped profile "<gpu>-vidur", fitted from a copy of vidur's profiling data
    (`vidur_root` holds `profiling/compute/<gpu>` and `profiling/network/<node>`)."""
    if gpu not in VIDUR_PROFILES:
        raise ConfigError(f"no shipped vidur profile for {gpu!r}; one of "
                          f"{', '.join(VIDUR_PROFILES)}")
    root = Path(vidur_root) / "profiling"
    node = VIDUR_PROFILES[gpu]
    return fit_paths([root / "compute" / gpu, root / "network" / node], gpu=gpu, node=node,
                     options=options, profile_id=f"{gpu}-vidur", source=VIDUR_SOURCE)
