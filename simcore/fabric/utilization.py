"""Link utilization over time: the bytes each link carried in every sampling interval, accumulated
from piecewise-constant transmission rates.

The bins are dense in time, so a run that spans many intervals (a message sent an hour in, a
terabyte on one link) would hold an interval per 10 us of it for every link. They are held to
`MAX_SAMPLE_VALUES` values: where a later time needs more, the interval doubles, each pair of
adjacent bins merged into one (the bytes of [2k w, (2k + 2) w) are those of the two halves), as
often as it takes; the interval used is `interval_s`, which the run's result reports. A run that
fits keeps its configured interval and its figures to the bit."""

from __future__ import annotations

import math

import numpy as np

from simcore.compiled import compile_kernel


MAX_SAMPLE_VALUES = 1 << 24
"""Most utilization values (intervals x links) a run holds, 128 MB of float64, or 64 intervals
where its links are so many that fewer would be held (see the module docstring); the packet
backend keeps its samples to the same bound."""


def max_intervals(num_links: int) -> int:
    """Most sampling intervals a run of `num_links` links holds (`MAX_SAMPLE_VALUES`): an even
    number, at least 64."""
    return max(64, MAX_SAMPLE_VALUES // max(1, num_links) // 2 * 2)


class LinkLoadRecorder:
    """Bins of carried bytes, one row per sampling interval [k*interval_s, (k+1)*interval_s) and
    one column per link. Rows grow as later times are recorded, to `max_intervals` of them, past
    which the interval doubles (see the module docstring); nothing is ever removed."""

    def __init__(self, num_links: int, interval_s: float) -> None:
        if interval_s <= 0:
            raise ValueError(f"sample interval must be positive, got {interval_s}")
        self.interval_s = interval_s
        self._max_rows = max_intervals(num_links)
        self._bins = np.zeros((16, num_links))

    def _last_row(self, t_s: float) -> int:
        """The bin of an interval ending at `t_s` (one ending on a boundary ends the bin
        before it)."""
        k = int(t_s // self.interval_s)
        return k - 1 if k > 0 and k * self.interval_s >= t_s else k

    def _fit(self, t_s: float) -> None:
        """Double the interval (merging adjacent bins) until an interval ending at `t_s` falls
        in a bin that may be held."""
        while self._last_row(t_s) >= self._max_rows:
            bins = self._bins
            if len(bins) % 2:
                bins = np.concatenate([bins, np.zeros((1, bins.shape[1]))])
            merged = bins[0::2] + bins[1::2]
            self._bins = np.concatenate([merged, np.zeros_like(merged)])[:self._max_rows]
            self.interval_s *= 2

    def _grow(self, row: int) -> None:
        if row >= len(self._bins):
            extra = np.zeros((min(max(row + 1, 2 * len(self._bins)), self._max_rows)
                              - len(self._bins),
                              self._bins.shape[1]))
            self._bins = np.concatenate([self._bins, extra])

    def add(self, t0_s: float, t1_s: float, load_bytes_per_s: np.ndarray | float,
            link: int | list[int] | None = None) -> None:
        """Record that over [t0_s, t1_s) the links carried `load_bytes_per_s` (a vector over all
        links, or one rate for `link`, or for each of a list of distinct links)."""
        if t1_s <= t0_s:
            return
        self._fit(t1_s)
        width = self.interval_s
        k0 = int(t0_s // width)
        k1 = int(t1_s // width)
        if k1 * width >= t1_s:          # an interval ending exactly on a boundary
            k1 -= 1
        k1 = max(k0, k1)
        self._grow(k1)
        col = slice(None) if link is None else link
        if k0 == k1:
            self._bins[k0, col] += load_bytes_per_s * (t1_s - t0_s)
            return
        self._bins[k0, col] += load_bytes_per_s * ((k0 + 1) * width - t0_s)
        if k1 > k0 + 1:
            self._bins[k0 + 1:k1, col] += load_bytes_per_s * width
        self._bins[k1, col] += load_bytes_per_s * (t1_s - k1 * width)

    def add_spans(self, t0_s: np.ndarray, t1_s: np.ndarray, load_bytes_per_s: np.ndarray,
                  links: np.ndarray, num_links: np.ndarray) -> None:
        """`add(t0_s[m], t1_s[m], load_bytes_per_s[m], its links)` for every span m in order,
        in one pass: span m's links are the next `num_links[m]` entries of `links` (distinct).
        Every bin receives the same additions in the same order as from those calls, so the
        result is the same to the bit."""
        live = t1_s > t0_s
        if not live.all():
            keep = np.repeat(live, num_links)
            t0_s, t1_s, load_bytes_per_s = t0_s[live], t1_s[live], load_bytes_per_s[live]
            links, num_links = links[keep], num_links[live]
        if len(t0_s) == 0:
            return
        self._fit(float(t1_s.max()))
        width = self.interval_s
        k0 = np.floor_divide(t0_s, width).astype(np.int64)
        k1 = np.floor_divide(t1_s, width).astype(np.int64)
        k1 -= (k1 * width >= t1_s).astype(np.int64)   # an interval ending on a boundary
        np.maximum(k0, k1, out=k1)
        self._grow(int(k1.max()))
        _spread()(self._bins, width, np.ascontiguousarray(t0_s, dtype=float),
                  np.ascontiguousarray(t1_s, dtype=float),
                  np.ascontiguousarray(load_bytes_per_s, dtype=float), k0, k1,
                  np.ascontiguousarray(links, dtype=np.int64),
                  np.ascontiguousarray(num_links, dtype=np.int64))

    def copy(self) -> LinkLoadRecorder:
        other = LinkLoadRecorder(self._bins.shape[1], self.interval_s)
        other._max_rows = self._max_rows
        other._bins = self._bins.copy()
        return other

    def samples(self, rates_bytes_per_s: np.ndarray, until_s: float
                ) -> tuple[list[float], list[list[float]]]:
        """(sample start times, utilization per sample per link) over [0, until_s): bytes carried
        in each interval over what the link could carry in it (the last one may be shorter)."""
        if until_s <= 0:
            return [], []
        self._fit(until_s)
        width = self.interval_s
        n = max(1, math.ceil(until_s / width - 1e-9))
        self._grow(n - 1)
        starts = np.arange(n) * width
        spans = np.minimum(width, until_s - starts)
        spans[spans <= 0] = width
        util = self._bins[:n] / (spans[:, None] * rates_bytes_per_s[None, :])
        return starts.tolist(), util.tolist()


def spread(bins, width, t0_s, t1_s, rate, k0, k1, links, num_links):
    """Add to `bins` (row: interval, column: link) span m's bytes over each interval from k0[m]
    to k1[m] on each of its links (the next num_links[m] of `links`): rate x its part of the
    interval, every span in order, each interval in order and each link in order, so that a bin
    receives its additions in the order `LinkLoadRecorder.add` makes them."""
    first = 0
    for m in range(len(t0_s)):
        n = num_links[m]
        a, b, r, lo, hi = t0_s[m], t1_s[m], rate[m], k0[m], k1[m]
        for row in range(lo, hi + 1):
            if lo == hi:
                value = r * (b - a)
            elif row == lo:
                value = r * ((lo + 1) * width - a)
            elif row == hi:
                value = r * (b - hi * width)
            else:
                value = r * width
            for j in range(first, first + n):
                bins[row, links[j]] += value
        first += n


_compiled_spread = None


def _spread():
    """`spread` compiled by numba (cached on disk), made on first use; `spread` itself where
    numba is not installed."""
    global _compiled_spread
    if _compiled_spread is None:
        _compiled_spread = compile_kernel(spread)
    return _compiled_spread
