"""Reading the user's files: a byte that is not UTF-8 and a key given twice are one sentence naming
the file (and the byte or the lines), in every reader and in `dse simulate`, `search`, `fabric`."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from dse.cli import main
from dse.space import load_space
from dse.study import load_study
from simcore import loading
from simcore.calibration.profile import CalibrationProfile
from simcore.cluster.replay import read_step_log
from simcore.config import load_config
from simcore.engine.conformance import load_scenario as load_conformance_scenario
from simcore.errors import ConfigError
from simcore.fabric.scenario import load_scenario
from simcore.loading import load_json, load_yaml, not_utf8, parse_yaml, read_text
from simcore.model.hf import load_hf_config
from simcore.workload import WorkloadConfig, generate_requests

TESTS = Path(__file__).parent
DATA = TESTS / "data"
ROOT = TESTS.parent
BAD = b"\xe9"          # Latin-1 "e acute": not UTF-8 on its own


def with_bad_byte(src: Path, dst: Path, marker: bytes) -> tuple[Path, int, int]:
    """Copy `src` to `dst` with BAD inserted just before the first `marker`; (dst, offset, line)."""
    data = src.read_bytes()
    at = data.index(marker)
    dst.write_bytes(data[:at] + BAD + data[at:])
    return dst, at, data.count(b"\n", 0, at) + 1


def config_error(call, *args, **kwargs) -> ConfigError:
    with pytest.raises(ConfigError) as e:
        call(*args, **kwargs)
    return e.value


def assert_not_utf8(err: ConfigError | str, path: Path, offset: int, line: int) -> None:
    msg = str(err)
    assert f"{path}: not UTF-8 text (byte {offset}, on line {line})" in msg, msg
    assert "\n" not in msg and "codec" not in msg


# -- the loader itself ---------------------------------------------------------------------------


def test_read_text_names_the_offset_and_line_of_the_first_bad_byte(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_bytes(b"a: 1\nb: caf" + BAD + b"\nc: \xff\n")
    with pytest.raises(ConfigError) as e:
        read_text(path)
    assert str(e.value) == f"{path}: not UTF-8 text (byte 11, on line 2); save it as UTF-8"


def test_read_text_accepts_utf8_and_drops_a_byte_order_mark(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_bytes(b"\xef\xbb\xbfname: caf\xc3\xa9\n")
    assert read_text(path) == "name: café\n"
    assert load_yaml(path) == {"name": "café"}


def test_read_text_missing_file_and_folder(tmp_path):
    with pytest.raises(ConfigError, match=r"none.yaml: no such file$"):
        read_text(tmp_path / "none.yaml")
    with pytest.raises(ConfigError, match=r": is a folder, not a file$"):
        read_text(tmp_path)


@pytest.mark.parametrize("data, offset, line", [
    (b"ok\n" * 5 + b"\x80", 15, 6),               # a stray continuation byte
    (b"x\ny\xc3", 3, 2),                          # a sequence cut short at the end of the file
    (b"ab\xf0\x9f\x98", 2, 1),
])
def test_not_utf8_finds_the_byte_of_a_streamed_file(tmp_path, data, offset, line):
    path = tmp_path / "t.jsonl"
    path.write_bytes(data)
    assert_not_utf8(not_utf8(path), path, offset, line)


def test_not_utf8_across_read_chunks(tmp_path, monkeypatch):
    # A multi-byte character split by a chunk boundary is fine; the bad byte after it is found.
    monkeypatch.setattr(loading, "_CHUNK_BYTES", 4)
    path = tmp_path / "t.csv"
    path.write_bytes(b"abc\xc3\xa9\nde\nf\xa9")
    assert_not_utf8(not_utf8(path), path, 10, 3)


def test_not_utf8_in_a_gzipped_file_counts_decompressed_bytes(tmp_path):
    path = tmp_path / "t.json.gz"
    with gzip.open(path, "wb") as f:
        f.write(b'{"a":\n "' + BAD + b'"}')
    assert_not_utf8(not_utf8(path, gzip.open), path, 8, 2)


@pytest.mark.parametrize("text, key, line, first", [
    ("seed: 1\nname: x\nseed: 2\n", "seed", 3, 1),
    ("engine:\n  max_num_seqs: 8\n  block_size: 16\n  max_num_seqs: 64\n", "max_num_seqs", 4, 2),
    ("traffic:\n  - {kind: message, src: h0, src: h1}\n", "src", 2, 2),
    ("choices: {1: a, 1.0: b}\n", 1.0, 1, 1),
])
def test_a_key_given_twice_is_refused_with_both_lines(text, key, line, first):
    with pytest.raises(ConfigError) as e:
        parse_yaml(text, "c.yaml")
    assert str(e.value) == (f"c.yaml: line {line}: key {key!r} is given twice in the same mapping "
                            f"(first on line {first}); keep one")


def test_equal_keys_in_different_mappings_and_merge_overrides_are_fine():
    assert parse_yaml("a: {x: 1}\nb: {x: 2}\n", "c.yaml") == {"a": {"x": 1}, "b": {"x": 2}}
    merged = parse_yaml("base: &b {x: 1, y: 2}\nother:\n  <<: *b\n  x: 3\n", "c.yaml")
    assert merged["other"] == {"x": 3, "y": 2}


def test_syntax_errors_still_name_the_line():
    with pytest.raises(ConfigError, match=r"^c.yaml: line 2 is not valid YAML"):
        parse_yaml("a: 1\n b: [\n", "c.yaml")


def test_load_json_names_the_file(tmp_path):
    path = tmp_path / "c.json"
    path.write_bytes(b'{"a": "' + BAD + b'"}')
    assert_not_utf8(config_error(load_json, path), path, 7, 1)
    path.write_text("{nope")
    with pytest.raises(ConfigError, match=r"c.json: not valid JSON \(line 1"):
        load_json(path)


# -- every reader ----------------------------------------------------------------------------------


def test_simulate_config(tmp_path):
    path, offset, line = with_bad_byte(DATA / "configs" / "tiny.yaml", tmp_path / "c.yaml",
                                       b"short requests")
    assert_not_utf8(config_error(load_config, path), path, offset, line)


def test_simulate_config_with_a_key_given_twice(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text((DATA / "configs" / "tiny.yaml").read_text() + "seed: 4\n")
    with pytest.raises(ConfigError, match=r"c.yaml: line 13: key 'seed' is given twice .*first "
                                          r"on line 3"):
        load_config(path)


def test_study_its_base_and_its_space_files(tmp_path):
    path, offset, line = with_bad_byte(DATA / "studies" / "tiny.yaml", tmp_path / "s.yaml",
                                       b"short requests")
    assert_not_utf8(config_error(load_study, path), path, offset, line)

    base, offset, line = with_bad_byte(DATA / "configs" / "tiny.yaml", tmp_path / "base.yaml",
                                       b"short requests")
    space = tmp_path / "space.yaml"
    space.write_bytes(b"# caf" + BAD + b"\nparameters:\n  engine.max_num_seqs: {type: int, "
                      b"low: 8, high: 64}\n")
    study = tmp_path / "study.yaml"
    study.write_text("name: s\nbase: base.yaml\nspace: space.yaml\n"
                     "objectives: [{metric: p99_ttft_ms, direction: minimize}]\n")
    assert_not_utf8(config_error(load_study, study), base, offset, line)
    shutil.copy(DATA / "configs" / "tiny.yaml", base)
    assert_not_utf8(config_error(load_study, study), space, 5, 1)
    assert_not_utf8(config_error(load_space, str(space), "study.yaml: space", tmp_path), space,
                    5, 1)


def test_study_with_a_key_given_twice(tmp_path):
    study = tmp_path / "s.yaml"
    study.write_text((DATA / "studies" / "tiny.yaml").read_text().replace(
        "budget: {n_trials: 8}", "budget: {n_trials: 8, n_trials: 80}"))
    with pytest.raises(ConfigError, match=r"s.yaml: line 26: key 'n_trials' is given twice"):
        load_study(study)


def test_fabric_scenario(tmp_path):
    path, offset, line = with_bad_byte(ROOT / "examples" / "fabric" / "incast_pfc.yaml",
                                       tmp_path / "f.yaml", b"receiver's link")
    assert_not_utf8(config_error(load_scenario, path), path, offset, line)


def test_hf_config_json(tmp_path):
    path, offset, line = with_bad_byte(DATA / "tinymodel_config.json", tmp_path / "config.json",
                                       b'"hidden_size"')
    assert_not_utf8(config_error(load_hf_config, path), path, offset, line)


@pytest.mark.parametrize("name, kind, marker", [
    ("custom.jsonl", "custom", b"capital"),
    ("sharegpt.json", "sharegpt", b"haiku"),
    ("sharegpt_lengths_excerpt.csv", "sharegpt", b"290"),
    ("mooncake_excerpt.jsonl", "mooncake", b'"input_length": 7322'),
    ("azure_conv_excerpt.csv", "azure", b"396"),
])
def test_dataset_and_trace_files(tmp_path, name, kind, marker):
    path, offset, line = with_bad_byte(DATA / name, tmp_path / name, marker)
    cfg = WorkloadConfig.model_validate({"dataset": {"kind": kind, "path": name}})
    err = config_error(generate_requests, cfg, block_size=16, seed=0, base_dir=tmp_path,
                       max_model_len=None)
    assert_not_utf8(err, path, offset, line)


def test_conformance_scenario_and_step_log(tmp_path):
    scenario = tmp_path / "s.json.gz"
    with gzip.open(scenario, "wb") as f:
        f.write(b'{"config": {},\n "requests": ["' + BAD + b'"]}')
    assert_not_utf8(config_error(load_conformance_scenario, scenario), scenario, 30, 2)
    log = tmp_path / "steps.jsonl"
    log.write_bytes(b'{"step": 0}\n{"step": "' + BAD + b'"}\n')
    assert_not_utf8(config_error(read_step_log, log), log, 22, 2)


def test_calibration_profile(tmp_path):
    path = tmp_path / "p.json"
    path.write_bytes(b'{"format": "x' + BAD + b'"}')
    assert_not_utf8(config_error(CalibrationProfile.load, path), path, 13, 1)


# -- the commands ----------------------------------------------------------------------------------


def one_error_line(args: list) -> str:
    r = CliRunner().invoke(main, [str(a) for a in args])
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    assert isinstance(r.exception, SystemExit), r.exception
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "Traceback" not in r.output
    return lines[0]


@pytest.mark.parametrize("command, src, marker", [
    ("simulate", DATA / "configs" / "tiny.yaml", b"short requests"),
    ("search", DATA / "studies" / "tiny.yaml", b"short requests"),
    ("fabric", ROOT / "examples" / "fabric" / "incast_pfc.yaml", b"receiver's link"),
])
def test_commands_name_the_file_and_byte(tmp_path, command, src, marker):
    path, offset, line = with_bad_byte(src, tmp_path / "in.yaml", marker)
    msg = one_error_line([command, path])
    assert msg == f"error: {path}: not UTF-8 text (byte {offset}, on line {line}); save it as UTF-8"


@pytest.mark.parametrize("command, src", [
    ("simulate", DATA / "configs" / "tiny.yaml"),
    ("search", DATA / "studies" / "tiny.yaml"),
    ("fabric", ROOT / "examples" / "fabric" / "incast_pfc.yaml"),
])
def test_commands_refuse_a_key_given_twice(tmp_path, command, src):
    path = tmp_path / "in.yaml"
    text = src.read_text()
    path.write_text(text + "name: again\n")
    first = next(i for i, ln in enumerate(text.splitlines(), 1) if ln.startswith("name:"))
    msg = one_error_line([command, path])
    assert msg == (f"error: {path}: line {len(text.splitlines()) + 1}: key 'name' is given twice "
                   f"in the same mapping (first on line {first}); keep one")
