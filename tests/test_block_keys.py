"""Block keys expanded from a trace's hash ids are held as an int64 array (`BlockKeys`) that reads
as the tuple of its keys wherever a tuple of keys is read."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from simcore.engine.request import BlockHashSpace, Request
from hypothesis import given, settings
from hypothesis import strategies as st

from simcore.workload.keys import BlockKeys, hash_block_keys, hash_block_keys_many


def test_expanded_keys_are_the_tuple_the_ids_expand_to():
    keys = hash_block_keys([7, 3, 9], prompt_len=80, block_size=16, hash_block_tokens=32)
    assert isinstance(keys, BlockKeys)
    assert keys == (14, 15, 6, 7, 18) and (14, 15, 6, 7, 18) == keys
    assert hash_block_keys([], prompt_len=80, block_size=16, hash_block_tokens=32) == ()
    assert hash_block_keys([1], prompt_len=15, block_size=16, hash_block_tokens=32) == ()



@settings(max_examples=300, deadline=None)
@given(st.sampled_from([(1, 1), (16, 32), (16, 512), (2, 8), (32, 32)]),
       st.lists(st.tuples(st.lists(st.integers(0, 10**6), max_size=6),
                          st.integers(0, 300)), max_size=8))
def test_a_traces_keys_expanded_at_once_are_each_rows_own(sizes, rows):
    """`hash_block_keys_many` (a trace's rows in one pass, each a view of one array) gives what
    `hash_block_keys` gives row by row: the same keys, () for a row with none."""
    block_size, hash_block_tokens = sizes
    many = hash_block_keys_many(rows, block_size=block_size, hash_block_tokens=hash_block_tokens)
    one = [hash_block_keys(ids, prompt_len=n, block_size=block_size,
                           hash_block_tokens=hash_block_tokens) for ids, n in rows]
    assert many == one
    assert [type(k) for k in many] == [type(k) for k in one]
    for k in many:
        if k:
            with pytest.raises(ValueError):
                np.asarray(k)[0] = 1


def test_block_keys_read_as_their_tuple():
    t = tuple(range(100, 140))
    k = BlockKeys(np.array(t))
    assert len(k) == 40 and list(k) == list(t) and all(type(x) is int for x in k)
    assert k[3] == t[3] and type(k[3]) is int and k[-1] == t[-1]
    assert k[5:9] == t[5:9] and isinstance(k[5:9], BlockKeys) and k[50:] == ()
    assert k == t and k == BlockKeys(t) and k != t[:-1] and k != BlockKeys(t[1:])
    assert hash(k) == hash(t) and {k: 1}[t] == 1 and len({k, t}) == 1
    assert repr(k) == repr(t)
    assert k + (1, 2) == t + (1, 2) and (1, 2) + k == (1, 2) + t and k + k == t + t
    assert isinstance((1,) + k, BlockKeys)
    assert bool(k) and not BlockKeys(())
    assert pickle.loads(pickle.dumps(k)) == k
    assert k.count(101) == 1 and k.index(120) == 20 and 139 in k


def test_block_keys_hold_a_read_only_array_numpy_takes_as_it_is():
    src = np.arange(10, dtype=np.int64)
    k = BlockKeys(src)
    src[0] = 99                                   # a writeable array is copied
    assert k[0] == 0
    a = np.asarray(k, dtype=np.int64)
    assert not a.flags.writeable and np.asarray(k) is a
    with pytest.raises(ValueError):
        a[0] = 1
    frozen = np.arange(5, dtype=np.int64)
    frozen.flags.writeable = False
    assert np.asarray(BlockKeys(frozen)) is frozen


@pytest.mark.parametrize("n", [3, 40, 400])
def test_a_hash_space_chains_block_keys_as_it_chains_their_tuple(n):
    """The chained hashes, block by block (few keys) or run by run, are those of the tuple."""
    rng = np.random.default_rng(n)
    prompts = [rng.integers(0, 5, size=n) for _ in range(6)]
    prompts += [np.concatenate([prompts[0][:n // 2], rng.integers(0, 5, size=n - n // 2)])]
    spaces, outs = (BlockHashSpace(), BlockHashSpace()), ([], [])
    for p in prompts:
        for space, out, keys in zip(spaces, outs, (tuple(p.tolist()), BlockKeys(p))):
            hashes, _ = space.chain(keys)
            assert hashes.dtype == np.int64
            out.append(hashes.tolist())
    assert outs[0] == outs[1]


def test_a_requests_hashes_grow_in_its_buffer_and_views_taken_before_stay_right():
    """Hashes are drawn into a buffer with room (`ensure_block_hashes`, `draw_fresh`); a view
    taken earlier, or another request given them, sees the hashes of its own length only."""
    space = BlockHashSpace()
    a = Request("a", 0, 40, 40, block_keys=(5, 6))
    first = a.ensure_block_hashes(space, 16)
    assert first.dtype == np.int64 and first.tolist() == [1, 2]
    a.num_output_tokens = 30                        # 70 tokens: 4 full blocks
    assert a.ensure_block_hashes(space, 16).tolist() == [1, 2, -1, -2]
    assert first.tolist() == [1, 2] and a.num_hashes == 4
    b = Request("b", 1, 40, 40)
    b.block_hashes = a.block_hashes
    assert b.draw_fresh(space) == -3 and b.block_hashes.tolist() == [1, 2, -1, -2, -3]
    assert a.block_hashes.tolist() == [1, 2, -1, -2]
    c = Request("c", 2, 5, 40)                      # no full block yet
    assert c.draw_fresh(space) == -4 and c.draw_fresh(space) == -5
    assert c.block_hashes.tolist() == [-4, -5]
