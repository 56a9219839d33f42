"""The per-setting half of a launch plan: the model argument, the weight and KV-cache dtype
flags, the engine flags of vLLM 0.33 with the values the simulation resolved, and the warnings
for settings a `vllm serve` launch cannot carry (see `dse.launch` for the decisions)."""

from __future__ import annotations

import json
from pathlib import Path

from simcore.config import SimConfig, default_batch_limits
from simcore.model.arch import ModelArch
from simcore.model.hf import checkpoint_dtype

VLLM_VERSION = "0.33.0"
SIMULATOR_ONLY = "not a vLLM option: the simulated engine differs from stock vLLM here"
KV_DTYPES = {"auto": "auto", "bf16": "bfloat16", "fp16": "float16", "fp8": "fp8",
             "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}


def _quant_of_json(qc: object) -> str | None:
    """The simulator's dtype for a checkpoint's `quantization_config`
    (`simcore.model.hf.checkpoint_dtype`), else its method."""
    if not isinstance(qc, dict):
        return None
    return checkpoint_dtype(qc) or str(qc.get("quant_method", "")).lower() or None


def _quant_of_name(name: str) -> str | None:
    low = name.lower()
    if "fp4" in low:
        return "nvfp4"
    if "fp8" in low:
        return "fp8_named"      # an FP8 checkpoint, scales not known from the name
    if any(k in low for k in ("awq", "gptq", "int4", "w4a16")):
        return "int4"
    return None


def model_ref(cfg: SimConfig, arch: ModelArch, warnings: list[str],
              notes: list[str]) -> tuple[str, str | None]:
    """The model argument of `vllm serve` and the quantization its checkpoint carries."""
    m = cfg.model
    if m.name is not None:
        name = m.name if "/" in m.name else arch.name
        if name != m.name:
            warnings.append(f"model.name {m.name!r} is a preset's short name; the command "
                            f"names its Hugging Face id {name}")
        # The preset's shipped config.json, read with it (`ModelArch.checkpoint_dtype`).
        return name, _quant_of_name(name) or arch.checkpoint_dtype
    path = Path(m.hf_config)
    if not path.is_absolute():
        path = Path(cfg.base_dir) / path
    folder = path if path.is_dir() else path.parent
    cfg_file = folder / "config.json" if path.is_dir() else path
    try:
        qc = json.loads(cfg_file.read_text(encoding="utf-8")).get("quantization_config")
    except (OSError, ValueError, AttributeError):
        qc = None
    notes.append(f"model.hf_config: the command serves the local folder {folder}; it must hold "
                 "the weights and tokenizer beside config.json on every node (or replace it "
                 "with the checkpoint's Hugging Face id)")
    return str(folder), _quant_of_json(qc)


def weight_flags(dtype: str, quant: str | None, name: str, warnings: list[str],
                 notes: list[str]) -> list[str]:
    """`--dtype` (the activation dtype) and, where vLLM needs one, `--quantization`."""
    flags = ["--dtype", "float16" if dtype == "fp16" else "bfloat16"]
    carries = f"the checkpoint {name} carries the quantization; vLLM reads its quantization_config"
    mismatch = (f"model.dtype {dtype}: the checkpoint {name} is quantized as {quant}, which "
                f"vLLM serves as it is, not as {dtype}")
    if dtype in ("bf16", "fp16"):
        if quant:
            warnings.append(f"{mismatch}; name an unquantized checkpoint to launch what was "
                            "simulated")
    elif dtype == "fp8":
        if quant is None:
            flags += ["--quantization", "fp8"]
            notes.append("model.dtype fp8: --quantization fp8 quantizes the checkpoint's linear "
                         "layers to fp8 as it loads (per-tensor weight scales, dynamic "
                         "activation scales), as simulated")
        elif quant in ("fp8", "fp8_named"):
            notes.append(f"model.dtype fp8: {carries}, no --quantization flag")
        else:
            warnings.append(f"{mismatch}; set model.dtype: {quant} to simulate what it serves"
                            if quant in ("fp8_block", "int4", "nvfp4") else mismatch)
    elif dtype == "fp8_block":
        if quant is None:
            flags += ["--quantization", "fp8_per_block"]
            notes.append("model.dtype fp8_block: --quantization fp8_per_block quantizes the "
                         "checkpoint to fp8 with 128x128 block scales as it loads; a checkpoint "
                         "that carries block fp8 (e.g. the model's -FP8 release) needs no flag")
        elif quant in ("fp8_block", "fp8_named"):
            notes.append(f"model.dtype fp8_block: {carries}, no --quantization flag")
        else:
            warnings.append(mismatch)
    elif quant == dtype:
        how = {"int4": "awq_marlin or gptq_marlin", "mxfp4": "mxfp4"}.get(dtype, "modelopt_fp4")
        notes.append(f"model.dtype {dtype}: {carries} ({how}), no --quantization flag")
    else:
        what = {"int4": "an AWQ or GPTQ 4-bit (W4A16) checkpoint",
                "mxfp4": "an MXFP4 checkpoint"}.get(
                    dtype, "an NVFP4 checkpoint (e.g. NVIDIA's ModelOpt FP4 release)")
        warnings.append(f"model.dtype {dtype}: vLLM serves {dtype} weights only from a "
                        f"checkpoint that carries them: replace {name} in the command with "
                        f"{what} of the model (vLLM reads its quantization_config; no "
                        "--quantization flag is needed)")
    return flags


# --- engine flags -------------------------------------------------------------------------

def engine_flags(cfg: SimConfig, dep, warnings: list[str],
                 resolved: list[tuple[str, str, str]]) -> list[str]:
    e = cfg.engine
    given = e.model_fields_set
    v_seqs, v_tokens = default_batch_limits(dep.gpu.memory_bytes, dep.gpu.name,
                                            e.enable_chunked_prefill, dep.max_model_len)
    for key, value, stock in (("max_num_seqs", dep.max_num_seqs, v_seqs),
                              ("max_num_batched_tokens", dep.max_num_batched_tokens, v_tokens)):
        if key in given and getattr(e, key) is not None:
            resolved.append((f"engine.{key}", str(value), "config"))
            continue
        resolved.append((f"engine.{key}", str(value), f"simulator default for {dep.gpu.name}"))
        differs = "" if stock == value else (f"; stock vLLM {VLLM_VERSION} would pick {stock} "
                                             "on this GPU")
        warnings.append(f"engine.{key} not set: the simulation used {value} for "
                        f"{dep.gpu.name}{differs}; the command passes {value}")
    src = "config" if cfg.model.max_model_len else "the model's max_position_embeddings"
    resolved.append(("model.max_model_len", str(dep.max_model_len), src))
    f = ["--max-model-len", str(dep.max_model_len), "--max-num-seqs", str(dep.max_num_seqs),
         "--max-num-batched-tokens", str(dep.max_num_batched_tokens)]
    if e.max_num_scheduled_tokens is not None:
        f += ["--max-num-scheduled-tokens", str(e.max_num_scheduled_tokens)]
    f.append("--enable-chunked-prefill" if e.enable_chunked_prefill
             else "--no-enable-chunked-prefill")
    f.append("--enable-prefix-caching" if e.enable_prefix_caching
             else "--no-enable-prefix-caching")
    f += ["--block-size", str(e.block_size),
          "--gpu-memory-utilization", f"{e.gpu_memory_utilization:g}"]
    if e.num_gpu_blocks_override is not None:
        f += ["--num-gpu-blocks-override", str(e.num_gpu_blocks_override)]
    if e.long_prefill_token_threshold:
        f += ["--long-prefill-token-threshold", str(e.long_prefill_token_threshold)]
    if e.scheduling_policy == "priority":
        f += ["--scheduling-policy", "priority"]
    if e.watermark > 0:
        f += ["--watermark", f"{e.watermark:g}"]
    if not e.scheduler_reserve_full_isl:
        f.append("--no-scheduler-reserve-full-isl")
    f.append("--async-scheduling" if e.async_scheduling else "--no-async-scheduling")
    if e.speculative_config is not None:
        f += ["--speculative-config", speculative_flag(e.speculative_config, warnings)]
    if e.preemption_mode != "vllm":
        warnings.append(f"engine.preemption_mode {e.preemption_mode}: {SIMULATOR_ONLY} "
                        "(vLLM preempts the last-admitted, or lowest-priority, request)")
    if e.persistent_batch:
        warnings.append(f"engine.persistent_batch: {SIMULATOR_ONLY} (vLLM admits new requests "
                        "at every step)")
    if dep.arch.is_mla and e.block_size != 64:
        warnings.append(f"engine.block_size {e.block_size}: vLLM's FlashMLA backend for "
                        f"{dep.arch.name} needs 64-token blocks; with --block-size "
                        f"{e.block_size} vLLM picks another MLA backend (set engine.block_size: "
                        "64 to simulate FlashMLA's layout)")
    return f


def more_warnings(cfg: SimConfig, num_nodes: int, warnings: list[str],
                  notes: list[str]) -> None:
    """Settings beside the engine's that the launch cannot carry, and multi-node advice."""
    par = cfg.parallelism
    if cfg.host.entrypoint == "offline":
        warnings.append("host.entrypoint offline: the simulation ran vLLM's LLM class with no "
                        "API server; `vllm serve` adds the server's per-request and per-token "
                        "costs")
    if par.enable_expert_parallel and par.data_parallel_size > 1:
        notes.append("expert parallelism: the simulation's dispatch and combine send top-k "
                     "token copies (DeepEP-style); vLLM's default --all2all-backend is "
                     "allgather_reducescatter: add --all2all-backend deepep_high_throughput or "
                     "deepep_low_latency (DeepEP installed) to launch what was simulated")
    hw = sorted(k for k in cfg.hardware.model_fields_set if k not in ("gpu", "gpus_per_node"))
    if hw:
        warnings.append(f"hardware: the simulation overrode {cfg.hardware.gpu}'s datasheet "
                        f"({', '.join(hw)}); the launch runs on the GPUs there are, whose "
                        "speed and memory (hence KV-cache size) may differ")
    c = cfg.cluster
    if c is not None:
        d = c.dag
        if d.overlap != "none":
            warnings.append(f"cluster.dag.overlap {d.overlap}: {SIMULATOR_ONLY}"
                            + (" (vLLM's closest is --enable-dbo, dual-batch overlap for DP + "
                               "EP with DeepEP)" if d.overlap == "two_batch" else ""))
        if d.pp_microbatches > 1:
            warnings.append(f"cluster.dag.pp_microbatches {d.pp_microbatches}: {SIMULATOR_ONLY}")
        algo = {"ring": "Ring", "tree": "Tree"}.get(d.collectives.all_reduce)
        if d.collectives.all_reduce != "auto":
            warnings.append(f"cluster.dag.collectives.all_reduce {d.collectives.all_reduce}: "
                            + (f"set NCCL_ALGO={algo} on every node to force it"
                               if algo else SIMULATOR_ONLY))
    if num_nodes > 1:
        notes.append("multi-node: every node needs the same vLLM version, model files and "
                     "Python environment; point NCCL at the RDMA NICs (NCCL_IB_HCA, "
                     "NCCL_SOCKET_IFNAME) and, with Ray, set VLLM_HOST_IP to each node's address")


def speculative_flag(spec, warnings: list[str]) -> str:
    """`--speculative-config`'s JSON for `engine.speculative_config` (vLLM's keys: method, model,
    num_speculative_tokens, prompt_lookup_min / max); the acceptance model is the simulator's
    stand-in for token contents and is not passed. An EAGLE head named by nothing gets a
    placeholder and a warning: vLLM needs its checkpoint."""
    out: dict = {"method": spec.method}
    if spec.model:
        out["model"] = spec.model
        if spec.method == "draft_model" and "/" not in spec.model:
            from simcore.model.presets import load_preset

            name = load_preset(spec.model).name       # the simulated draft model's own id
            if name != spec.model:
                out["model"] = name
                warnings.append(f"engine.speculative_config.model {spec.model!r} is a preset's "
                                f"short name; the command names its Hugging Face id {name}")
    elif spec.method in ("eagle", "eagle3"):
        out["model"] = "<EAGLE head checkpoint>"
        warnings.append(f"engine.speculative_config.model not set: vLLM's {spec.method} needs "
                        "the draft head's checkpoint; replace <EAGLE head checkpoint> in "
                        "--speculative-config")
    out["num_speculative_tokens"] = spec.num_speculative_tokens
    for key in ("prompt_lookup_min", "prompt_lookup_max"):
        if getattr(spec, key) is not None:
            out[key] = getattr(spec, key)
    return json.dumps(out, separators=(", ", ": "))
