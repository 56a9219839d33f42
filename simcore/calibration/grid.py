"""Measured kernel times on a grid of shapes, and their interpolation in log-log space.

A kernel's time against its shape parameters (a GEMM's m, n, k; an attention kernel's batch and
sequence length; a fused-MoE kernel's tokens) is close to a power law in each parameter over
long stretches: flat while a fixed cost dominates, proportional to the work once it does.
`LogGrid` holds a table of measured times on the product of positive axis values and predicts a
point by multilinear interpolation of log time in log axis values, which is exact for any power
law. Cells the measurements lack are missing (NaN): a prediction uses the cell corners that
were measured, their weights renormalised, and is None when none was.

Outside an axis's range: below its first value the time is that of the first value (kernels do
not get faster for less work than the smallest measured); above its last value the time grows
with the axis's log-log slope over the last measured segment, clamped to [floor, cap] per axis
(cap 1 for work that grows linearly, e.g. GEMM rows; 2 for causal attention's query-key pairs
against sequence length; floor = cap = 1 for a GEMM's n and k, whose weights grow with them
whatever the noise of the last measured segment).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable

import numpy as np


class LogGrid:
    """A table of positive times on positive axes; immutable after construction.

    `axes`: the axis values, each strictly increasing and positive; `values`: an array of shape
    (len(axis) for axis in axes), seconds, NaN where not measured; `caps`: per axis, the largest
    log-log slope used above its last value.
    """

    __slots__ = ("axes", "values", "caps", "floors", "_log_axes", "_log_values", "_axes_lists",
                 "_flat", "_strides")

    def __init__(self, axes: list, values: np.ndarray, caps: tuple[float, ...],
                 floors: tuple[float, ...] | None = None):
        self.axes = [np.asarray(a, dtype=float) for a in axes]
        self.values = np.asarray(values, dtype=float)
        if self.values.shape != tuple(len(a) for a in self.axes):
            raise ValueError(f"values of shape {self.values.shape} on axes of lengths "
                             f"{[len(a) for a in self.axes]}")
        if len(caps) != len(self.axes):
            raise ValueError("one slope cap per axis")
        for a in self.axes:
            if len(a) == 0 or a[0] <= 0 or np.any(np.diff(a) <= 0):
                raise ValueError("axis values must be positive and strictly increasing")
        with np.errstate(divide="ignore", invalid="ignore"):
            self._log_values = np.log(np.where(self.values > 0, self.values, np.nan))
        self.caps = tuple(float(c) for c in caps)
        self.floors = tuple(float(f) for f in floors) if floors else (0.0,) * len(self.caps)
        self._log_axes = [np.log(a) for a in self.axes]
        self._axes_lists = [la.tolist() for la in self._log_axes]
        # The log values as Python floats in one row-major list (indexing a list is cheaper
        # than a numpy scalar, and the arithmetic on the floats is the same).
        self._flat = self._log_values.ravel().tolist()
        strides = []
        step = 1
        for a in reversed(self.axes):
            strides.append(step)
            step *= len(a)
        self._strides = tuple(reversed(strides))

    @property
    def ndim(self) -> int:
        return len(self.axes)

    def _inside_log(self, lx: list[float]) -> float | None:
        """Log time at a point inside every axis's range (multilinear over measured corners)."""
        base = 0
        dims: list[tuple[int, float, bool]] = []     # per axis: stride, fraction, one value
        for ax, x, stride in zip(self._axes_lists, lx, self._strides):
            offset, f, single = _dim(ax, stride, x)
            dims.append((stride, f, single))
            base += offset
        total_w = 0.0
        acc = 0.0
        flat = self._flat
        for corner in range(1 << len(dims)):
            w = 1.0
            at = base
            for d, (stride, f, single) in enumerate(dims):
                if (corner >> d) & 1:
                    if f == 0.0 or single:
                        w = 0.0
                        break
                    w *= f
                    at += stride
                else:
                    if f == 1.0:
                        w = 0.0
                        break
                    w *= 1.0 - f
            if w == 0.0:
                continue
            y = flat[at]
            if y != y:        # NaN: not measured
                continue
            acc += w * y
            total_w += w
        if total_w <= 0.0:
            return None
        return acc / total_w

    def __call__(self, *point: float) -> float | None:
        """Seconds at `point` (one value per axis); None when no corner of its cell was
        measured. A two-axis grid (attention's batch and length, most tables) takes `_call2`,
        the same operations in the same order unrolled."""
        if len(point) == 2 and len(self._strides) == 2:
            return self._call2(point[0], point[1])
        return self._call_any(point)

    def _call2(self, x0: float, x1: float) -> float | None:
        """`_call_any` for a two-axis grid, unrolled (`_dim`, `_corners`)."""
        ax0, ax1 = self._axes_lists
        s0, s1 = self._strides
        flat = self._flat
        l0, above0 = _clamped_log(ax0, x0)
        l1, above1 = _clamped_log(ax1, x1)
        d0 = _dim(ax0, s0, l0)
        d1 = _dim(ax1, s1, l1)
        y = _corners(flat, s0, s1, d0, d1)
        if y is None:
            return None
        if above0:
            y0 = _corners(flat, s0, s1, _dim(ax0, s0, ax0[-2]), d1) if len(ax0) > 1 else None
            y += _slope(y, y0, ax0, self.caps[0], self.floors[0]) * above0
        if above1:
            y0 = _corners(flat, s0, s1, d0, _dim(ax1, s1, ax1[-2])) if len(ax1) > 1 else None
            y += _slope(y, y0, ax1, self.caps[1], self.floors[1]) * above1
        return math.exp(y)

    def _call_any(self, point) -> float | None:
        """`__call__` for any number of axes: per axis the log of its value, clamped to the
        axis, `_inside_log` over the cell's corners, then the extrapolation above each axis."""
        lx = []
        above: list[tuple[int, float]] = []
        for d, (ax, x) in enumerate(zip(self._axes_lists, point)):
            l, excess = _clamped_log(ax, x)
            if excess:
                above.append((d, excess))
            lx.append(l)
        y = self._inside_log(lx)
        if y is None:
            return None
        for d, excess in above:
            ax = self._axes_lists[d]
            y0 = None
            if len(ax) > 1:
                prev = list(lx)
                prev[d] = ax[-2]
                y0 = self._inside_log(prev)
            y += _slope(y, y0, ax, self.caps[d], self.floors[d]) * excess
        return math.exp(y)

    def along(self, *prefix: float) -> Callable[[float], float | None]:
        """`x -> self(*prefix, x)`: the grid along its last axis with the other axes' values
        fixed, their part of the interpolation worked out once (a decode step's attention at a
        fixed batch, over growing lengths). The same float as calling the grid, to the bit:
        a two-axis grid's closure repeats `_call_any`'s operations in their order (a test holds
        them equal); other grids call it."""
        if len(prefix) != len(self.axes) - 1:
            raise ValueError(f"{len(prefix)} fixed values for a grid of {len(self.axes)} axes")
        if len(self.axes) != 2:
            return lambda x: self(*prefix, x)
        flat, ax1, g = self.along_params(prefix[0])

        def at(x: float) -> float | None:
            y = along_at(flat, ax1, g, x)
            return None if y != y else y

        return at

    def along_params(self, x0: float) -> tuple[list[float], list[float], tuple[float, ...]]:
        """(table, length axis, `g`): what `along_at` reads for a two-axis grid with its first
        axis at `x0`, that axis's part of the interpolation worked out (`g` as `along_at`
        lists it)."""
        ax0, ax1 = self._axes_lists
        s0, s1 = self._strides
        flat = self._flat
        l0, above0 = _clamped_log(ax0, x0)
        d0 = _dim(ax0, s0, l0)
        d0_prev = _dim(ax0, s0, ax0[-2]) if len(ax0) > 1 else (0, 0.0, True)
        d1_prev = _dim(ax1, s1, ax1[-2]) if len(ax1) > 1 else None
        y1_prev = _corners(flat, s0, s1, d0, d1_prev) if d1_prev is not None else None
        g = (float(s0), float(s1), float(d0[0]), d0[1], float(d0[2]),
             float(len(ax0) > 1), float(d0_prev[0]), d0_prev[1], float(d0_prev[2]), above0,
             ax0[-1] - ax0[-2] if len(ax0) > 1 else 1.0, self.caps[0], self.floors[0],
             ax1[0], ax1[-1], float(y1_prev is not None),
             y1_prev if y1_prev is not None else 0.0,
             ax1[-1] - ax1[-2] if len(ax1) > 1 else 1.0, self.caps[1], self.floors[1])
        return flat, ax1, g


def corners(flat, s0, s1, off0, f0, one0, off1, f1, one1):
    """`LogGrid._inside_log`'s corner loop for two axes, unrolled in its order (corner bits: axis
    0 low, axis 1 high), from each axis's offset, fraction and single-value flag (`_dim`); NaN
    where no corner of the cell was measured. Plain Python over numbers, so that compiled kernels
    (`simcore.compute.decode_steps`) run this same source."""
    base = off0 + off1
    acc = 0.0
    total_w = 0.0
    lo0 = f0 != 1.0
    hi0 = not (f0 == 0.0 or one0)
    lo1 = f1 != 1.0
    hi1 = not (f1 == 0.0 or one1)
    if lo1:
        if lo0:
            w = (1.0 - f0) * (1.0 - f1)
            y = flat[base]
            if w != 0.0 and y == y:
                acc += w * y
                total_w += w
        if hi0:
            w = f0 * (1.0 - f1)
            y = flat[base + s0]
            if w != 0.0 and y == y:
                acc += w * y
                total_w += w
    if hi1:
        if lo0:
            w = (1.0 - f0) * f1
            y = flat[base + s1]
            if w != 0.0 and y == y:
                acc += w * y
                total_w += w
        if hi0:
            w = f0 * f1
            y = flat[base + s0 + s1]
            if w != 0.0 and y == y:
                acc += w * y
                total_w += w
    if total_w <= 0.0:
        return math.nan
    return acc / total_w


def slope(y, y0, has_y0, den, cap, floor):
    """The log-log slope above a log axis whose last step is `den`: from `y0` at its second last
    value to `y` at its last (`cap` without `y0`), clamped to [floor, cap]."""
    s = (y - y0) / den if has_y0 else cap
    return min(max(s, floor), cap)


def along_at(flat, ax1, g, x):
    """A two-axis grid's time at (its first axis's fixed value, `x`) from `along_params`' table,
    length axis and `g`: `__call__`'s operations in their order, the first axis's part read from
    `g`; NaN where `__call__` gives None. Plain Python over numbers (see `corners`).

    `g`, in order: the table's strides; the first axis's offset, fraction and single-value flag,
    whether it has a second-last value, that value's offset, fraction and flag, and the excess
    above the axis; the first axis's last step (log), cap and floor; the second axis's first and
    last values, whether the table has a value at its second-last one (the first axis where it
    is) and that value, its last step, cap and floor. Flags are 0.0 or 1.0: compiled kernels
    take `g` as one float array."""
    (s0, s1, off0, f0, one0, has_prev0, off0_prev, f0_prev, one0_prev, above0, den0, cap0,
     floor0, lo1, hi1, has_y1_prev, y1_prev, den1, cap1, floor1) = g
    s0, s1 = int(s0), int(s1)
    l1 = math.log(x) if x > 0 else -math.inf
    above1 = 0.0
    if l1 < lo1:
        l1 = lo1
    elif l1 > hi1:
        above1 = l1 - hi1
        l1 = hi1
    n = len(ax1)
    if n == 1:
        off1, f1, one1 = 0, 0.0, True
    else:
        lo, hi = 0, n                    # bisect.bisect_right(ax1, l1)
        while lo < hi:
            mid = (lo + hi) // 2
            if l1 < ax1[mid]:
                hi = mid
            else:
                lo = mid + 1
        i = lo - 1
        i = 0 if i < 0 else (n - 2 if i > n - 2 else i)
        f = (l1 - ax1[i]) / (ax1[i + 1] - ax1[i])
        off1, f1, one1 = i * s1, min(max(f, 0.0), 1.0), False
    y = corners(flat, s0, s1, int(off0), f0, one0 != 0.0, off1, f1, one1)
    if y != y:
        return y
    if above0 != 0.0:
        y0 = math.nan
        if has_prev0 != 0.0:
            y0 = corners(flat, s0, s1, int(off0_prev), f0_prev, one0_prev != 0.0, off1, f1, one1)
        y += slope(y, y0, y0 == y0, den0, cap0, floor0) * above0
    if above1:
        y += slope(y, y1_prev, has_y1_prev != 0.0, den1, cap1, floor1) * above1
    return math.exp(y)


def _clamped_log(ax: list[float], x: float) -> tuple[float, float]:
    """(log x clamped to the log axis `ax`, its excess above the axis's last value)."""
    l = math.log(x) if x > 0 else -math.inf
    if l < ax[0]:
        return ax[0], 0.0
    if l > ax[-1]:
        return ax[-1], l - ax[-1]
    return l, 0.0


def _slope(y: float, y0: float | None, ax: list[float], cap: float, floor: float) -> float:
    """The log-log slope above the log axis `ax`'s last value: from `y0` at its second last
    value to `y` at its last (`cap` where `y0` is None), clamped to [floor, cap]."""
    if y0 is None:
        return slope(y, 0.0, False, 1.0, cap, floor)
    return slope(y, y0, True, ax[-1] - ax[-2], cap, floor)


def _dim(ax: list[float], stride: int, l: float) -> tuple[int, float, bool]:
    """`LogGrid._inside_log`'s per-axis part for log value `l` on log axis `ax`: (offset into
    the table, fraction, one value)."""
    n = len(ax)
    if n == 1:
        return 0, 0.0, True
    i = bisect.bisect_right(ax, l) - 1
    i = 0 if i < 0 else (n - 2 if i > n - 2 else i)
    f = (l - ax[i]) / (ax[i + 1] - ax[i])
    return i * stride, min(max(f, 0.0), 1.0), False


def _corners(flat: list[float], s0: int, s1: int, a: tuple[int, float, bool],
             b: tuple[int, float, bool]) -> float | None:
    """`corners` for two axes' `_dim` readings `a` and `b`; None where no corner was measured."""
    y = corners(flat, s0, s1, a[0], a[1], a[2], b[0], b[1], b[2])
    return None if y != y else y


def check_axis(name: str, axis: list) -> None:
    """ValueError unless `axis` is non-empty, positive and strictly increasing."""
    if not axis or axis[0] <= 0 or any(b <= a for a, b in zip(axis, axis[1:])):
        raise ValueError(f"{name} must be positive and strictly increasing")


def check_batch_seq(batch: list, seq: list, time_us: list) -> None:
    """ValueError unless a (batch, seq) table's axes are valid and it holds a time per cell."""
    check_axis("batch", batch)
    check_axis("seq", seq)
    if len(time_us) != len(batch) * len(seq):
        raise ValueError("time_us must hold len(batch) x len(seq) values")


def fill_along(values: np.ndarray, axis_values: np.ndarray, axis: int, cap: float) -> np.ndarray:
    """`values` with the missing cells beyond the last measured one of each line along `axis`
    extrapolated in log-log space with the slope of the line's last measured segment, clamped to
    [0, cap]. Lines with fewer than two measured cells, and gaps between measured cells, are left
    as they are (interpolation handles gaps)."""
    v = np.moveaxis(np.array(values, dtype=float), axis, -1)
    la = np.log(np.asarray(axis_values, dtype=float))
    flat = v.reshape(-1, v.shape[-1])
    for row in flat:
        ok = np.flatnonzero(row > 0)
        if len(ok) < 2:
            continue
        a, b = ok[-2], ok[-1]
        slope = (math.log(row[b]) - math.log(row[a])) / (la[b] - la[a])
        slope = min(max(slope, 0.0), cap)
        for j in range(b + 1, len(row)):
            row[j] = math.exp(math.log(row[b]) + slope * (la[j] - la[b]))
    return np.moveaxis(flat.reshape(v.shape), -1, axis)
