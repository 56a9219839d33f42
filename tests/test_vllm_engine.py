"""`engine.implementation: vllm`: an engine whose every scheduling decision comes from a vLLM
scheduler in a child process, applied to the simulator's requests on the virtual clock.

CI has no vLLM: `tests/fake_vllm.py` stands in for its interpreter, speaking the same protocol
with the simulator's own scheduler deciding; a simulation driven through it must then equal the
plain simulation exactly, which checks everything on this side (requests sent, decisions
applied, tokens, preemptions, aborts, prefix hits, KV usage, evictions). With SIMCORE_VLLM_ENV
set to an environment scripts/vllm_conformance/setup.sh built, the last test drives vLLM's real
scheduler and requires the same result (the conformance scenarios say it decides alike)."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from simcore.config import parse_config
from simcore.errors import ConfigError
from simcore.simulate import simulate

ROOT = Path(__file__).resolve().parent.parent
BASE = {"name": "vllm-driven", "seed": 3,
        "model": {"name": "meta-llama/Llama-3.1-8B", "max_model_len": 4096},
        "hardware": {"gpu": "H100-SXM"}, "compute": {"kind": "roofline"},
        "metrics": {"timeseries_interval_s": 0.25}}
# A shared prefix, a pool small enough to preempt, and clients that give up (aborts).
PRESSURE = {**BASE,
            "engine": {"num_gpu_blocks_override": 400, "max_num_seqs": 48},
            "workload": {"num_prompts": 160, "request_rate": 40, "request_timeout_s": 6.0,
                         "dataset": {"kind": "random", "input_len": 600, "output_len": 120,
                                     "range_ratio": 0.5, "prefix_len": 256}}}
# Several shared prompts of priorities 0-3 under the priority policy, prefix-cache evictions
# in a small pool.
PRIORITY = {**BASE,
            "engine": {"num_gpu_blocks_override": 300, "scheduling_policy": "priority"},
            "workload": {"num_prompts": 120, "request_rate": 30,
                         "dataset": {"kind": "custom", "path": str(
                             ROOT / "tests" / "data" / "priority_prefixes.jsonl")}}}


def _fake_python(tmp_path: Path) -> Path:
    script = tmp_path / "fake-python"
    script.write_text(f"#!/bin/sh\nPYTHONPATH={ROOT} exec {sys.executable} "
                      f"{ROOT / 'tests' / 'fake_vllm.py'} \"$@\"\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def _without_semantics(result: dict) -> dict:
    out = dict(result)
    out["provenance"] = {k: v for k, v in result["provenance"].items()
                         if k != "engine_semantics"}
    return out


@pytest.mark.slow
@pytest.mark.parametrize("case", [PRESSURE, PRIORITY], ids=["pressure", "priority"])
def test_an_engine_driven_through_the_link_equals_the_simulators_own(tmp_path, case):
    own = simulate(parse_config(case))
    driven = simulate(parse_config({**case, "engine": {
        **case["engine"], "implementation": "vllm", "vllm_python": str(_fake_python(tmp_path))}}))
    assert "vLLM 0.0.0+fake's own V1 scheduler (engine.implementation vllm)" in \
        driven["provenance"]["engine_semantics"]
    assert _without_semantics(driven) == _without_semantics(own)
    # The run exercised what the link must carry.
    assert own["num_completed"] > 0
    if case is PRESSURE:
        assert own["total_preemptions"] > 0 and own["num_cached_prompt_tokens"] > 0
        assert own["num_failed"] > 0 or own["num_completed"] < 160


def test_settings_vllm_does_not_take_are_refused_naming_the_field():
    for extra, word in (({"persistent_batch": True}, "persistent_batch"),
                        ({"preemption_mode": "least_work_done"}, "preemption_mode")):
        with pytest.raises(ConfigError, match=word):
            parse_config({**PRESSURE, "engine": {"implementation": "vllm", **extra}})
    with pytest.raises(ConfigError, match="vllm_python"):
        parse_config({**PRESSURE, "engine": {"vllm_python": "/usr/bin/python3"}})


@pytest.mark.slow
def test_a_missing_vllm_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="no such interpreter"):
        simulate(parse_config({**PRESSURE, "engine": {
            "implementation": "vllm", "vllm_python": str(tmp_path / "none" / "python")}}))
    broken = tmp_path / "broken-python"
    broken.write_text("#!/bin/sh\necho 'ModuleNotFoundError: No module named '\"'vllm'\" >&2\n"
                      "exit 1\n")
    broken.chmod(broken.stat().st_mode | stat.S_IEXEC)
    with pytest.raises(ConfigError, match="cannot import vllm"):
        simulate(parse_config({**PRESSURE, "engine": {
            "implementation": "vllm", "vllm_python": str(broken)}}))
    gpt_oss = {**PRESSURE, "model": {"name": "openai/gpt-oss-20b", "dtype": "mxfp4",
                                     "max_model_len": 4096},
               "engine": {"implementation": "vllm", "vllm_python": str(_fake_python(tmp_path))}}
    with pytest.raises(ConfigError, match="sliding-window"):
        simulate(parse_config(gpt_oss))


VLLM_ENV = os.environ.get("SIMCORE_VLLM_ENV")


@pytest.mark.slow
@pytest.mark.skipif(not VLLM_ENV, reason="set SIMCORE_VLLM_ENV to a setup.sh environment")
def test_vllms_real_scheduler_drives_the_same_simulation():
    env = Path(VLLM_ENV)
    own = simulate(parse_config(PRESSURE))
    driven = simulate(parse_config({**PRESSURE, "engine": {
        **PRESSURE["engine"], "implementation": "vllm",
        "vllm_python": str(env / "venv" / "bin" / "python"), "vllm_path": str(env / "src")}}))
    assert "own V1 scheduler (engine.implementation vllm)" in \
        driven["provenance"]["engine_semantics"]
    assert _without_semantics(driven) == _without_semantics(own)
