"""The analytical fabric: the pipelined store-and-forward formula, exactly; single packets over
multi-hop paths on both the analytical and flow backends; routes and the protocol's lifecycle;
messages that share a link serialised on it, so that no link carries more than its rate (a
property over random message sets on Clos topologies)."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simcore.fabric.analytical import AnalyticalFabric
from simcore.fabric.messages import ideal_message_s, message_path, num_packets, wire_bytes
from simcore.fabric.ecmp import default_salts, flow_hash, path, source_port
from simcore.fabric.flow import FlowFabric
from simcore.fabric.settings import FabricSettings
from simcore.fabric.topology import dumbbell, explicit, fat_tree, leaf_spine, star
from simcore.fabric import utilization
from simcore.fabric.utilization import LinkLoadRecorder

BACKENDS = [AnalyticalFabric, FlowFabric]


def _mixed_rate_chain():
    """h0 -100G- s1 -40G- s2 -25G- s3 -100G- h1, delays 1, 2, 3, 4 us; 1500-byte MTU, 52 header."""
    nodes = [("h0", "host"), ("s1", "switch"), ("s2", "switch"), ("s3", "switch"), ("h1", "host")]
    cables = [{"a": "h0", "b": "s1", "rate_bps": 100e9, "delay_s": 1e-6},
              {"a": "s1", "b": "s2", "rate_bps": 40e9, "delay_s": 2e-6},
              {"a": "s2", "b": "s3", "rate_bps": 25e9, "delay_s": 3e-6},
              {"a": "s3", "b": "h1", "rate_bps": 100e9, "delay_s": 4e-6}]
    return explicit(nodes, cables, mtu_bytes=1500, header_bytes=52)


def _formula(links, size, mtu, header):
    """sum_h (d_h + L1 / C_h) + (W - L1) / C_min, written out independently."""
    payload = mtu - header
    n = max(1, math.ceil(size / payload))
    wire = size + n * header
    first = min(size, payload) + header
    rates = [lk.rate_bps / 8 for lk in links]
    return (sum(lk.delay_s for lk in links) + sum(first / c for c in rates)
            + (wire - first) / min(rates))


def _train_arrival(links, sizes):
    """Exact store-and-forward arrival of the last of back-to-back packets `sizes` (wire bytes)
    on an idle path: packet k leaves hop h at max(arrival at h, hop h free) + L_k / C_h."""
    free = [0.0] * len(links)
    done = 0.0
    for size in sizes:
        t = 0.0
        for h, lk in enumerate(links):
            t = max(t, free[h]) + size * 8 / lk.rate_bps
            free[h] = t
            t += lk.delay_s
        done = t
    return done


@pytest.mark.parametrize("size", [0, 1, 1447, 1448, 1449, 14480, 14487, 1_000_000])
def test_analytical_equals_the_formula_on_a_mixed_rate_path(size):
    topo = _mixed_rate_chain()
    fab = AnalyticalFabric(topo)
    h0, h1 = topo.node_index("h0"), topo.node_index("h1")
    fab.send(h0, h1, size)
    fab.run()
    (res,) = fab.stats().messages
    links = [topo.links[li] for li in message_path(topo, h0, h1, 0, default_salts(topo))]
    assert len(links) == 4
    assert res.fct_s == pytest.approx(_formula(links, size, 1500, 52), rel=1e-13)
    assert res.ideal_s == res.fct_s
    assert res.slowdown == pytest.approx(1.0, rel=1e-12)


@pytest.mark.parametrize("num_full", [1, 2, 7, 100])
def test_formula_is_the_exact_packet_train_time_for_full_packets(num_full):
    topo = _mixed_rate_chain()
    h0, h1 = topo.node_index("h0"), topo.node_index("h1")
    route = message_path(topo, h0, h1, 0, default_salts(topo))
    links = [topo.links[li] for li in route]
    size = num_full * 1448
    assert ideal_message_s(topo, route, size) == pytest.approx(
        _train_arrival(links, [1500] * num_full), rel=1e-13)


def test_formula_is_exact_with_a_short_last_packet_on_a_one_rate_path():
    topo = dumbbell(1, 1, rate_bps=10e9, delay_s=1e-6, mtu_bytes=1500, header_bytes=52)
    route = message_path(topo, topo.node_index("L0"), topo.node_index("R0"), 0,
                         default_salts(topo))
    links = [topo.links[li] for li in route]
    size = 5 * 1448 + 100
    assert ideal_message_s(topo, route, size) == pytest.approx(
        _train_arrival(links, [1500] * 5 + [152]), rel=1e-13)


def test_packet_and_wire_counts():
    assert num_packets(0, 1500, 52) == 1
    assert num_packets(1448, 1500, 52) == 1
    assert num_packets(1449, 1500, 52) == 2
    assert wire_bytes(1449, 1500, 52) == 1449 + 2 * 52


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("payload", [1, 500, 4034])
def test_single_packet_store_and_forward_over_multi_hop_paths(backend, payload):
    # Leaf-spine, hosts under different leaves: 4 hops, host links 100G, uplinks 50G.
    topo = leaf_spine(2, 2, 2, host_rate_bps=100e9, delay_s=1.5e-6, oversubscription=2,
                      mtu_bytes=4096, header_bytes=62)
    fab = backend(topo, seed=3)
    src, dst = topo.node_index("h0"), topo.node_index("h3")
    fab.send(src, dst, payload, at_s=2e-6)
    fab.run()
    (res,) = fab.stats().messages
    route = message_path(topo, src, dst, 0, default_salts(topo, 3))
    assert len(route) == 4
    packet = payload + 62
    expected = sum(packet * 8 / topo.links[li].rate_bps + topo.links[li].delay_s for li in route)
    assert res.start_s == 2e-6
    assert res.fct_s == pytest.approx(expected, rel=1e-12)


def test_routes_are_ecmp_paths_of_the_flow_key():
    topo = leaf_spine(2, 4, 4, host_rate_bps=100e9, delay_s=1e-6)
    salts = default_salts(topo, 5)
    fab = AnalyticalFabric(topo, seed=5)
    src, dst = topo.node_index("h0"), topo.node_index("h7")
    spines = set()
    for key in range(32):
        fab.send(src, dst, 1000, flow_key=key)
        expected = path(topo, src, dst, flow_hash(src, dst, source_port(key)), salts)
        assert list(message_path(topo, src, dst, key, salts)) == expected
        spines.add(topo.links[expected[1]].dst)
    assert len(spines) == 4       # the flow keys spread over every spine


def test_default_flow_key_is_the_message_id():
    topo = leaf_spine(2, 4, 4, host_rate_bps=100e9, delay_s=1e-6)
    salts = default_salts(topo, 0)
    a, b = AnalyticalFabric(topo), AnalyticalFabric(topo)
    src, dst = topo.node_index("h0"), topo.node_index("h7")
    for i in range(8):
        assert a.send(src, dst, 10_000) == i
        b.send(src, dst, 10_000, flow_key=i)
    a.run(), b.run()
    assert [m.end_s for m in a.stats().messages] == [m.end_s for m in b.stats().messages]
    assert message_path(topo, src, dst, 3, salts) == message_path(topo, src, dst, 3, salts)


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda c: c.__name__)
def test_run_until_and_callbacks_in_time_order(backend):
    topo = dumbbell(2, 2, rate_bps=10e9, delay_s=1e-6)
    fab = backend(topo)
    seen = []
    l0, l1, r0 = (topo.node_index(n) for n in ("L0", "L1", "R0"))

    def again(res):
        seen.append(res.msg_id)
        if res.msg_id == 0:
            fab.send(l1, r0, 100, on_done=lambda r: seen.append(r.msg_id))

    fab.send(l0, r0, 100_000, at_s=1e-6, on_done=again)
    fab.send(l1, r0, 100, at_s=0.5e-6, on_done=lambda r: seen.append(r.msg_id))
    assert 0.5e-6 <= fab.next_event_s() < math.inf
    assert fab.run(until_s=1e-9) == 1e-9
    assert fab.now_s == 1e-9
    fab.run()
    assert seen == [1, 0, 2]
    st = fab.stats()
    ends = [m.end_s for m in st.messages]
    assert ends == sorted(ends)
    assert fab.next_event_s() == math.inf
    st.check_conservation()
    assert st.payload_delivered_bytes == 100_200


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda c: c.__name__)
def test_bad_sends_are_refused(backend):
    topo = dumbbell(1, 1, rate_bps=10e9, delay_s=1e-6)
    fab = backend(topo)
    l0, r0, sw = topo.node_index("L0"), topo.node_index("R0"), topo.node_index("swL")
    with pytest.raises(ValueError, match="src must be the index of a host"):
        fab.send(sw, r0, 10)
    with pytest.raises(ValueError, match="two different hosts"):
        fab.send(l0, l0, 10)
    with pytest.raises(ValueError, match="non-negative"):
        fab.send(l0, r0, -1)
    fab.run(until_s=1.0)
    with pytest.raises(ValueError, match="before the fabric's clock"):
        fab.send(l0, r0, 10, at_s=0.5)


def test_analytical_in_flight_and_link_bytes_mid_run():
    topo = dumbbell(1, 1, rate_bps=10e9, delay_s=1e-6, mtu_bytes=1500, header_bytes=52)
    fab = AnalyticalFabric(topo)
    fab.send(topo.node_index("L0"), topo.node_index("R0"), 1_448_000)
    fab.run(until_s=1e-4)
    st = fab.stats()
    st.check_conservation()
    assert st.payload_in_flight_bytes == 1_448_000
    fab.run()
    st = fab.stats()
    assert st.payload_delivered_bytes == 1_448_000
    route = message_path(topo, topo.node_index("L0"), topo.node_index("R0"), 0,
                         default_salts(topo))
    for li, ls in enumerate(st.links):
        assert ls.bytes_sent == (1_500_000 if li in route else 0)


@pytest.mark.parametrize("compiled", [True, False])
def test_link_load_spans_add_what_one_call_per_span_adds_to_the_bit(compiled, monkeypatch):
    # Spans inside one bin, across bins, ending on a boundary, empty, over 0-4 links; the
    # spreading kernel compiled (where numba is installed) and as its Python source.
    if not compiled:
        monkeypatch.setattr(utilization, "_compiled_spread", utilization.spread)
    rng = np.random.default_rng(11)
    for trial in range(40):
        width = float(rng.choice([1e-2, 1e-5, 3.7e-3]))
        num = int(rng.integers(1, 300))
        t0 = rng.random(num) * 0.2
        if trial % 3 == 0:
            t0 = np.round(t0 / width) * width
        t1 = t0 + rng.exponential(width * float(rng.choice([0.01, 0.5, 3.0])), num)
        empty = rng.random(num) < 0.05
        t1[empty] = t0[empty]
        t1[::7] = np.ceil(t1[::7] / width) * width
        rate = rng.random(num) * 1e10
        paths = [rng.choice(12, size=int(rng.integers(0, 5)), replace=False) for _ in range(num)]
        one, many = LinkLoadRecorder(12, width), LinkLoadRecorder(12, width)
        for m in range(num):
            if len(paths[m]):
                one.add(float(t0[m]), float(t1[m]), float(rate[m]), paths[m].tolist())
        many.add_spans(t0, t1, rate, np.concatenate(paths).astype(np.int64),
                       np.array([len(p) for p in paths]))
        until = float(max(t1.max(), t0.max())) + width
        rates = np.ones(12)
        assert one.samples(rates, until) == many.samples(rates, until)


def test_delivered_messages_read_like_a_list_and_keep_their_moment():
    topo = dumbbell(2, 2, rate_bps=10e9, delay_s=1e-6)
    fab = AnalyticalFabric(topo)
    l0, l1, r0 = (topo.node_index(n) for n in ("L0", "L1", "R0"))
    fab.send(l1, r0, 100, tag="b")          # first on the shared links: not delayed
    fab.send(l0, r0, 10_000, tag="a")
    fab.send(l1, r0, 5_000_000, tag="c")
    fab.run(until_s=1e-4)
    early = fab.stats().messages
    assert len(early) == 2 and [m.tag for m in early] == ["b", "a"]
    assert early[0] == list(early)[0] and early[-1].tag == "a" and early[:1] == [early[0]]
    (only_b,) = early[:1]
    assert only_b.size_bytes == 100 and only_b.end_s == only_b.start_s + only_b.ideal_s
    fab.run()
    assert len(early) == 2                   # an earlier report does not grow
    late = fab.stats().messages
    assert [m.tag for m in late] == ["b", "a", "c"] and list(late)[:2] == list(early)


# --- links shared by serialisation --------------------------------------------------------------

TOL = 1e-9


def _topologies():
    return st.sampled_from([
        leaf_spine(4, 4, 2, host_rate_bps=400e9, delay_s=1e-6),
        leaf_spine(3, 4, 2, host_rate_bps=100e9, delay_s=5e-7, oversubscription=2,
                   mtu_bytes=1500, header_bytes=52),
        leaf_spine(2, 3, 3, host_rate_bps=200e9, delay_s=2e-6, spine_rate_bps=50e9),
        fat_tree(4, rate_bps=100e9, delay_s=1e-6),
    ])


@st.composite
def _message_sets(draw):
    topo = draw(_topologies())
    hosts = topo.hosts
    num = draw(st.integers(1, 40))
    msgs = []
    for _ in range(num):
        src = draw(st.sampled_from(hosts))
        dst = draw(st.sampled_from([h for h in hosts if h != src]))
        size = draw(st.one_of(st.integers(0, 5000), st.integers(5000, 3_000_000)))
        at = draw(st.sampled_from([0.0, 0.0, 1e-6, 2.5e-5])) + draw(
            st.floats(0, 1e-4, allow_nan=False))
        msgs.append((src, dst, size, at, draw(st.integers(0, 3))))
    interval = draw(st.sampled_from([1e-6, 7e-6, 1e-4]))
    stop = draw(st.one_of(st.none(), st.floats(1e-6, 3e-4)))
    return topo, msgs, interval, stop


def _run(topo, msgs, interval, stop=None):
    fab = AnalyticalFabric(topo, FabricSettings(sample_interval_s=interval))
    for src, dst, size, at, key in sorted(msgs, key=lambda m: m[3]):
        fab.send(src, dst, size, at_s=at, flow_key=key)
    fab.run(stop)
    return fab, fab.stats()


@settings(max_examples=100, deadline=None)
@given(_message_sets(), st.sampled_from(BACKENDS))
def test_send_timed_is_send_with_a_timed_callback(case, backend):
    """The step DAGs' fast path (`send_timed`: checks and log inlined on a routed queue pair)
    gives what `send` with the timed callback (fn, arg) gives: the same ideal times, callbacks at
    the same moments in the same order, and the same message log and link figures; the
    delivered messages' (size, slowdown) columns are what reading each message gives."""
    topo, msgs, interval, stop = case
    runs = []
    for fast in (False, True, "routed"):
        fab = backend(topo, FabricSettings(sample_interval_s=interval))
        calls: list[tuple] = []
        ideals = []

        def on_done(arg, end_s, ideal_s, calls=calls):
            calls.append((arg, end_s, ideal_s))
        for k, (src, dst, size, at, key) in enumerate(sorted(msgs, key=lambda m: m[3])):
            tag = "step" if k % 3 else "other"
            route = (fab.routed(src, dst, key) if fast == "routed" and hasattr(fab, "routed")
                     else None)
            if route is not None:       # the queue pair's route, fixed by its first message
                ideals.append(fab.send_routed(route, size, max(at, fab.now_s), on_done, k, tag))
            elif fast:
                ideals.append(fab.send_timed(src, dst, size, at, on_done, k, key, tag))
            else:
                mid = fab.send(src, dst, size, at_s=at, tag=tag, on_done=(on_done, k),
                               flow_key=key)
                ideals.append(fab.ideal_s(mid))
        fab.run(stop)
        stats = fab.stats()
        messages = stats.messages
        sizes, slowdowns = messages.sizes_and_slowdowns("step")
        step = [m for m in messages if m.tag == "step"]
        assert sizes == [m.size_bytes for m in step]
        assert slowdowns == [m.slowdown for m in step]
        runs.append((ideals, calls, list(messages), [ls.busy_s for ls in stats.links],
                     stats.payload_delivered_bytes))
    assert runs[0] == runs[1] == runs[2]


@settings(max_examples=150, deadline=None)
@given(_message_sets())
def test_no_link_carries_more_than_its_rate(case):
    topo, msgs, interval, stop = case
    fab, st_ = _run(topo, msgs, interval, stop)
    st_.check_conservation()
    util = np.asarray(st_.utilization)
    assert util.size == 0 or util.max() <= 1 + TOL
    for ls in st_.links:
        assert ls.busy_s <= st_.duration_s * (1 + TOL) + 1e-18
    for m in st_.messages:
        assert m.end_s >= m.start_s + m.ideal_s and m.slowdown >= 1 - 1e-12


@settings(max_examples=150, deadline=None)
@given(_message_sets())
def test_a_message_waits_for_everything_before_it_on_each_link(case):
    # Over any stretch from a start time t on, a link carries at most rate x time: a message
    # cannot have arrived before the link has carried its bytes and those of every message
    # that started on it from t up to (and, in send order, before) it.
    topo, msgs, interval, _ = case
    fab, st_ = _run(topo, msgs, interval)
    log = fab._log
    order = sorted(range(len(log)), key=lambda i: (log.start_s[i], i))
    for li, link in enumerate(topo.links):
        on = [i for i in order if li in log.path[i]]
        rate = link.rate_bytes_per_s
        for k, m in enumerate(on):
            for j in range(k + 1):
                t = log.start_s[on[j]]
                carried = sum(log.wire_bytes[i] for i in on[j:k + 1])
                assert log.end_s[m] >= t + carried / rate - TOL * max(t, 1e-6)


def test_messages_sharing_a_link_are_serialised_in_start_order():
    # Two senders into one receiver on a star: its link carries one message after the other.
    topo = star(3, rate_bps=100e9, delay_s=1e-6, mtu_bytes=1500, header_bytes=52)
    h0, h1, h2 = topo.hosts
    fab = AnalyticalFabric(topo)
    late = fab.send(h1, h2, 1_448_000, at_s=1e-6)
    early = fab.send(h0, h2, 1_448_000)
    fab.run()
    res = {m.msg_id: m for m in fab.stats().messages}
    w = wire_bytes(1_448_000, 1500, 52) / 12.5e9
    assert res[early].end_s == res[early].start_s + res[early].ideal_s    # first: alone
    # The second waits for the shared link h2's downlink to carry the first message.
    downlink = message_path(topo, h0, h2, early, default_salts(topo))[-1]
    assert downlink == message_path(topo, h1, h2, late, default_salts(topo))[-1]
    first_done_on_it = res[early].end_s - topo.links[downlink].delay_s
    assert res[late].end_s == pytest.approx(first_done_on_it + w + 1e-6, rel=1e-12)
    assert res[late].slowdown > 1.9
    st_ = fab.stats()
    assert max(max(u) for u in st_.utilization) <= 1 + TOL


def test_an_all_to_all_takes_as_long_as_its_busiest_link():
    # Every message of an all-to-all starts at once: the last one ends once the busiest link
    # has carried all its bytes (plus a path's latency), close to fair sharing's answer.
    topo = leaf_spine(4, 4, 4, host_rate_bps=400e9, delay_s=1e-6)
    fabs = {name: cls(topo) for name, cls in (("analytical", AnalyticalFabric),
                                               ("flow", FlowFabric))}
    for fab in fabs.values():
        for src in topo.hosts:
            for dst in topo.hosts:
                if src != dst:
                    fab.send(src, dst, 1_000_000)
        fab.run()
    st_ = fabs["analytical"].stats()
    busiest = max(ls.busy_s for ls in st_.links)
    assert busiest <= st_.duration_s <= busiest + 1e-5
    assert st_.duration_s == pytest.approx(fabs["flow"].stats().duration_s, rel=0.05)
    assert max(max(u) for u in st_.utilization) <= 1 + TOL
