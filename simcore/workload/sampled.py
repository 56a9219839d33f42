"""The sampled datasets of `vllm bench serve` (ShareGPT, custom JSONL): shuffled, filtered, oversampled."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from pathlib import Path

import numpy as np

from simcore.errors import ConfigError, away_from_default
from simcore.workload import files
from simcore.workload.config import CustomDataset, LengthFilter, ShareGPTDataset, TextLengthEstimate
from simcore.workload.keys import (MAX_ROW_BLOCKS, VALUE_LIMIT, check_hash_block, check_hash_count,
                                   hash_block_keys, max_hash_id, row_keys, user_keys)
from simcore.workload.sample import SampleColumns

_Row = tuple[int, int, tuple[int, ...]]
"""A dataset row as sent: prompt tokens, output tokens, content keys."""


def estimate_tokens(text: str, estimate: TextLengthEstimate) -> int:
    """Estimated token count of `text` (see TextLengthEstimate)."""
    if estimate.method == "words":
        return math.ceil(len(text.split()) * estimate.tokens_per_word)
    return math.ceil(len(text) / estimate.chars_per_token)


def sharegpt_samples(ds: ShareGPTDataset, num_prompts: int, *, path: Path, block_size: int,
                     seed: int) -> SampleColumns:
    """First turns of a ShareGPT file (or rows of a lengths CSV), chosen as vLLM's sharegpt dataset does."""
    suffix = path.suffix.lower()
    if suffix == ".json":
        row_ids, prompt_lens, answer_lens = _sharegpt_json(path, ds.text_estimate)
    elif suffix == ".csv":
        row_ids, prompt_lens, answer_lens = _lengths_csv(path)
    else:
        raise ConfigError(f"{path}: a sharegpt dataset is a .json ShareGPT file or a .csv of "
                          "num_prefill_tokens,num_decode_tokens")
    output_lens = answer_lens if ds.output_len is None else np.full(len(row_ids), ds.output_len)
    valid = passes_length_filter(ds.length_filter, prompt_lens, output_lens,
                                 check_output=ds.output_len is None)
    chosen = vllm_order(valid, num_prompts, shuffle=ds.shuffle, seed=seed)
    if chosen.size == 0:
        raise ConfigError(f"{path}: no conversation passes workload.dataset.length_filter "
                          f"({len(row_ids)} with two or more turns)")

    def sample(row: int) -> _Row:
        prompt_len = max(1, int(prompt_lens[row]))
        keys = _row_content_keys(path, int(row_ids[row]), prompt_len, block_size, ())
        return prompt_len, max(1, int(output_lens[row])), keys

    return _build(chosen, sample)


def custom_samples(ds: CustomDataset, num_prompts: int, *, path: Path, block_size: int,
                   seed: int) -> SampleColumns:
    """Lines of a custom JSONL file, chosen as vLLM's custom dataset does (no length filter);
    a line's optional `priority` (a whole number, vLLM's meaning: lower is served first under
    engine.scheduling_policy priority) goes with each request that sends it."""
    rows: list[tuple[int, int, tuple[int, ...]]] = []
    priorities: list[int] = []
    texts = hashes = False      # whether a line gives its prompt as text, its ids as hash_ids
    for row_index, (lineno, obj) in enumerate(files.iter_jsonl(path)):
        where = f"{path}: line {lineno}"
        prompt_len = _custom_prompt_len(obj, where, ds.text_estimate)
        texts = texts or "prompt_len" not in obj
        hashes = hashes or obj.get("hash_ids") is not None
        if ds.output_len is not None:
            output_len = ds.output_len
        else:
            output_len = max(1, files.count_field(obj, "output_len", where))
        keys = _custom_keys(obj, where, prompt_len, block_size, ds.hash_block_tokens)
        rows.append((prompt_len, output_len,
                     _row_content_keys(where, row_index, prompt_len, block_size, keys)))
        priorities.append(_custom_priority(obj, where))
    chosen = vllm_order(np.ones(len(rows), dtype=bool), num_prompts, shuffle=ds.shuffle,
                        seed=seed)
    if chosen.size == 0:
        raise ConfigError(f"{path}: no requests in the file")
    set_ = away_from_default(ds, "text_estimate", "hash_block_tokens")
    for name, used, what in (("text_estimate", texts, "its prompt as text ('prompt')"),
                             ("hash_block_tokens", hashes, "'hash_ids'")):
        if name in set_ and not used:
            raise ConfigError(f"{path}: workload.dataset.{name} has no effect: no line gives "
                              f"{what}; remove it")
    return _build(chosen, lambda row: rows[row],
                  np.array(priorities, dtype=np.int64) if any(priorities) else None)


def _sharegpt_json(path: Path, estimate: TextLengthEstimate
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    data = files.read_json(path)
    if not isinstance(data, list):
        raise ConfigError(f"{path}: expected a JSON list of conversations")
    row_ids, prompt_lens, answer_lens = [], [], []
    for index, entry in enumerate(data):
        if not isinstance(entry, dict):
            raise ConfigError(f"{path}: entry {index}: expected an object with 'conversations'")
        turns = entry.get("conversations")
        if not isinstance(turns, list) or len(turns) < 2:
            continue  # vLLM keeps only conversations with at least two turns
        texts = []
        for turn_index in (0, 1):
            turn = turns[turn_index]
            text = turn.get("value") if isinstance(turn, dict) else None
            if not isinstance(text, str):
                raise ConfigError(f"{path}: entry {index}: conversations[{turn_index}] has no "
                                  "string 'value'")
            texts.append(text)
        row_ids.append(index)
        prompt_lens.append(estimate_tokens(texts[0], estimate))
        answer_lens.append(estimate_tokens(texts[1], estimate))
    return np.array(row_ids, dtype=np.int64), np.array(prompt_lens), np.array(answer_lens)


def read_lengths_csv(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(prompt lengths, answer lengths) of a CSV with columns num_prefill_tokens,
    num_decode_tokens, in file order. A count may be 0 (an empty turn, counted by a tokenizer
    that adds no BOS), as a ShareGPT JSON's estimate may: vLLM's length filter drops such a
    row, and a prompt sent without the filter takes at least one token."""
    prompt_lens, answer_lens = [], []
    for lineno, row in files.iter_csv(path, ("num_prefill_tokens", "num_decode_tokens")):
        where = f"{path}: line {lineno}"
        prompt_lens.append(files.count_field(row, "num_prefill_tokens", where))
        answer_lens.append(files.count_field(row, "num_decode_tokens", where))
    return np.array(prompt_lens, dtype=np.int64), np.array(answer_lens, dtype=np.int64)


def _lengths_csv(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    prompt_lens, answer_lens = read_lengths_csv(path)
    return np.arange(len(prompt_lens)), prompt_lens, answer_lens


def passes_length_filter(flt: LengthFilter | None, prompt_lens: np.ndarray,
                         output_lens: np.ndarray, *, check_output: bool = True) -> np.ndarray:
    """vLLM's is_valid_sequence, vectorised: which samples `flt` keeps (all when it is None)."""
    valid = np.ones(len(prompt_lens), dtype=bool)
    if flt is None:
        return valid
    valid &= prompt_lens >= flt.min_len
    if check_output:
        valid &= output_lens >= flt.min_len
    if flt.max_prompt_len is not None:
        valid &= prompt_lens <= flt.max_prompt_len
    if flt.max_total_len is not None:
        valid &= prompt_lens + output_lens <= flt.max_total_len
    return valid


def vllm_order(valid: np.ndarray, num_prompts: int, *, shuffle: bool, seed: int) -> np.ndarray:
    """The rows `vllm bench serve` sends, in order, as its sharegpt and custom datasets choose
    them with `--seed seed`: the rows shuffled by Python's `random` seeded with it
    (`random.seed(seed); random.shuffle(rows)`; not with --disable-shuffle), the first
    `num_prompts` that are `valid` (its length filter) kept, and when fewer are, the rest drawn
    from those with replacement after seeding again (`random.seed(seed); random.choices`)."""
    order = list(range(len(valid)))
    if shuffle:
        random.Random(seed).shuffle(order)
    chosen = [i for i in order if valid[i]][:num_prompts]
    if 0 < len(chosen) < num_prompts:
        chosen += random.Random(seed).choices(chosen, k=num_prompts - len(chosen))
    return np.asarray(chosen, dtype=np.int64)


def _build(chosen: np.ndarray, make: Callable[[int], _Row],
           priorities: np.ndarray | None = None) -> SampleColumns:
    """Request i sends row chosen[i] (an oversampled row is sent again with the same prompt,
    keys and priority, under its own id); each distinct row is made once, in order of first
    use. `priorities`: each row's priority (None: all 0)."""
    rows, first_use, row_of = np.unique(chosen, return_index=True, return_inverse=True)
    made: list[_Row] = [(0, 0, ())] * len(rows)
    for j in np.argsort(first_use, kind="stable").tolist():
        made[j] = make(int(rows[j]))
    prompt_lens = np.array([m[0] for m in made], dtype=np.int64)
    output_lens = np.array([m[1] for m in made], dtype=np.int64)
    return SampleColumns("r", prompt_lens[row_of], output_lens[row_of], [m[2] for m in made],
                         row_of, None if priorities is None else priorities[chosen])


def _row_content_keys(where: Path | str, row_index: int, prompt_len: int, block_size: int,
                      keys: tuple[int, ...]) -> tuple[int, ...]:
    """`keys`, then row-unique keys for the rest of the prompt's full blocks; `where` (the file,
    or its line) names the row in an error."""
    num_blocks = prompt_len // block_size
    if num_blocks >= MAX_ROW_BLOCKS:
        raise ConfigError(f"{where}: a prompt of {prompt_len:,} tokens is too long to key (at "
                          f"most {MAX_ROW_BLOCKS * block_size - 1:,} at block size {block_size})")
    return keys + row_keys(row_index, len(keys), num_blocks)


def _custom_prompt_len(obj: dict, where: str, estimate: TextLengthEstimate) -> int:
    if "prompt_len" in obj:
        return files.as_count(obj["prompt_len"], where, "prompt_len", 1)
    prompt = obj.get("prompt")
    if prompt is None:
        raise ConfigError(f"{where}: needs 'prompt_len' (tokens) or 'prompt' (text)")
    if not isinstance(prompt, str):
        raise ConfigError(f"{where}: 'prompt' must be a string")
    return max(1, estimate_tokens(prompt, estimate))


PRIORITY_LIMIT = 1 << 63
"""A custom line's priority lies in [-PRIORITY_LIMIT, PRIORITY_LIMIT) (a 64-bit integer)."""


def _custom_priority(obj: dict, where: str) -> int:
    if obj.get("priority") is None:
        return 0
    priority = files.as_whole(obj["priority"], where, "priority", limit=PRIORITY_LIMIT)
    if not -PRIORITY_LIMIT <= priority < PRIORITY_LIMIT:
        raise ConfigError(f"{where}: priority must lie in [-2^63, 2^63), got "
                          f"{files.short(obj['priority'])}")
    return priority


def _custom_keys(obj: dict, where: str, prompt_len: int, block_size: int,
                 hash_block_tokens: int) -> tuple[int, ...]:
    has_keys, has_hashes = obj.get("block_keys") is not None, obj.get("hash_ids") is not None
    if has_keys and has_hashes:
        raise ConfigError(f"{where}: give 'block_keys' or 'hash_ids', not both")
    if has_keys:
        keys = files.as_id_list(obj["block_keys"], where, "block_keys", VALUE_LIMIT - 1)
        return user_keys(keys, prompt_len=prompt_len, block_size=block_size)
    if has_hashes:
        check_hash_block(block_size, hash_block_tokens)
        ids = files.as_id_list(obj["hash_ids"], where, "hash_ids",
                               max_hash_id(block_size, hash_block_tokens))
        check_hash_count(ids, prompt_len, hash_block_tokens, where)
        return hash_block_keys(ids, prompt_len=prompt_len, block_size=block_size,
                               hash_block_tokens=hash_block_tokens)
    return ()

