"""Headroom in every result: the offered load against the measured throughput capacity, and the
verdict the explanation opens with (`simcore.saturation.headroom`)."""

from __future__ import annotations

import pytest

from dse.explain import explain
from simcore.config import parse_config
from simcore.uncertainty import simulate_with_envelope


def _run(rate: float, **over) -> dict:
    # 1,500 requests: at 40 req/s the second half of the arrivals spans some five generations
    # of the batch (equal output lengths finish in waves), enough to read a steady rate.
    d = {"name": "h", "seed": 0, "model": {"name": "meta-llama/Llama-3.1-8B"},
         "hardware": {"gpu": "A100-80GB"}, "engine": {"max_num_seqs": 64},
         "uncertainty": {"method": "first_order"},
         "workload": {"num_prompts": 1500, "request_rate": rate,
                      "dataset": {"kind": "random", "input_len": 512, "output_len": 128}}}
    d.update(over)
    return simulate_with_envelope(parse_config(d))


@pytest.fixture(scope="module")
def runs():
    return {rate: _run(rate) for rate in (3.0, 40.0)}


def test_capacity_is_what_an_overloaded_run_serves(runs):
    over = runs[40.0]
    h = over["headroom"]
    assert h["state"] == "over_capacity" and over["over_capacity"]
    # Sending faster than the capacity: the run serves about the capacity, and the rest queues.
    assert over["served_request_rate"] == pytest.approx(h["throughput_capacity_rps"], rel=0.1)
    assert h["queue_growth_rps"] == pytest.approx(40.0 - over["served_request_rate"], rel=0.15)
    # Both rates measure the same deployment: one capacity run serves both.
    assert runs[3.0]["headroom"]["throughput_capacity_rps"] == h["throughput_capacity_rps"]
    assert h["capacity_run_concurrency"] == 64 and h["capacity_run_requests"] == 1500


def test_light_load_has_headroom_and_says_how_much(runs):
    light = runs[3.0]
    h = light["headroom"]
    assert h["state"] == "headroom" and not light["over_capacity"]
    assert h["load_fraction"] == pytest.approx(3.0 / h["throughput_capacity_rps"])
    first = explain(light)["sentences"][0]
    assert first.startswith(f"Headroom: 3 req/s offered is {h['load_fraction'] * 100:.0f}% of "
                            f"the {h['throughput_capacity_rps']:.3g} req/s")
    assert f"{h['binds_first_label']} binds first" in first


def test_overload_says_the_queue_grows(runs):
    e = explain(runs[40.0])
    assert e["load_state"] == "over_capacity"
    assert e["sentences"][0].startswith("Over capacity: 40 req/s offered against a capacity of")
    assert "the queue grows" in e["sentences"][0]


def test_a_short_run_still_filling_under_capacity_is_not_called_overloaded():
    # 100 requests at 10 req/s on the quickstart's A100: the queue still grows over the second
    # half of the arrivals (requests take about as long as that half), at 59% of the capacity.
    from pathlib import Path

    import yaml

    d = yaml.safe_load((Path(__file__).parent.parent / "examples/quickstart.yaml").read_text())
    d["workload"]["num_prompts"] = 100
    d["uncertainty"] = {"method": "first_order"}
    r = simulate_with_envelope(parse_config(d))
    h = r["headroom"]
    assert r["over_capacity"] and h["load_fraction"] < 0.85
    assert h["state"] == "headroom" and h["still_filling"]
    first = explain(r)["sentences"][0]
    assert first.startswith("Headroom: 10 req/s offered is ")
    assert "that is the run filling from empty, not overload" in first
    # At capacity a growing queue is overload.
    assert not _run(40.0)["headroom"]["still_filling"]


def test_a_clients_concurrency_cap_below_the_engines_sets_the_capacity():
    # 16 requests in flight on an engine that holds 64: the client, not the engine, caps what
    # is served. The capacity run keeps 16 in flight, and the verdict names the client's cap
    # (before, the engines were kept full, and a queue growing behind the cap at 10 req/s was
    # called a run still filling, at well under that capacity).
    capped = _run(10.0, workload={"num_prompts": 600, "request_rate": 10.0, "max_concurrency": 16,
                                  "dataset": {"kind": "random", "input_len": 512,
                                              "output_len": 128}})
    h = capped["headroom"]
    assert h["capacity_run_concurrency"] == 16 and h["capacity_run_client_cap"] == 16
    assert h["binds_first"] == "max_concurrency"
    assert h["state"] == "over_capacity" and not h["still_filling"]
    assert capped["served_request_rate"] == pytest.approx(h["throughput_capacity_rps"], rel=0.1)
    first = explain(capped)["sentences"][0]
    assert first.startswith("Over capacity: 10 req/s offered against a capacity of")
    assert "with the client's 16 requests in flight" in first
    assert "set by the client's max_concurrency of 16 requests in flight" in first
    # A cap the engines never reach changes nothing.
    loose = _run(3.0, workload={"num_prompts": 1500, "request_rate": 3.0, "max_concurrency": 64,
                                "dataset": {"kind": "random", "input_len": 512, "output_len": 128}})
    assert "capacity_run_client_cap" not in loose["headroom"]
    assert loose["headroom"]["binds_first"] != "max_concurrency"


def test_no_headroom_without_a_rate_or_when_switched_off():
    burst = _run(float("inf"))
    assert "headroom" not in burst and explain(burst)["load_state"] is None
    off = _run(3.0, metrics={"headroom": False})
    assert "headroom" not in off


@pytest.mark.slow
def test_seventy_b_on_two_nodes_gets_three_different_correct_verdicts():
    """Llama-3.1-70B on 2 x 8 H100 (TP 8, two replicas), ShareGPT: is 20, 40 or 100 req/s
    enough?"""
    verdicts = {}
    for rate in (20.0, 40.0, 100.0):
        r = _run(rate, model={"name": "meta-llama/Llama-3.1-70B"},
                 hardware={"gpu": "H100-SXM"}, engine={},
                 parallelism={"tensor_parallel_size": 8, "data_parallel_size": 2},
                 workload={"num_prompts": 1500, "request_rate": rate,
                           "dataset": {"kind": "sharegpt"}})
        h = r["headroom"]
        verdicts[rate] = (h, explain(r)["sentences"][0])
    cap = verdicts[20.0][0]["throughput_capacity_rps"]
    assert 25.0 < cap < 80.0
    assert verdicts[20.0][0]["state"] == "headroom"
    assert verdicts[20.0][1].startswith("Headroom: 20 req/s offered is ")
    over = verdicts[100.0][0]
    assert over["state"] == "over_capacity"
    # An overloaded deployment serves up to its capacity (this short run, still filling its
    # batch of 1,024 per engine with prompts whose steps, launched op by op at TP 8, are the
    # slow ones, serves somewhat less); the rest of the offered load queues.
    assert 0.6 * cap < over["served_rps"] < 1.05 * cap
    assert over["queue_growth_rps"] == pytest.approx(100.0 - over["served_rps"], rel=0.2)
    mid = verdicts[40.0][0]
    assert mid["load_fraction"] == pytest.approx(40.0 / cap)
    assert mid["state"] != "headroom" or mid["load_fraction"] < 0.85
    assert len({v[1] for v in verdicts.values()}) == 3


def test_a_clusters_capacity_is_one_replica_on_the_analytical_fabric_times_the_replicas():
    from simcore.saturation import _capacity, capacity_config

    d = {"name": "hc", "seed": 0, "model": {"name": "meta-llama/Llama-3.1-8B"},
         "hardware": {"gpu": "A100-80GB"}, "engine": {"max_num_seqs": 8},
         "parallelism": {"num_replicas": 2}, "uncertainty": {"method": "first_order"},
         "workload": {"num_prompts": 40, "request_rate": 4.0,
                      "dataset": {"kind": "random", "input_len": 256, "output_len": 32}},
         "cluster": {"num_nodes": 1, "fabric": {"backend": "flow"}}}
    r = simulate_with_envelope(parse_config(d))
    h = r["headroom"]
    assert h["capacity_run_replicas_measured"] == 1
    assert h["capacity_run_replicas_scaled_to"] == 2
    assert h["capacity_run_fabric"] == "analytical"
    one = capacity_config(parse_config(d), r)
    assert one.parallelism.num_replicas == 1 and one.cluster.fabric.backend == "analytical"
    assert one.workload.max_concurrency == 8          # one replica's engine, full
    assert h["throughput_capacity_rps"] == pytest.approx(
        2 * _capacity(one)["throughput_capacity_rps"], rel=1e-12)
    assert "(one replica measured on the analytical fabric, times 2)" in \
        explain(r)["sentences"][0]
