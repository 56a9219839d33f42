"""Where the reference data shipped inside the package lives: vLLM's recorded scheduler decisions
and Vidur's GPU measurements (each folder's README names its source and licence)."""

from __future__ import annotations

from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent / "data"

CONFORMANCE_DIR = DATA_DIR / "conformance"
"""Scheduler scenarios (`scenarios/*.json.gz`) and what vLLM's own V1 scheduler decided on each,
step by step (`golden/*.jsonl.gz`)."""

VIDUR_DIR = DATA_DIR / "measurements" / "vidur"
"""Vidur's per-op compute and NCCL measurements (`profiling/compute`, `profiling/network`; MIT)."""
