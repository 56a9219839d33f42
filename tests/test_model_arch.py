"""Model architectures: parameter counts against published sizes, weight and KV bytes."""

import pytest

from simcore.errors import ConfigError
from simcore.model.arch import pp_stage_layers
from simcore.model.presets import is_preset, load_preset, preset_names

# (preset, published total parameters, published active parameters per token)
PUBLISHED = [
    ("meta-llama/Llama-3.1-8B", 8.03e9, 8.03e9),
    ("meta-llama/Llama-3.1-70B", 70.6e9, 70.6e9),
    ("meta-llama/Llama-3.1-405B", 405.9e9, 405.9e9),
    ("Qwen/Qwen3-8B", 8.2e9, 8.2e9),
    ("Qwen/Qwen3-14B", 14.8e9, 14.8e9),
    ("Qwen/Qwen3-32B", 32.8e9, 32.8e9),
    ("mistralai/Mixtral-8x7B-v0.1", 46.7e9, 12.9e9),
    ("Qwen/Qwen3-30B-A3B", 30.5e9, 3.3e9),
    ("Qwen/Qwen3-235B-A22B", 235e9, 22e9),
    ("deepseek-ai/DeepSeek-V3", 671e9, 37e9),
]


# Z.ai's model cards: "106B total parameters and 12B active parameters", "355B total / 32B
# active"; the active counts leave out the embedding and the LM head, the totals the MTP layer.
PUBLISHED_WITHOUT_EMBEDDINGS = [
    ("zai-org/GLM-4.5-Air", 106e9, 12e9),
    ("zai-org/GLM-4.6", 355e9, 32e9),
]


@pytest.mark.parametrize("name,total,active", PUBLISHED + PUBLISHED_WITHOUT_EMBEDDINGS)
def test_parameter_counts_match_published_sizes(name, total, active):
    arch = load_preset(name)
    assert arch.num_params == pytest.approx(total, rel=0.01)
    if (name, total, active) in PUBLISHED_WITHOUT_EMBEDDINGS:
        active += arch.embedding_params + arch.lm_head_params
    assert arch.num_active_params == pytest.approx(active, rel=0.02)


CHECKED_ELSEWHERE = {"openai/gpt-oss-120b", "openai/gpt-oss-20b"}
"""Presets whose published active counts leave out the embedding: tests/test_gpt_oss.py."""


def test_glm_presets_have_dense_first_layers_and_shared_experts():
    for name, _, _ in PUBLISHED_WITHOUT_EMBEDDINGS:
        arch = load_preset(name)
        assert arch.num_moe_layers() == arch.num_layers - arch.first_k_dense_layers
        assert arch.qkv_bias and arch.router_bias and arch.num_shared_experts == 1


def test_every_preset_is_covered_by_the_published_table():
    assert set(preset_names()) == ({name for name, _, _ in PUBLISHED} | CHECKED_ELSEWHERE
                                   | {name for name, _, _ in PUBLISHED_WITHOUT_EMBEDDINGS})


def test_preset_names_are_case_insensitive_with_or_without_org():
    full = load_preset("meta-llama/Llama-3.1-8B")
    assert load_preset("llama-3.1-8b") == full
    assert load_preset("META-LLAMA/LLAMA-3.1-8B") == full
    assert load_preset("Llama-3.1-8B-Instruct").num_params == full.num_params
    assert is_preset("deepseek-v3") and not is_preset("gpt-5")


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(ConfigError, match="known presets: .*Llama-3.1-8B"):
        load_preset("llama-9")


def test_kinds_of_model():
    assert not load_preset("llama-3.1-8b").is_moe
    assert load_preset("mixtral-8x7b-v0.1").is_moe
    ds = load_preset("deepseek-v3")
    assert ds.is_mla and ds.is_moe
    assert ds.num_moe_layers() == 58 and not ds.is_moe_layer(2) and ds.is_moe_layer(3)


def test_llama_8b_weights_and_fp8_keeps_embeddings_in_bf16():
    arch = load_preset("llama-3.1-8b")
    assert arch.weight_bytes("bf16") == pytest.approx(2 * arch.num_params)
    embed_and_head = 2 * arch.vocab_size * arch.hidden_size
    # fp8: linear layers at 1 byte, embeddings/LM head/norms at 2 bytes.
    assert arch.weight_bytes("fp8") == pytest.approx(arch.num_params + embed_and_head, rel=1e-3)


def test_weights_per_gpu_shard_over_tp_and_pp():
    arch = load_preset("llama-3.1-70b")
    whole = arch.weight_bytes("bf16")
    assert arch.weight_bytes_per_gpu("bf16", tp=8) == pytest.approx(whole / 8, rel=0.01)
    # PP: the embedding and LM head end up on different stages.
    per_gpu = arch.weight_bytes_per_gpu("bf16", tp=4, pp=2)
    assert whole / 8 < per_gpu < whole / 8 * 1.05


def test_expert_parallel_splits_experts_whole():
    arch = load_preset("qwen3-235b-a22b")
    tp_sharded = arch.weight_bytes_per_gpu("bf16", tp=8)
    ep_split = arch.weight_bytes_per_gpu("bf16", tp=8, ep=8)
    assert ep_split == pytest.approx(tp_sharded, rel=0.01)


def test_kv_bytes_per_token_standard_attention():
    arch = load_preset("llama-3.1-8b")
    assert arch.kv_bytes_per_token("bf16") == 128 * 1024  # 32 layers x 2 x 8 heads x 128 x 2 B
    assert arch.kv_bytes_per_token("fp8") == 64 * 1024
    assert arch.kv_bytes_per_token("bf16", tp=2) == 64 * 1024
    # tp > kv heads: each rank keeps one (replicated) KV head.
    assert arch.kv_bytes_per_token("bf16", tp=8) == 16 * 1024
    assert arch.kv_bytes_per_token("bf16", tp=16) == 16 * 1024
    assert arch.model_kv_bytes_per_token("bf16") == 128 * 1024
    assert arch.kv_bytes_per_token("bf16", num_layers=16) == 64 * 1024


def test_kv_bytes_per_token_mla_is_not_split_by_tp():
    arch = load_preset("deepseek-v3")
    expected = (512 + 64) * 61 * 2
    assert arch.kv_bytes_per_token("bf16") == expected
    assert arch.kv_bytes_per_token("bf16", tp=8) == expected
    assert arch.model_kv_bytes_per_token("bf16") == expected


def test_tp_must_divide_heads():
    arch = load_preset("llama-3.1-8b")
    with pytest.raises(ConfigError, match="does not divide"):
        arch.weight_bytes_per_gpu("bf16", tp=3)


def test_pp_stage_layers_follow_vllm():
    assert pp_stage_layers(32, 1) == (32,)
    assert pp_stage_layers(32, 4) == (8, 8, 8, 8)
    assert pp_stage_layers(61, 4) == (15, 15, 16, 15)  # remainder before the last stage
    assert pp_stage_layers(126, 4) == (31, 32, 32, 31)
    with pytest.raises(ConfigError):
        pp_stage_layers(4, 5)


def test_gemm_shapes_per_gpu():
    arch = load_preset("llama-3.1-8b")
    shapes = {g.name: (g.in_features, g.out_features) for g in arch.attention_gemms(tp=2)}
    assert shapes["q_proj"] == (4096, 2048)
    assert shapes["k_proj"] == (4096, 512)
    assert shapes["o_proj"] == (2048, 4096)
    mlp = {g.name: (g.in_features, g.out_features) for g in arch.mlp_gemms(0, tp=2)}
    assert mlp == {"gate_up_proj": (4096, 14336), "down_proj": (7168, 4096)}
    mixtral = load_preset("mixtral-8x7b-v0.1")
    experts = [g for g in mixtral.mlp_gemms(0, tp=2) if g.group == "expert"]
    assert {g.count for g in experts} == {8}
