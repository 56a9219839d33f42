"""A request router in front of data-parallel engine replicas, deciding on stale load reports."""

from __future__ import annotations

import numpy as np

from simcore.engine.request import BlockHashSpace, grown


class Router:
    """Picks a replica per request.

    Engines publish their load (running + waiting requests) every
    `periodic_infra_update_time_s`; between reports the router sees only the last report, so
    bursts can herd onto one replica exactly as with real routers that scrape engine metrics.
    Prefix affinity keeps its own index of the prompt blocks it has sent where (as cache-aware
    routers do), since it cannot see the engines' caches.
    """

    def __init__(self, policy: str, num_replicas: int, *, space: BlockHashSpace,
                 balance_threshold: int = 16) -> None:
        self.policy = policy
        self.num_replicas = num_replicas
        self.space = space
        self.balance_threshold = balance_threshold
        self.reported_load = [0] * num_replicas
        self._next = 0
        # The replica each keyed block (by its id in `space`) was last sent to; -1: none.
        self._prefix_owner = np.full(1024, -1, dtype=np.int32)
        self.num_prefix_routed = 0
        self.last_hashes: np.ndarray | None = None
        """Chained hashes of the last routed prompt's keyed blocks (prefix_affinity only), so the
        engine need not hash them again."""

    def publish_all(self, loads: list[int]) -> None:
        """Every replica's load report (running + waiting requests), in replica order, as of
        now."""
        self.reported_load[:] = loads

    def route(self, block_keys: tuple[int, ...]) -> int:
        self.last_hashes = None
        n = self.num_replicas
        if n == 1:
            return 0
        if self.policy == "round_robin":
            r = self._next
            self._next = (r + 1) % n
            return r
        least = self._least_loaded()
        if self.policy == "least_outstanding":
            return least
        # prefix_affinity: the replica that was sent the longest run of this prompt's blocks.
        # Only blocks interned before this prompt can have been sent somewhere.
        ids, known = self.space.chain(block_keys)
        owner = self._prefix_owner = grown(self._prefix_owner, self.space.num_keyed + 1, -1)
        best = -1
        if known:
            sent = owner[ids[:known]]
            unsent = sent < 0
            stop = int(unsent.argmax()) if unsent.any() else known
            if stop:
                best = int(sent[stop - 1])
        if best >= 0 and self.reported_load[best] - self.reported_load[least] <= self.balance_threshold:
            choice = best
            self.num_prefix_routed += 1
        else:
            choice = least
        owner[ids] = choice
        self.last_hashes = ids
        return choice

    def _least_loaded(self) -> int:
        """Least reported load; ties broken in rotation so equal replicas share a burst."""
        load = self.reported_load
        n = self.num_replicas
        start = self._next
        best = start
        for k in range(1, n):
            i = (start + k) % n
            if load[i] < load[best]:
                best = i
        self._next = (best + 1) % n
        return best
