"""The report's files: build a study's report, decide, and write its formats and launch plan."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from dse.fidelity import inert_notes
from dse.fingerprint import study_digest
from dse.report import FILE_NAMES, LAUNCH_FILE, StudyReport, build_report
from simcore.errors import ConfigError

if TYPE_CHECKING:
    from dse.study import StudyConfig


def decided_report(study: StudyConfig, *, storage: str | None = None) -> StudyReport:
    """The report of `study` (default: its storage) with its notes and decision
    (`dse.recommend.decide`)."""
    from dse.recommend import decide
    from dse.report_serving import serving_comparison

    report = build_report(storage or study.storage_url, study.name, study.objectives,
                          study.constraints, digest=study_digest(study))
    report = decide(replace(report, notes=report.notes + tuple(inert_notes(study))), study)
    serving = serving_comparison(report, study)
    return replace(report, serving=serving) if serving is not None else report


def write_report(study: StudyConfig, *, storage: str | None = None,
                 out_dir: Path | None = None) -> dict[str, Path]:
    """Build the report of `study` and write its formats (study.report.formats) to `out_dir`.

    Defaults: the study's storage URL and report folder. Returns {format: path written}.
    """
    return write_report_files(decided_report(study, storage=storage),
                              out_dir or study.report_dir, study.report.formats)


def write_report_files(report: StudyReport, out_dir: Path,
                       formats: Iterable[str] = tuple(FILE_NAMES)) -> dict[str, Path]:
    """Write the chosen formats (html, md, csv, json) of `report` into `out_dir`."""
    from dse.report_render import render_csv, render_html, render_markdown, report_json

    renderers: dict[str, Callable[[StudyReport], str]] = {
        "html": render_html, "md": render_markdown, "csv": render_csv,
        "json": lambda r: json.dumps(report_json(r), indent=1, allow_nan=False)}
    out_dir = Path(out_dir)
    written = {}
    for fmt in formats:
        if fmt not in renderers:
            raise ConfigError(f"report.formats: unknown format {fmt!r} "
                              f"(known: {', '.join(FILE_NAMES)})")
        path = out_dir / FILE_NAMES[fmt]
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            path.write_text(renderers[fmt](report), encoding="utf-8")
        except OSError as err:
            raise ConfigError(f"{path}: cannot write the report ({err.strerror})") from None
        written[fmt] = path
    rec = report.recommendation
    if rec is not None and rec.launch_plan:
        path = out_dir / LAUNCH_FILE
        try:
            path.write_text(rec.launch_plan, encoding="utf-8")
        except OSError as err:
            raise ConfigError(f"{path}: cannot write the launch plan ({err.strerror})") from None
        written["launch"] = path
    return written
