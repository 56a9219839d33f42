"""Timed request traces (Mooncake JSONL, Azure CSV): requests with their own times, cut to a window."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from simcore.errors import ConfigError, away_from_default
from simcore.workload import files
from simcore.workload.config import AzureDataset, MooncakeDataset
from simcore.workload.keys import (BlockKeys, check_hash_block, check_hash_count,
                                   hash_block_keys_many, max_hash_id)
from simcore.workload.sample import Sample

MS_PER_S = 1000.0


@dataclass(frozen=True, slots=True)
class _Window:
    """The replayed part of a trace: [start_s, start_s + duration_s) in trace seconds."""

    start_s: float
    end_s: float
    time_scale: float

    @staticmethod
    def of(ds: MooncakeDataset | AzureDataset) -> _Window:
        end_s = float("inf") if ds.duration_s is None else ds.start_s + ds.duration_s
        return _Window(ds.start_s, end_s, ds.time_scale)

    def contains(self, t_s: float) -> bool:
        return self.start_s <= t_s < self.end_s

    def run_time_s(self, t_s: float) -> float:
        return (t_s - self.start_s) * self.time_scale


class _Span:
    """The trace times read, so that a window holding none of them can say where they lie."""

    __slots__ = ("count", "first_s", "last_s")

    def __init__(self) -> None:
        self.count = 0
        self.first_s = float("inf")
        self.last_s = float("-inf")

    def add(self, t_s: float) -> None:
        self.count += 1
        if t_s < self.first_s:
            self.first_s = t_s
        if t_s > self.last_s:
            self.last_s = t_s

    def refuse(self, path: Path, window: _Window, num_prompts: int | None) -> None:
        """Raise the ConfigError of a trace that gives the window no request."""
        if not self.count:
            raise ConfigError(f"{path}: no requests in the file")
        if num_prompts == 0:
            return
        end = "its end" if window.end_s == float("inf") else f"{window.end_s:g} s"
        raise ConfigError(f"{path}: no request of the trace falls in the replayed window, "
                          f"{window.start_s:g} s to {end} (workload.dataset.start_s, duration_s); "
                          f"its requests lie from {self.first_s:g} to {self.last_s:g} s")


@dataclass(frozen=True, slots=True)
class MooncakeRow:
    """One request of a Mooncake trace's window: its 1-based line, run time, lengths (output at
    least 1), hash ids as written, and the ids expanded to block keys."""

    lineno: int
    t_s: float
    prompt_len: int
    output_len: int
    hash_ids: tuple[int, ...]
    block_keys: tuple[int, ...] | BlockKeys


def mooncake_rows(ds: MooncakeDataset, num_prompts: int | None, *, path: Path,
                  block_size: int) -> list[MooncakeRow]:
    """The first num_prompts requests of the window, in file order, with hash ids expanded to keys."""
    check_hash_block(block_size, ds.hash_block_tokens)
    id_limit = max_hash_id(block_size, ds.hash_block_tokens)
    window = _Window.of(ds)
    kept: list[tuple[int, float, int, int, list[int]]] = []
    span = _Span()
    hashed = False              # whether a line read gives hash_ids
    for lineno, obj in files.iter_jsonl(path):
        if num_prompts is not None and len(kept) >= num_prompts:
            break
        where = f"{path}: line {lineno}"
        t_s = files.as_seconds(files.field(obj, "timestamp", where), where, "timestamp", MS_PER_S)
        prompt_len = files.count_field(obj, "input_length", where, 1)
        output_len = files.count_field(obj, "output_length", where)
        raw_ids = obj.get("hash_ids")
        ids = [] if raw_ids is None else files.as_id_list(raw_ids, where, "hash_ids", id_limit)
        check_hash_count(ids, prompt_len, ds.hash_block_tokens, where)
        hashed = hashed or raw_ids is not None
        span.add(t_s)
        if window.contains(t_s):
            kept.append((lineno, window.run_time_s(t_s), prompt_len, max(1, output_len), ids))
    if not kept:
        span.refuse(path, window, num_prompts)
    if away_from_default(ds, "hash_block_tokens") and not hashed:
        raise ConfigError(f"{path}: workload.dataset.hash_block_tokens has no effect: no request "
                          f"replayed gives 'hash_ids'; remove it")
    keys = hash_block_keys_many([(ids, prompt_len) for _, _, prompt_len, _, ids in kept],
                                block_size=block_size, hash_block_tokens=ds.hash_block_tokens)
    return [MooncakeRow(lineno, t_s, prompt_len, output_len, tuple(ids), row_keys)
            for (lineno, t_s, prompt_len, output_len, ids), row_keys in zip(kept, keys)]


def mooncake_samples(ds: MooncakeDataset, num_prompts: int | None, *, path: Path,
                     block_size: int) -> list[Sample]:
    """The first num_prompts requests of the window, in file order, with hash ids expanded to keys.

    Request ids are `m{i}`, i the 0-based line index, as in the vLLM conformance scenarios.
    """
    return [Sample(f"m{r.lineno - 1}", r.prompt_len, r.output_len, r.block_keys, r.t_s)
            for r in mooncake_rows(ds, num_prompts, path=path, block_size=block_size)]


def azure_samples(ds: AzureDataset, num_prompts: int | None, *, path: Path) -> list[Sample]:
    """The first num_prompts requests of the window, in file order; ids `a{i}`, i the 0-based row."""
    rows: list[tuple[datetime, int, int]] = []
    for lineno, row in files.iter_csv(path, ("TIMESTAMP", "ContextTokens", "GeneratedTokens")):
        where = f"{path}: line {lineno}"
        stamp = files.field(row, "TIMESTAMP", where)
        try:
            at = datetime.fromisoformat(stamp.strip())
        except ValueError:
            raise ConfigError(f"{where}: TIMESTAMP must be a date-time such as "
                              f"2023-11-16 18:15:46.680590, got {stamp!r}") from None
        rows.append((at,
                     files.count_field(row, "ContextTokens", where, 1),
                     files.count_field(row, "GeneratedTokens", where)))
    if not rows:
        raise ConfigError(f"{path}: no requests in the file (a header and no rows)")
    try:
        first = min(at for at, _, _ in rows)
    except TypeError:
        raise ConfigError(f"{path}: TIMESTAMP mixes times with and without a time zone") from None
    window = _Window.of(ds)
    samples: list[Sample] = []
    span = _Span()
    for index, (at, prompt_len, output_len) in enumerate(rows):
        if num_prompts is not None and len(samples) >= num_prompts:
            break
        t_s = (at - first).total_seconds()
        span.add(t_s)
        if window.contains(t_s):
            samples.append(Sample(f"a{index}", prompt_len, max(1, output_len), (),
                                  window.run_time_s(t_s)))
    if not samples:
        span.refuse(path, window, num_prompts)
    return samples
