"""Open-loop replay of a recorded scheduler-step log through the step DAG and the fabric: the
network's answer for schedules that a real deployment (or `dse conformance`) already made.

The log is the format of `simcore.engine.conformance`: an optional header line, then one JSON
object a step with `scheduled` {request id: tokens this step} and, to place each request's tokens
on top of its KV cache, `new`, `resumed`, `preempted`, `computed_on_admit` and `finished`. The
tokens a request has computed before a step are not in the log; they are rebuilt by following
each request from its admission (see `logged_batches`). Nothing is scheduled here: the steps run
back to back on the clock, each starting when the one before it ended.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np
import simpy

from simcore import __version__
from simcore.cluster.build import build_cluster
from simcore.config import SimConfig
from simcore.engine.conformance import (STEP_FORMAT_VERSION, STEP_LOG_FORMAT, is_step_log_header,
                                        step_log_header)
from simcore.errors import ConfigError
from simcore.loading import not_utf8
from simcore.setup import build_deployment

_ID_LISTS = ("new", "resumed", "preempted", "finished")


class LoggedRequest:
    """A request of a step log as the step DAG sees it: an id, and no client whose latency the
    network's share of a step is charged to."""

    __slots__ = ("request_id",)
    client = None

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id


def read_step_log(path: str | Path) -> list[tuple[int, dict]]:
    """The step records of a log as (line number, record), header checked and dropped; a bad
    line raises ConfigError naming the file and the line."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt") as f:
            lines = list(f)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such step log") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a folder, not a step log") from None
    except UnicodeDecodeError:
        raise not_utf8(path, opener) from None
    except (OSError, EOFError) as e:
        raise ConfigError(f"{path}: cannot be read as a step log ({e})") from None
    records: list[tuple[int, dict]] = []
    last_step = None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}: line {n}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{where}: not valid JSON ({e.msg})") from None
        if is_step_log_header(rec):
            if records or last_step is not None:
                raise ConfigError(f"{where}: a header line may only come first")
            if rec.get("format") != STEP_LOG_FORMAT:
                raise ConfigError(f"{where}: the header names format {rec.get('format')!r}, not "
                                  f"{STEP_LOG_FORMAT!r}")
            if rec != step_log_header():
                raise ConfigError(f"{where}: step-log version {rec.get('version')!r} is not the "
                                  f"version {STEP_FORMAT_VERSION} this simulator reads")
            last_step = -1
            continue
        _check_record(rec, where)
        step = rec.get("step")
        if step is not None:
            if last_step is not None and step <= last_step:
                raise ConfigError(f"{where}: step {step} does not follow step {last_step}")
            last_step = step
        records.append((n, rec))
    if not records:
        raise ConfigError(f"{path}: the step log holds no steps")
    return records


def _check_record(rec: Any, where: str) -> None:
    """Raise ConfigError if a step record has a missing or ill-typed field."""
    if not isinstance(rec, dict):
        raise ConfigError(f"{where}: a step must be a JSON object, got {type(rec).__name__}")
    step = rec.get("step")
    if step is not None and (not isinstance(step, int) or isinstance(step, bool) or step < 0):
        raise ConfigError(f"{where}: step must be a non-negative integer, got {step!r}")
    sched = rec.get("scheduled")
    if not isinstance(sched, dict):
        raise ConfigError(f"{where}: scheduled must be an object of request id to tokens"
                          + (" and is missing" if sched is None else f", got {sched!r}"))
    for rid, k in sched.items():
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ConfigError(f"{where}: scheduled[{rid!r}] must be a positive token count, "
                              f"got {k!r}")
    for key in _ID_LISTS:
        ids = rec.get(key, [])
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise ConfigError(f"{where}: {key} must be a list of request ids, got {ids!r}")
    hits = rec.get("computed_on_admit", {})
    if not isinstance(hits, dict) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in hits.values()):
        raise ConfigError(f"{where}: computed_on_admit must be an object of request id to a "
                          f"non-negative token count, got {hits!r}")


def logged_batches(records: list[tuple[int, dict]]
                   ) -> tuple[list[list[tuple[str, int, int]]], int]:
    """Each step's batch as (request id, num_new_tokens, num_computed_before), in the log's
    order, and how many admissions started from a computed-token count the log does not give.

    A request's computed tokens follow vLLM's bookkeeping: a preempted request drops to 0; an
    admitted one (`new` or `resumed`) starts from its `computed_on_admit` (its prefix-cache hit);
    every step adds its scheduled tokens; `finished` forgets it. Where the log is silent the
    count is derived as 0: an admission without a `computed_on_admit` entry (no prefix hit), or a
    request first seen already running (a log that starts mid-run).
    """
    computed: dict[str, int] = {}
    batches = []
    num_assumed = 0
    for _, rec in records:
        for rid in rec.get("preempted", ()):
            computed[rid] = 0
        hits = rec.get("computed_on_admit", {})
        for rid in (*rec.get("new", ()), *rec.get("resumed", ())):
            if rid not in hits:
                num_assumed += 1
            computed[rid] = hits.get(rid, 0)
        batch = []
        for rid, k in rec["scheduled"].items():
            if rid not in computed:
                num_assumed += 1
                computed[rid] = 0
            batch.append((rid, k, computed[rid]))
            computed[rid] += k
        for rid in rec.get("finished", ()):
            computed.pop(rid, None)
        batches.append(batch)
    return batches, num_assumed


def check_within_limits(logged, dep, steps_path) -> None:
    """Refuse a log step that the config's engine could not have scheduled: more sequences than
    its max_num_seqs, more tokens than its max_num_batched_tokens, or a request past its
    max_model_len (the log was recorded under other limits, and its step times would be read
    as this config's)."""
    for k, batch in enumerate(logged):
        if not batch:
            continue
        where = f"{steps_path}: step {k}"
        if len(batch) > dep.max_num_seqs:
            raise ConfigError(f"{where} schedules {len(batch)} requests, more than the config's "
                              f"max_num_seqs ({dep.max_num_seqs}): the log was recorded under "
                              f"other limits")
        tokens = sum(n for _, n, _ in batch)
        if tokens > dep.max_num_batched_tokens:
            raise ConfigError(f"{where} schedules {tokens} tokens, more than the config's "
                              f"max_num_batched_tokens ({dep.max_num_batched_tokens}): the log "
                              f"was recorded under other limits")
        for rid, n, ctx in batch:
            if ctx + n > dep.max_model_len:
                raise ConfigError(f"{where}: request {rid} reaches {ctx + n} tokens, past the "
                                  f"config's max_model_len ({dep.max_model_len})")


def replay_steps(cfg: SimConfig, steps_path: str | Path, *, instance: int = 0) -> dict:
    """Run every step of the log at `steps_path` on engine `instance` of `cfg`'s cluster, back to
    back from time 0, and return a JSON-able result.

    The result holds `num_steps` (lines of the log), `num_executed_steps` (those that schedule
    something: an empty step runs no model and takes no time), `total_s`, `step_times_s` (one a
    log step, 0 for empty ones), mean/p50/p99/max over executed steps, token counts, the
    cluster's `summary()` under `cluster`, and `trace` when `cluster.trace` opens a window (its
    `first_step` counts executed steps). An engine of an expert-parallel group steps with the
    group's other ranks running dummy batches.
    """
    if cfg.cluster is None:
        raise ConfigError("cluster: replaying a step log runs it over the cluster's step DAG and "
                          "fabric; add a cluster section (num_nodes at least)")
    records = read_step_log(steps_path)
    logged, num_assumed = logged_batches(records)
    dep = build_deployment(cfg)
    check_within_limits(logged, dep, steps_path)
    env = simpy.Environment()
    runtime = build_cluster(env, cfg, dep)
    num_instances = len(runtime.placement.instances)
    if not 0 <= instance < num_instances:
        raise ConfigError(f"instance {instance}: the placement has {num_instances} "
                          f"engine{'s' if num_instances > 1 else ''}, numbered from 0")
    group = next((g for g in runtime.placement.ep_groups if instance in g), (instance,))
    requests: dict[str, LoggedRequest] = {}
    times = [0.0] * len(logged)
    totals = {"compute_s": 0.0, "comm_s": 0.0}
    tokens = {"prefill": 0, "decode": 0}

    def drive():
        for k, batch in enumerate(logged):
            if not batch:
                continue
            sched = [(requests.setdefault(rid, LoggedRequest(rid)), n, ctx)
                     for rid, n, ctx in batch]
            for _, n, ctx in batch:
                tokens["decode" if n == 1 and ctx > 0 else "prefill"] += n
            st = yield from runtime.step([(i, sched if i == instance else None) for i in group])
            times[k] = st.total_s
            totals["compute_s"] += st.compute_s
            totals["comm_s"] += st.comm_s

    runtime.start()
    env.run(until=env.process(drive()))
    ran = np.array([t for t, b in zip(times, logged) if b])
    total_s = float(env.now)
    out: dict[str, Any] = {
        "steps_file": str(steps_path),
        "instance": instance,
        "num_steps": len(logged),
        "num_executed_steps": int(ran.size),
        "num_requests": len(requests),
        "num_requests_assumed_uncached": num_assumed,
        "num_prefill_tokens": tokens["prefill"],
        "num_decode_tokens": tokens["decode"],
        "total_s": total_s,
        "token_throughput": (tokens["prefill"] + tokens["decode"]) / total_s if total_s else 0.0,
        "mean_step_s": float(ran.mean()) if ran.size else 0.0,
        "p50_step_s": float(np.percentile(ran, 50)) if ran.size else 0.0,
        "p99_step_s": float(np.percentile(ran, 99)) if ran.size else 0.0,
        "max_step_s": float(ran.max()) if ran.size else 0.0,
        **totals,
        "step_times_s": times,
        "cluster": runtime.summary(),
        "provenance": {
            "simulator": "simcore", "simulator_version": __version__, "seed": cfg.seed,
            "compute_profile": dep.step_model.profile_id,
            "calibrated": dep.step_model.calibrated,
            "fidelity": f"recorded schedule, step DAG over the {cfg.cluster.fabric.backend} "
                        f"fabric",
        },
    }
    if runtime.trace is not None:
        out["trace"] = {"traceEvents": runtime.trace.events(), "displayTimeUnit": "ms"}
    return out
