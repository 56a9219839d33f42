"""Config validation at the edge: every kind of bad input is one ConfigError naming the field, file or line."""

import copy
import re
from pathlib import Path

import pytest

from simcore.config import SimConfig, default_batch_limits, load_config, parse_config
from simcore.errors import ConfigError
from simcore.setup import build_deployment
from simcore.simulate import simulate

DATA = Path(__file__).parent / "data"

BASE = {
    "model": {"name": "meta-llama/Llama-3.1-8B"},
    "hardware": {"gpu": "A100-80GB"},
    "workload": {"num_prompts": 10, "dataset": {"kind": "random", "input_len": 64,
                                                "output_len": 8}},
}


def merged(**sections) -> dict:
    """BASE with the given keys of each section replaced (one level deep)."""
    d = copy.deepcopy(BASE)
    for name, values in sections.items():
        if isinstance(values, dict) and isinstance(d.get(name), dict):
            d[name] = {**d[name], **copy.deepcopy(values)}
        else:
            d[name] = copy.deepcopy(values)
    return d


def error_of(data: dict, *, deploy: bool = False, run: bool = False) -> str:
    """The ConfigError message for `data`, raised by parsing, deploying or simulating it."""
    with pytest.raises(ConfigError) as info:
        cfg = parse_config(data)
        if deploy or run:
            build_deployment(cfg)
        if run:
            simulate(cfg)
    msg = str(info.value)
    assert "\n" not in msg, "one sentence, one line"
    return msg


def test_the_base_config_is_valid():
    cfg = parse_config(BASE)
    assert isinstance(cfg, SimConfig)
    dep = build_deployment(cfg)
    assert dep.max_model_len == 131072 and dep.block_size == 16


# -- unknown keys and wrong types ----------------------------------------------------------------


def test_unknown_key_is_named_with_its_path():
    msg = error_of(merged(engine={"max_num_seq": 64}))
    assert msg == ("config: engine.max_num_seq: is not a known setting (check its spelling and "
                   "place in the file)")


@pytest.mark.parametrize("data, field", [
    ({"engin": {}}, "engin"),
    ({"workload": {"num_prompts": 10, "rate": 5}}, "workload.rate"),
    ({"router": {"polcy": "round_robin"}}, "router.polcy"),
    ({"model": {"name": "llama-3.1-8b", "dtyp": "bf16"}}, "model.dtyp"),
])
def test_unknown_keys_anywhere(data, field):
    msg = error_of(merged(**data))
    assert msg.startswith(f"config: {field}: is not a known setting")


@pytest.mark.parametrize("section, values, field, words", [
    ("engine", {"max_num_seqs": "many"}, "engine.max_num_seqs",
     "expected a whole number (got 'many')"),
    ("engine", {"enable_chunked_prefill": "maybe"}, "engine.enable_chunked_prefill",
     "expected true or false (got 'maybe')"),
    ("engine", {"gpu_memory_utilization": 1.5}, "engine.gpu_memory_utilization",
     "must be at most 1 (got 1.5)"),
    ("parallelism", {"tensor_parallel_size": 0}, "parallelism.tensor_parallel_size",
     "must be at least 1 (got 0)"),
    ("router", {"policy": "random"}, "router.policy",
     "expected one of round_robin, least_outstanding, prefix_affinity, cache_aware (got 'random')"),
    ("workload", {"num_prompts": 0}, "workload.num_prompts", "must be at least 1 (got 0)"),
    ("seed", "x", "seed", "expected a whole number (got 'x')"),
])
def test_wrong_types_and_ranges_name_the_field(section, values, field, words):
    msg = error_of(merged(**{section: values}))
    assert msg.startswith(f"config: {field}: ")
    assert words in msg


def test_a_missing_section_is_named():
    data = copy.deepcopy(BASE)
    del data["model"]
    assert error_of(data) == "config: model: is required"


def test_top_level_must_be_a_mapping():
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        parse_config([1, 2])


# -- vLLM's start-up checks --------------------------------------------------------------------


def test_tp_must_divide_attention_heads():
    msg = error_of(merged(parallelism={"tensor_parallel_size": 3}), deploy=True)
    assert msg.startswith("parallelism.tensor_parallel_size: ")
    assert "3 does not divide the 32 attention heads" in msg


def test_tp_beyond_one_node_is_refused():
    msg = error_of(merged(parallelism={"tensor_parallel_size": 16}), deploy=True)
    assert msg.startswith("parallelism.tensor_parallel_size: 16 exceeds the 8 GPUs")


def test_more_pipeline_stages_than_layers():
    msg = error_of(merged(parallelism={"pipeline_parallel_size": 33}), deploy=True)
    assert msg.startswith("parallelism.pipeline_parallel_size: 33 stages exceed the 32 layers")


def test_no_chunked_prefill_needs_a_budget_of_max_model_len():
    msg = error_of(merged(engine={"enable_chunked_prefill": False,
                                  "max_num_batched_tokens": 4096},
                          model={"max_model_len": 8192}), deploy=True)
    assert msg.startswith("engine.max_num_batched_tokens: 4096 is smaller than max_model_len "
                          "(8192)")
    ok = parse_config(merged(engine={"enable_chunked_prefill": False,
                                     "max_num_batched_tokens": 8192},
                             model={"max_model_len": 8192}))
    assert build_deployment(ok).max_num_batched_tokens == 8192


def test_budget_below_max_num_seqs():
    msg = error_of(merged(engine={"max_num_batched_tokens": 100, "max_num_seqs": 200}),
                   deploy=True)
    assert msg == "engine.max_num_batched_tokens: 100 must be at least max_num_seqs (200)"
    # The default max_num_seqs (256 on A100) counts too.
    msg = error_of(merged(engine={"max_num_batched_tokens": 128}), deploy=True)
    assert msg == "engine.max_num_batched_tokens: 128 must be at least max_num_seqs (256)"


def test_unknown_gpu():
    msg = error_of(merged(hardware={"gpu": "H900"}))
    assert msg.startswith("config: hardware")
    assert "unknown GPU 'H900'" in msg and "H100-SXM" in msg


def test_unknown_model_preset():
    msg = error_of(merged(model={"name": "llama-9"}))
    assert msg.startswith("config: model.name: unknown model 'llama-9'")
    assert "meta-llama/Llama-3.1-8B" in msg


def test_model_name_and_hf_config_are_exclusive():
    msg = error_of(merged(model={"name": "llama-3.1-8b",
                                 "hf_config": str(DATA / "tinymodel_config.json")}))
    assert msg.startswith("config: model: give exactly one of model.name")


def test_model_too_big_for_the_gpu():
    msg = error_of(merged(model={"name": "meta-llama/Llama-3.1-70B", "dtype": "bf16"}),
                   deploy=True)
    assert "weights" in msg and "GiB" in msg
    assert re.search(r"need [\d.]+ GiB per GPU but only [\d.]+ GiB is usable", msg)
    assert "tensor_parallel_size" in msg
    # Spread over 4 GPUs it fits.
    build_deployment(parse_config(merged(model={"name": "meta-llama/Llama-3.1-70B"},
                                         parallelism={"tensor_parallel_size": 4})))


@pytest.mark.parametrize("changes, field", [
    # A step's activations (here 95,000 GiB) leave no KV cache: the token budget's fault.
    ({"engine": {"max_num_batched_tokens": 10**9}}, "engine.max_num_batched_tokens"),
    # The sampler's run over 200,000 rows of the vocabulary, larger than a step's forward.
    ({"engine": {"max_num_seqs": 200_000, "max_num_batched_tokens": 200_000}},
     "engine.max_num_seqs"),
    # The weights take most of the little memory allowed, where the default utilisation would
    # leave the KV cache room: the lowered utilisation's fault.
    ({"engine": {"gpu_memory_utilization": 0.2}}, "engine.gpu_memory_utilization"),
    # One request of the model's whole context does not fit.
    ({"hardware": {"gpu": "L40S"}, "engine": {"gpu_memory_utilization": 0.55},
      "model": {"max_model_len": 131072}}, "model.max_model_len"),
])
def test_a_memory_refusal_names_the_setting_responsible(changes, field):
    msg = error_of(merged(**changes), deploy=True)
    assert msg.startswith(f"{field}: ")
    assert "KV cache" in msg


def test_weights_refused_for_a_lowered_utilisation_name_it():
    # 15 GiB of weights in the 7.9 GiB of 0.1 x 80 GiB; the default 0.92 has room for them.
    msg = error_of(merged(engine={"gpu_memory_utilization": 0.1}), deploy=True)
    assert msg.startswith("engine.gpu_memory_utilization: model weights of ")
    assert "raise gpu_memory_utilization (the default 0.92 allows 72.9 GiB)" in msg
    # Past what the default allows, the weights need more GPUs whatever the utilisation.
    msg = error_of(merged(model={"name": "meta-llama/Llama-3.1-70B"},
                          engine={"gpu_memory_utilization": 0.5}), deploy=True)
    assert msg.startswith("parallelism.tensor_parallel_size: model weights of ")
    assert "raise gpu_memory_utilization" not in msg


@pytest.mark.parametrize("section, values, field", [
    ("engine", {"enable_lora": True}, "enable_lora"),
    ("engine", {"kv_transfer_config": {"kv_connector": "LMCacheConnectorV1"}},
     "kv_transfer_config"),
    ("engine", {"cpu_offload_gb": 8}, "cpu_offload_gb"),
])
def test_unmodelled_features_are_refused(section, values, field):
    msg = error_of(merged(**{section: values}))
    assert msg.startswith(f"config: {section}.{field}: ")
    assert "not modelled" in msg


def test_unmodelled_features_left_at_their_defaults_are_fine():
    parse_config(merged(engine={"async_scheduling": False, "enable_lora": False,
                                "speculative_config": None, "kv_transfer_config": None,
                                "cpu_offload_gb": 0},
                        parallelism={"enable_expert_parallel": False}))


@pytest.mark.parametrize("block_size", [0, 12, 24, 256])
def test_bad_block_size(block_size):
    msg = error_of(merged(engine={"block_size": block_size}))
    assert msg == (f"config: engine.block_size: expected one of 1, 8, 16, 32, 64, 128 "
                   f"(got {block_size})")


def test_max_model_len_above_max_positions():
    msg = error_of(merged(model={"max_model_len": 200000}), deploy=True)
    assert msg == ("model.max_model_len 200000 exceeds meta-llama/Llama-3.1-8B's "
                   "max_position_embeddings (131072)")


def test_kv_block_override_too_small_for_one_request():
    msg = error_of(merged(engine={"num_gpu_blocks_override": 10},
                          model={"max_model_len": 1024}), deploy=True)
    assert msg.startswith("engine.num_gpu_blocks_override: 10 blocks of 16 tokens cannot hold "
                          "one max_model_len (1024) request")


def test_bad_percentile_and_goodput_metric():
    assert "percentiles: 0.0 is not in (0, 100]" in error_of(merged(metrics={"percentiles": [0]}))
    msg = error_of(merged(metrics={"goodput": {"itl": 5}}))
    assert msg.startswith("config: metrics.goodput")


# -- files ----------------------------------------------------------------------------------------


def test_bad_yaml_syntax_names_the_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("model:\n  name: llama-3.1-8b\n   dtype: bf16\nhardware: {gpu: A100-80GB}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == f"{path}: line 3 is not valid YAML (mapping values are not allowed here)"


def test_unclosed_flow_mapping_names_a_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("model:\n  name: llama-3.1-8b\nhardware: {gpu: A100-80GB\nworkload:\n"
                    "  num_prompts: 3\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: line \d+ is not valid YAML"):
        load_config(path)


def test_missing_config_file(tmp_path):
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == f"{path}: no such file"


def test_empty_config_file(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("")
    with pytest.raises(ConfigError, match="empty.yaml: the top level must be a mapping"):
        load_config(path)


def test_errors_from_a_file_name_the_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model: {name: llama-3.1-8b}\nhardware: {gpu: A100-80GB}\n"
                    "engine: {max_num_seq: 4}\nworkload: {num_prompts: 2}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: engine.max_num_seq: is not a known setting")


def test_relative_paths_resolve_against_the_config_directory(tmp_path):
    (tmp_path / "sub").mkdir()
    path = tmp_path / "sub" / "c.yaml"
    path.write_text("model: {name: llama-3.1-8b}\nhardware: {gpu: A100-80GB}\n"
                    "workload:\n  dataset: {kind: mooncake, path: trace.jsonl}\n")
    cfg = load_config(path)
    assert Path(cfg.base_dir) == path.parent.resolve()
    with pytest.raises(ConfigError) as info:
        simulate(cfg)
    msg = str(info.value)
    assert msg == (f"{path.parent.resolve() / 'trace.jsonl'}: no such file "
                   f"(workload.dataset.path: 'trace.jsonl')")


@pytest.mark.parametrize("dataset", [
    {"kind": "mooncake", "path": "missing.jsonl"},
    {"kind": "azure", "path": "missing.csv"},
    {"kind": "sharegpt", "path": "missing.json"},
    {"kind": "custom", "path": "missing.jsonl"},
])
def test_missing_workload_files(dataset, tmp_path):
    data = merged(workload={"dataset": dataset})
    data["workload"].pop("num_prompts")
    with pytest.raises(ConfigError) as info:
        simulate(parse_config(data, base_dir=tmp_path))
    msg = str(info.value)
    assert msg.startswith(f"{tmp_path / dataset['path']}: no such file")
    assert "workload.dataset.path" in msg


@pytest.mark.parametrize("workload, words", [
    ({"num_prompts": 10, "dataset": {"kind": "bogus"}}, "workload.dataset"),
    ({"num_prompts": 10, "ramp_up_start_rps": 1}, "need a ramp_up_strategy"),
    ({"num_prompts": 3, "dataset": {"kind": "prefix_repetition", "num_prefixes": 5}},
     "num_prompts (3) must be at least dataset.num_prefixes (5)"),
    ({"dataset": {"kind": "mooncake", "path": "x.jsonl"}, "request_rate": 5},
     "set dataset.use_timestamps: false"),
    ({"dataset": {"kind": "random", "input_len": 0}}, "input_len is too small"),
])
def test_workload_settings(workload, words):
    msg = error_of(merged(workload=workload))
    assert msg.startswith("config: workload")
    assert words in msg


# -- GPU-dependent defaults ----------------------------------------------------------------------


@pytest.mark.parametrize("gpu, seqs, tokens", [
    ("H100-SXM", 1024, 8192),
    ("H200", 1024, 8192),
    ("A100-80GB", 256, 2048),       # vLLM excludes A100s from the large defaults
    ("A100-40GB", 256, 2048),
    ("L40S", 256, 2048),             # under 70 GiB
])
def test_batch_limit_defaults_follow_vllm_serve(gpu, seqs, tokens):
    dep = build_deployment(parse_config(merged(hardware={"gpu": gpu})))
    assert (dep.max_num_seqs, dep.max_num_batched_tokens) == (seqs, tokens)


def test_explicit_batch_limits_win_over_defaults():
    dep = build_deployment(parse_config(merged(hardware={"gpu": "H100-SXM"},
                                               engine={"max_num_seqs": 64,
                                                       "max_num_batched_tokens": 512})))
    assert (dep.max_num_seqs, dep.max_num_batched_tokens) == (64, 512)


def test_without_chunked_prefill_the_default_budget_covers_max_model_len():
    dep = build_deployment(parse_config(merged(engine={"enable_chunked_prefill": False},
                                               model={"max_model_len": 16384})))
    assert (dep.max_num_seqs, dep.max_num_batched_tokens) == (256, 16384)
    assert default_batch_limits(80 * 2**30, "H100-SXM", False, 4096) == (1024, 8192)
    assert default_batch_limits(80 * 2**30, "A100-80GB", True, 4096) == (256, 2048)
    assert default_batch_limits(69 * 2**30, "H100-SXM", True, 4096) == (256, 2048)


EXAMPLES = Path(__file__).parent.parent / "examples"


@pytest.mark.parametrize("path", sorted([*EXAMPLES.glob("*.yaml"),
                                         *(EXAMPLES / "cluster").glob("*.yaml")]),
                         ids=lambda p: p.name)
def test_a_config_written_out_whole_reads_back(path):
    # Every field, defaults included, as a tool writing a resolved config out would: the checks
    # of settings with no effect compare with the defaults, so this reads back the same.
    cfg = load_config(path)
    again = parse_config(cfg.model_dump(mode="json", exclude={"base_dir"}), base_dir=path.parent)
    assert again == cfg
