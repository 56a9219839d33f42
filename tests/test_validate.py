"""`dse validate`: every row of the validation suite within its declared tolerance, and rows that
fail when the prediction is wrong."""

import json
import math
import subprocess
import sys

import pytest

from dse.validate import SUITES, Row, render_table, run_suite
from dse.validate_calibration import _held_out_compute, _vidur_root
from simcore.calibration.profile import CalibrationProfile, shipped_profile
from simcore.reference_data import VIDUR_DIR

pytestmark = pytest.mark.slow  # the validation sweeps against every reference


@pytest.fixture(scope="module")
def rows():
    return run_suite()


def test_every_suite_has_rows_with_sources(rows):
    assert {r.suite for r in rows} == set(SUITES)
    for r in rows:
        assert r.source and r.unit and r.tolerance >= 0


@pytest.mark.parametrize("suite", SUITES)
def test_each_row_stays_within_its_tolerance(rows, suite):
    bad = [(r.name, r.error, r.tolerance, r.note) for r in rows
           if r.suite == suite and not r.ok]
    assert not bad


def test_the_issue_targets_are_rows(rows):
    ops = [r for r in rows if r.suite == "ops" and "held-out" in r.name]
    # Three GPUs x ten ops, each under a 5% median held-out error.
    assert len(ops) == 30 and all(r.tolerance == 0.05 for r in ops)
    sched = [r for r in rows if r.suite == "scheduler"]
    assert len(sched) == 15 and all(r.predicted == r.reference for r in sched)
    e2e = [r for r in rows if r.suite == "end_to_end"]
    # every measurement row cites its source; the fit-part row counts the shipped fit's cases
    assert all("https://" in r.source for r in e2e if not r.name.startswith("fit part"))
    assert [r.source for r in e2e if r.name.startswith("fit part")] == [
        "simcore/data/cpu_costs/fitted.json"]
    # the checks apart, from the simulations themselves: the decode step, the busiest second
    # and the tails
    assert sum(r.name.endswith(" median ITL") for r in e2e) >= 30
    assert sum(r.name.endswith(" peak output throughput") for r in e2e) >= 30
    assert sum(r.name.endswith(" p99 TTFT") for r in e2e) >= 40
    assert sum(r.name.endswith(" p99 TPOT") for r in e2e) >= 40
    assert sum(r.name.endswith(" p99 ITL") for r in e2e) >= 40


def test_a_profile_that_no_longer_fits_its_data_fails():
    p = shipped_profile("h100-vidur")
    raw = json.loads(p.to_json())
    for c in raw["curves"]:
        c["time_us"] = [t * 1.2 for t in c["time_us"]]
    bad = CalibrationProfile.from_dict(raw)
    ops, pred, meas = _held_out_compute(bad, _vidur_root(VIDUR_DIR))
    rel = abs(pred - meas) / meas
    assert len(rel) > 1000 and float(sorted(rel)[len(rel) // 2]) > 0.1


def test_rows_compute_their_error():
    r = Row("x", "n", 110.0, 100.0, "ms", 0.05, "src")
    assert r.error == pytest.approx(0.1) and not r.ok
    s = Row("x", "n", 0.03, 500, "rows", 0.05, "src", error_kind="statistic")
    assert s.error == 0.03 and s.ok
    text = render_table([r, s])
    assert "NO" in text and "n=500" in text and "[1] src" in text
    # A statistic's note (its target, met or not) is printed under it, and a held-out case's
    # envelope (not the rest of its note); another measurement's note is not.
    t = Row("x", "m", 0.14, 57, "cases", 0.16, "src", error_kind="statistic",
            note="target <= 10%: not met")
    u = Row("x", "k", 1.0, 1.0, "ms", 0.1, "src",
            note="envelope [0.9, 1.1] (inside); chat requests")
    v = Row("x", "j", 1.0, 1.0, "ms", 0.1, "src", note="a remark")
    lines = render_table([t, u, v]).splitlines()
    assert lines[3] == " " * 14 + "target <= 10%: not met"
    assert lines[4].startswith("x           k ")
    assert lines[5] == " " * 14 + "envelope [0.9, 1.1] (inside)"
    assert lines[6].startswith("x           j ") and "a remark" not in render_table([v])
    # In JSON an unbounded tolerance (a row listed, not checked) is null: standard JSON.
    w = Row("x", "i", 1.0, 1.0, "ms", math.inf, "src")
    assert w.as_dict()["tolerance"] is None
    json.dumps(w.as_dict(), allow_nan=False)


def test_the_table_never_cuts_a_check_name():
    long = "gpustack-qwen3-235b-a22b-fp8-tp4-mnbt16384-h100sxm-rand128x4 throughput"
    rows = [Row("end_to_end", long, 1.0, 1.0, "tok/s", 0.1, "src"),
            Row("ops", "short", 2.0, 2.0, "ms", 0.1, "src")]
    lines = render_table(rows).splitlines()
    assert long in lines[2] and lines[3].startswith("ops         short ")
    # The columns after the name line up on every row.
    assert lines[2].index("tok/s") == lines[3].index("ms   ") == lines[0].index("unit")


def test_cli_prints_the_table_and_exits_zero(tmp_path):
    out = tmp_path / "v.json"
    r = subprocess.run([sys.executable, "-m", "dse.cli", "validate", "--suite", "fabric",
                        "--suite", "end_to_end", "--out", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "checks within tolerance" in r.stdout and "johnmusgrave.com" in r.stdout
    data = json.loads(out.read_text())
    assert data["rows"] and all(row["ok"] for row in data["rows"])


def test_folders_no_chosen_suite_reads_and_a_conformance_folder_without_logs_are_refused(
        tmp_path):
    from simcore.errors import ConfigError

    with pytest.raises(ConfigError, match="--vidur: no suite chosen reads it"):
        run_suite(("fabric",), vidur_dir=tmp_path)
    with pytest.raises(ConfigError, match="--conformance: no suite chosen reads it"):
        run_suite(("fabric",), conformance_dir=tmp_path)
    (tmp_path / "scenarios").mkdir()
    (tmp_path / "scenarios" / "basic.json").write_text("{}")
    with pytest.raises(ConfigError, match="no scenario of scenarios/ has its golden log"):
        run_suite(("scheduler",), conformance_dir=tmp_path)
    # A suite named twice runs once.
    assert len(run_suite(("fabric", "fabric"))) == len(run_suite(("fabric",)))
