"""vLLM's Triton attention backend against FlashAttention 2, measured on the same GPU.

vLLM serves a model with attention sinks (gpt-oss) with its Triton backend (TRITON_ATTN) on a GPU
whose FlashAttention has no sinks (FlashAttention 2: Ampere, Ada), and the kernel profiles
measured FlashAttention's kernels there, or none of that head shape. AIConfigurator measured
both kernels on one such GPU, the L40S (Ada), in vLLM 0.24: the context (prefill) tables of
`vllm_triton_attn` and `vllm_flash_attn_fa2` share seven head shapes of dimension 192 (1/1,
2/1, 4/1, 8/1, 16/1, 32/2 and 64/4 query/KV heads), their batch sizes and prompt lengths.
Their ratio is what this module fits:

    ratio(batch, prompt) = median over the shared head shapes of
                           t_triton(shape, batch, prompt) / t_fa2(shape, batch, prompt)

(each kernel's median latency per cell), full attention only. From 1,024-token prompts the
Triton kernel takes about 2-2.5x FlashAttention 2's time (per length, the median over batches
and shapes 2.0 at 1,024 tokens, 2.25 at 4,096, 2.4 at 16,384); under 128 tokens 0.6-1.4x
(median 0.9): there the kernels' fixed costs differ, not their rate. Its prefill tile is 16
query rows (two positions of eight query heads per KV head) against FlashAttention's 64-128,
so each K/V tile it loads serves a few times fewer queries.

What the ratio does not separate: the Triton rows were measured with an fp8 KV cache (K and V
converted to 16 bits in the kernel, at half the bytes), the FlashAttention 2 rows with a 16-bit
one; the head dimension is 192, not gpt-oss's 64; and vLLM 0.24's Triton kernel, not the
earlier releases' (later releases tuned it, so earlier ones are not faster). The spread over
the head shapes is recorded per cell.

Applied to full-attention layers only. The two kernels' sliding-window (128) context tables,
from 1,024-token prompts, are within 6% of each other at gpt-oss's per-GPU head shapes of TP 1,
2 and 4 (64/8, 32/4, 16/2: 0.94-1.06x at the median); with one KV head per GPU (TP 8) the
Triton kernel takes 1.4x, on a part of the prefill that is small beside the full layers'.
Decode attention is not compared: the fp8 KV cache halves the bytes a memory-bound decode reads.

`fit_triton_context_ratio` computes the table from the installed `aiconfigurator-core`;
`scripts/fit_triton_attention.py` writes it to
`simcore/data/profiles/derived/triton-attention-l40s.json`, which `context_ratio` reads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from simcore.calibration.grid import LogGrid
from simcore.errors import ConfigError

FORMAT = "simcore-triton-attention"
VERSION = 1
SYSTEM = "l40s"
TRITON = "vllm_triton_attn"
REFERENCE = "vllm_flash_attn_fa2"
SHIPPED = Path(__file__).resolve().parent.parent / "data" / "profiles" / "derived" / \
    "triton-attention-l40s.json"
LONG_PROMPT = 1024
"""The prompt length from which the summary quantiles are taken (the regime of long prefills)."""


def fit_triton_context_ratio(root: Path | None = None, system: str = SYSTEM) -> dict:
    """The ratio table of vLLM's Triton context attention to FlashAttention 2's on `system`
    (its newest vLLM context-attention table), as the shipped JSON holds it."""
    from simcore.calibration.aiconfigurator import (
        PACKAGE, _Reader, _round, data_root, package_version)

    root = root or data_root()
    reader = _Reader(root, system)
    df = reader.table("attention", "context_attention_perf.parquet")
    if df is None:
        raise ConfigError(f"{PACKAGE}: no vLLM context-attention table for {system!r}")
    if "window_size" in df.columns:
        df = df[df["window_size"] == 0]
    df = df[df["beam_width"] == 1] if "beam_width" in df.columns else df
    if "attn_dtype" in df.columns:
        df = df[df["attn_dtype"] == "bfloat16"]
    shape = ["num_heads", "num_key_value_heads", "head_dim"]
    cell = shape + ["batch_size", "isl"]
    kv_dtypes = {}
    parts = []
    for kernel in (TRITON, REFERENCE):
        rows = df[df["kernel_source"] == kernel]
        if rows.empty:
            raise ConfigError(f"{PACKAGE}: {system!r} has no {kernel} context-attention rows")
        # One KV-cache dtype per kernel: the 16-bit one where measured, else the most measured.
        counts = rows["kv_cache_dtype"].value_counts()
        kv = "bfloat16" if "bfloat16" in counts.index else str(counts.index[0])
        kv_dtypes[kernel] = kv
        rows = rows[rows["kv_cache_dtype"] == kv]
        parts.append(rows.groupby(cell)["latency"].median().reset_index())
    tri, ref = parts
    both = tri.merge(ref, on=cell, suffixes=("_t", "_r"))
    both = both[(both["latency_t"] > 0) & (both["latency_r"] > 0)]
    if both.empty:
        raise ConfigError(f"{PACKAGE}: {system!r} has no head shape measured with both "
                          f"{TRITON} and {REFERENCE}")
    both["ratio"] = both["latency_t"] / both["latency_r"]
    shapes = sorted({tuple(int(v) for v in row) for row in both[shape].to_numpy()})
    batches = sorted(int(b) for b in both["batch_size"].unique())
    prompts = sorted(int(s) for s in both["isl"].unique())
    grid = both.groupby(["batch_size", "isl"])["ratio"]
    ratio = np.full((len(batches), len(prompts)), np.nan)
    low = np.full_like(ratio, np.nan)
    high = np.full_like(ratio, np.nan)
    for (b, s), r in grid:
        i, j = batches.index(int(b)), prompts.index(int(s))
        ratio[i, j] = float(np.median(r))
        low[i, j] = float(r.min())
        high[i, j] = float(r.max())
    long = both[both["isl"] >= LONG_PROMPT]["ratio"]

    def rows(a):
        return [[None if not np.isfinite(x) else _round(float(x)) for x in row] for row in a]

    return {
        "format": FORMAT, "version": VERSION,
        "provenance": {
            "source": f"NVIDIA AIConfigurator's kernel database ({PACKAGE} {package_version()}, "
                      "Apache-2.0): vLLM's context-attention kernels measured on one GPU",
            "package": PACKAGE, "package_version": package_version(), "system": system,
            "device": reader.device, "files": reader.files,
            "kernels": {"triton": TRITON, "reference": REFERENCE},
            "kv_cache_dtypes": kv_dtypes,
            "shapes": [list(s) for s in shapes],
            "method": "per cell (batch, prompt tokens) and head shape the median latency of "
                      "each kernel (16-bit queries, the KV-cache dtype of kv_cache_dtypes); the "
                      "ratio Triton / FlashAttention 2 per shape; the median over the shapes "
                      "(low and high: their least and greatest); full attention (window 0) "
                      "only"},
        "batch": batches, "prompt": prompts,
        "ratio": rows(ratio), "low": rows(low), "high": rows(high),
        "long_prompt_quantiles": {
            "from_prompt": LONG_PROMPT, "n": int(len(long)),
            "p10": _round(float(np.quantile(long, 0.1))),
            "median": _round(float(np.median(long))),
            "p90": _round(float(np.quantile(long, 0.9)))},
    }


@dataclass(frozen=True)
class ContextRatio:
    """The fitted ratio as a function of (batch, prompt tokens): log-linear interpolation on the
    measured grid; flat past its ends; a batch a prompt length was not measured at (the
    largest batches of the longest prompts, past the GPU's memory) takes the largest batch
    measured at that length."""

    grid: LogGrid
    median_long: float
    p10_long: float
    p90_long: float
    device: str
    package_version: str
    vllm_version: str

    def __call__(self, batch: float, prompt: float) -> float:
        r = self.grid(batch, prompt)      # below an axis's first value: that value's
        return 1.0 if r is None else r

    def describe(self) -> str:
        return (f"vLLM's Triton context attention measured against FlashAttention 2 on "
                f"{self.device} (AIConfigurator {self.package_version}, vLLM "
                f"{self.vllm_version}): "
                f"x{self.median_long:.2f} at the median from {LONG_PROMPT:,}-token prompts "
                f"(10th-90th percentile x{self.p10_long:.2f}-x{self.p90_long:.2f}), by batch "
                "and prompt length")


def ratio_from(data: dict) -> ContextRatio:
    """The `ContextRatio` of a table as `fit_triton_context_ratio` returns it."""
    if data.get("format") != FORMAT or data.get("version") != VERSION:
        raise ConfigError(f"Triton attention table: format {data.get('format')!r} version "
                          f"{data.get('version')!r}, expected {FORMAT!r} version {VERSION}")
    values = np.array([[np.nan if x is None else float(x) for x in row]
                       for row in data["ratio"]])
    for j in range(values.shape[1]):        # the largest measured batch, carried up
        col = values[:, j]
        seen = np.where(np.isfinite(col))[0]
        if len(seen):
            col[seen[-1] + 1:] = col[seen[-1]]
    grid = LogGrid([data["batch"], data["prompt"]], values, caps=(0.0, 0.0), floors=(0.0, 0.0))
    q = data["long_prompt_quantiles"]
    prov = data["provenance"]
    files = prov.get("files") or [{}]
    return ContextRatio(grid, float(q["median"]), float(q["p10"]), float(q["p90"]),
                        str(prov.get("device", "unknown")), str(prov.get("package_version")),
                        str(files[0].get("framework_version", "unknown")))


@lru_cache(maxsize=1)
def context_ratio() -> ContextRatio:
    """The shipped ratio table (`SHIPPED`), read once."""
    try:
        data = json.loads(SHIPPED.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConfigError(f"{SHIPPED}: cannot be read ({e})") from None
    return ratio_from(data)
