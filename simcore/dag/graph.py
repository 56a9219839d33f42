"""One engine step as a DAG: compute ops on GPU streams, collectives with modelled durations, and
point-to-point transfers, joined by data, stream-order and resource dependencies."""

from __future__ import annotations

from dataclasses import dataclass

COMPUTE = 0
"""A kernel (or a run of kernels) on a lane's stream for a modelled duration."""
LOCAL = 1
"""Communication with a modelled duration on a lane's stream (a collective inside one node)."""
TRANSFER = 2
"""A point-to-point message between two GPUs: over NVLink inside a node, over the fabric across."""

COMPUTE_STREAM = 0
COMM_STREAM = 1


@dataclass(frozen=True, slots=True)
class Lane:
    """GPUs that execute the same ops in lock-step (a tensor-parallel group of one pipeline stage
    of one engine), with one compute stream and one communication stream."""

    name: str                  # e.g. "engine 0 / stage 1"
    gpus: tuple[int, ...]
    engine: int
    stage: int


class StepDag:
    """Nodes in topological order (every dependency has a smaller index) and what each needs.

    Lifecycle: a builder appends nodes, then an executor runs the DAG once. Stream order is a
    dependency like any other: a node placed on a lane's stream depends on the node placed there
    before it (CUDA streams run in order). `deps[i]` lists data dependencies; `stream_dep[i]` is
    the stream predecessor (-1 for none). `children[i]` lists the nodes that wait for node i
    (data and stream order) and `num_inputs[i]` how many nodes node i waits for, kept as nodes
    are added so that an executor need not derive them.

    Structure reuse: `template()` is a built DAG's structure (every field but the durations,
    sizes and latencies); `adopt` makes an empty DAG that structure with new values. A builder
    whose steps repeat a shape builds it once; an adopted DAG shares the template's lists, so
    nothing is added to it afterwards.
    """

    __slots__ = ("lanes", "kind", "lane", "stream", "dur_s", "deps", "stream_dep", "op", "src",
                 "dst", "size_bytes", "latency_s", "fabric", "children", "num_inputs", "_last",
                 "_exposure")

    def __init__(self, lanes: list[Lane]) -> None:
        self.lanes = lanes
        self.kind: list[int] = []
        self.lane: list[int] = []
        self.stream: list[int] = []
        self.dur_s: list[float] = []
        self.deps: list[tuple[int, ...]] = []
        self.stream_dep: list[int] = []
        self.op: list[str] = []
        self.src: list[int] = []
        self.dst: list[int] = []
        self.size_bytes: list[int] = []
        self.latency_s: list[float] = []
        self.fabric: list[bool] = []       # communication that crosses nodes (the collective's)
        self.children: list[list[int]] = []
        self.num_inputs: list[int] = []
        self._last: dict[int, int] = {}     # 2 x lane + stream -> its last node
        # Columns worked out once per structure, shared with the DAGs that adopt it: the
        # exposure walk's first, then those of a fabric that runs the DAG as a job
        # (`simcore.dag.compiled_run`).
        self._exposure: list = [None]

    def __len__(self) -> int:
        return len(self.kind)

    def _add(self, kind: int, lane: int, stream: int, dur_s: float, deps: tuple[int, ...],
             op: str, src: int = -1, dst: int = -1, size_bytes: int = 0, latency_s: float = 0.0,
             fabric: bool = False) -> int:
        i = len(self.kind)
        children = self.children
        for d in deps:
            children[d].append(i)
        inputs = len(deps)
        sd = -1
        if stream >= 0:
            last = self._last
            key = 2 * lane + stream          # streams are 0 and 1
            sd = last.get(key, -1)
            last[key] = i
            if sd >= 0:
                children[sd].append(i)
                inputs += 1
        self.stream_dep.append(sd)
        children.append([])
        self.num_inputs.append(inputs)
        self.kind.append(kind)
        self.lane.append(lane)
        self.stream.append(stream)
        self.dur_s.append(dur_s)
        self.deps.append(deps)
        self.op.append(op)
        self.src.append(src)
        self.dst.append(dst)
        self.size_bytes.append(size_bytes)
        self.latency_s.append(latency_s)
        self.fabric.append(fabric)
        return i

    def template(self) -> tuple:
        """This DAG's structure, for `adopt` (its lists, shared: build no further)."""
        return (self.kind, self.lane, self.stream, self.deps, self.stream_dep, self.op, self.src,
                self.dst, self.fabric, self.children, self.num_inputs, self._exposure)

    def adopt(self, template: tuple, dur_s: list[float], size_bytes: list[int],
              latency_s: list[float]) -> None:
        """Become the DAG of `template` (from `template()` of a DAG on the same lanes) with
        these per-node values; the DAG must be empty."""
        if self.kind or len(dur_s) != len(template[0]):
            raise ValueError(f"adopt: {len(dur_s)} values for a template of "
                             f"{len(template[0])} nodes, into a DAG of {len(self.kind)}")
        (self.kind, self.lane, self.stream, self.deps, self.stream_dep, self.op, self.src,
         self.dst, self.fabric, self.children, self.num_inputs, self._exposure) = template
        self.dur_s, self.size_bytes, self.latency_s = dur_s, size_bytes, latency_s
        self._last = {}

    def exposure_columns(self):
        """The structure's columns for `simcore.dag.exposure.walk`, made once per structure
        (again if nodes were added since)."""
        from simcore.dag.exposure import ExposureColumns
        held = self._exposure
        cols = held[0]
        if cols is None or cols.num_nodes != len(self.kind):
            cols = held[0] = ExposureColumns(self)
        return cols

    def compute(self, lane: int, op: str, dur_s: float, deps: tuple[int, ...] = ()) -> int:
        """A compute op of `dur_s` on the lane's compute stream, after `deps`."""
        return self._add(COMPUTE, lane, COMPUTE_STREAM, dur_s, deps, op)

    def local(self, lane: int, op: str, dur_s: float, deps: tuple[int, ...] = (),
              stream: int = COMPUTE_STREAM) -> int:
        """A collective inside one node timed by formula, on one of the lane's streams."""
        return self._add(LOCAL, lane, stream, dur_s, deps, op)

    def transfer(self, lane: int, op: str, src: int, dst: int, size_bytes: int, latency_s: float,
                 deps: tuple[int, ...], fabric: bool) -> int:
        """A message from GPU `src` to GPU `dst`, started `latency_s` after its deps complete.
        `lane` is the sending lane (for reports); `fabric` marks a collective that crosses nodes."""
        return self._add(TRANSFER, lane, -1, 0.0, deps, op, src, dst, size_bytes, latency_s,
                         fabric)

    def barrier(self, lane: int, op: str, deps: tuple[int, ...], stream: int) -> int:
        """A zero-length node on a stream that waits for `deps` (a stream waiting on an event)."""
        return self._add(LOCAL, lane, stream, 0.0, deps, op)
