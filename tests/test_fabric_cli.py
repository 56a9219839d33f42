"""`dse fabric`: every shipped scenario runs and writes its measurements; bad input is one line."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = sorted((ROOT / "examples" / "fabric").glob("*.yaml"))


def dse(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "dse.cli", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=600)


def test_scenarios_are_shipped():
    assert len(SCENARIOS) >= 6


@pytest.mark.slow
@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_every_shipped_scenario_runs_on_the_flow_backend(path):
    from simcore.fabric.run import run_scenario

    result = run_scenario(path, "flow")
    assert result["bytes"]["conserved"] is True
    json.dumps(result, allow_nan=False)


@pytest.mark.slow
def test_cli_prints_and_writes_the_measurements(tmp_path):
    out = tmp_path / "stats.json"
    p = dse("fabric", ROOT / "examples/fabric/dumbbell_two_senders.yaml", "--backend", "packet",
            "--out", out)
    assert p.returncode == 0, p.stderr
    assert "Bytes conserved:" in p.stdout and "yes" in p.stdout
    stats = json.loads(out.read_text())
    assert stats["backend"] == "packet" and stats["bytes"]["conserved"] is True
    assert stats["losses"]["drops"] == 0


@pytest.mark.slow
def test_bad_scenario_is_one_error_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("topology: {kind: star, num_hosts: 2, rate_gbps: 10, delay_s: 1.0e-6}\n"
                   "traffic: [{kind: message, src: h0, dst: h9, size_bytes: 1000}]\n")
    p = dse("fabric", bad)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "h9" in lines[0]
    assert "Traceback" not in p.stderr
    p = dse("fabric", tmp_path / "missing.yaml")
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1
