"""What `dse simulate`, `replay` and `fabric` refuse before they run anything: output files
that could not be written afterwards, and runs too big for the machine's memory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

import simcore.fabric.run
import simcore.uncertainty
from dse.cli import main
from simcore.reference_data import CONFORMANCE_DIR

TESTS = Path(__file__).parent
TINY = TESTS / "data" / "configs" / "tiny.yaml"
ROOT = TESTS.parent
BASIC_GOLDEN = CONFORMANCE_DIR / "golden" / "basic.jsonl.gz"


def invoke(*args) -> "CliRunner.invoke":
    return CliRunner().invoke(main, [str(a) for a in args])


def one_error_line(r) -> str:
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    assert isinstance(r.exception, SystemExit), r.exception
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    return lines[0]


@pytest.fixture
def no_run(monkeypatch):
    """Fail the test if a simulation or a fabric run starts."""
    def refuse(*args, **kwargs):
        raise AssertionError("the run started before the output was checked")

    monkeypatch.setattr(simcore.uncertainty, "simulate_with_envelope", refuse)
    monkeypatch.setattr(simcore.fabric.run, "run_scenario", refuse)


@pytest.fixture
def blocked(tmp_path) -> Path:
    """A path whose parent folder cannot be made: a file stands where the folder would be."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    return blocker / "sub" / "out.json"


@pytest.mark.parametrize("option, what", [("--out", "result"), ("--trace", "trace")])
def test_simulate_checks_its_outputs_before_the_run(no_run, blocked, option, what):
    cfg = TINY
    if option == "--trace":
        cfg = blocked.parents[2] / "c.yaml"
        data = yaml.safe_load(TINY.read_text())
        data.update(parallelism={"tensor_parallel_size": 8},
                    cluster={"num_nodes": 1, "trace": {"num_steps": 1}})
        cfg.write_text(yaml.safe_dump(data))
    msg = one_error_line(invoke("simulate", cfg, option, blocked, "--quiet"))
    assert msg == (f"error: {blocked}: cannot write the {what} ({blocked.parents[1]} "
                   f"is a file, not a folder)")


def test_an_output_that_is_a_folder_is_refused_before_the_run(no_run, tmp_path):
    msg = one_error_line(invoke("simulate", TINY, "--out", tmp_path, "--quiet"))
    assert msg == f"error: {tmp_path}: cannot write the result (it is a folder)"


def test_replay_and_fabric_check_their_outputs(no_run, blocked, monkeypatch):
    import simcore.cluster.replay

    monkeypatch.setattr(simcore.cluster.replay, "replay_steps", simcore.fabric.run.run_scenario)
    cfg = blocked.parents[2] / "c.yaml"
    data = yaml.safe_load(TINY.read_text())
    data.update(parallelism={"tensor_parallel_size": 8}, cluster={"num_nodes": 1})
    cfg.write_text(yaml.safe_dump(data))
    msg = one_error_line(invoke("replay", BASIC_GOLDEN, "--config", cfg, "--out", blocked))
    assert msg.startswith(f"error: {blocked}: cannot write the result")
    msg = one_error_line(invoke("fabric", ROOT / "examples" / "fabric" / "incast_pfc.yaml",
                                "--out", blocked))
    assert msg.startswith(f"error: {blocked}: cannot write the measurements")


def test_a_writable_output_leaves_nothing_behind_until_written(tmp_path, monkeypatch):
    seen = {}

    def fake_run(cfg, **kwargs):
        seen["files"] = sorted(os.listdir(tmp_path))
        raise simcore.errors.ConfigError("workload: stop here")

    import simcore.errors

    monkeypatch.setattr(simcore.uncertainty, "simulate_with_envelope", fake_run)
    existing = tmp_path / "old.json"
    existing.write_text("keep")
    one_error_line(invoke("simulate", TINY, "--out", tmp_path / "new" / "r.json", "--quiet"))
    one_error_line(invoke("simulate", TINY, "--out", existing, "--quiet"))
    assert seen["files"] == ["old.json"] and existing.read_text() == "keep"


def test_a_run_too_big_for_the_memory_is_refused_before_anything_is_made(no_run, tmp_path,
                                                                        monkeypatch):
    import simcore.footprint
    import simcore.workload.generate

    def refuse(*args, **kwargs):
        raise AssertionError("requests were generated before the memory check")

    monkeypatch.setattr(simcore.workload.generate, "request_stream", refuse)
    monkeypatch.setattr(simcore.footprint, "available_memory_bytes", lambda: 16 * 2**30)
    cfg = tmp_path / "huge.yaml"
    cfg.write_text(TINY.read_text().replace("num_prompts: 20", "num_prompts: 100000000"))
    msg = one_error_line(invoke("simulate", cfg, "--quiet"))
    assert msg == (f"error: {cfg}: workload.num_prompts: 100,000,000 requests need about 246.1 "
                   f"GiB of memory (2,640 bytes a request with 16 output tokens each), more "
                   f"than the 16.0 GiB this machine has available; lower num_prompts or free "
                   f"memory")
