"""Running a step DAG on the clock: compute ops for their modelled durations, NVLink transfers by
formula, fabric transfers through a fabric backend, and the step ending when the DAG does.

Every node starts when its dependencies (data and stream order) have finished. Nodes whose
durations are known (compute, collectives inside a node, NVLink transfers) are resolved at once;
a fabric transfer is handed to the fabric to start at its computed time and resolves when the
fabric reports its last byte delivered, which may release further nodes. So the executor costs a
few operations per node and waits only where the network decides.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from simcore.dag.exposure import compiled_walk
from simcore.dag.graph import TRANSFER, StepDag


class TransferPort(Protocol):
    """Where the executor sends transfers: NVLink inside a node, the fabric across nodes."""

    def node_of(self, gpu: int) -> int: ...

    def nvlink_s(self, size_bytes: int) -> float:
        """Duration of an NVLink transfer of `size_bytes` (latency excluded)."""
        ...

    def send(self, src_gpu: int, dst_gpu: int, size_bytes: int, at_s: float,
             on_done: Callable[[Any, float, float], None], arg: Any,
             channel: str = "") -> None:
        """Start a fabric transfer at `at_s`; `on_done(arg, end_s, ideal_s)` fires when it
        arrives. Transfers of one `channel` (the op) between two GPUs share a queue pair."""
        ...


class DagRun:
    """One execution of a StepDag from `t0_s`.

    Lifecycle: `start()` resolves every node it can and sends fabric transfers; each fabric
    completion (through the port's callback) resolves more; when the last node resolves,
    `on_complete(run)` is called once and `end_s` is the step's GPU completion time. Afterwards
    `exposure()` splits each lane's idle compute-stream time by cause.
    """

    __slots__ = ("dag", "t0_s", "port", "on_complete", "start_s", "finish_s", "ideal_s",
                 "cause", "end_s", "done", "lane_comm_s", "_remaining", "_children", "_ready",
                 "_unresolved", "_fields")

    def __init__(self, dag: StepDag, t0_s: float, port: TransferPort,
                 on_complete: Callable[[DagRun], None] | None = None) -> None:
        self.dag = dag
        self.t0_s = t0_s
        self.port = port
        self.on_complete = on_complete
        self.end_s = t0_s
        self.done = False
        self.lane_comm_s: list[float] = []
        self._begin()

    def _begin(self) -> None:
        """The node times and the executor's state before the start, as lists."""
        dag, t0_s = self.dag, self.t0_s
        n = len(dag)
        self.start_s = [t0_s] * n
        self.finish_s = [0.0] * n
        self.ideal_s = [0.0] * n              # fabric transfers: alone on an idle network
        self.cause = [-1] * n                 # the dependency that finished last
        self._ready = [t0_s] * n
        self._remaining = list(dag.num_inputs)
        self._children = dag.children
        self._unresolved = n
        # The node fields `_drain` reads, fetched once (it runs once per fabric arrival).
        self._fields = (dag.kind, dag.latency_s, dag.size_bytes, dag.src, dag.dst, dag.dur_s,
                        dag.op)

    def start(self) -> None:
        ready = [i for i, count in enumerate(self._remaining) if count == 0]
        self._drain(ready)
        if self._unresolved == 0:
            self._complete()

    def _drain(self, stack: list[int]) -> None:
        """Resolve `stack` and everything it releases (depth-first)."""
        kind, latency_s, size_bytes, src_of, dst_of, dur_s, op = self._fields
        port = self.port
        node_of = port.node_of
        start_s, ready = self.start_s, self._ready
        finish_s, remaining, cause, children = (self.finish_s, self._remaining, self.cause,
                                                self._children)
        pop, push = stack.pop, stack.append
        # Bound here, not kept on the run: a run holding its own bound method is a reference
        # cycle, left for the garbage collector with the whole DAG.
        on_transfer = self._transfer_done
        while stack:
            i = pop()
            t = ready[i]
            if kind[i] == TRANSFER:
                t += latency_s[i]
                start_s[i] = t
                size = size_bytes[i]
                src, dst = src_of[i], dst_of[i]
                if size > 0 and node_of(src) != node_of(dst):
                    port.send(src, dst, size, t, on_transfer, i, op[i])
                    continue
                end = t + port.nvlink_s(size, src) if size > 0 else t
            else:
                start_s[i] = t
                end = t + dur_s[i]
            # Node i has finished: release the nodes that now have all their inputs (as
            # `_release`, inlined: this runs for every node).
            finish_s[i] = end
            self._unresolved -= 1
            for c in children[i]:
                if end >= ready[c]:
                    ready[c] = end
                    cause[c] = i
                remaining[c] -= 1
                if remaining[c] == 0:
                    push(c)

    def _release(self, i: int, end_s: float, stack: list[int]) -> None:
        """Node i finished at end_s: push the nodes that now have all their inputs."""
        self.finish_s[i] = end_s
        self._unresolved -= 1
        ready, remaining, cause = self._ready, self._remaining, self.cause
        for c in self._children[i]:
            if end_s >= ready[c]:
                ready[c] = end_s
                cause[c] = i
            remaining[c] -= 1
            if remaining[c] == 0:
                stack.append(c)

    def _transfer_done(self, i: int, end_s: float, ideal_s: float) -> None:
        """Fabric transfer i has arrived (the port's callback)."""
        self.ideal_s[i] = ideal_s
        stack: list[int] = []
        self._release(i, end_s, stack)
        if stack:
            self._drain(stack)
        if self._unresolved == 0:
            self._complete()

    def _complete(self) -> None:
        self.end_s = max(max(self.finish_s, default=self.t0_s), self.t0_s)
        self.done = True
        if self.on_complete is not None:
            self.on_complete(self)

    # -- what the step spent its time on -------------------------------------------------------

    def exposure(self) -> tuple[list[float], dict[str, float], float]:
        """Per lane compute-busy seconds; lane-seconds of compute-stream idle or communication by
        cause; and the congestion share of the fabric part (actual minus ideal transfer time).

        Causes: "<op>/nvlink" or "<op>/fabric" (a collective or transfer of kind op, inside a
        node or across nodes, that the stream waited for or ran), "pipeline" (waiting for another
        pipeline stage), "sync" (waiting for another lane of the same stage: a slower rank), in
        the order the walk first meets them. Lane-seconds: multiply by the lane's GPU count for
        GPU-seconds. Also sets `lane_comm_s`: each lane's communication-induced stall (the
        "/nvlink" and "/fabric" causes), the time its compute stream spent on or waiting for
        communication. The walk over the compute-stream nodes is `simcore.dag.exposure.walk`,
        compiled.
        """
        dag = self.dag
        cols = dag.exposure_columns()
        stage = [x.stage for x in dag.lanes]
        busy, comm, by_cause, order, congestion = compiled_walk()(
            cols.compute_nodes, cols.kind, cols.lane, cols.cause_of, cols.fabric,
            np.array(dag.dur_s, dtype=float), np.array(self.cause, dtype=np.int64),
            np.array(self.start_s, dtype=float), np.array(self.finish_s, dtype=float),
            np.array(self.ideal_s, dtype=float), np.array(stage, dtype=np.int64),
            float(self.t0_s), float(self.end_s), len(set(stage)) > 1, len(cols.names))
        self.lane_comm_s = comm.tolist()
        seconds = by_cause.tolist()
        names = cols.names
        return busy.tolist(), {names[k]: seconds[k] for k in order.tolist()}, float(congestion)
