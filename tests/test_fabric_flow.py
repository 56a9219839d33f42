"""The flow fabric: max-min fair shares with hand-computed completion times, agreement with the
analytical answer for a lone flow, byte conservation, and link loads within capacity."""

import math
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simcore.fabric.analytical import AnalyticalFabric
from simcore.fabric.messages import message_path, wire_bytes
from simcore.fabric.ecmp import default_salts
from simcore.fabric import flow as flow_module
from simcore.fabric.flow import FlowFabric, MaxMinSolver, max_min_rates
from simcore.fabric.topology import dumbbell, explicit, leaf_spine, star

D = 1e-6
C10 = 10e9 / 8          # bytes/s of a 10 Gb/s link


def _reference_max_min(paths, capacity):
    """Textbook progressive filling, one bottleneck link at a time, in plain Python."""
    rates = [0.0] * len(paths)
    frozen = [False] * len(paths)
    residual = list(capacity)
    while not all(frozen):
        best, best_link = math.inf, None
        for link, cap in enumerate(residual):
            users = [f for f, p in enumerate(paths) if link in p and not frozen[f]]
            if users and cap / len(users) < best:
                best, best_link = cap / len(users), link
        for f, p in enumerate(paths):
            if not frozen[f]:
                rates[f] += best
                for link in p:
                    residual[link] -= best
        for f, p in enumerate(paths):
            if not frozen[f] and best_link in p:
                frozen[f] = True
    return rates


def _hops(paths, num_links):
    width = max(len(p) for p in paths)
    out = np.full((width, len(paths)), num_links, dtype=np.int64)
    for f, p in enumerate(paths):
        out[:len(p), f] = p
    return out


@given(st.data())
@settings(max_examples=200, deadline=None)
def test_max_min_rates_match_textbook_progressive_filling(data):
    num_links = data.draw(st.integers(1, 6))
    capacity = data.draw(st.lists(st.integers(1, 20), min_size=num_links, max_size=num_links))
    paths = data.draw(st.lists(st.lists(st.integers(0, num_links - 1), min_size=1, max_size=4,
                                        unique=True), min_size=1, max_size=10))
    got = max_min_rates(_hops(paths, num_links), np.array(capacity + [math.inf], dtype=float))
    want = _reference_max_min(paths, [float(c) for c in capacity])
    assert got == pytest.approx(want, rel=1e-9)
    load = np.zeros(num_links)
    for f, p in enumerate(paths):
        load[p] += got[f]
    assert np.all(load <= np.array(capacity) * (1 + 1e-9))


def _vectorized_max_min(hops, capacity):
    """The same progressive filling in whole-array numpy operations (the fabric's formulation
    before its rounds were compiled): the compiled rounds must match it to the bit."""
    num_hops, num_flows = hops.shape
    rates = np.zeros(num_flows)
    if num_flows == 1:
        rates[0] = capacity[hops[:, 0]].min()
        return rates
    pad = len(capacity) - 1
    cols = [hops[j] for j in range(num_hops)]
    counts = np.zeros(pad + 1)
    for col in cols:
        counts += np.bincount(col, minlength=pad + 1)
    counts[pad] = 0.0
    used = np.zeros(pad + 1)
    todo = np.arange(num_flows)
    rank = np.empty(pad + 1, dtype=np.int64)
    level = np.empty(pad + 1)
    while len(todo):
        live = counts > 0
        level.fill(math.inf)
        np.divide(capacity - used, counts, out=level, where=live)
        order = np.argsort(level)
        rank[order] = np.arange(pad + 1)
        first = rank[cols[0]]
        second = np.full_like(first, pad + 1)
        for col in cols[1:]:
            r = rank[col]
            second = np.minimum(second, np.maximum(first, r))
            first = np.minimum(first, r)
        hit = first < min(int(np.count_nonzero(live)), int(second.min()))
        rate = level[order[first[hit]]]
        rates[todo[hit]] = rate
        for col in cols:
            used += np.bincount(col[hit], weights=rate, minlength=pad + 1)
            counts -= np.bincount(col[hit], minlength=pad + 1)
        counts[pad] = 0.0
        todo = todo[~hit]
        cols = [col[~hit] for col in cols]
    return rates


def test_max_min_rates_match_the_vectorized_formulation_to_the_bit():
    # Capacities from a few values (thirds included) make equal fill levels, whose order is
    # numpy's argsort's: the compiled rounds must keep it, and add in the same order.
    rng = np.random.default_rng(7)
    for trial in range(3000):
        num_links = int(rng.integers(2, 41))
        if trial % 2:
            caps = rng.choice([1.0, 2.0, 3.0, 7.0, 5e10, 5e10 / 3, 1.25e9], size=num_links)
        else:
            caps = rng.random(num_links) * 10
        capacity = np.append(caps, math.inf)
        num_hops = int(rng.integers(1, 5))
        paths = [rng.choice(num_links, size=int(rng.integers(1, min(num_hops, num_links) + 1)),
                            replace=False).tolist() for _ in range(int(rng.integers(1, 30)))]
        hops = _hops(paths, num_links)
        want = _vectorized_max_min(hops, capacity)
        assert np.array_equal(max_min_rates(hops, capacity), want)
        # A solver reused across calls, on the flows of some of the columns.
        solver = MaxMinSolver(len(capacity))
        assert np.array_equal(solver.solve(hops, capacity, np.arange(len(paths))), want)
        cols = np.flatnonzero(rng.random(len(paths)) < 0.7)
        assert np.array_equal(solver.solve(hops, capacity, cols),
                              _vectorized_max_min(hops[:, cols], capacity))


def test_compiled_rounds_compute_what_their_python_source_does():
    kernels = [flow_module._fill_start, flow_module._fill_round]
    if not all(hasattr(k, "py_func") for k in kernels):
        pytest.skip("numba is not installed: the Python source is what runs")
    rng = np.random.default_rng(3)
    for _ in range(200):
        num_links = int(rng.integers(2, 20))
        capacity = np.append(rng.choice([1.0, 3.0, 5.0], size=num_links), math.inf)
        paths = [rng.choice(num_links, size=int(rng.integers(1, min(4, num_links) + 1)),
                            replace=False).tolist() for _ in range(int(rng.integers(2, 12)))]
        hops = _hops(paths, num_links)
        results = []
        for compiled in (True, False):
            start = flow_module._fill_start if compiled else flow_module._fill_start.py_func
            step = flow_module._fill_round if compiled else flow_module._fill_round.py_func
            n, num_flows = len(capacity), hops.shape[1]
            counts, used, level, acc = (np.zeros(n) for _ in range(4))
            rank, touched = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.bool_)
            cols, todo = np.zeros_like(hops), np.zeros(num_flows, dtype=np.int64)
            rates, first = np.zeros(num_flows), np.zeros(num_flows, dtype=np.int64)
            left = start(hops, np.arange(num_flows), capacity, counts, used, level, cols, todo,
                         rates)
            while left:
                left = step(np.argsort(level), level, counts, used, capacity, cols, todo, left,
                            rates, rank, first, acc, touched)
            results.append(rates)
        assert np.array_equal(results[0], results[1])


def test_max_min_three_flows_on_two_links():
    # A (10) carries f1, f2; B (20) carries f1, f3: A is the bottleneck of f1 and f2 at 5 each,
    # which leaves 15 of B to f3.
    hops = _hops([[0, 1], [0], [1]], 2)
    assert max_min_rates(hops, np.array([10.0, 20.0, math.inf])).tolist() == [5.0, 5.0, 15.0]


def _two_pair_dumbbell():
    return dumbbell(2, 2, rate_bps=10e9, delay_s=D, mtu_bytes=1500, header_bytes=52)


def test_two_flows_sharing_a_bottleneck_get_half_each():
    topo = _two_pair_dumbbell()
    fab = FlowFabric(topo)
    size = 1000 * 1448                      # 1000 full packets: 1.5 MB on the wire
    fab.send(topo.node_index("L0"), topo.node_index("R0"), size)
    fab.send(topo.node_index("L1"), topo.node_index("R1"), size)
    fab.run()
    # Fluid: 1.5 MB each at 5 Gb/s = 2.4 ms; then 3 hops of 1 us and the first 1500-byte packet's
    # store-and-forward on the two non-bottleneck hops (1.2 us each).
    for res in fab.stats().messages:
        assert res.fct_s == pytest.approx(2.4e-3 + 3e-6 + 2.4e-6, rel=1e-12)


def test_a_late_flow_takes_half_then_all():
    topo = _two_pair_dumbbell()
    fab = FlowFabric(topo)
    size = 1000 * 1448
    first = fab.send(topo.node_index("L0"), topo.node_index("R0"), size)
    second = fab.send(topo.node_index("L1"), topo.node_index("R1"), size, at_s=1e-3)
    fab.run()
    res = {m.msg_id: m for m in fab.stats().messages}
    # First: 1.25 MB alone by 1 ms, the last 0.25 MB at half rate (0.4 ms).
    assert res[first].end_s == pytest.approx(1.4e-3 + 5.4e-6, rel=1e-12)
    # Second: 0.25 MB at half rate, then 1.25 MB alone (1 ms).
    assert res[second].fct_s == pytest.approx(1.4e-3 + 5.4e-6, rel=1e-12)


def _chain():
    nodes = [("x", "host"), ("y", "host"), ("z", "host"),
             ("s1", "switch"), ("s2", "switch"), ("s3", "switch")]
    cables = [{"a": "x", "b": "s1", "rate_bps": 100e9, "delay_s": D},
              {"a": "y", "b": "s2", "rate_bps": 100e9, "delay_s": D},
              {"a": "z", "b": "s3", "rate_bps": 100e9, "delay_s": D},
              {"a": "s1", "b": "s2", "rate_bps": 10e9, "delay_s": D},     # A
              {"a": "s2", "b": "s3", "rate_bps": 20e9, "delay_s": D}]     # B
    return explicit(nodes, cables, mtu_bytes=1500, header_bytes=52)


def test_max_min_three_flows_completion_times():
    topo = _chain()
    fab = FlowFabric(topo)
    x, y, z = (topo.node_index(n) for n in "xyz")
    f1 = fab.send(x, z, 1000 * 1448)        # A and B, 1.5 MB on the wire
    f2 = fab.send(x, y, 500 * 1448)         # A, 0.75 MB
    f3 = fab.send(y, z, 1000 * 1448)        # B, 1.5 MB
    fab.run()
    res = {m.msg_id: m for m in fab.stats().messages}
    # Rates 5 / 5 / 15 Gb/s. f3 is out after 1.5 MB / 15 Gb/s = 0.8 ms (nothing changes: A still
    # binds f1 and f2); f2 after 0.75 MB / 5 Gb/s = 1.2 ms; then f1 has A alone at 10 Gb/s for
    # its last 0.75 MB: 0.6 ms more. Latencies: hops of 1 us plus the 1500-byte first packet on
    # the non-bottleneck hops (0.12 us at 100G, 0.6 us at 20G).
    assert res[f3].fct_s == pytest.approx(0.8e-3 + 3e-6 + 0.24e-6, rel=1e-12)
    assert res[f2].fct_s == pytest.approx(1.2e-3 + 3e-6 + 0.24e-6, rel=1e-12)
    assert res[f1].fct_s == pytest.approx(1.8e-3 + 4e-6 + 0.84e-6, rel=1e-12)
    st_ = fab.stats()
    a = topo.link(topo.node_index("s1"), topo.node_index("s2"))
    b = topo.link(topo.node_index("s2"), topo.node_index("s3"))
    assert st_.links[a.index].bytes_sent == 2_250_000
    assert st_.links[b.index].bytes_sent == 3_000_000
    # A is saturated until f1's last byte leaves at 1.8 ms.
    # A is saturated until f1's last byte leaves at 1.8 ms: 180 samples of 10 us, then idle.
    assert fab.settings.sample_interval_s == 1e-5
    util_a = [row[a.index] for row in st_.utilization]
    assert util_a[:180] == pytest.approx([1.0] * 180, rel=1e-9)
    assert util_a[180:] == pytest.approx([0.0] * (len(util_a) - 180), abs=1e-9)


@pytest.mark.parametrize("size", [1, 4034, 4035, 100_000, 3_000_000])
def test_a_flow_alone_matches_the_analytical_answer(size):
    topo = leaf_spine(4, 2, 2, host_rate_bps=100e9, delay_s=D, oversubscription=2,
                      mtu_bytes=4096, header_bytes=62)
    flow, ana = FlowFabric(topo, seed=1), AnalyticalFabric(topo, seed=1)
    for fab in (flow, ana):
        fab.send(topo.node_index("h0"), topo.node_index("h7"), size, at_s=3e-6)
        fab.run()
    (f,), (a,) = flow.stats().messages, ana.stats().messages
    assert f.fct_s == pytest.approx(a.fct_s, rel=1e-12)
    assert f.ideal_s == a.ideal_s
    assert f.slowdown == pytest.approx(1.0, rel=1e-12)


def test_bytes_conserved_mid_run_and_at_the_end():
    topo = star(5, rate_bps=100e9, delay_s=D, mtu_bytes=4096, header_bytes=62)
    fab = FlowFabric(topo)
    hosts = topo.hosts
    sizes = {}
    for i, s in enumerate(hosts[:4]):
        sizes[fab.send(s, hosts[4], 1_000_000 * (i + 1), at_s=i * 1e-5)] = 1_000_000 * (i + 1)
    fab.run(until_s=2.5e-5)
    mid = fab.stats()
    mid.check_conservation()
    assert mid.payload_sent_bytes == 6_000_000          # three have started
    assert mid.payload_in_flight_bytes == 6_000_000
    down = topo.link(topo.node_index("sw"), hosts[4]).index
    # The receiver's link has been busy since the first byte.
    assert mid.links[down].bytes_sent == pytest.approx(100e9 / 8 * 2.5e-5, rel=1e-9)
    fab.run()
    end = fab.stats()
    end.check_conservation()
    assert end.payload_delivered_bytes == 10_000_000
    assert end.links[down].bytes_sent == sum(wire_bytes(s, 4096, 62) for s in sizes.values())


def test_links_idle_and_queues_zero():
    topo = _two_pair_dumbbell()
    fab = FlowFabric(topo)
    fab.send(topo.node_index("L0"), topo.node_index("R0"), 10_000)
    fab.run()
    st_ = fab.stats()
    assert all(ls.max_queue_bytes == 0 and ls.ecn_marks == 0 and ls.drops == 0
               and ls.pfc_pause_frames == 0 for ls in st_.links)
    assert st_.num_drops == st_.num_ecn_marks == st_.num_pfc_pause_frames == 0
    used = set(message_path(topo, topo.node_index("L0"), topo.node_index("R0"), 0,
                            default_salts(topo)))
    for li, ls in enumerate(st_.links):
        assert (ls.bytes_sent > 0) == (li in used)


def test_all_to_all_on_64_hosts_runs_in_seconds():
    topo = leaf_spine(8, 8, 8, host_rate_bps=400e9, delay_s=D, mtu_bytes=4096, header_bytes=62)
    fab = FlowFabric(topo)
    hosts = topo.hosts
    t0 = time.perf_counter()
    for s in hosts:
        for d in hosts:
            if s != d:
                fab.send(s, d, 1_000_000)
    fab.run()
    wall = time.perf_counter() - t0
    st_ = fab.stats()
    st_.check_conservation()
    assert len(st_.messages) == 64 * 63
    assert min(m.slowdown for m in st_.messages) >= 1 - 1e-9
    # Each host sends 63 MB through a 400 Gb/s link: at least 1.26 ms.
    assert fab.now_s >= 63 * wire_bytes(1_000_000, 4096, 62) / (400e9 / 8)
    assert wall < 30


@given(st.data())
@settings(max_examples=40, deadline=None)
def test_random_messages_conserve_bytes_and_respect_capacity(data):
    kind = data.draw(st.sampled_from(["star", "dumbbell", "leaf_spine"]))
    if kind == "star":
        topo = star(data.draw(st.integers(2, 5)), rate_bps=10e9, delay_s=D)
    elif kind == "dumbbell":
        topo = dumbbell(2, 2, rate_bps=10e9, delay_s=D, bottleneck_rate_bps=5e9)
    else:
        topo = leaf_spine(2, 2, 2, host_rate_bps=10e9, delay_s=D, oversubscription=2)
    hosts = topo.hosts
    seed = data.draw(st.integers(0, 5))
    fab = FlowFabric(topo, seed=seed)
    msgs = data.draw(st.lists(st.tuples(st.sampled_from(hosts), st.sampled_from(hosts),
                                        st.integers(0, 200_000), st.floats(0, 2e-4)),
                              min_size=1, max_size=12))
    salts = default_salts(topo, seed)
    expected = np.zeros(len(topo.links), dtype=np.int64)
    total = 0
    for s, d, size, at in msgs:
        if s == d:
            continue
        mid = fab.send(s, d, size, at_s=at)
        total += size
        for li in message_path(topo, s, d, mid, salts):
            expected[li] += wire_bytes(size, topo.mtu_bytes, topo.header_bytes)
    fab.run()
    result = fab.stats()
    result.check_conservation()
    assert result.payload_sent_bytes == result.payload_delivered_bytes == total
    for m in result.messages:
        assert m.fct_s >= m.ideal_s * (1 - 1e-9)
    assert [ls.bytes_sent for ls in result.links] == expected.tolist()
    for row in result.utilization:
        assert max(row, default=0) <= 1 + 1e-9
