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
        width = self.interval_s
        k0 = np.floor_divide(t0_s, width).astype(np.int64)
        k1 = np.floor_divide(t1_s, width).astype(np.int64)
        k1 -= (k1 * width >= t1_s).astype(np.int64)   # an interval ending on a boundary
        np.maximum(k0, k1, out=k1)
        self._grow(int(k1.max()))
        # Each span's rows: k0 alone, or k0 (partial), the whole rows between, k1 (partial).
        num_rows = k1 - k0 + 1
        span = np.repeat(np.arange(len(k0)), num_rows)
        first_row = np.cumsum(num_rows) - num_rows
        offset = np.arange(len(span)) - first_row[span]
        row = k0[span] + offset
        rate = load_bytes_per_s[span]
        value = rate * width
        head = offset == 0
        tail = offset == num_rows[span] - 1
        single = head & tail
        value[head] = (rate * ((k0[span] + 1) * width - t0_s[span]))[head]
        value[tail] = (rate * (t1_s[span] - k1[span] * width))[tail]
        value[single] = (rate * (t1_s[span] - t0_s[span]))[single]
        # Every row of a span over every one of its links, spans in order.
        first_link = np.cumsum(num_links) - num_links
        per_row = num_links[span]
        entry_row = np.repeat(np.arange(len(span)), per_row)
        entry_link = links[first_link[span][entry_row] + np.arange(len(entry_row))
                           - np.repeat(np.cumsum(per_row) - per_row, per_row)]
        np.add.at(self._bins, (row[entry_row], entry_link), value[entry_row])

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
