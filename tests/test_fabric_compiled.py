"""The compiled analytical fabric (`simcore.fabric.analytical_compiled`) against
`AnalyticalFabric` with `DagRun`: the same deliveries, clock and figures to the bit, for messages
sent from Python and for clusters whose step DAGs it runs as jobs."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import simcore.cluster.build as cluster_build
import simcore.dag.compiled_run as compiled_module
from simcore.compiled import import_numba
from simcore.config import load_config
from simcore.fabric.analytical import AnalyticalFabric
from simcore.fabric.analytical_compiled import CompiledAnalyticalFabric
from simcore.fabric.settings import FabricSettings
from simcore.simulate import simulate
from tests.test_fabric_analytical import _message_sets

pytestmark = pytest.mark.skipif(import_numba() is None, reason="numba is not installed")


def _drive(cls, topo, msgs, interval, horizons, replies):
    """Send `msgs` (each by `send` with a result callback, `send_timed`, `send_routed` once
    its queue pair is routed, or without a callback), run to each of `horizons` with a stop
    that turns on after every third delivery, a delivery of an even message sending a reply;
    everything each fabric said, in order."""
    fab = cls(topo, FabricSettings(sample_interval_s=interval))
    seen: list = []
    woken = [False]

    def timed(arg, end_s, ideal_s):
        seen.append(("timed", arg, end_s, ideal_s))
        delivered(arg, end_s)

    def result(r):
        seen.append(("result", r))
        delivered(r.msg_id, r.end_s)

    def delivered(arg, end_s):
        if len(seen) % 3 == 0:
            woken[0] = True
        if replies and arg % 2 == 0:
            src, dst, size, _, key = msgs[arg % len(msgs)]
            seen.append(("reply", fab.send(dst, src, size // 2 + 1, at_s=end_s,
                                           on_done=result, flow_key=key)))

    for k, (src, dst, size, at, key) in enumerate(sorted(msgs, key=lambda m: m[3])):
        route = fab.routed(src, dst, key) if k % 4 == 3 else None
        if route is not None:
            seen.append(fab.send_routed(route, size, max(at, fab.now_s), timed, k, "step"))
        elif k % 4 == 1:
            seen.append(fab.send_timed(src, dst, size, at, timed, k, key, "step"))
        elif k % 4 == 2:
            seen.append(fab.send(src, dst, size, at_s=at, tag="quiet", flow_key=key))
        else:
            seen.append(fab.send(src, dst, size, at_s=at, tag=k, on_done=result, flow_key=key))
    for until in horizons:
        woken[0] = False
        seen.append(("run", fab.run(until, stop=lambda: woken[0]), fab.now_s,
                     fab.next_event_s()))
    seen.append(("run", fab.run(), fab.now_s))
    stats = fab.stats()
    return seen, (list(stats.messages), [(ls.bytes_sent, ls.busy_s) for ls in stats.links],
                  stats.utilization_t_s, stats.utilization, stats.payload_sent_bytes,
                  stats.payload_delivered_bytes, stats.duration_s)


@settings(max_examples=60, deadline=None)
@given(_message_sets(), st.lists(st.floats(0, 3e-4, allow_nan=False), max_size=4),
       st.booleans())
def test_compiled_fabric_is_the_analytical_fabric(case, horizons, replies):
    topo, msgs, interval, _ = case
    horizons = sorted(horizons)
    assert (_drive(CompiledAnalyticalFabric, topo, msgs, interval, horizons, replies)
            == _drive(AnalyticalFabric, topo, msgs, interval, horizons, replies))


def test_arrays_grow_for_many_messages_and_a_longer_path_late():
    """Thousands of messages on a path of two links, then one of four started at the clock (its
    spans need room the shorter path never asked for), with callbacks that send more: the
    arrays grow between kernel calls, never inside one."""
    from simcore.fabric.topology import leaf_spine
    said = []
    for cls in (CompiledAnalyticalFabric, AnalyticalFabric):
        topo = leaf_spine(2, 2, 1, host_rate_bps=100e9, delay_s=1e-6)
        fab = cls(topo)
        near, far = (topo.hosts[0], topo.hosts[1]), (topo.hosts[0], topo.hosts[3])
        seen = []
        for k in range(2047):
            fab.send(*near, 100 + k, on_done=seen.append, flow_key=k % 3)
        fab.send(*far, 5000, on_done=seen.append, flow_key=0)
        fab.run(1e-4)
        for k in range(3000):
            fab.send(*(far if k % 7 == 0 else near), 70_000, at_s=fab.now_s + k * 1e-7,
                     on_done=seen.append, flow_key=k % 5)
        fab.run()
        st = fab.stats()
        said.append((seen, list(st.messages), [ls.busy_s for ls in st.links], st.utilization))
    assert said[0] == said[1]


def _cluster(path: str, num_prompts: int, **fabric):
    cfg = load_config(path)
    c = cfg.cluster
    return cfg.model_copy(update={
        "cluster": c.model_copy(update={"fabric": c.fabric.model_copy(
            update={"backend": "analytical", **fabric})}),
        "workload": cfg.workload.model_copy(update={"num_prompts": num_prompts})})


def _pd_expert_parallel():
    """Disaggregated expert parallelism over three nodes: the decode group across two, KV-cache
    transfers (messages sent from Python) from the prefill node to them."""
    from simcore.config import parse_config
    from tests.test_pd_expert_parallel import mapping
    m = mapping(n_p=8, n_d=16, prompts=24)
    m["cluster"]["num_nodes"] = 3
    return parse_config(m)


def _tp_expert_parallel(all_to_all: str):
    """EP 4 = DP 2 x TP 2 over two nodes (its steps built node by node, not adopted), with a
    tenant's messages sent from Python alongside."""
    from tests.test_cluster import ep_config
    return ep_config(all_to_all, "analytical", {
        "num_prompts": 20, "request_rate": 40,
        "dataset": {"kind": "random", "input_len": 128, "output_len": 8}}, tenant_traffic=[
            {"src_gpu": 0, "dst_gpu": 2, "rate_gbps": 100, "message_bytes": 1_000_000,
             "stop_s": 0.02}])


@pytest.mark.parametrize("case", [
    ("examples/cluster/moe_ep_8node.yaml", 40),        # four expert-parallel groups at once
    ("examples/cluster/dense_pp_8node.yaml", 40),      # pipeline stages across nodes
    ("examples/cluster/pd_disaggregation.yaml", 30),   # KV-cache transfers sent from Python
    "pd_expert_parallel",                              # both
    "direct", "hierarchical",                          # TP inside EP, and a tenant
])
def test_cluster_runs_are_the_same_with_step_dags_run_as_jobs(case, monkeypatch):
    cfg = (_pd_expert_parallel() if case == "pd_expert_parallel"
           else _tp_expert_parallel(case) if isinstance(case, str) else _cluster(*case))
    jobs = []
    start = CompiledAnalyticalFabric.start_job

    def counted(self, run, *args):
        jobs.append(len(run.dag))
        return start(self, run, *args)
    monkeypatch.setattr(CompiledAnalyticalFabric, "start_job", counted)
    compacted = []
    compact = CompiledAnalyticalFabric._compact
    monkeypatch.setattr(CompiledAnalyticalFabric, "_compact",
                        lambda self: (compacted.append(1), compact(self)))
    make = cluster_build.make_fabric
    results = []
    for compiled in (True, False):
        monkeypatch.setattr(cluster_build, "make_fabric",
                            lambda *a, forced=compiled, **k: make(*a, **{**k,
                                                                       "compiled": forced}))
        results.append(json.dumps(simulate(cfg), sort_keys=True, default=str))
    assert results[0] == results[1]
    assert jobs                      # the steps ran as jobs (after their queue pairs' first)
    if "moe_ep" in case[0]:
        assert compacted             # groups overlap: the finished jobs' rows were reused


def test_the_compiled_fabric_is_taken_for_expert_parallel_groups_across_nodes(monkeypatch):
    made = []
    make = cluster_build.make_fabric
    monkeypatch.setattr(cluster_build, "make_fabric",
                        lambda *a, **k: made.append(make(*a, **k)) or made[-1])
    simulate(_cluster("examples/cluster/moe_ep_8node.yaml", 3))
    simulate(_cluster("examples/cluster/dense_pp_8node.yaml", 3))
    assert [type(f) for f in made] == [CompiledAnalyticalFabric, AnalyticalFabric]


def test_a_step_with_an_unrouted_queue_pair_runs_as_dag_run(monkeypatch):
    """The first step of a group fixes its queue pairs' routes message by message (as
    `DagRun`); later steps are jobs."""
    python = []
    fallback = compiled_module.CompiledDagRun._start_python
    monkeypatch.setattr(compiled_module.CompiledDagRun, "_start_python",
                        lambda self: (python.append(len(self.dag)), fallback(self)))
    simulate(_cluster("examples/cluster/moe_ep_8node.yaml", 5))
    assert python


# --- step DAGs as jobs, against DagRun on AnalyticalFabric ------------------------------------

GPUS = 8            # two GPUs a node, each with its own NIC (host)
DURATIONS = [1e-5, 3e-5, 3e-5, 1e-4]


def _runtime(fabric):
    """The parts of a ClusterRuntime its port and sends use, around `fabric`."""
    from simcore.cluster.runtime import ClusterRuntime, _Port

    class Placement:
        node_of = staticmethod(lambda g: g // 2)

    class Network:
        num_gpus = GPUS
        gpu_host = list(fabric.topology.hosts[:GPUS])

    rt = ClusterRuntime.__new__(ClusterRuntime)
    rt.fabric, rt.placement, rt.network = fabric, Placement(), Network()
    rt.fabric_timed, rt._flow_keys, rt._kick = True, {}, None
    if hasattr(fabric, "start_job"):
        fabric.on_job_send = rt._kicked
    return _Port(rt, 5e10)


@st.composite
def _step_dags(draw):
    """Lanes of one GPU each exchanging messages (across nodes and inside one, some empty)
    between compute ops, over a few layers; the same structure with new sizes and durations
    for each of several steps, each starting at its own time."""
    from simcore.dag.graph import COMPUTE_STREAM, Lane, StepDag
    lanes = [Lane(f"lane {g}", (g,), 0, 0) for g in range(GPUS)]
    layers = draw(st.integers(1, 3))
    pairs = [draw(st.lists(st.tuples(st.integers(0, GPUS - 1), st.integers(0, GPUS - 1))
                           .filter(lambda p: p[0] != p[1]), min_size=1, max_size=10,
                           unique=True)) for _ in range(layers)]
    steps = []
    for _ in range(draw(st.integers(2, 5))):
        dag = StepDag(lanes)
        ready = {g: () for g in range(GPUS)}
        for layer in pairs:
            for g in range(GPUS):
                # Durations and starts from a few values: ties at one instant, which the
                # stop and the heaps' order decide.
                ready[g] = (dag.compute(g, "attention", draw(st.sampled_from(DURATIONS)),
                                        ready[g]),)
            got = {g: [] for g in range(GPUS)}
            for src, dst in layer:
                size = draw(st.sampled_from([0, 1, 4096, 70_000, 2_000_000]))
                got[dst].append(dag.transfer(src, "dispatch", src, dst, size,
                                             draw(st.sampled_from([0.0, 2e-6])), ready[src],
                                             src // 2 != dst // 2))
            for g in range(GPUS):
                ready[g] = (dag.barrier(g, "dispatch", ready[g] + tuple(got[g]),
                                        COMPUTE_STREAM),)
        steps.append((draw(st.sampled_from([0.0, 1e-4, 2e-4, 2e-4, 3.5e-4])), dag))
    return sorted(steps, key=lambda s: s[0])


def _run_steps(fabric_cls, steps, stop_early):
    from simcore.dag.executor import DagRun
    fab = fabric_cls(__import__("simcore.fabric.topology", fromlist=["x"]).leaf_spine(
        4, 4, 2, host_rate_bps=100e9, delay_s=1e-6, spine_rate_bps=50e9))
    port = _runtime(fab)
    run_cls = compiled_module.CompiledDagRun if fabric_cls is CompiledAnalyticalFabric else DagRun
    woken = [False]
    said: list = []
    runs = []

    def complete(run):
        said.append(("complete", next(k for k, r in enumerate(runs) if r is run), run.end_s,
                      fab.now_s))
        woken[0] = True

    def pump(until):
        while True:
            woken[0] = False
            t = fab.run(until, stop=(lambda: woken[0]) if stop_early else None)
            nxt = fab.next_event_s()
            said.append(("run", t, nxt))
            if nxt == float("inf") or (until is not None and nxt > until):
                return

    for t0, dag in steps:
        pump(t0)
        run = run_cls(dag, t0, port, complete)
        runs.append(run)
        run.start()
    pump(None)
    stats = fab.stats()
    return said, [(r.done, r.end_s, list(r.start_s), list(r.finish_s), list(r.ideal_s),
                   list(r.cause), r.exposure()) for r in runs], (
        list(stats.messages), [ls.busy_s for ls in stats.links], stats.utilization,
        stats.duration_s)


@settings(max_examples=60, deadline=None)
@given(_step_dags(), st.booleans())
def test_step_dags_run_as_jobs_as_dag_run_runs_them(steps, stop_early):
    assert (_run_steps(CompiledAnalyticalFabric, steps, stop_early)
            == _run_steps(AnalyticalFabric, steps, stop_early))


def test_a_stop_holds_after_a_tie_with_a_finished_step():
    """Two steps' messages arrive at one instant; the first completes its step (the stop turns
    on), the second does not complete its own: the run stops there, not at the later message
    (a job's delivery checks the stop as `AnalyticalFabric.run` checks it after a callback)."""
    from simcore.dag.graph import COMPUTE_STREAM, Lane, StepDag
    lanes = [Lane(f"lane {g}", (g,), 0, 0) for g in range(GPUS)]

    def step(src, dst, then):
        dag = StepDag(lanes)
        x = dag.transfer(src, "dispatch", src, dst, 70_000, 0.0, (), True)
        if then:
            c = dag.compute(dst, "attention", 3e-5, (x,))
            dag.barrier(dst, "dispatch", (dag.transfer(dst, "dispatch", dst, src, 70_000, 0.0,
                                                       (c,), True),), COMPUTE_STREAM)
        return dag
    # The first two route the queue pairs (as a group's first step does), the last two tie.
    steps = [(0.0, step(0, 2, True)), (0.0, step(4, 6, True)), (1e-3, step(0, 2, False)),
             (1e-3, step(4, 6, True))]
    said, runs, stats = _run_steps(CompiledAnalyticalFabric, steps, True)
    assert (said, runs, stats) == _run_steps(AnalyticalFabric, steps, True)
    # After the third step completes, the run call returns at that instant with the fourth
    # step's return message still ahead.
    (third,) = [k for k, s in enumerate(said) if s[0] == "complete" and s[1] == 2]
    tie = said[third][3]
    assert said[third + 1][0] == "run" and said[third + 1][1] == tie < said[third + 1][2]


def test_a_trace_of_steps_run_as_jobs_is_the_same(monkeypatch):
    from simcore.simulate import simulate_run
    cfg = _cluster("examples/cluster/moe_ep_8node.yaml", 20)
    c = cfg.cluster
    cfg = cfg.model_copy(update={"cluster": c.model_copy(update={
        "trace": c.trace.model_copy(update={"first_step": 3, "num_steps": 4})})})
    make = cluster_build.make_fabric
    traces = []
    for compiled in (True, False):
        monkeypatch.setattr(cluster_build, "make_fabric",
                            lambda *a, forced=compiled, **k: make(*a, **{**k,
                                                                       "compiled": forced}))
        traces.append(json.dumps(simulate_run(cfg).trace))
    assert traces[0] == traces[1] and len(traces[0]) > 1000
