"""Link utilization over time: the bytes each link carried in every sampling interval, accumulated
from piecewise-constant transmission rates."""

from __future__ import annotations

import math

import numpy as np


class LinkLoadRecorder:
    """Bins of carried bytes, one row per sampling interval [k*interval_s, (k+1)*interval_s) and
    one column per link. Rows grow as later times are recorded; nothing is ever removed."""

    def __init__(self, num_links: int, interval_s: float) -> None:
        if interval_s <= 0:
            raise ValueError(f"sample interval must be positive, got {interval_s}")
        self.interval_s = interval_s
        self._bins = np.zeros((16, num_links))

    def _grow(self, row: int) -> None:
        if row >= len(self._bins):
            extra = np.zeros((max(row + 1, 2 * len(self._bins)) - len(self._bins),
                              self._bins.shape[1]))
            self._bins = np.concatenate([self._bins, extra])

    def add(self, t0_s: float, t1_s: float, load_bytes_per_s: np.ndarray | float,
            link: int | list[int] | None = None) -> None:
        """Record that over [t0_s, t1_s) the links carried `load_bytes_per_s` (a vector over all
        links, or one rate for `link`, or for each of a list of distinct links)."""
        if t1_s <= t0_s:
            return
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

    def copy(self) -> LinkLoadRecorder:
        other = LinkLoadRecorder(self._bins.shape[1], self.interval_s)
        other._bins = self._bins.copy()
        return other

    def samples(self, rates_bytes_per_s: np.ndarray, until_s: float
                ) -> tuple[list[float], list[list[float]]]:
        """(sample start times, utilization per sample per link) over [0, until_s): bytes carried
        in each interval over what the link could carry in it (the last one may be shorter)."""
        if until_s <= 0:
            return [], []
        width = self.interval_s
        n = max(1, math.ceil(until_s / width - 1e-9))
        self._grow(n - 1)
        starts = np.arange(n) * width
        spans = np.minimum(width, until_s - starts)
        spans[spans <= 0] = width
        util = self._bins[:n] / (spans[:, None] * rates_bytes_per_s[None, :])
        return starts.tolist(), util.tolist()
