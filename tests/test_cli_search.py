"""`dse search`, `dse report` and `dse dashboard` as a user runs them, on a real local Ray (2 CPUs):
a tiny study end to end, its report files, resuming it, opening it in optuna-dashboard, and
one-line errors for bad input."""

from __future__ import annotations

import csv
import io
import json
import re
import signal
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path
from wsgiref.util import setup_testing_defaults

import optuna
import pytest
import yaml

from dse.backends import open_storage
from dse.study import load_study
from simcore.config import parse_config
from simcore.simulate import simulate

pytestmark = pytest.mark.slow       # every test here runs `dse` in a subprocess

NAME = "cli-search"
FILES = {"html": "report.html", "md": "report.md", "csv": "trials.csv", "json": "report.json"}
BASE = {
    "name": NAME, "seed": 3,
    "model": {"name": "meta-llama/Llama-3.1-8B"},
    "hardware": {"gpu": "A100-80GB"},
    "engine": {"max_num_seqs": 64, "max_num_batched_tokens": 2048},
    "workload": {"num_prompts": 40, "request_rate": 20,
                 "dataset": {"kind": "random", "input_len": 256, "output_len": 64}},
}


def dse(*args, cwd=None, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dse.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd)


def assert_one_line_error(p: subprocess.CompletedProcess, *words: str) -> str:
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stdout + p.stderr, p.stderr
    lines = p.stderr.splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("error: "), lines[0]
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


def tpot_slo() -> float:
    """A p99 TPOT SLO between what max_num_seqs 16 and 32 give on the base (taken from the
    simulator, so the test follows the model): small batches meet it, the baseline (64) does not."""
    tpot = [simulate(parse_config({**BASE, "engine": {**BASE["engine"], "max_num_seqs": n}}))
            ["p99_tpot_ms"] for n in (16, 32)]
    assert tpot[0] < tpot[1], tpot
    return round((tpot[0] + tpot[1]) / 2, 3)


def study_data(slo: float, **update) -> dict:
    return {
        "name": NAME,
        "base": BASE,
        "space": {"parameters": {
            "engine.max_num_seqs": {"type": "int", "low": 4, "high": 64, "log": True},
            "engine.max_num_batched_tokens": {"type": "categorical",
                                              "choices": [512, 1024, 2048]}}},
        "objectives": [{"metric": "p99_ttft_ms", "direction": "minimize"},
                       {"metric": "output_throughput_per_gpu", "direction": "maximize"}],
        "constraints": [f"p99_tpot_ms <= {slo}"],
        "budget": {"n_trials": 6},
        "sampler": {"kind": "tpe", "seed": 7, "n_startup_trials": 3},
        "fidelity": {"confirm": {"workload.num_prompts": 60}, "confirm_top_k": 2},
        "execution": {"workers": 2, "trial_timeout_s": 60},
        # Relative to the study file, which is not the working directory of the command.
        "storage": "sqlite:///run/study.db",
        "report": {"dir": "run/report"},
        **update,
    }


class Searched:
    """The first `dse search` of the tiny study and where it left things."""

    def __init__(self, proc: subprocess.CompletedProcess, study_file: Path, slo: float) -> None:
        self.proc = proc
        self.study_file = study_file
        self.slo = slo
        self.dir = study_file.parent
        self.report_dir = self.dir / "run" / "report"
        self.storage_url = load_study(study_file).storage_url

    def json(self, folder: Path | None = None) -> dict:
        return json.loads(((folder or self.report_dir) / FILES["json"]).read_text())


@pytest.fixture(scope="module")
def searched(tmp_path_factory) -> Searched:
    slo = tpot_slo()
    folder = tmp_path_factory.mktemp("study")
    study_file = folder / "study.yaml"
    study_file.write_text(yaml.safe_dump(study_data(slo), sort_keys=False))
    elsewhere = tmp_path_factory.mktemp("cwd")
    proc = dse("search", study_file, cwd=elsewhere, timeout=240)
    return Searched(proc, study_file, slo)


def load(url: str, name: str = NAME) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.load_study(study_name=name, storage=open_storage(url))


COUNTS_RE = re.compile(rf"^study {NAME}: 6 complete \((\d+) within every SLO\), 0 undeployable, "
                       r"0 failed; Pareto set of (\d+), 2 confirmed$", re.M)


def report_paths(stdout: str) -> dict[str, str]:
    return dict(re.findall(r"^\s*(html|md|csv|json): (.+)$", stdout, re.M))


# -- a whole search ------------------------------------------------------------------------------


def test_search_prints_the_counts_and_the_report_paths(searched):
    p = searched.proc
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert "Traceback" not in p.stdout + p.stderr and "error:" not in p.stderr, p.stderr
    m = COUNTS_RE.search(p.stdout)
    assert m, p.stdout
    assert int(m.group(2)) >= 1
    paths = report_paths(p.stdout)
    assert paths == {k: str(searched.report_dir / f) for k, f in FILES.items()}, p.stdout
    for path in paths.values():
        assert Path(path).is_file() and Path(path).stat().st_size > 0, path
    # The terminal's counts are the report's.
    counts = json.loads(Path(paths["json"]).read_text())["counts"]
    assert (counts["feasible"], counts["pareto"]) == (int(m.group(1)), int(m.group(2)))
    # The storage lies where the study file says, not in the working directory.
    assert (searched.dir / "run" / "study.db").is_file()


def test_the_pareto_set_is_non_empty_and_meets_the_slo(searched):
    r = searched.json()
    assert r["study"] == NAME
    assert r["constraints"][0]["text"] == f"p99_tpot_ms <= {searched.slo:g}"
    by_number = {t["number"]: t for t in r["trials"]}
    assert len(by_number) == 6 and r["counts"]["trials"] == 6
    feasible = [t for t in r["trials"] if t["feasible"]]
    assert 0 < len(feasible) < 6, (
        "the SLO should split the trials into feasible and infeasible ones: "
        f"{[(t['number'], t['params'], t['reasons']) for t in r['trials']]}")
    assert r["pareto"], "the Pareto set is empty"
    for n in r["pareto"]:
        t = by_number[n]
        assert t["feasible"] and t["reasons"] == [], t["reasons"]
        assert t["rank"] == 1
        for stage in ("screen", "confirm"):
            m = t[stage]
            if m is None:
                continue
            assert m["metrics"]["p99_tpot_ms"] <= searched.slo, (n, stage, m["metrics"])
            assert all(v <= 0 for v in m["constraints"].values()), (n, stage, m["constraints"])
    # The SLO-violating trials are explained and kept out of the front.
    for t in r["trials"]:
        if not t["feasible"]:
            assert t["number"] not in r["pareto"]
            assert t["reasons"] and t["reasons"][0].startswith("p99_tpot_ms = "), t["reasons"]
    # The same as the storage says, independently of the report.
    st = load(searched.storage_url)
    for n in r["pareto"]:
        assert st.trials[n].user_attrs["metrics"]["p99_tpot_ms"] <= searched.slo
    # The baseline (max_num_seqs 64) is trial 0 and misses the SLO.
    assert by_number[0]["baseline"] and not by_number[0]["feasible"]
    # Two confirmed at 60 requests, kept beside their screening run.
    confirmed = [t for t in r["trials"] if t["confirm"] is not None]
    assert len(confirmed) == 2 and r["counts"]["confirmed"] == 2
    for t in confirmed:
        assert t["fidelity"] == "screen + confirm"
        assert t["confirm"]["metrics"]["num_prompts"] == 60
        assert t["screen"]["metrics"]["num_prompts"] == 40


def test_the_csv_has_one_row_per_trial(searched):
    rows = list(csv.DictReader(io.StringIO((searched.report_dir / FILES["csv"]).read_text())))
    assert sorted(int(r["number"]) for r in rows) == list(range(6))
    assert {"params_engine.max_num_seqs", "params_engine.max_num_batched_tokens",
            "values_p99_ttft_ms", "values_output_throughput_per_gpu", "feasible"} <= set(rows[0])
    pareto = set(searched.json()["pareto"])
    for r in rows:
        assert (r["rank"] == "1") == (int(r["number"]) in pareto), r["number"]


class _ExternalRefs(HTMLParser):
    """Collects every URL a page would fetch from elsewhere (scripts, stylesheets, images)."""

    def __init__(self) -> None:
        super().__init__()
        self.external: list[tuple[str, str]] = []
        self.num_scripts = 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "script":
            self.num_scripts += 1
        for key in ("src", "href"):
            url = (a.get(key) or "").strip()
            if tag in ("script", "link", "img", "iframe", "embed", "source") and \
                    re.match(r"(?i)(https?:)?//", url):
                self.external.append((tag, url))


def test_the_html_page_is_self_contained(searched):
    page = (searched.report_dir / FILES["html"]).read_text()
    refs = _ExternalRefs()
    refs.feed(page)
    assert refs.external == [], refs.external
    assert refs.num_scripts >= 1                 # the plots' library is inlined
    assert NAME in page
    md = (searched.report_dir / FILES["md"]).read_text()
    assert NAME in md and "<script" not in md


def test_report_writes_the_files_again_elsewhere(searched, tmp_path):
    out = tmp_path / "other"
    p = dse("report", searched.study_file, "--out", out, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    assert report_paths(p.stdout) == {k: str(out / f) for k, f in FILES.items()}, p.stdout
    for f in FILES.values():
        assert (out / f).is_file(), f
    again, first = searched.json(out), searched.json()
    for key in ("pareto", "counts", "objectives", "constraints"):
        assert again[key] == first[key], key
    assert [t["number"] for t in again["trials"]] == [t["number"] for t in first["trials"]]


def test_search_again_resumes_without_new_trials(searched, tmp_path):
    before = [(t.number, t.params, t.values) for t in load(searched.storage_url).trials]
    confirm_before = len(load(searched.storage_url, f"{NAME}/confirm").trials)
    p = dse("search", searched.study_file, cwd=tmp_path, timeout=240)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    assert COUNTS_RE.search(p.stdout), p.stdout
    assert COUNTS_RE.search(p.stdout).groups() == COUNTS_RE.search(searched.proc.stdout).groups()
    after = [(t.number, t.params, t.values) for t in load(searched.storage_url).trials]
    assert after == before, "resuming a finished study ran new screening trials"
    assert len(load(searched.storage_url, f"{NAME}/confirm").trials) == confirm_before == 2
    assert report_paths(p.stdout) == {k: str(searched.report_dir / f) for k, f in FILES.items()}


def test_search_no_resume_refuses_a_stored_study(searched, tmp_path):
    p = dse("search", searched.study_file, "--no-resume", cwd=tmp_path)
    assert_one_line_error(p, "already exists", NAME)


def _get(app, path: str) -> tuple[str, dict]:
    environ: dict = {}
    setup_testing_defaults(environ)
    environ.update({"REQUEST_METHOD": "GET", "PATH_INFO": path, "wsgi.input": io.BytesIO()})
    status = []

    def start_response(s, headers, exc_info=None):
        status.append(s)

    body = b"".join(app(environ, start_response))
    return status[0], json.loads(body)


def test_the_study_opens_in_optuna_dashboard(searched):
    from dse.dashboard import dashboard_app

    app = dashboard_app(searched.storage_url)
    status, data = _get(app, "/api/studies")
    assert status.startswith("200"), status
    summaries = {s["study_name"]: s for s in data["study_summaries"]}
    assert set(summaries) == {NAME, f"{NAME}/confirm"}
    assert summaries[NAME]["directions"] == ["minimize", "maximize"]
    status, detail = _get(app, f"/api/studies/{summaries[NAME]['study_id']}")
    assert status.startswith("200") and len(detail["trials"]) == 6


# -- one-line errors -----------------------------------------------------------------------------


BAD = {
    "unknown key": ({"budgett": {"n_trials": 2}}, ["budgett"]),
    "bad constraint": ({"constraints": ["p99_tpot_ms =< 50"]}, ["constraints", "=<"]),
    "unknown metric": ({"objectives": [{"metric": "p99_ttft", "direction": "minimize"}]},
                       ["objectives[0].metric", "'p99_ttft'", "p99_ttft_ms"]),
    "float without step under grid": (
        {"sampler": {"kind": "grid"}, "space": {"parameters": {
            "engine.gpu_memory_utilization": {"type": "float", "low": 0.8, "high": 0.9}}}},
        ["engine.gpu_memory_utilization", "step"]),
    "unknown GPU in the base": ({"base": {**BASE, "hardware": {"gpu": "Z100"}}},
                                ["base", "hardware.gpu", "Z100"]),
}


@pytest.mark.parametrize("update, words", BAD.values(), ids=BAD.keys())
def test_a_bad_study_is_exit_2_and_one_line(tmp_path, update, words):
    study_file = tmp_path / "bad.yaml"
    study_file.write_text(yaml.safe_dump(study_data(13.0, **update), sort_keys=False))
    p = dse("search", study_file, cwd=tmp_path)
    line = assert_one_line_error(p, *words)
    assert line.startswith(f"error: {study_file}: "), line
    assert not (tmp_path / "run").exists(), "a bad study wrote a storage or a report"


def test_a_study_with_a_yaml_syntax_error_is_exit_2_and_names_the_line(tmp_path):
    study_file = tmp_path / "broken.yaml"
    study_file.write_text("name: x\nbase:\n  model: {name: meta-llama/Llama-3.1-8B}\n"
                          "   hardware: {gpu: A100-80GB}\n")
    assert_one_line_error(dse("search", study_file, cwd=tmp_path), str(study_file), "line 4")


def test_a_missing_study_file_is_exit_2(tmp_path):
    assert_one_line_error(dse("search", tmp_path / "absent.yaml"), "absent.yaml", "no such file")


def test_report_into_an_unwritable_folder_is_exit_2(searched, tmp_path):
    p = dse("report", searched.study_file, "--out", "/proc/nope", cwd=tmp_path)
    assert_one_line_error(p, "/proc/nope/report.html: cannot write the report")


def test_report_of_a_study_never_run_is_exit_2(tmp_path):
    study_file = tmp_path / "never.yaml"
    study_file.write_text(yaml.safe_dump(study_data(13.0)))
    assert_one_line_error(dse("report", study_file, cwd=tmp_path), "run `dse search` first")
    assert not (tmp_path / "run").exists()


def test_report_of_a_study_not_in_its_storage_is_exit_2(searched, tmp_path):
    # Same storage as the searched study, another name.
    study_file = tmp_path / "other.yaml"
    study_file.write_text(yaml.safe_dump(study_data(
        13.0, name="not-run", storage=searched.storage_url)))
    assert_one_line_error(dse("report", study_file, cwd=tmp_path), "'not-run'",
                          "run `dse search` first")


def test_dashboard_on_a_missing_storage_is_exit_2(tmp_path):
    study_file = tmp_path / "never.yaml"
    study_file.write_text(yaml.safe_dump(study_data(13.0)))
    p = dse("dashboard", study_file, "--port", "9", cwd=tmp_path, timeout=30)
    assert_one_line_error(p, "no file at", str(tmp_path / "run" / "study.db"))
    assert p.stdout == ""
    assert not (tmp_path / "run").exists(), "the dashboard created a storage"


# -- refused before the search starts ------------------------------------------------------------


UNWRITABLE = {
    "sqlite storage under /proc": ({"storage": "sqlite:////proc/nope/study.db"},
                                   ["storage:", "/proc/nope/study.db", "/proc"]),
    "journal storage under a file": ({"storage": "journal:///etc/passwd/x.log"},
                                     ["storage:", "/etc/passwd/x.log", "/etc/passwd is a file"]),
    "report folder under /proc": ({"report": {"dir": "/proc/nope"}},
                                  ["report.dir:", "/proc/nope", "/proc"]),
}


@pytest.mark.parametrize("update, words", UNWRITABLE.values(), ids=UNWRITABLE.keys())
def test_an_unwritable_storage_or_report_folder_is_refused_before_the_search(tmp_path, update,
                                                                            words):
    study_file = tmp_path / "study.yaml"
    study_file.write_text(yaml.safe_dump(study_data(13.0, **update), sort_keys=False))
    t0 = time.monotonic()
    p = dse("search", study_file, cwd=tmp_path)
    line = assert_one_line_error(p, *words)
    assert line.startswith(f"error: {study_file}: "), line
    assert time.monotonic() - t0 < 20, "the check came after the search started"
    assert not (tmp_path / "run").exists()


def test_a_ray_address_where_nothing_answers_fails_in_seconds(tmp_path):
    study_file = tmp_path / "study.yaml"
    study_file.write_text(yaml.safe_dump(study_data(13.0, execution={
        "workers": 2, "ray_address": "127.0.0.1:1", "connect_timeout_s": 2}), sort_keys=False))
    t0 = time.monotonic()
    p = dse("search", study_file, cwd=tmp_path)
    assert_one_line_error(p, "execution.ray_address: no Ray cluster answers at 127.0.0.1:1")
    assert time.monotonic() - t0 < 20
    assert not (tmp_path / "run").exists(), "a trial was started before the cluster answered"


# -- searches that did not do their job -----------------------------------------------------------


def test_a_search_where_no_trial_completes_exits_1_with_the_reasons_counted(tmp_path):
    study_file = tmp_path / "study.yaml"
    study_file.write_text(yaml.safe_dump(study_data(
        13.0, budget={"n_trials": 2}, fidelity={"screen": {"workload.num_prompts": 400000}},
        execution={"workers": 2, "trial_timeout_s": 1}), sort_keys=False))
    p = dse("search", study_file, cwd=tmp_path, timeout=120)
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert "Traceback" not in p.stderr
    assert p.stderr.splitlines() == ["error: no trial completed: 2 x timed out after 1 s"]
    assert re.search(rf"^study {NAME}: 0 complete \(0 within every SLO\), 0 undeployable, 2 "
                     rf"failed; Pareto set of 0$",
                     p.stdout, re.M), p.stdout
    assert report_paths(p.stdout), "the report was not written"


# -- SIGTERM and SIGKILL -------------------------------------------------------------------------


def _start_long_search(tmp_path, **popen_kw) -> tuple[Path, Path, subprocess.Popen]:
    """A search of 20 trials of 20,000 requests each (seconds a trial) started as a process of
    its own: (study file, its sqlite storage, the driver)."""
    study_file = tmp_path / "study.yaml"
    study_file.write_text(yaml.safe_dump(study_data(
        13.0, budget={"n_trials": 20}, fidelity={"screen": {"workload.num_prompts": 20000}}),
        sort_keys=False))
    driver = subprocess.Popen([sys.executable, "-m", "dse.cli", "search", str(study_file),
                               "--quiet"], cwd=tmp_path, **popen_kw)
    return study_file, tmp_path / "run" / "study.db", driver


def test_sigterm_stops_the_search_like_ctrl_c_and_leaves_no_ray_behind(tmp_path, processes,
                                                                       wait_for_storage):
    # SIGTERM comes once one trial has completed and the next batch of two runs (while the
    # first batch is being told, one of its trials is still RUNNING in the storage: a signal
    # then is held until that tell is written, and nothing is left to interrupt).
    study_file, db, driver = _start_long_search(tmp_path, stdout=subprocess.PIPE,
                                                stderr=subprocess.PIPE, text=True)
    def one_done_and_more_running(con) -> bool:
        states = [s for (s,) in con.execute("SELECT state FROM trials")]
        return states.count("COMPLETE") >= 1 and states.count("RUNNING") >= 2

    try:
        wait_for_storage(driver, db, one_done_and_more_running, 120)
        ray_processes = processes.descendants(driver.pid)
        assert any("raylet" in cmd for cmd in ray_processes.values()), ray_processes
        driver.send_signal(signal.SIGTERM)
        out, err = driver.communicate(timeout=60)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == 2, (out, err)
    assert err.splitlines() == ["error: interrupted: finished trials are stored and running "
                                "ones marked interrupted; run the same command to resume"], err
    deadline = time.monotonic() + 30
    while processes.alive(ray_processes) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes.alive(ray_processes) == [], "Ray processes were left behind"
    st = load(load_study(study_file).storage_url)
    states = [t.state for t in st.trials]
    assert optuna.trial.TrialState.COMPLETE in states
    assert optuna.trial.TrialState.RUNNING not in states
    interrupted = [t for t in st.trials if t.state == optuna.trial.TrialState.FAIL]
    assert interrupted and all(t.user_attrs["failure_reason"] == "interrupted"
                               for t in interrupted)



def test_a_driver_killed_outright_leaves_no_ray_behind(tmp_path, processes, wait_for_storage):
    """SIGKILL cannot be handled: the watchdog started beside Ray stops Ray's processes."""
    _, db, driver = _start_long_search(tmp_path, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL)
    try:
        wait_for_storage(driver, db, lambda con: con.execute(
            "SELECT count(*) FROM trials WHERE state = 'RUNNING'").fetchone()[0] > 0, 120)
        time.sleep(1.0)          # the watchdog has seen the workers running the trials
        ray_processes = processes.descendants(driver.pid)
        assert any("raylet" in cmd for cmd in ray_processes.values()), ray_processes
        assert any("Agent" in cmd for cmd in ray_processes.values()), ray_processes
        driver.kill()
        driver.wait(timeout=30)
    finally:
        if driver.poll() is None:
            driver.kill()
    deadline = time.monotonic() + 30
    while processes.alive(ray_processes) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes.alive(ray_processes) == [], "Ray processes were left behind"

def test_an_interrupt_while_the_report_is_written_is_exit_2_and_says_how_to_write_it(
        tmp_path, monkeypatch):
    # After the trials, an interrupt (Ctrl-C, or SIGTERM, whose handler is set again once Ray
    # has shut down) used to end in click's "Aborted!" with exit 1, which means no trial ran.
    from types import SimpleNamespace

    from click.testing import CliRunner

    import dse.report_files
    import dse.runner
    from dse.cli import main

    study = tmp_path / "s.yaml"
    study.write_text(yaml.safe_dump({
        "name": "i", "base": {"model": {"name": "meta-llama/Llama-3.1-8B"},
                              "hardware": {"gpu": "A100-80GB"}, "workload": {"num_prompts": 8}},
        "space": {"parameters": {"engine.max_num_seqs": {"type": "categorical",
                                                         "choices": [8, 16]}}},
        "objectives": [{"metric": "p99_ttft_ms", "direction": "minimize"}],
        "report": {"dir": str(tmp_path / "r")}}))
    outcome = SimpleNamespace(notes=(), workers_line=lambda: "")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(dse.runner, "run_search", lambda *a, **k: outcome)
    monkeypatch.setattr(dse.report_files, "decided_report", interrupted)
    before = signal.getsignal(signal.SIGTERM)
    try:
        r = CliRunner().invoke(main, ["search", str(study)])
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, before)
    assert r.exit_code == 2
    assert ("interrupted while writing the report: every trial is stored; `dse report "
            f"{study}` writes it") in r.output
