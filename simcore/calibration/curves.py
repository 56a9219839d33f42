"""Evaluating fitted curves: monotone knot curves (linear or log-log between knots) and the
GEMM fallback that rescales the nearest measured shapes' curves."""

from __future__ import annotations

import bisect
import math

import numpy as np


class KnotCurve:
    """A fitted monotone curve ready for evaluation; immutable.

    Linear between knots, the first knot's value below it, proportional to x beyond the last
    knot (`log_log`: interpolation of log time against log x instead of linear)."""

    __slots__ = ("x", "y_s", "_xs", "_ys", "_log_x", "_log_y", "_x_last", "_y_last", "_log_log")

    def __init__(self, x: np.ndarray | list, y_s: np.ndarray | list, *, log_log: bool = False):
        self.x = np.asarray(x, dtype=float)
        self.y_s = np.asarray(y_s, dtype=float)
        self._xs = self.x.tolist()
        self._ys = self.y_s.tolist()
        self._log_log = log_log
        self._log_x = np.log(self.x) if log_log else None
        self._log_y = np.log(self.y_s) if log_log else None
        self._x_last = self._xs[-1]
        self._y_last = self._ys[-1]

    def __call__(self, x: float) -> float:
        """The curve at one x, seconds."""
        if x >= self._x_last:
            return self._y_last * x / self._x_last
        i = bisect.bisect_right(self._xs, x)
        if i == 0:
            return self._ys[0]
        x0, x1, y0, y1 = self._xs[i - 1], self._xs[i], self._ys[i - 1], self._ys[i]
        if self._log_log:
            f = math.log(x / x0) / math.log(x1 / x0)
            return y0 * (y1 / y0) ** f
        return y0 + (y1 - y0) * (x - x0) / (x1 - x0)

    def many(self, x: np.ndarray) -> np.ndarray:
        """The curve at each of an array of x, seconds."""
        x = np.asarray(x, dtype=float)
        if self._log_log:
            inside = np.exp(np.interp(np.log(np.maximum(x, self._xs[0])), self._log_x,
                                      self._log_y))
        else:
            inside = np.interp(x, self.x, self.y_s)
        return np.where(x >= self._x_last, self._y_last * x / self._x_last, inside)

    @property
    def x_range(self) -> tuple[float, float]:
        """First and last knot positions."""
        return self._xs[0], self._x_last


def gemm_cost(coefficients_s: np.ndarray, m: np.ndarray | float, k: float, n: float):
    """The GEMM cost model c0 + c1 k n + c2 m (k + n) + c3 m k n (see `GenericGemm`)."""
    c0, c1, c2, c3 = coefficients_s
    return c0 + c1 * k * n + c2 * m * (k + n) + c3 * m * k * n


class GemmFallback:
    """`GenericGemm` evaluated over a set of measured GEMM curves; neighbours are cached per shape.

    Lifecycle: built once per profile; `time_s` may be called any number of times."""

    def __init__(self, shapes: list[tuple[int, int]], curves: list[KnotCurve],
                 coefficients_s: list[float] | np.ndarray, neighbors: int):
        self._shapes = list(shapes)
        self._log_shapes = np.log(np.asarray(shapes, dtype=float).reshape(-1, 2))
        self._curves = list(curves)
        self._c = np.asarray(coefficients_s, dtype=float)
        self._neighbors = neighbors
        self._cache: dict[tuple[int, int], tuple[list[tuple[KnotCurve, int, int]], np.ndarray]] = {}

    def _nearest(self, k: int, n: int):
        found = self._cache.get((k, n))
        if found is None:
            d = np.hypot(self._log_shapes[:, 0] - math.log(k), self._log_shapes[:, 1] - math.log(n))
            order = np.argsort(d, kind="stable")[:self._neighbors]
            w = 1.0 / (d[order] + 0.05) ** 2
            found = ([(self._curves[i], *self._shapes[i]) for i in order], w / w.sum())
            self._cache[(k, n)] = found
        return found

    def time_s(self, k: int, n: int, m: float) -> float:
        """Estimated time of an m x k x n GEMM (m tokens, k in, n out features), seconds."""
        near, w = self._nearest(k, n)
        cost = gemm_cost(self._c, m, k, n)
        log_t = 0.0
        for (curve, k_i, n_i), w_i in zip(near, w):
            log_t += w_i * math.log(curve(m) * cost / gemm_cost(self._c, m, k_i, n_i))
        return math.exp(log_t)

    def many(self, k: int, n: int, m: np.ndarray) -> np.ndarray:
        """`time_s` for an array of token counts."""
        near, w = self._nearest(k, n)
        m = np.asarray(m, dtype=float)
        cost = gemm_cost(self._c, m, k, n)
        log_t = sum(w_i * np.log(curve.many(m) * cost / gemm_cost(self._c, m, k_i, n_i))
                    for (curve, k_i, n_i), w_i in zip(near, w))
        return np.exp(log_t)
