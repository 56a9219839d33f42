"""Quiet steps taken together (`simcore.serve.quiet`) give exactly what stepping one at a time
gives: the same records, counters, samples and scheduler state, bit for bit."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest
import simpy

import simcore.serve.loop as loop
from simcore.serve import observers
from simcore.compute.base import StepShape, StepTime
from simcore.config import load_config
from simcore.engine.request import FINISHED, Request
from simcore.engine.scheduler import Scheduler, SchedulerConfig
from simcore.serve import run_serving
from simcore.serve import quiet
from simcore.serve.horizon import InertTimeout
from simcore.serve.quiet import QuietLeap, QuietRun, StepColumns
from simcore.simulate import simulate
from simcore.workload.spec import RequestSpec

ROOT = Path(__file__).resolve().parent.parent


class KvStep:
    """Stub step model whose time grows with tokens, sequences and KV read (so every step of a
    quiet run has its own time), with an irrational-looking base so that sums round."""

    profile_id = "stub/kv"
    calibrated = False
    relative_uncertainty = 0.0

    def step_time(self, shape: StepShape) -> StepTime:
        t = 0.0031 + 1.7e-5 * shape.num_tokens + 3.1e-6 * shape.num_seqs \
            + 1.3e-8 * shape.kv_tokens_read
        return StepTime(total_s=t, compute_s=t, comm_s=0.0, bound="memory")


def specs(seed: int, n: int, *, rate: float, shared: bool) -> list[RequestSpec]:
    rng = random.Random(seed)
    out = []
    t = 0.0
    for i in range(n):
        t += rng.expovariate(rate)
        p = rng.randint(1, 600)
        keys = tuple(rng.randint(0, 3) if shared and k < 4 else rng.getrandbits(60)
                     for k in range(p // 16))
        out.append(RequestSpec(f"r{i}", t, p, rng.randint(1, 300), keys,
                               priority=rng.randint(0, 2)))
    return out


class DyadicStep:
    """Stub step model whose times are multiples of 2**-9 s: every step end and every sample
    time is exact, so steps end at the very instant of samples."""

    profile_id = "stub/dyadic"
    calibrated = False
    relative_uncertainty = 0.0

    def step_time(self, shape: StepShape) -> StepTime:
        t = (4 + shape.num_seqs % 3 + (shape.num_tokens > shape.num_seqs)) / 512
        return StepTime(total_s=t, compute_s=t, comm_s=0.0, bound="memory")


def run(reqs, leaps: bool, *, replicas=1, router="round_robin", max_concurrency=None,
        timeout=None, server=False, latency_s=0.002, sample_s=0.5, step_model=None,
        tokenize=False, servers=1, **sched):
    old = loop.QUIET_LEAPS
    loop.QUIET_LEAPS = leaps
    try:
        cfg = dict(max_num_seqs=32, max_num_batched_tokens=512, num_blocks=800, block_size=16,
                   max_model_len=1024)
        cfg.update(sched)
        r = run_serving(list(reqs), sched_config=SchedulerConfig(**cfg), num_replicas=replicas,
                        step_model=step_model or KvStep(), router_policy=router,
                        report_interval_s=0.05, balance_threshold=4,
                        max_concurrency=max_concurrency,
                        max_model_len=cfg["max_model_len"], sample_interval_s=sample_s,
                        request_timeout_s=timeout,
                        request_cpu_s=(lambda p: 1e-4 + 1e-6 * p) if server else None,
                        request_latency_s=latency_s if server else 0.0,
                        request_tokenize_s=(lambda p: 2e-5 * p) if tokenize else None,
                        api_servers=servers)
    finally:
        loop.QUIET_LEAPS = old
    return r


def canonical_hashes(pool) -> list:
    """The pool's blocks grouped by content, hashes renamed in block order: engines share one
    hash space, whose labels for blocks unique to a request follow the order engines reach
    them, which a quiet run may change; which blocks hold the same content may not."""
    names: dict[int, int] = {}
    for h in pool.block_hash:
        if h and h not in names:
            names[h] = len(names)
    return [[names.get(h, 0) for h in pool.block_hash],
            sorted((names[h], blocks) for h, blocks in pool.cached.items())]


def snapshot(r) -> str:
    """Everything a run produced, as text compared byte for byte."""
    recs = [{k: getattr(x, k) for k in x.__slots__} if hasattr(x, "__slots__") else vars(x)
            for x in r.records]
    pools = [(s.kv.pool.free_queue(), canonical_hashes(s.kv.pool), s.kv.pool.num_evictions,
              s.num_steps, s.kv.num_hit_blocks) for s in r.schedulers]
    return json.dumps([recs, [vars(x) if not hasattr(x, "__slots__") else
                              {k: getattr(x, k) for k in x.__slots__} for x in r.replicas],
                       vars(r.timeseries) if not hasattr(r.timeseries, "__slots__") else
                       {k: getattr(r.timeseries, k) for k in r.timeseries.__slots__},
                       pools, r.end_s, r.num_routed_by_prefix], default=repr)


@pytest.fixture
def counted(monkeypatch):
    """Counts the quiet runs, the steps taken in them (as planned), the runs whose last step is
    waited for from its start (`spans`: a step spanning a hand-off, or any run's last step), and the runs cut by a request sent to their engine (`cuts`, with
    the steps they dropped, `dropped`, and `cut_spans`, the cuts that kept a spanning step)."""
    seen = {"runs": 0, "steps": 0, "spans": 0, "cuts": 0, "dropped": 0, "cut_spans": 0}
    plan = QuietLeap.plan
    cut = QuietRun.cut

    def counting(self, last):
        got = plan(self, last)
        if got is not None:
            seen["runs"] += 1
            seen["steps"] += got.num_steps
            seen["spans"] += got.span_s is not None
        return got

    def cutting(self, env, reach_s, span=False, made_s=None, made_before_s=None):
        before = self.num_steps
        spanned = self.span_s
        cut(self, env, reach_s, span, made_s, made_before_s)
        seen["cuts"] += self.num_steps < before
        seen["dropped"] += before - self.num_steps
        seen["cut_spans"] += self.span_s is not None and (spanned is None
                                                          or self.num_steps < before)

    monkeypatch.setattr(QuietLeap, "plan", counting)
    monkeypatch.setattr(QuietRun, "cut", cutting)
    return seen


CASES = {       # (serving settings, scheduler settings)
    "one engine": ({}, {}),
    "four engines, prefix affinity": (dict(replicas=4, router="prefix_affinity"), {}),
    "least outstanding, API server path": (dict(replicas=2, router="least_outstanding",
                                                server=True), {}),
    "API server path, 30 ms of latency": (dict(replicas=2, server=True, latency_s=0.03), {}),
    "max concurrency": (dict(replicas=2, max_concurrency=12), {}),
    "client timeout": (dict(timeout=2.5), {}),
    "small pool, preemptions": ({}, dict(num_blocks=120, max_num_seqs=64)),
    "priority, watermark": (dict(replicas=2), dict(policy="priority", watermark=0.05)),
    "no prefix caching": ({}, dict(enable_prefix_caching=False)),
    "short max_model_len": ({}, dict(max_model_len=640)),
    # Arrivals pass runs and cut the chosen engine's; the server's work counts for the engines
    # its requests are bound for.
    "three engines, tokenizer, two API servers": (
        dict(replicas=3, router="prefix_affinity", server=True, latency_s=0.01, tokenize=True,
             servers=2), {}),
    "four engines, API server path, max concurrency": (
        dict(replicas=4, router="least_outstanding", server=True, latency_s=0.02,
             max_concurrency=14), {}),
    "three engines, API server path, small pool": (
        dict(replicas=3, server=True, latency_s=0.005, tokenize=True), dict(num_blocks=150)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_runs_match_single_steps_bit_for_bit(name, counted):
    serving, sched = CASES[name]
    reqs = specs(7, 160, rate=6.0, shared=True)
    single = run(reqs, False, **serving, **sched)
    assert counted["steps"] == 0
    together = run(reqs, True, **serving, **sched)
    assert snapshot(together) == snapshot(single)
    # The comparison means something only where runs were taken.
    total = sum(s.num_steps for s in together.schedulers)
    assert counted["runs"] > 0 and counted["steps"] > 0.2 * total, (counted, total)
    if serving.get("server"):
        # Sends cut runs, keeping the step begun before the request could reach its engine.
        assert counted["cut_spans"] > 0, counted


@pytest.mark.parametrize("name", ["one engine", "four engines, prefix affinity",
                                  "API server path, 30 ms of latency", "small pool, preemptions"])
@pytest.mark.parametrize("sample_s,model", [(0.013, None), (2 ** -4, DyadicStep()),
                                            (2 ** -6, DyadicStep())])
@pytest.mark.parametrize("compiled", [False, True])
def test_samples_inside_runs_read_the_engine_as_single_steps(name, sample_s, model, compiled,
                                                           counted, monkeypatch):
    """Samples of the engines' state pass quiet runs: an engine inside one is read as single
    stepping shows it (its blocks allocated up to the running step), and a run stops before a
    step that would end at the very instant of a sample (dyadic step times, where steps and
    samples meet exactly)."""
    serving, sched = CASES[name]
    reqs = specs(11, 160, rate=6.0, shared=True)
    if model is not None:       # arrivals on the same grid as the steps
        reqs = [dataclasses.replace(r, arrival_s=round(r.arrival_s * 128) / 128) for r in reqs]
        serving = {**serving, "latency_s": 2 ** -5}
    ties = {"samples": 0, "inside": 0, "cut": 0}
    sampled = observers.TimeSeriesSampler.process

    def counting(self):
        for event in sampled(self):
            ties["samples"] += 1
            ties["inside"] += sum(r.quiet is not None for r in self.ranks)
            yield event

    monkeypatch.setattr(observers.TimeSeriesSampler, "process", counting)
    tie_of = quiet._sample_tie

    def tie(*args):
        got = tie_of(*args)
        ties["cut"] += got is not None
        return got

    monkeypatch.setattr(quiet, "_sample_tie", tie)
    single = run(reqs, False, **serving, **sched, sample_s=sample_s, step_model=model,
                 compiled=compiled)
    together = run(reqs, True, **serving, **sched, sample_s=sample_s, step_model=model,
                   compiled=compiled)
    assert snapshot(together) == snapshot(single)
    assert counted["runs"] > 0 and ties["inside"] > 0, (counted, ties)
    if model is not None and "API server" not in name:     # its work is not on the grid
        assert ties["cut"] > 0, ties


@pytest.mark.parametrize("name", list(CASES))
def test_the_compiled_block_pool_gives_the_same_runs(name):
    """Every case run with the block pool in arrays (`simcore.engine.array_pool`) as with the
    Python pool: records, replica counters, time series, free queues, prefix caches, evictions."""
    serving, sched = CASES[name]
    reqs = specs(7, 160, rate=6.0, shared=True)
    python = run(reqs, True, **serving, **sched)
    arrays = run(reqs, True, **serving, **sched, compiled=True)
    assert type(arrays.schedulers[0].kv.pool).__name__ == "ArrayBlockPool"
    assert snapshot(arrays) == snapshot(python)


@pytest.mark.parametrize("name", ["quickstart.yaml", "mooncake_prefix_affinity.yaml",
                                  "llama70b_h100_tp4_sharegpt.yaml"])
def test_compiled_kernels_give_the_same_results(name, monkeypatch):
    """A run with the engine's compiled kernels (the block pool in arrays, quiet runs timed at
    once) is byte-identical to one without, async scheduling included."""
    import simcore.simulate as sim

    cfg = load_config(ROOT / "examples" / name)
    variants = [cfg, cfg.model_copy(update={"engine": cfg.engine.model_copy(
        update={"async_scheduling": True})})]
    import simcore.compute.decode_steps as decode_steps

    compiled = decode_steps.compiled_steps
    runs = []

    def counting():
        runs.append(1)
        return compiled()

    for c in variants:
        python = json.dumps(simulate(c), sort_keys=True)
        monkeypatch.setattr(sim, "COMPILED_MIN_REQUESTS", 0)
        monkeypatch.setattr(decode_steps, "compiled_steps", counting)
        assert json.dumps(simulate(c), sort_keys=True) == python, name
        monkeypatch.undo()
    assert runs, "no quiet run was timed by the compiled kernel"


def test_shipped_examples_are_unchanged(counted):
    for name in ("quickstart.yaml", "mooncake_prefix_affinity.yaml"):
        cfg = load_config(ROOT / "examples" / name)
        loop.QUIET_LEAPS = False
        try:
            single = json.dumps(simulate(cfg), sort_keys=True)
        finally:
            loop.QUIET_LEAPS = True
        assert json.dumps(simulate(cfg), sort_keys=True) == single, name
    assert counted["steps"] > 0


def test_step_columns_read_as_step_times():
    """A compiled run's columns read as the StepTimes the decode timer gives (overhead the rest
    of the total, no all-to-all), cut as a run's list of them is, and read through views of other columns."""
    from simcore.compute.base import StepTime

    cols = StepColumns([1.0, 2.5, 4.0], [0.5, 2.0, 1.0], [0.25, 0.0, 0.5], [0, 1, 2])
    times = [StepTime(1.0, 0.5, 0.25, "compute", 0.25, 0.0),
             StepTime(2.5, 2.0, 0.0, "memory", 0.5, 0.0),
             StepTime(4.0, 1.0, 0.5, "communication", 2.5, 0.0)]
    assert len(cols) == 3 and list(cols) == times and cols[1] == times[1]
    first_two = StepColumns(*(c[:2] for c in (cols.total, cols.compute, cols.comm, cols.bound)))
    assert list(first_two) == times[:2]
    del cols[1:]
    assert list(cols) == times[:1] and list(first_two) == times[:2]


@pytest.mark.parametrize("seed", range(4))
def test_compiled_run_sums_equal_a_step_at_a_time(seed):
    """A compiled run's columns summed into the replica counters at once (`sum_steps`) give the
    floats, counts and dict key order of its StepTimes summed one at a time, runs after runs."""
    from types import SimpleNamespace

    from simcore.compute.decode_steps import BOUNDS
    from simcore.serve.observers import ReplicaCounters

    rng = random.Random(seed)
    by_columns, by_steps = ReplicaCounters(1), ReplicaCounters(1)
    rank = SimpleNamespace(index=0)
    for _ in range(6):
        k, num = rng.randint(1, 40), rng.randint(1, 64)
        bound = [rng.choice((0, 1, 1, 2) if seed % 2 else (1,)) for _ in range(k)]
        total = [rng.uniform(1e-4, 0.05) for _ in range(k)]
        compute = [t * rng.random() for t in total]
        comm = [t * rng.random() * 0.2 for t in total]
        cols = StepColumns(total, compute, comm, bound)
        by_columns.on_quiet_steps(rank, SimpleNamespace(requests=[None] * num, times=cols))
        by_steps.on_quiet_steps(rank, SimpleNamespace(requests=[None] * num, times=list(cols)))
    a, b = by_columns.stats[0], by_steps.stats[0]
    assert a == b
    assert list(a.steps_by_bound) == list(b.steps_by_bound)
    assert list(a.step_s_by_phase_bound) == list(b.step_s_by_phase_bound)
    assert set(a.steps_by_bound) <= set(BOUNDS)


def _decoding_scheduler(n: int, pool: int, seed: int) -> Scheduler:
    rng = random.Random(seed)
    s = Scheduler(SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=4096,
                                  num_blocks=pool, block_size=16, max_model_len=4096))
    for i in range(n):
        p = rng.randint(1, 200)
        keys = tuple(rng.randint(0, 1) if k < 2 else rng.getrandbits(60) for k in range(p // 16))
        s.add_request(Request(f"q{i}", i, p, rng.randint(100, 400), keys))
    while any(r.num_computed_tokens < r.num_tokens - 1 for r in s.running) or s.waiting.items:
        s.update(s.schedule())
    return s


def test_a_run_ends_with_a_request_s_last_token_or_where_blocks_run_out():
    s = _decoding_scheduler(10, 10_000, 1)
    left = [r.max_tokens - r.num_output_tokens for r in s.running]
    shortest = min(left)
    leap = QuietLeap(simpy.Environment(), s, KvStep().step_time, lambda: False)
    got = leap.plan(0.0)
    assert got.num_steps == shortest
    assert got.finished == [r for r, n in zip(s.running, left) if n == shortest]
    # Applied, those requests have finished (their blocks freed) and the others run on.
    leap.apply(got)
    assert all(r.status == FINISHED and r.request_id not in s.kv.req_blocks
               for r in got.finished)
    assert [r for r in got.requests if r not in got.finished] == s.running
    # With the pool nearly full the run is cut where the free blocks run out.
    s = _decoding_scheduler(10, 150, 2)
    free = s.kv.pool.num_free
    got = QuietLeap(simpy.Environment(), s, KvStep().step_time, lambda: False).plan(0.0)
    if got is not None:
        need = sum(max(0, -(-(r.num_computed_tokens + got.num_steps) // 16)
                       - len(s.kv.req_blocks[r.request_id])) for r in s.running)
        assert need <= free


def test_a_run_ends_before_the_next_external_event():
    s = _decoding_scheduler(6, 10_000, 3)
    env = simpy.Environment()
    env.timeout(0.05)             # e.g. the client's next arrival
    got = QuietLeap(env, s, KvStep().step_time, lambda: False).plan(0.0)
    assert got.ends_s[-1] < 0.05
    assert got.ends_s[-1] + KvStep().step_time(got.shapes[-1]).total_s >= 0.05 - 1e-3
    assert quiet.MIN_STEPS <= got.num_steps


def test_a_run_leaves_a_finishing_step_that_ties_with_an_event_to_single_stepping():
    """A load report due at the very end of the step where a request finishes reads the
    running count; which comes first is SimPy's order of queueing, which a run changes, so
    the run stops one step short of it."""
    s = _decoding_scheduler(10, 10_000, 1)
    shortest = min(r.max_tokens - r.num_output_tokens for r in s.running)
    plan = QuietLeap(simpy.Environment(), s, KvStep().step_time, lambda: False).plan(0.0)
    assert plan.num_steps == shortest and plan.finished
    env = simpy.Environment()
    InertTimeout(env, plan.ends_s[-1])         # e.g. the router's load report, inert
    got = QuietLeap(env, s, KvStep().step_time, lambda: False).plan(0.0)
    assert got.num_steps == shortest - 1 and not got.finished
    assert got.ends_s == plan.ends_s[:-1]
