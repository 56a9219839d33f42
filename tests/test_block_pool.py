"""The block pool's free queue (kept in three parts: freed unhashed blocks, blocks never handed
out, freed hashed blocks) behaves as vLLM's doubly linked free queue: one ordered set."""

from __future__ import annotations

import random
from collections import OrderedDict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simcore.engine.kv_cache import BlockPool


class ReferencePool:
    """The free queue as one ordered dict (head first), vLLM's order: unhashed blocks freed to
    the head, hashed ones to the tail, allocation from the head, prefix hits taken out."""

    def __init__(self, num_blocks: int) -> None:
        self.queue = OrderedDict.fromkeys(range(1, num_blocks))
        self.ref = [0] * num_blocks
        self.hash = [0] * num_blocks

    def allocate(self, n: int) -> list[int]:
        out = [self.queue.popitem(last=False)[0] for _ in range(n)]
        for b in out:
            self.ref[b] = 1
            self.hash[b] = 0
        return out

    def touch(self, blocks: list[int]) -> None:
        for b in blocks:
            if self.ref[b] == 0:
                del self.queue[b]
            self.ref[b] += 1

    def release(self, blocks: list[int]) -> None:
        for b in reversed(blocks):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.queue[b] = None
                if not self.hash[b]:
                    self.queue.move_to_end(b, last=False)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32), st.sampled_from([6, 40, 300]))
def test_free_queue_is_an_ordered_set(seed, num_blocks):
    rng = random.Random(seed)
    pool = BlockPool(num_blocks, True)
    ref = ReferencePool(num_blocks)
    held: list[list[int]] = []
    next_hash = 1
    for _ in range(400):
        op = rng.random()
        if op < 0.4 and pool.num_free:
            n = rng.randint(1, min(pool.num_free, 12))
            blocks = pool.allocate(n)
            assert blocks == ref.allocate(n)
            k = rng.randint(0, n)          # the leading blocks filled: hashed
            pool.cache_many(blocks[:k], list(range(next_hash, next_hash + k)))
            for b in blocks[:k]:
                ref.hash[b] = next_hash
                next_hash += 1
            held.append(blocks)
        elif op < 0.6 and pool.cached:
            # A prefix hit on cached blocks, free or held.
            hit = [pool.get_cached(h) for h in
                   rng.sample(sorted(pool.cached), min(len(pool.cached), 5))]
            pool.touch(hit)
            ref.touch(hit)
            held.append(hit)
        elif held:
            blocks = held.pop(rng.randrange(len(held)))
            pool.release(blocks)
            ref.release(blocks)
        assert pool.free_queue() == list(ref.queue)
        assert pool.num_free == len(ref.queue)
        assert all(pool.is_free(b) == (b in ref.queue) for b in range(1, num_blocks))


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32), st.sampled_from([2, 7, 40, 300]))
def test_array_pool_matches_the_python_pool(seed, num_blocks):
    """The compiled pool gives every operation's result and leaves every view (free queue, prefix
    cache, ref counts, hashes, evictions) as the Python pool does, hashes shared by several
    blocks and negative (unkeyed) hashes included."""
    from simcore.engine.array_pool import ArrayBlockPool

    rng = random.Random(seed)
    py, arr = BlockPool(num_blocks, True), ArrayBlockPool(num_blocks, True)
    held: list[list[int]] = []
    hashes = [h for h in range(-6, 9) if h]        # few, so that blocks share them
    for _ in range(300):
        op = rng.random()
        if op < 0.35 and py.num_free:
            n = rng.randint(1, min(py.num_free, 12))
            blocks = py.allocate(n)
            assert arr.allocate(n) == blocks
            k = rng.randint(0, n)
            keys = [rng.choice(hashes) for _ in range(k)]
            if k == 1 and rng.random() < 0.5:
                py.cache(blocks[0], keys[0])
                arr.cache(blocks[0], keys[0])
            else:
                py.cache_many(blocks[:k], keys)
                arr.cache_many(blocks[:k], keys)
            held.append(blocks)
        elif op < 0.55:
            query = [rng.choice(hashes) for _ in range(rng.randint(0, 6))]
            hit = py.longest_cached(query)
            assert arr.longest_cached(query) == hit
            assert [arr.get_cached(h) for h in query] == [py.get_cached(h) for h in query]
            assert arr.num_evictable(hit) == py.num_evictable(hit)
            if hit:
                py.touch(hit)
                arr.touch(hit)
                held.append(hit)
        elif held:
            blocks = held.pop(rng.randrange(len(held)))
            py.release(blocks)
            arr.release(blocks)
        assert arr.free_queue() == py.free_queue()
        assert arr.num_free == py.num_free and arr.num_evictions == py.num_evictions
        assert arr.cached == py.cached
        assert arr.ref_cnt == py.ref_cnt and arr.block_hash == py.block_hash
        assert all(arr.is_free(b) == py.is_free(b) for b in range(1, num_blocks))


@pytest.mark.parametrize("hit", [0, 1, 63, 64, 65, 191, 192, 193, 400, 449, 450])
def test_a_long_lookup_finds_the_hit_whatever_its_length(hit):
    """The compiled pool looks hashes up in chunks that double (64, 128, ...): a hit that ends
    anywhere, at a chunk's edge or past the query, is the Python pool's."""
    from simcore.engine.array_pool import ArrayBlockPool

    py, arr = BlockPool(500, True), ArrayBlockPool(500, True)
    blocks = py.allocate(hit)
    assert arr.allocate(hit) == blocks
    py.cache_many(blocks, list(range(1, hit + 1)))
    arr.cache_many(blocks, list(range(1, hit + 1)))
    query = list(range(1, 451))
    assert arr.longest_cached(query) == py.longest_cached(query) == blocks[:450]


def test_a_full_ring_of_hashed_free_blocks_keeps_its_live_entries_in_order():
    """The compiled pool holds its freed hashed blocks in a ring whose entries a prefix hit
    leaves stale: hits on free blocks, each freed again, fill the ring with stale entries
    until it is compacted, many times over, with the free queue the Python pool's throughout."""
    from simcore.engine.array_pool import QHEAD, QTAIL, ArrayBlockPool

    rng = random.Random(7)
    num_blocks = 9
    py, arr = BlockPool(num_blocks, True), ArrayBlockPool(num_blocks, True)
    blocks = py.allocate(num_blocks - 1)
    assert arr.allocate(num_blocks - 1) == blocks
    py.cache_many(blocks, list(range(1, num_blocks)))
    arr.cache_many(blocks, list(range(1, num_blocks)))
    py.release(blocks)
    arr.release(blocks)
    ring = len(arr.queue)
    appended = 0
    for _ in range(20 * ring):
        hit = rng.sample(blocks, rng.randint(1, 3))
        py.touch(hit)
        arr.touch(hit)
        rng.shuffle(hit)
        py.release(hit)
        arr.release(hit)
        appended += len(hit)
        assert arr.free_queue() == py.free_queue()
        assert arr.num_free == py.num_free
        assert all(arr.is_free(b) == py.is_free(b) for b in range(1, num_blocks))
        assert arr.counts[QTAIL] - arr.counts[QHEAD] <= ring
    assert appended > 10 * ring       # the ring was compacted again and again
    assert arr.allocate(num_blocks - 1) == py.allocate(num_blocks - 1)
    assert arr.num_evictions == py.num_evictions
