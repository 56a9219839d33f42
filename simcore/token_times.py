"""A request's token arrival times held as ranges of its engine's delivery log, and the pooled
inter-token gaps of a run made from them a block of requests at a time, with the statistics
numpy would give on the whole array, to the bit, without ever holding it (but a short run's,
kept between the passes over it)."""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable
from itertools import chain

import numpy as np


class TokenTimes:
    """A request's token arrival times as they reach the client, in order, held as ranges of
    its engine's delivery log (`DeliveryLog`: one entry per step that delivered tokens, shared
    by every request of the engine) where they come from one, and as single times otherwise, so
    that a request costs a few words however many tokens it streams. Reads like a sequence of
    floats: `len`, iteration (flat, in order), `[i]` and `numpy.asarray`."""

    __slots__ = ("_parts", "_log", "_a", "_b", "_n")

    def __init__(self, times: Iterable[float] = ()) -> None:
        # Single times and closed ranges (log, a, b), in order; None until there is one (a
        # request whose tokens all come from one range of one log, most of them, has none).
        self._parts: list | None = [float(t) for t in times] or None
        self._log = None                                  # the open range: _log[_a:_b]
        self._a = self._b = 0
        self._n = len(self._parts) if self._parts else 0

    @classmethod
    def of_range(cls, log: "DeliveryLog", a: int, b: int) -> TokenTimes:
        """One token at each of `log`'s entries a .. b - 1."""
        t = cls()
        if a < b:
            t._log, t._a, t._b, t._n = log, a, b, b - a
        return t

    def single_range(self) -> tuple | None:
        """(log, a, b) when the times are exactly one range of one delivery log, else None."""
        if self._parts is None and self._log is not None:
            return self._log, self._a, self._b
        return None

    def _add_part(self, part) -> None:
        if self._parts is None:
            self._parts = [part]
        else:
            self._parts.append(part)

    def _close(self) -> None:
        if self._b > self._a:
            self._add_part((self._log, self._a, self._b))
        self._log = None
        self._a = self._b = 0

    def append(self, t: float) -> None:
        """One token at `t`, not from a delivery log."""
        if self._log is not None:
            self._close()
        self._add_part(t)
        self._n += 1

    def add_step(self, log: "DeliveryLog", i: int) -> None:
        """One token at `log`'s entry i (a step's delivery): the open range grows when it
        ends there, as it does step after step."""
        if self._b == i and self._log is log:
            self._b = i + 1
            self._n += 1
        else:
            self.add_range(log, i, i + 1)

    def add_range(self, log: "DeliveryLog", a: int, b: int) -> None:
        """One token at each of `log`'s entries a .. b - 1 (a < b)."""
        if log is self._log and a == self._b:
            self._b = b
        else:
            if self._log is not None:
                self._close()
            if a < b:
                self._log, self._a, self._b = log, a, b
        self._n += b - a

    def _chunks(self):
        for p in self._parts or ():
            if type(p) is tuple:
                log, a, b = p
                yield log.times[a:b]
            else:
                yield (p,)
        if self._b > self._a:
            yield self._log.times[self._a:self._b]

    def __len__(self) -> int:
        return self._n

    def __iter__(self):
        return chain.from_iterable(self._chunks())

    def __getitem__(self, i: int) -> float:
        if not isinstance(i, int):
            raise TypeError("token times are indexed by an integer")
        n = self._n
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("token index out of range")
        if i == n - 1 and self._b > self._a:
            return self._log.times[self._b - 1]
        if i == 0:                  # the first token, without copying a range
            if not self._parts:
                return self._log.times[self._a]
            p = self._parts[0]
            return p[0].times[p[1]] if type(p) is tuple else p
        for c in self._chunks():
            if i < len(c):
                return c[i]
            i -= len(c)
        raise IndexError("token index out of range")   # unreachable: counts are kept

    def to_array(self) -> np.ndarray:
        """The times as a new float64 array: each range of a delivery log copied whole, not
        token by token."""
        pieces = []
        for p in self._parts or ():
            if type(p) is tuple:
                log, a, b = p
                pieces.append(np.frombuffer(log.times[a:b], dtype=np.float64))
            else:
                pieces.append(np.array((p,), dtype=np.float64))
        if self._b > self._a:
            pieces.append(np.frombuffer(self._log.times[self._a:self._b], dtype=np.float64))
        if len(pieces) == 1:
            return pieces[0]
        return np.concatenate(pieces) if pieces else np.empty(0, dtype=np.float64)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        a = self.to_array()
        return a if dtype is None else a.astype(dtype, copy=False)

    def __eq__(self, other) -> bool:
        try:
            return len(other) == self._n and all(a == b for a, b in zip(self, other))
        except TypeError:
            return NotImplemented

    __hash__ = None

    def __repr__(self) -> str:
        return f"TokenTimes({list(self)!r})"


def _float_array(times) -> np.ndarray:
    """A record's token times as a float64 array (`TokenTimes` or a sequence of floats)."""
    if type(times) is TokenTimes:
        return times.to_array()
    return np.asarray(times, dtype=np.float64)


class DeliveryLog:
    """An engine's token-delivery instants, one per step that delivered tokens to clients, in
    order (`array('d')`, 8 bytes a step); requests' `TokenTimes` hold ranges of it."""

    __slots__ = ("times",)

    def __init__(self) -> None:
        self.times = array("d")


def pairwise_sum(x: np.ndarray | None, part=None, leaf: int = 1 << 16,
                 size: int | None = None) -> float:
    """`np.add.reduce(x)` of a contiguous float64 array to the bit, by numpy's own pairwise
    summation tree (halves rounded down to a multiple of 8, recursively), reducing leaves of at
    most `leaf` (at least 128) elements with numpy itself: the same tree, with `part(a, b)`
    (default `x[a:b]`) giving each leaf's values, so that a sum of a transform of `x`, or of
    values made as they are read (`size` of them, no `x`), never holds all of them. Leaves are
    asked for in order, each starting where the last ended."""
    get = part if part is not None else (lambda a, b: x[a:b])
    leaf = max(leaf, 128)       # numpy sums at most 128 elements without splitting

    def rec(a: int, m: int) -> float:
        if m <= leaf:
            return np.add.reduce(get(a, a + m))
        m2 = m // 2
        m2 -= m2 % 8
        left = rec(a, m2)
        return left + rec(a + m2, m - m2)
    return rec(0, x.size if size is None else size)


def blockwise_std(x: np.ndarray) -> np.float64:
    """`np.std(x)` to the bit without its full-size temporary (x - mean)**2: the same
    deviations, squared a block at a time and summed in numpy's tree (`pairwise_sum`)."""
    if x.size <= _BLOCK:
        return np.std(x)
    n = x.size
    mean = np.add.reduce(x) / n
    return np.sqrt(pairwise_sum(x, lambda a, b: np.square(x[a:b] - mean), leaf=_BLOCK) / n)


_BLOCK = 1 << 20
"""Elements per pass of the array work on per-token arrays (bounds their temporaries)."""

_KEPT_BLOCKS = 8
"""Most gaps `PooledGaps.scan` keeps for the passes after it, in `_BLOCK`s (64 MB of them): a
run with more makes them again on each pass, so that it never holds them all."""

_KEY_SHIFT = 44
"""Order statistics of the pooled gaps are found by the top 20 bits of their float64 patterns
(sign, exponent and 8 bits of mantissa: buckets 0.4% wide), which order non-negative floats."""


class PooledGaps:
    """The pooled ITLs of a run: the gaps between consecutive chunks of each successful request,
    request after request (`np.diff` of the chunk times without the gaps that cross from one
    request to the next), made from the requests' token times a block of requests at a time
    and never all held, unless they are few. `scan` makes them once and counts them (`size`)
    and the top bits of their floats (`key_counts`); `mean_std` and `order_statistics` read
    them again: those the scan kept (at most `_KEPT_BLOCKS` blocks' worth), else made again.

    `token_block(i, j)` gives the token times of successful requests i .. j - 1 concatenated,
    a new float64 array (the block's own buffer); `num_tokens`, each request's count. With
    `role_chunk`, each request's stream opens with a chunk at its first token's time that holds
    no token (the role chunk vLLM's chat completions server sends first): one more chunk, and
    a gap of 0 to the first token's."""

    __slots__ = ("_token_block", "_num_tokens", "size", "key_counts", "_kept", "_role_chunk")

    def __init__(self, token_block: Callable[[int, int], np.ndarray],
                 num_tokens: np.ndarray, role_chunk: bool = False) -> None:
        self._token_block = token_block
        self._num_tokens = num_tokens
        self._role_chunk = role_chunk
        self.size = 0
        self.key_counts = np.zeros(1 << (64 - _KEY_SHIFT), dtype=np.int64)
        self._kept: list[np.ndarray] | None = None     # the scan's blocks of gaps, if kept

    def _chunk_blocks(self):
        """(chunk times, chunks per request) per block of whole requests of about `_BLOCK`
        tokens (one request of more tokens is a block of its own); the chunk times are the
        block's own buffer."""
        nt = self._num_tokens
        ends = np.cumsum(nt)
        i, n = 0, len(nt)
        while i < n:
            base = ends[i] - nt[i]
            j = max(i + 1, int(np.searchsorted(ends, base + _BLOCK, side="right")))
            k = int(ends[j - 1] - base)
            times = self._token_block(i, j)
            last = ends[i:j] - base - 1
            first = last - nt[i:j] + 1
            # A token that arrives at the same instant as the previous one of its request
            # travels in the same chunk: vLLM's client times chunks, not tokens.
            new_chunk = np.empty(k, dtype=bool)
            np.not_equal(times[1:], times[:-1], out=new_chunk[1:])
            new_chunk[first] = True
            chunks = np.add.reduceat(new_chunk, first, dtype=np.int64)
            # Every token its own chunk (no speculative decoding): the token times are the
            # chunk times.
            chunk_times = times if new_chunk.all() else times[new_chunk]
            if self._role_chunk:
                opening = np.cumsum(chunks) - chunks
                chunk_times = np.insert(chunk_times, opening, chunk_times[opening])
                chunks = chunks + 1
            yield chunk_times, chunks
            i = j

    def _blocks(self):
        """The gaps, in order, an array per block (not to be written): those the scan kept,
        else made again."""
        if self._kept is not None:
            return iter(self._kept)
        return (_gaps_within(chunk_times, chunks)
                for chunk_times, chunks in self._chunk_blocks())

    def scan(self, on_chunk_times: Callable[[np.ndarray], None]) -> None:
        """The first pass: each block's chunk times to `on_chunk_times` (before its gaps are
        taken in their buffer), then its gaps counted, and kept while the run's fit in
        `_KEPT_BLOCKS` blocks."""
        limit = _KEPT_BLOCKS * _BLOCK
        kept: list[np.ndarray] | None = []
        for chunk_times, chunks in self._chunk_blocks():
            on_chunk_times(chunk_times)
            gaps = _gaps_within(chunk_times, chunks)
            if gaps.size and gaps.min() < 0:
                raise ValueError("a request's token times decrease")
            self.size += gaps.size
            self.key_counts += np.bincount(gaps.view(np.int64) >> _KEY_SHIFT,
                                           minlength=self.key_counts.size)
            if kept is not None:
                if self.size <= limit:
                    kept.append(gaps)
                else:
                    kept = None
        self._kept = kept

    def mean_std(self) -> tuple[np.float64, np.float64]:
        """`np.mean` and `np.std` of the gaps, to the bit: numpy's pairwise summation over the
        gaps made as the tree reads them (a pass for the sum, one for the deviations)."""
        n = self.size
        mean = pairwise_sum(None, _Reader(self._blocks()).take, leaf=_BLOCK, size=n) / n
        dev = _Reader(self._blocks(), transform=lambda g: np.square(g - mean))
        return mean, np.sqrt(pairwise_sum(None, dev.take, leaf=_BLOCK, size=n) / n)

    def order_statistics(self, ranks: set[int]) -> dict[int, float]:
        """The gaps at `ranks` (0 the smallest) in sorted order, exactly: the buckets that hold
        them by `key_counts`, then those buckets' distinct values and counts over a pass."""
        cum = np.cumsum(self.key_counts)
        where = {r: int(np.searchsorted(cum, r, side="right")) for r in ranks}
        keys = np.array(sorted(set(where.values())), dtype=np.int64)
        found_v, found_c = [], []
        for gaps in self._blocks():
            sel = gaps[np.isin(gaps.view(np.int64) >> _KEY_SHIFT, keys)]
            if sel.size:
                v, c = np.unique(sel, return_counts=True)
                found_v.append(v)
                found_c.append(c)
        values, inverse = np.unique(np.concatenate(found_v), return_inverse=True)
        counts = np.bincount(inverse, weights=np.concatenate(found_c)).astype(np.int64)
        value_keys = values.view(np.int64) >> _KEY_SHIFT
        out = {}
        for r in ranks:
            key = where[r]
            in_key = value_keys == key
            c = counts[in_key]
            # The rank of each distinct value's first copy: the gaps in the buckets below its
            # own, then the copies before it in its bucket.
            start = (cum[key - 1] if key > 0 else 0) + np.cumsum(c) - c
            out[r] = float(values[in_key][int(np.searchsorted(start, r, side="right")) - 1])
        return out


class _Reader:
    """Consecutive ranges of the concatenation of `blocks` (each range starting where the last
    ended), as `pairwise_sum` asks for its leaves."""

    __slots__ = ("_blocks", "_block", "_at", "_pos", "transform")

    def __init__(self, blocks, transform=None) -> None:
        self._blocks = iter(blocks)
        self._block = np.empty(0)
        self._at = 0          # position in the current block
        self._pos = 0         # position in the concatenation
        self.transform = transform

    def take(self, a: int, b: int) -> np.ndarray:
        if a != self._pos:
            raise ValueError("ranges must be read in order")
        parts = []
        m = b - a
        while m:
            blk, at = self._block, self._at
            if at == blk.size:
                self._block = blk = next(self._blocks)
                if self.transform is not None:
                    self._block = blk = self.transform(blk)
                self._at = at = 0
                continue
            k = min(m, blk.size - at)
            parts.append(blk[at:at + k])
            self._at = at + k
            m -= k
        self._pos = b
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


def percentile_points(n: int, q: float) -> tuple[int, int, np.float64]:
    """numpy's linear percentile q of n values: the ranks of the two values it interpolates
    between and the weight of the upper one (virtual index (n - 1) x q / 100)."""
    virtual = (n - 1) * np.true_divide(np.float64(q), 100)
    lo = int(np.floor(virtual))
    return lo, min(lo + 1, n - 1), virtual - lo


def percentile_of(kth: Callable[[int], float], n: int, q: float) -> np.float64:
    """`np.percentile` (linear) of n values whose k-th smallest is `kth(k)`, to the bit:
    numpy's two-sided interpolation between `percentile_points`."""
    lo, hi, gamma = percentile_points(n, q)
    a, b = np.float64(kth(lo)), np.float64(kth(hi))
    diff = b - a
    if gamma >= 0.5:
        return b - diff * (1 - gamma)
    return a + diff * gamma


def median_ranks(n: int) -> tuple[int, ...]:
    """The ranks `np.median` of n values reads."""
    return (n // 2,) if n % 2 else (n // 2 - 1, n // 2)


def median_of(kth: Callable[[int], float], n: int) -> np.float64:
    """`np.median` of n values whose k-th smallest is `kth(k)`, to the bit."""
    if n % 2:
        return np.float64(kth(n // 2))
    return np.add.reduce(np.array([kth(r) for r in median_ranks(n)])) / 2


def _gaps_within(chunk_times: np.ndarray, chunks: np.ndarray) -> np.ndarray:
    """The gaps between consecutive chunks of each request, request after request (the gap
    before each request's first chunk left out): `np.diff` of `chunk_times` without the gaps
    that cross from one request to the next, computed in `chunk_times`' own buffer, block by
    block, which it consumes (a view of it is returned)."""
    c = chunk_times
    m = c.size - 1
    if m <= 0:
        return c[:0]
    # c[i] = c[i + 1] - c[i], front to back: each block reads the next element before a later
    # block writes it (numpy copies an overlapping block's operands first).
    for a in range(0, m, _BLOCK):
        b = min(a + _BLOCK, m)
        np.subtract(c[a + 1:b + 1], c[a:b], out=c[a:b])
    # Drop the gap at each request's last chunk (but the last request's), keeping the order.
    cross = (np.cumsum(chunks) - chunks)[1:] - 1
    w = 0
    for a in range(0, m, _BLOCK):
        b = min(a + _BLOCK, m)
        lo, hi = np.searchsorted(cross, (a, b))
        if lo == hi and w == a:
            w = b
            continue
        keep = np.ones(b - a, dtype=bool)
        keep[cross[lo:hi] - a] = False
        block = c[a:b][keep]
        c[w:w + block.size] = block
        w += block.size
    return c[:w]
