"""Named model presets: published Hugging Face configs shipped in simcore/data/models."""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

from simcore.errors import ConfigError
from simcore.model.arch import ModelArch
from simcore.model.hf import arch_from_hf_dict

_PRESET_FILES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("meta-llama/Llama-3.1-8B", "llama-3.1-8b.json",
     ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Meta-Llama-3.1-8B",
      "meta-llama/Meta-Llama-3.1-8B-Instruct", "meta-llama/Meta-Llama-3-8B",
      "meta-llama/Meta-Llama-3-8B-Instruct")),
    ("meta-llama/Llama-3.1-70B", "llama-3.1-70b.json",
     ("meta-llama/Llama-3.1-70B-Instruct", "meta-llama/Meta-Llama-3.1-70B",
      "meta-llama/Meta-Llama-3.1-70B-Instruct", "meta-llama/Llama-3.3-70B-Instruct",
      "meta-llama/Meta-Llama-3-70B", "meta-llama/Meta-Llama-3-70B-Instruct")),
    ("meta-llama/Llama-3.1-405B", "llama-3.1-405b.json",
     ("meta-llama/Llama-3.1-405B-Instruct", "meta-llama/Meta-Llama-3.1-405B",
      "meta-llama/Meta-Llama-3.1-405B-Instruct")),
    ("Qwen/Qwen3-8B", "qwen3-8b.json", ("Qwen/Qwen3-8B-FP8",)),
    ("Qwen/Qwen3-14B", "qwen3-14b.json", ("Qwen/Qwen3-14B-FP8",)),
    ("Qwen/Qwen3-32B", "qwen3-32b.json", ("Qwen/Qwen3-32B-FP8",)),
    ("mistralai/Mixtral-8x7B-v0.1", "mixtral-8x7b-v0.1.json",
     ("mistralai/Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b")),
    ("Qwen/Qwen3-30B-A3B", "qwen3-30b-a3b.json",
     ("Qwen/Qwen3-30B-A3B-FP8", "Qwen/Qwen3-30B-A3B-Instruct-2507",
      "Qwen/Qwen3-30B-A3B-Instruct-2507-FP8")),
    ("Qwen/Qwen3-235B-A22B", "qwen3-235b-a22b.json",
     ("Qwen/Qwen3-235B-A22B-FP8", "Qwen/Qwen3-235B-A22B-Instruct-2507",
      "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8")),
    ("openai/gpt-oss-20b", "gpt-oss-20b.json", ()),
    ("openai/gpt-oss-120b", "gpt-oss-120b.json", ()),
    ("deepseek-ai/DeepSeek-V3", "deepseek-v3.json",
     ("deepseek-ai/DeepSeek-V3-0324", "deepseek-ai/DeepSeek-R1", "deepseek-ai/DeepSeek-R1-0528")),
    ("zai-org/GLM-4.5-Air", "glm-4.5-air.json", ("zai-org/GLM-4.5-Air-FP8",)),
    ("zai-org/GLM-4.6", "glm-4.6.json", ("zai-org/GLM-4.6-FP8",)),
)
"""(canonical Hugging Face name, data file, aliases with the same architecture)."""


SHAREGPT_TOKENIZERS = {
    "meta-llama/Llama-3.1-8B": "llama3", "meta-llama/Llama-3.1-70B": "llama3",
    "meta-llama/Llama-3.1-405B": "llama3", "mistralai/Mixtral-8x7B-v0.1": "mistral_v1",
    "Qwen/Qwen3-8B": "qwen3", "Qwen/Qwen3-14B": "qwen3", "Qwen/Qwen3-32B": "qwen3",
    "Qwen/Qwen3-30B-A3B": "qwen3", "Qwen/Qwen3-235B-A22B": "qwen3",
    "openai/gpt-oss-20b": "o200k", "openai/gpt-oss-120b": "o200k",
    "deepseek-ai/DeepSeek-V3": "deepseek_v3",
}
"""The tokenizer of each preset (by canonical name) whose ShareGPT counts the simulator ships
(`simcore.reference_data.SHAREGPT_FIRST_TURNS`); the GLM presets have none."""


def sharegpt_tokenizer(name: str) -> str | None:
    """The shipped ShareGPT counts in preset `name`'s tokenizer (`SHAREGPT_TOKENIZERS`), None
    for a preset without them or a name that is no preset."""
    hit = _index().get(name.lower())
    return SHAREGPT_TOKENIZERS.get(hit[0]) if hit else None


def canonical_name(name: str) -> str | None:
    """The canonical name of preset `name` (full or short, any case, or an alias), None for a
    name that is no preset."""
    hit = _index().get(name.lower())
    return hit[0] if hit else None


def _index() -> dict[str, tuple[str, str]]:
    """Lower-case lookup key -> (canonical name, data file); keys are full and short names."""
    index: dict[str, tuple[str, str]] = {}
    for canonical, filename, aliases in _PRESET_FILES:
        for name in (canonical, *aliases):
            index[name.lower()] = (canonical, filename)
            index[name.split("/")[-1].lower()] = (canonical, filename)
    return index


def preset_names() -> tuple[str, ...]:
    """Canonical names of the shipped presets."""
    return tuple(canonical for canonical, _, _ in _PRESET_FILES)


def is_preset(name: str) -> bool:
    """`name` (case-insensitive, with or without the organisation) names a shipped preset."""
    return name.lower() in _index()


def load_preset(name: str) -> ModelArch:
    """The ModelArch of preset `name`, e.g. "meta-llama/Llama-3.1-8B" or "llama-3.1-8b"."""
    try:
        canonical, filename = _index()[name.lower()]
    except KeyError:
        raise ConfigError(f"unknown model {name!r}; known presets: {', '.join(preset_names())} "
                          "(or give hf_config: a path to a config.json)") from None
    path = resources.files("simcore") / "data" / "models" / filename
    data = json.loads(path.read_text())
    return arch_from_hf_dict(data, f"preset {canonical}", name=canonical)


@lru_cache(maxsize=None)
def preset_checkpoint_dtype(name: str) -> str | None:
    """The weight dtype preset `name`'s checkpoint is quantized in (`ModelArch.checkpoint_dtype`),
    or None for a 16-bit checkpoint."""
    return load_preset(name).checkpoint_dtype
