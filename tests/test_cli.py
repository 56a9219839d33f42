"""The `dse` command line as a user runs it: output, exit codes, one-line errors, light imports."""

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from simcore.engine.conformance import read_steps
from simcore.reference_data import CONFORMANCE_DIR

TESTS = Path(__file__).parent
CONFIGS = TESTS / "data" / "configs"
CONFORMANCE = CONFORMANCE_DIR
BASIC = CONFORMANCE / "scenarios" / "basic.json.gz"
BASIC_GOLDEN = CONFORMANCE / "golden" / "basic.jsonl.gz"


def dse(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dse.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=60, cwd=cwd)


def assert_one_line_error(p: subprocess.CompletedProcess, *words: str) -> str:
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stdout + p.stderr
    lines = p.stderr.splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("error: ")
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


# -- dse simulate ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("sim") / "deep" / "tiny.json"
    return dse("simulate", CONFIGS / "tiny.yaml", "--out", out, "--quiet"), out


def test_simulate_prints_the_summary_and_writes_json(tiny_run):
    p, out = tiny_run
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""
    text = p.stdout
    assert "Serving Benchmark Result (simulated)" in text
    assert "Successful requests:" in text and text.count("\n") > 30
    assert "Request goodput (req/s):" in text
    assert "calibrated profile" in text and ": a100-80gb-aiconfigurator" in text
    assert ("compute.kind calibrated (the default, auto: a kernel profile of A100-80GB is "
            "shipped)") in " ".join(text.split())
    assert f"result written to {out}" in text
    r = json.loads(out.read_text())
    assert r["name"] == "tiny"
    assert r["completed"] == 20 and r["failed"] == 0
    assert r["provenance"]["seed"] == 3
    # The printed numbers are the written ones.
    assert f"{r['mean_ttft_ms']:.2f}" in text
    assert f"{r['request_throughput']:.2f}" in text
    line = next(ln for ln in text.splitlines() if ln.startswith("Successful requests:"))
    assert line.split()[-1] == "20"
    # As vllm bench serve prints them: failures even when none, the configured rate when
    # finite, the peak concurrency to two decimals.
    lines = {ln.split(":")[0]: ln.split()[-1] for ln in text.splitlines() if ":" in ln}
    assert lines["Failed requests"] == "0"
    if isinstance(r["request_rate"], float):
        assert lines["Request rate configured (RPS)"] == f"{r['request_rate']:.2f}"
    assert lines["Peak concurrent requests"] == f"{r['max_concurrent_requests']:.2f}"
    # The request rows, held as columns in the run, are written as the plain result's rows.
    from simcore.config import load_config
    from simcore.uncertainty import simulate_with_envelope

    assert r["requests"] == simulate_with_envelope(load_config(CONFIGS / "tiny.yaml"))["requests"]
    assert len(r["requests"]) == 20 and r["requests"][0]["request_id"]


@pytest.mark.slow
def test_simulate_seed_override_changes_the_result(tiny_run, tmp_path):
    _, out = tiny_run
    other = tmp_path / "seed4.json"
    p = dse("simulate", CONFIGS / "tiny.yaml", "--out", other, "--seed", "4", "--quiet")
    assert p.returncode == 0, p.stderr
    a, b = json.loads(out.read_text()), json.loads(other.read_text())
    assert b["provenance"]["seed"] == 4
    assert a["mean_ttft_ms"] != b["mean_ttft_ms"]


@pytest.mark.slow
def test_simulate_resolves_trace_paths_from_the_config_directory(tmp_path):
    out = tmp_path / "m.json"
    p = dse("simulate", CONFIGS / "mooncake.yaml", "--out", out, "--quiet", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    r = json.loads(out.read_text())
    assert r["completed"] == 30


@pytest.mark.parametrize("name, words", [
    ("unknown_key.yaml", ["unknown_key.yaml", "engine.max_num_seq", "not a known setting"]),
    ("bad_syntax.yaml", ["bad_syntax.yaml", "line 3", "not valid YAML"]),
    ("too_big.yaml", ["weights", "GiB"]),
    ("missing_trace.yaml", ["no_such_trace.jsonl", "no such file", "workload.dataset.path"]),
    ("does_not_exist.yaml", ["does_not_exist.yaml", "no such file"]),
])
@pytest.mark.slow
def test_simulate_bad_input_is_one_error_line(name, words):
    p = dse("simulate", CONFIGS / name)
    assert_one_line_error(p, *words)
    assert p.stdout == ""


@pytest.mark.slow
def test_simulate_directory_as_config_is_one_error_line(tmp_path):
    p = dse("simulate", tmp_path)
    assert p.returncode == 2
    assert len(p.stderr.splitlines()) == 1 and p.stderr.startswith("error: "), (
        "a directory given as CONFIG gets click's multi-line usage error instead of one "
        f"'error:' line (dse/cli.py, click.Path(dir_okay=False)); got {p.stderr!r}")


@pytest.mark.slow
def test_simulate_is_deterministic_across_processes(tmp_path):
    # Different hash seeds in different processes (as in different workers): same bytes.
    outs = []
    for hash_seed in ("1", "2"):
        out = tmp_path / f"r{hash_seed}.json"
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        p = subprocess.run([sys.executable, "-m", "dse.cli", "simulate",
                            str(CONFIGS / "prefix_dp2.yaml"), "--out", str(out), "--quiet"],
                           capture_output=True, text=True, timeout=60, env=env)
        assert p.returncode == 0, p.stderr
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
    r = json.loads(outs[0])
    assert r["num_routed_by_prefix"] > 0 and r["prefix_cache_hit_rate"] > 0


@pytest.mark.slow
def test_simulate_unwritable_out_is_one_error_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    p = dse("simulate", CONFIGS / "tiny.yaml", "--out", blocker / "sub" / "r.json", "--quiet")
    assert_one_line_error(p, "cannot write the result")


@pytest.mark.slow
def test_simulate_does_not_import_search_or_plotting_libraries():
    code = (
        "import sys\n"
        "from dse.cli import main\n"
        f"main(['simulate', {str(CONFIGS / 'tiny.yaml')!r}, '--quiet'], standalone_mode=False)\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'ray', 'optuna', 'plotly'})\n"
        "print('HEAVY', heavy)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "Serving Benchmark Result" in p.stdout, "the command must have run"
    assert p.stdout.strip().splitlines()[-1] == "HEAVY []"


# -- dse conformance -------------------------------------------------------------------------------


@pytest.mark.slow
def test_conformance_matches_the_golden_log(tmp_path):
    out = tmp_path / "basic.jsonl"
    p = dse("conformance", BASIC, "--out", out, "--golden", BASIC_GOLDEN)
    assert p.returncode == 0, p.stderr
    golden = read_steps(BASIC_GOLDEN)
    assert f"{len(golden)} steps written to {out}" in p.stdout
    assert f"identical to {BASIC_GOLDEN}: all {len(golden)} steps match" in p.stdout
    ours = read_steps(out)
    assert len(ours) == len(golden) > 100
    for a, b in zip(ours, golden):
        assert a == b, a["step"]


@pytest.mark.slow
def test_conformance_without_golden_only_writes(tmp_path):
    out = tmp_path / "o.jsonl"
    p = dse("conformance", BASIC, "--out", out)
    assert p.returncode == 0, p.stderr
    assert "identical" not in p.stdout
    assert read_steps(out) == read_steps(BASIC_GOLDEN)


def test_conformance_writes_a_gz_log_gzipped_and_refuses_to_write_over_its_reference(
        tmp_path):
    out = tmp_path / "o.jsonl.gz"
    p = dse("conformance", BASIC, "--out", out)
    assert p.returncode == 0, p.stderr
    assert out.read_bytes()[:2] == b"\x1f\x8b" and read_steps(out) == read_steps(BASIC_GOLDEN)
    golden = tmp_path / "g.jsonl.gz"
    golden.write_bytes(BASIC_GOLDEN.read_bytes())
    assert_one_line_error(dse("conformance", BASIC, "--out", golden, "--golden", golden),
                          "is also --golden; it would be written over")
    assert golden.read_bytes() == BASIC_GOLDEN.read_bytes()


def _write_golden(path: Path, steps: list[dict]) -> Path:
    with gzip.open(path, "wt") as f:
        for s in steps:
            f.write(json.dumps(s) + "\n")
    return path


@pytest.mark.slow
def test_conformance_names_the_first_differing_step(tmp_path):
    steps = read_steps(BASIC_GOLDEN)
    steps[7]["free_blocks"] += 1
    steps[9]["free_blocks"] += 1
    golden = _write_golden(tmp_path / "tampered.jsonl.gz", steps)
    p = dse("conformance", BASIC, "--out", tmp_path / "o.jsonl", "--golden", golden)
    assert p.returncode == 1
    assert "Traceback" not in p.stdout + p.stderr
    expected = steps[7]["free_blocks"]
    assert (f"differs from {golden}: step 7: free_blocks differs: ours {expected - 1}, "
            f"the log {expected}") in p.stdout


@pytest.mark.slow
def test_conformance_names_a_step_count_difference(tmp_path):
    steps = read_steps(BASIC_GOLDEN)[:-3]
    golden = _write_golden(tmp_path / "short.jsonl.gz", steps)
    p = dse("conformance", BASIC, "--out", tmp_path / "o.jsonl", "--golden", golden)
    assert p.returncode == 1
    n = len(steps) + 3
    assert f"step count differs: ours {n}, the log {len(steps)}" in p.stdout


@pytest.mark.slow
def test_conformance_bad_input_is_one_error_line(tmp_path):
    assert_one_line_error(dse("conformance", tmp_path / "none.json", "--out", tmp_path / "o"),
                          "none.json", "no such scenario file")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert_one_line_error(dse("conformance", bad, "--out", tmp_path / "o"), "bad.json",
                          "not valid JSON")
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text("hello\n")
    assert_one_line_error(dse("conformance", BASIC, "--out", tmp_path / "o", "--golden", garbage),
                          "garbage.jsonl", "cannot be read as a step log")


def _scenario(path: Path, config: dict | None = None, requests: list | None = None) -> Path:
    cfg = {"max_num_seqs": 4, "max_num_batched_tokens": 64, "num_blocks": 10, **(config or {})}
    req = {"id": "a", "arrive_step": 0, "prompt_len": 5, "output_len": 3}
    path.write_text(json.dumps({"config": cfg, "requests": requests or [req]}))
    return path


@pytest.mark.slow
def test_conformance_refuses_what_it_would_otherwise_drop_or_misread(tmp_path):
    req = {"id": "a", "arrive_step": 0, "prompt_len": 5, "output_len": 3}
    cases = [({"max_num_scheduled_token": 8}, None,
              "config.max_num_scheduled_token: is not a scenario setting (did you mean "
              "max_num_scheduled_tokens?)"),
             (None, [{**req, "skip_reading_prefix_cach": True}],
              "requests[0].skip_reading_prefix_cach: is not a request field (did you mean "
              "skip_reading_prefix_cache?)"),
             (None, [req, {**req, "id": "b"}, {**req, "arrive_step": 4}],
              "requests[2].id: 'a' is also the id of requests[0]"),
             ({"policy": "lifo"}, None, "config.policy: expected one of fcfs, priority (got 'lifo')")]
    for config, requests, words in cases:
        sc = _scenario(tmp_path / "s.json", config, requests)
        assert_one_line_error(dse("conformance", sc, "--out", tmp_path / "o"), "s.json", words)


@pytest.mark.slow
def test_conformance_checks_engine_values_as_simulate_does(tmp_path):
    sc = _scenario(tmp_path / "s.json", {"max_num_seqs": -1})
    line = assert_one_line_error(dse("conformance", sc, "--out", tmp_path / "o"), "s.json")
    cfg = tmp_path / "c.yaml"
    tiny = yaml.safe_load((CONFIGS / "tiny.yaml").read_text())
    tiny.setdefault("engine", {})["max_num_seqs"] = -1
    cfg.write_text(yaml.safe_dump(tiny))
    sim = assert_one_line_error(dse("simulate", cfg), "c.yaml")
    assert line.split("config.", 1)[1] == sim.split("engine.", 1)[1] \
        == "max_num_seqs: must be at least 1 (got -1)"
