"""Capacity: the highest rate that meets the SLOs in steady state (`dse capacity`)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from dse.capacity import DEFAULT_SLOS, find_capacity, parse_slos
from dse.cli import main
from simcore.config import load_config
from simcore.errors import ConfigError
from simcore.saturation import load_trend
from simcore.simulate import simulate

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "tests" / "data" / "configs" / "tiny.yaml"
QUICKSTART = ROOT / "examples" / "quickstart.yaml"


# --- the steady-state test -------------------------------------------------------------------

def _poisson(rate: float, n: int, seed: int = 0) -> np.ndarray:
    return np.cumsum(np.random.default_rng(seed).exponential(1 / rate, n))


def test_trend_flat_when_service_keeps_up():
    a = _poisson(10, 2000)
    t = load_trend(a, a + 2.0)  # every request takes 2 s: about 20 in the system, flat
    assert not t.over_capacity
    assert abs(t.queue_growth_rps) < 0.3
    assert t.offered_request_rate == pytest.approx(10, rel=0.1)
    assert t.served_request_rate == pytest.approx(10, rel=0.1)


def test_trend_grows_at_offered_minus_served():
    a = _poisson(10, 2000)
    ends = np.arange(1, a.size + 1) / 7.0  # a server finishing 7 a second, in arrival order
    t = load_trend(a, np.maximum(ends, a))
    assert t.over_capacity
    assert t.queue_growth_rps == pytest.approx(3.0, rel=0.15)
    assert t.served_request_rate == pytest.approx(7.0, rel=0.05)


def test_trend_undefined_for_a_burst_or_a_handful():
    assert load_trend(np.zeros(500), np.linspace(1, 10, 500)) is None
    a = _poisson(10, 20)
    assert load_trend(a, a + 1) is None


def test_trend_of_a_very_high_rate_is_fitted_without_underflow():
    # Arrivals 1e-170 s apart: time squared underflows unless the fit is in units of the span.
    a = _poisson(10, 2000) * 1e-170
    t = load_trend(a, a + 2e-170)
    assert t is not None and not t.over_capacity
    assert t.offered_request_rate == pytest.approx(1e171, rel=0.1)


def test_every_rated_result_says_whether_it_kept_up():
    cfg = load_config(QUICKSTART)
    w = cfg.workload.model_copy(update={"num_prompts": 600})
    light = simulate(cfg.model_copy(update={"workload": w.model_copy(
        update={"request_rate": 4.0})}))
    heavy = simulate(cfg.model_copy(update={"workload": w.model_copy(
        update={"request_rate": 45.0})}))
    assert light["over_capacity"] is False and heavy["over_capacity"] is True
    assert heavy["queue_growth_rps"] > 10  # offered ~45, served ~19
    assert heavy["served_request_rate"] < 0.6 * heavy["offered_request_rate"]
    assert light["served_request_rate"] == pytest.approx(light["offered_request_rate"], rel=0.1)


# --- SLOs --------------------------------------------------------------------------------------

def test_default_slos_are_stated():
    assert [str(c) for c in parse_slos(None)] == ["p99_ttft_ms <= 1000", "p99_tpot_ms <= 50"]
    assert [str(c) for c in parse_slos(",".join(DEFAULT_SLOS))] == [
        str(c) for c in parse_slos("")]


@pytest.mark.parametrize("text, needle", [
    ("p99_ttft_ms>=1000", "upper bound"),
    ("output_throughput<=5", "not a latency statistic"),
    ("p99_ttft<=5", "not a latency statistic"),
    ("p99_ttft_ms<=0", "positive"),
    ("p99_ttft_ms<=10,p99_ttft_ms<=20", "bounded twice"),
    # These used to end in a traceback (float() of the text, numpy's percentile) or pass.
    ("p99_ttft_ms<=1..0", "positive, finite number of ms, got '1..0'"),
    ("p99_ttft_ms<=e", "positive, finite number of ms, got 'e'"),
    ("p99_ttft_ms<=1e400", "positive, finite number of ms, got '1e400'"),
    ("p150_ttft_ms<=1000", r"p150_ttft_ms: a percentile lies in \(0, 100\], got 150"),
    ("p0_ttft_ms<=1000", r"a percentile lies in \(0, 100\], got 0"),
])
def test_bad_slos_are_refused_by_name(text, needle):
    with pytest.raises(ConfigError, match=needle):
        parse_slos(text)


def test_rates_that_cannot_vary_are_refused():
    cfg = load_config(TINY)
    w = cfg.workload.model_copy(update={"request_rate": math.inf, "ramp_up_strategy": "linear",
                                        "ramp_up_start_rps": 1, "ramp_up_end_rps": 5})
    with pytest.raises(ConfigError, match="ramp_up_strategy"):
        find_capacity(cfg.model_copy(update={"workload": w}), envelope=False)


# --- the search --------------------------------------------------------------------------------

def _tiny_on_the_gpu():
    """The tiny config with the declared per-step CPU overhead only: its capacity is the GPU's,
    whatever the fitted API-server parameters."""
    from simcore.host import HostConfig

    cfg = load_config(TINY)
    return cfg.model_copy(update={"host": HostConfig(model="constant")})


@pytest.fixture(scope="module")
def tiny_capacity():
    cfg = _tiny_on_the_gpu()
    return cfg, find_capacity(cfg, parse_slos("p99_ttft_ms<=1000,p99_tpot_ms<=50"),
                              window_s=30, envelope=True)


def test_capacity_is_bracketed_by_a_meeting_and_a_failing_rate(tiny_capacity):
    _, c = tiny_capacity
    assert c.rate > 0 and c.at.meets
    failing = [r for r in c.runs if not r.meets and r.rate > c.rate]
    assert failing and min(r.rate for r in failing) <= c.rate * 1.05 + 1e-9
    assert c.below.rate == pytest.approx(0.9 * c.rate, rel=1e-4) and c.below.meets
    assert c.above.rate == pytest.approx(1.1 * c.rate, rel=1e-4) and not c.above.meets
    first_fail = min(failing, key=lambda r: r.rate)
    assert any(v.startswith(c.binding) for v in first_fail.violations)
    assert c.binding_detail.startswith(c.binding)
    assert c.notes == ()


def test_capacity_envelope_brackets_it(tiny_capacity):
    _, c = tiny_capacity
    e = c.envelope
    assert e["low"] < c.rate < e["high"]


def test_a_capacity_run_is_what_simulate_reports_at_that_rate(tiny_capacity):
    cfg, c = tiny_capacity
    run = c.at
    w = cfg.workload.model_copy(update={"request_rate": run.rate, "num_prompts": run.num_prompts})
    m = cfg.metrics.model_copy(update={"percentiles": (50, 99)})
    r = simulate(cfg.model_copy(update={"workload": w, "metrics": m}))
    assert r["p99_ttft_ms"] == run.values["p99_ttft_ms"]
    assert r["request_throughput"] == run.request_throughput


def test_an_unreachable_slo_gives_capacity_zero_with_the_reason():
    cfg = _tiny_on_the_gpu()
    c = find_capacity(cfg, parse_slos("p99_tpot_ms<=1"), window_s=30, envelope=False)
    assert c.rate == 0 and c.at is None
    assert c.binding == "p99_tpot_ms"
    assert "no rate meets" in c.notes[0]


# --- the command -------------------------------------------------------------------------------

def test_cli_capacity_writes_the_answer(tmp_path):
    out = tmp_path / "cap.json"
    res = CliRunner().invoke(main, ["capacity", str(TINY), "--window", "30", "--no-envelope",
                                    "--quiet", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert res.output.startswith("Capacity: ")
    d = json.loads(out.read_text())
    assert d["max_sustainable_rate"] > 0
    assert d["neighbours"]["below"]["meets"] and not d["neighbours"]["above"]["meets"]
    assert d["slos"] == ["p99_ttft_ms <= 1000", "p99_tpot_ms <= 50"]


def test_cli_capacity_bad_slo_is_one_clear_error():
    res = CliRunner().invoke(main, ["capacity", str(TINY), "--slo", "p99_ttft_ms>=5"])
    assert res.exit_code == 2
    assert "--slo" in res.output and "Traceback" not in res.output


@pytest.mark.slow
def test_quickstart_capacity_neighbours(tmp_path):
    out = tmp_path / "cap.json"
    res = CliRunner().invoke(main, ["capacity", str(QUICKSTART), "--no-envelope", "--quiet",
                                    "--out", str(out)])
    assert res.exit_code == 0, res.output
    d = json.loads(out.read_text())
    rate = d["max_sustainable_rate"]
    below, above = d["neighbours"]["below"], d["neighbours"]["above"]
    assert below["rate"] == pytest.approx(0.9 * rate, rel=1e-4) and below["meets"]
    assert above["rate"] == pytest.approx(1.1 * rate, rel=1e-4) and not above["meets"]


def test_a_trial_can_maximise_the_sustainable_rate():
    import yaml

    from dse.evaluate import EvalSpec, evaluate, metric_names
    from dse.study import Objective

    base = yaml.safe_load(TINY.read_text())
    base["host"] = {"model": "constant"}
    slo = parse_slos("p99_ttft_ms<=800")
    spec = EvalSpec(objectives=(Objective(metric="max_sustainable_rate_per_gpu",
                                          direction="maximize"),),
                    constraints=slo)
    assert spec.wants_capacity
    assert "max_sustainable_rate" in metric_names(base, {})
    out = evaluate(base, {}, {}, spec)
    assert out.status == "complete", out.reason
    expected = find_capacity(_tiny_on_the_gpu(), slo, envelope=False).rate
    assert out.values == (expected,)  # one GPU
    assert out.metrics["max_sustainable_requests_per_dollar"] == pytest.approx(
        expected * 3600 / 2.5)


def test_decimal_percentile_slos_and_the_goodput_thresholds_they_give():
    from dse.capacity import goodput_thresholds

    slos = parse_slos("p99.9_ttft_ms<=1000,median_tpot_ms<=30,p95_ttft_ms<=300,"
                      "p99_itl_ms<=200,mean_e2el_ms<=9000,p90_e2el_ms<=8000")
    assert [c.metric for c in slos][0] == "p99.9_ttft_ms"
    # Percentile bounds on TTFT, TPOT or E2E hold each request (the tightest where several do);
    # a median or mean bound, or one on the ITL, does not.
    assert goodput_thresholds(slos) == {"ttft": 300.0, "e2el": 8000.0}
    assert goodput_thresholds(parse_slos("p99_itl_ms<=200,median_tpot_ms<=30")) == {}


def test_goodput_is_stated_as_not_applicable_where_the_slos_give_no_threshold(tiny_capacity):
    import dataclasses

    from dse.capacity import render_capacity

    _, c = tiny_capacity
    assert c.at.request_goodput is not None
    assert f"goodput {c.at.request_goodput:,.4g} req/s" in render_capacity(c)
    none = dataclasses.replace(c, at=dataclasses.replace(c.at, request_goodput=None))
    assert "goodput n/a (no percentile SLO on TTFT, TPOT or E2E latency" in render_capacity(none)
    assert none.as_dict()["goodput_at_capacity"] is None


def test_a_queue_behind_the_clients_concurrency_cap_is_named_as_such(tiny_capacity):
    import dataclasses

    from dse.capacity import _binding, _client_cap

    assert _client_cap({"max_concurrency": 16, "max_concurrent_requests": 16}) == 16
    assert _client_cap({"max_concurrency": 16, "max_concurrent_requests": 9}) is None
    assert _client_cap({"max_concurrency": None, "max_concurrent_requests": 90}) is None
    _, c = tiny_capacity
    over = dataclasses.replace(c.at, over_capacity=True, queue_growth_rps=0.5, violations=())
    slos = parse_slos("p99_ttft_ms<=1e9")
    assert _binding(over, slos)[0] == "queue_growth"
    assert "the engine cannot keep up" in _binding(over, slos)[1]
    capped = dataclasses.replace(over, client_cap=16)
    name, detail = _binding(capped, slos)
    assert name == "max_concurrency"
    assert "behind the client's max_concurrency of 16 in flight" in detail
