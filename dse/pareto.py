"""Non-dominated sorting: the Pareto rank of every configuration of a study."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def pareto_ranks(values: Any, directions: Sequence[str]) -> np.ndarray:
    """Non-dominated rank of each row of `values` (n points x m objectives): 1 is the Pareto front.

    Rank k holds the points that only points of ranks < k dominate. A point dominates another
    when it is no worse on every objective and better on one; equal points share a rank.
    `directions` are "minimize" / "maximize" per objective.
    """
    v = np.asarray(values, dtype=float)
    n = v.shape[0]
    if n == 0:
        return np.zeros(0, dtype=int)
    v = v.reshape(n, -1)
    if v.shape[1] != len(directions):
        raise ValueError(f"{v.shape[1]} objective columns but {len(directions)} directions")
    loss = v * np.array([1.0 if d == "minimize" else -1.0 for d in directions])
    no_worse = (loss[:, None, :] <= loss[None, :, :]).all(axis=2)
    better = (loss[:, None, :] < loss[None, :, :]).any(axis=2)
    dominates = no_worse & better          # [i, j]: i dominates j
    ranks = np.zeros(n, dtype=int)
    remaining = np.ones(n, dtype=bool)
    rank = 0
    while remaining.any():
        rank += 1
        front = remaining & ~dominates[remaining].any(axis=0)
        ranks[front] = rank
        remaining &= ~front
    return ranks
