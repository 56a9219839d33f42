"""BlockTable: a request's block ids in an int32 buffer, read as a sequence of ints."""

import numpy as np
import pytest

from simcore.engine.block_table import BlockTable


def test_a_block_table_reads_as_the_list_of_its_blocks_as_it_grows():
    t = BlockTable(2)
    ref: list[int] = []
    for chunk in ([7, 3], np.array([9], dtype=np.int32), [], [4, 5, 6]):
        t.extend(chunk)
        ref.extend(int(b) for b in chunk)
        t.append(100 + len(ref))
        ref.append(100 + len(ref))
        assert len(t) == len(ref) and t == ref and list(t) == ref and t.tolist() == ref
        assert [t[i] for i in range(-len(ref), len(ref))] == ref + ref
        assert [t.at(i) for i in range(len(ref))] == ref
        assert all(type(t[i]) is int for i in range(len(ref)))
    view = t[2:5]
    assert view.dtype == np.int32 and view.tolist() == ref[2:5]
    assert t.array.tolist() == ref and t[len(ref):].tolist() == []
    with pytest.raises(IndexError):
        t[len(ref)]
    other = BlockTable()
    other.extend(t.array)
    assert other == t and other != BlockTable() and t != ref[:-1]
