"""How much memory a simulation needs, estimated from its configuration before anything is
generated, and how much this machine can give: a run that cannot fit is refused up front
instead of swapping or being killed hours in.

The per-request figures were measured on `dse simulate` (peak resident memory, the bounds
envelope, the result written with --out) with the random dataset at 10k-40k requests and
16-512 output tokens, as the slope between two request counts: about 1.8 KB a request plus
about 40 bytes an output token (the client's token times, the summary's per-token arrays, the
result's row for the request). Rounded up here.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from simcore.config import SimConfig
from simcore.errors import ConfigError
from simcore.workload.config import (SESSION_DATASETS, TIMED_TRACES, PrefixRepetitionDataset,
                                     RandomDataset, count_bounds)

REQUEST_BYTES = 2_000
"""Memory a request holds until the result is written, apart from its output tokens."""

OUTPUT_TOKEN_BYTES = 40
"""Memory an output token holds at the run's peak (the summary of its token times)."""

BASE_BYTES = 200 * 2**20
"""Memory of a run before its first request: interpreter, libraries, model, KV-cache tables."""

GIB = 2**30


def output_tokens_per_request(cfg: SimConfig) -> tuple[float, bool]:
    """The mean output tokens a request, and whether that is known from the config (False: the
    lengths come from a data file, and 1, the least a request has, is used)."""
    ds = cfg.workload.dataset
    if isinstance(ds, RandomDataset):
        r = ds.range_ratio
        low = max(math.floor(ds.output_len * (1 - r)), 1)
        high = max(math.ceil(ds.output_len * (1 + r)), 1)
        return (low + high) / 2, True
    if isinstance(ds, PrefixRepetitionDataset):
        return float(ds.output_len), True
    if isinstance(ds, SESSION_DATASETS):
        low, high = count_bounds(ds.reply_len)
        return (low + high) / 2, True
    output_len = getattr(ds, "output_len", None)
    return (float(output_len), True) if output_len is not None else (1.0, False)


def estimate_run_bytes(cfg: SimConfig) -> int | None:
    """Peak memory of simulating `cfg`, or None when the number of requests is only known from
    a trace file (a trace window holds what the file holds)."""
    if isinstance(cfg.workload.dataset, TIMED_TRACES):
        return None
    tokens, _ = output_tokens_per_request(cfg)
    per_request = REQUEST_BYTES + OUTPUT_TOKEN_BYTES * tokens
    return int(BASE_BYTES + cfg.workload.resolved_num_prompts * per_request)


def available_memory_bytes() -> int | None:
    """Memory this process can still take: the kernel's MemAvailable, or less under a cgroup
    (container) limit; None where neither can be read."""
    found = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    if not found:
        try:
            found.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (OSError, ValueError, AttributeError):
            pass
    cgroup = Path("/sys/fs/cgroup")
    try:
        limit = (cgroup / "memory.max").read_text().strip()
        if limit != "max":
            found.append(int(limit) - int((cgroup / "memory.current").read_text()))
    except (OSError, ValueError):
        pass
    return max(min(found), 0) if found else None


MAX_OUTPUT_TOKENS = 10_000_000
"""More output tokens a request than any model's context window (the longest are a few million
tokens): a run refused for its memory at such lengths is refused for the lengths."""


def check_fits(cfg: SimConfig, available_bytes: int | None) -> None:
    """Refuse, naming workload.num_prompts, a run whose estimated memory exceeds
    `available_bytes` (None: unknown, nothing is refused)."""
    need = estimate_run_bytes(cfg)
    if need is None or available_bytes is None or need <= available_bytes:
        return
    tokens, known = output_tokens_per_request(cfg)
    if known and tokens > MAX_OUTPUT_TOKENS:
        # Fewer requests would not help: each one's output is past any model's context.
        raise ConfigError(
            f"workload.dataset: {tokens:,.0f} output tokens a request are past any model's "
            f"context ({MAX_OUTPUT_TOKENS:,} tokens) and would need {need / GIB:,.1f} GiB to "
            f"simulate; lower the dataset's output length")
    per_request = REQUEST_BYTES + OUTPUT_TOKEN_BYTES * tokens
    each = (f"{per_request:,.0f} bytes a request with {tokens:g} output tokens each" if known
            else f"at least {per_request:,.0f} bytes a request")
    field = "num_prompts"
    if isinstance(cfg.workload.dataset, SESSION_DATASETS):
        field = "dataset.num_sessions"     # its sessions' turns, at most
    raise ConfigError(
        f"workload.{field}: {cfg.workload.resolved_num_prompts:,} requests need about "
        f"{need / GIB:,.1f} GiB of memory ({each}), more than the {available_bytes / GIB:,.1f} "
        f"GiB this machine has available; lower {field.split('.')[-1]} or free memory")
