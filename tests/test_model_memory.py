"""KV-cache block counts by vLLM's memory formula, and the errors when a model does not fit."""

from pathlib import Path

import pytest

from simcore.errors import ConfigError
from simcore.hardware import get_gpu
from simcore.model.hf import load_hf_config
from simcore.model.memory import kv_cache_num_blocks
from simcore.model.presets import load_preset
from simcore.units import GIB

TINY = Path(__file__).parent / "data" / "tinymodel_config.json"


def test_num_blocks_hand_computed_for_the_tiny_model():
    arch = load_hf_config(TINY)  # 2 layers, hidden 64, 4 heads (2 KV) of 16, MLP 128, vocab 32000
    mem = kv_cache_num_blocks(
        arch, 1 * GIB, weight_dtype="bf16", kv_cache_dtype="bf16", gpu_memory_utilization=0.5,
        max_num_batched_tokens=256, max_num_seqs=4, cuda_graph_bytes=0, non_torch_bytes=0,
        sampler_bytes_per_logit=16)
    weights = 2 * (2 * 32000 * 64 + 2 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128 + 2 * 64) + 64)
    sampler = 4 * 32000 * 16 + 256 * 64 * 2      # exceeds the forward pass peak
    forward = 256 * 2 * (2 * 64 + 3 * 128)
    assert sampler > forward
    per_block = 16 * 2 * (2 * 2 * 16) * 2        # block x layers x (K,V x heads x dim) x bytes
    assert mem.weight_bytes == weights
    assert mem.activation_peak_bytes == sampler
    assert mem.bytes_per_block == per_block
    assert mem.num_blocks == (GIB // 2 - weights - sampler) // per_block
    assert mem.num_tokens == mem.num_blocks * 16
    total = (mem.weight_bytes + mem.activation_peak_bytes + mem.cuda_graph_bytes
             + mem.non_torch_bytes + mem.kv_cache_bytes)
    assert total == pytest.approx(mem.requested_bytes)


def test_llama_8b_on_h100_has_a_realistic_kv_cache():
    mem = kv_cache_num_blocks(load_preset("llama-3.1-8b"), get_gpu("H100-SXM").memory_bytes)
    assert 14.5 * GIB < mem.weight_bytes < 15.5 * GIB
    # vLLM reports roughly 52-56 GiB of KV cache (~440k tokens) here.
    assert 50 * GIB < mem.kv_cache_bytes < 60 * GIB
    assert 400_000 < mem.num_tokens < 500_000


def test_tp_and_fp8_kv_give_more_blocks():
    arch = load_preset("llama-3.1-70b")
    h100 = get_gpu("H100-SXM").memory_bytes
    tp4 = kv_cache_num_blocks(arch, h100, tp=4)
    tp8 = kv_cache_num_blocks(arch, h100, tp=8)
    fp8 = kv_cache_num_blocks(arch, h100, tp=4, kv_cache_dtype="fp8")
    assert tp8.num_blocks > tp4.num_blocks
    assert fp8.num_blocks == pytest.approx(2 * tp4.num_blocks, abs=1)


def test_pipeline_parallel_takes_the_tightest_stage():
    arch = load_preset("llama-3.1-405b")
    mem = kv_cache_num_blocks(arch, get_gpu("H100-SXM").memory_bytes, tp=8, pp=2)
    assert mem.bytes_per_block == 16 * 63 * 2 * 1 * 128 * 2
    assert mem.pp_stage in (0, 1)


def test_mla_blocks_hold_the_latent():
    arch = load_preset("deepseek-v3")
    mem = kv_cache_num_blocks(arch, get_gpu("H200").memory_bytes, weight_dtype="fp8", tp=8)
    assert mem.bytes_per_block == 16 * 61 * 576 * 2
    assert mem.num_blocks > 10_000


def test_weights_that_do_not_fit_raise_with_the_numbers():
    arch = load_preset("llama-3.1-70b")
    with pytest.raises(ConfigError, match=r"need 131\.\d GiB per GPU but only 72\.\d GiB.*"
                                          r"increase tensor_parallel_size"):
        kv_cache_num_blocks(arch, get_gpu("H100-SXM").memory_bytes, tp=1)


def test_no_room_left_for_kv_and_max_model_len_too_long():
    arch = load_preset("llama-3.1-8b")
    with pytest.raises(ConfigError, match="no memory left for the KV cache"):
        kv_cache_num_blocks(arch, get_gpu("H100-SXM").memory_bytes, gpu_memory_utilization=0.2)
    with pytest.raises(ConfigError, match="max_model_len 131072"):
        kv_cache_num_blocks(arch, get_gpu("L40S").memory_bytes, gpu_memory_utilization=0.55,
                            max_num_seqs=256, max_model_len=131072)


def test_bad_arguments():
    arch = load_hf_config(TINY)
    with pytest.raises(ConfigError, match="gpu_memory_utilization"):
        kv_cache_num_blocks(arch, GIB, gpu_memory_utilization=1.5)
    with pytest.raises(ConfigError, match="unknown dtype"):
        kv_cache_num_blocks(arch, GIB, kv_cache_dtype="fp6")
