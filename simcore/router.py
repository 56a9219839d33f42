"""A request router in front of data-parallel engine replicas: in turn, on stale load reports, or
on its own record of the prompts it sent and the requests it has in flight."""

from __future__ import annotations

import numpy as np

from simcore.engine.request import BlockHashSpace, grown


class Router:
    """Picks a replica per request.

    For least_outstanding and prefix_affinity, engines publish their load (running + waiting
    requests) every `periodic_infra_update_time_s`; between reports the router sees only the
    last report, so bursts can herd onto one replica exactly as with real routers that scrape
    engine metrics.
    Prefix affinity keeps its own index of the prompt blocks it has sent where (as cache-aware
    routers do), since it cannot see the engines' caches.

    `cache_aware` is vLLM's router's policy of that name (vllm-project/router,
    `src/policies/cache_aware.rs`; SGLang's gateway runs the same algorithm). Its load is the
    router's own count of the requests it sent each replica that have not completed, exact at
    every instant, not a report. When the loads are imbalanced (the busiest replica has more
    than `balance_abs_threshold` requests over the idlest and more than `balance_rel_threshold`
    times as many) the request goes to the least loaded replica (the first of equals). Otherwise
    the router matches the request's own prompt (the client's text, without the chat template
    the server adds) against the prompts it sent: where the longest match is more than
    `cache_threshold` of the prompt, the request goes to a replica that was sent that prefix
    (the one sent it last), else to the least loaded. Either way the prompt joins the record
    under the chosen replica. The match is counted in whole KV blocks of tokens, where the real
    router counts characters of text; its index is never evicted (vLLM's router drops least
    recently used entries past `--max-tree-size`, 2^26 characters).
    """

    def __init__(self, policy: str, num_replicas: int, *, space: BlockHashSpace,
                 balance_threshold: int = 16, cache_threshold: float = 0.3,
                 balance_abs_threshold: int = 64, balance_rel_threshold: float = 1.5,
                 block_size: int = 16) -> None:
        self.policy = policy
        self.num_replicas = num_replicas
        self.space = space
        self.balance_threshold = balance_threshold
        self.cache_threshold = cache_threshold
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self.block_size = block_size
        self.reported_load = [0] * num_replicas
        self.in_flight = [0] * num_replicas
        """cache_aware: requests sent to each replica and not yet completed (`release`)."""
        self._next = 0
        # The replica each keyed block (by its id in `space`) was last sent to; -1: none.
        self._prefix_owner = np.full(1024, -1, dtype=np.int32)
        self.num_prefix_routed = 0
        self.last_hashes: np.ndarray | None = None
        """Chained hashes of the last routed prompt's keyed blocks (prefix_affinity and
        cache_aware), so the engine need not hash them again."""

    def publish_all(self, loads: list[int]) -> None:
        """Every replica's load report (running + waiting requests), in replica order, as of
        now."""
        self.reported_load[:] = loads

    @property
    def reads_reports(self) -> bool:
        """Whether the policy decides on the engines' load reports (`publish_all`): round_robin
        reads no load, cache_aware its own count."""
        return self.policy in ("least_outstanding", "prefix_affinity") and self.num_replicas > 1

    @property
    def counts_in_flight(self) -> bool:
        """Whether the policy counts the requests it has in flight (`release` when each
        completes)."""
        return self.policy == "cache_aware" and self.num_replicas > 1

    def release(self, replica: int) -> None:
        """A request routed to `replica` completed (or failed): cache_aware's load drops."""
        self.in_flight[replica] -= 1

    def route(self, block_keys: tuple[int, ...], prompt_len: int = 0,
              lead_blocks: int = 0) -> int:
        """The replica for a prompt of `block_keys` (its full blocks' keys, the chat template's
        `lead_blocks` first); `prompt_len`: the client's own prompt tokens (cache_aware's match
        rate is over them)."""
        self.last_hashes = None
        n = self.num_replicas
        if n == 1:
            return 0
        if self.policy == "cache_aware":
            return self._cache_aware(block_keys, prompt_len, lead_blocks)
        if self.policy == "round_robin":
            r = self._next
            self._next = (r + 1) % n
            return r
        least = self._least_loaded()
        if self.policy == "least_outstanding":
            return least
        # prefix_affinity: the replica that was sent the longest run of this prompt's blocks.
        ids, stop, best = self._longest_sent(block_keys)
        if best >= 0 and self.reported_load[best] - self.reported_load[least] <= self.balance_threshold:
            choice = best
            self.num_prefix_routed += 1
        else:
            choice = least
        return self._record(ids, choice)

    def _longest_sent(self, block_keys: tuple[int, ...]) -> tuple[np.ndarray, int, int]:
        """(the prompt's chained block ids, how many of its leading blocks some replica was sent,
        the replica sent the last of them, -1 if none). Only blocks interned before this prompt
        can have been sent somewhere."""
        ids, known = self.space.chain(block_keys)
        self._prefix_owner = grown(self._prefix_owner, self.space.num_keyed + 1, -1)
        if not known:
            return ids, 0, -1
        sent = self._prefix_owner[ids[:known]]
        unsent = sent < 0
        stop = int(unsent.argmax()) if unsent.any() else known
        return ids, stop, int(sent[stop - 1]) if stop else -1

    def _record(self, ids: np.ndarray, choice: int) -> int:
        """The prompt of blocks `ids` was sent to `choice` (returned)."""
        self._prefix_owner[ids] = choice
        self.last_hashes = ids
        return choice

    def _cache_aware(self, block_keys: tuple[int, ...], prompt_len: int,
                     lead_blocks: int) -> int:
        load = self.in_flight
        low, high = min(load), max(load)
        ids, stop, best = self._longest_sent(block_keys)
        # The chat template's leading blocks are not the request's text: they do not count.
        if not (high - low > self.balance_abs_threshold
                and high > low * self.balance_rel_threshold) and stop > lead_blocks \
                and prompt_len > 0 \
                and (stop - lead_blocks) * self.block_size > self.cache_threshold * prompt_len:
            choice = best
            self.num_prefix_routed += 1
        else:
            choice = load.index(low)
        load[choice] += 1
        return self._record(ids, choice)

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
