"""Sizes far beyond what a run can hold get one clear error naming the field, or are said in
the result, never a traceback or a run that does not end: more engines than a run simulates, a
shared prefix longer than the model's context (whose blocks' keys alone would not fit in
memory), a run whose every request is refused (its headroom has no capacity to compare with),
sessions that send nothing, arrivals spread over years (the sampling and the load reports
widened, and said), intervals finer than a millisecond, and a command that runs out of memory
anyway."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

import dse.cli as cli
from simcore.config import MAX_ENGINES, parse_config
from simcore.errors import ConfigError
from simcore.setup import build_deployment

TINY = {
    "name": "tiny",
    "model": {"name": "meta-llama/Llama-3.1-8B", "max_model_len": 2048},
    "hardware": {"gpu": "A100-80GB"},
    "workload": {"num_prompts": 20, "request_rate": 5,
                 "dataset": {"kind": "random", "input_len": 128, "output_len": 8}},
}


def _config(**changes) -> dict:
    data = yaml.safe_load(yaml.safe_dump(TINY))
    for path, value in changes.items():
        *head, last = path.split(".")
        node = data
        for key in head:
            node = node.setdefault(key, {})
        node[last] = value
    return data


def test_more_engines_set_without_validation_are_refused_at_deployment():
    """A parallelism copied in without validation (a search's derived data_parallel_size) is
    held to the same bound when the deployment is built."""
    cfg = parse_config(TINY)
    big = cfg.model_copy(update={"parallelism": cfg.parallelism.model_copy(
        update={"data_parallel_size": MAX_ENGINES + 1})})
    with pytest.raises(ConfigError, match=r"^parallelism: 8,193 engine instances; one run holds "
                                          r"at most 8,192"):
        build_deployment(big)


def test_more_engines_than_a_run_holds_are_refused_naming_the_field():
    parse_config(_config(**{"parallelism.data_parallel_size": MAX_ENGINES}))
    for changes in ({"parallelism.data_parallel_size": MAX_ENGINES + 1},
                    {"parallelism.data_parallel_size": 10**12},
                    {"parallelism.data_parallel_size": 4096, "parallelism.num_replicas": 3}):
        with pytest.raises(ConfigError, match=r"parallelism: .* engine instances .* at most "
                                              r"8,192"):
            parse_config(_config(**changes))


@pytest.mark.parametrize("dataset, field", [
    ({"kind": "random", "input_len": 16, "output_len": 8, "prefix_len": 2048}, "prefix_len"),
    ({"kind": "random", "input_len": 16, "output_len": 8, "prefix_len": 10**12}, "prefix_len"),
    ({"kind": "prefix_repetition", "prefix_len": 5000, "suffix_len": 16, "num_prefixes": 2,
      "output_len": 8}, "prefix_len"),
    ({"kind": "sessions", "num_sessions": 2, "shared_prefix_len": 10**12}, "shared_prefix_len"),
])
def test_a_shared_prefix_as_long_as_the_context_is_refused(dataset, field):
    data = _config(**{"workload.dataset": dataset})
    if dataset["kind"] == "sessions":
        del data["workload"]["num_prompts"]
    cfg = parse_config(data)
    with pytest.raises(ConfigError, match=rf"^workload\.dataset\.{field}: \d+ tokens begin every "
                                          r"prompt, at least the model's max_model_len \(2048\)"):
        build_deployment(cfg)


def test_a_prefix_just_under_the_context_is_kept():
    cfg = parse_config(_config(**{"workload.dataset": {
        "kind": "random", "input_len": 16, "output_len": 8, "prefix_len": 2047}}))
    assert build_deployment(cfg).max_model_len == 2048


def test_a_run_whose_every_request_is_refused_reports_it_without_headroom(tmp_path):
    path = tmp_path / "long.yaml"
    path.write_text(yaml.safe_dump(_config(**{"workload.dataset.input_len": 10**12,
                                              "workload.num_prompts": 200})))
    res = CliRunner().invoke(cli.main, ["simulate", str(path), "--out",
                                        str(tmp_path / "out.json")])
    assert res.exit_code == 0, res.output
    assert "No request completed: all 200 failed" in res.output
    assert "Traceback" not in res.output
    out = yaml.safe_load((tmp_path / "out.json").read_text())
    assert out["completed"] == 0 and out.get("headroom") is None


def test_a_command_that_runs_out_of_memory_fails_in_one_line(monkeypatch, tmp_path: Path):
    import simcore.uncertainty

    def exhausted(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(simcore.uncertainty, "simulate_with_envelope", exhausted)
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY))
    res = CliRunner().invoke(cli.main, ["simulate", str(path)])
    assert res.exit_code == 2
    assert res.output.startswith("error: this machine ran out of memory for the run")
    assert res.output.count("\n") == 1


def test_arrivals_spread_over_a_long_span_widen_the_sampling_interval_and_say_so(monkeypatch):
    """A run samples the engines at most MAX_TIMESERIES_SAMPLES times while its requests
    arrive: requests one in a million seconds apart would otherwise be years of one-second
    samples of idle engines."""
    import simcore.simulate as sim

    monkeypatch.setattr(sim, "MAX_TIMESERIES_SAMPLES", 1000)
    monkeypatch.setattr(sim, "SAMPLES_PER_REQUEST", 10)    # 200 for the 20 requests: 1000 binds
    slow = parse_config(_config(**{"workload.request_rate": 1e-6}))
    r = sim.simulate(slow)
    widened = [a for a in r["provenance"]["assumptions"] if "widened" in a]
    assert len(widened) == 1 and "metrics.timeseries_interval_s widened from 1 to" in widened[0]
    t = r["timeseries"]["t_s"]
    assert t[-1] >= r["requests"][-1]["send_s"] and len(t) <= 1002
    assert r["completed"] == 20
    # At an ordinary rate nothing changes: one sample a second, no such line.
    r = sim.simulate(parse_config(TINY))
    assert not any("widened" in a for a in r["provenance"]["assumptions"])
    assert r["timeseries"]["t_s"][:3] == [0.0, 1.0, 2.0]


def test_long_arrival_spans_widen_the_load_reports_of_routed_engines_and_say_so(monkeypatch):
    import simcore.simulate as sim

    monkeypatch.setattr(sim, "MAX_TIMESERIES_SAMPLES", 1000)
    monkeypatch.setattr(sim, "MAX_LOAD_REPORTS", 2000)
    two = _config(**{"workload.request_rate": 1e-6, "parallelism.data_parallel_size": 2,
                     "router.policy": "least_outstanding"})
    lines = [a for a in sim.simulate(parse_config(two))["provenance"]["assumptions"]
             if "widened" in a]
    assert [line.split(" widened")[0] for line in lines] == [
        "metrics.timeseries_interval_s", "router.periodic_infra_update_time_s"]
    # Round robin reads no load: its reports are widened unsaid.
    two["router"]["policy"] = "round_robin"
    lines = [a for a in sim.simulate(parse_config(two))["provenance"]["assumptions"]
             if "widened" in a]
    assert [line.split(" widened")[0] for line in lines] == ["metrics.timeseries_interval_s"]
    # One engine publishes no loads: only the sampling is widened.
    one = parse_config(_config(**{"workload.request_rate": 1e-6}))
    lines = [a for a in sim.simulate(one)["provenance"]["assumptions"] if "widened" in a]
    assert [line.split(" widened")[0] for line in lines] == ["metrics.timeseries_interval_s"]


def test_sessions_whose_first_turns_all_exceed_the_context_are_refused_after_the_run():
    import simcore.simulate as sim

    data = _config(**{"workload.dataset": {"kind": "sessions", "num_sessions": 5,
                                           "first_prompt_len": 5000, "max_context_tokens": 4096}})
    del data["workload"]["num_prompts"]
    with pytest.raises(ConfigError, match=r"^workload\.dataset: no session sent a request: every "
                                          r"session's first turn, its prompt and reply, exceeds "
                                          r"the client's context limit \(workload\.dataset\."
                                          r"max_context_tokens, 4096 tokens\)"):
        sim.simulate(parse_config(data))


@pytest.mark.parametrize("path, field", [
    ("metrics.timeseries_interval_s", "metrics.timeseries_interval_s"),
    ("router.periodic_infra_update_time_s", "router.periodic_infra_update_time_s")])
def test_intervals_finer_than_a_millisecond_are_refused(path, field):
    """A sample or a load report every nanosecond is a billion events a simulated second, more
    than any run can take; no engine step is shorter than a millisecond."""
    policy = {"router.policy": "least_outstanding"} if path.startswith("router.") else {}
    parse_config(_config(**{path: 0.001}, **policy))
    with pytest.raises(ConfigError, match=rf"{field}: must be at least 0\.001 \(got 1e-09\)"):
        parse_config(_config(**{path: 1e-9}, **policy))


# -- settings past what a run holds, and settings with no effect ------------------------------

@pytest.mark.parametrize("path, value, message", [
    ("compute.roofline.relative_uncertainty", 35, "relative_uncertainty: must be less than 1"),
    ("compute.roofline.relative_uncertainty", float("inf"), "relative_uncertainty"),
    ("compute.roofline.min_kernel_s", float("inf"), "min_kernel_s: must be at most 0.01"),
    ("host.host_speed", 1e12, "host.host_speed: must be at most 100"),
    ("host.model_runner_step_s", float("inf"), "host.model_runner_step_s: must be at most 1"),
    ("host.request_overhead_s", 1e12, "host.request_overhead_s: must be at most 60"),
    ("host.api_server_count", 10**12, "host.api_server_count: must be at most 1024"),
    ("host.cpu_costs", "bogus", "host.cpu_costs: no measured CPU costs 'bogus'"),
    ("engine.num_gpu_blocks_override", 10**12,
     "engine.num_gpu_blocks_override: must be at most 134217728"),
])
def test_settings_past_what_a_run_holds_name_their_field(path, value, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(_config(**{path: value}))


def test_a_trace_time_scale_without_its_timestamps_is_refused():
    trace = {"kind": "mooncake", "path": str(Path(__file__).parent.parent / "examples" / "data"
                                             / "mooncake_head.jsonl"),
             "use_timestamps": False, "time_scale": 0.5}
    with pytest.raises(ConfigError, match="workload: dataset.time_scale: has no effect with "
                                          "dataset.use_timestamps false"):
        parse_config(_config(**{"workload.dataset": trace}))


def test_a_ramp_of_nan_requests_a_second_is_refused():
    with pytest.raises(ConfigError, match="ramp_up_start_rps and ramp_up_end_rps must be "
                                          "positive and finite"):
        parse_config(_config(**{"workload.request_rate": "inf",
                                "workload.ramp_up_strategy": "linear",
                                "workload.ramp_up_start_rps": float("nan"),
                                "workload.ramp_up_end_rps": 10}))


@pytest.mark.parametrize("changes, message", [
    ({"host.model": "constant", "host.host_speed": 0.05},
     "host.host_speed: has no effect with model: constant"),
    ({"host.model": "constant", "host.request_overhead_s": 1.0},
     "host.request_overhead_s: has no effect with model: constant"),
    ({"host.entrypoint": "offline", "host.api_server_per_request_s": 0.01},
     "host.api_server_per_request_s: has no effect with entrypoint: offline"),
    ({"compute.roofline.step_overhead_s": 0.1},
     "compute.roofline.step_overhead_s: only used with host.model constant"),
    ({"router.balance_threshold": 0}, "router.balance_threshold: only read by policy prefix_affinity"),
    ({"workload.request_rate": "inf", "workload.burstiness": 0.5},
     "workload.burstiness: has no effect when every request is sent at once"),
    ({"metrics.goodput": {"ttft": float("nan")}},
     "goodput.ttft: must be a positive, finite number of milliseconds"),
    ({"router.policy": "round_robin", "router.periodic_infra_update_time_s": 10},
     "periodic_infra_update_time_s: round_robin reads no load reports"),
    ({"router.policy": "cache_aware", "router.periodic_infra_update_time_s": 10},
     r"periodic_infra_update_time_s: cache_aware reads no load reports \(it counts its own"),
    ({"router.policy": "prefix_affinity", "router.cache_threshold": 0.5},
     "router.cache_threshold: only read by policy cache_aware, not prefix_affinity"),
    ({"router.balance_rel_threshold": 2.0},
     "router.balance_rel_threshold: only read by policy cache_aware, not round_robin"),
    ({"router.policy": "cache_aware", "router.balance_threshold": 4},
     "router.balance_threshold: only read by policy prefix_affinity, not cache_aware"),
])
def test_settings_that_would_have_no_effect_are_refused(changes, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(_config(**changes))
    # Where they are read they are taken.
    if changes.get("host.model") == "constant":
        parse_config(_config(**{**changes, "host.model": "vllm"}))


def test_a_gpu_peak_under_a_kernel_profile_is_refused_and_taken_by_the_roofline():
    with pytest.raises(ConfigError, match="hardware.bf16_flops: the A100-80GB kernel profile "
                                          "times the step's kernels as measured"):
        build_deployment(parse_config(_config(**{"hardware.bf16_flops": 156e12})))
    slow = build_deployment(parse_config(_config(**{"hardware.bf16_flops": 156e12,
                                                    "compute.kind": "roofline"})))
    assert slow.gpu.bf16_flops == 156e12


def test_mxfp4_weights_on_a_dense_model_are_refused():
    with pytest.raises(ConfigError, match="model.dtype: mxfp4 quantizes a mixture-of-experts "
                                          "model's experts"):
        build_deployment(parse_config(_config(**{"model.dtype": "mxfp4"})))


def test_a_negative_intermediate_size_is_refused():
    from dataclasses import replace

    from simcore.model.presets import load_preset

    with pytest.raises(ConfigError, match="intermediate_size must not be negative"):
        replace(load_preset("meta-llama/Llama-3.1-8B"), intermediate_size=-100_000)


def test_a_router_in_front_of_one_engine_is_said_to_have_no_effect():
    import simcore.simulate as sim

    one = sim.simulate(parse_config(_config(**{"router.policy": "prefix_affinity"})))
    assert any(a.startswith("router: one engine takes every request") and "prefix_affinity" in a
               for a in one["provenance"]["assumptions"])
    two = sim.simulate(parse_config(_config(**{"router.policy": "prefix_affinity",
                                               "parallelism.data_parallel_size": 2})))
    assert not any(a.startswith("router:") for a in two["provenance"]["assumptions"])
    plain = sim.simulate(parse_config(_config()))
    assert not any(a.startswith("router:") for a in plain["provenance"]["assumptions"])
