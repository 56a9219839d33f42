"""Scheduler micro-scenarios, the policy options, and KV-block conservation as a property."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simcore.engine.request import (FINISHED, FINISHED_ABORTED, PREEMPTED, RUNNING, WAITING,
                                    BlockHashSpace, Request)
from simcore.engine.scheduler import Scheduler, SchedulerConfig


def cfg(**kw):
    base = dict(max_num_seqs=8, max_num_batched_tokens=64, num_blocks=40, block_size=16,
                max_model_len=4096)
    base.update(kw)
    return SchedulerConfig(**base)


def run_to_end(s: Scheduler, max_steps=100_000):
    steps = []
    while s.has_requests and len(steps) < max_steps:
        out = s.schedule()
        s.update(out)
        steps.append(out)
    return steps


def test_chunked_prefill_then_decode_exact_counts():
    s = Scheduler(cfg())
    s.add_request(Request("a", 0, 100, 3))
    plan = [o.scheduled[0][1] for o in run_to_end(s)]
    # 100-token prompt in 64 + 36 token chunks, then two more decode steps (3 outputs in all).
    assert plan == [64, 36, 1, 1]
    assert s.kv.num_free_blocks == 39


def test_without_chunked_prefill_a_prompt_waits_for_a_full_budget():
    s = Scheduler(cfg(enable_chunked_prefill=False, max_num_batched_tokens=4096, max_model_len=4096))
    s.add_request(Request("a", 0, 100, 2))
    s.add_request(Request("b", 1, 4000, 2))
    out = s.schedule()
    # b does not fit the remaining budget (4096 - 100) so admission stops at it.
    assert [(r.request_id, n) for r, n, _ in out.scheduled] == [("a", 100)]


def test_same_step_prefix_hit():
    s = Scheduler(cfg(max_num_batched_tokens=512, num_blocks=100))
    keys = tuple(range(1, 9))
    s.add_request(Request("a", 0, 130, 2, keys))
    s.add_request(Request("b", 1, 130, 2, keys))
    out = s.schedule()
    # a's 8 full blocks are cached as they are allocated; b hits them in the same step.
    assert out.computed_on_admit == {"a": 0, "b": 128}
    assert [(r.request_id, n) for r, n, _ in out.scheduled] == [("a", 130), ("b", 2)]


def test_prefix_hit_never_covers_the_last_token():
    s = Scheduler(cfg(max_num_batched_tokens=512, num_blocks=100))
    keys = tuple(range(1, 9))
    s.add_request(Request("a", 0, 128, 1, keys))
    run_to_end(s)
    s.add_request(Request("b", 1, 128, 1, keys))
    out = s.schedule()
    assert out.computed_on_admit == {"b": 112}   # the block holding token 128 is recomputed


def test_fcfs_preempts_last_admitted_and_resumes_it_first():
    s = Scheduler(cfg(max_num_batched_tokens=256, num_blocks=7, enable_prefix_caching=False))
    s.add_request(Request("a", 0, 48, 40))
    s.add_request(Request("b", 1, 48, 40))
    preempted = []
    resumed = []
    for out in run_to_end(s):
        preempted += [r.request_id for r in out.preempted]
        resumed += [r.request_id for r in out.resumed]
    assert preempted and set(preempted) == {"b"}
    assert resumed == preempted


def test_priority_policy_preempts_lowest_priority():
    s = Scheduler(cfg(max_num_batched_tokens=256, num_blocks=7, enable_prefix_caching=False,
                      policy="priority"))
    s.add_request(Request("low", 0, 48, 40, priority=5))
    s.add_request(Request("high", 1, 48, 40, priority=0))
    out = s.schedule()
    # The priority queue admits "high" first.
    assert [r.request_id for r in out.new] == ["high", "low"]
    s.update(out)
    victims = set()
    for out in run_to_end(s):
        victims |= {r.request_id for r in out.preempted}
    assert victims == {"low"}


def test_least_work_done_preemption_spares_nearly_done_and_thrice_preempted():
    s = Scheduler(cfg(preemption="least_work_done", enable_prefix_caching=False))
    reqs = [Request(f"r{i}", i, 32, 100) for i in range(4)]
    for r in reqs:
        s.running.append(r)
    reqs[0].work_done_tokens = 10
    reqs[1].work_done_tokens = 5; reqs[1].num_preemptions = 3    # spared: preempted 3 times
    reqs[2].work_done_tokens = 1; reqs[2].num_output_tokens = 97  # spared: 3% of decode left
    reqs[3].work_done_tokens = 50
    assert s._pick_victim(reqs[3], {}) is reqs[0]
    # When nobody else may be preempted the request itself yields.
    reqs[0].num_preemptions = 3
    assert s._pick_victim(reqs[3], {}) is reqs[3]


def test_least_work_done_completes_a_run_under_pressure(blocks_conserved):
    s = Scheduler(cfg(preemption="least_work_done", num_blocks=12, enable_prefix_caching=False,
                      max_num_batched_tokens=128))
    for i in range(6):
        s.add_request(Request(f"r{i}", i, 40, 60))
    steps = run_to_end(s)
    assert not s.has_requests and s.num_preemptions > 0
    assert sum(len(o.preempted) for o in steps) == s.num_preemptions
    blocks_conserved(s)


def test_persistent_batch_admits_only_after_a_completion():
    s = Scheduler(cfg(persistent_batch=True, max_num_batched_tokens=512, num_blocks=200))
    s.add_request(Request("a", 0, 16, 5))
    out = s.schedule()
    s.update(out)
    s.add_request(Request("b", 1, 16, 5))
    admitted_at = None
    step = 1
    while s.has_requests:
        out = s.schedule()
        if any(r.request_id == "b" for r in out.new):
            admitted_at = step
        _, fin = s.update(out)
        step += 1
    # a needs 5 steps (prefill + 4 decodes); b joins the step after a finishes, not before.
    assert admitted_at == 5
    # The vLLM default admits b at once.
    v = Scheduler(cfg(max_num_batched_tokens=512, num_blocks=200))
    v.add_request(Request("a", 0, 16, 5))
    v.update(v.schedule())
    v.add_request(Request("b", 1, 16, 5))
    assert [r.request_id for r in v.schedule().new] == ["b"]


def test_preempted_request_hits_its_own_blocks():
    space = BlockHashSpace()
    s = Scheduler(cfg(max_num_batched_tokens=256, num_blocks=12), space)
    a = Request("a", 0, 64, 200)
    s.add_request(a)
    s.update(s.schedule())
    s.running.remove(a)
    s._preempt(a)
    out = s.schedule()
    assert out.resumed == [a] and out.computed_on_admit["a"] == 64


def test_priority_self_preemption_goes_on_with_the_requests_after_it():
    # vLLM 0.33 Scheduler.schedule: the lowest-priority running request that cannot get a block
    # preempts itself and the loop continues with the (more urgent) requests after it.
    s = Scheduler(cfg(num_blocks=8, enable_prefix_caching=False, policy="priority",
                      max_num_batched_tokens=256))
    low = Request("low", 0, 31, 100, priority=9)
    s.add_request(low)
    s.update(s.schedule())                      # low: 31 prompt tokens in 2 blocks, one token out
    s.add_request(Request("u0", 1, 47, 100, priority=0))     # 3 blocks
    s.add_request(Request("u1", 2, 31, 100, priority=0))     # 2 blocks
    out = s.schedule()
    assert [r.request_id for r in out.new] == ["u0", "u1"] and s.kv.num_free_blocks == 0
    s.update(out)
    # low's 33rd token needs a third block and none of the 7 is free. low is the lowest-priority
    # running request, so it preempts itself; u0 and u1 (their next tokens fit) still decode.
    out = s.schedule()
    assert out.preempted == [low] and low.status == PREEMPTED
    assert [(r.request_id, n) for r, n, _ in out.scheduled] == [("u0", 1), ("u1", 1)]


def test_watermark_applies_only_while_something_runs():
    # 19 usable blocks, watermark int(0.25 * 20) = 5 blocks.
    s = Scheduler(cfg(num_blocks=20, watermark=0.25, enable_prefix_caching=False,
                      max_num_batched_tokens=512))
    big = Request("big", 0, 16 * 17, 2)          # 17 blocks: more than 19 - 5, fits in 19
    s.add_request(big)
    out = s.schedule()
    assert out.new == [big]                      # nothing ran: no watermark
    s.update(out)
    small = Request("small", 1, 16, 2)           # 1 block of the 2 free, but 2 - 1 < 5
    s.add_request(small)
    out = s.schedule()
    assert out.new == [] and small.status == WAITING
    s.update(out)
    s.update(s.schedule())                       # big finishes; small is admitted
    assert small.status == RUNNING


def test_the_whole_prompt_must_fit_even_with_nothing_running():
    # vLLM checks scheduler_reserve_full_isl on every admission: a prompt of 40 blocks never
    # starts in a pool of 31 usable blocks, though its first 256-token chunk would fit.
    s = Scheduler(cfg(num_blocks=32, enable_prefix_caching=False, max_num_batched_tokens=256))
    s.add_request(Request("huge", 0, 16 * 40, 2))
    for _ in range(3):
        out = s.schedule()
        assert out.scheduled == []
        s.update(out)
    off = Scheduler(cfg(num_blocks=32, enable_prefix_caching=False, max_num_batched_tokens=256,
                        reserve_full_isl=False))
    off.add_request(Request("huge", 0, 16 * 40, 2))
    assert [n for _, n, _ in off.schedule().scheduled] == [256]


def test_max_num_scheduled_tokens_bounds_every_step():
    s = Scheduler(cfg(max_num_batched_tokens=64, max_num_scheduled_tokens=40))
    s.add_request(Request("a", 0, 100, 2))
    s.add_request(Request("b", 1, 10, 2))
    plans = [[(r.request_id, n) for r, n, _ in o.scheduled] for o in run_to_end(s)]
    assert plans[:3] == [[("a", 40)], [("a", 40)], [("a", 20), ("b", 10)]]
    assert s.config.token_budget == 40
    # Above max_num_batched_tokens it changes nothing: vLLM spends both budgets at once.
    assert SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, num_blocks=40,
                           max_num_scheduled_tokens=100).token_budget == 64


def test_skip_reading_prefix_cache_finds_no_hit_but_still_caches():
    s = Scheduler(cfg(max_num_batched_tokens=512, num_blocks=100))
    keys = tuple(range(1, 9))
    s.add_request(Request("a", 0, 130, 2, keys))
    s.add_request(Request("b", 1, 130, 2, keys, skip_reading_prefix_cache=True))
    s.add_request(Request("c", 2, 130, 2, keys))
    out = s.schedule()
    assert out.computed_on_admit == {"a": 0, "b": 0, "c": 128}


def test_abort_waiting_running_and_preempted_requests(blocks_conserved):
    s = Scheduler(cfg(max_num_batched_tokens=256, num_blocks=7, enable_prefix_caching=False))
    a, b, c = Request("a", 0, 48, 40), Request("b", 1, 48, 40), Request("c", 2, 16, 5)
    for r in (a, b, c):
        s.add_request(r)
    out = s.schedule()                           # a and b run (3 blocks each); c waits
    assert out.new == [a, b] and c.status == WAITING
    s.update(out)
    while b.status != PREEMPTED:                 # a grows until b is preempted
        s.update(s.schedule())
    assert s.finish_requests([b, c]) == [b, c]
    assert b.status == c.status == FINISHED_ABORTED and len(s.waiting) == 0
    assert s.finish_requests([b]) == []          # already finished: left out
    blocks_conserved(s)
    out = s.schedule()                           # a alone; abort it while its step runs
    assert s.finish_requests([a]) == [a] and s.running == [] and s.kv.num_free_blocks == 6
    emitted, finished = s.update(out)
    assert emitted == finished == [] and not s.has_requests
    blocks_conserved(s)


def test_a_persistent_batch_refills_after_an_abort_as_after_a_completion():
    s = Scheduler(cfg(persistent_batch=True, max_num_batched_tokens=512, num_blocks=200))
    a = Request("a", 0, 16, 50)
    s.add_request(a)
    s.update(s.schedule())
    b = Request("b", 1, 16, 5)
    s.add_request(b)
    s.update(s.schedule())
    assert b.status == WAITING                   # a still runs: the batch is not rebuilt
    s.finish_requests([a])
    assert s.schedule().new == [b]


def test_abort_of_a_priority_waiting_request_keeps_the_queue_order():
    s = Scheduler(cfg(policy="priority", max_num_seqs=1))
    reqs = [Request(f"r{i}", i, 16, 2, priority=p) for i, p in enumerate([3, 1, 2, 0])]
    for r in reqs:
        s.add_request(r)
    s.finish_requests([reqs[3]])
    assert [r.request_id for r in s.waiting] == ["r1", "r2", "r0"]


requests_strategy = st.lists(
    st.tuples(st.integers(1, 300), st.integers(1, 40), st.integers(0, 3), st.integers(0, 6)),
    min_size=1, max_size=25)


@settings(max_examples=60, deadline=None)
@given(reqs=requests_strategy, num_blocks=st.integers(24, 80), budget=st.integers(16, 300),
       chunked=st.booleans(), caching=st.booleans(), lwd=st.booleans(), seqs=st.integers(1, 8))
def test_blocks_are_conserved_and_every_request_finishes(reqs, num_blocks, budget, chunked,
                                                        caching, lwd, seqs, blocks_conserved):
    max_len = 16 * (num_blocks - 1)
    if not chunked:
        budget = max(budget, max_len)
    s = Scheduler(SchedulerConfig(max_num_seqs=seqs, max_num_batched_tokens=budget,
                                  num_blocks=num_blocks, block_size=16, max_model_len=max_len,
                                  enable_chunked_prefill=chunked, enable_prefix_caching=caching,
                                  preemption="least_work_done" if lwd else "vllm"))
    made = []
    for i, (plen, olen, prefix, arrive) in enumerate(reqs):
        plen = min(plen, max_len - olen)
        if plen < 1:
            continue
        keys = tuple(range(100 * prefix, 100 * prefix + plen // 16)) if prefix else ()
        made.append((arrive, Request(f"r{i}", i, plen, olen, keys)))
    step = 0
    pending = sorted(made, key=lambda p: (p[0], p[1].index))
    while (pending or s.has_requests) and step < 20_000:
        while pending and pending[0][0] <= step:
            s.add_request(pending.pop(0)[1])
        out = s.schedule()
        assert out.num_tokens <= budget
        assert len(s.running) <= seqs
        s.update(out)
        blocks_conserved(s)
        step += 1
    assert all(r.status == FINISHED for _, r in made)
    assert all(r.num_output_tokens == r.max_tokens for _, r in made)
    assert s.kv.num_free_blocks == num_blocks - 1


def _check_chain_against_one_by_one(prompts, compiled=False):
    space = BlockHashSpace(compiled=compiled)
    ids: dict[tuple[int, int], int] = {}     # the reference: identity -> id, in order
    for keys in prompts:
        known_before = len(ids)
        expected, parent, known = [], 0, None
        for j, key in enumerate(keys):
            h = ids.get((parent, key))
            if h is None:
                h = ids[(parent, key)] = len(ids) + 1
                known = j if known is None else known
            parent = h
            expected.append(h)
        arr, got = space.chain(tuple(keys))
        assert arr.dtype == np.int64 and arr.tolist() == expected
        assert got == (len(keys) if known is None else known)
        assert all(h <= known_before for h in expected[:known])
        # Every identity interned is found, with its id, and the count of ids is theirs.
        assert all(space.lookup(p, k) == h for (p, k), h in ids.items())
        assert space.num_keyed == len(ids)
    # Identities never interned are not found.
    assert space.lookup(0, 12345) is None and space.lookup(len(ids), 2**62 + 5) is None
    # Unkeyed blocks are numbered apart (negative), so keyed ids stay dense.
    assert space.fresh(3) == -1 and space.fresh(1) == -4 and space.num_keyed == len(ids)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.sampled_from([0, 1, 2, 2**63 - 1, 2**63, 2**64, -3]), max_size=12),
                min_size=1, max_size=6))
def test_chain_numbers_blocks_as_interning_them_one_by_one(prompts):
    # BlockHashSpace.chain (the router's and a request's whole-prompt hashing) gives every block
    # the id that interning its (parent hash, key) identity block by block gives it, and counts
    # the leading blocks already interned; keys outside [0, 2**63) take the one-by-one path.
    _check_chain_against_one_by_one(prompts)


@pytest.mark.parametrize("compiled", [False, True])
def test_a_run_ends_where_the_next_id_starts_a_run_of_its_own(compiled):
    # Id 3 starts a run (its parent is not id 2) and holds no key of its own in the run column:
    # a prompt continuing ids 1, 2 with the key 0 is not id 3.
    import simcore.engine.request as request
    old = request.VECTOR_MIN_KEYS
    request.VECTOR_MIN_KEYS = 1
    try:
        _check_chain_against_one_by_one([[5, 7], [9], [5, 7, 0]], compiled)
    finally:
        request.VECTOR_MIN_KEYS = old


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(st.integers(0, 40), min_size=0, max_size=90), min_size=1, max_size=8),
       st.sampled_from([1, 3, 32]), st.booleans())
def test_chain_by_runs_numbers_blocks_as_one_by_one(prompts, threshold, compiled):
    # Prompts that share prefixes and runs of keys (Mooncake's hash blocks, conversations that
    # repeat their earlier turns), walked run by run with numpy from `threshold` keys on, give
    # the ids of interning block by block, with the run's keys compared by numpy or by the
    # compiled loop.
    import simcore.engine.request as request
    shared = [k * 3 for k in range(60)]
    prompts = [shared[:len(p) // 2] + p if i % 2 else p for i, p in enumerate(prompts)]
    old = request.VECTOR_MIN_KEYS
    request.VECTOR_MIN_KEYS = threshold
    try:
        _check_chain_against_one_by_one(prompts, compiled)
    finally:
        request.VECTOR_MIN_KEYS = old
