"""Workload configuration: defaults, variants and vLLM's validation rules."""

import math

import pytest
from pydantic import ValidationError

from simcore.workload.config import (MooncakeDataset, PrefixRepetitionDataset, RandomDataset,
                                     ShareGPTDataset, WorkloadConfig)


def test_defaults_are_vllm_bench_serve_defaults():
    cfg = WorkloadConfig()
    assert cfg.request_rate == math.inf
    assert cfg.burstiness == 1.0
    assert cfg.resolved_num_prompts == 1000
    assert isinstance(cfg.dataset, RandomDataset)
    assert (cfg.dataset.input_len, cfg.dataset.output_len) == (1024, 128)


def test_dataset_variant_is_chosen_by_kind():
    cfg = WorkloadConfig.model_validate(
        {"dataset": {"kind": "prefix_repetition", "num_prefixes": 4}, "num_prompts": 8})
    assert isinstance(cfg.dataset, PrefixRepetitionDataset)
    cfg = WorkloadConfig.model_validate({"dataset": {"kind": "sharegpt", "path": "x.json"}})
    assert isinstance(cfg.dataset, ShareGPTDataset)
    assert cfg.dataset.length_filter.max_total_len == 2048


def test_timed_trace_without_cap_sends_the_whole_window():
    cfg = WorkloadConfig.model_validate({"dataset": {"kind": "mooncake", "path": "t.jsonl"}})
    assert isinstance(cfg.dataset, MooncakeDataset)
    assert cfg.resolved_num_prompts is None


def test_config_is_frozen_and_strict():
    cfg = WorkloadConfig()
    with pytest.raises(ValidationError):
        cfg.request_rate = 3.0
    with pytest.raises(ValidationError, match="extra"):
        WorkloadConfig.model_validate({"request_rte": 3.0})
    with pytest.raises(ValidationError):
        WorkloadConfig.model_validate({"dataset": {"kind": "burstgpt"}})


def test_every_field_is_described():
    from simcore.workload import config
    for name in dir(config):
        model = getattr(config, name)
        if isinstance(model, type) and hasattr(model, "model_fields"):
            for field_name, info in model.model_fields.items():
                assert info.description, f"{name}.{field_name} has no description"


@pytest.mark.parametrize("fields, message", [
    ({"ramp_up_strategy": "linear", "ramp_up_start_rps": 1, "ramp_up_end_rps": 5,
      "request_rate": 3.0}, "request_rate"),
    ({"ramp_up_strategy": "linear", "ramp_up_start_rps": 1}, "both"),
    ({"ramp_up_strategy": "linear", "ramp_up_start_rps": 6, "ramp_up_end_rps": 5}, "exceed"),
    ({"ramp_up_strategy": "exponential", "ramp_up_start_rps": 0, "ramp_up_end_rps": 5}, "positive"),
    ({"ramp_up_strategy": "linear", "ramp_up_start_rps": -1, "ramp_up_end_rps": 5}, "positive"),
    ({"ramp_up_start_rps": 1, "ramp_up_end_rps": 5}, "need a ramp_up_strategy"),
])
def test_ramp_up_is_validated_as_vllm_does(fields, message):
    with pytest.raises(ValidationError, match=message):
        WorkloadConfig.model_validate(fields)


def test_valid_ramp_up():
    cfg = WorkloadConfig.model_validate(
        {"ramp_up_strategy": "exponential", "ramp_up_start_rps": 1, "ramp_up_end_rps": 20})
    assert cfg.ramp_up_end_rps == 20


@pytest.mark.parametrize("fields", [
    {"request_rate": 0},
    {"burstiness": 0},
    {"num_prompts": 0},
    {"max_concurrency": 0},
    {"dataset": {"kind": "random", "range_ratio": 1.0}},
    {"dataset": {"kind": "random", "input_len": 0}},
    {"dataset": {"kind": "prefix_repetition", "num_prefixes": 20}, "num_prompts": 10},
    {"dataset": {"kind": "mooncake", "path": "t.jsonl"}, "request_rate": 5},
    {"dataset": {"kind": "azure", "path": "t.csv", "time_scale": 0}},
])
def test_invalid_settings_are_rejected(fields):
    with pytest.raises(ValidationError):
        WorkloadConfig.model_validate(fields)


def test_timed_trace_may_use_rate_based_arrivals_instead():
    cfg = WorkloadConfig.model_validate(
        {"dataset": {"kind": "azure", "path": "t.csv", "use_timestamps": False}, "request_rate": 5})
    assert cfg.request_rate == 5


YAML_EXAMPLES = """
random:
  num_prompts: 1000
  request_rate: 8.0
  burstiness: 1.0
  max_concurrency: 64
  dataset: {kind: random, input_len: 1024, output_len: 128, range_ratio: 0.1, prefix_len: 256}
prefix_repetition:
  num_prompts: 400
  ramp_up_strategy: linear
  ramp_up_start_rps: 1
  ramp_up_end_rps: 20
  dataset: {kind: prefix_repetition, prefix_len: 2048, suffix_len: 256, num_prefixes: 8,
            output_len: 200}
sharegpt:
  num_prompts: 500
  request_rate: 4
  dataset:
    kind: sharegpt
    path: traces/ShareGPT_V3_unfiltered_cleaned_split.json
    text_estimate: {method: words, tokens_per_word: 1.3}
    length_filter: {min_len: 4, max_prompt_len: 1024, max_total_len: 2048}
sharegpt_lengths:
  request_rate: 4
  dataset: {kind: sharegpt, path: traces/sharegpt_8k_lengths.csv, length_filter: null}
custom:
  num_prompts: 200
  request_rate: 2
  dataset: {kind: custom, path: prompts.jsonl, output_len: 256}
mooncake:
  dataset: {kind: mooncake, path: traces/mooncake_conversation.jsonl, time_scale: 0.5,
            start_s: 600, duration_s: 300}
azure:
  num_prompts: 2000
  request_rate: 10
  burstiness: 0.5
  dataset: {kind: azure, path: traces/azure_llm_2023_conv.csv, use_timestamps: false}
"""


def test_yaml_examples_validate():
    import yaml
    examples = yaml.safe_load(YAML_EXAMPLES)
    for name, block in examples.items():
        cfg = WorkloadConfig.model_validate(block)
        assert cfg.dataset.kind == name.split("_lengths")[0]
