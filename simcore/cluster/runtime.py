"""The cluster on the clock: one fabric shared by every engine, kept in lock-step with SimPy, step
DAGs executed over it, KV-cache transfers and other tenants' traffic on the same links.

Lock-step: the fabric runs on its own event loop but never ahead of the next SimPy event (the
only thing that can send into it), and it stops at every delivery whose callback may release
new work; the `pump` process then brings the SimPy clock to the fabric's. A callback's effects
on the engines are scheduled at the delivery's time, never earlier.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy

from simcore.cluster.config import ClusterConfig
from simcore.cluster.network import ClusterNetwork
from simcore.cluster.placement import Placement
from simcore.cluster.trace import TraceRecorder
from simcore.compute.base import StepTime
from simcore.compute.roofline import RooflineModel
from simcore.dag.builder import StepDagBuilder
from simcore.dag.executor import DagRun
from simcore.fabric.protocol import Fabric, MessageResult
from simcore.fabric.run import distribution

if TYPE_CHECKING:
    from simcore.host import HostOverheads

COMM_CAUSES = ("/nvlink", "/fabric")


@dataclass
class ClusterStats:
    """What the engines' steps spent their GPU time on, summed over steps (GPU-seconds)."""

    num_steps: int = 0
    gpu_step_s: float = 0.0                  # step time x GPUs of the step's lanes
    gpu_compute_s: float = 0.0
    gpu_exposed_s: dict[str, float] = field(default_factory=dict)   # by cause
    gpu_congestion_s: float = 0.0            # of the fabric part: actual minus ideal
    transfer_bytes: dict[str, int] = field(default_factory=dict)    # by op/medium
    gpu_comm_stall_s: dict[int, float] = field(default_factory=dict)
    """Per GPU: time its compute stream spent on or waiting for communication."""
    kv_transfers: list[tuple[int, float, float]] = field(default_factory=list)
    """(bytes, start_s, end_s) of every KV-cache transfer (P/D handoff or tier fetch)."""


class _Port:
    """The executor's TransferPort: NVLink by formula, the fabric through the runtime."""

    __slots__ = ("runtime", "node_of", "_ic", "_ic_of", "_host", "_routed")

    def __init__(self, runtime: ClusterRuntime, interconnect_bytes_per_s: float,
                 gpu_interconnect_bytes_per_s: tuple[float, ...] | None = None) -> None:
        self.runtime = runtime
        # A table lookup: the executor asks for every transfer.
        self.node_of = tuple(runtime.placement.node_of(g)
                             for g in range(runtime.network.num_gpus)).__getitem__
        self._host = runtime.network.gpu_host
        self._ic = interconnect_bytes_per_s
        self._ic_of = gpu_interconnect_bytes_per_s
        # (source GPU, destination GPU, channel) -> the queue pair's fixed route
        # (`ClusterRuntime.routed`), once its first transfer has been sent: where the fabric
        # fixes a queue pair's route for good.
        self._routed: dict[tuple[int, int, str], tuple] | None = (
            {} if hasattr(runtime.fabric, "send_routed") else None)

    def nvlink_s(self, size_bytes: int, gpu: int | None = None) -> float:
        """Time of `size_bytes` between two GPUs of one node (of `gpu`'s node where GPUs
        differ by node)."""
        if self._ic_of is not None and gpu is not None:
            return size_bytes / self._ic_of[gpu]
        return size_bytes / self._ic

    def send(self, src_gpu: int, dst_gpu: int, size_bytes: int, at_s: float,
             on_done: Callable[[Any, float, float], None], arg: Any, channel: str = "") -> None:
        rt = self.runtime
        routed = self._routed
        if routed is not None:
            route = routed.get((src_gpu, dst_gpu, channel))
            if route is not None:
                rt.send_routed(route, size_bytes, at_s, on_done, arg)
                return
        host = self._host
        if rt.fabric_timed:
            rt.send_timed(host[src_gpu], host[dst_gpu], size_bytes, at_s, on_done, arg,
                          channel)
            if routed is not None:
                route = rt.routed(host[src_gpu], host[dst_gpu], channel)
                if route is not None:
                    routed[src_gpu, dst_gpu, channel] = route
        else:
            rt.send_hosts(host[src_gpu], host[dst_gpu], size_bytes, at_s,
                          lambda r: on_done(arg, r.end_s, r.ideal_s), tag="step",
                          channel=channel)


class ClusterRuntime:
    """Engines of a placement stepping over one shared fabric on one SimPy clock.

    Lifecycle: built per simulation with its environment; `start()` launches the pump and any
    tenant traffic; engines call `step(...)` (a SimPy generator) once per step and
    `transfer_kv(...)` for KV-cache moves; `summary()` reports at the end.
    """

    def __init__(self, env: simpy.Environment, cfg: ClusterConfig, *, placement: Placement,
                 network: ClusterNetwork, fabric: Fabric, builder: StepDagBuilder,
                 model: RooflineModel, interconnect_bytes_per_s: float,
                 host: HostOverheads | None = None,
                 gpu_interconnect_bytes_per_s: tuple[float, ...] | None = None) -> None:
        self.env = env
        self.cfg = cfg
        self.placement = placement
        self.network = network
        self.fabric = fabric
        # Whether the fabric takes timed callbacks (`MessageFabric.timed_callbacks`).
        self.fabric_timed = getattr(fabric, "timed_callbacks", False)
        # A fabric that runs step DAGs itself (`CompiledAnalyticalFabric`) takes them as jobs,
        # and says when their transfers are sent (the pump's kick, as `send_routed` gives it).
        self._dag_run = DagRun
        if hasattr(fabric, "start_job"):
            from simcore.dag.compiled_run import CompiledDagRun
            self._dag_run = CompiledDagRun
            fabric.on_job_send = self._kicked
        self.builder = builder
        self.model = model
        self.port = _Port(self, interconnect_bytes_per_s, gpu_interconnect_bytes_per_s)
        self.stats = ClusterStats()
        a = model.assumptions
        self._overhead_s = a.step_overhead_s
        self.host = host
        self._eager_s = model.arch.num_layers * a.eager_launch_s_per_layer
        self._kick: simpy.Event | None = None
        self._woken = False
        self._flow_keys: dict[tuple[int, int, str], int] = {}
        self.trace = (TraceRecorder(cfg.trace.first_step, cfg.trace.num_steps, placement)
                      if cfg.trace.num_steps else None)
        self._step_index = 0

    # -- the clock ---------------------------------------------------------------------------

    def start(self) -> None:
        self.env.process(self._pump())
        for i, t in enumerate(self.cfg.tenant_traffic):
            self.env.process(self._tenant(i, t))

    def _pump(self):
        env, fabric = self.env, self.fabric
        while True:
            nxt = fabric.next_event_s()
            kick = self._kick = env.event()
            if nxt > env.now:
                if nxt == math.inf:
                    yield kick
                else:
                    yield env.timeout(nxt - env.now) | kick
                continue
            horizon = env.peek()
            self._woken = False
            t = fabric.run(None if horizon == math.inf else horizon, stop=self._stop)
            if t > env.now:
                yield env.timeout(t - env.now)

    def _stop(self) -> bool:
        """The fabric must pause: a callback has scheduled work on the SimPy clock."""
        return self._woken

    def _later(self, t_s: float, fn: Callable[[], None]) -> None:
        """Call fn on the SimPy clock at t_s (a fabric callback's time), not before."""
        self._woken = True
        ev = self.env.timeout(max(0.0, t_s - self.env.now))
        ev.callbacks.append(lambda _: fn())

    def send_hosts(self, src: int, dst: int, size_bytes: int, at_s: float,
                   on_done: Callable[[MessageResult], None] | tuple | None, *,
                   tag: Any = None, channel: str = "") -> float:
        """Put a message on the fabric between two hosts at at_s (>= the fabric's clock); returns
        its ideal time (alone on an idle network). `on_done` may be a timed callback (fn, arg)
        where the fabric takes them (`fabric_timed`). Messages of one `channel` between two hosts
        share a queue pair (they queue behind each other at the NIC and take one ECMP path);
        each channel (a collective kind, KV transfers, a tenant) has its own, as NCCL and
        DeepEP open several."""
        fabric = self.fabric
        at_s, key = self._queue_pair(src, dst, at_s, channel)
        mid = fabric.send(src, dst, size_bytes, at_s=at_s, tag=tag, on_done=on_done,
                          flow_key=key)
        self._kicked()
        return fabric.ideal_s(mid)

    def send_timed(self, src: int, dst: int, size_bytes: int, at_s: float,
                   fn: Callable[[Any, float, float], None], arg: Any, channel: str) -> float:
        """`send_hosts` of a step DAG's transfer (tag "step") with the timed callback (fn, arg),
        on a fabric that takes them (`fabric_timed`)."""
        at_s, key = self._queue_pair(src, dst, at_s, channel)
        ideal = self.fabric.send_timed(src, dst, size_bytes, at_s, fn, arg, key, "step")
        self._kicked()
        return ideal

    def _kicked(self) -> None:
        """Messages were put on the fabric: wake the pump if it waits (as every send does)."""
        kick = self._kick
        if kick is not None and not kick.triggered:
            kick.succeed()

    def routed(self, src: int, dst: int, channel: str) -> tuple | None:
        """The fabric's fixed route of the queue pair from host src to dst on `channel`, for
        `send_routed`; None if it has sent nothing yet."""
        key = self._flow_keys.get((src, dst, channel))
        return None if key is None else self.fabric.routed(src, dst, key)

    def send_routed(self, route: tuple, size_bytes: int, at_s: float,
                    fn: Callable[[Any, float, float], None], arg: Any) -> None:
        """`send_timed` on a queue pair whose route the fabric has fixed (`routed`): a step
        DAG's transfers, hundreds of thousands in a run on a few hundred queue pairs."""
        self.fabric.send_routed(route, size_bytes, self._on_clock(at_s), fn, arg, "step")
        self._kicked()

    def _on_clock(self, at_s: float) -> float:
        """A send's start, one within a nanosecond behind the fabric's clock (rounding) moved
        to it."""
        now = self.fabric.now_s
        if at_s < now:
            if at_s < now - 1e-9:
                raise AssertionError(f"a send at {at_s} s is behind the fabric clock {now} s")
            return now
        return at_s

    def _queue_pair(self, src: int, dst: int, at_s: float, channel: str) -> tuple[float, int]:
        """(start time, flow key) of a message from host src to dst on `channel` (`_on_clock`)."""
        keys = self._flow_keys
        key = keys.get((src, dst, channel))
        if key is None:
            key = keys[src, dst, channel] = len(keys)
        return self._on_clock(at_s), key

    def _tenant(self, index: int, t):
        env = self.env
        net = self.network
        gap = t.message_bytes * 8 / (t.rate_gbps * 1e9)
        if t.start_s > env.now:
            yield env.timeout(t.start_s - env.now)
        src, dst = net.host_of(t.src_gpu), net.host_of(t.dst_gpu)
        while t.stop_s is None or env.now < t.stop_s:
            self.send_hosts(src, dst, t.message_bytes, env.now, _ignore, tag=f"tenant{index}",
                            channel=f"tenant{index}")
            yield env.timeout(gap)

    # -- steps -------------------------------------------------------------------------------

    def step(self, batches: list[tuple[int, list | None]]):
        """Run one step of the listed engines (instance index, scheduled batch or None for a
        dummy batch) as a DAG over the fabric; a SimPy generator that returns its StepTime once
        the step has ended on the clock."""
        env = self.env
        t0 = env.now
        insts = self.placement.instances
        dag, full_graph, shapes = self.builder.build([(insts[i], s) for i, s in batches])
        host = self.host
        real = [s for s in shapes if s is not None]
        cpu_s = self._overhead_s if host is None else host.group_engine_s(real)
        overlapped = host is not None and host.async_scheduling
        # Async scheduling hides vLLM's scheduler behind the GPU, not the model runner's time.
        runner_s = host.group_runner_s(real) if overlapped else 0.0
        gpu_start = t0 + (runner_s if overlapped else cpu_s)
        done = env.event()
        run = self._dag_run(dag, gpu_start, self.port,
                            lambda r: self._later(self.fabric.now_s, done.succeed))
        run.start()
        if not run.done:
            yield done
        end = run.end_s
        if not full_graph and end < gpu_start + self._eager_s:
            end = gpu_start + self._eager_s
        if host is not None:
            # The API server streams the sampled tokens at its own pace; async scheduling
            # prepares the next step while this one runs, so the step takes the longer of the two.
            end = max(end, t0 + host.group_frontend_s(real))
            if overlapped:
                end = max(end, t0 + cpu_s - runner_s)
        if end > env.now:
            yield env.timeout(end - env.now)
        total = end - t0
        busy, causes, congestion = run.exposure()
        lanes = dag.lanes
        st = self.stats
        st.num_steps += 1
        compute = max(busy) if busy else 0.0
        stall = st.gpu_comm_stall_s
        for ln, b, c in zip(lanes, busy, run.lane_comm_s):
            if c:
                for gpu in ln.gpus:
                    stall[gpu] = stall.get(gpu, 0.0) + c
            g = len(ln.gpus)
            st.gpu_step_s += total * g
            st.gpu_compute_s += b * g
        gpus_per_lane = len(lanes[0].gpus) if lanes else 1
        for key, v in causes.items():
            st.gpu_exposed_s[key] = st.gpu_exposed_s.get(key, 0.0) + v * gpus_per_lane
        st.gpu_congestion_s += congestion * gpus_per_lane
        comm = sum(v for k, v in causes.items() if k.endswith(COMM_CAUSES))
        comm /= max(1, len(lanes))
        a2a = sum(v for k, v in causes.items()
                  if k.startswith(("dispatch", "combine"))) / max(1, len(lanes))
        if self.trace is not None:
            self.trace.record(self._step_index, run, t0)
        self._step_index += 1
        if real:
            widest = max(real, key=lambda s: s.num_tokens)
            by_role = getattr(self.builder, "for_instance", None)   # per-role TP
            model = (self.model if by_role is None
                     else by_role(insts[batches[0][0]]).model)
            cb, mb = model.op_bounds(widest)
        else:
            cb = mb = 0.0
        bound = ("communication" if comm > cb and comm > mb
                 else "compute" if cb >= mb else "memory")
        return StepTime(total, compute, comm, bound, total - compute - comm, a2a)

    # -- KV-cache transfers --------------------------------------------------------------------

    def transfer_kv(self, pairs: list[tuple[int, int, int]], on_done: Callable[[], None], *,
                    nvlink_bytes: tuple[int, ...] = ()) -> None:
        """Move KV-cache bytes now: `pairs` of (src host, dst host, bytes) over the fabric and,
        alongside, `nvlink_bytes` between pairs of GPUs of one node over NVLink (each pair its
        own link, timed as the step DAGs time NVLink transfers); on_done() runs on the clock
        when the last byte has arrived."""
        now = self.env.now
        live = [p for p in pairs if p[2] > 0]
        local = [b for b in nvlink_bytes if b > 0]
        if not live and not local:
            self._later(now, on_done)
            return
        left = [len(live) + (1 if local else 0)]
        total = sum(p[2] for p in live) + sum(local)

        def one(end_s: float) -> None:
            left[0] -= 1
            if left[0] == 0:
                self.stats.kv_transfers.append((total, now, end_s))
                self._later(end_s, on_done)

        for src, dst, size in live:
            self.send_hosts(src, dst, size, now, lambda r: one(r.end_s), tag="kv", channel="kv")
        if local:
            end_s = now + max(self.port.nvlink_s(b) for b in local)
            self.env.timeout(end_s - now).callbacks.append(lambda _: one(end_s))

    # -- results -----------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        """Network share of step time, exposed communication by kind and medium, congestion,
        KV transfers and the fabric's measurements.

        Congestion is the time the steps' compute streams waited on fabric transfers beyond
        those transfers' ideal times (alone on an idle network), along the critical path of
        each wait: a slowed transfer whose delay overlaps other work costs nothing. It is given
        as a share of step time and of the fabric's exposed time; `fabric.step_slowdown` and
        `fabric.num_step_messages_slowed` count the slowed messages whether or not a step
        waited for them."""
        st = self.stats
        fs = self.fabric.stats()
        exposed = {k: v for k, v in sorted(st.gpu_exposed_s.items())}
        comm = sum(v for k, v in exposed.items() if k.endswith(COMM_CAUSES))
        fabric_comm = sum(v for k, v in exposed.items() if k.endswith("/fabric"))
        step = st.gpu_step_s
        # The engines' messages as (size, slowdown) columns, in delivery order.
        columns = getattr(fs.messages, "sizes_and_slowdowns", None)
        if columns is not None:
            sizes, slowdowns = columns("step")
        else:
            sizes, slowdowns = [], []
            for m in fs.messages:
                if m.tag == "step":
                    sizes.append(m.size_bytes)
                    slowdowns.append(m.slowdown)
        out: dict[str, Any] = {
            "backend": self.cfg.fabric.backend,
            "num_nodes": self.placement.num_nodes,
            "gpus_used": self.placement.num_gpus_used,
            "num_steps": st.num_steps,
            "network_share_of_step_time": comm / step if step else 0.0,
            "fabric_share_of_step_time": fabric_comm / step if step else 0.0,
            "congestion_share_of_step_time": st.gpu_congestion_s / step if step else 0.0,
            "congestion_share_of_fabric_time": (st.gpu_congestion_s / fabric_comm
                                                if fabric_comm else 0.0),
            "compute_share_of_step_time": st.gpu_compute_s / step if step else 0.0,
            "exposed_gpu_s": exposed,
            "comm_stall_s_by_gpu": {str(g): v for g, v in sorted(st.gpu_comm_stall_s.items())},
            "congestion_gpu_s": st.gpu_congestion_s,
            "fabric": _fabric_block(fs, self.network, sizes, slowdowns),
        }
        if st.kv_transfers:
            times = distribution([e - s for _, s, e in st.kv_transfers])
            out["kv_transfers"] = {
                "num": len(st.kv_transfers),
                "bytes": int(sum(b for b, _, _ in st.kv_transfers)),
                **{f"{k}_s": v for k, v in times.items()}}
        return out


def _ignore(_: MessageResult) -> None:
    """Tenant messages need no completion handling."""


SLOWED = 1.1
"""A step message counts as slowed when it took more than this many times its time alone on an
idle network (uncontended messages come out at 1.00 on every backend)."""

SIZE_BUCKETS = ((0, 64 << 10, "<64KiB"), (64 << 10, 1 << 20, "64KiB-1MiB"),
                (1 << 20, 16 << 20, "1-16MiB"), (16 << 20, math.inf, ">=16MiB"))


def _fabric_block(fs, network: ClusterNetwork, sizes: list[int],
                  slowdowns: list[float]) -> dict[str, Any]:
    """The fabric's counters and the FCT slowdown of the engines' messages (their sizes and
    slowdowns) by size."""
    topo = network.topology
    duration = fs.duration_s
    by_size = []
    size_arr = np.array(sizes, dtype=float)
    slowdown_arr = np.array(slowdowns, dtype=float)
    for lo, hi, label in SIZE_BUCKETS:
        sel = slowdown_arr[(lo <= size_arr) & (size_arr < hi)]
        if len(sel):
            by_size.append({"size": label, "num": len(sel),
                            **{f"slowdown_{k}": v for k, v in distribution(sel).items()}})
    util = [ls.busy_s / duration for ls in fs.links] if duration > 0 else []
    busiest = int(np.argmax(util)) if util else -1
    names = [nd.name for nd in topo.nodes]
    return {
        "num_messages": len(fs.messages),
        "num_step_messages": len(sizes),
        "payload_bytes": fs.payload_delivered_bytes,
        "slowdown_by_size": by_size,
        "step_slowdown": distribution(slowdown_arr),
        "num_step_messages_slowed": int((slowdown_arr > SLOWED).sum()),
        "ecn_marks": fs.num_ecn_marks, "cnps": fs.num_cnps,
        "dcqcn_rate_cuts": fs.num_rate_cuts,
        "pfc_pause_frames": fs.num_pfc_pause_frames,
        "pfc_paused_s": sum(ls.paused_s for ls in fs.links),
        "drops": fs.num_drops, "retransmits": fs.num_retransmits,
        "max_queue_bytes": max((ls.max_queue_bytes for ls in fs.links), default=0),
        "link_utilization_mean": float(np.mean(util)) if util else 0.0,
        "busiest_link": (None if busiest < 0 else
                         {"name": f"{names[topo.links[busiest].src]}->"
                                  f"{names[topo.links[busiest].dst]}",
                          "utilization": util[busiest]}),
    }
