"""Fabric scenarios: every traffic kind expands to the right messages, every topology kind builds,
settings merge over their profile, errors name the field, and run_scenario reports every
measurement with bytes conserved."""

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simcore.errors import ConfigError
from simcore.fabric import run as fabric_run
from simcore.fabric.report import render_fabric_summary
from simcore.fabric.run import run_scenario
from simcore.fabric.scenario import build_topology, expand_traffic, load_scenario, \
    resolved_settings
from simcore.fabric.settings import FabricSettings

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples" / "fabric").glob("*.yaml"))
STAR = {"kind": "star", "num_hosts": 4, "rate_gbps": 10, "delay_s": 1e-6}


def _scenario(traffic, topology=STAR, **extra):
    return load_scenario({"topology": topology, "traffic": traffic, **extra})


def _expand(traffic, topology=STAR, **extra):
    sc = _scenario(traffic, topology, **extra)
    topo = build_topology(sc)
    names = [nd.name for nd in topo.nodes]
    return [(names[m.src], names[m.dst], m.size_bytes, m.at_s, m.flow_key, m.item)
            for m in expand_traffic(sc, topo)]


# -- traffic ------------------------------------------------------------------------------------

def test_message():
    assert _expand([{"kind": "message", "src": "h0", "dst": "h3", "size_bytes": "1e6",
                     "at_s": 2e-6}]) == [("h0", "h3", 1_000_000, 2e-6, 0, 0)]


def test_cbr_is_a_train_of_one_packet_messages_on_one_flow():
    # 1448 + 52 bytes every 1.2 us fill 10 Gb/s; [1 us, 13 us) holds 10 of them.
    msgs = _expand([{"kind": "message", "src": "h1", "dst": "h2", "size_bytes": 5},
                    {"kind": "cbr", "src": "h0", "dst": "h3", "rate_gbps": 10,
                     "payload_bytes": 1448, "start_s": 1e-6, "stop_s": 13e-6}],
                   settings={"mtu_bytes": 1500, "header_bytes": 52})
    train = [m for m in msgs if m[5] == 1]
    assert len(train) == 10
    assert [m[3] for m in train] == pytest.approx([1e-6 + k * 1.2e-6 for k in range(10)])
    assert {m[:3] for m in train} == {("h0", "h3", 1448)}
    assert {m[4] for m in train} == {1}            # the train's first message id
    assert msgs[0][4] == 0


def test_traffic_entries_carry_their_traffic_class_to_the_packet_backend():
    traffic = [{"kind": "incast", "receiver": "h0", "size_bytes": 2_000_000, "traffic_class": 2},
               {"kind": "message", "src": "h1", "dst": "h3", "size_bytes": 1000}]
    sc = _scenario(traffic, settings={"ecn": {"enabled": False}, "dcqcn": {"enabled": False},
                                      "pfc": {"shared_buffer_bytes": 2_000_000}})
    assert [m.traffic_class for m in expand_traffic(sc, build_topology(sc))] == [2, 2, 2, 0]
    r = run_scenario(sc, "packet")
    by_class = [sum(link["pfc_pause_frames_by_class"][c] for link in r["links"])
                for c in range(8)]
    assert by_class[2] > 0 and sum(by_class) == by_class[2]
    assert run_scenario(sc, "flow")["backend"] == "flow"
    with pytest.raises(ConfigError, match="traffic_class"):
        _scenario([{**traffic[1], "traffic_class": 8}])


def test_all_to_all():
    msgs = _expand([{"kind": "all_to_all", "hosts": ["h0", "h1", "h2"], "size_bytes": 10}])
    assert sorted((s, d) for s, d, *_ in msgs) == [
        ("h0", "h1"), ("h0", "h2"), ("h1", "h0"), ("h1", "h2"), ("h2", "h0"), ("h2", "h1")]
    assert [m[4] for m in msgs] == list(range(6))
    assert len(_expand([{"kind": "all_to_all", "size_bytes": 10}])) == 12


def test_incast():
    msgs = _expand([{"kind": "incast", "receiver": "h2", "size_bytes": 7, "at_s": 1e-6}])
    assert sorted(m[0] for m in msgs) == ["h0", "h1", "h3"]
    assert {m[1:4] for m in msgs} == {("h2", 7, 1e-6)}
    msgs = _expand([{"kind": "incast", "senders": ["h3"], "receiver": "h0", "size_bytes": 7}])
    assert [m[:2] for m in msgs] == [("h3", "h0")]


def test_permutation_is_a_seeded_derangement():
    big = {"kind": "star", "num_hosts": 16, "rate_gbps": 10, "delay_s": 1e-6}
    a = _expand([{"kind": "permutation", "size_bytes": 1}], big, seed=1)
    b = _expand([{"kind": "permutation", "size_bytes": 1}], big, seed=1)
    c = _expand([{"kind": "permutation", "size_bytes": 1}], big, seed=2)
    assert a == b != c
    assert sorted(m[0] for m in a) == sorted(m[1] for m in a) == sorted(f"h{i}" for i in range(16))
    assert all(s != d for s, d, *_ in a)


def test_poisson_is_seeded_and_has_its_rate():
    item = {"kind": "poisson", "src": "h0", "dst": "h1", "rate_pps": 1e6, "payload_bytes": 100,
            "start_s": 1e-3, "duration_s": 0.01}
    a = _expand([item], seed=4)
    assert a == _expand([item], seed=4) != _expand([item], seed=5)
    times = np.array([m[3] for m in a])
    assert len(a) == pytest.approx(10_000, rel=0.05)
    assert times.min() >= 1e-3 and times.max() < 0.011
    gaps = np.diff(times)
    assert gaps.mean() == pytest.approx(1e-6, rel=0.05)
    assert gaps.std() == pytest.approx(1e-6, rel=0.05)       # exponential: std = mean
    assert {m[4] for m in a} == {0}


def test_messages_are_ordered_by_time_then_entry():
    msgs = _expand([{"kind": "message", "src": "h0", "dst": "h1", "size_bytes": 1, "at_s": 5e-6},
                    {"kind": "message", "src": "h1", "dst": "h0", "size_bytes": 2, "at_s": 1e-6},
                    {"kind": "message", "src": "h2", "dst": "h0", "size_bytes": 3, "at_s": 5e-6}])
    assert [m[2] for m in msgs] == [2, 1, 3]


# -- topologies and settings --------------------------------------------------------------------

@pytest.mark.parametrize("spec, num_hosts", [
    ({"kind": "dumbbell", "num_left": 2, "num_right": 3, "rate_gbps": 10, "delay_s": 1e-6,
      "bottleneck_rate_gbps": 5}, 5),
    ({"kind": "star", "num_hosts": 6, "rate_gbps": 25, "delay_s": 1e-6}, 6),
    ({"kind": "leaf_spine", "num_leaves": 4, "hosts_per_leaf": 4, "num_spines": 2,
      "host_rate_gbps": 100, "delay_s": 1e-6, "oversubscription": 2}, 16),
    ({"kind": "fat_tree", "k": 4, "rate_gbps": 100, "delay_s": 1e-6}, 16),
    ({"kind": "rail_optimized", "num_nodes": 2, "gpus_per_node": 4, "nic_rate_gbps": 400,
      "nvlink_rate_gbps": 3600, "delay_s": 1e-6, "num_spines": 2}, 8),
    ({"kind": "explicit", "nodes": [{"name": "a", "kind": "host"}, {"name": "b", "kind": "host"},
                                    {"name": "s", "kind": "switch"}],
      "links": [{"a": "a", "b": "s", "rate_gbps": 10, "delay_s": 1e-6},
                {"a": "b", "b": "s", "rate_gbps": 10, "delay_s": 1e-6}]}, 2),
])
def test_every_topology_kind_builds(spec, num_hosts):
    sc = _scenario([{"kind": "all_to_all", "size_bytes": 1000}], spec)
    topo = build_topology(sc)
    assert len(topo.hosts) == num_hosts
    assert (topo.mtu_bytes, topo.header_bytes) == (4096, 62)       # the roce profile's framing
    r = run_scenario(sc, "flow")
    assert r["bytes"]["conserved"] and r["flows"]["num_completed"] == num_hosts * (num_hosts - 1)


def test_buffers_in_packets_or_bytes_and_per_link_disciplines():
    sc = _scenario([{"kind": "message", "src": "h0", "dst": "h1", "size_bytes": 1}],
                   {**STAR, "buffer_packets": 10}, settings={"mtu_bytes": 1500})
    assert {lk.buffer_bytes for lk in build_topology(sc).links} == {15000}
    spec = {"kind": "explicit",
            "nodes": [{"name": "a", "kind": "host"}, {"name": "b", "kind": "host"},
                      {"name": "s", "kind": "switch"}],
            "links": [{"a": "a", "b": "s", "rate_gbps": 10, "delay_s": 1e-6,
                       "buffer_bytes": 9000, "discipline": "drop_tail"},
                      {"a": "s", "b": "b", "rate_gbps": 10, "delay_s": 1e-6,
                       "buffer_packets": 2}]}
    sc = _scenario([{"kind": "message", "src": "a", "dst": "b", "size_bytes": 1}], spec)
    topo = build_topology(sc)
    assert [lk.buffer_bytes for lk in topo.links] == [9000, 9000, 8192, 8192]
    res = resolved_settings(sc, topo)
    assert [res.discipline(i) for i in range(4)] == ["drop_tail", "drop_tail", "ecn", "ecn"]


def test_a_discipline_for_a_link_the_topology_lacks_and_a_looped_cable_are_refused():
    msg = [{"kind": "message", "src": "h0", "dst": "h1", "size_bytes": 1}]
    for index in (999, -1):
        sc = _scenario(msg, settings={"link_disciplines": {index: "ecn"}})
        with pytest.raises(ConfigError, match=rf"settings.link_disciplines: no link {index} "
                                              r"\(the topology's links are 0 to 7\)"):
            resolved_settings(sc, build_topology(sc))
    spec = {"kind": "explicit",
            "nodes": [{"name": "a", "kind": "host"}, {"name": "b", "kind": "host"},
                      {"name": "s", "kind": "switch"}],
            "links": [{"a": "a", "b": "s", "rate_gbps": 10, "delay_s": 1e-6},
                      {"a": "s", "b": "b", "rate_gbps": 10, "delay_s": 1e-6},
                      {"a": "s", "b": "s", "rate_gbps": 10, "delay_s": 1e-6}]}
    with pytest.raises(ConfigError, match=r"topology.links\[2\].*a and b are both 's': a cable "
                                          r"joins two nodes"):
        _scenario([{"kind": "message", "src": "a", "dst": "b", "size_bytes": 1}], spec)
    with pytest.raises(ConfigError, match="sample_interval_s"):
        _scenario(msg, settings={"sample_interval_s": float("inf")})


@pytest.mark.parametrize("topology, message", [
    ({"kind": "leaf_spine", "num_leaves": 2, "hosts_per_leaf": 2, "num_spines": 1,
      "host_rate_gbps": 10, "delay_s": 1e-6, "spine_rate_gbps": 10, "oversubscription": 4},
     "oversubscription has no effect beside spine_rate_gbps"),
    ({"kind": "rail_optimized", "num_nodes": 2, "gpus_per_node": 2, "nic_rate_gbps": 10,
      "nvlink_rate_gbps": 100, "delay_s": 1e-6, "oversubscription": 2},
     r"oversubscription has no effect without spines \(num_spines 0\)"),
    ({"kind": "rail_optimized", "num_nodes": 2, "gpus_per_node": 2, "nic_rate_gbps": 10,
      "nvlink_rate_gbps": 100, "delay_s": 1e-6, "pcie_delay_s": 2e-6},
     "pcie_delay_s has no effect without pcie_rate_gbps"),
])
def test_topology_fields_the_rest_leaves_with_no_effect_are_refused(topology, message):
    with pytest.raises(ConfigError, match=message):
        _scenario([], topology)


def test_settings_merge_over_the_profile():
    s = FabricSettings(profile="roce", ecn={"pmax": 0.5}, dcqcn={"variant": "paper"})
    assert s.ecn.enabled and s.ecn.pmax == 0.5 and s.ecn.kmin_bytes_per_25gbps == 100_000
    assert s.pfc.enabled and not s.credit.enabled and s.lossless
    paper = s.dcqcn.params(100e9)
    assert s.dcqcn.enabled and paper.fast_recovery_steps == 5 and paper.alpha_timer_s == 55e-6
    assert s.queue_histogram_bin_bytes == s.mtu_bytes == 4096
    assert s.ecn.thresholds_bytes(100e9) == (400_000, 1_600_000)
    ib = FabricSettings(profile="infiniband")
    assert ib.credit.enabled and not ib.pfc.enabled and not ib.dcqcn.enabled and ib.lossless
    sl = FabricSettings(profile="slingshot")
    assert sl.routing == "adaptive" and sl.credit.enabled
    mlx = FabricSettings().dcqcn
    assert mlx.variant == "mellanox" and mlx.cnp_interval_s == 50e-6
    p = mlx.params(25e9)
    assert (p.alpha_timer_s, p.rate_decrease_min_interval_s, p.increase_timer_s,
            p.fast_recovery_steps, p.rate_ai_bps) == (1e-6, 4e-6, 300e-6, 1, 5e6)
    tuned = FabricSettings(dcqcn={"rate_ai_gbps": 0.01, "byte_counter_bytes": 0,
                                  "fast_recovery_steps": 3}).dcqcn.params(100e9)
    assert (tuned.rate_ai_bps, tuned.byte_counter_bytes, tuned.fast_recovery_steps) == \
        (1e7, None, 3)
    floor = FabricSettings(dcqcn={"min_rate_gbps": 50}).dcqcn
    assert floor.params(100e9).min_rate_bps == 50e9 and floor.params(25e9).min_rate_bps == 25e9
    lossy = FabricSettings(pfc={"enabled": False})
    assert not lossy.lossless


# -- errors -------------------------------------------------------------------------------------

@pytest.mark.parametrize("data, message", [
    ({"topology": STAR, "traffic": [{"kind": "all_to_all", "size_bytes": 1}], "colour": 1},
     "scenario: colour: is not a known setting"),
    ({"topology": STAR, "traffic": []}, "scenario: traffic: needs at least 1 item (got [])"),
    ({"topology": {**STAR, "kind": "ring"}, "traffic": [{"kind": "all_to_all", "size_bytes": 1}]},
     "scenario: topology.kind: expected one of dumbbell, star, leaf_spine, fat_tree, "
     "rail_optimized, explicit (got 'ring')"),
    ({"topology": {"kind": "star", "num_hosts": 4, "rate_gbps": 10},
      "traffic": [{"kind": "all_to_all", "size_bytes": 1}]},
     "scenario: topology.delay_s: is required"),
    ({"topology": {**STAR, "buffer_bytes": 1, "buffer_packets": 1},
      "traffic": [{"kind": "all_to_all", "size_bytes": 1}]},
     "scenario: topology: give buffer_bytes or buffer_packets, not both"),
    ({"topology": STAR, "traffic": [{"kind": "incast", "receiver": "h0", "size_bytes": -1}]},
     "scenario: traffic[0].size_bytes: must be at least 0 (got -1)"),
    ({"topology": STAR, "traffic": [{"kind": "cbr", "src": "h0", "dst": "h1", "rate_gbps": 1,
                                     "payload_bytes": 100, "start_s": 2, "stop_s": 1}]},
     "scenario: traffic[0]: stop_s (1.0) must be after start_s (2.0)"),
    ({"topology": STAR, "settings": {"ecn": {"enabled": False}},
      "traffic": [{"kind": "all_to_all", "size_bytes": 1}]},
     "scenario: settings: dcqcn needs ECN marking"),
    ({"topology": STAR, "settings": {"ecn": {"kmin_bytes": 5, "kmax_bytes": 5}},
      "traffic": [{"kind": "all_to_all", "size_bytes": 1}]},
     "scenario: settings.ecn: kmin_bytes (5) must be below kmax_bytes (5)"),
    ({"topology": STAR, "settings": {"dcqcn": {"alpha_timer_s": 0}},
      "traffic": [{"kind": "all_to_all", "size_bytes": 1}]},
     "scenario: settings.dcqcn.alpha_timer_s: must be greater than 0 (got 0)"),
    ({"topology": STAR, "settings": {"profile": "ethernet"},
      "traffic": [{"kind": "all_to_all", "size_bytes": 1}]},
     "scenario: settings.profile: expected one of roce, infiniband, slingshot (got 'ethernet')"),
])
def test_validation_errors_name_the_field(data, message):
    with pytest.raises(ConfigError) as e:
        load_scenario(data)
    assert str(e.value).startswith(message), str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("topology, traffic, message", [
    (STAR, [{"kind": "message", "src": "h0", "dst": "h9", "size_bytes": 1}],
     "scenario: traffic[0].dst: no host named 'h9' (hosts: h0, h1, h2, h3)"),
    (STAR, [{"kind": "message", "src": "sw", "dst": "h1", "size_bytes": 1}],
     "scenario: traffic[0].src: 'sw' is a switch, not a host"),
    (STAR, [{"kind": "message", "src": "h1", "dst": "h1", "size_bytes": 1}],
     "scenario: traffic[0].dst: must differ from src"),
    (STAR, [{"kind": "cbr", "src": "h0", "dst": "h1", "rate_gbps": 1, "payload_bytes": 5000,
             "stop_s": 1e-3}],
     "scenario: traffic[0].payload_bytes: 5000 does not fit one packet (at most mtu_bytes - "
     "header_bytes = 4034)"),
    (STAR, [{"kind": "all_to_all", "hosts": ["h0", "h5"], "size_bytes": 1}],
     "scenario: traffic[0].hosts[1]: no host named 'h5'"),
    (STAR, [{"kind": "incast", "senders": ["h0", "h1"], "receiver": "h1", "size_bytes": 1}],
     "scenario: traffic[0].senders: the receiver cannot be a sender"),
    (STAR, [{"kind": "poisson", "src": "h0", "dst": "h1", "rate_pps": 1e9, "payload_bytes": 1,
             "duration_s": 1}], "scenario: traffic[0]: the source sends about 1,000,000,000"),
    ({"kind": "fat_tree", "k": 3, "rate_gbps": 1, "delay_s": 1e-6},
     [{"kind": "all_to_all", "size_bytes": 1}], "scenario: topology.k must be even"),
    ({"kind": "explicit", "nodes": [{"name": "a", "kind": "host"}, {"name": "b", "kind": "host"}],
      "links": [{"a": "a", "b": "c", "rate_gbps": 1, "delay_s": 1e-6}]},
     [{"kind": "all_to_all", "size_bytes": 1}], "scenario: topology.links[0].b: unknown node 'c'"),
])
def test_expansion_errors_name_the_field(topology, traffic, message):
    with pytest.raises(ConfigError) as e:
        run_scenario({"topology": topology, "traffic": traffic}, "flow")
    assert str(e.value).startswith(message), str(e.value)


def test_bad_backend_and_missing_packet_backend(monkeypatch):
    sc = {"topology": STAR, "traffic": [{"kind": "all_to_all", "size_bytes": 1}]}
    with pytest.raises(ConfigError, match="backend must be one of packet, flow, analytical"):
        run_scenario(sc, "fluid")
    monkeypatch.setattr(fabric_run.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match="the packet backend is not available"):
        run_scenario(sc)


def test_file_errors_name_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("topology: {kind: star, num_hosts: 2, rate_gbps: 1, delay_s: 1.0e-6}\n"
                    "traffic:\n  - {kind: message, src: h0, dst: h1}\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: traffic\[0\].size_bytes: is required"):
        run_scenario(path, "flow")
    with pytest.raises(ConfigError, match="no such file"):
        run_scenario(tmp_path / "none.yaml")


# -- running ------------------------------------------------------------------------------------

def test_run_scenario_reports_every_measurement():
    r = run_scenario({"name": "t", "topology": STAR,
                      "traffic": [{"kind": "incast", "receiver": "h0", "size_bytes": 100_000},
                                  {"kind": "message", "src": "h0", "dst": "h1",
                                   "size_bytes": 1000, "at_s": 1e-5}]}, "flow")
    json.dumps(r, allow_nan=False)
    assert r["backend"] == "flow" and r["scenario"] == "t" and r["profile"] == "roce"
    assert r["topology"] == {"kind": "star", "num_hosts": 4, "num_switches": 1, "num_links": 8,
                             "mtu_bytes": 4096, "header_bytes": 62}
    flows = r["flows"]
    assert flows["num_messages"] == flows["num_completed"] == 4
    assert set(flows["fct_s"]) == {"mean", "p50", "p90", "p99", "max"}
    assert flows["slowdown"]["p50"] >= 1
    assert [t["num_messages"] for t in flows["per_traffic"]] == [3, 1]
    assert len(flows["messages"]) == 4
    assert flows["messages"][0]["traffic"] == 0
    assert len(r["links"]) == 8
    into_h0 = next(lk for lk in r["links"] if lk["name"] == "sw->h0")
    assert 0.9 < into_h0["utilization_max"] <= 1 + 1e-9
    assert into_h0["bytes_sent"] == 3 * (100_000 + 25 * 62)
    for key in ("queue_max_bytes", "queue_mean_bytes", "queue_histogram", "ecn_marks", "drops",
                "pfc_pause_frames", "paused_s"):
        assert key in into_h0
    series = r["utilization_over_time"]
    assert len(series["per_link"]) == 8 and len(series["per_link"][0]) == len(series["t_s"])
    assert set(r["congestion"]) == {"ecn_marks", "cnps", "dcqcn_rate_cuts", "pfc_pause_frames",
                                    "pfc_paused_s", "num_ports_paused"}
    assert r["losses"] == {"drops": 0, "dropped_bytes": 0, "retransmits": 0,
                           "retransmitted_bytes": 0}
    assert r["bytes"] == {"planned": 301_000, "sent": 301_000, "delivered": 301_000,
                          "dropped": 0, "in_flight": 0, "conserved": True}
    text = render_fabric_summary(r)
    assert "Fabric scenario result" in text and "sw->h0" in text
    assert "Bytes conserved:" in text and "yes" in text


def test_duration_limit_leaves_messages_in_flight():
    r = run_scenario({"topology": STAR, "duration_s": 1e-4,
                      "traffic": [{"kind": "message", "src": "h0", "dst": "h1",
                                   "size_bytes": 10_000_000}]}, "flow")
    assert r["duration_s"] == 1e-4
    assert r["flows"]["num_incomplete"] == 1
    assert r["bytes"]["in_flight"] == 10_000_000 and r["bytes"]["conserved"]
    assert r["flows"]["fct_s"]["p50"] is None
    assert "-" in render_fabric_summary(r)


def test_long_series_are_coarsened_and_runs_are_reproducible():
    sc = {"topology": STAR, "seed": 3, "settings": {"sample_interval_s": 1e-7},
          "traffic": [{"kind": "permutation", "size_bytes": 1_000_000}]}
    a, b = run_scenario(sc, "flow"), run_scenario(sc, "flow")
    assert a == b
    assert len(a["utilization_over_time"]["t_s"]) <= 200
    assert a["utilization_over_time"]["interval_s"] > 1e-7


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_examples_validate_and_run_analytically(path):
    assert len(EXAMPLES) >= 6
    r = run_scenario(path, "analytical", include_messages=False)
    assert r["bytes"]["conserved"] and r["flows"]["num_incomplete"] == 0
    assert "messages" not in r["flows"]
    json.dumps(r, allow_nan=False)


@pytest.mark.parametrize("name", ["explicit_chain", "dumbbell_two_senders", "incast_pfc",
                                  "rail_optimized_mixed", "fat_tree_permutation"])
def test_small_examples_run_on_the_flow_backend(name):
    r = run_scenario(EXAMPLES[0].parent / f"{name}.yaml", "flow")
    assert r["bytes"]["conserved"] and r["flows"]["num_incomplete"] == 0


def test_explicit_chain_example_has_the_max_min_shares():
    r = run_scenario(EXAMPLES[0].parent / "explicit_chain.yaml", "flow")
    fct = {(m["src"], m["dst"]): m["fct_s"] for m in r["flows"]["messages"]}
    # 4034-byte payloads: 248 packets, 1,015,376 bytes on the wire each. y->z has 15 Gb/s, x->y
    # and x->z 5 Gb/s until y->z is done; then x->z and x->y stay bound by the 10G link.
    wire = 1_000_000 + 248 * 62
    assert fct[("y", "z")] == pytest.approx(wire * 8 / 15e9, rel=1e-2)
    assert fct[("x", "y")] == pytest.approx(wire * 8 / 5e9, rel=1e-2)


@given(st.data())
@settings(max_examples=25, deadline=None)
def test_random_small_scenarios_conserve_bytes(data):
    n = data.draw(st.integers(2, 6))
    hosts = [f"h{i}" for i in range(n)]
    host = st.sampled_from(hosts)
    size = st.integers(0, 300_000)
    at = st.floats(0, 1e-4)
    item = st.one_of(
        st.builds(lambda s, d, b, t: {"kind": "message", "src": s, "dst": d, "size_bytes": b,
                                      "at_s": t}, host, host, size, at),
        st.builds(lambda b, t: {"kind": "all_to_all", "size_bytes": b, "at_s": t}, size, at),
        st.builds(lambda r, b: {"kind": "incast", "receiver": r, "size_bytes": b}, host, size),
        st.builds(lambda b: {"kind": "permutation", "size_bytes": b}, size),
        st.builds(lambda s, d, g: {"kind": "cbr", "src": s, "dst": d, "rate_gbps": g,
                                   "payload_bytes": 1000, "stop_s": 2e-5},
                  host, host, st.floats(1, 20)),
        st.builds(lambda s, d: {"kind": "poisson", "src": s, "dst": d, "rate_pps": 1e6,
                                "payload_bytes": 500, "duration_s": 2e-5}, host, host),
    )
    traffic = [t for t in data.draw(st.lists(item, min_size=1, max_size=4))
               if t.get("src") is None or t["src"] != t["dst"]]
    if not traffic:
        return
    sc = {"topology": {"kind": "star", "num_hosts": n, "rate_gbps": 10, "delay_s": 1e-6},
          "seed": data.draw(st.integers(0, 9)), "traffic": traffic,
          "duration_s": data.draw(st.sampled_from([None, 5e-5]))}
    r = run_scenario(sc, "flow")
    b = r["bytes"]
    assert b["conserved"]
    assert b["sent"] == b["delivered"] + b["in_flight"] <= b["planned"]
    if sc["duration_s"] is None:
        assert b["delivered"] == b["planned"]
    for lk in r["links"]:
        assert lk["utilization_max"] <= 1 + 1e-9


def test_rail_optimized_with_a_pcie_hop_to_the_nic():
    from simcore.fabric import topology as T
    from simcore.fabric.messages import ideal_message_s

    t = T.rail_optimized(2, 2, nic_rate_bps=400e9, nvlink_rate_bps=3600e9, delay_s=1e-6,
                         pcie_rate_bps=256e9, pcie_delay_s=2e-6)
    a, b = t.node_index("n0g0"), t.node_index("n1g0")
    (path,) = t.shortest_paths(a, b)
    kinds = [t.links[li].kind for li in path]
    assert kinds == ["pcie", "fabric", "fabric", "pcie"]
    # One full packet: store-and-forward over the four hops, the PCIe ones at 256 Gb/s.
    payload = t.mtu_bytes - t.header_bytes
    wire = t.mtu_bytes * 8
    expect = 2 * (wire / 256e9 + 2e-6) + 2 * (wire / 400e9 + 1e-6)
    assert ideal_message_s(t, path, payload) == pytest.approx(expect, rel=1e-12)
    # Without the option the GPU is cabled to its rail directly.
    t0 = T.rail_optimized(2, 2, nic_rate_bps=400e9, nvlink_rate_bps=3600e9, delay_s=1e-6)
    (p0,) = t0.shortest_paths(t0.node_index("n0g0"), t0.node_index("n1g0"))
    assert [t0.links[li].kind for li in p0] == ["fabric", "fabric"]


def test_rail_optimized_scenario_takes_the_pcie_rate():
    from simcore.fabric.run import run_scenario

    r = run_scenario({"topology": {"kind": "rail_optimized", "num_nodes": 2, "gpus_per_node": 2,
                                   "nic_rate_gbps": 400, "nvlink_rate_gbps": 3600,
                                   "delay_s": 1e-6, "pcie_rate_gbps": 256},
                      "traffic": [{"kind": "message", "src": "n0g0", "dst": "n1g0",
                                   "size_bytes": 1000000}]}, "flow")
    assert r["bytes"]["conserved"] is True
    assert any("nic" in name for name in json.dumps(r["links"]).split('"'))
