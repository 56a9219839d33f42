"""Golden scenarios: the scheduler makes exactly vLLM 0.33's decisions, step for step."""

from pathlib import Path

import pytest

from simcore.engine.conformance import compare, load_scenario, read_steps, replay
from simcore.errors import ConfigError
from simcore.reference_data import CONFORMANCE_DIR

DATA = CONFORMANCE_DIR
NAMES = sorted(p.name.removesuffix(".json.gz") for p in (DATA / "scenarios").glob("*.json.gz"))


def test_all_seven_scenarios_are_shipped():
    assert NAMES == ["basic", "mooncake_head", "nochunk", "noprefixcache", "prefix", "pressure",
                     "threshold"]


@pytest.mark.parametrize("name", NAMES)
def test_every_step_matches_vllm(name):
    ours = list(replay(load_scenario(DATA / "scenarios" / f"{name}.json.gz")))
    golden = read_steps(DATA / "golden" / f"{name}.jsonl.gz")
    assert compare(ours, golden) is None
    assert ours == [dict(g) for g in golden]


def test_goldens_discriminate_behaviours():
    """Turning off full-prompt admission changes the decisions: the comparison can fail."""
    sc = load_scenario(DATA / "scenarios" / "pressure.json.gz")
    golden = read_steps(DATA / "golden" / "pressure.jsonl.gz")
    diff = compare(list(replay(sc, reserve_full_isl=False)), golden)
    assert diff is not None and diff.startswith("step 3: scheduled differs")


def test_bad_scenarios_name_the_problem(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"config": {"max_num_seqs": 4}, "requests": []}')
    with pytest.raises(ConfigError, match="config.max_num_batched_tokens is missing"):
        load_scenario(bad)
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_scenario(bad)
    with pytest.raises(ConfigError, match="no such scenario file"):
        load_scenario(tmp_path / "missing.json")
    bad.write_text('{"config": {"max_num_seqs": 4, "max_num_batched_tokens": 64, "num_blocks": 10},'
                   ' "requests": [{"id": "a", "arrive_step": 0, "prompt_len": 0, "output_len": 3}]}')
    with pytest.raises(ConfigError, match=r"requests\[0\].prompt_len"):
        load_scenario(bad)
