"""The step-DAG executor on a hand-built DAG: exact start and finish of every node, stream order,
fabric transfers that resolve only when the fabric delivers them, the exposure of idle stream time
by cause and its congestion part, and overlap of compute with communication on its own stream."""

import heapq
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import simcore.dag.exposure as exposure
from simcore.dag.executor import DagRun
from simcore.dag.graph import (COMM_STREAM, COMPUTE, COMPUTE_STREAM, LOCAL, TRANSFER, Lane,
                               StepDag)

NVLINK_BYTES_PER_S = 1000.0


class FakePort:
    """A TransferPort whose fabric delivers each message `delay_s(size)` after it starts (ideal:
    `ideal_s(size)`), in time order when `deliver()` is called, like a backend's run loop;
    NVLink takes size / NVLINK_BYTES_PER_S. Two GPUs per node."""

    def __init__(self, delay_s=lambda size: 2.0, ideal_s=lambda size: 1.5) -> None:
        self.delay_s, self.ideal_s = delay_s, ideal_s
        self.sent: list[tuple[int, int, int, float]] = []
        self._heap: list = []
        self._seq = itertools.count()
        self.now_s = 0.0

    def node_of(self, gpu: int) -> int:
        return gpu // 2

    def nvlink_s(self, size_bytes: int, gpu: int | None = None) -> float:
        return size_bytes / NVLINK_BYTES_PER_S

    def send(self, src_gpu, dst_gpu, size_bytes, at_s, on_done, arg, channel="") -> None:
        assert at_s >= self.now_s, "a send behind the fabric clock"
        self.sent.append((src_gpu, dst_gpu, size_bytes, at_s))
        heapq.heappush(self._heap, (at_s + self.delay_s(size_bytes), next(self._seq),
                                    self.ideal_s(size_bytes), on_done, arg))

    def deliver(self) -> None:
        while self._heap:
            end, _, ideal, on_done, arg = heapq.heappop(self._heap)
            self.now_s = end
            on_done(arg, end, ideal)


def two_stage_lanes() -> list[Lane]:
    """Stage 0 on GPUs 0, 1 (node 0); stage 1 on GPUs 2, 3 (node 1)."""
    return [Lane("engine 0 / stage 0", (0, 1), 0, 0), Lane("engine 0 / stage 1", (2, 3), 0, 1)]


def pipeline_dag() -> tuple[StepDag, dict[str, int]]:
    """Stage 0 computes, all-reduces inside its node, moves 1000 B over NVLink and 500 B across
    the fabric to stage 1, which computes meanwhile, waits for the data, then computes again."""
    dag = StepDag(two_stage_lanes())
    n = {}
    n["a"] = dag.compute(0, "attention", 1.0)
    n["b"] = dag.compute(1, "attention", 2.0)
    n["c"] = dag.local(0, "all_reduce", 0.5, (n["a"],))
    n["d"] = dag.transfer(0, "pp_send", 0, 1, 1000, 0.125, (n["c"],), False)
    n["e"] = dag.transfer(0, "pp_send", 1, 2, 500, 0.25, (n["d"],), True)
    n["f"] = dag.barrier(1, "pp_send", (n["e"],), COMPUTE_STREAM)
    n["g"] = dag.compute(1, "mlp", 1.0, (n["f"],))
    return dag, n


def test_graph_records_kinds_streams_and_stream_order():
    dag, n = pipeline_dag()
    assert len(dag) == 7
    assert [dag.kind[i] for i in range(7)] == [COMPUTE, COMPUTE, LOCAL, TRANSFER, TRANSFER, LOCAL,
                                              COMPUTE]
    assert dag.stream == [COMPUTE_STREAM, COMPUTE_STREAM, COMPUTE_STREAM, -1, -1,
                          COMPUTE_STREAM, COMPUTE_STREAM]
    # Each node on a lane's stream follows the one placed there before it; transfers have none.
    assert dag.stream_dep == [-1, -1, n["a"], -1, -1, n["b"], n["f"]]
    assert dag.dur_s[n["f"]] == 0.0 and dag.deps[n["f"]] == (n["e"],)


def test_every_node_starts_and_finishes_at_its_exact_time():
    dag, n = pipeline_dag()
    port = FakePort()
    completed = []
    run = DagRun(dag, 10.0, port, completed.append)
    run.start()
    # Everything up to the fabric transfer is resolved at once; the rest waits for the fabric.
    assert not run.done and completed == []
    assert port.sent == [(1, 2, 500, 12.875)]
    port.deliver()
    assert run.done and completed == [run]
    expected = {            # (start, finish)
        "a": (10.0, 11.0),
        "b": (10.0, 12.0),
        "c": (11.0, 11.5),        # after a: data and stream order
        "d": (11.625, 12.625),    # c + 0.125 latency; 1000 B over NVLink at 1000 B/s
        "e": (12.875, 14.875),    # d + 0.25 latency; the fabric delivers 2 s later
        "f": (14.875, 14.875),    # the wait on stage 1's stream: zero length
        "g": (14.875, 15.875),
    }
    for name, (start, finish) in expected.items():
        assert (run.start_s[n[name]], run.finish_s[n[name]]) == (start, finish), name
    assert run.ideal_s[n["e"]] == 1.5
    assert run.end_s == 15.875


def test_exposure_splits_idle_stream_time_by_cause():
    dag, n = pipeline_dag()
    port = FakePort()
    run = DagRun(dag, 10.0, port)
    run.start()
    port.deliver()
    busy, by_cause, congestion = run.exposure()
    assert busy == [1.0, 3.0]
    assert by_cause == {
        "all_reduce/nvlink": 0.5,          # the local collective ran on stage 0's stream
        "pipeline": 15.875 - 11.5,         # stage 0 idle after its last op, until the step ends
        "pp_send/fabric": 14.875 - 12.0,   # stage 1 waited for the fabric transfer
    }
    # The fabric transfer took 2 s where 1.5 s was ideal.
    assert congestion == 0.5
    # Every lane's wall time is compute plus exposed time.
    assert sum(busy) + sum(by_cause.values()) == pytest.approx(2 * (run.end_s - run.t0_s),
                                                               rel=1e-15)


def test_congestion_counts_the_whole_critical_path_of_a_wait():
    """A congested fabric transfer followed by an NVLink hop (as in a ring's last step or a
    hierarchical collective's intra-node all-gather): the wait ends with the NVLink transfer, yet
    its congestion is the fabric transfer's excess."""
    dag = StepDag([Lane("engine 0 / stage 0", (0, 1, 2, 3), 0, 0)])
    a = dag.compute(0, "attention", 1.0)
    x = dag.transfer(0, "all_reduce", 1, 2, 100, 0.0, (a,), True)      # across nodes
    y = dag.transfer(0, "all_reduce", 2, 3, 250, 0.0, (x,), True)      # inside node 1
    w = dag.barrier(0, "all_reduce", (y,), COMPUTE_STREAM)
    dag.compute(0, "mlp", 1.0, (w,))
    port = FakePort(delay_s=lambda size: 3.0, ideal_s=lambda size: 1.0)
    run = DagRun(dag, 0.0, port)
    run.start()
    port.deliver()
    assert (run.start_s[x], run.finish_s[x]) == (1.0, 4.0)
    assert (run.start_s[y], run.finish_s[y]) == (4.0, 4.25)
    assert run.end_s == 5.25
    busy, by_cause, congestion = run.exposure()
    assert busy == [2.0]
    assert by_cause == {"all_reduce/fabric": 3.25}
    assert congestion == 2.0


def test_a_wait_on_a_slower_lane_of_the_same_stage_is_sync():
    lanes = [Lane("engine 0 / stage 0", (0,), 0, 0), Lane("engine 1 / stage 0", (2,), 1, 0)]
    dag = StepDag(lanes)
    a = dag.compute(0, "attention", 1.0)
    b = dag.compute(1, "attention", 3.0)
    dag.compute(0, "experts", 1.0, (b,))
    run = DagRun(dag, 0.0, FakePort())
    run.start()
    assert run.done and run.end_s == 4.0
    assert run.start_s[2] == 3.0 and run.cause[2] == b and run.cause[a] == -1
    busy, by_cause, congestion = run.exposure()
    assert busy == [2.0, 3.0]
    assert by_cause == {"sync": 2.0 + 1.0}      # lane 0 waited 2 s, lane 1 idle 1 s at the end
    assert congestion == 0.0


@pytest.mark.parametrize("stream, times, exposed", [
    # On its own stream the all-reduce overlaps the other micro-batch's compute; the stream
    # waits only for what is left of it.
    (COMM_STREAM, [(0.0, 1.0), (1.0, 3.0), (1.0, 2.0), (3.0, 4.0)], 1.0),
    # On the compute stream it runs in line: the independent compute waits behind it.
    (COMPUTE_STREAM, [(0.0, 1.0), (1.0, 3.0), (3.0, 4.0), (4.0, 5.0)], 2.0),
])
def test_communication_on_its_own_stream_overlaps_independent_compute(stream, times, exposed):
    dag = StepDag([Lane("engine 0 / stage 0", (0, 1), 0, 0)])
    a = dag.compute(0, "attention", 1.0)
    x = dag.local(0, "all_reduce", 2.0, (a,), stream)
    b = dag.compute(0, "attention", 1.0)            # the other micro-batch: independent of x
    c = dag.compute(0, "mlp", 1.0, (x,))
    run = DagRun(dag, 0.0, FakePort())
    run.start()
    assert [(run.start_s[i], run.finish_s[i]) for i in (a, x, b, c)] == times
    assert run.end_s == times[-1][1]
    busy, by_cause, congestion = run.exposure()
    assert busy == [3.0]
    assert by_cause == {"all_reduce/nvlink": exposed}
    assert congestion == 0.0


def test_empty_transfers_and_empty_dags_take_no_time():
    dag = StepDag(two_stage_lanes())
    a = dag.compute(0, "attention", 1.0)
    t = dag.transfer(0, "pp_send", 1, 2, 0, 0.25, (a,), True)      # zero bytes: not sent
    port = FakePort()
    run = DagRun(dag, 5.0, port)
    run.start()
    assert port.sent == [] and run.done
    assert (run.start_s[t], run.finish_s[t]) == (6.25, 6.25)
    empty = DagRun(StepDag([]), 7.0, port)
    empty.start()
    assert empty.done and empty.end_s == 7.0


# --- property: the executor is the DAG's longest path --------------------------------------------

@st.composite
def random_dags(draw):
    num_lanes = draw(st.integers(1, 3))
    lanes = [Lane(f"lane {i}", (2 * i, 2 * i + 1), 0, draw(st.integers(0, 1)))
             for i in range(num_lanes)]
    dag = StepDag(lanes)
    for i in range(draw(st.integers(1, 25))):
        deps = tuple(sorted(draw(st.sets(st.integers(0, i - 1), max_size=3)))) if i else ()
        lane = draw(st.integers(0, num_lanes - 1))
        kind = draw(st.sampled_from(["compute", "local", "transfer", "barrier"]))
        dur = draw(st.integers(0, 8)) / 4
        if kind == "compute":
            dag.compute(lane, "attention", dur, deps)
        elif kind == "local":
            dag.local(lane, "all_reduce", dur, deps, draw(st.sampled_from([0, 1])))
        elif kind == "barrier":
            dag.barrier(lane, "all_reduce", deps, draw(st.sampled_from([0, 1])))
        else:
            src = draw(st.integers(0, 2 * num_lanes - 1))
            dst = draw(st.integers(0, 2 * num_lanes - 1).filter(lambda g: g != src))
            size = draw(st.integers(0, 4)) * 250
            dag.transfer(lane, "pp_send", src, dst, size, draw(st.integers(0, 2)) / 8, deps,
                         src // 2 != dst // 2)
    return dag


def _longest_path(dag: StepDag, t0: float, port: FakePort) -> tuple[list[float], list[float]]:
    start, finish = [], []
    for i in range(len(dag)):
        preds = list(dag.deps[i]) + ([dag.stream_dep[i]] if dag.stream_dep[i] >= 0 else [])
        ready = max([t0] + [finish[d] for d in preds])
        if dag.kind[i] == TRANSFER:
            s = ready + dag.latency_s[i]
            size = dag.size_bytes[i]
            if size == 0:
                f = s
            elif port.node_of(dag.src[i]) != port.node_of(dag.dst[i]):
                f = s + port.delay_s(size)
            else:
                f = s + port.nvlink_s(size)
        else:
            s = ready
            f = s + dag.dur_s[i]
        start.append(s)
        finish.append(f)
    return start, finish


@settings(max_examples=200, deadline=None)
@given(random_dags())
def test_executor_times_are_the_longest_path_and_exposure_adds_up(dag):
    port = FakePort(delay_s=lambda size: size / 200 + 0.5, ideal_s=lambda size: size / 400)
    run = DagRun(dag, 1.0, port)
    run.start()
    port.deliver()
    assert run.done
    start, finish = _longest_path(dag, 1.0, port)
    assert run.start_s == start and run.finish_s == finish
    assert run.end_s == max(finish + [1.0])
    busy, by_cause, congestion = run.exposure()
    assert_walk_is_its_python_source(run, (busy, by_cause, congestion))
    # A lane's stream ops run in order, so its compute plus its exposed time is the step.
    span = len(dag.lanes) * (run.end_s - run.t0_s)
    assert sum(busy) + sum(by_cause.values()) == pytest.approx(span, rel=1e-12, abs=1e-12)
    fabric = sum(v for k, v in by_cause.items() if k.endswith("/fabric"))
    assert 0.0 <= congestion <= fabric + 1e-12


def test_a_wait_on_a_transfer_counts_as_communication_only_after_its_sender_computed():
    # Stage 1 is idle from 0; stage 0 computes until 10, then its 500 B cross the fabric in 2
    # (ideal 1.5): stage 1 waited 10 for stage 0 (pipeline) and 2 for the fabric, 0.5 of it
    # congestion; stage 0 then idles 3 until the step ends (pipeline too).
    dag = StepDag(two_stage_lanes())
    a = dag.compute(0, "attention", 10.0)
    t = dag.transfer(0, "pp_send", 0, 2, 500, 0.0, (a,), True)
    w = dag.barrier(1, "pp_send", (t,), COMPUTE_STREAM)
    dag.compute(1, "mlp", 1.0, (w,))
    port = FakePort()
    run = DagRun(dag, 0.0, port)
    run.start()
    port.deliver()
    assert run.done and run.end_s == pytest.approx(13.0)
    busy, causes, congestion = run.exposure()
    assert busy == [10.0, 1.0]
    assert causes == pytest.approx({"pipeline": 10.0 + 3.0, "pp_send/fabric": 2.0})
    assert congestion == pytest.approx(0.5)
    assert run.lane_comm_s == pytest.approx([0.0, 2.0])


EXPOSURE = DagRun.exposure


def assert_walk_is_its_python_source(run: DagRun, got) -> None:
    """`run.exposure()` (compiled: `got`, with `run.lane_comm_s`) is what the walk's Python
    source gives, to the bit, causes in the same order."""
    comm = list(run.lane_comm_s)
    compiled = exposure._compiled
    exposure._compiled = exposure.walk
    try:
        want = EXPOSURE(run)
    finally:
        exposure._compiled = compiled
    assert got == want and list(got[1]) == list(want[1]) and comm == run.lane_comm_s


def test_compiled_exposure_is_the_python_walk_in_a_cluster_run(monkeypatch):
    # Over every step of the shipped expert-parallel example (all-to-alls across 8 nodes, DeepEP
    # relays: waits that are part another lane's compute, part the fabric), the compiled walk
    # gives what the Python walk gives, to the bit: busy and communication time by lane, the
    # causes in the order first met, the congestion.
    from pathlib import Path

    from simcore.config import load_config
    from simcore.simulate import simulate

    compiled = DagRun.exposure
    seen = []

    def both(run):
        got = compiled(run)
        assert_walk_is_its_python_source(run, got)
        seen.append(len(got[1]))
        return got

    monkeypatch.setattr(DagRun, "exposure", both)
    cfg = load_config(Path(__file__).parents[1] / "examples/cluster/moe_ep_8node.yaml")
    c = cfg.cluster
    simulate(cfg.model_copy(update={
        "cluster": c.model_copy(update={"fabric": c.fabric.model_copy(
            update={"backend": "analytical"})}),
        "workload": cfg.workload.model_copy(update={"num_prompts": 10})}))
    assert len(seen) > 200 and max(seen) >= 3
