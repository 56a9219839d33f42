"""Where the reference data shipped inside the package lives: vLLM's recorded scheduler decisions,
Vidur's GPU measurements and dataset lengths (each folder's README names its source and licence)."""

from __future__ import annotations

from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent / "data"

CONFORMANCE_DIR = DATA_DIR / "conformance"
"""Scheduler scenarios (`scenarios/*.json.gz`) and what vLLM's own V1 scheduler decided on each,
step by step (`golden/*.jsonl.gz`)."""

VIDUR_DIR = DATA_DIR / "measurements" / "vidur"
"""Vidur's per-op compute and NCCL measurements (`profiling/compute`, `profiling/network`; MIT)."""

SHAREGPT_FIRST_TURN = DATA_DIR / "datasets" / "sharegpt_v3_first_turn_llama3.csv"
"""The first-turn prompt and reply lengths of ShareGPT's conversations with two or more turns, as
`vllm bench serve --dataset-name sharegpt` takes them, Llama-3 tokens with BOS, unfiltered, in
file order (num_prefill_tokens, num_decode_tokens): `dataset: {kind: sharegpt}` without a path."""

SHAREGPT_FIRST_TURNS = {
    "llama3": SHAREGPT_FIRST_TURN,
    "mistral_v1": DATA_DIR / "datasets" / "sharegpt_v3_first_turn_mistral_v1.csv",
    "qwen3": DATA_DIR / "datasets" / "sharegpt_v3_first_turn_qwen3.csv",
    "o200k": DATA_DIR / "datasets" / "sharegpt_v3_first_turn_o200k.csv",
    "deepseek_v3": DATA_DIR / "datasets" / "sharegpt_v3_first_turn_deepseek_v3.csv",
}
"""The shipped first-turn lengths by tokenizer (`dataset: {kind: sharegpt, tokenizer: ...}`): the
same conversations counted with Llama-3's BPE and with Mistral's 32k SentencePiece (v1: Mistral-7B
v0.1, Mixtral-8x7B), each with one BOS, and with the BPEs of Qwen3, gpt-oss (o200k) and
DeepSeek-V3, each as its Hugging Face tokenizer counts (a BOS for DeepSeek-V3 alone)."""

SHAREGPT_TOKENIZER_NAMES = {"llama3": "Llama-3", "mistral_v1": "Mistral v1", "qwen3": "Qwen3",
                            "o200k": "gpt-oss o200k", "deepseek_v3": "DeepSeek-V3"}
"""The tokenizers of `SHAREGPT_FIRST_TURNS`, as results and notes name them."""
