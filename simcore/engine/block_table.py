"""A request's block table: the KV-cache blocks it holds, in block order, as an int32 array."""

from __future__ import annotations

import numpy as np

from simcore.engine.request import grown


class BlockTable:
    """The ids of the blocks a request holds, in block order: an int32 buffer with room to grow
    and its length.

    It reads as a sequence of ints (`len`, an index, iteration, equality with a list of ints);
    a slice is an int32 view, and `array` the whole table as one, which the compiled pool
    (`simcore.engine.array_pool`) takes as they are: a long prompt's blocks cross between the
    pool and the table without a Python int made for each."""

    __slots__ = ("_buf", "_n")

    def __init__(self, room: int = 0) -> None:
        """An empty table with room for `room` blocks before it grows."""
        self._buf = np.empty(room, dtype=np.int32)
        self._n = 0

    def __len__(self) -> int:
        return self._n

    @property
    def array(self) -> np.ndarray:
        """The blocks as an int32 view (not to be written)."""
        return self._buf[:self._n]

    def _room(self, m: int) -> np.ndarray:
        """The buffer, grown (doubling) to hold at least `m` blocks."""
        buf = self._buf
        if m > len(buf):
            self._buf = buf = grown(buf, m, 0)
        return buf

    def extend(self, blocks) -> None:
        """Append `blocks` (ints, or an int array) in order."""
        n = self._n
        m = n + len(blocks)
        self._room(m)[n:m] = blocks
        self._n = m

    def append(self, b: int) -> None:
        n = self._n
        buf = self._buf
        if n >= len(buf):
            buf = self._room(n + 1)
        buf[n] = b
        self._n = n + 1

    def at(self, i: int) -> int:
        """Block `i` (0 <= i < len), as an int: `self[i]` without its checks."""
        return self._buf.item(i)

    def __getitem__(self, i):
        """Block `i` as an int; a slice as an int32 view."""
        if isinstance(i, slice):
            return self._buf[:self._n][i]
        n = self._n
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("block table index out of range")
        return self._buf.item(i)

    def tolist(self) -> list[int]:
        return self._buf[:self._n].tolist()

    def __iter__(self):
        return iter(self.tolist())

    def __eq__(self, other) -> bool:
        if isinstance(other, BlockTable):
            return self.tolist() == other.tolist()
        if isinstance(other, (list, tuple)):
            return self.tolist() == list(other)
        return NotImplemented

    __hash__ = None

    def __repr__(self) -> str:
        return f"BlockTable({self.tolist()})"
