"""Why a step's compute streams waited, as one compiled pass over the DAG's columns.

`DagRun.exposure` splits each lane's idle compute-stream time by cause, walking the
compute-stream nodes in order and, for each wait, the chain of last-finishing dependencies back
to the compute op that fed it. Every cluster step runs it (some 150 nodes a step for an
expert-parallel group of 16 lanes), so `walk` runs compiled by numba over the run's times as
arrays; without numba the same source runs as Python, to the same bit. Causes are numbered
(`SYNC`, `PIPELINE`, then each op and medium of the DAG) and come back with the order in which
the walk first met them.
"""

from __future__ import annotations

import numpy as np

from simcore.dag.graph import COMPUTE, COMPUTE_STREAM, LOCAL, TRANSFER, StepDag

SYNC = 0
PIPELINE = 1
CAUSE_BASE = 2
"""Cause numbers: 0 "sync", 1 "pipeline", then 2 + 2 x (the op's index) + (1 on the fabric, 0
over NVLink)."""


class ExposureColumns:
    """A DAG structure's columns for the walk, made once per structure (adopted DAGs share
    their template's): kinds, lanes, cause numbers and the compute-stream nodes in order."""

    __slots__ = ("num_nodes", "kind", "lane", "cause_of", "fabric", "compute_nodes", "names")

    def __init__(self, dag: StepDag) -> None:
        self.num_nodes = len(dag.kind)
        ops: dict[str, int] = {}
        for op in dag.op:
            ops.setdefault(op, len(ops))
        self.names = ["sync", "pipeline"]
        for op in ops:
            self.names += [op + "/nvlink", op + "/fabric"]
        self.kind = np.array(dag.kind, dtype=np.int64)
        self.lane = np.array(dag.lane, dtype=np.int64)
        self.cause_of = np.array([CAUSE_BASE + 2 * ops[op] + (1 if f else 0)
                                  for op, f in zip(dag.op, dag.fabric)], dtype=np.int64)
        self.fabric = np.array(dag.fabric, dtype=np.bool_)
        self.compute_nodes = np.array([i for i, s in enumerate(dag.stream)
                                       if s == COMPUTE_STREAM], dtype=np.int64)


def walk(compute_nodes, kind, lane_of, cause_of, fabric_of, dur_s, cause, start, finish, ideal,
         stage, t0_s, end_s, multi_stage, num_causes):
    """(compute-busy seconds by lane, communication-induced stall by lane, seconds by cause
    number, cause numbers in the order first met, congestion seconds) of the run whose node
    times are `start`, `finish`, `cause` (the dependency that finished last) and `ideal` (a
    fabric transfer alone on an idle network), over `compute_nodes` (the compute-stream nodes
    in order); `DagRun.exposure` reads them."""
    num_lanes = len(stage)
    busy = np.zeros(num_lanes)
    comm = np.zeros(num_lanes)
    last = np.full(num_lanes, t0_s)
    by_cause = np.zeros(num_causes)
    seen = np.zeros(num_causes, dtype=np.bool_)
    order = np.zeros(num_causes, dtype=np.int64)
    num_seen = np.zeros(1, dtype=np.int64)      # an array: the inner function counts in it
    congestion = 0.0

    def met(key):
        # Cause `key` is added to: note the order causes are first met in.
        if not seen[key]:
            seen[key] = True
            order[num_seen[0]] = key
            num_seen[0] += 1

    for idx in range(len(compute_nodes)):
        i = compute_nodes[idx]
        ln = lane_of[i]
        since = last[ln]
        gap = start[i] - since
        if gap > 1e-15:
            # Why node i started late: the cause (key), the part of the gap it accounts for,
            # the cause of the rest (wait_key) and, for a wait on the fabric, the congestion
            # delay (extra). A wait on communication is split at the chain's origin: the chain
            # of last-finishing dependencies runs back through transfers and collectives to the
            # compute op that fed them; the gap up to that op's end is waiting for it
            # ("pipeline" if it is another stage's, "sync" if a slower lane's), the rest is
            # communication. The congestion delay is the excess over ideal of every fabric
            # transfer on that chain (the transfer that finishes last is often not the
            # congested one: a ring's last step, a hierarchical collective's NVLink all-gather).
            c = cause[i]
            # A zero-length wait node stands for what it waited on.
            while c >= 0 and kind[c] == LOCAL and dur_s[c] == 0.0 and cause[c] >= 0:
                c = cause[c]
            if c < 0 or kind[c] == COMPUTE:
                key = PIPELINE if c >= 0 and stage[lane_of[c]] != stage[ln] else SYNC
                met(key)
                by_cause[key] += gap
            else:
                on_fabric = fabric_of[c]
                key = cause_of[c]
                extra = 0.0
                origin = since
                wait_key = SYNC
                j = c
                while j >= 0 and finish[j] > since:
                    if kind[j] == COMPUTE:
                        origin = since if since >= finish[j] else finish[j]
                        wait_key = PIPELINE if stage[lane_of[j]] != stage[ln] else SYNC
                        break
                    if on_fabric and kind[j] == TRANSFER and ideal[j] > 0:
                        excess = (finish[j] - start[j]) - ideal[j]
                        if excess > 0.0:
                            extra += excess
                    j = cause[j]
                part = start[i] - origin         # min(gap, max(0.0, part)), as Python's
                if not part > 0.0:
                    part = 0.0
                if not part < gap:
                    part = gap
                if part < gap:
                    met(wait_key)
                    # (sum + gap) - part: the order the figures were first defined in
                    by_cause[wait_key] = by_cause[wait_key] + gap - part
                if part > 0:
                    met(key)
                    by_cause[key] += part
                    congestion += extra if extra < part else part
                    comm[ln] += part
        dur = finish[i] - start[i]
        if kind[i] == COMPUTE:
            busy[ln] += dur
        elif dur > 0:
            key = cause_of[i]
            met(key)
            by_cause[key] += dur
            comm[ln] += dur
        if finish[i] > last[ln]:
            last[ln] = finish[i]
    tail_key = PIPELINE if multi_stage else SYNC
    for ln in range(num_lanes):
        tail = end_s - last[ln]
        if tail > 1e-15:
            met(tail_key)
            by_cause[tail_key] += tail
    return busy, comm, by_cause, order[:num_seen[0]], congestion


_compiled = None


def compiled_walk():
    """`walk` compiled by numba (cached on disk), made on first use so that runs without a
    cluster never import numba; `walk` itself where numba is not installed."""
    global _compiled
    if _compiled is None:
        from simcore.compiled import compile_kernel
        _compiled = compile_kernel(walk)
    return _compiled
