"""A step DAG run as a job of `simcore.fabric.analytical_compiled.CompiledAnalyticalFabric`:
`CompiledDagRun` (the executor the cluster runtime takes with that fabric) and the columns of a
DAG structure it hands over (`JobColumns`)."""

from __future__ import annotations

import itertools

import numpy as np

from simcore.dag.executor import DagRun
from simcore.dag.graph import TRANSFER, StepDag
from simcore.fabric import analytical_kernels as K
from simcore.fabric.analytical_compiled import CompiledAnalyticalFabric


class JobColumns:
    """A step DAG structure's columns for the jobs' arrays, made once per structure (adopted
    DAGs share their template's): kinds, inputs, children (numbered within the DAG), its
    transfers with their senders' interconnect, and those across nodes with their queue pairs'
    routes once known."""

    __slots__ = ("num_nodes", "kind", "num_inputs", "child_off", "num_children", "children",
                 "transfer", "ic", "fabric_nodes", "routes", "fabric", "_dag")

    def __init__(self, dag: StepDag, fabric: CompiledAnalyticalFabric, gpu_node: np.ndarray,
                 gpu_ic: np.ndarray, routed: dict) -> None:
        n = self.num_nodes = len(dag.kind)
        self.kind = np.array(dag.kind, dtype=np.int64)
        self.num_inputs = np.array(dag.num_inputs, dtype=np.int64)
        self.num_children = np.fromiter(map(len, dag.children), dtype=np.int64, count=n)
        self.child_off = np.cumsum(self.num_children) - self.num_children
        self.children = np.fromiter(itertools.chain.from_iterable(dag.children),
                                    dtype=np.int64, count=int(self.num_children.sum()))
        self.transfer = np.flatnonzero(self.kind == TRANSFER)
        src = np.array(dag.src, dtype=np.int64)[self.transfer]
        dst = np.array(dag.dst, dtype=np.int64)[self.transfer]
        self.ic = gpu_ic[src]              # `_Port.nvlink_s`: the sender's interconnect
        self.fabric_nodes = self.transfer[gpu_node[src] != gpu_node[dst]]
        self.fabric = fabric
        self._dag = dag
        # Each fabric transfer's route on the fabric, once its queue pair has one (else -1):
        # from the port's routed queue pairs (`_Port._routed`).
        found = [routed.get(self.pair(k)) for k in range(len(self.fabric_nodes))]
        self.routes = np.array([-1 if r is None else r[3] for r in found], dtype=np.int64)

    def pair(self, k: int) -> tuple[int, int, str]:
        """The queue pair (source GPU, destination GPU, channel) of fabric transfer k."""
        i = int(self.fabric_nodes[k])
        dag = self._dag
        return dag.src[i], dag.dst[i], dag.op[i]


class CompiledDagRun(DagRun):
    """`DagRun` on a `CompiledAnalyticalFabric`: the DAG run there as a job. Where a transfer's
    queue pair has no route yet (its first message fixes it), the step runs as `DagRun` does.
    The node times (`start_s`, `finish_s`, `ideal_s`, `cause`) are lists once it is done."""

    __slots__ = ("_size",)

    def _begin(self) -> None:
        """Before the start the job has no rows in the jobs' arrays; `DagRun`'s lists are made
        only if it runs as `DagRun` (`_start_python`)."""
        self._size = (0, 0)                  # (nodes, children) in the jobs' arrays

    def start(self) -> None:
        port = self.port
        fabric = port.runtime.fabric
        dag = self.dag
        held = dag._exposure
        cols = held[1] if len(held) > 1 else None
        if cols is None or cols.num_nodes != len(dag.kind) or cols.fabric is not fabric:
            gpus = fabric._gpus
            if gpus is None:
                nodes = port.node_of.__self__        # the port's table of each GPU's node
                ic = [port._ic] * len(nodes) if port._ic_of is None else port._ic_of
                gpus = fabric._gpus = (np.array(nodes, dtype=np.int64),
                                       np.array(ic, dtype=float))
            cols = JobColumns(dag, fabric, *gpus, port._routed)
            if len(held) > 1:
                held[1] = cols
            else:
                held.append(cols)
        dur = np.array(dag.dur_s, dtype=float)
        size = np.array(dag.size_bytes, dtype=np.int64)
        lat = np.array(dag.latency_s, dtype=float)
        while True:
            k = fabric.start_job(self, cols, dur, size, lat)
            if k < 0:
                return
            # A transfer with bytes on a queue pair the port has not seen routed here yet: its
            # route if the port has one, else the step runs as `DagRun` (its first message
            # fixes the route).
            found = port._routed.get(cols.pair(k))
            if found is None:
                self._start_python()
                return
            cols.routes[k] = found[3]

    def _start_python(self) -> None:
        """Run as `DagRun`: its lists made, its transfers sent one by one."""
        DagRun._begin(self)
        DagRun.start(self)

    def _finish(self, node_f: np.ndarray, cause: np.ndarray) -> None:
        """The job is complete: its node times taken from the jobs' arrays (as arrays), then
        `DagRun._complete`."""
        self.start_s = node_f[:, K.N_START].copy()
        finish = self.finish_s = node_f[:, K.FINISH].copy()
        self.ideal_s = node_f[:, K.N_IDEAL].copy()
        self.cause = cause.copy()
        t0 = self.t0_s
        last = float(finish.max()) if len(finish) else t0
        self.end_s = last if last > t0 else t0
        self.done = True
        if self.on_complete is not None:
            self.on_complete(self)
