"""Decode-only steps timed from numbers: the one source of `RooflineModel.decode_timer` (a step at
a time, in Python) and of a quiet run's timing (its steps at once, compiled).

A decode step of `num` sequences reading `kv` KV tokens in all costs, as `RooflineModel._step_time`
assembles it: the parts that depend on the batch size alone (linear layers, elementwise passes, LM
head, sampler, collectives, the CPU side), worked out once per batch size into the constants `c`,
plus the attention at `kv`: the profile's generation-attention grid along its length axis at the
batch size (`LogGrid.along`, its two-axis reading unrolled here), or the roofline's formula.

`decode_step` is plain Python over indexable numbers, and so is `decode_steps`, a quiet run's loop
over it, whose columns the run keeps as `StepColumns`; `compiled_steps()` is that loop compiled
by numba, where a long run asks for it (the engine's compiled kernels,
`SchedulerConfig.compiled`). Compiled, the same operations run in the
same order on the same doubles (numba's log and exp are the C library's, as Python's are), so the
steps' times are the same to the bit (`tests/test_roofline.py` holds both to `_step_time`).
"""

from __future__ import annotations

import numpy as np

from simcore.calibration import grid
from simcore.calibration.grid import along_at
from simcore.compute.base import StepTime
from simcore.host import step_period

COMPUTE, MEMORY, COMMUNICATION = 0, 1, 2
BOUNDS = ("compute", "memory", "communication")


def bound_of(compute_bound, memory_bound, comm):
    """What a step's time is bound by (an index into `BOUNDS`): the largest of its three sums,
    compute on ties with memory."""
    if comm > compute_bound and comm > memory_bound:
        return COMMUNICATION
    return COMPUTE if compute_bound >= memory_bound else MEMORY


def decode_step_time(total, compute, comm, bound) -> StepTime:
    """The StepTime of a decode step `decode_step` timed: the CPU side the rest of its total,
    no all-to-all."""
    return StepTime(total, compute, comm, BOUNDS[bound], total - (compute + comm), 0.0)


class StepColumns:
    """A run's step times as columns, numpy arrays (total, compute and communication seconds,
    bound as an index into `BOUNDS`), read as a sequence of `StepTime`: what `decode_steps`
    gives a quiet run (`simcore.serve.quiet.QuietLeap._timed`), which observers that sum a run's
    steps read column by column (`simcore.serve.observers.sum_steps`)."""

    __slots__ = ("total", "compute", "comm", "bound")

    def __init__(self, total, compute, comm, bound) -> None:
        self.total = np.asarray(total, dtype=np.float64)
        self.compute = np.asarray(compute, dtype=np.float64)
        self.comm = np.asarray(comm, dtype=np.float64)
        self.bound = np.asarray(bound, dtype=np.int64)

    @classmethod
    def of(cls, total, compute, comm, bound) -> StepColumns:
        """Columns that are already float64 arrays (int64 for `bound`), taken as they are."""
        cols = cls.__new__(cls)
        cols.total, cols.compute, cols.comm, cols.bound = total, compute, comm, bound
        return cols

    def __len__(self) -> int:
        return len(self.total)

    def __getitem__(self, i: int) -> StepTime:
        return decode_step_time(float(self.total[i]), float(self.compute[i]),
                                float(self.comm[i]), int(self.bound[i]))

    def __iter__(self):
        return (self[i] for i in range(len(self.total)))

    def __delitem__(self, index: slice) -> None:
        columns = (self.total, self.compute, self.comm, self.bound)
        if index.stop is None and index.step is None and (index.start or 0) >= 0:
            # The steps from one on (how a plan cuts a run): the first ones kept as views.
            kept = (column[:index.start or 0] for column in columns)
        else:
            kept = (np.delete(column, index) for column in columns)
        self.total, self.compute, self.comm, self.bound = kept


def decode_step(c, flat, ax1, g, kv):
    """(total, compute, communication seconds, bound) of the decode step reading `kv` KV tokens
    of the batch size whose constants are `c` (`RooflineModel.decode_params`, in this order: the
    linear layers' compute- and memory-bound seconds, the speculative query-key pairs, the
    roofline attention's seconds per pair, per KV token and per token and its floor, the
    compute-bound scale, elementwise seconds, LM head seconds, sampler seconds, collectives,
    the eager launch time, the host's engine, API server and model-runner seconds, the
    declared per-step overhead, the measured attention's factor, the batch size, and the flags
    (0.0 or 1.0): attention measured, LM head compute-bound, full CUDA graph, host model, async
    scheduling)."""
    (lin_c, lin_m, spec, fpp, bpk, tok_m, floor, scale, ew, lm, smp, comm, eager, engine,
     frontend, runner, overhead, fa, batch, has_attn, lm_compute, full_graph, host,
     is_async) = c
    compute_bound = lin_c
    memory_bound = lin_m
    fc = (float(kv) + spec) * fpp
    m = kv * bpk + tok_m
    if has_attn != 0.0:
        x = fa * along_at(flat, ax1, g, kv / batch)
        if fc >= m:
            compute_bound += x * scale
        else:
            memory_bound += x
    elif fc >= m and fc >= floor:
        compute_bound += fc * scale
    else:
        memory_bound += m if m > floor else floor
    memory_bound += ew
    if lm_compute != 0.0:
        compute_bound += lm
    else:
        memory_bound += lm
    memory_bound += smp
    compute = compute_bound + memory_bound
    gpu = compute + comm
    busy = gpu if full_graph != 0.0 or gpu >= eager else eager
    if host != 0.0:
        total = step_period(busy, engine, frontend, runner, is_async != 0.0)
    else:
        total = busy + overhead
    return total, compute, comm, bound_of(compute_bound, memory_bound, comm)


def decode_steps(c, flat, ax1, g, kv0, num, steps, t0, limit, total, compute, comm, bound,
                 ends):
    """Time up to `steps` decode steps of `num` sequences from `t0`, the first reading `kv0` KV
    tokens, each next one `num` more, into `total`, `compute`, `comm`, `bound` and their end
    times `ends`, until one ends at or after `limit`: how many end before it (that one, if any,
    is timed at their index)."""
    t = t0
    kv = kv0
    for j in range(steps):
        a, b, d, e = decode_step(c, flat, ax1, g, kv)
        total[j] = a
        compute[j] = b
        comm[j] = d
        bound[j] = e
        t = t + a
        ends[j] = t
        if not t < limit:
            return j
        kv += num
    return steps


_compiled = None


def compiled_steps():
    """`decode_steps` compiled by numba (cached on disk), with the functions it calls
    (`decode_step`, the grid's `along_at`, `corners` and `slope`), made on first use so that
    short runs never import numba; `decode_steps` itself where numba is not installed. The
    Python functions stay as they are (`decode_timer` calls them): the compiled ones are copies
    whose calls resolve to each other."""
    global _compiled
    if _compiled is None:
        from simcore.compiled import compile_family
        _compiled = compile_family([grid.corners, grid.slope, grid.along_at,
                                    step_period, bound_of, decode_step,
                                    decode_steps])[-1]
    return _compiled
