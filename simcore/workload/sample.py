"""A dataset's requests before the client gives them send times: one Sample, or columns of them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from simcore.workload.keys import BlockKeys


@dataclass(frozen=True, slots=True)
class Sample:
    """One request as a dataset yields it: lengths, content identity and, for timed traces, a time.

    `timestamp_s` is the request's time in the replayed trace window (time scale applied), or None
    for datasets without timing; `block_keys` follow `RequestSpec`'s meaning.
    """

    request_id: str
    prompt_len: int
    output_len: int
    block_keys: tuple[int, ...] | BlockKeys = ()
    timestamp_s: float | None = None
    priority: int = 0


class SampleColumns(Sequence[Sample]):
    """A dataset's samples kept as columns, a few numbers a request instead of an object, each
    Sample made when it is read (a run of millions of requests holds no list of them).

    Sample i is request `{id_prefix}{i}` with `prompt_lens[i]` and `output_lens[i]` tokens and
    the content keys `keys[key_index[i]]` (`keys[0]` for every request when `key_index` is
    None: one shared prefix, or none) and the priority `priorities[i]` (0 for every request
    when `priorities` is None). Immutable after construction."""

    def __init__(self, id_prefix: str, prompt_lens: np.ndarray, output_lens: np.ndarray,
                 keys: Sequence[tuple[int, ...]] = ((),), key_index: np.ndarray | None = None,
                 priorities: np.ndarray | None = None):
        if len(prompt_lens) != len(output_lens) or any(
                column is not None and len(column) != len(prompt_lens)
                for column in (key_index, priorities)):
            raise ValueError("every column needs one entry a sample")
        self._id_prefix = id_prefix
        self._prompt_lens = prompt_lens
        self._output_lens = output_lens
        self._keys = keys
        self._key_index = key_index
        self._priorities = priorities

    @property
    def has_priorities(self) -> bool:
        """Whether some sample has a priority other than 0 (vLLM's default)."""
        p = self._priorities
        return p is not None and bool(np.any(p != 0))

    def __len__(self) -> int:
        return len(self._prompt_lens)

    def __getitem__(self, i):  # type: ignore[override]  (integer indices only)
        i = int(i)
        if not 0 <= i < len(self):
            raise IndexError(i)
        keys = self._keys[0 if self._key_index is None else int(self._key_index[i])]
        priority = 0 if self._priorities is None else int(self._priorities[i])
        return Sample(f"{self._id_prefix}{i}", int(self._prompt_lens[i]),
                      int(self._output_lens[i]), keys, priority=priority)
