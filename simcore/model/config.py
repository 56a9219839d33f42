"""The `model:` section of a simulation config: which model, in which dtypes, up to which length."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from simcore.errors import ConfigError
from simcore.model.chat_template import TemplateTokens, preset_template_tokens
from simcore.model.arch import (MXFP4_MOE_LAYOUTS, ModelArch,
                                default_mxfp4_moe_layout)
from simcore.model.hf import load_hf_config
from simcore.model.presets import is_preset, load_preset, preset_checkpoint_dtype, preset_names


class ModelConfig(BaseModel):
    """A model to serve: a shipped preset (`name`) or a local Hugging Face config (`hf_config`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str | None = Field(
        default=None,
        description="Preset name, case-insensitive, with or without the organisation, e.g. "
                    "'meta-llama/Llama-3.1-8B' or 'llama-3.1-8b'. Exactly one of name and "
                    "hf_config.")
    hf_config: Path | None = Field(
        default=None,
        description="Path to a Hugging Face config.json (or its directory); a relative path is "
                    "resolved against the directory of the file that declares it. Exactly one of "
                    "name and hf_config.")
    dtype: Literal["bf16", "fp16", "fp8", "fp8_block", "int4", "nvfp4", "mxfp4"] = Field(
        default="bf16",
        description="Weight dtype of the linear layers (embeddings, LM head, norms and MoE "
                    "routers stay in bf16). Default: bf16, or for a quantized checkpoint the "
                    "dtype its quantization_config gives, which vLLM loads it in (a preset's: "
                    "fp8_block for DeepSeek-V3/R1, mxfp4 for gpt-oss; an hf_config with a "
                    "quantization_config needs dtype set): fp8 with per-tensor or per-channel scales (W8A8, "
                    "e.g. compressed-tensors FP8 checkpoints), fp8_block with 128x128 block "
                    "scales (DeepSeek-V3 and Qwen3 FP8 checkpoints), int4 weight-only with "
                    "group scales (AWQ/GPTQ, W4A16), nvfp4 (4-bit weights and activations with "
                    "fp8 scales per 16 elements, Blackwell), mxfp4 (the routed experts alone in "
                    "4-bit values with an e8m0 scale per 32, 16-bit activations; every other "
                    "layer bf16: gpt-oss checkpoints).")
    mxfp4_moe_layout: Literal["auto", "marlin", "triton", "flashinfer", "rocm", "rocm_gfx950",
                              "unpadded"] = Field(
        default="auto",
        description="How vLLM lays out MXFP4 routed experts in GPU memory (dtype mxfp4 only): "
                    "the kernel backend whose padded shapes the weights take. 'auto' is vLLM's "
                    "default for the GPU: flashinfer on Blackwell, triton on Hopper, the ROCm "
                    "layout on AMD GPUs, marlin elsewhere (and on Hopper with vLLM builds "
                    "without the triton_kernels package, e.g. vLLM 0.10-0.11's pip wheels). "
                    "It sets the weights' padding (memory) and the kernels that time the "
                    "experts: the kernel profile's measurement of their shape, or where that "
                    "is another backend's and the layout's backend measured at least two other "
                    "models of the GPU, those moved to their shape (Marlin on Hopper); the "
                    "result's assumed parts say which.")
    kv_cache_dtype: Literal["auto", "bf16", "fp16", "fp8", "fp8_e4m3", "fp8_e5m2"] = Field(
        default="auto",
        description="KV-cache dtype; 'auto' means the activation dtype (bf16 for quantized weights, "
                    "else the weight dtype), as vLLM's --kv-cache-dtype auto.")
    chat_template_tokens: tuple[int, int] | None = Field(
        default=None,
        description="[lead, tail]: the tokens the model's chat template adds before a chat "
                    "request's message text (BOS, system header, the user's role tokens: the "
                    "same in every request, so prefix-cached) and after it (closing the message, "
                    "opening the assistant's turn), which the engine prefills and vllm bench "
                    "serve's token counts leave out. Default: measured for the presets whose "
                    "chat format was measured with their own template and tokenizer (Qwen3 "
                    "[3, 5], gpt-oss harmony [66, 3], DeepSeek-V3/R1 [2, 1]); none for other "
                    "models. Chat requests only (workload.endpoint chat_completions).")
    max_model_len: int | None = Field(
        default=None, gt=0,
        description="Longest request (prompt + output) in tokens; default: the model's "
                    "max_position_embeddings.")

    @field_validator("name")
    @classmethod
    def _known_preset(cls, name: str | None) -> str | None:
        if name is not None and not is_preset(name):
            raise ValueError(f"unknown model {name!r}; known presets: {', '.join(preset_names())} "
                             "(or give hf_config: a path to a config.json)")
        return name

    @model_validator(mode="after")
    def _checkpoint_dtype_by_default(self) -> ModelConfig:
        # vLLM loads a quantized checkpoint in its own quantization (its quantization_config):
        # without a dtype, a preset's model runs in it, not in bf16. Set as a default (dtype
        # stays out of the fields set), before the checks below read it.
        if "dtype" not in self.model_fields_set and self.name is not None \
                and is_preset(self.name):
            dtype = preset_checkpoint_dtype(self.name)
            if dtype is not None:
                object.__setattr__(self, "dtype", dtype)
        return self

    @field_validator("chat_template_tokens")
    @classmethod
    def _counts(cls, value: tuple[int, int] | None) -> tuple[int, int] | None:
        if value is not None and (min(value) < 0 or max(value) > 100_000):
            raise ValueError(f"[lead, tail] must be token counts from 0 to "
                             f"100,000, got {list(value)}")
        return value

    def template_tokens(self, arch: ModelArch) -> TemplateTokens | None:
        """The tokens a chat request's template adds: `chat_template_tokens` where set, else
        the preset's measured ones (None where neither)."""
        if self.chat_template_tokens is not None:
            lead, tail = self.chat_template_tokens
            return TemplateTokens(lead, tail, "model.chat_template_tokens")
        return preset_template_tokens(arch.name, self.name) if self.name is not None else None

    @model_validator(mode="after")
    def _layout_needs_mxfp4(self) -> ModelConfig:
        if self.mxfp4_moe_layout != "auto" and self.dtype != "mxfp4":
            raise ValueError(f"mxfp4_moe_layout {self.mxfp4_moe_layout!r} applies to dtype "
                             f"mxfp4 only (dtype is {self.dtype!r})")
        return self

    def resolved_mxfp4_moe_layout(self, gpu_name: str) -> str:
        """`mxfp4_moe_layout` with 'auto' replaced by vLLM's default on `gpu_name`."""
        layout = self.mxfp4_moe_layout
        return default_mxfp4_moe_layout(gpu_name) if layout == "auto" else layout

    def expert_align(self, gpu_name: str) -> tuple[int, int]:
        """(hidden, intermediate-per-rank) multiples the routed experts are padded to on
        `gpu_name` (`MXFP4_MOE_LAYOUTS`); (1, 1) for every dtype but mxfp4."""
        if self.dtype != "mxfp4":
            return (1, 1)
        return MXFP4_MOE_LAYOUTS[self.resolved_mxfp4_moe_layout(gpu_name)]

    @model_validator(mode="after")
    def _fp8_checkpoint_in_fp8(self) -> ModelConfig:
        # A preset's -FP8 name is its FP8 checkpoint, whose quantization_config vLLM follows:
        # simulating it in another dtype would time weights vLLM never loads.
        if self.name is not None and self.name.upper().endswith("-FP8") \
                and self.dtype not in ("fp8", "fp8_block"):
            base = self.name[:-len("-FP8")]
            block = " (fp8_block: Qwen3's FP8 checkpoints scale 128x128 blocks)" \
                if "qwen3" in self.name.lower() else ""
            raise ValueError(f"dtype: {self.name} is an FP8 checkpoint, which vLLM loads in fp8; "
                             f"set dtype fp8 or fp8_block{block}, or name the 16-bit model "
                             f"{base}")
        return self

    @model_validator(mode="after")
    def _one_source(self) -> ModelConfig:
        if (self.name is None) == (self.hf_config is None):
            raise ValueError("give exactly one of model.name (a preset) and model.hf_config "
                             "(a path to a config.json)")
        return self

    @property
    def resolved_kv_cache_dtype(self) -> str:
        """The KV-cache dtype with 'auto' replaced by the activation dtype."""
        if self.kv_cache_dtype == "auto":
            return self.dtype if self.dtype in ("bf16", "fp16") else "bf16"
        return self.kv_cache_dtype

    def resolve(self, base_dir: str | Path | None = None) -> ModelArch:
        """The ModelArch: the preset, or `hf_config` read relative to `base_dir` (default: cwd)."""
        if self.name is not None:
            return load_preset(self.name)
        assert self.hf_config is not None
        path = self.hf_config
        if not path.is_absolute() and base_dir is not None:
            path = Path(base_dir) / path
        arch = load_hf_config(path)
        quantized = arch.checkpoint_dtype
        if quantized is not None and "dtype" not in self.model_fields_set:
            raise ConfigError(f"model.dtype: {path} is a {quantized} checkpoint "
                              "(quantization_config), which vLLM loads in that dtype, not the "
                              f"default bf16; set model.dtype: {quantized} (or another dtype to "
                              "time such weights instead)")
        return arch

    def resolved_max_model_len(self, arch: ModelArch) -> int:
        """`max_model_len`, defaulting to (and checked against) max_position_embeddings."""
        if self.max_model_len is None:
            return arch.max_position_embeddings
        if self.max_model_len > arch.max_position_embeddings:
            raise ConfigError(f"model.max_model_len {self.max_model_len} exceeds {arch.name}'s "
                              f"max_position_embeddings ({arch.max_position_embeddings})")
        return self.max_model_len
