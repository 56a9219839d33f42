"""External KV through a KV connector: asynchronous loads in WAITING_FOR_REMOTE_KVS, the external
tier and its connector, the P/D decode connector, and KV-block conservation with loads as a property.

Micro-scenarios use 64 blocks of 16 tokens; each expected value is worked out in the comments.
"""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simcore.engine import conformance
from simcore.engine.conformance import compare, load_scenario, read_steps, replay
from simcore.engine.connector import DisaggDecodeConnector, DisaggPrefillConnector, KVConnector
from simcore.engine.kv_tier import ExternalKVTier, TierConnector
from simcore.engine.request import (FINISHED, PREEMPTED, RUNNING, WAITING, WAITING_FOR_REMOTE_KVS,
                                    BlockHashSpace, Request)
from simcore.engine.scheduler import Scheduler, SchedulerConfig
from simcore.reference_data import CONFORMANCE_DIR as DATA

KEYS = tuple(range(1, 11))
"""Content keys of ten full blocks shared by the requests of a scenario."""
OTHER_KEYS = tuple(range(21, 31))
"""Ten blocks of other content."""


def cfg(**kw):
    base = dict(max_num_seqs=8, max_num_batched_tokens=256, num_blocks=64, block_size=16,
                max_model_len=4096)
    base.update(kw)
    return SchedulerConfig(**base)


def store_chain(tier: ExternalKVTier, space: BlockHashSpace, num_blocks: int, keys=KEYS) -> None:
    """Store the first `num_blocks` blocks of the chain with content `keys` in `tier`."""
    donor = Request("donor", -1, 16 * len(keys), 1, keys)
    tier.store(donor.ensure_block_hashes(space, 16)[:num_blocks])


def tier_with(space: BlockHashSpace, num_blocks: int) -> ExternalKVTier:
    tier = ExternalKVTier(100)
    store_chain(tier, space, num_blocks)
    return tier


def plan(out):
    return [(r.request_id, n, before) for r, n, before in out.scheduled]


def run_to_end(s: Scheduler, max_steps=10_000):
    steps = []
    while s.has_requests and len(steps) < max_steps:
        out = s.schedule()
        s.update(out)
        steps.append(out)
    assert not s.has_requests
    return steps


class Scripted:
    """A connector answering from a table {request id: (tokens, asynchronous)}, once per request,
    and recording every call (a finish with the blocks the request holds at that moment)."""

    def __init__(self, answers):
        self.answers = dict(answers)
        self.calls = []
        self.sched = None

    def get_num_new_matched_tokens(self, req, num_local_computed_tokens):
        self.calls.append(("match", req.request_id, num_local_computed_tokens))
        return self.answers.get(req.request_id, (0, False))

    def update_state_after_alloc(self, req, num_external_tokens):
        self.calls.append(("alloc", req.request_id, num_external_tokens))
        self.answers.pop(req.request_id, None)

    def request_finished(self, req):
        self.calls.append(("finished", req.request_id, self.sched.kv.num_blocks_held(req)))


def scripted(answers, **kw):
    conn = Scripted(answers)
    s = conn.sched = Scheduler(cfg(**kw), connector=conn)
    return s, conn


# -- asynchronous loads from the tier ---------------------------------------------------------
def test_tier_hit_waits_for_remote_kv_then_runs_with_the_loaded_tokens_computed(
        blocks_conserved):
    space = BlockHashSpace()
    conn = TierConnector(tier_with(space, 8), 16, space)
    s = Scheduler(cfg(), space, conn)
    a = Request("a", 0, 170, 3, KEYS)
    s.add_request(a)
    out = s.schedule()
    # No local hit; the tier holds blocks 0-7: 128 tokens to load. Blocks for 0 + 128 tokens
    # (8) are allocated, no token budget is used and nothing runs.
    assert out.kv_loads == ((a, 128),) and out.scheduled == [] and out.num_tokens == 0
    assert a.status == WAITING_FOR_REMOTE_KVS and a.num_computed_tokens == 0
    assert a.num_external_tokens == 128 and conn.loaded_tokens == {"a": 128}
    assert s.kv.num_blocks_held(a) == 8 and s.kv.num_free_blocks == 63 - 8
    assert s.has_requests and s.num_waiting_for_remote == 1 and s.num_waiting == 0
    assert s.waiting_for_remote == {"a": a}
    hashes = a.ensure_block_hashes(space, 16)
    assert not any(s.kv.pool.get_cached(h) for h in hashes)
    # The blocks being loaded are not in the prefix cache: b, same content, loads them too.
    b = Request("b", 1, 170, 3, KEYS)
    s.add_request(b)
    s.update(out)
    out = s.schedule()
    assert out.kv_loads == ((b, 128),) and out.scheduled == [] and out.computed_on_admit == {}
    s.update(out)
    # Until its load is reported done the request is passed over, step after step.
    for _ in range(3):
        out = s.schedule()
        assert out.scheduled == [] and out.kv_loads == ()
        s.update(out)
    s.finish_remote_load(a)
    assert a.status == WAITING_FOR_REMOTE_KVS          # taken up by the next schedule()
    out = s.schedule()
    # a: 8 blocks = 128 tokens computed, 170 - 128 = 42 to compute; b still loading.
    assert plan(out) == [("a", 42, 128)] and out.new == [a]
    assert out.computed_on_admit == {"a": 128} and a.num_cached_tokens == 128
    assert a.status == RUNNING and b.status == WAITING_FOR_REMOTE_KVS
    assert s.kv.num_blocks_held(a) == 11                # ceil(170 / 16)
    # The loaded blocks are in the prefix cache now, and so are the two a computed (8, 9).
    assert all(s.kv.pool.get_cached(h) for h in hashes[:10])
    s.update(out)
    s.finish_remote_load(b)
    out = s.schedule()
    # a decodes; b's loaded blocks count as computed (128), as in vLLM, though a now holds 160
    # tokens of the same content: b's prefix lookup was made before its load.
    assert plan(out) == [("a", 1, 170), ("b", 42, 128)]
    s.update(out)
    run_to_end(s)
    assert a.status == b.status == FINISHED and s.kv.num_free_blocks == 63
    blocks_conserved(s)


def test_local_hit_then_tier_blocks_after_it():
    space = BlockHashSpace()
    tier = ExternalKVTier(100)
    s = Scheduler(cfg(), space, TierConnector(tier, 16, space))
    s.add_request(Request("w", 0, 64, 1, KEYS[:4]))      # computes blocks 0-3 locally
    run_to_end(s)
    store_chain(tier, space, 10)
    a = Request("a", 1, 200, 2, KEYS)
    s.add_request(a)
    out = s.schedule()
    # Local hit: blocks 0-3 (64 tokens). The tier holds 0-9; after the local hit, 4-9 load:
    # 96 tokens. Held: the 4 hit blocks plus 6 new ones.
    assert out.kv_loads == ((a, 96),)
    assert s.kv.num_blocks_held(a) == 10 and s.kv.num_cached_block["a"] == 4
    s.finish_remote_load(a)
    s.update(out)
    out = s.schedule()
    assert plan(out) == [("a", 200 - 160, 160)] and out.computed_on_admit == {"a": 160}


def test_tier_load_never_reaches_the_last_token():
    space = BlockHashSpace()
    conn = TierConnector(tier_with(space, 10), 16, space)
    s = Scheduler(cfg(), space, conn)
    a = Request("a", 0, 160, 2, KEYS)         # exactly 10 full blocks, all in the tier
    s.add_request(a)
    out = s.schedule()
    # The block holding token 160 is never loaded (as it is never a local hit): 9 blocks.
    assert out.kv_loads == ((a, 144),)
    s.finish_remote_load(a)
    s.update(out)
    assert plan(s.schedule()) == [("a", 16, 144)]


def test_min_external_blocks_ignores_short_tier_hits():
    space = BlockHashSpace()
    conn = TierConnector(tier_with(space, 2), 16, space, min_external_blocks=3)
    s = Scheduler(cfg(), space, conn)
    s.add_request(Request("a", 0, 170, 2, KEYS))
    out = s.schedule()
    assert out.kv_loads == () and plan(out) == [("a", 170, 0)]


def test_a_load_of_every_token_recomputes_the_last_one():
    s, conn = scripted({"a": (32, True)})
    a = Request("a", 0, 32, 2)
    s.add_request(a)
    out = s.schedule()
    assert out.kv_loads == ((a, 32),) and s.kv.num_blocks_held(a) == 2
    s.finish_remote_load(a)
    s.update(out)
    out = s.schedule()
    # 2 blocks = 32 tokens = all of them: vLLM counts 31 computed and recomputes the last.
    assert plan(out) == [("a", 1, 31)] and out.computed_on_admit == {"a": 31}
    emitted, _ = s.update(out)
    assert emitted == [a] and a.num_output_tokens == 1


def test_a_partial_last_block_counts_up_to_the_request_end():
    s, conn = scripted({"a": (40, True)})
    a = Request("a", 0, 40, 2)
    s.add_request(a)
    s.update(s.schedule())
    # 40 tokens in 3 blocks (48 slots): computed = min(48, 40) - 1 = 39.
    s.finish_remote_load(a)
    assert plan(s.schedule()) == [("a", 1, 39)]


def test_connector_calls_in_order_and_finish_sees_the_blocks():
    s, conn = scripted({"a": (48, True)})
    a = Request("a", 0, 100, 2)
    s.add_request(a)
    s.update(s.schedule())
    s.finish_remote_load(a)
    run_to_end(s)
    # Asked once, at the first admission; told of the allocation with the load (48) and again
    # with 0 when the request is admitted after it; told of the finish while it still holds
    # its 7 blocks (101 tokens computed at most).
    assert conn.calls == [("match", "a", 0), ("alloc", "a", 48), ("alloc", "a", 0),
                          ("finished", "a", 7)]
    assert isinstance(conn, KVConnector)


# -- the cap on concurrent loads ---------------------------------------------------------------
def test_max_kvc_ready_requests_holds_the_third_load_until_one_finishes():
    space = BlockHashSpace()
    tier = tier_with(space, 8)
    store_chain(tier, space, 8, OTHER_KEYS)
    s = Scheduler(cfg(max_kvc_ready_requests=2), space, TierConnector(tier, 16, space))
    a, b = (Request(x, i, 170, 2, KEYS) for i, x in enumerate("ab"))
    c = Request("c", 2, 170, 2, OTHER_KEYS)
    d = Request("d", 3, 50, 2)                  # nothing external
    for r in (a, b, c, d):
        s.add_request(r)
    out = s.schedule()
    # a and b start loading; c is refused a load and keeps its place; d, behind it, runs.
    assert out.kv_loads == ((a, 128), (b, 128)) and plan(out) == [("d", 50, 0)]
    assert c.status == WAITING and s.kv.num_blocks_held(c) == 0
    assert [r.request_id for r in s.waiting] == ["a", "b", "c"]
    assert s.num_waiting_for_remote == 2 and s.num_waiting == 1
    s.update(out)
    out = s.schedule()
    assert out.kv_loads == () and plan(out) == [("d", 1, 50)]
    s.update(out)
    s.finish_remote_load(a)
    out = s.schedule()
    # a is taken up and runs; then b is passed over; c may load now (one load under way).
    assert plan(out) == [("a", 42, 128)] and out.kv_loads == ((c, 128),)
    assert s.num_waiting_for_remote == 2 and [r.request_id for r in s.waiting] == ["b", "c"]
    s.update(out)
    s.finish_remote_load(c)
    s.finish_remote_load(b)
    out = s.schedule()
    assert plan(out) == [("a", 1, 170), ("b", 42, 128), ("c", 42, 128)]


def test_a_load_that_does_not_fit_stops_admission():
    s, conn = scripted({"a": (48, True)}, num_blocks=4)
    s.add_request(Request("a", 0, 100, 2))     # needs 7 blocks to fit whole, 3 to load
    s.add_request(Request("b", 1, 16, 2))
    s.add_request(Request("big", 2, 40, 2))
    s.running.append(Request("r", 3, 10, 5))   # something running: the whole sequence must fit
    s.kv.allocate_slots(s.running[0], 10)
    out = s.schedule()
    # a's whole sequence does not fit the 2 free blocks: admission stops at it, as in vLLM.
    assert out.kv_loads == () and plan(out) == [("r", 10, 0)]
    assert s.waiting.peek().request_id == "a" and conn.calls == [("match", "a", 0)]


# -- synchronous loads -------------------------------------------------------------------------
def test_synchronous_load_counts_the_tokens_computed_at_once():
    space = BlockHashSpace()
    conn = TierConnector(tier_with(space, 8), 16, space, load_async=False)
    s = Scheduler(cfg(), space, conn)
    a = Request("a", 0, 170, 2, KEYS)
    b = Request("b", 1, 170, 2, KEYS)
    s.add_request(a)
    s.add_request(b)
    out = s.schedule()
    # a: 128 tokens loaded within the step, 42 computed; its full blocks (0-9) are cached as
    # they are allocated, so b hits 10 of them locally and computes the last 10 tokens.
    assert out.kv_loads == ((a, 128),)
    assert plan(out) == [("a", 42, 128), ("b", 10, 160)]
    assert out.computed_on_admit == {"a": 128, "b": 160} and a.status == RUNNING
    assert s.num_waiting_for_remote == 0 and s.kv.num_blocks_held(a) == 11


def test_synchronous_load_must_leave_a_token():
    s, _ = scripted({"a": (32, False)})
    s.add_request(Request("a", 0, 32, 2))
    with pytest.raises(ValueError, match="synchronous KV load must leave a token"):
        s.schedule()


def test_a_match_beyond_the_request_is_refused():
    s, _ = scripted({"a": (48, True)})
    s.add_request(Request("a", 0, 32, 2))
    with pytest.raises(ValueError, match="matched 48 tokens after 0 of request 'a'"):
        s.schedule()


def test_finish_remote_load_of_a_request_not_loading_is_refused():
    s, _ = scripted({})
    a = Request("a", 0, 32, 2)
    s.add_request(a)
    with pytest.raises(ValueError, match="not waiting for remote KV"):
        s.finish_remote_load(a)


# -- preemption --------------------------------------------------------------------------------
def test_abort_while_loading_frees_the_blocks_when_the_load_ends(blocks_conserved):
    s, _ = scripted({"a": (32, True)})
    a = Request("a", 0, 64, 2)
    s.add_request(a)
    s.schedule()
    assert a.status == WAITING_FOR_REMOTE_KVS and s.kv.num_blocks_held(a) == 2
    assert s.finish_requests([a]) == [a]
    # As vLLM's finish_requests delays the free: the load is still writing into the blocks.
    assert not s.has_requests and s.num_waiting_for_remote == 0 and s.kv.num_blocks_held(a) == 2
    s.finish_remote_load(a)
    assert s.kv.num_blocks_held(a) == 0
    blocks_conserved(s)
    with pytest.raises(ValueError, match="not waiting for remote KV"):
        s.finish_remote_load(a)


def test_a_preempted_request_reloads_and_resumes():
    s, conn = scripted({"a": (64, True)}, enable_prefix_caching=False)
    a = Request("a", 0, 100, 50)
    s.add_request(a)
    s.update(s.schedule())
    s.finish_remote_load(a)
    s.update(s.schedule())
    s.running.remove(a)
    s._preempt(a)
    conn.answers["a"] = (96, True)          # say, the tier now has its first six blocks
    out = s.schedule()
    assert out.kv_loads == ((a, 96),) and out.preempted == []
    s.finish_remote_load(a)
    s.update(out)
    out = s.schedule()
    # Back to PREEMPTED after the load, so it is resumed; 101 tokens, 96 computed.
    assert out.resumed == [a] and plan(out) == [("a", 5, 96)]


def test_requests_loading_are_never_preempted(blocks_conserved):
    s, conn = scripted({"l": (64, True)}, num_blocks=12, enable_prefix_caching=False)
    r = Request("r", 0, 32, 100)
    s.add_request(r)
    s.update(s.schedule())
    loading = Request("l", 1, 80, 2)
    s.add_request(loading)
    out = s.schedule()
    assert out.kv_loads == ((loading, 64),) and s.kv.num_blocks_held(loading) == 4
    s.update(out)
    # r grows to 7 more blocks than it holds: the pool (11 usable, 4 held by the load) runs out
    # and r preempts itself; the loading request keeps its blocks.
    preempted = []
    for _ in range(200):
        out = s.schedule()
        preempted += out.preempted
        s.update(out)
        if preempted:
            break
    assert preempted == [r] and loading.status == WAITING_FOR_REMOTE_KVS
    assert s.kv.num_blocks_held(loading) == 4
    blocks_conserved(s)


# -- P/D disaggregation: the decode side -------------------------------------------------------
def test_disagg_decode_loads_the_remote_prefill_then_decodes():
    conn = DisaggDecodeConnector(16)
    s = Scheduler(cfg(), connector=conn)
    p = Request("p", 0, 100, 3, remote_prefill_tokens=100)
    s.add_request(p)
    out = s.schedule()
    # The whole prompt's KV comes from the prefill instance: 100 tokens in 7 blocks.
    assert out.kv_loads == ((p, 100),) and out.scheduled == []
    assert s.kv.num_blocks_held(p) == 7
    s.update(out)
    s.finish_remote_load(p)
    steps = run_to_end(s)
    # 99 tokens computed; the last prompt token is recomputed and samples the first output;
    # then two decode steps.
    assert [plan(o) for o in steps] == [[("p", 1, 99)], [("p", 1, 100)], [("p", 1, 101)]]
    assert p.status == FINISHED and p.num_output_tokens == 3
    assert conn.loaded_tokens == {"p": 100} and conn.num_loaded_tokens == 100


def test_disagg_decode_partial_remote_prefill_loads_whole_blocks():
    conn = DisaggDecodeConnector(16)
    s = Scheduler(cfg(), connector=conn)
    p = Request("p", 0, 100, 2, remote_prefill_tokens=40)
    s.add_request(p)
    out = s.schedule()
    # 40 tokens prefilled remotely: blocks 0-1 (32 tokens) load; the rest is computed here.
    assert out.kv_loads == ((p, 32),)
    s.update(out)
    s.finish_remote_load(p)
    assert plan(s.schedule()) == [("p", 68, 32)]


def test_disagg_decode_loads_only_at_the_first_admission():
    conn = DisaggDecodeConnector(16)
    s = Scheduler(cfg(), connector=conn)
    p = Request("p", 0, 100, 50, remote_prefill_tokens=100)
    s.add_request(p)
    s.update(s.schedule())
    s.finish_remote_load(p)
    s.update(s.schedule())
    s.running.remove(p)
    s._preempt(p)
    out = s.schedule()
    # After a preemption the request recomputes locally, from its own cached blocks (6 full
    # blocks of the 101 tokens it has).
    assert out.kv_loads == () and out.resumed == [p] and plan(out) == [("p", 5, 96)]


def test_disagg_decode_local_hit_shortens_the_load():
    conn = DisaggDecodeConnector(16)
    space = BlockHashSpace()
    s = Scheduler(cfg(), space, conn)
    s.add_request(Request("w", 0, 64, 1, KEYS[:4]))
    run_to_end(s)
    p = Request("p", 1, 100, 2, KEYS[:6], remote_prefill_tokens=100)
    s.add_request(p)
    out = s.schedule()
    assert out.kv_loads == ((p, 36),) and s.kv.num_blocks_held(p) == 7


# -- the tier on its own -----------------------------------------------------------------------
def test_tier_lookup_counts_consecutive_hits_from_start():
    tier = ExternalKVTier(10)
    assert tier.store([1, 2, 3]) == 3
    assert tier.lookup([1, 2, 3, 4]) == 3
    assert tier.lookup([1, 2, 3, 4], start=1) == 2
    assert tier.lookup([1, 2, 3, 4], start=1, stop=2) == 1
    assert tier.lookup([9, 2, 3]) == 0
    assert (tier.num_lookups, tier.num_hit_blocks) == (4, 6)
    assert tier.store([1, 2, 3, 4]) == 1 and tier.num_stored_blocks == 4


def test_tier_evicts_least_recently_used_keeping_chain_prefixes():
    tier = ExternalKVTier(4)
    tier.store([1, 2, 3])                 # stored last first: 1 is the most recent
    tier.store([10, 11])                  # full at the 5th: evicts the LRU, 3 (a chain's tail)
    assert 3 not in tier and all(h in tier for h in (1, 2, 10, 11))
    assert (tier.num_stored_blocks, tier.num_evicted_blocks) == (5, 1)
    assert tier.lookup([1, 2, 3]) == 2    # touches 2 then 1: order now 11, 10, 2, 1
    tier.store([20])
    assert 11 not in tier and 10 in tier and len(tier) == 4
    tier.store([30, 31])
    assert 10 not in tier and 2 not in tier and 1 in tier and len(tier) == 4
    assert tier.num_evicted_blocks == 4


def test_tier_stores_only_the_chain_prefix_that_fits():
    tier = ExternalKVTier(2)
    assert tier.store([1, 2, 3]) == 2 and 3 not in tier and tier.num_evicted_blocks == 0
    empty = ExternalKVTier(0)
    assert empty.store([1]) == 0 and len(empty) == 0


def test_finished_requests_are_stored_in_the_tier():
    space = BlockHashSpace()
    tier = ExternalKVTier(100)
    s = Scheduler(cfg(), space, TierConnector(tier, 16, space))
    a = Request("a", 0, 170, 30, KEYS)
    s.add_request(a)
    run_to_end(s)
    # 170 + 30 tokens, 199 computed: 12 full blocks (10 prompt blocks with shared content, and
    # the blocks ending at tokens 176 and 192, unique to a).
    hashes = a.ensure_block_hashes(space, 16)
    assert len(tier) == 12 and all(h in tier for h in hashes[:12])
    # Another engine sharing the space and the tier loads the shared blocks.
    s2 = Scheduler(cfg(), space, TierConnector(tier, 16, space))
    s2.add_request(Request("b", 1, 170, 2, KEYS))
    assert s2.schedule().kv_loads[0][1] == 160


# -- without external KV, decisions are vLLM's -------------------------------------------------
class NeverMatches:
    def get_num_new_matched_tokens(self, req, num_local_computed_tokens):
        return 0, False

    def update_state_after_alloc(self, req, num_external_tokens):
        pass

    def request_finished(self, req):
        pass


@pytest.mark.parametrize("name", ["pressure", "prefix", "threshold", "nochunk"])
@pytest.mark.parametrize("make", [lambda space: NeverMatches(),
                                  lambda space: TierConnector(ExternalKVTier(0), 16, space)],
                         ids=["never", "empty_tier"])
def test_a_connector_with_nothing_external_keeps_vllm_decisions(monkeypatch, name, make):
    def with_connector(config):
        space = BlockHashSpace()
        return Scheduler(config, space, make(space))
    monkeypatch.setattr(conformance, "Scheduler", with_connector)
    ours = list(replay(load_scenario(DATA / "scenarios" / f"{name}.json.gz")))
    assert compare(ours, read_steps(DATA / "golden" / f"{name}.jsonl.gz")) is None


# -- blocks conserved with loads, as a property ------------------------------------------------
class PerRequest:
    """The P/D connector for requests prefilled remotely, the tier for the others."""

    def __init__(self, disagg, tier):
        self.disagg = disagg
        self.tier = tier

    def _pick(self, req):
        return self.disagg if req.remote_prefill_tokens else self.tier

    def get_num_new_matched_tokens(self, req, num_local_computed_tokens):
        return self._pick(req).get_num_new_matched_tokens(req, num_local_computed_tokens)

    def update_state_after_alloc(self, req, num_external_tokens):
        self._pick(req).update_state_after_alloc(req, num_external_tokens)

    def request_finished(self, req):
        self._pick(req).request_finished(req)


def run_with_loads(reqs, num_blocks, budget, chunked, caching, lwd, priority, seqs, limit,
                   load_async, tier_blocks, seed, blocks_conserved) -> Scheduler:
    """Run requests (% of max_model_len, % of it output, prefix group, arrival step, P/D kind)
    with the tier and P/D connectors, each load ending 0-5 steps after it starts; check KV-block
    conservation and the loads' invariants after every step and that every request finishes."""
    rng = random.Random(seed)
    # Requests small enough that the loads under way, one load taken up and not yet admitted,
    # and the request at the head of the queue always fit the pool together (see Scheduler).
    max_len = 16 * ((num_blocks - 1) // (limit + 2))
    if not chunked:
        budget = max(budget, max_len)
    config = SchedulerConfig(max_num_seqs=seqs, max_num_batched_tokens=budget,
                             num_blocks=num_blocks, block_size=16, max_model_len=max_len,
                             enable_chunked_prefill=chunked, enable_prefix_caching=caching,
                             preemption="least_work_done" if lwd else "vllm",
                             policy="priority" if priority else "fcfs",
                             max_kvc_ready_requests=limit)
    space = BlockHashSpace()
    tier = ExternalKVTier(tier_blocks)
    for prefix in (1, 2, 3):                 # some shared content is in the tier from the start
        store_chain(tier, space, rng.randint(0, 20), tuple(range(100 * prefix, 100 * prefix + 20)))
    connector = PerRequest(DisaggDecodeConnector(16),
                           TierConnector(tier, 16, space, load_async=load_async))
    s = Scheduler(config, space, connector)
    made = []
    for i, (size, out_share, prefix, arrive, remote) in enumerate(reqs):
        total = max(2, max_len * size // 100)
        olen = min(max(1, total * out_share // 100), total - 1)
        plen = total - olen
        keys = tuple(range(100 * prefix, 100 * prefix + plen // 16)) if prefix else ()
        remote_tokens = (0, plen, rng.randint(1, plen))[remote]
        made.append((arrive, Request(f"r{i}", i, plen, olen, keys, priority=rng.randint(0, 2),
                                     arrival=float(i), remote_prefill_tokens=remote_tokens)))
    pending = sorted(made, key=lambda p: (p[0], p[1].index))
    due: list[tuple[int, Request]] = []
    expect: dict[str, tuple[int, int]] = {}     # id -> (blocks held, computed after the load)
    step = 0
    while (pending or s.has_requests) and step < 20_000:
        while pending and pending[0][0] <= step:
            s.add_request(pending.pop(0)[1])
        for d, r in list(due):
            if d <= step:
                s.finish_remote_load(r)
                due.remove((d, r))
        out = s.schedule()
        assert out.num_tokens <= budget and len(s.running) <= seqs
        for r, ext in out.kv_loads:
            assert ext > 0
            if r.status == WAITING_FOR_REMOTE_KVS:
                held = s.kv.num_blocks_held(r)
                assert held == -(-(s.kv.num_cached_block[r.request_id] * 16 + ext) // 16)
                expect[r.request_id] = (held, min(held * 16, r.num_tokens - 1))
                due.append((step + rng.randint(0, 5), r))
            else:
                assert r.status == RUNNING and not load_async
        for r in out.new + out.resumed:
            if r.request_id in expect:
                assert out.computed_on_admit[r.request_id] == expect.pop(r.request_id)[1]
        assert all(r.status != WAITING_FOR_REMOTE_KVS for r, _, _ in out.scheduled)
        assert all(r.status in (WAITING, PREEMPTED) for r in out.preempted)
        s.update(out)
        # Loads hold exactly their blocks, none of the loaded ones cached yet, and are queued.
        assert len(s.waiting_for_remote) <= limit
        queued = set(map(id, s.waiting))
        for rid, r in s.waiting_for_remote.items():
            assert r.status == WAITING_FOR_REMOTE_KVS and id(r) in queued
            blocks = s.kv.req_blocks[rid]
            assert len(blocks) == expect[rid][0]
            assert not any(s.kv.pool.block_hash[b] for b in blocks[s.kv.num_cached_block[rid]:])
        blocks_conserved(s)
        step += 1
    assert step < 20_000
    assert all(r.status == FINISHED for _, r in made)
    assert all(r.num_output_tokens == r.max_tokens for _, r in made)
    assert s.kv.num_free_blocks == num_blocks - 1 and len(tier) <= tier_blocks
    return s


requests_strategy = st.lists(
    st.tuples(st.integers(1, 100), st.integers(1, 100), st.integers(0, 3), st.integers(0, 6),
              st.integers(0, 2)),
    min_size=1, max_size=25)


@settings(max_examples=60, deadline=None)
@given(reqs=requests_strategy, num_blocks=st.integers(30, 120), budget=st.integers(16, 300),
       chunked=st.booleans(), caching=st.booleans(), lwd=st.booleans(),
       priority=st.booleans(), seqs=st.integers(1, 8), limit=st.integers(1, 3),
       load_async=st.booleans(), tier_blocks=st.integers(0, 60), seed=st.integers(0, 2**32 - 1))
def test_blocks_are_conserved_with_loads_and_every_request_finishes(
        reqs, num_blocks, budget, chunked, caching, lwd, priority, seqs, limit, load_async,
        tier_blocks, seed, blocks_conserved):
    run_with_loads(reqs, num_blocks, budget, chunked, caching, lwd, priority, seqs, limit,
                   load_async, tier_blocks, seed, blocks_conserved)


def test_blocks_are_conserved_with_loads_under_memory_pressure(blocks_conserved):
    """Many long requests at once, so that loads meet preemption (rare in the property test)."""
    totals = {"preemptions": 0, "loads": 0}
    for seed in range(30):
        rng = random.Random(seed)
        reqs = [(rng.randint(40, 100), rng.randint(30, 80), rng.randint(0, 3), rng.randint(0, 2),
                 rng.randint(0, 2)) for _ in range(20)]
        s = run_with_loads(reqs, rng.randint(40, 120), rng.randint(64, 512), rng.random() < 0.8,
                           rng.random() < 0.7, rng.random() < 0.3, rng.random() < 0.3,
                           rng.randint(4, 8), rng.randint(1, 3), rng.random() < 0.8,
                           rng.randint(0, 60), seed, blocks_conserved)
        totals["preemptions"] += s.num_preemptions
        totals["loads"] += s.connector.disagg.num_loaded_tokens + s.connector.tier.num_loaded_tokens
    assert totals["preemptions"] > 50 and totals["loads"] > 0


def test_prefill_side_holds_a_finished_prompts_blocks_until_it_is_read():
    s = Scheduler(cfg(num_blocks=20), connector=DisaggPrefillConnector())
    free0 = s.kv.num_free_blocks
    req = Request("p", 0, 100, 1)              # max_tokens 1: prefill and one sampled token
    s.add_request(req)
    out = s.schedule()
    assert plan(out) == [("p", 100, 0)]
    emitted, finished = s.update(out)
    assert finished == [req] and req.status == FINISHED
    # 100 tokens in 16-token blocks: 7 blocks stay allocated while the KV is being read.
    assert s.sending == {"p": req}
    assert s.kv.num_free_blocks == free0 - 7
    s.finish_sending(req)
    assert s.sending == {} and s.kv.num_free_blocks == free0
    with pytest.raises(ValueError, match="not holding blocks"):
        s.finish_sending(req)
