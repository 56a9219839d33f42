"""Serving on the virtual clock: a benchmark client, a router and engine replicas under SimPy.

`run_serving` composes the parts: a `Frontend` (client, API server path, router, request
records), one `EngineLoop` per lock-step group over a `StepExecutor` (the step-time model, or
the step DAG over the cluster's fabric), and the observers that count the run
(`ReplicaCounters`, `TimeSeriesSampler`, `KvHandoff` when KV moves over the fabric).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import simpy

from simcore.compute.base import StepTimeModel
from simcore.engine.request import BlockHashSpace
from simcore.engine.scheduler import Scheduler, SchedulerConfig
from simcore.errors import ConfigError
from simcore.records import RecordStore
from simcore.router import Router
from simcore.serve.executor import DagExecutor, ModelExecutor
from simcore.serve.api_server import ApiServerPath
from simcore.serve.frontend import ClientSettings, Frontend, KvHandoff
from simcore.serve.loop import MAX_EMPTY_STEPS, EngineLoop, Rank
from simcore.serve.observers import (NetworkShares, ReplicaCounters, ReplicaStats, TimeSeries,
                                     TimeSeriesSampler)
from simcore.workload.generate import RequestStream
from simcore.workload.sessions import SessionOutcomes, SessionStream
from simcore.workload.spec import RequestSpec

__all__ = ["MAX_EMPTY_STEPS", "ApiServerPath", "ClientSettings", "ReplicaStats", "ServingRun",
           "TimeSeries", "run_serving"]


@dataclass(slots=True)
class ServingRun:
    """Raw outcome of a serving run, before summarising."""

    records: RecordStore
    """Every request's record, in request order (columns once the run has ended)."""
    replicas: list[ReplicaStats]
    timeseries: TimeSeries
    schedulers: list[Scheduler]
    end_s: float
    num_routed_by_prefix: int
    sessions: SessionOutcomes | None = None
    """How a session workload's sessions ended; None for independent requests."""
    session_turns: list[tuple[str, int]] | None = None
    """With sessions: record i's session id and 0-based turn."""
    num_routed_engines: int = 1
    """Engines the router sends requests to; with more than one they report their loads."""


def _scheduler(config: SchedulerConfig, space: BlockHashSpace, connector):
    """An engine's scheduler: the simulator's, or vLLM's own driven through a child process
    (`config.vllm`, engine.implementation vllm)."""
    if config.vllm is None:
        return Scheduler(config, space, connector)
    from simcore.engine.vllm_engine import VllmScheduler

    if connector is not None:
        raise ConfigError("engine.implementation vllm: KV connectors (P/D disaggregation, an "
                          "external KV tier) are not driven through vLLM")
    return VllmScheduler(config, config.vllm)


def run_serving(specs: Sequence[RequestSpec] | RequestStream | SessionStream, *,
                sched_config: SchedulerConfig, num_replicas: int, step_model: StepTimeModel, router_policy: str,
                report_interval_s: float, balance_threshold: int, max_concurrency: int | None,
                max_model_len: int, sample_interval_s: float,
                progress: Callable[[float, int, int], None] | None = None,
                lockstep_groups: list[tuple[int, ...]] | None = None,
                env: simpy.Environment | None = None, cluster=None,
                kv_paths=None, request_timeout_s: float | None = None,
                request_cpu_s: Callable[[int], float] | None = None,
                request_latency_s: float = 0.0, api_servers: int = 1,
                request_tokenize_s: Callable[[int], float] | None = None,
                request_template: tuple[int, tuple[int, ...]] = (0, ()),
                sched_configs: Sequence[SchedulerConfig] | None = None,
                router_options: Mapping[str, float] | None = None) -> ServingRun:
    """Serve `specs` (sorted by arrival) on `num_replicas` engines; return every request's record.

    `specs` is read once, in order, as the client reaches each request (a RequestStream makes
    them then); each request's record is made when it arrives. A SessionStream runs
    closed-loop sessions instead (`Frontend`): a turn's record is made when the turn arrives.

    A request whose prompt plus output exceeds `max_model_len` is refused at once, as vLLM's API
    server refuses it, and recorded as failed. With `request_timeout_s`, a request not finished
    that long after its send is given up by the client: aborted in the engine
    (`Scheduler.finish_requests`) and recorded as failed, its tokens left out of the metrics.
    Between a request's send and its arrival in the scheduler lies the API server's path
    (`ApiServerPath`) on one of `api_servers` server processes: its prompt's tokenization,
    `request_tokenize_s(prompt_len)`, on the process's tokenizer thread, one prompt after
    another (`TokenizerThread`); then its work on the event loop, `request_cpu_s(prompt_len)`,
    the loop sharing its CPU among the requests it works on (`SharedCpu`), so that a burst of
    requests reaches the engine together after all of their work; then `request_latency_s`,
    which every request pays concurrently. `request_template` (tokens, keys): what the API
    server's chat template adds to every prompt the engine sees (the records keep the client's
    counts), and the keys of the full blocks its shared leading tokens fill, which come first.
    `router_options`: the router's settings beyond `balance_threshold` (cache_aware's
    thresholds, `simcore.router.Router`).

    `lockstep_groups` (expert parallelism) partitions the replicas into groups that step
    together, timed by `step_model.step_time_group` (a `GroupStepTimeModel`): while any rank of
    a group has requests, every step each rank's scheduler plans its batch, a rank with nothing
    to run contributes a dummy batch, all wait for the group's step time, then each scheduler
    takes its outputs. Without it, every replica steps on its own.

    `cluster` (a `simcore.cluster.runtime.ClusterRuntime` on `env`) runs every step as a DAG
    over the cluster's fabric instead of timing it with `step_model`; the step ends when the
    DAG does. `kv_paths` (a `simcore.cluster.kvpaths.KvPaths`) gives engines KV connectors and
    moves KV caches over the fabric: with prefill/decode disaggregation the router sends each
    request to a prefill instance, which runs its prompt (max_tokens 1, its token not streamed);
    then a decode instance loads the KV and generates every output token; with an external KV
    tier, tier hits are fetched from the storage servers before the request is scheduled.
    `sched_configs` gives engine i its own `sched_configs[i]` (prefill and decode instances of
    different TP: their own KV-cache sizes); without it every engine has `sched_config`.
    """
    env = env or simpy.Environment()
    space = BlockHashSpace(compiled=sched_config.compiled)
    configs = [sched_config] * num_replicas if sched_configs is None else list(sched_configs)
    ranks = [Rank(i, _scheduler(configs[i], space,
                                kv_paths.connector(i, space) if kv_paths else None))
             for i in range(num_replicas)]
    entry = (kv_paths.prefill_instances() if kv_paths is not None and kv_paths.disaggregated
             else list(range(num_replicas)))
    router = Router(router_policy, len(entry), space=space, balance_threshold=balance_threshold,
                    block_size=sched_config.block_size, **(router_options or {}))
    kv = KvHandoff(kv_paths, ranks) if kv_paths is not None else None
    frontend = Frontend(env, specs, ranks, router, entry,
                        ClientSettings(max_model_len, max_concurrency, request_timeout_s),
                        ApiServerPath(request_cpu_s, request_latency_s, api_servers,
                                      request_tokenize_s, *request_template),
                        kv=kv, progress=progress)
    counters = ReplicaCounters(num_replicas)
    observers = (counters, *([NetworkShares()] if cluster is not None else []),
                 *([kv] if kv is not None else []), frontend)

    if lockstep_groups is None:
        groups = [(i,) for i in range(num_replicas)]
    else:
        members = sorted(i for g in lockstep_groups for i in g)
        if members != list(range(num_replicas)):
            raise ValueError(f"lockstep_groups must partition the {num_replicas} replicas, "
                             f"got {lockstep_groups}")
        groups = lockstep_groups
    if cluster is not None:
        executor = DagExecutor(cluster)
        cluster.start()
    elif lockstep_groups is not None:
        executor = ModelExecutor(step_model, lockstep=True)
    else:
        executor = ModelExecutor(step_model)
    sampler = TimeSeriesSampler(env, ranks, sample_interval_s, frontend.check_lost)

    env.process(frontend.process())
    for g in groups:
        env.process(EngineLoop(env, [ranks[i] for i in g], executor, observers,
                               all_events=lambda: frontend.sends_on_output,
                               sampler=sampler).process())
    if router.reads_reports:
        # Engines publish their loads only to a router that reads them.
        env.process(frontend.reporter(report_interval_s))
    env.process(sampler.process())
    try:
        env.run(until=frontend.all_done)
    finally:
        for r in ranks:
            if hasattr(r.sched, "close"):
                r.sched.close()
    frontend.records.seal_all()
    return ServingRun(frontend.records, counters.stats, sampler.series,
                      [r.sched for r in ranks], env.now, router.num_prefix_routed,
                      frontend.outcomes,
                      None if frontend.sessions is None
                      else [(s.session_id, j) for s, j in frontend.session_of], len(entry))
