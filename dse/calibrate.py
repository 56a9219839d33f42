"""`dse calibrate`: fit a calibration profile from measurement files, write it, and report its
errors on the rows and shapes held out of the fit."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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
