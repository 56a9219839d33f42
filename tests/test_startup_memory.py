"""The KV-cache memory estimate against vLLM's own start-up logs
(`simcore/data/measurements/vllm_startup_memory.csv`): the sampler's bytes per logit and the
non-torch memory were read off the rows marked fit; the rows marked check were not used."""

from __future__ import annotations

import csv

import pytest

from simcore.config import default_batch_limits
from simcore.errors import ConfigError
from simcore.hardware import get_gpu
from simcore.model.arch import MXFP4_MOE_LAYOUTS
from simcore.model.memory import (SAMPLER_BYTES_PER_LOGIT, activation_peak_bytes,
                                  kv_cache_num_blocks, non_torch_bytes)
from simcore.model.presets import load_preset
from simcore.reference_data import DATA_DIR
from simcore.units import GIB

LOGS = DATA_DIR / "measurements" / "vllm_startup_memory.csv"


def _rows() -> list[dict]:
    with open(LOGS, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _estimate(row: dict):
    """The simulator's memory breakdown for a logged start-up (vLLM 0.10-0.11: CUDA graphs are
    captured after the KV cache), or the ConfigError it raises."""
    arch = load_preset(row["model"])
    gpu = get_gpu(row["gpu"])
    seqs, tokens = default_batch_limits(gpu.memory_bytes, gpu.name, True,
                                        int(row["max_model_len"]))
    seqs = int(row["max_num_seqs"] or seqs)
    tokens = int(row["max_num_batched_tokens"] or tokens)
    tp = int(row["tp"])
    return kv_cache_num_blocks(
        arch, gpu.memory_bytes, weight_dtype=row["weight_dtype"], tp=tp, ep=int(row["ep"]),
        gpu_memory_utilization=float(row["gpu_memory_utilization"]),
        max_num_batched_tokens=tokens, max_num_seqs=seqs, cuda_graph_bytes=0.0,
        non_torch_bytes=non_torch_bytes(tp, "pcie" not in gpu.interconnect.lower()),
        expert_align=MXFP4_MOE_LAYOUTS[row["mxfp4_layout"]] if row["mxfp4_layout"] else (1, 1))


@pytest.mark.parametrize("row", _rows(), ids=lambda r: f"{r['split']}-{r['model']}-tp{r['tp']}"
                         f"-{r['gpu']}-{r['url'].rsplit('/', 1)[-1]}")
def test_kv_cache_memory_within_half_a_gib_of_vllms_log(row):
    logged = float(row["available_kv_gib"])
    if logged <= 0:        # vLLM found no memory for the KV cache and refused to start
        with pytest.raises(ConfigError, match="no memory left for the KV cache"):
            _estimate(row)
        return
    est = _estimate(row)
    assert est.kv_cache_bytes / GIB == pytest.approx(logged, abs=0.5)
    if row["weights_gib"]:
        assert est.weight_bytes / GIB == pytest.approx(float(row["weights_gib"]), abs=0.2)
    if row["total_gib"]:
        assert est.total_memory_bytes / GIB == pytest.approx(float(row["total_gib"]), abs=0.02)


def test_sampler_bytes_per_logit_is_read_off_the_fit_rows():
    """Each fit row's logged activation peak, less the T x hidden term the estimate adds, over
    max_num_seqs x vocab: the constant is their mean, and every row is within 1% of it."""
    per_logit = []
    for row in _rows():
        if row["split"] != "fit":
            continue
        arch = load_preset(row["model"])
        gpu = get_gpu(row["gpu"])
        seqs, tokens = default_batch_limits(gpu.memory_bytes, gpu.name, True,
                                            int(row["max_model_len"]))
        hidden_term = tokens * arch.hidden_size * 2
        per_logit.append((float(row["activation_gib"]) * GIB - hidden_term)
                         / (seqs * arch.vocab_size))
    assert len(per_logit) == 7
    mean = sum(per_logit) / len(per_logit)
    assert SAMPLER_BYTES_PER_LOGIT == pytest.approx(mean, abs=0.05)
    assert all(abs(x / mean - 1) < 0.01 for x in per_logit)


def test_the_sampler_sets_the_activation_peak_at_vllms_default_batch_limits():
    """At 1,024 sequences (H100, H200) the sampler run, not the 8,192-token forward pass, is the
    peak for dense and MoE models alike."""
    for name in ("meta-llama/Llama-3.1-8B", "Qwen/Qwen3-235B-A22B", "openai/gpt-oss-120b"):
        arch = load_preset(name)
        peak = activation_peak_bytes(arch, tp=1, act_dtype_bytes=2, max_num_batched_tokens=8192,
                                     max_num_seqs=1024, last_stage=True)
        forward = activation_peak_bytes(arch, tp=1, act_dtype_bytes=2,
                                        max_num_batched_tokens=8192, max_num_seqs=1024,
                                        last_stage=False)
        assert peak > forward
        assert peak == pytest.approx(1024 * arch.vocab_size * SAMPLER_BYTES_PER_LOGIT
                                     + 8192 * arch.hidden_size * 2)


def test_cuda_graph_profiling_takes_its_estimate_out_of_the_kv_cache():
    from simcore.config import parse_config
    from simcore.model.memory import DEFAULT_CUDA_GRAPH_BYTES
    from simcore.setup import build_deployment

    def kv(**engine):
        cfg = parse_config({"model": {"name": "meta-llama/Llama-3.1-8B"},
                            "hardware": {"gpu": "H100-SXM"}, "engine": engine,
                            "workload": {"num_prompts": 1}})
        return build_deployment(cfg).memory

    on, off = kv(), kv(profile_cuda_graph_memory=False)
    assert on.cuda_graph_bytes == DEFAULT_CUDA_GRAPH_BYTES and off.cuda_graph_bytes == 0
    assert off.kv_cache_bytes - on.kv_cache_bytes == pytest.approx(DEFAULT_CUDA_GRAPH_BYTES)
    assert off.num_blocks > on.num_blocks
