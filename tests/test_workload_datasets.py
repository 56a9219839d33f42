"""Each dataset kind: lengths, content keys, timing, determinism (on the excerpts in tests/data)."""

import csv
import json
import math
from collections import Counter
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest

from simcore.workload import WorkloadConfig, generate_requests, generate_workload
from simcore.reference_data import CONFORMANCE_DIR, SHAREGPT_FIRST_TURN, SHAREGPT_FIRST_TURNS
from simcore.workload.config import LengthFilter
from simcore.workload.sampled import passes_length_filter, read_lengths_csv
from simcore.workload.keys import NAMESPACE_SHIFT, ROW, SHARED_PREFIX, USER

DATA = Path(__file__).parent / "data"
MOONCAKE = DATA / "mooncake_excerpt.jsonl"
AZURE = DATA / "azure_conv_excerpt.csv"
SHAREGPT_CSV = DATA / "sharegpt_lengths_excerpt.csv"


def generate(fields, *, block_size=16, seed=0, max_model_len=None):
    cfg = WorkloadConfig.model_validate(fields)
    return generate_requests(cfg, block_size=block_size, seed=seed, base_dir=DATA,
                             max_model_len=max_model_len)


def namespace(key):
    return key >> NAMESPACE_SHIFT


def mooncake_lines():
    with MOONCAKE.open() as f:
        return [json.loads(line) for line in f]


# --- random -----------------------------------------------------------------------------------

def test_random_lengths_stay_within_vllm_ranges_and_reach_both_ends():
    reqs = generate({"num_prompts": 4000, "dataset": {"kind": "random", "input_len": 100,
                                                       "output_len": 15, "range_ratio": 0.25}})
    prompt = np.array([r.prompt_len for r in reqs])
    output = np.array([r.output_len for r in reqs])
    assert (prompt.min(), prompt.max()) == (75, 125)
    assert (output.min(), output.max()) == (math.floor(15 * 0.75), math.ceil(15 * 1.25))


def test_random_without_range_ratio_has_exact_lengths():
    reqs = generate({"num_prompts": 20, "dataset": {"kind": "random", "input_len": 300,
                                                     "output_len": 7}})
    assert {(r.prompt_len, r.output_len) for r in reqs} == {(300, 7)}
    assert all(r.block_keys == () for r in reqs)


def test_random_prefix_full_blocks_are_shared_by_every_request():
    reqs = generate({"num_prompts": 50, "dataset": {"kind": "random", "input_len": 64,
                                                     "prefix_len": 100, "range_ratio": 0.5}})
    keys = {r.block_keys for r in reqs}
    assert len(keys) == 1
    (prefix,) = keys
    assert len(prefix) == 100 // 16
    assert all(namespace(k) == SHARED_PREFIX for k in prefix)
    assert all(100 + 32 <= r.prompt_len <= 100 + 96 for r in reqs)


def test_random_output_length_is_at_least_one():
    reqs = generate({"num_prompts": 500, "dataset": {"kind": "random", "output_len": 1,
                                                      "range_ratio": 0.9}})
    assert min(r.output_len for r in reqs) == 1


# --- prefix_repetition ------------------------------------------------------------------------

def test_prefix_repetition_spreads_requests_evenly_over_prefixes():
    reqs = generate({"num_prompts": 23, "dataset": {
        "kind": "prefix_repetition", "prefix_len": 64, "suffix_len": 40, "num_prefixes": 5,
        "output_len": 9}})
    assert len(reqs) == 20  # vLLM sends num_prompts // num_prefixes per prefix
    assert {(r.prompt_len, r.output_len) for r in reqs} == {(104, 9)}
    counts = Counter(r.block_keys for r in reqs)
    assert sorted(counts.values()) == [4] * 5
    all_keys = [k for keys in counts for k in keys]
    assert len(all_keys) == len(set(all_keys)) == 5 * 4
    assert all(namespace(k) == SHARED_PREFIX for k in all_keys)


def test_prefix_repetition_is_shuffled_unless_asked_not_to():
    base = {"num_prompts": 40, "dataset": {"kind": "prefix_repetition", "num_prefixes": 4}}
    shuffled = [r.block_keys for r in generate(base)]
    base["dataset"]["shuffle"] = False
    ordered = [r.block_keys for r in generate(base)]
    assert shuffled != ordered
    assert ordered == sorted(ordered, key=ordered.index)  # prefix by prefix
    assert Counter(shuffled) == Counter(ordered)


# --- sharegpt ---------------------------------------------------------------------------------

def test_sharegpt_json_first_turns_with_word_estimate():
    reqs = generate({"num_prompts": 3, "dataset": {"kind": "sharegpt", "path": "sharegpt.json",
                                                    "shuffle": False}})
    # c1 has one turn (skipped); c2's prompt "Hi" is 2 tokens < min_len 4 (filtered).
    # Words x 1.3, rounded up: c0 15 -> 20 / 15 -> 20, c3 13 -> 17 / 12 -> 16, c4 8 -> 11 / 10 -> 13.
    assert [(r.prompt_len, r.output_len) for r in reqs] == [(20, 20), (17, 16), (11, 13)]
    assert [r.request_id for r in reqs] == ["r0", "r1", "r2"]
    assert [len(r.block_keys) for r in reqs] == [1, 1, 0]
    assert all(namespace(k) == ROW for r in reqs for k in r.block_keys)


def test_sharegpt_json_char_estimate():
    reqs = generate({"num_prompts": 1, "dataset": {
        "kind": "sharegpt", "path": "sharegpt.json", "shuffle": False,
        "text_estimate": {"method": "chars", "chars_per_token": 4}}})
    prompt = "Write a haiku about the sea and the wind that moves over it at night"
    assert reqs[0].prompt_len == math.ceil(len(prompt) / 4)


def test_sharegpt_oversamples_with_identical_content():
    reqs = generate({"num_prompts": 12, "dataset": {"kind": "sharegpt", "path": "sharegpt.json",
                                                     "output_len": 5}})
    assert len(reqs) == 12
    assert len({r.request_id for r in reqs}) == 12
    assert {r.output_len for r in reqs} == {5}
    # with output_len overriding, c2 ("Hi", 2 tokens) still fails min_len on its prompt
    assert {r.prompt_len for r in reqs} <= {20, 17, 11}
    by_len = {}
    for r in reqs:
        assert by_len.setdefault(r.prompt_len, r.block_keys) == r.block_keys


def test_sharegpt_lengths_csv_rows_in_file_order():
    with SHAREGPT_CSV.open() as f:
        rows = [(int(r["num_prefill_tokens"]), int(r["num_decode_tokens"]))
                for r in csv.DictReader(f)]
    reqs = generate({"num_prompts": 300, "dataset": {"kind": "sharegpt", "path": SHAREGPT_CSV.name,
                                                      "shuffle": False, "length_filter": None}})
    assert [(r.prompt_len, r.output_len) for r in reqs] == rows
    assert len(reqs[0].block_keys) == rows[0][0] // 16


def test_sharegpt_lengths_csv_applies_vllm_filter():
    reqs = generate({"num_prompts": 50, "dataset": {"kind": "sharegpt",
                                                     "path": SHAREGPT_CSV.name}})
    assert len(reqs) == 50
    assert all(4 <= r.prompt_len <= 1024 and r.output_len >= 4 and
               r.prompt_len + r.output_len <= 2048 for r in reqs)


# --- sharegpt without a path: the shipped first-turn lengths ---------------------------------

SHIPPED_README = SHAREGPT_FIRST_TURN.parent / "README.md"
SHIPPED_ROWS, SHIPPED_VALID = 17_400, 15_822
SHIPPED_MEANS = {"prompt": 221.1, "output": 198.9}
"""The row counts and the valid rows' mean lengths as simcore/data/datasets/README.md states them."""


def test_the_shipped_first_turn_lengths_match_their_readme():
    text = SHIPPED_README.read_text(encoding="utf-8")
    for figure in ("17,400", "15,822", "221.1", "198.9"):
        assert figure in text
    prompts, outputs = read_lengths_csv(SHAREGPT_FIRST_TURN)
    assert len(prompts) == len(outputs) == SHIPPED_ROWS
    valid = passes_length_filter(LengthFilter(), prompts, outputs)
    assert int(valid.sum()) == SHIPPED_VALID
    assert prompts[valid].mean() == pytest.approx(SHIPPED_MEANS["prompt"], rel=0.01)
    assert outputs[valid].mean() == pytest.approx(SHIPPED_MEANS["output"], rel=0.01)
    # unfiltered: the rows vLLM drops are in the file, for the workload's filter to drop
    assert prompts.max() > 1024 and outputs.min() < 4


def test_the_shipped_lengths_are_package_data():
    import tomllib
    from fnmatch import fnmatch

    root = Path(__file__).resolve().parents[1]
    globs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]["simcore"]
    for shipped in (*SHAREGPT_FIRST_TURNS.values(), SHIPPED_README):
        rel = shipped.relative_to(root / "simcore").as_posix()
        assert any(fnmatch(rel, g) for g in globs), rel


def test_the_shipped_mistral_counts_are_the_same_conversations_in_more_tokens():
    """Mistral's 32k vocabulary splits the same texts into more tokens than Llama-3's 128k, row
    by row for almost every conversation; the README's figures are the file's."""
    text = SHIPPED_README.read_text(encoding="utf-8")
    for figure in ("15,500", "244.0", "229.0"):
        assert figure in text
    lp, lo = read_lengths_csv(SHAREGPT_FIRST_TURN)
    mp, mo = read_lengths_csv(SHAREGPT_FIRST_TURNS["mistral_v1"])
    assert len(mp) == len(mo) == SHIPPED_ROWS
    valid = passes_length_filter(LengthFilter(), mp, mo)
    assert int(valid.sum()) == 15_500
    assert mp[valid].mean() == pytest.approx(244.0, abs=0.05)
    assert mo[valid].mean() == pytest.approx(229.0, abs=0.05)
    assert (mo >= lo).mean() > 0.95 and (mp >= lp).mean() > 0.9
    assert np.corrcoef(lo, mo)[0, 1] > 0.95


def test_sharegpt_tokenizer_chooses_the_shipped_counts(tmp_path):
    def lengths(tokenizer):
        ds = {"kind": "sharegpt", **({"tokenizer": tokenizer} if tokenizer else {})}
        cfg = WorkloadConfig.model_validate({"num_prompts": 300, "dataset": ds})
        reqs = generate_requests(cfg, block_size=16, seed=0, base_dir=tmp_path,
                                 max_model_len=None)
        return [(r.prompt_len, r.output_len) for r in reqs]

    mp, mo = read_lengths_csv(SHAREGPT_FIRST_TURNS["mistral_v1"])
    mistral = lengths("mistral_v1")
    assert set(mistral) <= set(zip(mp.tolist(), mo.tolist()))
    assert lengths(None) == lengths("llama3") != mistral
    with pytest.raises(ValueError, match="tokenizer"):
        WorkloadConfig.model_validate({"dataset": {"kind": "sharegpt", "path": "x.csv",
                                                   "tokenizer": "mistral_v1"}})
    with pytest.raises(ValueError):
        WorkloadConfig.model_validate({"dataset": {"kind": "sharegpt", "tokenizer": "gpt2"}})


@pytest.mark.parametrize("tokenizer,valid,prompt_mean,output_mean", [
    ("qwen3", 15_460, 219.6, 202.9), ("o200k", 15_472, 217.6, 199.8),
    ("deepseek_v3", 15_809, 224.2, 200.8)])
def test_the_shipped_bpe_counts_are_the_same_conversations(tokenizer, valid, prompt_mean,
                                                           output_mean):
    """Qwen3's, gpt-oss's and DeepSeek-V3's counts of the same conversations, row by row close
    to Llama-3's (BPEs of 128k-200k tokens); the README's figures are the files'."""
    text = SHIPPED_README.read_text(encoding="utf-8")
    for figure in (f"{valid:,}", f"{prompt_mean}", f"{output_mean}"):
        assert figure in text
    lp, lo = read_lengths_csv(SHAREGPT_FIRST_TURN)
    p, o = read_lengths_csv(SHAREGPT_FIRST_TURNS[tokenizer])
    assert len(p) == len(o) == SHIPPED_ROWS
    ok = passes_length_filter(LengthFilter(), p, o)
    assert int(ok.sum()) == valid
    assert p[ok].mean() == pytest.approx(prompt_mean, abs=0.05)
    assert o[ok].mean() == pytest.approx(output_mean, abs=0.05)
    assert np.corrcoef(lo, o)[0, 1] > 0.98 and np.corrcoef(lp, p)[0, 1] > 0.98


def test_a_models_sharegpt_load_takes_its_own_tokenizers_counts():
    """Without `tokenizer`, a preset whose tokenizer's counts ship sends them; others send
    Llama-3's; `tokenizer` overrides; the run's assumptions say which."""
    from simcore.config import parse_config
    from simcore.workload.generate import config_requests, config_sharegpt_tokenizer

    def cfg(model, **ds):
        return parse_config({"name": "s", "model": {"name": model}, "hardware": {"gpu": "H200"},
                             "workload": {"num_prompts": 50,
                                          "dataset": {"kind": "sharegpt", **ds}}})

    for model, tok in (("Qwen/Qwen3-8B", "qwen3"), ("openai/gpt-oss-20b", "o200k"),
                       ("deepseek-ai/DeepSeek-R1-0528", "deepseek_v3"),
                       ("mistralai/Mixtral-8x7B-Instruct-v0.1", "mistral_v1"),
                       ("meta-llama/Llama-3.1-8B", "llama3"), ("zai-org/GLM-4.6", "llama3")):
        c = cfg(model)
        assert config_sharegpt_tokenizer(c) == tok, model
        p, o = read_lengths_csv(SHAREGPT_FIRST_TURNS[tok])
        assert {(s.prompt_len, s.output_len) for s in config_requests(c)} <= set(
            zip(p.tolist(), o.tolist())), model
    assert config_sharegpt_tokenizer(cfg("Qwen/Qwen3-8B", tokenizer="llama3")) == "llama3"


@pytest.mark.parametrize("dataset", [{"kind": "sharegpt"}, {"kind": "sharegpt", "path": None}])
def test_sharegpt_without_a_path_sends_the_shipped_first_turns(dataset, tmp_path):
    cfg = WorkloadConfig.model_validate({"num_prompts": 1000, "dataset": dataset})
    reqs = generate_requests(cfg, block_size=16, seed=0, base_dir=tmp_path, max_model_len=None)
    prompts, outputs = read_lengths_csv(SHAREGPT_FIRST_TURN)
    rows = set(zip(prompts.tolist(), outputs.tolist()))
    assert len(reqs) == 1000
    assert all((r.prompt_len, r.output_len) in rows for r in reqs)
    assert all(4 <= r.prompt_len <= 1024 and r.output_len >= 4 and
               r.prompt_len + r.output_len <= 2048 for r in reqs)
    # 1,000 of 15,822 rows: the sample means are within a few standard errors (7 tokens)
    assert np.mean([r.prompt_len for r in reqs]) == pytest.approx(SHIPPED_MEANS["prompt"], rel=0.1)
    assert np.mean([r.output_len for r in reqs]) == pytest.approx(SHIPPED_MEANS["output"], rel=0.1)


def test_sharegpt_without_a_path_keeps_the_filter_setting():
    reqs = generate({"num_prompts": 2000, "dataset": {"kind": "sharegpt", "length_filter": None}})
    assert max(r.prompt_len for r in reqs) > 1024


def test_sharegpt_without_a_path_simulates(tmp_path):
    from simcore.config import parse_config
    from simcore.simulate import simulate

    cfg = parse_config({"name": "sharegpt-default", "seed": 0,
                        "model": {"name": "meta-llama/Llama-3.1-8B"},
                        "hardware": {"gpu": "A100-80GB"},
                        "workload": {"num_prompts": 40, "request_rate": 10,
                                     "dataset": {"kind": "sharegpt"}},
                        "host": {"model": "constant"}}, base_dir=tmp_path)
    result = simulate(cfg)
    assert result["completed"] == 40 and result["failed"] == 0
    assert 4 * 40 <= result["total_input_tokens"] <= 1024 * 40


# --- custom -----------------------------------------------------------------------------------

def test_custom_lines_lengths_and_keys():
    reqs = generate({"num_prompts": 4, "dataset": {"kind": "custom", "path": "custom.jsonl",
                                                    "shuffle": False}})
    assert [(r.prompt_len, r.output_len) for r in reqs] == [(40, 8), (70, 5), (16, 12), (600, 3)]
    assert [namespace(k) for k in reqs[0].block_keys] == [ROW, ROW]
    user = USER << NAMESPACE_SHIFT
    assert reqs[1].block_keys == (user | 7, user | 8, user | 9, user | 10)
    assert len(reqs[2].block_keys) == 1
    # hash ids [4, 5] of 512 tokens at block size 16: 4*32 + 0..31, then 5*32 + 0..4 (600 // 16 = 37)
    assert reqs[3].block_keys == tuple(range(128, 160)) + tuple(range(160, 165))


def test_custom_output_len_override():
    reqs = generate({"num_prompts": 4, "dataset": {"kind": "custom", "path": "custom.jsonl",
                                                    "output_len": 33}})
    assert {r.output_len for r in reqs} == {33}


def test_custom_priorities_go_with_their_lines_also_when_oversampled(tmp_path):
    (tmp_path / "p.jsonl").write_text('{"prompt_len": 20, "output_len": 2, "priority": -3}\n'
                                      '{"prompt_len": 30, "output_len": 2}\n'
                                      '{"prompt_len": 40, "output_len": 2, "priority": "7"}\n')
    cfg = WorkloadConfig.model_validate({"num_prompts": 9, "dataset": {"kind": "custom",
                                                                        "path": "p.jsonl"}})
    reqs = generate_requests(cfg, block_size=16, seed=0, base_dir=tmp_path, max_model_len=None)
    assert len(reqs) == 9
    assert {(r.prompt_len, r.priority) for r in reqs} == {(20, -3), (30, 0), (40, 7)}


# --- mooncake ---------------------------------------------------------------------------------

def test_mooncake_first_line_keys_by_hand():
    line = mooncake_lines()[0]
    assert line["hash_ids"] == list(range(14)) and line["input_length"] == 6758
    reqs = generate({"dataset": {"kind": "mooncake", "path": MOONCAKE.name}})
    first = next(r for r in reqs if r.request_id == "m0")
    # hash ids 0..13, 32 keys of 16 tokens each: keys 0..447, truncated to 6758 // 16 = 422
    assert first.block_keys == tuple(range(422))
    assert (first.prompt_len, first.output_len, first.arrival_s) == (6758, 500, 0.0)


def test_mooncake_shared_prefix_and_block_size():
    reqs = {r.request_id: r for r in generate(
        {"dataset": {"kind": "mooncake", "path": MOONCAKE.name}}, block_size=64)}
    second = reqs["m1"]  # hash_ids [0, 14, 15, ...], input_length 7322
    assert len(second.block_keys) == 7322 // 64
    assert second.block_keys[:8] == reqs["m0"].block_keys[:8] == tuple(range(8))
    assert second.block_keys[8:16] == tuple(range(14 * 8, 15 * 8))


def test_mooncake_uses_trace_times_sorted():
    lines = mooncake_lines()
    reqs = generate({"dataset": {"kind": "mooncake", "path": MOONCAKE.name}})
    assert len(reqs) == len(lines)
    assert [r.arrival_s for r in reqs] == sorted(line["timestamp"] / 1000 for line in lines)
    by_id = {r.request_id: r for r in reqs}
    for i, line in enumerate(lines):
        assert by_id[f"m{i}"].prompt_len == line["input_length"]
        assert by_id[f"m{i}"].output_len == max(1, line["output_length"])


def test_mooncake_time_scale_window_and_cap():
    lines = mooncake_lines()
    reqs = generate({"dataset": {"kind": "mooncake", "path": MOONCAKE.name, "time_scale": 0.5,
                                 "start_s": 10, "duration_s": 30}})
    expected = [(t - 10) * 0.5 for t in (line["timestamp"] / 1000 for line in lines)
                if 10 <= t < 40]
    assert [r.arrival_s for r in reqs] == pytest.approx(expected)
    assert reqs[0].arrival_s >= 0
    capped = generate({"num_prompts": 7, "dataset": {"kind": "mooncake", "path": MOONCAKE.name}})
    assert [r.request_id for r in capped] == [f"m{i}" for i in range(7)]


def test_mooncake_rate_based_arrivals_instead_of_timestamps():
    reqs = generate({"request_rate": 4.0, "num_prompts": 100,
                     "dataset": {"kind": "mooncake", "path": MOONCAKE.name,
                                 "use_timestamps": False}})
    assert len(reqs) == 100
    assert reqs[-1].arrival_s == pytest.approx(100 / 4.0)
    assert [r.request_id for r in reqs] == [f"m{i}" for i in range(100)]


def test_requests_over_max_model_len_are_set_apart():
    lines = mooncake_lines()
    too_long = sum(1 for line in lines if line["input_length"] + line["output_length"] > 8192)
    cfg = WorkloadConfig.model_validate({"dataset": {"kind": "mooncake", "path": MOONCAKE.name}})
    w = generate_workload(cfg, block_size=16, seed=0, base_dir=DATA, max_model_len=8192)
    assert too_long > 0
    assert w.num_refused == too_long
    assert len(w.requests) + w.num_refused == len(lines)
    assert all(r.prompt_len + r.output_len <= 8192 for r in w.requests)
    assert generate({"dataset": {"kind": "mooncake", "path": MOONCAKE.name}},
                    max_model_len=8192) == list(w.requests)


# --- azure ------------------------------------------------------------------------------------

def test_azure_times_relative_to_first_request():
    with AZURE.open(newline="") as f:
        rows = list(csv.DictReader(f))
    t0 = datetime.fromisoformat(rows[0]["TIMESTAMP"])
    reqs = generate({"dataset": {"kind": "azure", "path": AZURE.name}})
    assert len(reqs) == 200
    assert reqs[0].arrival_s == 0.0
    assert reqs[1].arrival_s == pytest.approx(4.314579)
    by_id = {r.request_id: r for r in reqs}
    for i, row in enumerate(rows):
        r = by_id[f"a{i}"]
        assert r.prompt_len == int(row["ContextTokens"])
        assert r.output_len == int(row["GeneratedTokens"])
        assert r.arrival_s == pytest.approx(
            (datetime.fromisoformat(row["TIMESTAMP"]) - t0).total_seconds())
        assert r.block_keys == ()


def test_azure_window():
    reqs = generate({"dataset": {"kind": "azure", "path": AZURE.name, "start_s": 5,
                                 "duration_s": 10}})
    assert reqs and all(0 <= r.arrival_s < 10 for r in reqs)


# --- all kinds --------------------------------------------------------------------------------

ALL_KINDS = [
    {"request_rate": 5.0, "burstiness": 0.5, "dataset": {"kind": "random", "range_ratio": 0.3,
                                                          "prefix_len": 40}},
    {"request_rate": 5.0, "dataset": {"kind": "prefix_repetition"}},
    {"request_rate": 5.0, "dataset": {"kind": "sharegpt", "path": SHAREGPT_CSV.name}},
    {"request_rate": 5.0, "dataset": {"kind": "sharegpt"}},
    {"request_rate": 5.0, "num_prompts": 10, "dataset": {"kind": "custom", "path": "custom.jsonl"}},
    {"dataset": {"kind": "mooncake", "path": MOONCAKE.name}},
    {"dataset": {"kind": "azure", "path": AZURE.name}},
]


@pytest.mark.parametrize("fields", ALL_KINDS, ids=lambda f: f["dataset"]["kind"])
def test_deterministic_sorted_and_well_formed(fields):
    a = generate(fields, seed=11)
    assert a == generate(fields, seed=11)
    times = [r.arrival_s for r in a]
    assert times == sorted(times)
    assert len({r.request_id for r in a}) == len(a)
    assert all(r.prompt_len >= 1 and r.output_len >= 1 for r in a)
    assert all(len(r.block_keys) <= r.prompt_len // 16 for r in a)


@pytest.mark.parametrize("fields", ALL_KINDS[:5], ids=lambda f: f["dataset"]["kind"])
def test_different_seed_different_workload(fields):
    assert generate(fields, seed=1) != generate(fields, seed=2)


def test_rate_change_leaves_the_prompts_unchanged():
    base = {"num_prompts": 100, "dataset": {"kind": "random", "range_ratio": 0.5}}
    slow = generate({**base, "request_rate": 1.0})
    fast = generate({**base, "request_rate": 100.0})
    assert [(r.prompt_len, r.output_len) for r in slow] == [(r.prompt_len, r.output_len)
                                                              for r in fast]
    assert [r.arrival_s for r in slow] == pytest.approx([100 * r.arrival_s for r in fast])


def test_mooncake_keys_match_the_vllm_conformance_scenario():
    import gzip
    with gzip.open(CONFORMANCE_DIR / "scenarios" / "mooncake_head.json.gz", "rt") as f:
        scenario = json.load(f)
    block_size = scenario["config"]["block_size"]
    ours = {r.request_id: r for r in generate({"dataset": {"kind": "mooncake", "path": MOONCAKE.name}},
                                              block_size=block_size,
                                              max_model_len=scenario["config"]["max_model_len"])}
    compared = 0
    for req in scenario["requests"]:
        if req["id"] in ours:
            r = ours[req["id"]]
            assert (r.prompt_len, r.output_len, list(r.block_keys)) == (
                req["prompt_len"], req["output_len"], req["block_keys"])
            compared += 1
    assert compared == len(ours) == 200


@pytest.mark.parametrize("seed", [0, 11])
@pytest.mark.parametrize("num_prompts", [5, 40, 70])
def test_rows_are_chosen_in_vllms_own_order(seed, num_prompts):
    """vLLM's sharegpt and custom datasets: random.seed(seed); random.shuffle(rows); the first
    num_prompts valid ones; if fewer, random.seed(seed); random.choices(...) for the rest."""
    import random

    import numpy as np

    from simcore.workload.sampled import vllm_order

    valid = np.array([i % 3 != 0 for i in range(50)])       # 33 valid rows of 50
    rows = list(range(50))
    random.seed(seed)
    random.shuffle(rows)
    want = [r for r in rows if valid[r]][:num_prompts]
    if len(want) < num_prompts:
        random.seed(seed)
        want += random.choices(want, k=num_prompts - len(want))
    assert vllm_order(valid, num_prompts, shuffle=True, seed=seed).tolist() == want
    assert vllm_order(valid, 5, shuffle=False, seed=seed).tolist() == [1, 2, 4, 5, 7]
