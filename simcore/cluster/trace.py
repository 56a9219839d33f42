"""A Chrome/Perfetto trace (JSON trace-event format) of a window of steps: each lane's compute and
communication streams, and every transfer, on the simulated clock in microseconds."""

from __future__ import annotations

from typing import Any

from simcore.cluster.placement import Placement
from simcore.dag.executor import DagRun
from simcore.dag.graph import COMPUTE, TRANSFER

_STREAM_NAMES = ("compute", "comm")


class TraceRecorder:
    """Collects trace events of steps first_step .. first_step + num_steps - 1 (counting every
    step of every engine in the order they end). Process = engine, thread = stage and stream,
    plus one thread per engine for its transfers; `events()` is the `traceEvents` list."""

    def __init__(self, first_step: int, num_steps: int, placement: Placement) -> None:
        self.first = first_step
        self.last = first_step + num_steps
        self.placement = placement
        self._events: list[dict[str, Any]] = []
        self._named: set[tuple[int, int]] = set()

    def _thread(self, pid: int, tid: int, name: str) -> None:
        if (pid, tid) not in self._named:
            self._named.add((pid, tid))
            self._events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                                 "args": {"name": name}})
            if (pid, -1) not in self._named:
                self._named.add((pid, -1))
                self._events.append({"ph": "M", "name": "process_name", "pid": pid,
                                     "args": {"name": f"engine {pid}"}})

    def record(self, step_index: int, run: DagRun, t0_s: float) -> None:
        """Add the nodes of one executed step if it falls in the window."""
        if not self.first <= step_index < self.last:
            return
        dag = run.dag
        ev = self._events
        for i in range(len(dag)):
            lane = dag.lanes[dag.lane[i]]
            start, end = run.start_s[i], run.finish_s[i]
            if dag.kind[i] == TRANSFER:
                if dag.size_bytes[i] == 0:
                    continue
                tid = 1000 + lane.stage
                self._thread(lane.engine, tid, f"stage {lane.stage} transfers")
                medium = ("fabric" if self.placement.node_of(dag.src[i])
                          != self.placement.node_of(dag.dst[i]) else "nvlink")
                args = {"src_gpu": dag.src[i], "dst_gpu": dag.dst[i],
                        "bytes": dag.size_bytes[i], "medium": medium, "step": step_index}
                if run.ideal_s[i] > 0:
                    args["ideal_us"] = run.ideal_s[i] * 1e6
            else:
                if end <= start:
                    continue
                stream = dag.stream[i]
                tid = 2 * lane.stage + stream
                self._thread(lane.engine, tid, f"stage {lane.stage} {_STREAM_NAMES[stream]}")
                args = {"step": step_index}
            ev.append({"ph": "X", "name": dag.op[i],
                       "cat": "compute" if dag.kind[i] == COMPUTE else "communication",
                       "ts": start * 1e6, "dur": (end - start) * 1e6, "pid": lane.engine,
                       "tid": tid, "args": args})
        ev.append({"ph": "i", "name": f"step {step_index}", "s": "g", "ts": t0_s * 1e6,
                   "pid": dag.lanes[0].engine if dag.lanes else 0, "tid": 0})

    def events(self) -> list[dict[str, Any]]:
        return list(self._events)
