"""Content keys of prompt blocks: which sources they come from, and why keys from two sources never collide.

A block key is a 63-bit integer `(namespace << 56) | value`. Each source of content identity owns a
namespace, so keys from different sources can only be equal when they are meant to be:

- `HASH_BLOCK` (0): keys expanded from trace hash ids (Mooncake's `hash_ids`, or `hash_ids` in a
  custom file). A hash id stands for `hash_block_tokens` (512) tokens; with `per = 512 // block_size`
  its blocks get keys `hash_id * per + k` for `k` in `0..per-1`, truncated to
  `prompt_len // block_size` keys. Namespace 0 keeps these keys numerically identical to those of the
  vLLM conformance scenarios (`make_scenarios.py`).
- `USER` (1): `block_keys` written verbatim in a custom file.
- `SHARED_PREFIX` (2): the synthetic prefixes of the `random` and `prefix_repetition` datasets;
  value = `prefix_index << 32 | block_index`.
- `ROW` (3): the content of one row of a sampled dataset (ShareGPT, custom); value =
  `row_index << 24 | block_index`. A row sent twice (vLLM oversamples when a dataset has fewer rows
  than requests) sends the same prompt twice, so both copies carry the same keys.
- `SESSION` (4): the conversation of one session (`simcore.workload.sessions`): prompts, replies
  and new messages of every turn, block by block; value = `session_index << 28 | block_index`.
  Turn j+1's prompt repeats turn j's prompt and reply, so its blocks carry the keys turn j's
  blocks had, generated ones included.
- `TEMPLATE` (5): the full blocks of the tokens a chat template puts before every prompt (its
  system header: `simcore.model.chat_template`); value = `block_index`. They come before the
  prompt's own blocks, whose keys stay as the dataset gives them: the template's leading tokens
  are the same in every request, so two prompts that share their first k blocks still share
  the first k blocks after them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from simcore.errors import ConfigError

NAMESPACE_SHIFT = 56
VALUE_LIMIT = 1 << NAMESPACE_SHIFT
"""Key values (before the namespace is added) must lie in [0, VALUE_LIMIT)."""

HASH_BLOCK = 0
USER = 1
SHARED_PREFIX = 2
ROW = 3
SESSION = 4
TEMPLATE = 5

_PREFIX_INDEX_SHIFT = 32
_ROW_INDEX_SHIFT = 24
MAX_ROW_BLOCKS = 1 << _ROW_INDEX_SHIFT
"""A row's prompt may have at most this many full blocks (268 M tokens at block size 16)."""
_SESSION_INDEX_SHIFT = 28
MAX_SESSION_BLOCKS = 1 << _SESSION_INDEX_SHIFT
"""A session's conversation may have at most this many full blocks."""
MAX_SESSIONS = VALUE_LIMIT >> _SESSION_INDEX_SHIFT


def check_hash_block(block_size: int, hash_block_tokens: int) -> None:
    """Hash ids can be expanded only when the KV block size divides the hash block."""
    if block_size < 1 or hash_block_tokens % block_size:
        raise ConfigError(f"block_size {block_size} does not divide the trace's "
                          f"{hash_block_tokens}-token hash blocks (workload.dataset.hash_block_tokens)")


def check_hash_count(ids: Sequence[int], prompt_len: int, hash_block_tokens: int,
                     where: str) -> None:
    """A prompt of `prompt_len` tokens has one hash id per `hash_block_tokens`-token block, its
    last one partial: more ids than that name blocks it does not have (refused, naming
    `where`)."""
    most = -(-prompt_len // hash_block_tokens)
    if len(ids) > most:
        raise ConfigError(f"{where}: hash_ids gives {len(ids)} ids for a prompt of {prompt_len} "
                          f"tokens, which has {most} block(s) of {hash_block_tokens} "
                          f"(workload.dataset.hash_block_tokens)")


def max_hash_id(block_size: int, hash_block_tokens: int) -> int:
    """Largest hash id whose expanded keys still fit in the value range."""
    return VALUE_LIMIT // (hash_block_tokens // block_size) - 1


class BlockKeys(Sequence):
    """Block keys held as a read-only int64 array (8 bytes a key, where a tuple holds an int
    object and a pointer, about 40): what `hash_block_keys` gives, since an hour of a trace
    holds millions of keys. It reads as the tuple of its keys: its items, slices and
    iteration give Python ints (a slice is a BlockKeys), it equals and hashes as that tuple,
    `+` joins it with a tuple or another BlockKeys, and numpy takes its array as it is
    (`np.asarray(keys)`, no copy)."""

    __slots__ = ("_a",)

    def __init__(self, keys) -> None:
        a = np.asarray(keys, dtype=np.int64)
        if a.flags.writeable:       # a read-only array is taken as it is, any other copied
            a = a.copy()
            a.flags.writeable = False
        self._a = a

    def __len__(self) -> int:
        return len(self._a)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return BlockKeys(self._a[i])
        return int(self._a[i])

    def __iter__(self):
        return iter(self._a.tolist())

    def __array__(self, dtype=None, copy=None):
        if dtype is None or np.dtype(dtype) == self._a.dtype:
            return self._a.copy() if copy else self._a
        return self._a.astype(dtype)

    def __eq__(self, other) -> bool:
        if isinstance(other, BlockKeys):
            return bool(np.array_equal(self._a, other._a))
        if isinstance(other, tuple):
            return len(other) == len(self._a) and self._a.tolist() == list(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self._a.tolist()))

    def __add__(self, other):
        if isinstance(other, (BlockKeys, tuple)):
            return BlockKeys(np.concatenate([self._a, np.asarray(other, dtype=np.int64)]))
        return NotImplemented

    def __radd__(self, other):
        if isinstance(other, tuple):
            return BlockKeys(np.concatenate([np.asarray(other, dtype=np.int64), self._a]))
        return NotImplemented

    def __repr__(self) -> str:
        return repr(tuple(self._a.tolist()))

    def __reduce__(self):
        return BlockKeys, (self._a,)


def hash_block_keys(hash_ids: Sequence[int], *, prompt_len: int, block_size: int,
                    hash_block_tokens: int) -> BlockKeys | tuple[()]:
    """Expand hash ids of `hash_block_tokens`-token blocks into `block_size`-token block keys
    (a `BlockKeys`; () for none): `hash_block_keys_many` of one row.

    `block_size` must divide `hash_block_tokens` (the caller checks); ids must be in
    [0, max_hash_id(...)].
    """
    return hash_block_keys_many([(hash_ids, prompt_len)], block_size=block_size,
                                hash_block_tokens=hash_block_tokens)[0]


def hash_block_keys_many(rows: Sequence[tuple[Sequence[int], int]], *, block_size: int,
                         hash_block_tokens: int) -> list[BlockKeys | tuple[()]]:
    """`hash_block_keys` of each (hash ids, prompt length) of `rows`, expanded in one pass: the
    used ids of all rows expanded into one read-only array, each row's `BlockKeys` a view of its
    part (a trace's rows number in the thousands, and numpy's few microseconds a call would be
    most of expanding them one by one)."""
    per = hash_block_tokens // block_size
    used = [min(len(ids), -(-(n // block_size) // per)) for ids, n in rows]
    flat = np.fromiter((i for (ids, _), u in zip(rows, used) for i in ids[:u]),
                       dtype=np.int64, count=sum(used))
    keys = (flat[:, None] * per + np.arange(per, dtype=np.int64)).ravel()
    keys |= HASH_BLOCK << NAMESPACE_SHIFT
    keys.flags.writeable = False
    out: list[BlockKeys | tuple[()]] = []
    start = 0
    for (_, n), u in zip(rows, used):
        count = min(u * per, n // block_size)
        out.append(BlockKeys(keys[start:start + count]) if count > 0 else ())
        start += u * per
    return out


def user_keys(keys: Sequence[int], *, prompt_len: int, block_size: int) -> tuple[int, ...]:
    """Namespace verbatim per-block keys, truncated to the prompt's full blocks."""
    tag = USER << NAMESPACE_SHIFT
    return tuple(tag | k for k in keys[: prompt_len // block_size])


def shared_prefix_keys(prefix_index: int, num_blocks: int) -> tuple[int, ...]:
    """Keys of the first `num_blocks` full blocks of synthetic prefix number `prefix_index`."""
    base = (SHARED_PREFIX << NAMESPACE_SHIFT) | (prefix_index << _PREFIX_INDEX_SHIFT)
    return tuple(range(base, base + num_blocks))


def template_keys(num_blocks: int) -> tuple[int, ...]:
    """Keys of the first `num_blocks` full blocks of the chat template's leading tokens."""
    base = TEMPLATE << NAMESPACE_SHIFT
    return tuple(range(base, base + num_blocks))


def row_keys(row_index: int, start_block: int, end_block: int) -> tuple[int, ...]:
    """Keys of blocks [start_block, end_block) of dataset row `row_index` (end_block <= MAX_ROW_BLOCKS)."""
    base = (ROW << NAMESPACE_SHIFT) | (row_index << _ROW_INDEX_SHIFT)
    return tuple(range(base + start_block, base + end_block))


def session_key_base(session_index: int) -> int:
    """Key of block 0 of session `session_index`'s conversation; block b's key is base + b
    (b < MAX_SESSION_BLOCKS)."""
    if not 0 <= session_index < MAX_SESSIONS:
        raise ConfigError(f"session index {session_index} is outside [0, {MAX_SESSIONS})")
    return (SESSION << NAMESPACE_SHIFT) | (session_index << _SESSION_INDEX_SHIFT)
