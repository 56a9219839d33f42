"""Bad data files and settings: one ConfigError naming the file and line (or the field), never a traceback."""

import json
import re

import pytest

from simcore.errors import ConfigError
from simcore.workload import WorkloadConfig, generate_requests

GOOD_MOONCAKE = {"timestamp": 0, "input_length": 100, "output_length": 5, "hash_ids": [0]}


def run(tmp_path, dataset, *, block_size=16, seed=0, **fields):
    cfg = WorkloadConfig.model_validate({"dataset": dataset, **fields})
    return generate_requests(cfg, block_size=block_size, seed=seed, base_dir=tmp_path,
                             max_model_len=None)


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path.name


def mooncake_file(tmp_path, bad_line):
    good = json.dumps(GOOD_MOONCAKE)
    return write_lines(tmp_path / "trace.jsonl", [good, good, bad_line, good])


@pytest.mark.parametrize("kind, name", [("mooncake", "none.jsonl"), ("azure", "none.csv"),
                                        ("sharegpt", "none.json"), ("custom", "none.jsonl")])
def test_missing_file_names_the_path(tmp_path, kind, name):
    with pytest.raises(ConfigError, match=f"{name}: no such file"):
        run(tmp_path, {"kind": kind, "path": name})


@pytest.mark.parametrize("path, problem", [("", "is a folder, not a file"),
                                           ("sub", "is a folder, not a file"),
                                           ("none.csv", "no such file")])
def test_a_bad_sharegpt_path_is_still_named_when_the_path_is_optional(tmp_path, path, problem):
    (tmp_path / "sub").mkdir()
    with pytest.raises(ConfigError, match=problem + r" \(workload\.dataset\.path: "):
        run(tmp_path, {"kind": "sharegpt", "path": path})


@pytest.mark.parametrize("bad_line, message", [
    ('{"timestamp": 0, "input_length": 100,', "line 3: invalid JSON"),
    ('[1, 2, 3]', "line 3: expected a JSON object"),
    ('{"timestamp": 0, "output_length": 5}', "line 3: missing 'input_length'"),
    ('{"input_length": 10, "output_length": 5}', "line 3: missing 'timestamp'"),
    ('{"timestamp": 0, "input_length": 100, "output_length": -5}',
     "line 3: output_length must be at least 0"),
    ('{"timestamp": 0, "input_length": 0, "output_length": 5}', "line 3: input_length must be at least 1"),
    ('{"timestamp": 0, "input_length": "many", "output_length": 5}',
     "line 3: input_length must be a whole number"),
    ('{"timestamp": 0, "input_length": 10.5, "output_length": 5}',
     "line 3: input_length must be a whole number"),
    ('{"timestamp": -4, "input_length": 10, "output_length": 5}', "line 3: timestamp must be"),
    ('{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": 3}',
     "line 3: hash_ids must be a list"),
    ('{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1, -2]}',
     "line 3: hash_ids values must be at least 0"),
])
def test_mooncake_bad_line_is_named(tmp_path, bad_line, message):
    name = mooncake_file(tmp_path, bad_line)
    with pytest.raises(ConfigError, match=f"trace.jsonl: {message}"):
        run(tmp_path, {"kind": "mooncake", "path": name})


def test_mooncake_block_size_must_divide_hash_block(tmp_path):
    name = mooncake_file(tmp_path, json.dumps(GOOD_MOONCAKE))
    with pytest.raises(ConfigError, match="block_size 48"):
        run(tmp_path, {"kind": "mooncake", "path": name}, block_size=48)


@pytest.mark.parametrize("rows, message", [
    (["TIMESTAMP,ContextTokens", "2023-11-16 18:15:46.68,3"], "line 1: missing column.*GeneratedTokens"),
    (["TIMESTAMP,ContextTokens,GeneratedTokens", "2023-11-16 18:15:46.68,3,4", "yesterday,3,4"],
     "line 3: TIMESTAMP must be a date-time"),
    (["TIMESTAMP,ContextTokens,GeneratedTokens", "2023-11-16 18:15:46.68,3,4",
      "2023-11-16 18:15:47.68,-3,4"], "line 3: ContextTokens must be at least 1"),
    (["TIMESTAMP,ContextTokens,GeneratedTokens", "2023-11-16 18:15:46.68,3"],
     "line 2: missing 'GeneratedTokens'"),
    ([], "empty file"),
])
def test_azure_bad_input_is_named(tmp_path, rows, message):
    name = write_lines(tmp_path / "azure.csv", rows)
    with pytest.raises(ConfigError, match=f"azure.csv: {message}"):
        run(tmp_path, {"kind": "azure", "path": name})


def test_sharegpt_csv_missing_column_and_negative_length(tmp_path):
    name = write_lines(tmp_path / "lengths.csv", ["num_prefill_tokens,other", "5,6"])
    with pytest.raises(ConfigError, match="lengths.csv: line 1: missing column.*num_decode_tokens"):
        run(tmp_path, {"kind": "sharegpt", "path": name})
    name = write_lines(tmp_path / "lengths.csv",
                       ["num_prefill_tokens,num_decode_tokens", "5,6", "7,8", "9,-1"])
    with pytest.raises(ConfigError, match="lengths.csv: line 4: num_decode_tokens must be at least 0"):
        run(tmp_path, {"kind": "sharegpt", "path": name})


@pytest.mark.parametrize("text, message", [
    ('[{"conversations": []},\n {"conversations": [}', "line 2: invalid JSON"),
    ('{"conversations": []}', "expected a JSON list"),
    ('[{"conversations": [{"value": "hi"}, {"from": "gpt"}]}]',
     r"entry 0: conversations\[1\] has no string 'value'"),
    ('[3]', "entry 0: expected an object"),
    ('[{"conversations": [{"value": "hi"}, {"value": "yo"}]}]', "no conversation passes"),
])
def test_sharegpt_json_bad_input_is_named(tmp_path, text, message):
    (tmp_path / "sg.json").write_text(text)
    with pytest.raises(ConfigError, match=f"sg.json: {message}"):
        run(tmp_path, {"kind": "sharegpt", "path": "sg.json"})


def test_sharegpt_unknown_suffix(tmp_path):
    (tmp_path / "sg.txt").write_text("x")
    with pytest.raises(ConfigError, match="sg.txt: a sharegpt dataset is a .json"):
        run(tmp_path, {"kind": "sharegpt", "path": "sg.txt"})


@pytest.mark.parametrize("bad_line, message", [
    ('{"output_len": 5}', "line 2: needs 'prompt_len' \\(tokens\\) or 'prompt' \\(text\\)"),
    ('{"prompt_len": 5}', "line 2: missing 'output_len'"),
    ('{"prompt": 5, "output_len": 5}', "line 2: 'prompt' must be a string"),
    ('{"prompt_len": 50, "output_len": 5, "block_keys": [1], "hash_ids": [1]}',
     "line 2: give 'block_keys' or 'hash_ids', not both"),
    ('{"prompt_len": 50, "output_len": 5, "block_keys": ["a"]}',
     "line 2: block_keys must be a whole number"),
    ('{"prompt_len": -50, "output_len": 5}', "line 2: prompt_len must be at least 1"),
    ('{"prompt_len": true, "output_len": 5}', "line 2: prompt_len must be a whole number"),
    ('{"prompt_len": 5, "output_len": 5, "priority": "high"}',
     "line 2: priority must be a whole number, got 'high'"),
    ('{"prompt_len": 5, "output_len": 5, "priority": 1.5}',
     "line 2: priority must be a whole number, got 1.5"),
    ('{"prompt_len": 5, "output_len": 5, "priority": true}',
     "line 2: priority must be a whole number, got True"),
    ('{"prompt_len": 5, "output_len": 5, "priority": 9223372036854775808}',
     r"line 2: priority must lie in \[-2\^63, 2\^63\)"),
])
def test_custom_bad_line_is_named(tmp_path, bad_line, message):
    name = write_lines(tmp_path / "c.jsonl", ['{"prompt_len": 5, "output_len": 1}', bad_line])
    with pytest.raises(ConfigError, match=f"c.jsonl: {message}"):
        run(tmp_path, {"kind": "custom", "path": name}, num_prompts=2)


def test_custom_empty_file(tmp_path):
    name = write_lines(tmp_path / "c.jsonl", ["", "  "])
    with pytest.raises(ConfigError, match="c.jsonl: no requests"):
        run(tmp_path, {"kind": "custom", "path": name})


def test_directory_instead_of_file(tmp_path):
    (tmp_path / "d.jsonl").mkdir()
    with pytest.raises(ConfigError, match="d.jsonl: is a folder, not a file"):
        run(tmp_path, {"kind": "mooncake", "path": "d.jsonl"})


def test_not_utf8(tmp_path):
    (tmp_path / "t.jsonl").write_bytes(b'{"timestamp": 0}\n\xff\xfe\n')
    with pytest.raises(ConfigError, match="t.jsonl: not UTF-8"):
        run(tmp_path, {"kind": "mooncake", "path": "t.jsonl"})


def test_bad_seed_and_block_size(tmp_path):
    with pytest.raises(ConfigError, match="seed"):
        run(tmp_path, {"kind": "random"}, seed=-1)
    with pytest.raises(ConfigError, match="block_size"):
        run(tmp_path, {"kind": "random"}, block_size=0)


@pytest.mark.parametrize("line, message", [
    ('{"prompt_len": 100, "output_len": 10000000000000000000}',
     "line 2: output_len must be at most 2,147,483,647, got 1e+19"),
    ('{"prompt_len": 1e300, "output_len": 10}',
     "line 2: prompt_len must be at most 2,147,483,647, got 1e+300"),
    ('{"prompt_len": 100, "output_len": 10, "priority": -1e300}',
     "line 2: priority must be at least -9,223,372,036,854,775,808, got -1e+300"),
    ('{"prompt_len": 100, "prompt_len": 200, "output_len": 10}',
     "line 2: the key 'prompt_len' is given twice in one object"),
    ('{"prompt_len": 2000000000, "output_len": 10}',
     "line 2: a prompt of 2,000,000,000 tokens is too long to key"),
])
def test_custom_numbers_too_large_and_repeated_keys_are_named(tmp_path, line, message):
    # These used to end in an OverflowError, be read as the key's last value, or name no line.
    name = write_lines(tmp_path / "c.jsonl", ['{"prompt_len": 5, "output_len": 1}', line])
    with pytest.raises(ConfigError, match=re.escape(f"c.jsonl: {message}")):
        run(tmp_path, {"kind": "custom", "path": name}, num_prompts=2)


def test_trace_times_and_lengths_out_of_range_are_named(tmp_path):
    name = mooncake_file(tmp_path, '{"timestamp": 1e300, "input_length": 10, "output_length": 5}')
    with pytest.raises(ConfigError, match=re.escape("line 3: timestamp must be at most 1e+12 "
                                                    "(1e+09 s), got 1e+300")):
        run(tmp_path, {"kind": "mooncake", "path": name})
    name = mooncake_file(tmp_path, '{"timestamp": 0, "input_length": 1e300, "output_length": 5}')
    with pytest.raises(ConfigError, match="line 3: input_length must be at most 2,147,483,647"):
        run(tmp_path, {"kind": "mooncake", "path": name})
    name = write_lines(tmp_path / "azure.csv", ["TIMESTAMP,ContextTokens,GeneratedTokens",
                                                "2023-11-16 18:15:46.68,1e300,4"])
    with pytest.raises(ConfigError, match="line 2: ContextTokens must be at most"):
        run(tmp_path, {"kind": "azure", "path": name})


def test_repeated_csv_columns_extra_fields_and_a_byte_order_mark(tmp_path):
    name = write_lines(tmp_path / "azure.csv", ["TIMESTAMP,ContextTokens,GeneratedTokens,"
                                                "ContextTokens", "2023-11-16 18:15:46.68,3,4,5"])
    with pytest.raises(ConfigError, match="azure.csv: line 1: the header names ContextTokens "
                                          "more than once"):
        run(tmp_path, {"kind": "azure", "path": name})
    name = write_lines(tmp_path / "azure.csv", ["TIMESTAMP,ContextTokens,GeneratedTokens",
                                                "2023-11-16 18:15:46.68,3,4",
                                                "2023-11-16 18:15:47.68,3,4,9"])
    with pytest.raises(ConfigError, match="azure.csv: line 3: 4 fields, the header has 3"):
        run(tmp_path, {"kind": "azure", "path": name})
    # A byte-order mark (as some editors write) is passed over, in CSV and in JSONL alike.
    (tmp_path / "bom.csv").write_text("\ufeffTIMESTAMP,ContextTokens,GeneratedTokens\n"
                                      "2023-11-16 18:15:46.68,3,4\n", encoding="utf-8")
    assert len(run(tmp_path, {"kind": "azure", "path": "bom.csv"})) == 1
    (tmp_path / "bom.jsonl").write_text("\ufeff" + json.dumps(GOOD_MOONCAKE) + "\n",
                                        encoding="utf-8")
    assert len(run(tmp_path, {"kind": "mooncake", "path": "bom.jsonl"})) == 1


def test_a_trace_with_no_request_in_its_window_says_where_its_requests_lie(tmp_path):
    name = write_lines(tmp_path / "t.jsonl", [
        json.dumps({**GOOD_MOONCAKE, "timestamp": 1000}),
        json.dumps({**GOOD_MOONCAKE, "timestamp": 3000})])
    with pytest.raises(ConfigError, match=re.escape(
            "t.jsonl: no request of the trace falls in the replayed window, 10 s to its end "
            "(workload.dataset.start_s, duration_s); its requests lie from 1 to 3 s")):
        run(tmp_path, {"kind": "mooncake", "path": name, "start_s": 10})
    write_lines(tmp_path / "empty.jsonl", [])
    with pytest.raises(ConfigError, match="empty.jsonl: no requests in the file"):
        run(tmp_path, {"kind": "mooncake", "path": "empty.jsonl"})
    write_lines(tmp_path / "a.csv", ["TIMESTAMP,ContextTokens,GeneratedTokens"])
    with pytest.raises(ConfigError, match=r"a.csv: no requests in the file \(a header and no "
                                          r"rows\)"):
        run(tmp_path, {"kind": "azure", "path": "a.csv"})


def test_dataset_settings_the_data_leaves_with_no_effect_are_refused(tmp_path):
    name = write_lines(tmp_path / "c.jsonl", ['{"prompt_len": 50, "output_len": 5}'])
    with pytest.raises(ConfigError, match="c.jsonl: workload.dataset.hash_block_tokens has no "
                                          "effect: no line gives 'hash_ids'"):
        run(tmp_path, {"kind": "custom", "path": name, "hash_block_tokens": 64})
    with pytest.raises(ConfigError, match="c.jsonl: workload.dataset.text_estimate has no "
                                          r"effect: no line gives its prompt as text"):
        run(tmp_path, {"kind": "custom", "path": name, "text_estimate": {"method": "chars"}})
    # Given where a line reads them, they are taken.
    write_lines(tmp_path / "t.jsonl", ['{"prompt": "a b c", "output_len": 5}',
                                       '{"prompt_len": 64, "output_len": 5, "hash_ids": [1]}'])
    run(tmp_path, {"kind": "custom", "path": "t.jsonl", "hash_block_tokens": 64,
                   "text_estimate": {"method": "chars"}})
    trace = write_lines(tmp_path / "m.jsonl", ['{"timestamp": 0, "input_length": 100, '
                                               '"output_length": 5}'])
    with pytest.raises(ConfigError, match="m.jsonl: workload.dataset.hash_block_tokens has no "
                                          "effect: no request replayed gives 'hash_ids'"):
        run(tmp_path, {"kind": "mooncake", "path": trace, "hash_block_tokens": 64})
    for path in (None, "lengths.csv"):
        with pytest.raises(ValueError, match="text_estimate estimates the token counts of a "
                                              "ShareGPT JSON file's text and has no effect"):
            run(tmp_path, {"kind": "sharegpt", "path": path, "text_estimate": {"method": "chars"}})


@pytest.mark.parametrize("field", ["time_scale", "start_s", "duration_s"])
def test_trace_window_settings_must_be_finite(tmp_path, field):
    with pytest.raises(ValueError, match="finite number|greater than 0"):
        WorkloadConfig.model_validate({"dataset": {"kind": "mooncake", "path": "t.jsonl",
                                                   field: float("nan")}})


def test_more_hash_ids_than_the_prompt_has_blocks_are_refused(tmp_path):
    name = mooncake_file(tmp_path, '{"timestamp": 0, "input_length": 100, "output_length": 5, '
                                   '"hash_ids": [1, 2]}')
    with pytest.raises(ConfigError, match=re.escape(
            "trace.jsonl: line 3: hash_ids gives 2 ids for a prompt of 100 tokens, which has 1 "
            "block(s) of 512")):
        run(tmp_path, {"kind": "mooncake", "path": name})
    name = write_lines(tmp_path / "c.jsonl", ['{"prompt_len": 64, "output_len": 5, '
                                              '"hash_ids": [1, 2, 3]}'])
    with pytest.raises(ConfigError, match="c.jsonl: line 1: hash_ids gives 3 ids for a prompt "
                                          "of 64 tokens, which has 2 block"):
        run(tmp_path, {"kind": "custom", "path": name, "hash_block_tokens": 32})
