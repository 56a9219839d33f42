"""`dse calibrate`: fit a calibration profile from measurement files, write it, and report its
errors on the rows and shapes held out of the fit."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from simcore.calibration.fit import FitOptions, fit_paths
from simcore.calibration.profile import CalibrationProfile, ErrorStats

ERROR_COLUMNS = ("op", "source", "n_train", "n_held_out", "median", "p90", "p99", "max")
"""Columns of `error_table`: the op (vidur op name, 'gemm' = all GEMM ops, 'all' = every compute
op, or a collective), where predictions come from ('measured' curves on held-out rows,
'generic' fallbacks on held-out shapes, 'alpha_beta' fits of the collectives), rows fitted,
rows predicted, and the relative-error distribution over the predicted rows."""

_SOURCE_NOTES = {
    "measured": "measured curves, rows held out of the fit",
    "generic": "shape-generic fallbacks, each source model left out in turn",
    "alpha_beta": "alpha-beta fits of the collectives, rows held out of the fit",
}


@dataclass(frozen=True)
class CalibrationReport:
    """What `run_calibrate` did: the fitted profile and where it was written."""

    profile: CalibrationProfile
    """The fitted profile."""
    out: Path
    """The profile file written."""

    def table(self) -> str:
        """The held-out error distribution per op, as fixed-width text."""
        return render_error_table(error_table(self), title=f"{self.profile.profile_id} "
                                  f"({self.profile.gpu}): relative errors")


def error_table(profile_or_report: CalibrationProfile | CalibrationReport) -> pd.DataFrame:
    """The profile's declared errors, one row per (op, source), columns `ERROR_COLUMNS`."""
    profile = (profile_or_report.profile if isinstance(profile_or_report, CalibrationReport)
               else profile_or_report)
    e = profile.data.errors
    rows = []
    groups: list[tuple[str, dict[str, ErrorStats]]] = [
        ("measured", e.ops), ("measured", e.collectives), ("alpha_beta", e.alpha_beta),
        ("generic", e.generic)]
    for source, stats in groups:
        for op, s in stats.items():
            rows.append({"op": op, "source": source, "n_train": s.n_train, "n_held_out": s.n,
                         "median": s.median, "p90": s.p90, "p99": s.p99, "max": s.max})
    return pd.DataFrame(rows, columns=list(ERROR_COLUMNS))


def _pct(x) -> str:
    return "-" if x is None or pd.isna(x) else f"{x:.1%}"


def render_error_table(table: pd.DataFrame, *, title: str = "relative errors") -> str:
    """`error_table` rows as text, grouped by source."""
    head = (f"{'op':<26}{'n train':>9}{'n held out':>12}{'median':>9}{'p90':>9}{'p99':>9}"
            f"{'max':>9}")
    lines = [title]
    for source, grp in table.groupby("source", sort=False):
        lines += ["", f"{source}: {_SOURCE_NOTES.get(source, source)}", head, "-" * len(head)]
        for r in grp.itertuples():
            lines.append(f"{r.op:<26}{r.n_train:>9}{r.n_held_out:>12}{_pct(r.median):>9}"
                         f"{_pct(r.p90):>9}{_pct(r.p99):>9}{_pct(r.max):>9}")
    return "\n".join(lines)


def run_calibrate(paths: list[str], out: str, gpu: str | None = None, holdout: float = 0.2,
                  seed: int = 0, *, node: str | None = None, profile_id: str | None = None,
                  source: str | None = None) -> CalibrationReport:
    """Fit the profile of one GPU from measurement files or directories (vidur's layout), write
    it to `out`, and return the report.

    `gpu`: measurement or catalog name, needed when the files cover several GPUs; `holdout`:
    fraction of each curve's distinct token counts / message sizes held out to measure the
    errors; `seed`: seed of that draw; `node`: node kind of the collectives (default
    "<gpu>_dgx" or the only "<gpu>_*" node). Bad input raises one ConfigError naming the file
    and column or the option."""
    profile = fit_paths(list(paths), gpu=gpu, node=node,
                        options=FitOptions(holdout_fraction=holdout, seed=seed),
                        profile_id=profile_id, source=source)
    path = Path(out)
    profile.save(path)
    return CalibrationReport(profile=profile, out=path)


# ---- kernel profiles (AIConfigurator) --------------------------------------------------------

KERNEL_ERROR_COLUMNS = ("table", "n_train", "n_held_out", "median", "p90", "p99", "max")
"""Columns of `kernel_error_table`: the table family ('gemm/<dtype>', 'attention/<phase>/<kv
dtype>', 'mla/<phase>/<kv dtype>/<weight dtype>', 'moe/<dtype>', 'all_reduce/<mode>',
'all_gather/nccl', 'memory/<kernel>'), grid cells fitted, measured cells at held-out axis values
predicted, and the relative-error distribution over them."""


MARLIN_FRAMEWORKS = "moe/marlin/sglang_vs_vllm"
"""The errors entry that is no hold-out: SGLang's measurement of vLLM's Marlin fused-MoE kernel
taken as vLLM's own, at the cells both measured (n_train: the shapes compared)."""


def kernel_error_table(profile) -> pd.DataFrame:
    """A kernel profile's held-out errors, one row per table family (`MARLIN_FRAMEWORKS` apart:
    `render_kernel_errors` gives it)."""
    rows = [{"table": k, "n_train": s.n_train, "n_held_out": s.n, "median": s.median,
             "p90": s.p90, "p99": s.p99, "max": s.max}
            for k, s in profile.data.errors.items() if k != MARLIN_FRAMEWORKS]
    return pd.DataFrame(rows, columns=list(KERNEL_ERROR_COLUMNS))


def _versions(files) -> str:
    """'vLLM 0.24.0; NCCL 2.29.2; SGLang 0.5.10': the versions the profile's tables were
    measured with."""
    out = []
    for name, folder in (("vLLM", "/vllm/"), ("NCCL", "/nccl/"), ("SGLang", "/sglang/")):
        v = sorted({f.framework_version for f in files if folder in f.path})
        if v:
            out.append(f"{name} {', '.join(v)}")
    return "; ".join(out)


def render_kernel_errors(profile) -> str:
    """`kernel_error_table` as text, headed by the profile's source."""
    prov = profile.data.provenance
    head = (f"{'table':<30}{'n train':>9}{'n held out':>12}{'median':>9}{'p90':>9}{'p99':>9}"
            f"{'max':>9}")
    lines = [f"{profile.profile_id} ({profile.gpu}): {prov.package} {prov.package_version}, "
             f"system {prov.system}, {_versions(prov.files)}",
             "", "measured kernels, cells at held-out axis values predicted from the rest", head,
             "-" * len(head)]
    for r in kernel_error_table(profile).itertuples():
        lines.append(f"{r.table:<30}{r.n_train:>9}{r.n_held_out:>12}{_pct(r.median):>9}"
                     f"{_pct(r.p90):>9}{_pct(r.p99):>9}{_pct(r.max):>9}")
    both = profile.data.errors.get(MARLIN_FRAMEWORKS)
    if both is not None:
        lines += ["", f"vLLM's Marlin fused-MoE kernel measured in SGLang (the shapes vLLM's tables "
                  f"lack), against vLLM's own at the {both.n} cells of {both.n_train} curves "
                  f"both measured: |error| median {_pct(both.median)}, p90 {_pct(both.p90)}, "
                  f"max {_pct(both.max)}"]
    transfer = moe_transfer_errors(profile)
    if transfer:
        head = f"{'table':<44}{'shapes':>9}{'median':>9}{'p90':>9}{'signed':>9}"
        lines += ["", "fused-MoE shapes moved from the nearest other model's (each model left "
                  "out; the bound of an unmeasured shape)", head, "-" * len(head)]
        for table, e in transfer:
            lines.append(f"{table:<44}{e.n:>9}{_pct(e.median):>9}{_pct(e.p90):>9}"
                         f"{e.signed:>+9.1%}")
    return "\n".join(lines)


def moe_transfer_errors(profile) -> list[tuple[str, object]]:
    """(`moe/<dtype>/<routing>`, `moe_transfer.TransferError`) of each fused-MoE table of the
    profile at the step model's default routing, through the default roofline's rates; MXFP4's
    per kernel backend (`[triton]`, ...) with two models or more measured by it."""
    from simcore.calibration.moe_transfer import KERNEL_BACKENDS, leave_one_out
    from simcore.compute.kernel_model import DEFAULT_MOE_ROUTING, table_weight_dtype
    from simcore.compute.assumptions import RooflineAssumptions
    from simcore.hardware import get_gpu
    from simcore.model.arch import dtype_bytes

    gpu, a = get_gpu(profile.gpu), RooflineAssumptions()
    bw = gpu.hbm_bandwidth_bytes_per_s * a.hbm_bandwidth_fraction
    out = []
    for dtype in sorted({k[0] for k in profile.moe_keys()}):
        wb = 2.0 if dtype == "bf16" else dtype_bytes(table_weight_dtype(dtype))
        flops = gpu.flops_for(dtype) * a.gemm_flops_fraction
        # MXFP4 experts move only their layout's backend's measurements (`derived_experts`).
        families = KERNEL_BACKENDS if dtype == "mxfp4_w4a16" else (None,)
        for family in families:
            err = leave_one_out(profile, dtype, DEFAULT_MOE_ROUTING, wb, flops, bw, family)
            if err is not None:
                out.append((f"moe/{dtype}/{DEFAULT_MOE_ROUTING}"
                            + (f" [{family}]" if family else ""), err))
    return out


_VIDUR_PASS_BYTES = {"add": 6.0, "input_layernorm": 4.0, "post_attention_layernorm": 4.0,
                     "attn_rope": 4.0, "emb": 4.0}
"""Bytes a pass Vidur measured moves per element it counts (16-bit): a residual add reads two
operands and writes one; a norm, the rotary embedding and the embedding gather read and write
each element once. The activation: a gated one reads 2f and writes f per 2f counted (3), a plain
one reads and writes each (4)."""


def _vidur_pass_bytes(op: str, gated) -> float:
    if op == "mlp_act":
        return 3.0 if gated else 4.0
    return _VIDUR_PASS_BYTES[op]


def source_disagreement(kernel_profile, calibration_profile) -> pd.DataFrame:
    """Where Vidur's measurements (a calibration profile) and the kernel database time the same
    kind of op on the same GPU, as ratios of the kernel profile's time over Vidur's (1.0 =
    agreement): per GEMM shape Vidur measured, the bf16 GEMM at each of Vidur's knots with at
    least 16 tokens; per elementwise pass Vidur measured (norms, residual add, rotary,
    activation, embedding), the kernel profile's memory-bound kernel at the bytes the pass moves.
    Columns: op, shape, n, median ratio, p10 and p90 ratio."""
    rows = []

    def add(op, shape, ratios):
        if ratios:
            r = np.asarray(ratios)
            rows.append({"op": op, "shape": shape, "n": len(r),
                         "median_ratio": float(np.median(r)),
                         "p10_ratio": float(np.quantile(r, 0.1)),
                         "p90_ratio": float(np.quantile(r, 0.9))})

    for c in calibration_profile.data.curves:
        if c.op != "gemm":
            continue
        k, n = c.key["in_features"], c.key["out_features"]
        ratios = []
        for m, t_us in zip(c.num_tokens, c.time_us):
            if m < 16:
                continue
            t = kernel_profile.gemm_time_s("bf16", m, n, k)
            if t is not None:
                ratios.append(t / (t_us / 1e6))
        add("gemm", f"{k}->{n}", ratios)
    memory = kernel_profile.memory_curve()
    if memory is not None:
        _, mem = memory
        for e in calibration_profile.data.generic_elementwise:
            b = _vidur_pass_bytes(e.op, e.gated)
            add(e.op if e.gated is None else f"{e.op}({'gated' if e.gated else 'plain'})",
                "all shapes",
                [mem(x * b) / (t_us / 1e6) for x, t_us in zip(e.elements, e.time_us)])
    return pd.DataFrame(rows, columns=["op", "shape", "n", "median_ratio", "p10_ratio",
                                       "p90_ratio"])


def render_disagreement(kernel_profile, calibration_profile) -> str:
    """`source_disagreement` summed up: for GEMMs the median over shapes and the spread; for the
    elementwise passes, each pass's median ratio."""
    t = source_disagreement(kernel_profile, calibration_profile)
    if t.empty:
        return ""
    g = t[t["op"] == "gemm"]
    lines = []
    if not g.empty:
        lines.append(
            f"sources disagree on {kernel_profile.gpu}: {kernel_profile.profile_id} / "
            f"{calibration_profile.profile_id} GEMM time, {len(g)} shapes measured by both "
            f"(>= 16 tokens): median ratio {float(np.median(g['median_ratio'])):.2f}, shapes' "
            f"medians from {g['median_ratio'].min():.2f} to {g['median_ratio'].max():.2f}")
    e = t[t["op"] != "gemm"]
    if not e.empty:
        kernel = kernel_profile.memory_curve()[0]
        lines.append(
            f"elementwise passes timed by {kernel} at their bytes / Vidur's measured passes: "
            + ", ".join(f"{r.op} {r.median_ratio:.2f} ({r.p10_ratio:.2f}-{r.p90_ratio:.2f})"
                        for r in e.itertuples()))
    return "\n".join(lines)


def run_calibrate_aiconfigurator(system: str, out: str, *, seed: int = 0,
                                 gpu: str | None = None,
                                 profile_id: str | None = None):
    """Fit the kernel profile of an AIConfigurator system from the installed package, write it
    (gzipped when `out` ends in .gz) and return it."""
    from simcore.calibration.aiconfigurator import fit_system

    profile = fit_system(system, seed=seed, gpu=gpu, profile_id=profile_id)
    profile.save(out)
    return profile
