"""The tokens a model's chat template adds to a chat request's prompt.

vLLM's chat endpoint renders a request's messages with the model's chat template (gpt-oss: with
OpenAI's harmony encoding) and prefills the rendered prompt; `vllm bench serve` counts only the
tokens of the message text. For one user message the template adds `lead` tokens before the text
(BOS, a system header, the user's role tokens), the same in every request, so vLLM's prefix
cache shares their full blocks, and `tail` tokens after it (closing the message, opening the
assistant's turn). Measured for the presets' chat formats with each model's own template and
tokenizer (`simcore/data/models/chat_templates.json`, `scripts/chat_template_tokens/`), or for
GLM, whose tokenizer is not shipped, derived from its template; `model.chat_template_tokens` gives
them for any other model.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from functools import lru_cache

from simcore.model.presets import SHAREGPT_TOKENIZERS, canonical_name, sharegpt_tokenizer
from simcore.reference_data import DATA_DIR

TEMPLATES_FILE = DATA_DIR / "models" / "chat_templates.json"

TOKENIZER_FORMATS = {"qwen3": "qwen3", "o200k": "harmony", "deepseek_v3": "deepseek_v3",
                     "llama3": "llama3_1"}
"""The measured chat format of each preset tokenizer family (`simcore.model.presets.
SHAREGPT_TOKENIZERS`) whose template was measured, from the same package as the tokenizer:
every Qwen3 checkpoint, its 2507 instruct ones included, wraps a user message in the same ChatML
tokens (measured on Qwen3-8B's template); gpt-oss's requests are rendered with harmony;
DeepSeek-V3's template also stands for R1 and R1-0528, whose generation prompt may add a few
tokens more; Llama 3.1 Instruct's default system block (knowledge cutoff and date) also stands
for Llama 3.3's, whose date is today's, the same count of tokens, but not for Llama 3's checkpoints
(`OTHER_TEMPLATE`). GLM's are derived (`DERIVED_FORMATS`). Mixtral has no template counts: its
chat requests are prefilled as the client counts them (`TemplateTokens.unknown_line`)."""

OTHER_TEMPLATE = re.compile(r"meta-llama-3-(8|70)b", re.IGNORECASE)
"""Served names of preset aliases whose chat template is not their preset's format: Llama 3's
checkpoints (aliases of the Llama 3.1 presets) write no system block (5 tokens before the text,
not 30), and are left without template counts."""

DERIVED_FORMATS = {"zai-org/GLM-4.5-Air": "glm4", "zai-org/GLM-4.6": "glm4"}
"""Presets whose chat format is derived from their template, not measured with their tokenizer
(which the simulator does not ship): GLM-4.5 and GLM-4.6 wrap a user message in
`[gMASK]<sop><|user|>\n ... <|assistant|>`, single special tokens but the newline (the format's
`source` says how that was read)."""

PRESET_FORMATS = {**{name: TOKENIZER_FORMATS[tok] for name, tok in SHAREGPT_TOKENIZERS.items()
                     if tok in TOKENIZER_FORMATS}, **DERIVED_FORMATS}
"""The chat format of each preset (by canonical name) that has one: measured, else derived."""


COUNTED_BOS = {"llama3": 1, "mistral_v1": 1, "deepseek_v3": 1}
"""The BOS in each shipped ShareGPT count (`simcore/data/datasets/README.md`: the tokenizers that
add one on encode), as `vllm bench serve` counts a ShareGPT prompt (`tokenizer(prompt)`, special
tokens added); its random prompts are counted without it (vLLM 0.11's random dataset takes the
tokenizer's special tokens off the requested length and counts the re-encoded text alone)."""


@dataclass(frozen=True)
class TemplateTokens:
    """Tokens a chat template adds around one user message: `lead` before it (shared by every
    request), `tail` after it; `source`, where the counts come from; `counted`, how many of the
    lead the client's prompt count already holds (the BOS of a ShareGPT count, `COUNTED_BOS`)."""

    lead: int
    tail: int
    source: str
    counted: int = 0

    @property
    def total(self) -> int:
        return self.lead + self.tail

    @property
    def added(self) -> int:
        """The tokens the rendered prompt has beyond the client's count."""
        return self.total - self.counted

    def for_sharegpt_counts(self, tokenizer: str, model: str) -> TemplateTokens:
        """These counts for a client that sends the shipped ShareGPT counts of `tokenizer` to
        `model`: where those are the model's own tokenizer's, the BOS they hold is the one the
        template writes (`COUNTED_BOS`); another tokenizer's counts hold none of its tokens."""
        if tokenizer != sharegpt_tokenizer(model):
            return self
        return replace(self, counted=min(COUNTED_BOS.get(tokenizer, 0), self.lead))

    def assumption_line(self, block_size: int) -> str:
        shared = self.lead // block_size * block_size
        cached = (f"the same in every request, {shared} of them in whole blocks that the prefix "
                  "cache keeps after the first" if shared else
                  "the same in every request, but less than a block: none cached")
        held = (f"; the client's count of each prompt already holds {self.counted} of them "
                "(the BOS of a ShareGPT count)" if self.counted else "")
        return (f"chat requests: the chat template adds {self.lead} tokens before each prompt "
                f"({cached}) and {self.tail} after it, which the engine prefills and vllm bench "
                f"serve's token counts leave out ({self.source}){held}")

    @staticmethod
    def unknown_line(model: str) -> str:
        return (f"chat requests: no measured chat template for {model}; the engine prefills the "
                "prompt as the client counts it, without the template's tokens (set "
                "model.chat_template_tokens to add them)")


@lru_cache(maxsize=1)
def _formats() -> dict:
    return json.loads(TEMPLATES_FILE.read_text(encoding="utf-8"))["formats"]


def preset_template_tokens(model: str, served: str | None = None) -> TemplateTokens | None:
    """The template tokens of preset `model` (measured, or derived from its template where its
    tokenizer is not shipped), None where its chat format is neither or the checkpoint
    `served` (the name the config gives, an alias of the preset) has another
    (`OTHER_TEMPLATE`)."""
    if served is not None and OTHER_TEMPLATE.search(served):
        return None
    name = TOKENIZER_FORMATS.get(sharegpt_tokenizer(model) or "")
    if name is None:
        canonical = canonical_name(model)
        name = DERIVED_FORMATS.get(canonical) if canonical else None
        if name is None:
            return None
    f = _formats()[name]
    how = "derived from its template, not measured" if f.get("derived") else "measured"
    return TemplateTokens(int(f["lead"]), int(f["tail"]),
                          f"{how}: the {name} chat format, simcore/data/models/"
                          "chat_templates.json")
