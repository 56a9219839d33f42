"""Fixtures shared by several test files, and the `slow` marker's documentation.

Test tiers: `python -m pytest` runs everything (what CI and the README run); during development
`python -m pytest -m "not slow"` skips the tests marked slow (Ray searches, CLI subprocesses,
full shipped examples, validation sweeps) and finishes in a fraction of the time.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

import pytest

from dse.reaper import descendants, process_table
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
        assert pool.is_free(b) == (holders[b] == 0), b
    assert pool.num_free + sum(1 for h in holders[1:] if h) == pool.num_blocks - 1
    for h, blocks in pool.cached.items():
        for b in blocks:
            assert pool.block_hash[b] == h


@pytest.fixture(scope="session")
def blocks_conserved():
    """The KV-block conservation check, called on a scheduler after any step."""
    return _check_blocks_conserved


@pytest.fixture(scope="module")
def ray_address():
    """One quiet local Ray (2 CPUs) for a whole test module, started in the test process;
    drivers under test use it in-process, or join it by this address from processes of their
    own."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
             object_store_memory=256 * 2**20)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


class ProcessTable:
    """The processes running now, read from /proc (Linux)."""

    def descendants(self, pid: int) -> dict[int, str]:
        """{pid: command line} of every live descendant of process `pid`."""
        table = process_table()
        return {p: table[p][3] for p in descendants(table, {pid}) if p != pid}

    def alive(self, pids) -> list[str]:
        """The command lines of those of `pids` still running (zombies count as gone)."""
        table = process_table()
        return [table[p][3] for p in pids if p in table and table[p][1] != "Z"]


@pytest.fixture(scope="session")
def processes() -> ProcessTable:
    """The process table, to find the Ray processes a test's search started."""
    return ProcessTable()


def _wait_for_storage(driver, db: Path, ready, timeout_s: float) -> None:
    """Poll the sqlite storage `db` of a search running in process `driver` (a Popen) until
    `ready(connection)` is true; fail if the driver ends first or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert driver.poll() is None, f"the driver ended first: {driver.communicate()}"
        assert time.monotonic() < deadline, f"the storage was not ready within {timeout_s:g} s"
        try:
            if db.exists():
                with sqlite3.connect(db, timeout=5) as con:
                    if ready(con):
                        return
        except sqlite3.OperationalError:
            pass    # the driver is still creating the schema, or holds a write lock: look again
        time.sleep(0.05)


@pytest.fixture(scope="session")
def wait_for_storage():
    """`wait_for_storage(driver, db, ready, timeout_s)`: wait until a running search's sqlite
    storage satisfies `ready(connection)`."""
    return _wait_for_storage
