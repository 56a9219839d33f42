"""The level-order max-min solver: hand-computed rates, the same rates to the bit as the
whole-array rounds on random links and flows full of ties, both of its paths (the heap walk and
numpy's order) exercised, its Python source computing what numba compiles, and the flow fabric
giving byte-identical results whichever solver it uses."""

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simcore.fabric import level_order
from simcore.fabric.flow import FlowFabric, MaxMinSolver
from simcore.fabric.level_order import LevelOrderSolver
from simcore.fabric.topology import dumbbell, fat_tree, leaf_spine, star

D = 1e-6


def _hops(paths, num_links):
    out = np.full((max(len(p) for p in paths), len(paths)), num_links, dtype=np.int64)
    for f, p in enumerate(paths):
        out[:len(p), f] = p
    return out


def _solve_both(paths, caps):
    num_links = len(caps)
    capacity = np.append(np.asarray(caps, dtype=float), math.inf)
    hops, flows = _hops(paths, num_links), np.arange(len(paths))
    want = MaxMinSolver(num_links + 1).solve(hops, capacity, flows).copy()
    got = LevelOrderSolver(num_links + 1).solve(hops, capacity, flows).copy()
    return got, want


def _textbook(paths, caps):
    """Progressive filling one bottleneck at a time, in exact fractions."""
    residual = [Fraction(c) for c in caps]
    rates = [None] * len(paths)
    while any(r is None for r in rates):
        best = None
        for link in range(len(caps)):
            users = [f for f, p in enumerate(paths) if rates[f] is None and link in p]
            if users and (best is None or residual[link] / len(users) < best[0]):
                best = (residual[link] / len(users), users)
        share, users = best
        for f in users:
            rates[f] = share
            for link in paths[f]:
                residual[link] -= share
    return [float(r) for r in rates]


def test_hand_computed_rates():
    # A (10) carries f0, f1; B (20) carries f0, f2; C (6) carries f2, f3. C is the lowest level
    # (3), which freezes f2 and f3; then A at 5 freezes f0 and f1; B keeps 20 - 3 - 5 unused.
    got, want = _solve_both([[0, 1], [0], [1, 2], [2]], [10, 20, 6])
    assert got.tolist() == [5.0, 5.0, 3.0, 3.0]
    assert np.array_equal(got, want)


def test_hand_computed_ties_need_numpys_order():
    # Two disjoint flows over links of one capacity: every link ties, so the walk's prefix ends
    # inside a group of equal levels and the round is walked again in numpy's order.
    got, want = _solve_both([[0, 1], [2, 3]], [4, 4, 4, 4])
    assert got.tolist() == [4.0, 4.0]
    assert np.array_equal(got, want)
    # Three flows on one link of 1 share it in thirds; the fourth, alone on a link of 2, gets 2.
    got, want = _solve_both([[0], [0, 1], [0, 2], [3]], [1, 5, 5, 2])
    assert got.tolist() == [1 / 3, 1 / 3, 1 / 3, 2.0]
    assert np.array_equal(got, want)


def test_a_lone_flow_gets_its_slowest_link():
    got, want = _solve_both([[2, 0, 1]], [7, 3, 9])
    assert got.tolist() == want.tolist() == [3.0]


@given(st.data())
@settings(max_examples=300, deadline=None)
def test_same_bits_as_the_rounds_and_the_textbook_rates(data):
    num_links = data.draw(st.integers(1, 8))
    # Few distinct capacities make many equal levels, whose order is what the walk must get right.
    caps = data.draw(st.lists(st.sampled_from([1, 2, 3, 6, 12]), min_size=num_links,
                              max_size=num_links))
    paths = data.draw(st.lists(st.lists(st.integers(0, num_links - 1), min_size=1, max_size=4,
                                        unique=True), min_size=1, max_size=16))
    got, want = _solve_both(paths, caps)
    assert np.array_equal(got, want)
    assert got.tolist() == pytest.approx(_textbook(paths, caps), rel=1e-12)


def _random_case(rng, trial):
    num_links = int(rng.integers(2, 120))
    if trial % 2:
        caps = rng.choice([1.0, 2.0, 3.0, 7.0, 5e10, 5e10 / 3, 1.25e9], size=num_links)
    else:
        caps = rng.random(num_links) * 10
    num_hops = int(rng.integers(1, 6))
    num_flows = int(rng.integers(1, 400))
    paths = [rng.choice(num_links, size=int(rng.integers(1, min(num_hops, num_links) + 1)),
                        replace=False).tolist() for _ in range(num_flows)]
    return np.append(caps, math.inf), paths


def test_same_bits_as_the_rounds_on_random_flow_sets(monkeypatch):
    calls = {"walks": 0, "ordered": 0}
    solve = level_order._solve

    def counting(hops, flows, order, *rest):
        calls["walks"] += 1
        calls["ordered"] += len(order) > 0
        return solve(hops, flows, order, *rest)

    monkeypatch.setattr(level_order, "_solve", counting)
    rng = np.random.default_rng(11)
    reused = LevelOrderSolver(121)
    for trial in range(1500):
        capacity, paths = _random_case(rng, trial)
        num_links = len(capacity) - 1
        hops = _hops(paths, num_links)
        rounds = MaxMinSolver(len(capacity))
        flows = np.arange(len(paths))
        want = rounds.solve(hops, capacity, flows).copy()
        assert np.array_equal(LevelOrderSolver(len(capacity)).solve(hops, capacity, flows), want)
        # One solver reused across calls, on some of the columns, its links padded to 121 (the
        # padding index 120), growing when a call has more hops or flows than it was sized for.
        wide_capacity = np.append(capacity[:-1], np.full(121 - num_links, math.inf))
        wide_hops = np.where(hops == num_links, 120, hops)
        some = np.flatnonzero(rng.random(len(paths)) < 0.6)
        if len(some):
            want = MaxMinSolver(121).solve(wide_hops, wide_capacity, some)
            assert np.array_equal(reused.solve(wide_hops, wide_capacity, some), want)
    # Both ways of ranking equal levels were taken, many times.
    assert calls["ordered"] > 100
    assert calls["walks"] - calls["ordered"] > 1000


def test_compiled_kernels_compute_what_their_python_source_does(monkeypatch):
    kernels = ["_solve", "_start", "_blocked", "_mark", "_depends_on_order", "_merge_runs",
               "_freeze", "_sift", "_heap_push", "_heap_remove", "_heap_top"]
    if not all(hasattr(getattr(level_order, k), "py_func") for k in kernels):
        pytest.skip("numba is not installed: the Python source is what runs")
    rng = np.random.default_rng(5)
    cases = [_random_case(rng, trial) for trial in range(60)]
    compiled = []
    for capacity, paths in cases:
        hops = _hops(paths, len(capacity) - 1)
        compiled.append(LevelOrderSolver(len(capacity)).solve(hops, capacity,
                                                              np.arange(len(paths))).copy())
    for k in kernels:
        monkeypatch.setattr(level_order, k, getattr(level_order, k).py_func)
    for (capacity, paths), want in zip(cases, compiled):
        hops = _hops(paths, len(capacity) - 1)
        got = LevelOrderSolver(len(capacity)).solve(hops, capacity, np.arange(len(paths)))
        assert np.array_equal(got, want)


def _fabric_outputs(fab):
    st_ = fab.stats()
    return ([(m.msg_id, m.start_s, m.end_s) for m in st_.messages],
            [(ls.bytes_sent, ls.busy_s) for ls in st_.links],
            np.asarray(st_.utilization).tobytes(), st_.duration_s)


@pytest.mark.parametrize("kind", ["leaf_spine", "fat_tree", "star", "dumbbell"])
def test_the_fabric_gives_the_same_bytes_with_either_solver(kind):
    if kind == "leaf_spine":
        topo = leaf_spine(4, 4, 2, host_rate_bps=100e9, delay_s=D, oversubscription=2)
    elif kind == "fat_tree":
        topo = fat_tree(4, rate_bps=100e9, delay_s=D)
    elif kind == "star":
        topo = star(8, rate_bps=25e9, delay_s=D)
    else:
        topo = dumbbell(3, 3, rate_bps=10e9, delay_s=D, bottleneck_rate_bps=5e9)
    rng = np.random.default_rng(len(kind))
    hosts = topo.hosts
    msgs = []
    for _ in range(400):
        src, dst = rng.choice(hosts, 2, replace=False)
        size = int(rng.choice([4096, 65536, 1_000_000, int(rng.integers(1, 3_000_000))]))
        at = float(rng.choice([0.0, 1e-5, rng.random() * 2e-3]))
        msgs.append((int(src), int(dst), size, at))
    outputs = []
    for walk_from_flows in (1, 10**9):
        fab = FlowFabric(topo, seed=3, walk_from_flows=walk_from_flows)
        for src, dst, size, at in msgs:
            fab.send(src, dst, size, at_s=at)
        fab.run()
        outputs.append(_fabric_outputs(fab))
        counters = fab.counters()
        assert counters["rate_solves"] > 0
        assert counters["solved_flows"] >= counters["rate_solves"]
    assert outputs[0] == outputs[1]


def test_an_all_to_all_is_the_same_to_the_byte_and_counts_its_solves():
    topo = leaf_spine(4, 8, 4, host_rate_bps=400e9, delay_s=D, mtu_bytes=4096, header_bytes=62)
    outputs, counters = [], []
    for walk_from_flows in (2, 10**9):
        fab = FlowFabric(topo, walk_from_flows=walk_from_flows)
        for src in topo.hosts:
            for dst in topo.hosts:
                if src != dst:
                    fab.send(src, dst, 1_000_000)
        fab.run()
        outputs.append(_fabric_outputs(fab))
        counters.append(fab.counters())
    assert outputs[0] == outputs[1]
    assert counters[0] == counters[1]
    # Every flow is active at the first solve: 32 x 31 of them.
    assert counters[0]["solved_flows"] >= 32 * 31 + counters[0]["rate_solves"] - 1
