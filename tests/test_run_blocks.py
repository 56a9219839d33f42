"""A quiet run's block allocations made at once (`simcore.engine.run_blocks.allocate_run`, by
`QuietLeap.apply`) leave the block pool, the block tables and the requests' hashes as single
steps leave them, with the Python and the compiled pools."""

from __future__ import annotations

import copy
import random

import pytest
import simpy

from simcore.engine.request import Request
from simcore.engine.scheduler import Scheduler, SchedulerConfig
from simcore.serve.quiet import QuietLeap
from tests.test_quiet_steps import KvStep, _decoding_scheduler


@pytest.mark.parametrize("seed", range(4))
def test_apply_leaves_the_pool_as_single_steps_do(seed):
    s = _decoding_scheduler(12, 240, seed)
    t = copy.deepcopy(s)
    env = simpy.Environment()
    leap = QuietLeap(env, t, KvStep().step_time, lambda: False)
    got = leap.plan(0.0)
    assert got is not None and got.num_steps >= 2
    for j in range(got.num_steps):
        out = s.schedule()
        assert not out.new and not out.preempted and len(out.scheduled) == len(s.running)
        emitted, finished = s.update(out)
        # Only the run's last step may finish requests: those the run says.
        want = got.finished if j == got.num_steps - 1 else []
        assert [r.request_id for r in finished] == [r.request_id for r in want]
    leap.apply(got)
    state = lambda x: (x.kv.pool.free_queue(), x.kv.pool.cached, x.kv.pool.block_hash,
                       x.kv.pool.ref_cnt, x.kv.req_blocks, x.kv.num_tokens_fit,
                       x.kv.num_cached_block, x.num_steps,
                       [(r.num_computed_tokens, r.num_output_tokens, r.work_done_tokens,
                         r.block_hashes.tolist()) for r in x.running])
    assert state(t) == state(s)


def _evicting_scheduler(seed: int, compiled: bool, max_model_len: int = 4096) -> Scheduler:
    """Requests decoding on a small pool whose free queue holds cached blocks (a first wave's,
    finished), so the run's allocations evict; their keys run past their prompts and repeat
    between requests, so blocks completed while decoding are cached under hashes that other
    requests' blocks, held or free, also hold."""
    rng = random.Random(seed)
    s = Scheduler(SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=4096, num_blocks=160,
                                  block_size=16, max_model_len=max_model_len,
                                  compiled=compiled))
    shared = [tuple(rng.randint(0, 2) for _ in range(40)) for _ in range(3)]

    def add(name: str, max_tokens: int) -> None:
        p = rng.randint(17, 200)
        s.add_request(Request(name, len(s.running) + len(s.waiting.items), p, max_tokens,
                              rng.choice(shared)[:(p + max_tokens) // 16]))

    for i in range(6):
        add(f"a{i}", rng.randint(20, 60))
    while s.running or s.waiting.items:
        s.update(s.schedule())
    for i in range(8):
        add(f"b{i}", rng.randint(100, 300))
    while any(r.num_computed_tokens < r.num_tokens - 1 for r in s.running) or s.waiting.items:
        s.update(s.schedule())
    return s


@pytest.mark.parametrize("max_model_len", [4096, 290])
@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_apply_with_evictions_and_shared_hashes_leaves_the_pool_as_single_steps_do(
        seed, compiled, max_model_len):
    """As above, where allocations evict and completed blocks share hashes, with the Python
    and the compiled pools; at a short max_model_len, runs end where requests reach it."""
    s = _evicting_scheduler(seed, compiled, max_model_len)
    assert any(s.kv.pool.block_hash[b] for b in s.kv.pool.free_queue())   # allocations evict
    t = copy.deepcopy(s)
    got = QuietLeap(simpy.Environment(), t, KvStep().step_time, lambda: False).plan(0.0)
    assert got is not None and got.num_steps >= 16
    for _ in range(got.num_steps):
        s.update(s.schedule())
    QuietLeap(simpy.Environment(), t, KvStep().step_time, lambda: False).apply(got)
    state = lambda x: (x.kv.pool.free_queue(), x.kv.pool.cached, x.kv.pool.block_hash,
                       x.kv.pool.ref_cnt, x.kv.pool.num_evictions, x.kv.req_blocks,
                       x.kv.num_tokens_fit, x.kv.num_cached_block,
                       [(r.num_computed_tokens, r.num_output_tokens, r.block_hashes.tolist())
                        for r in x.running])
    assert state(t) == state(s)
    # Some block completed in the run is cached under a hash another block also holds.
    assert any(len(blocks) > 1 for blocks in t.kv.pool.cached.values())
