"""Reading Hugging Face config.json files and the `model:` config section."""

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from simcore.errors import ConfigError
from simcore.model.config import ModelConfig
from simcore.model.hf import arch_from_hf_dict, load_hf_config

DATA = Path(__file__).parent / "data"
TINY = DATA / "tinymodel_config.json"


def test_tinymodel_config_parses_with_derived_fields():
    arch = load_hf_config(TINY)
    assert (arch.num_layers, arch.hidden_size, arch.intermediate_size) == (2, 64, 128)
    assert (arch.num_attention_heads, arch.num_kv_heads) == (4, 2)
    assert arch.head_dim == 16  # absent: hidden_size / num_attention_heads
    assert arch.vocab_size == 32000 and arch.max_position_embeddings == 131072
    assert not arch.tie_word_embeddings and not arch.is_moe and not arch.is_mla
    # embed + head + 2 x (attention + MLP + norms) + final norm
    per_layer = 64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 128 + 2 * 64
    assert arch.num_params == 2 * 32000 * 64 + 2 * per_layer + 64


def test_num_kv_heads_defaults_to_heads(tmp_path):
    data = json.loads(TINY.read_text())
    del data["num_key_value_heads"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    assert load_hf_config(tmp_path).num_kv_heads == 4  # a directory finds its config.json


def test_missing_key_names_file_and_key(tmp_path):
    data = json.loads(TINY.read_text())
    del data["hidden_size"]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"bad\.json.*'hidden_size'"):
        load_hf_config(path)


def test_unknown_model_type_is_refused(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**json.loads(TINY.read_text()), "model_type": "gpt_neox"}))
    with pytest.raises(ConfigError, match=r"config\.json.*unsupported model_type 'gpt_neox'"):
        load_hf_config(path)


def test_unreadable_and_invalid_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_hf_config(tmp_path / "nope.json")
    path = tmp_path / "config.json"
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_hf_config(path)


def test_qwen2_has_qkv_bias_and_qwen2_moe_shared_expert():
    base = dict(hidden_size=2048, num_attention_heads=16, num_key_value_heads=16,
                num_hidden_layers=24, intermediate_size=5632, vocab_size=151936,
                max_position_embeddings=8192)
    q2 = arch_from_hf_dict({**base, "model_type": "qwen2"}, "test")
    assert q2.qkv_bias
    moe = arch_from_hf_dict({**base, "model_type": "qwen2_moe", "num_experts": 60,
                             "num_experts_per_tok": 4, "moe_intermediate_size": 1408,
                             "shared_expert_intermediate_size": 5632}, "test")
    assert moe.is_moe and moe.num_shared_experts == 1 and moe.shared_expert_gate
    # Qwen1.5-MoE-A2.7B: 14.3B parameters, 2.7B activated (non-embedding).
    assert moe.num_params == pytest.approx(14.3e9, rel=0.01)


def test_deepseek_v2_lite_without_q_lora():
    lite = arch_from_hf_dict(dict(
        model_type="deepseek_v2", hidden_size=2048, num_attention_heads=16,
        num_key_value_heads=16, num_hidden_layers=27, intermediate_size=10944,
        vocab_size=102400, max_position_embeddings=163840, n_routed_experts=64,
        num_experts_per_tok=6, moe_intermediate_size=1408, n_shared_experts=2,
        first_k_dense_replace=1, moe_layer_freq=1, kv_lora_rank=512, q_lora_rank=None,
        qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128), "test")
    assert lite.is_mla and lite.q_lora_rank == 0
    assert lite.num_params == pytest.approx(15.7e9, rel=0.01)  # published: 15.7B total
    # Published: 2.4B activated, counting the LM head but not the embedding lookup.
    active_without_embedding = lite.num_active_params - lite.embedding_params
    assert active_without_embedding == pytest.approx(2.4e9, rel=0.03)


def test_model_config_needs_exactly_one_source():
    with pytest.raises(ValidationError, match="exactly one"):
        ModelConfig()
    with pytest.raises(ValidationError, match="exactly one"):
        ModelConfig(name="llama-3.1-8b", hf_config="config.json")
    with pytest.raises(ValidationError, match="unknown model"):
        ModelConfig(name="llama-9")
    with pytest.raises(ValidationError):
        ModelConfig(name="llama-3.1-8b", dtype="int3")
    with pytest.raises(ValidationError):
        ModelConfig(name="llama-3.1-8b", bogus=1)


def test_model_config_resolves_relative_paths_against_base_dir():
    cfg = ModelConfig(hf_config="tinymodel_config.json")
    assert cfg.resolve(base_dir=DATA).hidden_size == 64
    assert ModelConfig(hf_config=str(TINY)).resolve(base_dir="/nonexistent").num_layers == 2


def test_model_config_dtypes_and_max_model_len():
    cfg = ModelConfig(name="llama-3.1-8b")
    arch = cfg.resolve()
    assert cfg.resolved_kv_cache_dtype == "bf16"
    assert ModelConfig(name="llama-3.1-8b", dtype="fp8").resolved_kv_cache_dtype == "bf16"
    assert ModelConfig(name="llama-3.1-8b", kv_cache_dtype="fp8").resolved_kv_cache_dtype == "fp8"
    assert cfg.resolved_max_model_len(arch) == 131072
    assert ModelConfig(name="llama-3.1-8b", max_model_len=8192).resolved_max_model_len(arch) == 8192
    with pytest.raises(ConfigError, match="exceeds"):
        ModelConfig(name="llama-3.1-8b", max_model_len=200_000).resolved_max_model_len(arch)


@pytest.mark.parametrize("quantization,dtype", [
    ({"quant_method": "fp8", "weight_block_size": [128, 128]}, "fp8_block"),
    ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "fp8"),
    ({"quant_method": "mxfp4"}, "mxfp4"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128}, "int4"),
    ({"quant_method": "gptq", "bits": 8}, None),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "nvfp4"),
    ({"quant_method": "compressed-tensors", "config_groups": {"group_0": {
        "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}}}, "fp8"),
    ({"quant_method": "compressed-tensors", "config_groups": {"group_0": {
        "weights": {"num_bits": 4, "type": "int", "strategy": "group"}}}}, "int4"),
    ({"quant_method": "bitsandbytes"}, None),
    (None, None),
])
def test_a_configs_quantization_gives_its_checkpoint_dtype(quantization, dtype):
    data = json.loads(TINY.read_text())
    if quantization is not None:
        data["quantization_config"] = quantization
    assert arch_from_hf_dict(data, "test").checkpoint_dtype == dtype


def test_a_quantized_presets_model_runs_in_its_checkpoints_dtype_unless_set():
    """vLLM loads a quantized checkpoint in its quantization: gpt-oss ran as bf16 (twice its
    weights) and DeepSeek-R1 on 8 H200 was refused for memory, wanting "fp8 weights"."""
    assert ModelConfig(name="openai/gpt-oss-120b").dtype == "mxfp4"
    assert ModelConfig(name="deepseek-ai/DeepSeek-R1").dtype == "fp8_block"
    assert ModelConfig(name="meta-llama/Llama-3.1-8B").dtype == "bf16"
    assert ModelConfig(name="deepseek-ai/DeepSeek-V3", dtype="fp8").dtype == "fp8"   # as set
    assert ModelConfig(name="openai/gpt-oss-20b", dtype="bf16").dtype == "bf16"


def test_an_hf_config_of_a_quantized_checkpoint_needs_its_dtype(tmp_path):
    data = json.loads(TINY.read_text())
    data["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"^model\.dtype: .* is a fp8_block checkpoint"):
        ModelConfig(hf_config=str(tmp_path)).resolve()
    assert ModelConfig(hf_config=str(tmp_path), dtype="fp8_block").resolve().num_layers == 2
    assert ModelConfig(hf_config=str(tmp_path), dtype="bf16").resolve().num_layers == 2


def test_zero_heads_and_an_mlp_tp_does_not_divide_are_refused_naming_them(tmp_path):
    from simcore.config import parse_config
    from simcore.setup import build_deployment

    base = {"model_type": "llama", "hidden_size": 1024, "num_attention_heads": 8,
            "num_key_value_heads": 8, "num_hidden_layers": 4, "intermediate_size": 3001,
            "vocab_size": 32000, "max_position_embeddings": 4096}

    def deploy(cfg_json, tp=2):
        path = tmp_path / "config.json"
        path.write_text(json.dumps(cfg_json))
        return build_deployment(parse_config({
            "model": {"hf_config": str(path)}, "hardware": {"gpu": "H100-SXM"},
            "parallelism": {"tensor_parallel_size": tp}, "workload": {"num_prompts": 4}}))

    # vLLM shards the MLP's columns evenly: 3001 over 2 GPUs lost 5,000 weights before.
    with pytest.raises(ConfigError, match="tensor_parallel_size 2 does not divide the "
                                          "intermediate_size 3001"):
        deploy(base)
    deploy({**base, "intermediate_size": 3000})
    # No heads: one error naming the key (a ZeroDivisionError before).
    with pytest.raises(ConfigError, match="'num_attention_heads' must be at least 1, got 0"):
        deploy({**base, "num_attention_heads": 0, "intermediate_size": 3000})


def test_a_yarn_scaled_context_is_served_as_vllm_derives_it(tmp_path):
    from simcore.config import parse_config
    from simcore.setup import build_deployment

    qwen = {"model_type": "qwen3", "hidden_size": 1024, "num_attention_heads": 8,
            "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 4,
            "intermediate_size": 3072, "vocab_size": 32000, "max_position_embeddings": 32768,
            "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                             "original_max_position_embeddings": 32768}}
    # vLLM: original_max_position_embeddings x factor for YaRN (Qwen documents this setup).
    assert arch_from_hf_dict(qwen, source="q").max_position_embeddings == 131072
    path = tmp_path / "config.json"
    path.write_text(json.dumps(qwen))
    dep = build_deployment(parse_config({"model": {"hf_config": str(path),
                                                   "max_model_len": 131072},
                                         "hardware": {"gpu": "H100-SXM"},
                                         "workload": {"num_prompts": 4}}))
    assert dep.max_model_len == 131072
    # Llama 3's rope already counts in max_position_embeddings; without scaling, as written.
    llama3 = {**qwen, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}
    assert arch_from_hf_dict(llama3, source="l").max_position_embeddings == 32768
    assert arch_from_hf_dict({**qwen, "rope_scaling": None},
                             source="n").max_position_embeddings == 32768
    with pytest.raises(ConfigError, match="'num_local_experts' must be at least 1"):
        arch_from_hf_dict({**qwen, "model_type": "mixtral", "num_local_experts": 0,
                           "num_experts_per_tok": 2}, source="m")
