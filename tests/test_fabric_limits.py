"""Fabric scenarios at sizes and times past what a run can hold: refused with one sentence naming
the field, or run with the link-utilization samples held to their bound (the interval doubled),
never out of memory."""

import re
from pathlib import Path

import numpy as np
import pytest

from simcore.errors import ConfigError
from simcore.fabric import run as fabric_run
from simcore.fabric import utilization
from simcore.fabric.run import run_scenario
from simcore.fabric.scenario import build_topology, expand_traffic, load_scenario
from simcore.fabric.topology import MAX_CABLES, MAX_NODES

STAR = {"kind": "star", "num_hosts": 4, "rate_gbps": 10, "delay_s": 1e-6}


def _two_messages(second_at_s: float, **extra) -> dict:
    return {"topology": STAR, "settings": {"profile": "roce"},
            "traffic": [{"kind": "message", "src": "h0", "dst": "h1", "size_bytes": 200_000},
                        {"kind": "message", "src": "h2", "dst": "h1", "size_bytes": 200_000,
                         "at_s": second_at_s}], **extra}


@pytest.mark.parametrize("topology", [
    {"kind": "dumbbell", "num_left": 10**12, "num_right": 1, "rate_gbps": 10, "delay_s": 1e-6},
    {"kind": "leaf_spine", "num_leaves": 1000, "hosts_per_leaf": 1, "num_spines": 1000,
     "host_rate_gbps": 10, "delay_s": 1e-6},
    {"kind": "fat_tree", "k": 100, "rate_gbps": 10, "delay_s": 1e-6},
    {"kind": "rail_optimized", "num_nodes": 10**6, "gpus_per_node": 8, "nic_rate_gbps": 400,
     "nvlink_rate_gbps": 3600, "delay_s": 1e-6},
])
def test_a_topology_too_large_to_build_is_refused_before_it_is_built(topology):
    sc = load_scenario({"topology": topology,
                        "traffic": [{"kind": "message", "src": "h0", "dst": "h0",
                                     "size_bytes": 1}]})
    with pytest.raises(ConfigError, match=f"past the most the fabric simulator builds "
                                          f"\\({MAX_NODES:,} nodes, {MAX_CABLES:,} cables\\)"):
        build_topology(sc)


@pytest.mark.parametrize("where, value, field", [
    ("topology", {**STAR, "delay_s": 5.0}, "topology.delay_s: must be at most 1"),
    ("at_s", 2e6, "traffic[1].at_s: must be at most 1000000"),
    ("duration_s", 1e7, "duration_s: must be at most 1000000"),
])
def test_times_past_the_packet_clock_and_delays_past_a_second_name_their_field(where, value,
                                                                               field):
    data = _two_messages(0.0)
    if where == "topology":
        data["topology"] = value
    elif where == "at_s":
        data["traffic"][1]["at_s"] = value
    else:
        data["duration_s"] = value
    with pytest.raises(ConfigError, match=re.escape(field)):
        load_scenario(data)


@pytest.mark.parametrize("backend", ["packet", "flow", "analytical"])
def test_a_long_run_doubles_the_sampling_interval_instead_of_growing_without_bound(
        backend, monkeypatch):
    # 2,000 values over 8 links: 250 intervals held. The second message, sent at 10 ms, is
    # delivered at about 10.16 ms: 1,016 intervals of 10 us, 254 of 40 us, so the interval
    # doubles three times, to 80 us.
    base = run_scenario(_two_messages(0.01), backend)
    monkeypatch.setattr(utilization, "MAX_SAMPLE_VALUES", 2000)
    held = run_scenario(_two_messages(0.01), backend)
    over = held["utilization_over_time"]
    assert over["sampled_every_s"] == pytest.approx(8e-5)
    assert "sampled_every_s" not in base["utilization_over_time"]
    assert held["duration_s"] == base["duration_s"]
    assert held["flows"] == base["flows"]
    for a, b in zip(held["links"], base["links"]):
        assert a["bytes_sent"] == b["bytes_sent"]
        assert a["utilization_mean"] == pytest.approx(b["utilization_mean"])
        assert a["utilization_max"] <= b["utilization_max"] + 1e-9
    # The series holds every byte: utilization x interval x rate summed over time.
    rates = np.array([lk["rate_gbps"] * 1e9 / 8 for lk in held["links"]])
    t = np.array(over["t_s"])
    spans = np.minimum(np.diff(np.append(t, held["duration_s"])), over["interval_s"])
    carried = (np.array(over["per_link"]) * spans[None, :]).sum(axis=1) * rates
    sent = np.array([lk["bytes_sent"] for lk in held["links"]], dtype=float)
    busy = sent > 0
    assert carried[busy] == pytest.approx(
        [lk["busy_s"] * r for lk, r, b in zip(held["links"], rates, busy) if b], rel=1e-6)


def test_the_report_says_when_the_samples_were_widened(monkeypatch):
    from simcore.fabric.report import render_fabric_summary

    monkeypatch.setattr(utilization, "MAX_SAMPLE_VALUES", 2000)
    text = render_fabric_summary(run_scenario(_two_messages(0.01), "flow"))
    assert "The max is over samples of 8e-05 s" in " ".join(text.split())


def test_traffic_of_more_packets_than_the_packet_backend_takes_is_refused(monkeypatch):
    monkeypatch.setattr(fabric_run, "MAX_PACKETS", 90)
    # 200,000 bytes in 4,034-byte payloads (4,096-byte frames, 62 header bytes): 50 each.
    with pytest.raises(ConfigError, match="100 packets of 4034 payload bytes, past the 90 it "
                                          "takes .*use the flow or analytical backend"):
        run_scenario(_two_messages(0.0), "packet")
    assert run_scenario(_two_messages(0.0), "flow")["bytes"]["conserved"]
    # A run stopped at a duration simulates what fits in it.
    stopped = run_scenario(_two_messages(0.0, duration_s=1e-4), "packet")
    assert stopped["duration_s"] == pytest.approx(1e-4)


def test_a_negative_seed_is_refused_in_the_file_and_on_the_command_line():
    from click.testing import CliRunner

    from dse.cli import main

    with pytest.raises(ConfigError, match="seed: must be at least 0"):
        load_scenario({**_two_messages(0.0), "seed": -1})
    with pytest.raises(ConfigError, match="--seed must be a non-negative integer"):
        run_scenario(_two_messages(0.0), "flow", seed=-1)
    res = CliRunner().invoke(main, ["fabric", "x.yaml", "--seed", "-1"])
    assert res.exit_code == 2 and "-1 is not in the range x>=0" in res.output


def test_a_link_past_100_tbps_is_refused():
    with pytest.raises(ConfigError, match="topology.rate_gbps: must be at most 100000"):
        load_scenario({**_two_messages(0.0), "topology": {**STAR, "rate_gbps": 1e6}})


LEAF_SPINE = {"kind": "leaf_spine", "num_leaves": 2, "hosts_per_leaf": 2, "num_spines": 1,
              "host_rate_gbps": 10, "delay_s": 1e-6}
RAILS = {"kind": "rail_optimized", "num_nodes": 2, "gpus_per_node": 2, "nic_rate_gbps": 10,
         "nvlink_rate_gbps": 100, "delay_s": 1e-6, "num_spines": 1}


@pytest.mark.parametrize("topology", [LEAF_SPINE, RAILS], ids=["leaf_spine", "rails"])
@pytest.mark.parametrize("value", [0.001, 0])
def test_a_scenario_oversubscription_is_held_to_a_clusters_bounds(topology, value):
    with pytest.raises(ConfigError, match=r"topology\.oversubscription: must be at least 0\.01 "
                                          rf"\(got {value}\)"):
        load_scenario({**_two_messages(0.0), "topology": {**topology,
                                                           "oversubscription": value}})
    load_scenario({**_two_messages(0.0), "topology": {**topology, "oversubscription": 0.01}})


@pytest.mark.parametrize("topology", [LEAF_SPINE, RAILS], ids=["leaf_spine", "rails"])
def test_a_scenario_oversubscription_of_true_is_refused(topology):
    # YAML's true is not an oversubscription of 1.
    with pytest.raises(ConfigError, match=r"topology\.oversubscription: expected a number "
                                          r"\(got true\)"):
        load_scenario({**_two_messages(0.0), "topology": {**topology,
                                                           "oversubscription": True}})
    sc = load_scenario({**_two_messages(0.0), "topology": {**topology, "oversubscription": "2"}})
    assert sc.topology.oversubscription == 2.0


def test_a_link_under_1_mbps_is_refused():
    # One bit a second: 2 MB would take six months, past the packet clock's 53 days; a frame
    # of a link of 10^-13 Gb/s outlasts the clock.
    for rate in (1e-9, 1e-13):
        with pytest.raises(ConfigError, match="topology.rate_gbps: must be at least 0.001"):
            load_scenario({**_two_messages(0.0), "topology": {**STAR, "rate_gbps": rate}})


def test_a_packet_run_that_reaches_the_end_of_its_clock_is_refused_not_reported():
    from types import SimpleNamespace

    from simcore.fabric.packet.clock import HORIZON_S
    from simcore.fabric.run import _check_clock

    planned = [object(), object()]
    for duration_s, ran_s in ((None, 1e-6), (None, HORIZON_S), (10.0, HORIZON_S)):
        stats = SimpleNamespace(messages=[], lost_message_ids=[], duration_s=ran_s)
        with pytest.raises(ConfigError, match="end of the packet backend's clock .* 0 of 2 "
                                              "messages delivered.*use the flow or analytical"):
            _check_clock(stats, planned, "scenario", duration_s)
    # A run its duration stopped keeps its undelivered messages.
    _check_clock(SimpleNamespace(messages=[], lost_message_ids=[], duration_s=10.0), planned,
                 "scenario", 10.0)


def test_a_packet_fabric_refuses_to_run_past_the_end_of_its_clock():
    from simcore.fabric.packet.clock import HORIZON_S
    from simcore.fabric.run import make_fabric

    sc = load_scenario(_two_messages(0.0))
    fabric = make_fabric("packet", build_topology(sc), sc.settings, seed=0)
    with pytest.raises(ConfigError, match="passed the end of the packet fabric's clock"):
        fabric.run(HORIZON_S * 1.5)


CLUSTER = Path(__file__).resolve().parents[1] / "examples" / "cluster" / "dense_pp_8node.yaml"


def _cluster(**changes):
    from simcore.config import load_config

    cfg = load_config(CLUSTER)
    data = cfg.model_dump(mode="json", exclude_none=True)
    for path, value in changes.items():
        cur = data
        *head, last = path.split(".")
        for k in head:
            cur = cur[k]
        cur[last] = value
    return data


def test_a_cluster_on_the_packet_fabric_whose_sends_outlast_its_clock_is_refused_at_once():
    # 16 requests a billion seconds apart: the packet fabric's run used to spin for ever at the
    # end of its clock.
    from simcore.config import parse_config
    from simcore.simulate import simulate

    cfg = parse_config(_cluster(**{"workload.request_rate": 1e-9, "workload.num_prompts": 16}),
                       base_dir=CLUSTER.parent)
    with pytest.raises(ConfigError, match="cluster.fabric.backend: packet: the workload's planned "
                                          "sends span .* use the flow or analytical backend"):
        simulate(cfg)


@pytest.mark.parametrize("path, value, message", [
    ("cluster.network.topology.delay_s", 1e12, "delay_s: must be at most 1"),
    ("cluster.network.nic_gbps", 1e12, "nic_gbps: must be at most 100000"),
    ("cluster.dag.pp_microbatches", 10**12, "pp_microbatches: must be at most 64"),
    ("cluster.num_nodes", 10**12, "num_nodes: must be at most 1024"),
    ("cluster.network.num_storage_nodes", 10**12, "num_storage_nodes: must be at most 4096"),
    ("cluster.network.nic_gbps", 1e-6, "nic_gbps: must be at least 1"),
    ("cluster.network.topology.oversubscription", 1e12,
     "oversubscription: must be at most 1000"),
    ("cluster.network.topology.oversubscription", 0.001,
     "cluster.network.topology.oversubscription: must be at least 0.01 \\(got 0.001\\)"),
    ("cluster.network.topology.oversubscription", True,
     "cluster.network.topology.oversubscription: expected a number \\(got true\\)"),
    ("cluster.tenant_traffic", [{"src_gpu": 0, "dst_gpu": 1, "rate_gbps": 100,
                                 "message_bytes": 4096}], "3.052e\\+06 messages a second, past "
                                                          "the 100,000 a tenant may send"),
])
def test_cluster_network_settings_past_what_a_run_holds_are_refused(path, value, message):
    from simcore.config import parse_config

    with pytest.raises(ConfigError, match=message):
        parse_config(_cluster(**{path: value}), base_dir=CLUSTER.parent)


def test_a_cluster_network_past_the_fabric_bounds_is_refused_before_it_is_built():
    from simcore.cluster.network import NetworkConfig, build_cluster_network

    with pytest.raises(ConfigError, match="80,000,000 NICs.*past the most the fabric simulator "
                                          "builds"):
        build_cluster_network(NetworkConfig(), 8, 10_000_000, where="cluster.network")
    with pytest.raises(ConfigError, match="past the most the fabric simulator builds"):
        build_cluster_network(NetworkConfig(topology={"kind": "leaf_spine",
                                                      "oversubscription": 0.01}),
                              1024, 8, where="cluster.network")


def test_samples_that_end_on_the_last_held_boundary_keep_their_interval(monkeypatch):
    monkeypatch.setattr(utilization, "MAX_SAMPLE_VALUES", 2000)
    width = 2.0 ** -17
    rec = utilization.LinkLoadRecorder(8, width)
    held = utilization.max_intervals(8)
    rec.add(0.0, held * width, 1.0, link=0)
    t_s, util = rec.samples(np.ones(8), held * width)
    assert rec.interval_s == width and len(t_s) == held
    rec.add(0.0, (held + 0.5) * width, 1.0, link=1)
    assert rec.interval_s == 2 * width


def test_a_derived_link_past_100_tbps_is_refused():
    sc = load_scenario({"topology": {"kind": "leaf_spine", "num_leaves": 2, "hosts_per_leaf": 4,
                                     "num_spines": 2, "host_rate_gbps": 1e5, "delay_s": 1e-6,
                                     "oversubscription": 0.01},
                        "traffic": [{"kind": "message", "src": "h0", "dst": "h1",
                                     "size_bytes": 10}]})
    with pytest.raises(ConfigError, match="leaf_spine builder derives links of 2e\\+07 Gb/s"):
        build_topology(sc)


def test_tenant_traffic_past_its_nic_is_refused():
    from simcore.config import parse_config
    from simcore.simulate import simulate

    tenant = [{"src_gpu": 0, "dst_gpu": 8, "rate_gbps": 450, "message_bytes": 4 << 20}]
    cfg = parse_config(_cluster(**{"cluster.tenant_traffic": tenant}), base_dir=CLUSTER.parent)
    with pytest.raises(ConfigError, match=r"^cluster.tenant_traffic\[0\].rate_gbps: 450 Gb/s is "
                                          r"past its NIC's 400"):
        simulate(cfg)


def test_tenants_that_together_pass_a_nic_are_refused():
    # Each within its NIC, two tenants from one NIC at once queue without end: the run used to
    # go on for ever. Windows that do not overlap share the NIC in turn.
    from simcore.config import parse_config
    from simcore.simulate import simulate

    two = [{"src_gpu": 0, "dst_gpu": 8, "rate_gbps": 300, "message_bytes": 4 << 20},
           {"src_gpu": 0, "dst_gpu": 9, "rate_gbps": 300, "message_bytes": 4 << 20}]
    cfg = parse_config(_cluster(**{"cluster.tenant_traffic": two}), base_dir=CLUSTER.parent)
    with pytest.raises(ConfigError, match=re.escape(
            "cluster.tenant_traffic[0], [1]: together they send from GPU 0's NIC at 600 Gb/s, "
            "past its 400 (cluster.network.nic_gbps)")):
        simulate(cfg)
    into = [{**two[0], "src_gpu": 1}, {**two[1], "dst_gpu": 8}]
    cfg = parse_config(_cluster(**{"cluster.tenant_traffic": into}), base_dir=CLUSTER.parent)
    with pytest.raises(ConfigError, match=re.escape("together they send to GPU 8's NIC")):
        simulate(cfg)
    from simcore.cluster.build import check_tenants_share_of_nics
    from simcore.cluster.config import TenantTraffic

    in_turn = [TenantTraffic(**two[0], stop_s=1.0), TenantTraffic(**two[1], start_s=1.0)]
    check_tenants_share_of_nics(in_turn, 400.0)
    with pytest.raises(ValueError, match=r"stop_s \(1\) must come after start_s \(5\)"):
        TenantTraffic(**two[0], start_s=5.0, stop_s=1.0)


def test_an_all_to_all_past_the_message_bound_is_refused_before_it_is_expanded():
    sc = load_scenario({"topology": {"kind": "star", "num_hosts": 60_000, "rate_gbps": 10,
                                     "delay_s": 1e-6},
                        "traffic": [{"kind": "all_to_all", "hosts": "all",
                                     "size_bytes": 1000}]})
    with pytest.raises(ConfigError, match="an all-to-all of 60,000 hosts is 3,599,940,000 "
                                          "messages"):
        expand_traffic(sc, build_topology(sc))


def test_adaptive_routing_past_its_table_bound_is_refused(monkeypatch):
    from simcore.fabric.packet import profiles

    monkeypatch.setattr(profiles, "MAX_ADAPTIVE_ENTRIES", 19)
    sc = load_scenario({**_two_messages(0.0), "settings": {"profile": "slingshot"}})
    with pytest.raises(ConfigError, match="adaptive routing .* keeps the ports toward every host "
                                          "at every node, 5 x 4 entries here, past the 19"):
        run_scenario(sc, "packet")
