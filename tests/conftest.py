"""Fixtures shared by several test files, and the `slow` marker's documentation.

Test tiers: `python -m pytest` runs everything (what CI and the README run); during development
`python -m pytest -m "not slow"` skips the tests marked slow (Ray searches, CLI subprocesses,
full shipped examples, validation sweeps) and finishes in a fraction of the time.
"""

from __future__ import annotations

import pytest

from simcore.engine.scheduler import Scheduler


def _check_blocks_conserved(s: Scheduler) -> None:
    """Every usable block is either free or held; ref counts equal the number of holders; every
    cached block is indexed under its own hash."""
    pool = s.kv.pool
    holders = [0] * pool.num_blocks
    for blocks in s.kv.req_blocks.values():
        for b in blocks:
            holders[b] += 1
    for b in range(1, pool.num_blocks):
        assert pool.ref_cnt[b] == holders[b], b
        assert (b in pool.free) == (holders[b] == 0), b
    assert len(pool.free) + sum(1 for h in holders[1:] if h) == pool.num_blocks - 1
    for h, blocks in pool.cached.items():
        for b in blocks:
            assert pool.block_hash[b] == h


@pytest.fixture(scope="session")
def blocks_conserved():
    """The KV-block conservation check, called on a scheduler after any step."""
    return _check_blocks_conserved
