"""`simulate(config)`: build the model, hardware, engines and workload from one config, run, summarise."""

from __future__ import annotations

import dataclasses
import gc
import platform
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import numpy as np

from simcore import __version__
from simcore.cluster import FABRIC_HEALTH_METRICS
from simcore.cluster import HEADLINE_METRICS as CLUSTER_HEADLINE_METRICS
from simcore.cluster import STEP_SLOWDOWN_METRIC
from simcore.config import CACHE_AWARE_SETTINGS, SimConfig
from simcore.engine.scheduler import SchedulerConfig
from simcore.engine.speculative import (LOOKAHEAD_METHODS, SpecDecodeParams,
                                        spec_decode_summary)
from simcore.errors import ConfigError
from simcore.host import HostOverheads
from simcore.metrics import engine_summary, summarize
from simcore.model.arch import ModelArch
from simcore.model.chat_template import TemplateTokens
from simcore.model.memory import kv_cache_groups
from simcore.reference_data import SHAREGPT_TOKENIZER_NAMES
from simcore.request_rows import RequestRows
from simcore.result import ClusterResult, Limits, ReplicaResult, RunResult, TimeSeriesResult
from simcore.saturation import load_trend
from simcore.serve import ServingRun, run_serving
from simcore.setup import Deployment, build_deployment, drafter_arch
from simcore.workload.config import ShareGPTDataset
from simcore.workload.generate import config_requests, sharegpt_choice
from simcore.workload.keys import template_keys
from simcore.workload.sessions import session_summary

def host_of(model) -> HostOverheads | None:
    """The step model's CPU side (`simcore.host`; an expert-parallel group's is its ranks'),
    None when it keeps the declared per-step overhead (host.model constant)."""
    return getattr(model, "host", None) or getattr(getattr(model, "rank_model", None), "host",
                                                   None)


def router_options(cfg: SimConfig) -> dict:
    """The router's settings beyond its policy and `balance_threshold`: cache_aware's."""
    r = cfg.router
    return ({name: getattr(r, name) for name in CACHE_AWARE_SETTINGS}
            if r.policy == "cache_aware" else {})


def request_path(cfg: SimConfig, dep: Deployment) -> dict:
    """The API server's path before a request reaches the scheduler, as `run_serving` takes it:
    the server's measured work per request and the fitted latency (host.model vllm with an API
    server)."""
    host = host_of(dep.step_model)
    if not cfg.host.api_server or host is None:
        return {}
    cpu = host.request_cpu_s
    chat = chat_extra_s(cfg, dep)
    if chat:
        cpu = partial(_plus, cpu, chat)
    path = {"request_cpu_s": cpu, "request_latency_s": host.request_overhead_s,
            "request_tokenize_s": host.tokenize_s}
    template = chat_template(cfg, dep)
    if template is not None and template.added:
        # The rendered prompt: the template's leading tokens, the same in every request, keyed
        # as one shared prefix where they fill blocks.
        path["request_template"] = (template.added, template_keys(template.lead
                                                                  // cfg.engine.block_size))
    return path


def chat_template(cfg: SimConfig, dep: Deployment):
    """The tokens the chat template adds to each request's prompt (`simcore.model.
    chat_template.TemplateTokens`), None for completions requests and for a model without a
    measured template."""
    if cfg.workload.endpoint != "chat_completions" or host_of(dep.step_model) is None:
        return None
    template = cfg.model.template_tokens(dep.arch)
    ds = cfg.workload.dataset
    if (template is not None and cfg.model.chat_template_tokens is None
            and getattr(ds, "kind", None) == "sharegpt" and ds.path is None):
        # The shipped counts in the model's own tokenizer hold the BOS its template writes.
        template = template.for_sharegpt_counts(sharegpt_choice(cfg)[0], dep.arch.name)
    return template


def _plus(f, extra: float, prompt_len: int) -> float:
    return f(prompt_len) + extra


def chat_extra_s(cfg: SimConfig, dep: Deployment) -> float:
    """The API server's CPU time of each request beyond a completions request's (s): for
    chat requests (workload.endpoint chat_completions) of a model with a Hugging Face chat
    template, the measured extra of vLLM's chat path (`host.chat_template_parse`); 0 for
    completions requests, and for gpt-oss, which vLLM renders with harmony (not measured).
    Refuses per_request for a harmony model, on which it has no effect."""
    if cfg.workload.endpoint != "chat_completions":
        return 0.0
    parse = cfg.host.chat_template_parse
    if dep.arch.chat_format != "jinja":
        if parse != "cached":
            raise ConfigError(f"host.chat_template_parse: {parse} has no effect on "
                              f"{dep.arch.name}, whose chats vLLM renders with "
                              f"{dep.arch.chat_format}, not a Jinja template; use cached")
        return 0.0
    host = host_of(dep.step_model)
    return host.chat_request_s if host is not None else 0.0


COMPILED_MIN_REQUESTS = 4096
"""Runs of at least this many requests take the engine's compiled kernels
(`SchedulerConfig.compiled`: the block pool in arrays, quiet runs' step times): the same results;
numba's import and the kernels' loading (about 0.3 s) pay for themselves from a few thousand
requests of ordinary length."""


def scheduler_config(cfg: SimConfig, dep: Deployment) -> SchedulerConfig:
    """The engine settings as the scheduler takes them, vLLM defaults filled in."""
    e = cfg.engine
    return SchedulerConfig(
        max_num_seqs=dep.max_num_seqs,
        max_num_batched_tokens=dep.max_num_batched_tokens,
        num_blocks=dep.num_blocks,
        block_size=e.block_size,
        max_model_len=dep.max_model_len,
        enable_chunked_prefill=e.enable_chunked_prefill,
        enable_prefix_caching=e.enable_prefix_caching,
        long_prefill_token_threshold=e.long_prefill_token_threshold,
        policy=e.scheduling_policy,
        preemption=e.preemption_mode,
        persistent_batch=e.persistent_batch,
        reserve_full_isl=e.scheduler_reserve_full_isl,
        watermark=e.watermark,
        max_num_scheduled_tokens=e.max_num_scheduled_tokens,
        kv_cache_groups=hybrid_kv_groups(dep.arch),
        speculative=spec_decode_params(cfg),
        vllm=vllm_install(cfg),
    )


def vllm_install(cfg: SimConfig):
    """Where vLLM's own scheduler runs under engine.implementation vllm (None otherwise);
    relative paths from the config's folder."""
    e = cfg.engine
    if e.implementation != "vllm":
        return None
    from simcore.engine.vllm_engine import VllmInstall

    def resolve(p):
        if p is None:
            return None
        p = Path(p)
        return str(p if p.is_absolute() else Path(cfg.base_dir) / p)
    return VllmInstall(python=resolve(e.vllm_python), path=resolve(e.vllm_path))


def spec_decode_params(cfg: SimConfig) -> SpecDecodeParams | None:
    """`engine.speculative_config` as the scheduler takes it (None when off): k, vLLM's
    lookahead slots (k for the EAGLE family and draft models, whose drafter writes its drafts'
    KV), the per-position conditional acceptance and the run's seed."""
    spec = cfg.engine.speculative_config
    if spec is None:
        return None
    k = spec.num_speculative_tokens
    return SpecDecodeParams(method=spec.method, num_spec_tokens=k,
                            num_lookahead_tokens=k if spec.method in LOOKAHEAD_METHODS else 0,
                            conditional=spec.conditional_acceptance(), seed=cfg.seed)


def hybrid_kv_groups(arch: ModelArch) -> tuple[int, ...]:
    """The windows of the model's KV-cache groups when vLLM's hybrid manager runs it (some
    sliding-window layers), else () (one group)."""
    windows = kv_cache_groups(arch).windows
    return windows if any(windows) else ()


def simulate(cfg: SimConfig, *, progress: Callable[[float, int, int], None] | None = None,
             op_scale: dict[str, float] | None = None, plain: bool = True) -> dict:
    """Run one configuration on the virtual clock and return its result as a JSON-able dict
    (`simulate_run(...).to_dict()`).

    The top level holds `vllm bench serve`'s keys (`mean_ttft_ms`, `p99_tpot_ms`,
    `request_throughput`, ...) and the engine's (`gpu_busy_fraction`, `total_preemptions`,
    `prefix_cache_hit_rate`, `mean_queue_ms`, ...); `kv_cache`, `replicas`, `timeseries`,
    `requests` and `provenance` hold the detail. `gpu_busy_fraction` is the fraction of wall
    time a step is running (mean over engines), however small its batch; how full the steps
    are is apart: `mean_batch_seqs` (sequences per step, weighted by step time) and
    `batch_fill_fraction` (that over max_num_seqs), `mean_batch_tokens` and
    `token_budget_fill_fraction` (tokens per step over max_num_batched_tokens), and
    `saturated_fraction`, the fraction of wall time a step ran while requests waited at an
    engine limit (max_num_seqs, the token budget, or KV blocks). Whether the run kept up with
    its arrivals: `offered_request_rate`, `served_request_rate`, `queue_growth_rps` and
    `over_capacity`, over the second half of the arrival window (`simcore.saturation`; absent
    when every request arrives at once or there are too few). `progress(now_s, done,
    total)` is called as requests complete. With expert parallelism the result also has `ep_size`,
    `dummy_busy_fraction` (share of GPU-busy time spent in dummy batches, which busy time
    includes: an idle rank of a lock-step group is still occupied),
    `all_to_all_fraction_of_busy`, an `expert_parallel` section, and per replica `dummy_steps`,
    `dummy_busy_s` and `all_to_all_s`. `op_scale` scales the compute model's op classes (a
    perturbed run of an envelope; see `simcore.uncertainty`). With `plain` false, `requests` is
    a `RequestRows`, the rows as columns, each made as a dict when read (a run of a million
    requests holds ~100 bytes a row instead of ~650), and the result is JSON with
    `json.dump(..., default=simcore.request_rows.json_default)`.
    """
    return simulate_run(cfg, progress=progress, op_scale=op_scale).to_dict(plain=plain)


@contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block, as it was after.

    A run allocates millions of short-lived containers (step times, scheduler outputs, token
    lists) and makes almost no reference cycles (measured: a few hundred objects in a run of
    20,000 requests, none in most examples), so the collector's passes find nothing while they
    cost a fifth of a long run's CPU time (the Mooncake hour: 7.7 of 38.7 CPU-s, most of it in
    passes over young objects that are still in use). Reference counting frees everything
    else as before; cycles left at the end are collected once the collector is back on."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def simulate_run(cfg: SimConfig, *, progress: Callable[[float, int, int], None] | None = None,
                 op_scale: dict[str, float] | None = None) -> RunResult:
    """Run one configuration on the virtual clock; its typed result (see `simulate`)."""
    with cyclic_gc_paused():
        return _simulate_run(cfg, progress=progress, op_scale=op_scale)


def _simulate_run(cfg: SimConfig, *, progress: Callable[[float, int, int], None] | None,
                  op_scale: dict[str, float] | None) -> RunResult:
    roles = None
    if cfg.parallelism.per_role:
        # Prefill and decode instances of their own TP or GPU: a deployment per role; the
        # decode role's stands for the run where one is asked for.
        from simcore.cluster.roles import build_role_deployments
        roles = build_role_deployments(cfg, op_scale=op_scale)
        dep = roles["decode"]
    else:
        dep = build_deployment(cfg, op_scale=op_scale)
    sched_cfg = scheduler_config(cfg, dep)
    w = cfg.workload
    specs = config_requests(cfg)
    check_runnable(cfg, specs)
    if len(specs) >= COMPILED_MIN_REQUESTS:
        sched_cfg = dataclasses.replace(sched_cfg, compiled=True)
    interval = widened_interval_s(cfg.metrics.timeseries_interval_s, specs,
                                  MAX_TIMESERIES_SAMPLES, SAMPLES_PER_REQUEST)
    report_s = widened_interval_s(cfg.router.periodic_infra_update_time_s, specs,
                                  MAX_LOAD_REPORTS, REPORTS_PER_REQUEST)
    par = cfg.parallelism
    dp = par.data_parallel_size
    num_engines = par.num_instances
    env = cluster = kv_paths = None
    if cfg.cluster is not None:
        import simpy

        from simcore.cluster.build import build_cluster
        from simcore.cluster.kvpaths import KvPaths
        env = simpy.Environment()
        cluster = build_cluster(env, cfg, dep, **({"roles": roles} if roles else {}))
        tier = cfg.cluster.kv_tier
        if tier is not None or par.prefill_decode is not None:
            if sched_cfg.kv_cache_groups:
                raise ConfigError(f"model.name: {dep.arch.name} has sliding-window layers; moving "
                                  "their KV (prefill/decode disaggregation, cluster.kv_tier) is "
                                  "not modelled")
            kv_paths = KvPaths(cluster, arch=dep.arch, kv_cache_dtype=dep.kv_cache_dtype,
                               block_size=cfg.engine.block_size,
                               tier_capacity_tokens=tier.capacity_tokens if tier else None,
                               min_fetch_blocks=tier.min_fetch_blocks if tier else 1,
                               draft_arch=drafter_arch(cfg, dep.arch))
        if tier is not None:
            sched_cfg = dataclasses.replace(sched_cfg,
                                            max_kvc_ready_requests=tier.max_kvc_ready_requests)
    # With expert parallelism EP = DP x TP: the DP ranks of each replica form one lock-step
    # EP group.
    if roles:
        # Disaggregation: an expert-parallel role's instances step as one group, each
        # instance of another role on its own.
        ep_groups = cluster.placement.ep_groups
        grouped = {i for g in ep_groups for i in g}
        groups = ([*ep_groups, *((i,) for i in range(num_engines) if i not in grouped)]
                  if ep_groups else None)
    else:
        groups = ([tuple(range(k * dp, (k + 1) * dp)) for k in range(par.num_replicas)]
                  if dep.expert_parallel else None)
    run = run_serving(
        specs, sched_config=sched_cfg, num_replicas=num_engines,
        step_model=dep.step_model, router_policy=cfg.router.policy,
        report_interval_s=report_s,
        balance_threshold=cfg.router.balance_threshold, max_concurrency=w.max_concurrency,
        max_model_len=dep.max_model_len, sample_interval_s=interval, progress=progress,
        lockstep_groups=groups, env=env, cluster=cluster, kv_paths=kv_paths,
        request_timeout_s=w.request_timeout_s,
        api_servers=cfg.host.api_server_count, **request_path(cfg, dep),
        router_options=router_options(cfg),
        **({"sched_configs": role_scheduler_configs(cfg, roles, sched_cfg, cluster)}
           if roles else {}))
    if not len(run.records):
        # Only a sessions workload can send nothing (check_runnable refused the others): every
        # session ended before its first turn.
        limit = getattr(specs, "max_context_tokens", None)
        where = ("workload.dataset.max_context_tokens" if limit is not None
                 else "the model's max_model_len")
        raise ConfigError(f"workload.dataset: no session sent a request: every session's first "
                          f"turn, its prompt and reply, exceeds the client's context limit "
                          f"({where}, {limit or dep.max_model_len} tokens); shorten the first "
                          "turns or raise the limit")
    result = assemble_result(cfg, dep, run, cluster=cluster, kv_paths=kv_paths)
    if interval != cfg.metrics.timeseries_interval_s:
        result.provenance["assumptions"].append(_widened_line(
            "metrics.timeseries_interval_s", cfg.metrics.timeseries_interval_s, interval, specs,
            "samples the engines"))
    if (report_s != cfg.router.periodic_infra_update_time_s and run.num_routed_engines > 1
            and cfg.router.policy != "round_robin"):      # round robin reads no load
        result.provenance["assumptions"].append(_widened_line(
            "router.periodic_infra_update_time_s", cfg.router.periodic_infra_update_time_s,
            report_s, specs, "reports the engines' loads to the router"))
    if run.num_routed_engines <= 1 and cfg.router != type(cfg.router)():
        # Said, not refused: a study may search the router beside DP, and its DP-1 trials run.
        result.provenance["assumptions"].append(
            f"router: one engine takes every request, so no router chooses; the router "
            f"section (policy {cfg.router.policy}) has no effect on this run")
    if roles:
        result = with_roles(result, cfg, roles)
    return result


def role_scheduler_configs(cfg: SimConfig, roles: dict[str, Deployment],
                           decode_cfg: SchedulerConfig, cluster) -> list[SchedulerConfig]:
    """Each engine's scheduler settings when prefill and decode instances have their own TP:
    those of its role's deployment (its KV-cache size); `decode_cfg` is the decode role's."""
    prefill = scheduler_config(cfg, roles["prefill"])
    return [prefill if inst.role == "prefill" else decode_cfg
            for inst in cluster.placement.instances]


def with_roles(result: RunResult, cfg: SimConfig,
               roles: dict[str, Deployment]) -> RunResult:
    """A per-role run's result: its GPU count (by GPU type) and per-GPU figures over every
    instance's GPUs, a `roles` part of `kv_cache` with each role's GPU, TP, instances and
    KV-cache size, and, where the roles run on different GPUs, each role's compute model in the
    provenance."""
    from simcore.cluster.roles import role_config

    m = dict(result.metrics)
    par = cfg.parallelism
    pd = par.prefill_decode
    n_gpu = par.num_gpus_used
    m["num_gpus"] = n_gpu
    m["output_throughput_per_gpu"] = m["output_throughput"] / n_gpu
    m["total_token_throughput_per_gpu"] = m["total_token_throughput"] / n_gpu
    count = {"prefill": pd.num_prefill_instances, "decode": pd.num_decode_instances}
    by_type = m["num_gpus_by_type"] = cfg.gpus_by_type()
    kv = dict(result.kv_cache)
    kv["roles"] = {
        role: {"gpu": d.gpu.name,
               "tensor_parallel_size": par.role_tensor_parallel_size(role),
               "num_instances": count[role],
               **{k: v for k, v in d.memory_report().items()
                  if k != "memory_breakdown_bytes"}}
        for role, d in roles.items()}
    ep = result.expert_parallel
    ep_roles = {role: d for role, d in roles.items() if d.expert_parallel}
    if ep_roles:
        # An expert-parallel role's instances are a group of their own (the rest of the
        # section, and ep_size among the metrics, are the decode role's where it has one).
        ep = dict(ep or {})
        ep["roles"] = {role: {"ep_size": d.ep_size, "num_lockstep_ranks": d.step_model.num_ranks,
                              "experts_per_gpu": d.step_model.experts_per_gpu,
                              "ep_gpus_per_node": d.step_model.ep_local}
                       for role, d in ep_roles.items()}
    prov = result.provenance
    if set(by_type) != {cfg.hardware.resolve().name}:
        prov = dict(prov)
        prov["compute_kind"] = "; ".join(
            f"{role} on {roles[role].gpu.name}: {_compute_kind_line(role_config(cfg, role))}"
            for role in ("prefill", "decode"))
        # One GPU type other than hardware.gpu's, or two (whose envelope takes every GPU's
        # residuals).
        prov["gpu"] = next(iter(by_type)) if len(by_type) == 1 else None
        prov["roles"] = {role: {"gpu": roles[role].gpu.name,
                                "compute_profile": roles[role].step_model.profile_id,
                                "reference_fallbacks": roles[role].step_model.fallbacks()}
                         for role in ("prefill", "decode")}
        prov["reference_fallbacks"] = sorted({f for d in roles.values()
                                              for f in d.step_model.fallbacks()})
        decode_lines = roles["decode"].step_model.assumption_lines()
        prov["assumptions"] = (
            [f"prefill instances on {roles['prefill'].gpu.name}: {line}"
             for line in roles["prefill"].step_model.assumption_lines()]
            + [f"decode instances on {roles['decode'].gpu.name}: {line}"
               for line in decode_lines]
            + list(prov["assumptions"])[len(decode_lines):])
    return dataclasses.replace(result, metrics=m, kv_cache=kv, provenance=prov,
                               expert_parallel=ep)


MAX_TIMESERIES_SAMPLES = 200_000
"""Samples of the engines' state a run takes while its requests are sent, past which (and past
`SAMPLES_PER_REQUEST` a request) the sampling interval is widened: at the default one a second,
55 hours. Each is a SimPy event, so a few requests spread over years (a rate of one in a million
seconds) would otherwise spend the run sampling idle engines; a busy run of that length has
requests enough to keep its interval."""

SAMPLES_PER_REQUEST = 100
"""Samples a request a run may take at least (a busy hour takes well under one)."""

MAX_LOAD_REPORTS = 4_000_000
"""Load reports the engines publish to the router, in the same way: at the default 50 ms, the
same 55 hours."""

REPORTS_PER_REQUEST = 2_000
"""Load reports a request a run may take at least, in the same way."""


def widened_interval_s(interval_s: float, specs, most: int, per_request: int) -> float:
    """`interval_s`, or where the requests' planned sends (as known before the run: the
    arrivals; a session's start and its pauses, drawn in advance) span more than
    max(`most`, `per_request` x the requests) intervals, that span over that many."""
    span = getattr(specs, "last_arrival_s", None)
    if span is None:
        return interval_s
    most = max(most, per_request * len(specs))
    return span / most if span / interval_s > most else interval_s


def _widened_line(setting: str, was: float, now: float, specs, what: str) -> str:
    return (f"{setting} widened from {was:g} to {now:.6g} s: the requests' planned sends span "
            f"{specs.last_arrival_s:.6g} s, more than the run {what} for {len(specs):,} requests")


def check_policy(policy: str, specs) -> None:
    """Refuse the scheduling policy `policy` (engine.scheduling_policy) for the requests `specs`
    where it has no effect (priority over requests of priority 0 alone: it would be FCFS) or
    vLLM refuses it (fcfs over requests with priorities other than 0; one such priority shared
    by all needs the priority policy, though it orders nothing)."""
    carried = getattr(specs, "has_priorities", False)
    if policy == "priority" and not carried:
        raise ConfigError("engine.scheduling_policy: priority has no effect: every request of "
                          "the workload has priority 0, so it serves them as fcfs does "
                          "(only a custom dataset's lines carry priorities, as `priority`); "
                          "use fcfs")
    if policy == "fcfs" and carried:
        raise ConfigError("engine.scheduling_policy: the workload's requests carry priorities "
                          "(its custom dataset's `priority`), which vLLM refuses under fcfs "
                          "('Priority scheduling is not enabled'); set scheduling_policy: "
                          "priority, or drop the priorities")


def check_runnable(cfg: SimConfig, specs) -> None:
    """Refuse, before anything runs, what `simulate` cannot run: a workload with no requests
    (`specs`, its request stream), a scheduling policy `check_policy` refuses for its requests,
    disaggregation without a cluster, an external KV tier beside disaggregation, and client
    timeouts with KV moved over the fabric."""
    if not len(specs):
        raise ConfigError("workload: it produces no requests (check num_prompts and the dataset)")
    check_policy(cfg.engine.scheduling_policy, specs)
    pd = cfg.parallelism.prefill_decode
    tier = cfg.cluster.kv_tier if cfg.cluster is not None else None
    if pd is not None and cfg.cluster is None:
        raise ConfigError("parallelism.prefill_decode: disaggregation moves KV caches over a "
                          "network; add a cluster section")
    if tier is not None and pd is not None:
        raise ConfigError("cluster.kv_tier: an external KV tier with "
                          "parallelism.prefill_decode is not modelled (prefill instances "
                          "would neither store to it nor fetch from it); remove one")
    if (tier is not None or pd is not None) and cfg.workload.request_timeout_s is not None:
        raise ConfigError("workload.request_timeout_s: client timeouts are not modelled with "
                          "prefill/decode disaggregation or an external KV tier; remove one")
    span = getattr(specs, "last_arrival_s", None)
    if cfg.cluster is not None and cfg.cluster.fabric.backend == "packet" and span is not None:
        from simcore.fabric.packet.clock import HORIZON_S

        if span >= HORIZON_S / 2:
            raise ConfigError(
                f"cluster.fabric.backend: packet: the workload's planned sends span {span:.4g} "
                f"s, and the packet fabric's clock (picoseconds in 64 bits) ends at "
                f"{HORIZON_S:.3g} s, about 53 days, with half of it kept for the run to finish; "
                f"use the flow or analytical backend, or a higher request rate")


def cluster_result(cluster, run: ServingRun, kv_paths=None) -> dict:
    """The cluster's summary plus the network's share of request latency."""
    out = cluster.summary()
    records = run.records
    done = records.success & (records.num_tokens > 0)
    # Summed in request order as Python floats, as a record at a time would.
    e2e = sum((records.last_token_s[done] - records.send_s[done]).tolist())
    net = sum(records.network_s[done].tolist())
    out["network_share_of_request_latency"] = net / e2e if e2e > 0 else 0.0
    if kv_paths is not None and kv_paths.tier is not None:
        t = kv_paths.tier
        # A request the scheduler passes over (max_kvc_ready_requests, or no free blocks) is
        # looked up again next step, so lookups and hits exceed the fetches.
        fetched = sum(s.connector.num_loaded_tokens for s in run.schedulers
                      if s.connector is not None)
        # With a tier (never beside P/D disaggregation) every KV transfer is a tier fetch.
        out["kv_tier"] = {"capacity_blocks": t.capacity_blocks, "stored_blocks": len(t),
                          "lookups": t.num_lookups, "hit_blocks": t.num_hit_blocks,
                          "fetched_blocks": fetched // kv_paths.block_size,
                          "fetched_bytes": (out["kv_transfers"]["bytes"]
                                            if "kv_transfers" in out else 0),
                          "evicted_blocks": t.num_evicted_blocks}
    return out


def assemble_result(cfg: SimConfig, dep: Deployment, run: ServingRun, *, cluster=None,
                    kv_paths=None) -> RunResult:
    """Turn a raw run into its typed result (metrics, sections and provenance)."""
    w = cfg.workload
    pcts = cfg.metrics.percentiles
    m: dict = summarize(
        run.records, selected_percentiles=pcts, goodput_slos_ms=cfg.metrics.goodput,
        request_rate=w.request_rate, burstiness=w.burstiness, max_concurrency=w.max_concurrency,
        model_id=dep.arch.name, role_chunk=w.endpoint == "chat_completions")
    if w.ramp_up_strategy is not None:
        m["ramp_up_strategy"] = w.ramp_up_strategy
        m["ramp_up_start_rps"] = w.ramp_up_start_rps
        m["ramp_up_end_rps"] = w.ramp_up_end_rps
    template = chat_template(cfg, dep)
    m.update(engine_summary(run.records, selected_percentiles=pcts,
                            template_tokens=template.added if template is not None else 0))
    duration = m["duration"]
    stats = run.replicas
    # The run ends with its last request; a step running then (its client gave up while it
    # ran) is counted whole, so an engine's busy time is held to the duration.
    busy = sum(min(s.busy_s, duration) for s in stats)
    n_gpu = dep.gpus_per_replica * len(stats)
    m["num_gpus"] = n_gpu
    m["num_gpus_by_type"] = {dep.gpu.name: n_gpu}
    wall = duration * len(stats)
    m["gpu_busy_fraction"] = busy / wall if wall > 0 else 0.0
    # How full the running steps are, apart from how long they run: a step can run all the
    # time with a small batch (busy 1.00 at light load), so busy alone does not mean saturated.
    at_limit = sum(min(s.busy_s_waiting_at_max_num_seqs + s.busy_s_waiting_at_token_budget
                       + s.busy_s_waiting_for_kv_blocks, duration) for s in stats)
    m["saturated_fraction"] = at_limit / wall if wall > 0 else 0.0
    ran = sum(s.busy_s for s in stats)      # every step whole: the batch's weights
    m["mean_batch_seqs"] = sum(s.seq_s for s in stats) / ran if ran > 0 else 0.0
    m["batch_fill_fraction"] = m["mean_batch_seqs"] / dep.max_num_seqs
    real_steps = sum(s.num_steps - s.dummy_steps for s in stats)
    m["mean_batch_tokens"] = (sum(s.num_tokens for s in stats) / real_steps
                              if real_steps else 0.0)
    m["token_budget_fill_fraction"] = m["mean_batch_tokens"] / dep.max_num_batched_tokens
    trend = load_trend(run.records.arrival_s, run.records.end_s)
    if trend is not None:
        m.update(trend.as_dict())
    m["output_throughput_per_gpu"] = m["output_throughput"] / n_gpu
    m["total_token_throughput_per_gpu"] = m["total_token_throughput"] / n_gpu
    usage = np.asarray(run.timeseries.kv_usage, dtype=float)
    m["mean_kv_cache_usage"] = float(usage.mean()) if usage.size else 0.0
    m["max_kv_cache_usage"] = float(usage.max()) if usage.size else 0.0
    m["num_steps"] = sum(s.num_steps for s in stats)
    m["num_routed_by_prefix"] = run.num_routed_by_prefix
    if run.sessions is not None:
        m["sessions"] = session_summary(run.sessions, run.records,
                                        [j for _, j in run.session_turns], pcts)
    comm = sum(s.comm_s for s in stats)
    m["communication_fraction_of_busy"] = comm / ran if ran > 0 else 0.0
    if cfg.engine.speculative_config is not None:
        m.update(spec_decode_summary([s.spec_stats for s in run.schedulers]))
    ep = None
    if dep.expert_parallel:
        sm = dep.step_model
        dummy = sum(s.dummy_busy_s for s in stats)
        a2a = sum(s.all_to_all_s for s in stats)
        m["ep_size"] = dep.ep_size
        m["dummy_busy_fraction"] = dummy / ran if ran > 0 else 0.0
        m["all_to_all_fraction_of_busy"] = a2a / ran if ran > 0 else 0.0
        ep = {
            "ep_size": dep.ep_size, "num_lockstep_ranks": sm.num_ranks,
            "experts_per_gpu": sm.experts_per_gpu, "ep_gpus_per_node": sm.ep_local,
            "all_to_all": ("none (one DP rank: TP all-reduce)" if sm.dp == 1
                           else "intra-node" if sm.ep_local >= sm.ep else "across nodes"),
            "num_dummy_steps": sum(s.dummy_steps for s in stats),
        }
    ts = run.timeseries
    prov = provenance(cfg, dep)
    versions = sorted({s.vllm.version for s in run.schedulers if hasattr(s, "vllm")})
    if versions:        # engine.implementation vllm: the installed vLLM decided
        prov["engine_semantics"] = prov["engine_semantics"].replace(
            "vLLM 0.33 V1 scheduler", f"vLLM {', '.join(versions)}'s own V1 scheduler "
            "(engine.implementation vllm)")
    cluster_part = trace = None
    if cluster is not None:
        summary = cluster_result(cluster, run, kv_paths)
        fabric = summary["fabric"]
        headline = {key: summary[key] for key in CLUSTER_HEADLINE_METRICS}
        headline.update({key: fabric[src] for key, src in FABRIC_HEALTH_METRICS.items()})
        headline[STEP_SLOWDOWN_METRIC] = fabric["step_slowdown"]["p99"] or 1.0
        cluster_part = ClusterResult(summary, headline)
        prov["fidelity"] = f"engine + step DAG over the {cfg.cluster.fabric.backend} fabric"
        prov["assumptions"] += cfg.cluster.assumption_lines()
        if cluster.trace is not None:
            trace = {"traceEvents": cluster.trace.events(), "displayTimeUnit": "ms"}
    return RunResult(
        name=cfg.name, metrics=m, kv_cache=dep.memory_report(),
        limits=Limits(max_num_seqs=dep.max_num_seqs,
                      max_num_batched_tokens=dep.max_num_batched_tokens,
                      max_model_len=dep.max_model_len, num_gpu_blocks=dep.num_blocks),
        replicas=tuple(ReplicaResult.from_stats(i, s, duration, sched.kv.pool.num_evictions,
                                                dep.expert_parallel)
                       for i, (s, sched) in enumerate(zip(stats, run.schedulers))),
        timeseries=TimeSeriesResult(ts.t_s, ts.kv_usage, ts.num_running, ts.num_waiting),
        requests=_request_rows(run),
        provenance=prov, expert_parallel=ep, cluster=cluster_part, trace=trace)


def _request_rows(run: ServingRun) -> RequestRows:
    """One row a request, as columns; with sessions, each names its session and turn."""
    return RequestRows.from_records(run.records, run.session_turns)


def provenance(cfg: SimConfig, dep: Deployment) -> dict:
    """Where the numbers come from: seed, profile, versions, and the assumptions they rest on."""
    m = dep.step_model
    share = m.measured_share()
    return {
        "simulator": "simcore", "simulator_version": __version__,
        "engine_semantics": "vLLM 0.33 V1 scheduler, sync-mode decisions"
                            + (", async scheduling's overlap" if cfg.engine.async_scheduling
                               else ""),
        "seed": cfg.seed,
        "seeds": {"workload": cfg.seed,
                  **({"envelope": cfg.seed} if cfg.uncertainty.method == "samples" else {}),
                  **({"fabric": cfg.seed, "expert_routing": cfg.seed}
                     if cfg.cluster is not None else {})},
        "gpu": dep.gpu.name,
        "weight_dtype": cfg.model.dtype,
        "compute_profile": m.profile_id,
        "compute_kind": _compute_kind_line(cfg),
        "profile_version": m.profile_version,
        "calibrated": m.calibrated,
        "reference_fallbacks": m.fallbacks(),
        "assumed_parts": m.assumed_parts(),
        "measured_share_of_step_time": round(share, 3),
        "profile_label": (f"calibrated profile ({share:.0%} of a reference step measured)"
                          if m.calibrated else "uncalibrated reference profile"),
        "step_time_relative_uncertainty": m.relative_uncertainty,
        "op_error_bounds": m.op_error_bounds(),
        "op_scale": {k: v for k, v in m.op_scale.items() if v != 1.0} or None,
        "fidelity": "engine + analytical step model (no fabric)",
        "python": platform.python_version(),
        "numpy": np.__version__,
        "assumptions": dep.assumptions() + _host_lines(cfg, dep) + _dataset_lines(cfg),
    }


def _dataset_lines(cfg: SimConfig) -> list[str]:
    """Which shipped lengths a sharegpt dataset without a `path` sends."""
    ds = cfg.workload.dataset
    if not isinstance(ds, ShareGPTDataset) or ds.path is not None:
        return []
    tok, why = sharegpt_choice(cfg)
    return [f"ShareGPT lengths: the shipped first turns counted with the "
            f"{SHAREGPT_TOKENIZER_NAMES[tok]} tokenizer ({why})"]


def _compute_kind_line(cfg: SimConfig) -> str:
    """Which compute model ran, and why when `compute.kind` left it to the default (auto)."""
    c = cfg.compute
    gpu = cfg.hardware.resolve().name
    kind = c.resolved_kind(gpu)
    if c.kind != "auto":
        return kind
    if c.profile is not None:
        return "calibrated (auto: compute.profile names a profile)"
    return ("calibrated (auto: a kernel profile of " + gpu + " is shipped)"
            if kind == "calibrated" else
            "roofline (auto: no kernel profile of " + gpu + " is shipped)")


def _host_lines(cfg: SimConfig, dep: Deployment) -> list[str]:
    """The CPU side's assumptions in words."""
    host = host_of(dep.step_model)
    if host is not None:
        lines = host.assumption_lines()
        if cfg.workload.endpoint == "chat_completions" and cfg.host.api_server:
            arch = dep.arch
            lines.append(
                f"chat requests: {chat_extra_s(cfg, dep) * 1e3:.2f} ms more of the API "
                f"server's work each than a completions request (vLLM's chat path, measured "
                f"with Qwen3's chat template; the template "
                + ("parsed for every request, as vLLM 0.11.0 does)"
                   if cfg.host.chat_template_parse == "per_request" else "resolution cached)")
                if arch.chat_format == "jinja" else
                f"chat requests: {arch.name} is rendered with {arch.chat_format}, "
                "not a Jinja template: no chat-path cost beyond a completions request's "
                "(not measured)")
            template = chat_template(cfg, dep)
            lines.append(template.assumption_line(cfg.engine.block_size) if template is not None
                         else TemplateTokens.unknown_line(cfg.model.name or dep.arch.name))
        return lines
    return ["CPU side: the declared compute.roofline.step_overhead_s per step (host.model "
            "constant)"]
