"""A fixed pure-Python workload timed on the measuring CPU, recorded with every CPU-cost
measurement so that its costs can be scaled to another CPU (the simulator scales by the ratio of
these times) and contention shows (taken at the start and at the end of a run). `dse calibrate
--host` times the same workloads (`dse/host_speed.py`, a copy that a test holds equal) to measure
a deployment host's speed against the measuring CPU."""

import os


def python_reference():
    """Fixed pure-Python workloads (best of 5), to scale these costs to another CPU and to see
    contention: the same numbers taken at the start and at the end of the run."""
    import timeit
    res = {}
    res["sum_range_1e6_s"] = min(timeit.repeat("sum(range(10**6))", number=5, repeat=5)) / 5
    setup = ("class A:\n def __init__(s): s.x = 0\n def f(s, y):\n  s.x += y\n  return s.x\n"
             "a = A(); d = {i: i for i in range(1000)}")
    res["method_calls_1e3_s"] = min(timeit.repeat("for i in range(1000): a.f(i)", setup,
                                                  number=200, repeat=5)) / 200
    res["dict_update_1e3_s"] = min(timeit.repeat("for k in d: d[k] += 1", setup,
                                                 number=200, repeat=5)) / 200
    res["loadavg"] = open("/proc/loadavg").read().split()[:3] if os.path.exists("/proc/loadavg") \
        else None
    return res
