"""Validation rows for the calibration profiles: each shipped profile's curves re-evaluated on the
measurement rows its fit held out, read again from the measurement files (so a profile that no
longer matches its data fails), and the roofline's ring all-reduce against the NCCL tables."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dse.validate import Row
from simcore.calibration.measurements import load_measurements
from simcore.calibration.ops import COMPUTE_OPS, OP_KEY_FIELDS, family
from simcore.calibration.profile import CalibrationProfile, shipped_profile, shipped_profile_ids
from simcore.reference_data import VIDUR_DIR

OP_TOLERANCE = 0.05
"""Median held-out relative error a profile's op (or collective) curves must stay under."""

GENERIC_TOLERANCE = 0.10
"""Median error declared for GEMM shapes a profile never measured (its generic fallback)."""

VIDUR_SOURCE = ("vidur per-op and NCCL measurements (microsoft/vidur, MIT, commit 7d47513), "
                "rows held out of the profile's fit (simcore/data/measurements/vidur)")


def _vidur_root(vidur: Path) -> Path:
    return vidur / "profiling"


def _files(profile: CalibrationProfile, root: Path, kind: str) -> list[Path]:
    """The measurement files a profile lists, found under `root` by their recorded paths."""
    out = []
    for f in profile.data.provenance.files:
        if f.kind != kind:
            continue
        rel = f.path.split("profiling/", 1)[-1]
        out.append(root / rel)
    return out


def _held_out_compute(profile: CalibrationProfile, root: Path):
    """(op, predicted seconds, measured seconds) arrays over the held-out compute rows."""
    m = load_measurements(_files(profile, root, "compute"))
    rows = m.compute
    held = {(c.op, tuple(c.key.values())): set(c.held_out_num_tokens)
            for c in profile.data.curves}
    ops, pred, meas = [], [], []
    for r in rows.itertuples(index=False):
        fam = family(r.op)
        key = tuple(int(getattr(r, f)) for f in OP_KEY_FIELDS[fam])
        if r.num_tokens not in held.get((fam, key), ()):
            continue
        ops.append(r.op)
        pred.append(profile.op_time_s(r.op, int(r.num_tokens),
                                      **dict(zip(OP_KEY_FIELDS[fam], key))))
        meas.append(r.time_s)
    return np.array(ops), np.array(pred, dtype=float), np.array(meas, dtype=float)


def _stat_row(suite: str, name: str, rel: np.ndarray, tolerance: float, source: str) -> Row:
    """A row whose value is the median relative error over `rel` (p90 and max in the note)."""
    return Row(suite, name, float(np.median(rel)), float(len(rel)), "rows", tolerance, source,
               error_kind="statistic",
               note=f"p90 {np.percentile(rel, 90):.1%}, max {rel.max():.1%}")


def op_rows(vidur: Path | None = None) -> list[Row]:
    """Per shipped profile and op: the median relative error on the held-out rows."""
    root = _vidur_root(vidur or VIDUR_DIR)
    rows: list[Row] = []
    for pid in shipped_profile_ids():
        p = shipped_profile(pid)
        ops, pred, meas = _held_out_compute(p, root)
        rel = np.abs(pred - meas) / meas
        for op in COMPUTE_OPS:
            sel = ops == op
            if sel.any():
                rows.append(_stat_row("ops", f"{pid} {op}: median held-out error", rel[sel],
                                      OP_TOLERANCE, VIDUR_SOURCE))
        g = p.error_stats("gemm", "generic")
        if g is not None:
            rows.append(Row("ops", f"{pid} unmeasured GEMM shapes: median error", g.median,
                            float(g.n), "rows", GENERIC_TOLERANCE,
                            "the profile's fit: each source model's GEMM shapes left out in "
                            "turn and predicted by the generic fallback (recorded statistics)",
                            error_kind="statistic", note=f"p90 {g.p90:.1%}, max {g.max:.1%}"))
    return rows


def collective_rows(vidur: Path | None = None) -> list[Row]:
    """Per shipped profile and collective: median held-out error; and the roofline's ring
    all-reduce (the reference profile) against the H100 DGX NCCL table for messages of 1 MiB
    and more, where bandwidth dominates."""
    from simcore.compute.assumptions import RooflineAssumptions
    from simcore.hardware import get_gpu

    root = _vidur_root(vidur or VIDUR_DIR)
    rows: list[Row] = []
    for pid in shipped_profile_ids():
        p = shipped_profile(pid)
        m = load_measurements(_files(p, root, "collective"))
        c = m.collectives
        held = {(k.collective, k.num_workers, k.devices_per_node): set(k.held_out_size_bytes)
                for k in p.data.collectives}
        for coll in sorted(c["collective"].unique()):
            rel = []
            for r in c[c["collective"] == coll].itertuples(index=False):
                if r.size_bytes in held.get((coll, r.num_workers, r.devices_per_node), ()):
                    t = p.collective_time_s(coll, float(r.size_bytes), int(r.num_workers),
                                            int(r.devices_per_node))
                    rel.append(abs(t - r.time_s) / r.time_s)
            if rel:
                rows.append(_stat_row("collectives", f"{pid} {coll}: median held-out error",
                                      np.array(rel), OP_TOLERANCE, VIDUR_SOURCE))
    # The reference profile's formula, 2 (n - 1) / n x S / B + 2 (n - 1) alpha, on NVSwitch.
    a = RooflineAssumptions()
    gpu = get_gpu("H100-SXM")
    bw = gpu.interconnect_bandwidth_bytes_per_s * a.interconnect_bandwidth_fraction
    table = load_measurements([root / "network" / "h100_dgx" / "all_reduce.csv"]).collectives
    big = table[(table["size_bytes"] >= 2**20) & (table["num_workers"] == table["devices_per_node"])]
    n = big["num_workers"].to_numpy()
    s = big["size_bytes"].to_numpy(dtype=float)
    ring = 2 * (n - 1) / n * s / bw + 2 * (n - 1) * a.collective_hop_latency_s
    rel = np.abs(ring - big["time_s"].to_numpy()) / big["time_s"].to_numpy()
    rows.append(_stat_row(
        "collectives", "roofline ring all-reduce vs NCCL, H100 DGX, >= 1 MiB", rel,
        a.relative_uncertainty,
        "vidur's NCCL all-reduce table on DGX H100 (simcore/data/measurements/vidur); the roofline's "
        "declared +/-35% bound is the tolerance"))
    return rows
