"""Settings only the packet backend reads: they change nothing on the flow and analytical
backends (the classification is checked against the backends themselves), and a run at those
fidelities says which of its settings it ignored, in its assumptions, its printed summary and
`dse fabric`'s result; settings no cluster run reads are refused."""

import copy
import json

import pytest

from dse.summary import render_summary
from simcore.cluster.config import backends_ignoring_path
from simcore.config import parse_config
from simcore.errors import ConfigError
from simcore.fabric.fidelity import PACKET_ONLY_SETTINGS, backends_ignoring, changed_settings
from simcore.fabric.report import render_fabric_summary
from simcore.fabric.run import run_scenario
from simcore.fabric.settings import FabricSettings
from simcore.simulate import simulate

READ_BY_EVERY_BACKEND = {"profile", "mtu_bytes", "header_bytes", "sample_interval_s"}
"""Packet framing (through the topology), the profile it comes from, and the sample interval."""

INCAST = {
    "name": "incast", "seed": 1, "backend": "packet",
    "topology": {"kind": "star", "num_hosts": 5, "rate_gbps": 100, "delay_s": 1e-6,
                 "buffer_bytes": 400_000},
    "settings": {"profile": "roce", "pfc": {"shared_buffer_bytes": 600_000}},
    "traffic": [{"kind": "incast", "senders": "all", "receiver": "h4",
                 "size_bytes": 300_000}],
}
"""A 4:1 incast that builds a queue: what every packet-only mechanism acts on."""

PACKET_ONLY_CHANGES = {
    "routing": {"routing": "adaptive"},
    "ecn": {"ecn": {"kmin_bytes": 20_000, "kmax_bytes": 40_000, "pmax": 1.0}},
    "pfc": {"pfc": {"enabled": False}},
    "credit": {"pfc": {"enabled": False}, "credit": {"enabled": True}},
    "dcqcn": {"dcqcn": {"cnp_interval_s": 4e-6, "variant": "paper"}},
    "traffic_classes": {"traffic_classes": {"lossless": [1]}},
    "retransmit_timeout_s": {"pfc": {"enabled": False}, "retransmit_timeout_s": 1e-5},
    "link_disciplines": {"link_disciplines": {0: "drop_tail"}},
    "queue_histogram_bin_bytes": {"queue_histogram_bin_bytes": 1000},
}
"""One change of each packet-only field, away from the RoCE profile's defaults."""


def scenario(**settings):
    sc = copy.deepcopy(INCAST)
    sc["settings"].update(settings)
    return sc


def flows(result):
    return [(m["id"], m["start_s"], m["end_s"]) for m in result["flows"]["messages"]]


def test_every_fabric_setting_is_classified():
    fields = set(FabricSettings.model_fields)
    assert set(PACKET_ONLY_SETTINGS) | READ_BY_EVERY_BACKEND == fields
    assert not set(PACKET_ONLY_SETTINGS) & READ_BY_EVERY_BACKEND
    assert set(PACKET_ONLY_CHANGES) == set(PACKET_ONLY_SETTINGS)


@pytest.mark.parametrize("field", PACKET_ONLY_SETTINGS)
def test_a_packet_only_setting_changes_nothing_on_flow_and_analytical(field):
    change = PACKET_ONLY_CHANGES[field]
    for backend in ("flow", "analytical"):
        base = run_scenario(scenario(), backend)
        changed = run_scenario(scenario(**change), backend)
        assert flows(changed) == flows(base), (field, backend)
        assert changed["links"] == base["links"] or field == "queue_histogram_bin_bytes"
        assert any(p.split(".")[1] == field for p in changed["ignored_settings"]), changed[
            "ignored_settings"]
        assert backend in backends_ignoring(field)
    assert run_scenario(scenario(**change), "packet")["ignored_settings"] == []


MARKING = PACKET_ONLY_CHANGES["ecn"]


@pytest.mark.parametrize("first, second", [
    ({}, MARKING),                                                  # ECN thresholds
    ({}, PACKET_ONLY_CHANGES["pfc"]),                               # PFC off: drops
    (MARKING, {**MARKING, "dcqcn": {"enabled": False}}),            # DCQCN reacts to marks
])
def test_the_packet_backend_does_read_them(first, second):
    assert flows(run_scenario(scenario(**first), "packet")) != flows(
        run_scenario(scenario(**second), "packet"))


def test_changed_settings_are_leaves_away_from_the_profile():
    s = FabricSettings(profile="infiniband", mtu_bytes=2048, dcqcn={"enabled": False},
                       credit={"buffer_bytes": 10_000})
    # mtu_bytes moves the histogram bin's default with it; enabled=False is infiniband's own.
    assert changed_settings(s) == ["mtu_bytes", "credit.buffer_bytes"]
    assert changed_settings(FabricSettings(profile="slingshot")) == []


def test_dse_fabric_names_what_its_backend_ignored():
    r = run_scenario(scenario(dcqcn={"g": 0.5}), "flow")
    assert r["ignored_settings"] == ["settings.pfc.shared_buffer_bytes", "settings.dcqcn.g",
                                     "topology.buffer_bytes"]
    out = " ".join(render_fabric_summary(r).split())
    assert ("Ignored at fidelity flow (read by the packet backend only): "
            "settings.pfc.shared_buffer_bytes, settings.dcqcn.g, topology.buffer_bytes") in out
    assert "Ignored at fidelity" not in render_fabric_summary(run_scenario(scenario(),
                                                                           "packet"))


@pytest.mark.parametrize("backend, words", [
    ("analytical", ("serialised first come, first served", "queueing dynamics beyond",
                    "congestion control", "losses", "ECN", "PFC")),
    ("flow", ("max-min fair sharing", "queues", "losses", "ECN", "PFC")),
    ("packet", ("packets through switch queues",)),
])
def test_dse_fabric_states_what_its_backend_models_and_ignores(backend, words):
    r = run_scenario(scenario(), backend)
    assert r["model"].startswith(f"{backend} fabric: ")
    for w in words:
        assert w in r["model"]
    assert f"Model: {r['model']}" in " ".join(render_fabric_summary(r).split())


# --- cluster runs ------------------------------------------------------------------------------

CLUSTER = {
    "name": "fidelity", "seed": 2,
    "model": {"name": "meta-llama/Llama-3.1-8B"},
    "hardware": {"gpu": "H100-SXM", "gpus_per_node": 2},
    "parallelism": {"tensor_parallel_size": 4},
    "workload": {"num_prompts": 12, "request_rate": 50,
                 "dataset": {"kind": "random", "input_len": 128, "output_len": 8}},
}
"""TP 4 across two nodes of two GPUs: every step's all-reduce crosses the fabric."""

DCQCN_AND_BUFFERS = {"settings": {"dcqcn": {"cnp_interval_s": 4e-6},
                                  "pfc": {"shared_buffer_bytes": 128_000_000}}}
IGNORED = ["cluster.fabric.settings.pfc.shared_buffer_bytes",
           "cluster.fabric.settings.dcqcn.cnp_interval_s",
           "cluster.network.topology.buffer_bytes"]


def cluster_config(backend, fabric=None, topology=None):
    d = copy.deepcopy(CLUSTER)
    d["cluster"] = {"num_nodes": 2, "fabric": {"backend": backend, **(fabric or {})},
                    "network": {"nic_gbps": 100,
                                "topology": {"kind": "leaf_spine", **(topology or {})}}}
    return parse_config(d)


def without_provenance(r):
    r = copy.deepcopy(r)
    del r["provenance"]
    return json.dumps(r, sort_keys=True)


@pytest.mark.parametrize("backend", ["analytical", "flow"])
def test_a_cluster_result_lists_the_settings_its_fidelity_ignored(backend):
    plain = simulate(cluster_config(backend))
    tuned = simulate(cluster_config(backend, DCQCN_AND_BUFFERS, {"buffer_bytes": 1_000_000}))
    # Bit-identical: the settings had no effect, so the result must say so.
    assert without_provenance(tuned) == without_provenance(plain)
    line = f"ignored at fidelity {backend} (no effect on this result): " + ", ".join(IGNORED)
    assert line in tuned["provenance"]["assumptions"]
    assert not any(a.startswith("ignored at fidelity")
                   for a in plain["provenance"]["assumptions"])
    assert any(a.startswith(f"{backend} fabric:") for a in plain["provenance"]["assumptions"])
    assert f"- {line}" in " ".join(render_summary(tuned).split())


def test_the_packet_backend_ignores_none_of_them():
    r = simulate(cluster_config("packet", DCQCN_AND_BUFFERS, {"buffer_bytes": 1_000_000}))
    assumptions = r["provenance"]["assumptions"]
    assert not any(a.startswith("ignored at fidelity") for a in assumptions)
    assert ("packet fabric (roce profile): packets through switch queues with ECN marking, "
            "PFC, DCQCN, ECMP") in assumptions


def test_tenant_traffic_is_read_by_the_analytical_fabric():
    # The analytical fabric serialises messages on shared links, so a tenant delays transfers
    # there too: it is not listed as ignored, and the result states the model's omissions.
    d = copy.deepcopy(CLUSTER)
    d["cluster"] = {"num_nodes": 2, "tenant_traffic": [{"src_gpu": 1, "dst_gpu": 3,
                                                        "rate_gbps": 50}]}
    assumptions = simulate(parse_config(d))["provenance"]["assumptions"]
    assert not any(a.startswith("ignored at fidelity") for a in assumptions)
    (line,) = [a for a in assumptions if a.startswith("analytical fabric:")]
    for words in ("serialised first come, first served", "queueing dynamics", "congestion control",
                  "losses", "PFC", "ECN"):
        assert words in line


@pytest.mark.parametrize("field, value, words", [
    ("sample_interval_s", 1e-3, "busy fraction over the whole run"),
    ("queue_histogram_bin_bytes", 1000, "deepest queue"),
    ("link_disciplines", {0: "drop_tail"}, "numbered by its builder"),
])
def test_settings_no_cluster_run_reads_are_refused(field, value, words):
    with pytest.raises(ConfigError) as err:
        cluster_config("packet", {"settings": {field: value}})
    msg = str(err.value)
    assert f"cluster.fabric: settings.{field} has no effect in a cluster run" in msg
    assert words in msg and "\n" not in msg


def test_the_utilization_interval_no_cluster_result_reads_is_refused():
    # A cluster result reports each link's busy fraction over the run, never the samples.
    with pytest.raises(ConfigError, match="utilization_interval_s has no effect: a cluster "
                                          "result reports each link's busy fraction"):
        cluster_config("analytical", {"utilization_interval_s": 1e-3})
    with pytest.raises(ConfigError, match="utilization_interval_s"):
        cluster_config("analytical", {"utilization_interval_s": float("inf")})
    cluster_config("analytical", {"utilization_interval_s": 1e-2})     # the default, written


@pytest.mark.parametrize("path, backends", [
    ("cluster.fabric.settings.dcqcn.cnp_interval_s", ("flow", "analytical")),
    ("cluster.fabric.settings.dcqcn", ("flow", "analytical")),
    ("cluster.fabric.settings.pfc.shared_buffer_bytes", ("flow", "analytical")),
    ("cluster.fabric.settings.routing", ("flow", "analytical")),
    ("cluster.network.topology.buffer_packets", ("flow", "analytical")),
    ("cluster.fabric.settings.sample_interval_s", ("packet", "flow", "analytical")),
    ("cluster.tenant_traffic", ()),
    ("cluster.fabric.settings.profile", ()),
    ("cluster.fabric.settings.mtu_bytes", ()),
    ("cluster.network.topology.oversubscription", ()),
    ("cluster.network.nic_gbps", ()),
    ("engine.max_num_seqs", ()),
])
def test_which_backends_ignore_a_config_path(path, backends):
    assert backends_ignoring_path(path) == backends


def test_settings_of_a_feature_switched_off_are_reported_as_having_no_effect():
    # DCQCN off with its CNP interval set, and a retransmission timeout on a fabric PFC keeps
    # lossless in every class: no backend reads them.
    sc = scenario(dcqcn={"enabled": False, "cnp_interval_s": 4e-6}, retransmit_timeout_s=1e-5)
    r = run_scenario(sc, "packet")
    assert r["inert_settings"] == ["settings.dcqcn.cnp_interval_s",
                                   "settings.retransmit_timeout_s"]
    assert "No effect (their feature is off, or the fabric never drops): " \
           "settings.dcqcn.cnp_interval_s, settings.retransmit_timeout_s" in \
           " ".join(render_fabric_summary(r).split())
    # The same run without them: identical flows.
    plain = run_scenario(scenario(dcqcn={"enabled": False}), "packet")
    assert flows(plain) == flows(r)
    assert run_scenario(scenario(), "packet")["inert_settings"] == []
    cfg = cluster_config("packet", {"settings": {"dcqcn": {"enabled": False, "g": 0.5}}})
    assert ("no effect on this result (their feature is off, or the fabric never drops): "
            "cluster.fabric.settings.dcqcn.g") in cfg.cluster.assumption_lines()
