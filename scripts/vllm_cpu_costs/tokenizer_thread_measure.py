"""Whether tokenizing on a worker thread holds up the API server's event loop.

vLLM's OpenAI server tokenizes each prompt on a one-worker thread pool beside its asyncio event
loop (`make_async(tokenizer, executor=ThreadPoolExecutor(max_workers=1))`; 0.10 to 0.2x batch the
queued prompts into one call, `AsyncMicrobatchTokenizer`; 0.3x's renderer keeps the one-worker
pool). Whether that thread competes with the event loop for the CPU depends on the GIL: the Hugging
Face tokenizer encodes in Rust and may release it. This measures it directly: a pure-Python
workload (the event loop's stand-in) runs alone, then beside a thread that tokenizes prompts back to
back with the tokenizer as vLLM loads it (transformers' `AutoTokenizer`, a fast tokenizer); and the
tokenizer's own rate, alone and beside the workload.

    python tokenizer_thread_measure.py --tokenizer Qwen3=/tmp/qwen3-8b "Llama 3=/tmp/llama3-tok" \
        --out tokenizer_thread.json
    python tokenizer_thread_measure.py --refit tokenizer_thread.json   # the fits again

Each run's `fit` is least squares t = a + c x tokens over its tokenizing-alone medians (weighted
by 1/t, a >= 0): what one prompt of n tokens costs the tokenizer thread.

Prompts are random token ids decoded to text, as `vllm bench serve --dataset-name random` makes
them. Needs two idle cores (the two threads run at once when the GIL allows).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import threading
import time


def busy(iters: int) -> int:
    """A pure-Python workload that holds the GIL the whole time it runs."""
    s = 0
    for i in range(iters):
        s += i * i % 7
    return s


def tokenize_alone(tok, prompt: str, reps: int) -> float:
    t = time.perf_counter()
    for _ in range(reps):
        tok(prompt)
    return (time.perf_counter() - t) / reps


def beside(tok, prompt: str, iters: int) -> tuple[float, float]:
    """(seconds the workload took, tokenizations per second) with a tokenizing thread beside it."""
    stop = threading.Event()
    done = [0]

    def worker() -> None:
        while not stop.is_set():
            tok(prompt)
            done[0] += 1

    th = threading.Thread(target=worker)
    th.start()
    time.sleep(0.05)
    before = done[0]
    t = time.perf_counter()
    busy(iters)
    took = time.perf_counter() - t
    after = done[0]
    stop.set()
    th.join()
    return took, (after - before) / took


def fit(points: list[tuple[int, float]]) -> dict:
    """Least squares t = a + c * tokens on (tokens, seconds) points, each weighted by 1/t
    (relative errors count evenly), a kept at 0 or above."""
    import numpy as np

    n = np.array([p[0] for p in points], dtype=float)
    t = np.array([p[1] for p in points], dtype=float)
    w = 1.0 / t
    (a, c), *_ = np.linalg.lstsq(np.stack([w, n * w], axis=1), t * w, rcond=None)
    if a < 0:
        a, c = 0.0, float(np.sum(n * t * w * w) / np.sum(n * n * w * w))
    worst = float(np.max(np.abs(a + c * n - t) / t))
    return {"a": float(a), "c_per_token": float(c), "points": len(points),
            "max_rel_residual": worst, "weighting": "1/median"}


def refit(path: str) -> None:
    """Recompute each run's `fit` of its tokenizing-alone medians in a written file."""
    with open(path) as f:
        data = json.load(f)
    for run in data["runs"]:
        run["fit"] = _fit_of(run)
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")


def measure_run(label: str, path: str, lengths: str, iters: int, trials: int) -> dict:
    """One tokenizer's run: the workload alone, then per prompt length the tokenizer alone and
    beside the workload; with the fit of its tokenizing-alone medians."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    rng = random.Random(0)
    alone = [0.0] * trials
    for k in range(trials):
        t = time.perf_counter()
        busy(iters)
        alone[k] = time.perf_counter() - t
    run = {"tokenizer": label, "workload_alone_s": {"median": statistics.median(alone),
                                                    "all": alone}, "lengths": []}
    for n in (int(x) for x in lengths.split(",")):
        ids = [rng.randrange(1000, min(tok.vocab_size, 100_000)) for _ in range(n)]
        prompt = tok.decode(ids)
        tokens = len(tok(prompt).input_ids)
        tokenize_alone(tok, prompt, 3)
        reps = max(3, int(0.3 / max(tokenize_alone(tok, prompt, 3), 1e-4)))
        t_alone = [tokenize_alone(tok, prompt, reps) for _ in range(trials)]
        runs = [beside(tok, prompt, iters) for _ in range(trials)]
        took = [r[0] for r in runs]
        rate = [r[1] for r in runs]
        row = {"prompt_tokens": tokens,
               "tokenize_alone_s": statistics.median(t_alone),
               "workload_beside_s": statistics.median(took),
               "workload_slowdown": statistics.median(took) / statistics.median(alone),
               "tokenize_rate_beside_per_s": statistics.median(rate),
               "tokenize_rate_alone_per_s": 1 / statistics.median(t_alone),
               "trials": {"tokenize_alone_s": t_alone, "workload_beside_s": took,
                          "tokenize_rate_beside_per_s": rate}}
        run["lengths"].append(row)
        share = row["tokenize_rate_beside_per_s"] / row["tokenize_rate_alone_per_s"]
        print(f"{label}, {tokens} tokens: tokenize {row['tokenize_alone_s'] * 1e3:.2f} ms alone; "
              f"workload x{row['workload_slowdown']:.2f} beside a tokenizing thread; "
              f"tokenizer at {share:.0%} of its rate alone", flush=True)
    run["fit"] = _fit_of(run)
    return run


def _fit_of(run: dict) -> dict:
    return fit([(r["prompt_tokens"], r["tokenize_alone_s"]) for r in run["lengths"]])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--refit", metavar="FILE", help="only recompute the fits of a written file")
    ap.add_argument("--tokenizer", nargs="+", metavar="LABEL=DIR",
                    help="tokenizers to measure, each a label and a directory with tokenizer.json")
    ap.add_argument("--lengths", default="256,2048,8192")
    ap.add_argument("--iters", type=int, default=3_000_000, help="the workload's size")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--out", help="the file to write (with --tokenizer)")
    args = ap.parse_args()
    if args.refit:
        refit(args.refit)
        return
    if not args.tokenizer or not args.out:
        ap.error("--tokenizer and --out are required")

    import tokenizers
    import transformers

    busy(args.iters // 10)
    out = {"format": "simcore-tokenizer-thread", "version": 1,
           "python": sys.version.split()[0], "tokenizers": tokenizers.__version__,
           "transformers": transformers.__version__, "machine": platform.machine(),
           "cores": os.cpu_count(), "switch_interval_s": sys.getswitchinterval(),
           "tokenizers_parallelism": os.environ.get("TOKENIZERS_PARALLELISM"),
           "measured_at": time.strftime("%Y-%m-%d"), "runs": []}
    for spec in args.tokenizer:
        label, _, path = spec.partition("=")
        out["runs"].append(measure_run(label, path, args.lengths, args.iters, args.trials))
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
