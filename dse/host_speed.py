"""`dse calibrate --host`: the host speed (`host.host_speed`) of the CPU this command runs on.

The simulator scales vLLM's CPU costs, measured on one CPU (`simcore/data/cpu_costs/`), to the
deployment's host by a declared host speed: the host's CPU time per second of the measuring
CPU's. The measurements carry the times of fixed pure-Python workloads taken on the measuring
CPU (`scripts/vllm_cpu_costs/pyref.py`), and the simulator takes a measurement made on another
CPU to the measuring one by the ratio of their method-call times (interpreted object code, as
vLLM's serving code is). This module times the same workloads here, so that a planner can run it
on a machine with the serving host's CPU (or on the host itself) and set what it prints in
place of the declared 0.4, which is the largest CPU-side unknown of a run: hosts that differ
2-3x in it are common, and where the API server or the scheduler limits a run its results move
with it.

The figure is a ratio of CPU times of single-threaded Python, so it does not depend on the
wall clock of anything simulated; it depends on the interpreter that runs it (vLLM's server runs
under its own) and on other work on the machine (the load average is printed beside it).
"""

from __future__ import annotations

import os
import platform
import timeit
from dataclasses import dataclass

from simcore.host import DEFAULT_CPU_COSTS, measuring_cpu, reference_times

WORKLOADS = (
    ("sum_range_1e6_s", "sum(range(10**6))", 5, "sum(range(10**6))"),
    ("method_calls_1e3_s", "for i in range(1000): a.f(i)", 200, "1,000 method calls"),
    ("dict_update_1e3_s", "for k in d: d[k] += 1", 200, "1,000 dict updates"),
)
"""(key, statement, runs per timing, label) of the reference workloads: those the CPU-cost
measurements recorded (`scripts/vllm_cpu_costs/pyref.py`), each the best of 5 timings of
`runs` runs, per run."""

SETUP = ("class A:\n def __init__(s): s.x = 0\n def f(s, y):\n  s.x += y\n  return s.x\n"
         "a = A(); d = {i: i for i in range(1000)}")

SCALED_BY = "method_calls_1e3_s"
"""The workload whose time ratio the simulator scales measured CPU costs by
(`simcore.host._on_cpu_of`)."""

HOST_SPEED_RANGE = (1e-3, 100.0)
"""`host.host_speed`'s allowed range (`simcore.host.HostConfig`)."""


def python_reference(repeat: int = 5) -> dict[str, float]:
    """The reference workloads' times here, s per run (best of `repeat` timings)."""
    return {key: min(timeit.repeat(stmt, SETUP, number=runs, repeat=repeat)) / runs
            for key, stmt, runs, _ in WORKLOADS}


def reference_of(cpu_costs: str = DEFAULT_CPU_COSTS) -> tuple[dict, str]:
    """(the measuring CPU's reference times, its description) of the shipped CPU-cost
    measurement `cpu_costs`: the times taken at the start of its run."""
    cpu = measuring_cpu(cpu_costs)
    what = ", ".join(str(x) for x in (cpu.get("model"), f"{cpu['cores']} cores"
                                      if cpu.get("cores") else None) if x)
    return reference_times(cpu_costs), what or "not recorded"


@dataclass(frozen=True)
class HostSpeed:
    """The reference workloads' times here and on the measuring CPU, and what they give."""

    here: dict[str, float]
    there: dict[str, float]
    cpu_costs: str
    measuring_cpu: str
    this_cpu: str
    python: str
    loadavg: tuple[float, ...] | None
    cores: int | None

    def ratio(self, key: str) -> float:
        """This CPU's time of workload `key` per second of the measuring CPU's."""
        return self.here[key] / self.there[key]

    @property
    def host_speed(self) -> float:
        """The host speed the simulator would take for this CPU: the method-call ratio."""
        return self.ratio(SCALED_BY)

    @property
    def busy(self) -> bool:
        """Whether other work loaded the machine while it was measured (a one-minute load
        average over a quarter of its cores: a busy core's share shows in the times within
        minutes of it)."""
        return bool(self.loadavg and self.cores and self.loadavg[0] > 0.25 * self.cores)

    def render(self) -> str:
        speed = self.host_speed
        lines = [f"host speed of this CPU: {speed:.3g} (host.host_speed)",
                 f"  this CPU: {self.this_cpu}, Python {self.python}"
                 + (f"; load average {self.loadavg[0]:.2f} when measured"
                    if self.loadavg else ""),
                 f"  the CPU that measured vLLM's CPU costs ({self.cpu_costs}): "
                 f"{self.measuring_cpu}"]
        for key, _, _, label in WORKLOADS:
            here, there = self.here[key], self.there[key]
            unit, scale = ("ms", 1e3) if there >= 1e-3 else ("us", 1e6)
            note = " (what the simulator scales measured costs by)" if key == SCALED_BY else ""
            lines.append(f"  {label}: {here * scale:.1f} {unit} here, {there * scale:.1f} "
                         f"{unit} there: {self.ratio(key):.3g}{note}")
        low, high = HOST_SPEED_RANGE
        if not low <= speed <= high:
            lines.append(f"{speed:.3g} is outside host.host_speed's range, {low:g} to "
                         f"{high:g}: the measurement is not usable as it is")
            return "\n".join(lines)
        if self.busy:
            lines.append(f"the machine was busy (load average {self.loadavg[0]:.2f} on "
                         f"{self.cores} cores): the figure is likely too high; measure again "
                         "when it is idle")
        lines.append(f"Set host: {{host_speed: {speed:.3g}}} to simulate a server with this "
                     "CPU, as fast as this Python (vLLM's server runs under its own). The "
                     "default, 0.4, is declared: a current server core about 2.5x as fast as "
                     "the measuring CPU.")
        return "\n".join(lines)


def _cpu_name() -> str:
    """This CPU's model name (from /proc/cpuinfo where there is one) and core count."""
    name = None
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    name = name or platform.processor() or platform.machine() or "unknown CPU"
    cores = os.cpu_count()
    return f"{name}, {cores} cores" if cores else name


def measure(cpu_costs: str = DEFAULT_CPU_COSTS, here: dict[str, float] | None = None
            ) -> HostSpeed:
    """Time the reference workloads here (or take `here`, already timed) against the measuring
    CPU of `cpu_costs`."""
    there, measuring = reference_of(cpu_costs)
    try:
        load = tuple(float(x) for x in os.getloadavg())
    except (AttributeError, OSError):
        load = None
    return HostSpeed(here if here is not None else python_reference(), there, cpu_costs,
                     measuring, _cpu_name(), platform.python_version(), load, os.cpu_count())
