"""Reading a Hugging Face `config.json` into a ModelArch, for the families vLLM serves most."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from simcore.errors import ConfigError
from simcore.loading import load_json
from simcore.model.arch import ModelArch

_DENSE_TYPES = ("llama", "mistral", "qwen2", "qwen3")
_MOE_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "gpt_oss",
              "glm4_moe")
SUPPORTED_MODEL_TYPES = _DENSE_TYPES + _MOE_TYPES
"""Values of `model_type` this reader understands."""


def _scaled_max_len(data: Mapping[str, Any], k: "_Keys", source: str) -> int:
    """The longest sequence the model serves, as vLLM derives it (ModelConfig's
    _get_and_verify_max_len): max_position_embeddings, times the RoPE scaling's `factor` for a
    scaling that extends the context (every rope type but su, longrope and llama3, whose
    max_position_embeddings already counts it), YaRN's from its original_max_position_embeddings."""
    length = k.get_int("max_position_embeddings")
    rope = data.get("rope_scaling")
    if not isinstance(rope, Mapping) or rope.get("factor") is None:
        return length
    kind = rope.get("rope_type", rope.get("type"))
    if kind in ("su", "longrope", "llama3", "default"):
        return length
    factor = rope["factor"]
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 0:
        raise ConfigError(f"{source}: key 'rope_scaling.factor' must be a positive number, got "
                          f"{factor!r}")
    if kind == "yarn" and rope.get("original_max_position_embeddings") is not None:
        original = rope["original_max_position_embeddings"]
        if isinstance(original, bool) or not isinstance(original, int) or original < 1:
            raise ConfigError(f"{source}: key 'rope_scaling.original_max_position_embeddings' "
                              f"must be a positive integer, got {original!r}")
        length = original
    return int(length * factor)


class _Keys:
    """Typed access to a config dict; a missing or mistyped key is a ConfigError naming it."""

    def __init__(self, data: Mapping[str, Any], source: str) -> None:
        self._data = data
        self._source = source

    def get_int(self, key: str, default: int | None = None) -> int:
        value = self._data.get(key)
        if value is None:
            if default is None:
                raise ConfigError(f"{self._source}: required key {key!r} is missing")
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{self._source}: key {key!r} must be an integer, got {value!r}")
        return value

    def get_bool(self, key: str, default: bool) -> bool:
        value = self._data.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ConfigError(f"{self._source}: key {key!r} must be true or false, got {value!r}")
        return value


def checkpoint_dtype(quantization: Any) -> str | None:
    """The weight dtype (`model.dtype`'s values) of a checkpoint with this Hugging Face
    `quantization_config`, or None: none given, or a method this maps to no dtype.

    fp8 (DeepSeek's and Qwen3's block-scaled checkpoints carry `weight_block_size`), mxfp4
    (gpt-oss), 4-bit AWQ and GPTQ (int4, weight-only), ModelOpt's FP8 and NVFP4, and
    compressed-tensors' 8-bit float and 4-bit integer weight groups."""
    if not isinstance(quantization, Mapping):
        return None
    method = str(quantization.get("quant_method", "")).lower()
    if method == "fp8":
        return "fp8_block" if quantization.get("weight_block_size") else "fp8"
    if method == "mxfp4":
        return "mxfp4"
    if method in ("awq", "gptq", "awq_marlin", "gptq_marlin"):
        return "int4" if quantization.get("bits", 4) == 4 else None
    if method == "modelopt":
        algo = str(quantization.get("quant_algo", "")).upper()
        return {"FP8": "fp8", "NVFP4": "nvfp4"}.get(algo)
    if method == "compressed-tensors":
        groups = quantization.get("config_groups")
        weights = [g.get("weights") for g in groups.values()
                   if isinstance(g, Mapping) and isinstance(g.get("weights"), Mapping)] \
            if isinstance(groups, Mapping) else []
        if not weights:
            return None
        w = weights[0]
        if w.get("num_bits") == 8 and w.get("type") == "float":
            return "fp8_block" if w.get("strategy") == "block" else "fp8"
        if w.get("num_bits") == 4 and w.get("type") == "int":
            return "int4"
    return None


def arch_from_hf_dict(data: Mapping[str, Any], source: str, name: str | None = None) -> ModelArch:
    """Build a ModelArch from the parsed contents of a Hugging Face config.

    `source` names where the dict came from (for error messages); `name` defaults to the config's
    `_name_or_path`, else `source`. Absent `head_dim` means hidden_size / num_attention_heads and
    absent `num_key_value_heads` means multi-head attention, as in transformers. `layer_types`
    (transformers' per-layer attention kinds) marks the "sliding_attention" layers, which attend
    over the last `sliding_window` keys; without it every layer attends over the whole context.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: a model config must be a JSON object")
    model_type = data.get("model_type")
    if model_type is None:
        raise ConfigError(f"{source}: required key 'model_type' is missing")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ConfigError(f"{source}: unsupported model_type {model_type!r}; supported: "
                          f"{', '.join(SUPPORTED_MODEL_TYPES)}")
    k = _Keys(data, source)
    hidden = k.get_int("hidden_size")
    heads = k.get_int("num_attention_heads")
    if heads < 1:       # the head width below divides by it
        raise ConfigError(f"{source}: key 'num_attention_heads' must be at least 1, got {heads}")
    fields: dict[str, Any] = dict(
        name=name or data.get("_name_or_path") or source,
        num_layers=k.get_int("num_hidden_layers"),
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=k.get_int("num_key_value_heads", heads),
        head_dim=k.get_int("head_dim", hidden // heads),
        intermediate_size=k.get_int("intermediate_size"),
        vocab_size=k.get_int("vocab_size"),
        max_position_embeddings=_scaled_max_len(data, k, source),
        tie_word_embeddings=k.get_bool("tie_word_embeddings", False),
    )
    if model_type in ("llama", "mistral", "mixtral"):
        fields["qkv_bias"] = k.get_bool("attention_bias", False)
    elif model_type in ("qwen2", "qwen2_moe"):
        fields["qkv_bias"] = True  # Qwen2 attention always has Q/K/V biases
    elif model_type in ("qwen3", "qwen3_moe"):
        fields["qkv_bias"] = k.get_bool("attention_bias", False)
        fields["qk_norm"] = True
    elif model_type == "glm4_moe":
        # Glm4MoeAttention: grouped-query attention with Q/K/V biases (attention_bias), RMS norms
        # on the query and key heads when use_qk_norm (GLM-4.6, not GLM-4.5-Air), rotary
        # embedding on part of each head (partial_rotary_factor: a cheaper pass, not modelled).
        fields["qkv_bias"] = k.get_bool("attention_bias", False)
        fields["qk_norm"] = k.get_bool("use_qk_norm", False)
    elif model_type == "gpt_oss":
        # GptOssAttention: biases on q, k, v and o; one sink logit per head.
        bias = k.get_bool("attention_bias", True)
        fields.update(qkv_bias=bias, o_bias=bias, attention_sinks=True)
    fields.update(_sliding_layers(data, k, source, fields["num_layers"]))
    fields["checkpoint_dtype"] = checkpoint_dtype(data.get("quantization_config"))

    if model_type == "mixtral":
        if k.get_int("num_local_experts") < 1:     # would read as a dense model
            raise ConfigError(f"{source}: key 'num_local_experts' must be at least 1 for a "
                              f"mixtral model")
        fields.update(num_experts=k.get_int("num_local_experts"),
                      num_experts_per_tok=k.get_int("num_experts_per_tok"),
                      moe_intermediate_size=fields["intermediate_size"])
    elif model_type in ("qwen2_moe", "qwen3_moe"):
        if k.get_int("decoder_sparse_step", 1) != 1 or data.get("mlp_only_layers"):
            raise ConfigError(f"{source}: decoder_sparse_step != 1 and mlp_only_layers are not "
                              "supported (every layer must be a MoE layer)")
        fields.update(num_experts=k.get_int("num_experts"),
                      num_experts_per_tok=k.get_int("num_experts_per_tok"),
                      moe_intermediate_size=k.get_int("moe_intermediate_size"))
        if model_type == "qwen2_moe":
            fields.update(num_shared_experts=1,
                          shared_expert_intermediate_size=k.get_int("shared_expert_intermediate_size"),
                          shared_expert_gate=True)
    elif model_type == "gpt_oss":
        # GptOssMLP: a biased linear router over num_local_experts experts (intermediate_size
        # wide), each a biased SwiGLU MLP; every layer is a MoE layer.
        fields.update(num_experts=k.get_int("num_local_experts"),
                      num_experts_per_tok=k.get_int("num_experts_per_tok"),
                      moe_intermediate_size=fields["intermediate_size"],
                      router_bias=True, expert_bias=True, chat_format="harmony")
    elif model_type == "glm4_moe":
        # Glm4MoeMoE: DeepSeek-V3's layout (below) with a sigmoid router that always carries a
        # per-expert score-correction bias, and grouped-query attention instead of MLA.
        fields.update(_routed_and_shared_experts(k), router_bias=True)
    elif model_type in ("deepseek_v2", "deepseek_v3"):
        fields.update(
            _routed_and_shared_experts(k),
            router_bias=data.get("topk_method") == "noaux_tc",
            moe_layer_freq=k.get_int("moe_layer_freq", 1),
            kv_lora_rank=k.get_int("kv_lora_rank"),
            q_lora_rank=k.get_int("q_lora_rank", 0),
            qk_rope_head_dim=k.get_int("qk_rope_head_dim"),
            qk_nope_head_dim=k.get_int("qk_nope_head_dim"),
            v_head_dim=k.get_int("v_head_dim"),
        )
    return ModelArch(**fields)


def _routed_and_shared_experts(k: _Keys) -> dict[str, Any]:
    """DeepSeek-style MoE layers (DeepSeek-V2/V3, GLM-4.5/4.6): the first
    `first_k_dense_replace` layers dense MLPs (intermediate_size), the rest n_routed_experts
    experts (moe_intermediate_size) beside n_shared_experts shared experts of the same width;
    num_nextn_predict_layers multi-token-prediction layers (unused unless speculative decoding
    runs them)."""
    return dict(
        num_experts=k.get_int("n_routed_experts"),
        num_experts_per_tok=k.get_int("num_experts_per_tok"),
        moe_intermediate_size=k.get_int("moe_intermediate_size"),
        num_shared_experts=k.get_int("n_shared_experts", 0),
        shared_expert_intermediate_size=k.get_int("moe_intermediate_size"),
        first_k_dense_layers=k.get_int("first_k_dense_replace", 0),
        num_mtp_layers=k.get_int("num_nextn_predict_layers", 0),
    )


_LAYER_TYPES = ("full_attention", "sliding_attention")
"""Values of `layer_types` this reader understands."""


def _sliding_layers(data: Mapping[str, Any], k: _Keys, source: str,
                    num_layers: int) -> dict[str, Any]:
    """`sliding_window` and `sliding_window_layers` from the config's `layer_types`."""
    types = data.get("layer_types")
    if types is None:
        return {}
    if not isinstance(types, list) or len(types) != num_layers:
        raise ConfigError(f"{source}: key 'layer_types' must list one attention kind for each of "
                          f"the {num_layers} layers")
    unknown = sorted({t for t in types if t not in _LAYER_TYPES}, key=str)
    if unknown:
        raise ConfigError(f"{source}: unsupported layer_types {unknown}; supported: "
                          f"{', '.join(_LAYER_TYPES)}")
    sliding = tuple(i for i, t in enumerate(types) if t == "sliding_attention")
    if not sliding:
        return {}
    return {"sliding_window": k.get_int("sliding_window"), "sliding_window_layers": sliding}


def load_hf_config(path: str | Path, name: str | None = None) -> ModelArch:
    """Build a ModelArch from a local `config.json` (or a directory holding one)."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ConfigError(f"cannot read model config {path}: no such file")
    data = load_json(path)
    return arch_from_hf_dict(data, str(path), name=name or _default_name(data, path))


def _default_name(data: Any, path: Path) -> str:
    """The config's `_name_or_path`, else the name of the directory holding it."""
    if isinstance(data, Mapping) and isinstance(data.get("_name_or_path"), str):
        return data["_name_or_path"]
    return path.parent.name or path.stem
