"""`dse conformance SCENARIO --record-with-installed-vllm`: the simulator's steps against the
decisions of vLLM's own scheduler run now, in an interpreter that can import vLLM.

CI has no vLLM, so most tests stand a small script in for vLLM's interpreter: it speaks the
recorder's contract (print "vllm VERSION", write the step log to its last argument), which
checks everything on this side of the link: the invocation, the comparison and its report, the
errors. With SIMCORE_VLLM_ENV set to an environment scripts/vllm_conformance/setup.sh built, the
last test runs vLLM's real scheduler on every shipped scenario."""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import stat
import sys
from pathlib import Path

import pytest

from simcore.engine.conformance import read_steps
from simcore.engine.vllm_link import RECORDER, record_with_vllm
from simcore.errors import ConfigError
from simcore.reference_data import CONFORMANCE_DIR
from tests.test_cli import BASIC, BASIC_GOLDEN, assert_one_line_error, dse


def _fake_vllm(tmp_path: Path, steps: list[dict] | None, *, version="9.9.9",
               fail: str | None = None) -> Path:
    """An executable standing in for vLLM's interpreter: it prints its version and writes
    `steps` to the output path it is given (or fails with `fail` on stderr)."""
    log = tmp_path / "vllm_steps.jsonl"
    if steps is not None:
        log.write_text("".join(json.dumps(s) + "\n" for s in steps))
    script = tmp_path / "fake-python"
    body = (f"import sys, shutil\nassert sys.argv[1].endswith('vllm_recorder.py')\n"
            f"print('vllm {version}')\n")
    body += (f"sys.stderr.write({fail!r} + '\\n'); sys.exit(1)\n" if fail else
             f"shutil.copy({str(log)!r}, sys.argv[3])\n")
    script.write_text(f"#!{sys.executable}\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


@pytest.mark.slow
def test_identical_decisions_are_reported_with_the_vllm_version(tmp_path):
    fake = _fake_vllm(tmp_path, read_steps(BASIC_GOLDEN))
    kept = tmp_path / "kept" / "vllm.jsonl"
    p = dse("conformance", BASIC, "--record-with-installed-vllm", "--vllm-python", fake,
            "--vllm-out", kept)
    assert p.returncode == 0, p.stderr
    n = len(read_steps(BASIC_GOLDEN))
    assert f"vLLM 9.9.9 scheduled basic.json.gz in {n} steps (written to {kept})" in p.stdout
    assert f"identical to vLLM 9.9.9's scheduler: all {n} steps match" in p.stdout
    assert read_steps(kept) == read_steps(BASIC_GOLDEN)


@pytest.mark.slow
def test_a_rule_vllm_changed_is_named_by_its_first_step(tmp_path):
    steps = read_steps(BASIC_GOLDEN)
    steps[5]["scheduled"] = {k: v + 1 for k, v in steps[5]["scheduled"].items()}
    p = dse("conformance", BASIC, "--record-with-installed-vllm",
            "--vllm-python", _fake_vllm(tmp_path, steps, version="0.99.0"))
    assert p.returncode == 1
    assert "Traceback" not in p.stdout + p.stderr
    assert "differs from vLLM 0.99.0's scheduler: step 5: scheduled differs" in p.stdout


@pytest.mark.slow
def test_a_missing_or_failing_vllm_is_one_error_line(tmp_path):
    if importlib.util.find_spec("vllm") is None:     # this interpreter has no vLLM
        line = assert_one_line_error(dse("conformance", BASIC, "--record-with-installed-vllm"),
                                     "cannot import", "setup.sh")
        assert sys.executable in line
    assert_one_line_error(dse("conformance", BASIC, "--record-with-installed-vllm",
                              "--vllm-python", tmp_path / "nowhere" / "python"),
                          "no such interpreter")
    fake = _fake_vllm(tmp_path, None, fail="SystemExit: stuck at step 3")
    assert_one_line_error(dse("conformance", BASIC, "--record-with-installed-vllm",
                              "--vllm-python", fake), "vLLM's scheduler failed", "stuck at step 3")
    assert_one_line_error(dse("conformance", BASIC, "--vllm-out", tmp_path / "v.jsonl"),
                          "need --record-with-installed-vllm")
    assert_one_line_error(dse("conformance", BASIC, "--record-with-installed-vllm", "--golden",
                              BASIC_GOLDEN), "give one reference")
    assert_one_line_error(dse("conformance", BASIC), "--out")


def test_the_recorder_is_shipped_standalone_with_its_model():
    text = RECORDER.read_text()
    assert "simcore" not in text.split('"""', 2)[2]        # imports nothing of the project
    spec = importlib.util.spec_from_file_location("recorder", RECORDER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)                            # no vLLM needed to load it
    cfg = json.loads((Path(mod.TINY_MODEL) / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    # The keys it passes to vLLM are the scenario format's vLLM keys.
    from simcore.engine.conformance import CONFIG_KEYS
    assert mod.CONFIG_KEYS <= set(CONFIG_KEYS)


def test_record_with_vllm_checks_its_paths(tmp_path):
    with pytest.raises(ConfigError, match="no such directory"):
        record_with_vllm(BASIC, tmp_path / "o", vllm_path=tmp_path / "missing")


VLLM_ENV = os.environ.get("SIMCORE_VLLM_ENV")


@pytest.mark.slow
@pytest.mark.skipif(not VLLM_ENV, reason="set SIMCORE_VLLM_ENV to a setup.sh environment")
@pytest.mark.parametrize("name", sorted(p.name.removesuffix(".json.gz") for p in
                                        (CONFORMANCE_DIR / "scenarios").glob("*.json.gz")))
def test_vllms_real_scheduler_agrees_on_every_shipped_scenario(tmp_path, name):
    env = Path(VLLM_ENV)
    out = tmp_path / "vllm.jsonl"
    version = record_with_vllm(CONFORMANCE_DIR / "scenarios" / f"{name}.json.gz", out,
                               python=env / "venv" / "bin" / "python", vllm_path=env / "src")
    assert version
    with gzip.open(CONFORMANCE_DIR / "golden" / f"{name}.jsonl.gz", "rt") as f:
        golden = [json.loads(line) for line in f if line.strip()]
    assert read_steps(out) == golden
