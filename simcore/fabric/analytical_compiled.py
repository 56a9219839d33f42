"""The analytical fabric with its state in arrays and its event loop compiled, running the step
DAGs of a cluster inside that loop (`simcore.fabric.analytical_kernels`).

`AnalyticalFabric` spends a few microseconds of Python on every message (its send, two heap
operations, its reservation, the executor's callback): an expert-parallel step has a hundred or
more, so a cluster run of a thousand requests is most of its time in them. Here a step's DAG is a
job the kernels run whole: its transfers are sent, reserved, delivered and release the nodes that
wait for them without returning to Python, which sees the job again when it is complete. Messages
sent from Python (KV-cache transfers, tenant traffic, a step whose queue pairs are not all routed
yet) take the same loop and hand their delivery back.

The results are `AnalyticalFabric`'s with `DagRun`, to the bit: the same operations in the same
order (`tests/test_fabric_compiled.py` holds the two together, and cluster runs byte-identical).
`stats` writes the arrays back into `AnalyticalFabric`'s lists and reports as it does. The
executor's side of a job is `simcore.dag.compiled_run.CompiledDagRun`.

Used for a cluster's analytical fabric where an expert-parallel group spans nodes and numba is
installed (`simcore.cluster.build`): a step of a few messages (pipeline stages, a tensor-parallel
group across nodes) costs more to set up as a job than it saves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from simcore.fabric import analytical_kernels as K
from simcore.fabric.analytical import AnalyticalFabric
from simcore.fabric.messages import MessageLog, _known_route
from simcore.fabric.protocol import FabricStats, MessageResult, OnDone
from simcore.fabric.settings import FabricSettings
from simcore.fabric.topology import Topology

if TYPE_CHECKING:
    from simcore.dag.compiled_run import CompiledDagRun, JobColumns


def _grown(a: np.ndarray, n: int) -> np.ndarray:
    """`a` with room for at least n rows (doubled), its contents kept."""
    if n <= len(a):
        return a
    out = np.empty((max(n, 2 * len(a)),) + a.shape[1:], dtype=a.dtype)
    out[:len(a)] = a
    return out


class CompiledAnalyticalFabric(AnalyticalFabric):
    """`AnalyticalFabric` run by `simcore.fabric.analytical_kernels`, with step DAGs as jobs
    (`start_job`, from `simcore.dag.compiled_run.CompiledDagRun`).

    Lifecycle as `AnalyticalFabric`; `on_job_send` (set by the cluster runtime) is called after
    a kernel call in which jobs sent messages, before anything else that call hands back, as the
    runtime's own sends kick its pump."""

    def __init__(self, topology: Topology, settings: FabricSettings | None = None, *,
                 seed: int = 0) -> None:
        super().__init__(topology, settings, seed=seed)
        self.on_job_send: Callable[[], None] | None = None
        self._clock = np.zeros(3)
        self._counts = np.zeros(9, dtype=np.int64)
        self._msg_f = np.empty((1024, 3))
        self._msg_i = np.empty((1024, 4), dtype=np.int64)
        self._msg_job = np.empty(1024, dtype=np.int64)
        self._route_i = np.empty((64, 2), dtype=np.int64)
        self._route_f = np.empty((64, 3))
        self._route_links = np.empty(256, dtype=np.int64)
        self._route_src: list[int] = []
        self._route_dst: list[int] = []
        self._paths: list[tuple[int, ...]] = []
        self._route_of: dict[tuple[int, ...], int] = {}
        self._longest_route = 1
        self._link_f = np.array([[0.0, inv, d] for inv, d in zip(self._inv_rate, self._delay)],
                                dtype=float).reshape(-1, 3)
        self._order_a = np.empty(1024, dtype=np.int64)
        self._spans = np.empty(4096)
        self._done_a = np.empty(1024, dtype=np.int64)
        self._starts_t = np.empty(1024)
        self._starts_i = np.empty((1024, 2), dtype=np.int64)
        self._ends_t = np.empty(1024)
        self._ends_i = np.empty((1024, 2), dtype=np.int64)
        self._node_f = np.empty((1024, 7))
        self._node_i = np.empty((1024, 7), dtype=np.int64)
        self._children = np.empty(1024, dtype=np.int64)
        self._job_i = np.zeros((8, 3), dtype=np.int64)
        self._stack = np.empty(1024, dtype=np.int64)
        self._jobs: dict[int, CompiledDagRun] = {}     # job slot -> its run, while in progress
        self._free_jobs: list[int] = []
        self._num_jobs = 0
        self._num_nodes = 0
        self._num_children = 0
        self._tags: dict[int, Any] = {}         # Python messages' tags (jobs': "step")
        self._callbacks: dict[int, OnDone] = {}
        # Each GPU's node and interconnect rate, from the cluster's port (`CompiledDagRun`).
        self._gpus: tuple[np.ndarray, np.ndarray] | None = None

    # -- state ------------------------------------------------------------------------------

    @property
    def now_s(self) -> float:
        return float(self._clock[K.NOW])

    def ideal_s(self, msg_id: int) -> float:
        if not 0 <= msg_id < self._counts[K.NUM_MSG]:
            raise IndexError(f"no message {msg_id}")
        return float(self._msg_f[msg_id, K.IDEAL])

    def next_event_s(self) -> float:
        c = self._counts
        t = float(self._ends_t[0]) if c[K.NUM_ENDS] else np.inf
        if c[K.NUM_STARTS] and self._starts_t[0] < t:
            return float(self._starts_t[0])
        return t

    def _room(self, extra_messages: int) -> None:
        """Make room for `extra_messages` more messages, and what the pending jobs may send."""
        c = self._counts
        more = extra_messages + int(c[K.PENDING])
        n = int(c[K.NUM_MSG]) + more
        if n > len(self._msg_f):
            self._msg_f = _grown(self._msg_f, n)
            self._msg_i = _grown(self._msg_i, n)
            self._msg_job = _grown(self._msg_job, n)
            self._order_a = _grown(self._order_a, n)
            self._done_a = _grown(self._done_a, n)
        # A message waits in one heap or the other until it is delivered.
        waiting = n - int(c[K.NUM_DONE])
        if waiting > len(self._starts_t):
            self._starts_t = _grown(self._starts_t, waiting)
            self._starts_i = _grown(self._starts_i, waiting)
            self._ends_t = _grown(self._ends_t, waiting)
            self._ends_i = _grown(self._ends_i, waiting)
        spans = int(c[K.NUM_SPANS]) + (n - int(c[K.NUM_ORDER])) * self._longest_route
        if spans > len(self._spans):
            self._spans = _grown(self._spans, spans)

    def _route(self, src: int, dst: int, path: tuple[int, ...], hit: tuple | None = None) -> int:
        """The index of the route `path` (from host src to dst), added on first use; `hit` its
        (path, sum of delays, sum of inverse rates, slowest rate) for the jobs' sends."""
        r = self._route_of.get(path)
        if r is None:
            r = self._route_of[path] = len(self._paths)
            self._paths.append(path)
            self._route_src.append(src)
            self._route_dst.append(dst)
            self._route_i = _grown(self._route_i, r + 1)
            self._route_f = _grown(self._route_f, r + 1)
            k = int(self._route_i[r - 1].sum()) if r else 0
            self._route_links = _grown(self._route_links, k + len(path))
            self._route_links[k:k + len(path)] = path
            self._route_i[r] = (k, len(path))
            self._route_f[r] = np.nan
            self._longest_route = max(self._longest_route, len(path))
        if hit is not None:
            self._route_f[r] = hit[1:]
        return r

    # -- sends from Python ------------------------------------------------------------------

    def _send(self, src: int, dst: int, size_bytes: int, start: float, route: tuple,
              wire: int, ideal: float, tag: Any, on_done: OnDone | None) -> int:
        r = self._route(src, dst, route)       # first: a longer path needs more spans' room
        self._room(1)
        mid = K.send_core(r, size_bytes, start, wire, ideal,
                          K.PYTHON_QUIET if on_done is None else K.PYTHON_CALLBACK,
                          *self._fabric_arrays())
        self._tags[mid] = tag
        if on_done is not None:
            self._callbacks[mid] = on_done
        return mid

    def _fabric_arrays(self) -> tuple:
        return (self._clock, self._counts, self._msg_f, self._msg_i, self._route_i,
                self._route_links, self._link_f, self._payload, self._header, self._order_a,
                self._spans, self._starts_t, self._starts_i, self._ends_t, self._ends_i)

    def send(self, src: int, dst: int, size_bytes: int, *, at_s: float | None = None,
             tag: Any = None, on_done: OnDone | None = None, flow_key: int | None = None,
             traffic_class: int = 0) -> int:
        return self._send(*self._planned(src, dst, size_bytes, at_s, flow_key,
                                         int(self._counts[K.NUM_MSG])), tag, on_done)

    def send_timed(self, src: int, dst: int, size_bytes: int, at_s: float, fn: Callable,
                   arg: Any, flow_key: int, tag: Any = None) -> float:
        mid = self.send(src, dst, size_bytes, at_s=at_s, tag=tag, on_done=(fn, arg),
                        flow_key=flow_key)
        return self.ideal_s(mid)

    def routed(self, src: int, dst: int, flow_key: int) -> tuple | None:
        """`AnalyticalFabric.routed`, with the route's index here as a fourth item."""
        hit = self._routes.get((src, dst, flow_key))
        return None if hit is None else (src, dst, hit, self._route(src, dst, hit[0], hit))

    def send_routed(self, route: tuple, size_bytes: int, at_s: float, fn: Callable, arg: Any,
                    tag: Any = None) -> float:
        src, dst, hit = route[:3]
        if size_bytes < 0:
            raise ValueError(f"size_bytes must be non-negative, got {size_bytes}")
        size = int(size_bytes)
        wire, ideal = _known_route(hit, size, self._payload, self._header)
        self._send(src, dst, size, float(at_s), hit[0], wire, ideal, tag, (fn, arg))
        return ideal

    # -- jobs -------------------------------------------------------------------------------

    def start_job(self, run: CompiledDagRun, cols: JobColumns, dur: np.ndarray,
                  size: np.ndarray, lat: np.ndarray) -> int:
        """Run the DAG of `run` from its start, its structure `cols` with this step's durations,
        sizes and latencies: written into the jobs' arrays and resolved as far as it goes;
        `run` is told when it completes. Returns -1, or (nothing done) the index among
        `cols.fabric_nodes` of a transfer with bytes whose queue pair has no route."""
        n, nc = cols.num_nodes, len(cols.children)
        if self._free_jobs:
            job = self._free_jobs.pop()
        else:
            job = self._num_jobs
            self._num_jobs += 1
            self._job_i = _grown(self._job_i, job + 1)
        if not self._jobs:
            self._num_nodes = self._num_children = 0       # nothing in progress: start over
        elif (self._num_nodes + n > len(self._node_f)
              or self._num_children + nc > len(self._children)):
            self._compact()
        base, cbase = self._num_nodes, self._num_children
        self._node_f = _grown(self._node_f, base + n)
        self._node_i = _grown(self._node_i, base + n)
        self._children = _grown(self._children, cbase + nc)
        self._stack = _grown(self._stack, n)
        self._room(len(cols.fabric_nodes))
        code, x = K.start_job_core(job, base, cbase, run.t0_s, cols.kind, cols.num_inputs,
                                   cols.child_off, cols.num_children, cols.children,
                                   cols.transfer, cols.ic, cols.fabric_nodes, cols.routes, dur,
                                   size, lat, self._stack, *self._job_arrays())
        if code == K.UNROUTED:
            self._free_jobs.append(job)
            return x
        self._num_nodes, self._num_children = base + n, cbase + nc
        self._jobs[job] = run
        run._size = (n, nc)
        self._after_kernel(code, x)
        return -1

    def _compact(self) -> None:
        """Move the nodes and children of the jobs in progress to the front of their arrays
        (those of finished jobs between them are free)."""
        base = cbase = 0
        for job in sorted(self._jobs, key=lambda j: self._job_i[j, K.NODE_BASE]):
            b, cb = int(self._job_i[job, K.NODE_BASE]), int(self._job_i[job, K.CHILD_BASE])
            n, nc = self._jobs[job]._size
            self._node_f[base:base + n] = self._node_f[b:b + n]
            self._node_i[base:base + n] = self._node_i[b:b + n]
            self._children[cbase:cbase + nc] = self._children[cb:cb + nc]
            self._job_i[job, K.NODE_BASE], self._job_i[job, K.CHILD_BASE] = base, cbase
            base, cbase = base + n, cbase + nc
        self._num_nodes, self._num_children = base, cbase

    def _job_arrays(self) -> tuple:
        return (self._clock, self._counts, self._msg_f, self._msg_i, self._msg_job,
                self._route_i, self._route_f, self._route_links, self._link_f, self._payload,
                self._header, self._order_a, self._spans, self._starts_t, self._starts_i,
                self._ends_t, self._ends_i, self._node_f, self._node_i, self._children,
                self._job_i)

    def _after_kernel(self, code: int, x: int) -> None:
        """What a kernel call hands back: the jobs' sends told, a send behind the clock raised,
        a complete job finished."""
        c = self._counts
        sent = int(c[K.NUM_SENT])
        if sent:
            c[K.NUM_SENT] = 0
            if self.on_job_send is not None:
                self.on_job_send()
        if code == K.BEHIND:
            at, now = self._clock[K.BEHIND_AT], self._clock[K.BEHIND_NOW]
            raise AssertionError(f"a send at {float(at)} s is behind the fabric clock "
                                 f"{float(now)} s")
        if code == K.JOB_DONE:
            run = self._jobs.pop(x)
            self._free_jobs.append(x)
            base = int(self._job_i[x, K.NODE_BASE])
            run._finish(self._node_f[base:base + len(run.dag)],
                        self._node_i[base:base + len(run.dag), K.CAUSE])

    # -- the clock --------------------------------------------------------------------------

    def run(self, until_s: float | None = None, *,
            stop: Callable[[], bool] | None = None) -> float:
        """`AnalyticalFabric.run`. `stop` is read when the run starts and after each callback
        into Python (a Python message's, a job's completion): it may change only there, as the
        cluster runtime's does (`ClusterRuntime._stop`)."""
        if self._running:
            raise RuntimeError("run() was called from inside a completion callback")
        limit = np.inf if until_s is None else float(until_s)
        stopping = stop is not None and bool(stop())
        self._running = True
        try:
            while True:
                self._room(0)
                code, x = K.run_core(limit, stopping, self._stack, self._clock, self._counts,
                                     self._msg_f, self._msg_i, self._msg_job, self._route_i,
                                     self._route_f, self._route_links, self._link_f,
                                     self._payload, self._header, self._order_a, self._spans,
                                     self._done_a, self._starts_t, self._starts_i,
                                     self._ends_t, self._ends_i, self._node_f, self._node_i,
                                     self._children, self._job_i)
                self._after_kernel(code, x)
                if code == K.IDLE:
                    break
                if code == K.STOPPED:
                    return self.now_s
                if code == K.PYTHON_DELIVERY:
                    on_done = self._callbacks.pop(x)
                    end = float(self._msg_f[x, K.END])
                    if on_done.__class__ is tuple:
                        on_done[0](on_done[1], end, float(self._msg_f[x, K.IDEAL]))
                    else:
                        on_done(self._result(x))
                if stop is not None:
                    stopping = bool(stop())
                    if stopping and not self._due():
                        return self.now_s
            if until_s is not None and until_s > self._clock[K.NOW]:
                self._clock[K.NOW] = until_s
        finally:
            self._running = False
        return self.now_s

    def _due(self) -> bool:
        """Whether an end or a start is due at the clock."""
        c, now = self._counts, self._clock[K.NOW]
        return bool((c[K.NUM_ENDS] and self._ends_t[0] <= now)
                    or (c[K.NUM_STARTS] and self._starts_t[0] <= now))

    # -- results ----------------------------------------------------------------------------

    def _result(self, mid: int) -> MessageResult:
        f, i = self._msg_f[mid], self._msg_i[mid]
        r = int(i[K.ROUTE])
        return MessageResult(mid, self._route_src[r], self._route_dst[r], int(i[K.SIZE]),
                             float(f[K.START]), float(f[K.END]), float(f[K.IDEAL]),
                             self._tags.get(mid, "step"))

    def stats(self) -> FabricStats:
        """`AnalyticalFabric.stats`, from its lists written back from the arrays."""
        c = self._counts
        n = int(c[K.NUM_MSG])
        log = MessageLog()
        routes = self._msg_i[:n, K.ROUTE]
        log.src = np.array(self._route_src, dtype=np.int64)[routes].tolist()
        log.dst = np.array(self._route_dst, dtype=np.int64)[routes].tolist()
        log.size_bytes = self._msg_i[:n, K.SIZE].tolist()
        log.start_s = self._msg_f[:n, K.START].tolist()
        log.path = list(map(self._paths.__getitem__, routes.tolist()))
        log.wire_bytes = self._msg_i[:n, K.WIRE].tolist()
        log.ideal_s = self._msg_f[:n, K.IDEAL].tolist()
        log.tag = ["step"] * n
        for mid, tag in self._tags.items():
            log.tag[mid] = tag
        ends = self._msg_f[:n, K.END]
        log.end_s = ends.tolist()
        for mid in np.flatnonzero(np.isnan(ends)).tolist():
            log.end_s[mid] = None
        log._on_done = dict(self._callbacks)
        self._log = log
        self._order = self._order_a[:int(c[K.NUM_ORDER])].tolist()
        self._done = self._done_a[:int(c[K.NUM_DONE])].tolist()
        self._heap = [None] * int(c[K.NUM_ENDS])
        self._now = float(self._clock[K.NOW])
        return super().stats()

    def _spans_of(self, mids: list[int], first_span: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """`AnalyticalFabric._spans_of`, from the arrays."""
        mids = np.asarray(mids, dtype=np.int64)
        wire = self._msg_i[mids, K.WIRE]
        routes = self._msg_i[mids, K.ROUTE]
        num_links = self._route_i[routes, K.NUM_LINKS]
        total = int(num_links.sum())
        first = np.repeat(self._route_i[routes, K.FIRST_LINK] - (np.cumsum(num_links)
                                                                - num_links), num_links)
        links = self._route_links[first + np.arange(total)]
        return wire, num_links, links, self._spans[first_span:first_span + total].copy()
