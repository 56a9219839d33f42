"""`dse calibrate --host`: this CPU's host speed from the reference Python workloads."""

from __future__ import annotations

import math

from click.testing import CliRunner

from dse.cli import main
from dse.host_speed import SCALED_BY, WORKLOADS, HostSpeed, measure, python_reference
from simcore.host import DEFAULT_CPU_COSTS, reference_times


def _times(scale: float) -> dict[str, float]:
    """The measuring CPU's reference times, each x `scale`."""
    ref = reference_times(DEFAULT_CPU_COSTS)
    return {key: ref[key] * scale for key, _, _, _ in WORKLOADS}


def test_host_speed_is_the_method_call_ratio_the_simulator_scales_by():
    here = _times(0.5)
    here["sum_range_1e6_s"] *= 3           # another workload's ratio does not decide it
    hs = measure(here=here)
    assert math.isclose(hs.host_speed, 0.5)
    assert math.isclose(hs.ratio("sum_range_1e6_s"), 1.5)
    text = hs.render()
    assert text.startswith("host speed of this CPU: 0.5 (host.host_speed)")
    assert "Set host: {host_speed: 0.5}" in text
    assert "(what the simulator scales measured costs by)" in text
    assert text.count(" here, ") == len(WORKLOADS)


def _speed(loadavg, cores, scale=0.5) -> HostSpeed:
    return HostSpeed(_times(scale), _times(1.0), DEFAULT_CPU_COSTS, "its CPU", "this CPU",
                     "3.11", loadavg, cores)


def test_a_busy_machine_is_said_and_an_unusable_figure_refused():
    assert not _speed((0.2, 0.1, 0.1), 2).busy and _speed((0.7, 0.5, 0.5), 2).busy
    busy = _speed((1.5, 1.0, 1.0), 2)
    assert busy.busy and "the machine was busy (load average 1.50 on 2 cores)" in busy.render()
    assert not _speed(None, None).busy
    text = _speed((0.1,), 2, scale=500.0).render()
    assert "outside host.host_speed's range" in text and "Set host" not in text


def test_the_workloads_are_timed_here():
    t = python_reference(repeat=1)
    assert set(t) == {key for key, _, _, _ in WORKLOADS}
    assert all(0 < v < 1 for v in t.values()) and SCALED_BY in t


def test_cli_prints_the_host_speed_and_refuses_other_options():
    r = CliRunner().invoke(main, ["calibrate", "--host"])
    assert r.exit_code == 0, r.output
    first = r.output.splitlines()[0]
    assert first.startswith("host speed of this CPU: ")
    assert float(first.split(": ")[1].split()[0]) > 0
    r = CliRunner().invoke(main, ["calibrate", "--host", "--list"])
    assert r.exit_code == 2 and "--host measures this CPU and takes nothing else (got --list)" \
        in r.output
    r = CliRunner().invoke(main, ["calibrate", "--host", "x.csv"])
    assert r.exit_code == 2 and "(got measurement files)" in r.output


def test_the_workloads_are_those_the_measurements_recorded():
    """The workloads are a copy of the recording script's, which the project cannot import at
    run time (scripts/ is not installed): same statements, setup and runs per timing."""
    import ast
    from pathlib import Path

    from dse.host_speed import SETUP

    text = (Path(__file__).resolve().parents[1]
            / "scripts/vllm_cpu_costs/pyref.py").read_text(encoding="utf-8")
    for key, stmt, runs, _ in WORKLOADS:
        assert f'res["{key}"]' in text
        assert f'"{stmt}"' in text and f"number={runs}" in text
    setup = next(node.value for node in ast.walk(ast.parse(text))
                 if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "setup")
    assert ast.literal_eval(setup) == SETUP
