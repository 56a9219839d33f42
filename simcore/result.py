"""`RunResult`: the typed, frozen outcome of one simulated configuration.

`simcore.simulate.simulate_run(cfg)` returns it; `simulate(cfg)` returns `to_dict()`, the JSON
layout users read (`vllm bench serve`'s keys at the top level, then the sections). Every
section is typed: `ReplicaResult` per engine (its counters under the names the JSON uses),
`Limits`, `TimeSeriesResult`, the request rows, the provenance, and with a cluster
`ClusterResult` (the fabric's summary and the figures that also stand at the top level).
`RunResult.from_dict` reads the JSON layout back, strictly: a missing key is an error naming
it, never a default.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from simcore.request_rows import RequestRows, rows_of

if TYPE_CHECKING:
    from simcore.serve.observers import ReplicaStats

_EP_FIELDS = ("dummy_steps", "dummy_busy_s", "all_to_all_s")
"""Per-replica counters only expert-parallel runs carry."""


class ResultError(ValueError):
    """A result mapping that lacks a key its layout requires."""


def _need(d: Mapping, key: str, where: str) -> Any:
    try:
        return d[key]
    except (KeyError, TypeError):
        raise ResultError(f"{where}: the result has no {key!r}") from None


@dataclass(frozen=True, slots=True)
class ReplicaResult:
    """One engine's counters over the run (see `ReplicaStats`), in the result's key order."""

    replica: int
    num_steps: int
    busy_s: float
    busy_fraction: float
    mean_batch_seqs: float
    compute_s: float
    comm_s: float
    num_prefill_tokens: int
    num_decode_tokens: int
    num_preemptions: int
    steps_by_bound: Mapping[str, int]
    max_num_running: int
    max_num_waiting: int
    num_steps_waiting_at_max_num_seqs: int
    num_steps_waiting_at_token_budget: int
    num_steps_waiting_for_kv_blocks: int
    num_steps_waiting_at_token_budget_compute_bound: int
    busy_s_waiting_at_max_num_seqs: float
    busy_s_waiting_at_token_budget: float
    busy_s_waiting_for_kv_blocks: float
    step_s_by_phase_bound: Mapping[str, float]
    prefix_cache_evictions: int
    dummy_steps: int | None = None
    dummy_busy_s: float | None = None
    all_to_all_s: float | None = None

    @classmethod
    def from_stats(cls, index: int, s: ReplicaStats, duration: float, evictions: int,
                   expert_parallel: bool) -> ReplicaResult:
        return cls(
            replica=index, num_steps=s.num_steps, busy_s=s.busy_s,
            busy_fraction=s.busy_s / duration if duration > 0 else 0.0,
            mean_batch_seqs=s.seq_s / s.busy_s if s.busy_s > 0 else 0.0,
            compute_s=s.compute_s, comm_s=s.comm_s,
            num_prefill_tokens=s.num_prefill_tokens, num_decode_tokens=s.num_decode_tokens,
            num_preemptions=s.num_preemptions, steps_by_bound=s.steps_by_bound,
            max_num_running=s.max_num_running, max_num_waiting=s.max_num_waiting,
            num_steps_waiting_at_max_num_seqs=s.num_steps_waiting_at_max_num_seqs,
            num_steps_waiting_at_token_budget=s.num_steps_waiting_at_token_budget,
            num_steps_waiting_for_kv_blocks=s.num_steps_waiting_for_kv_blocks,
            num_steps_waiting_at_token_budget_compute_bound=(
                s.num_steps_waiting_at_token_budget_compute_bound),
            busy_s_waiting_at_max_num_seqs=s.busy_s_waiting_at_max_num_seqs,
            busy_s_waiting_at_token_budget=s.busy_s_waiting_at_token_budget,
            busy_s_waiting_for_kv_blocks=s.busy_s_waiting_for_kv_blocks,
            step_s_by_phase_bound=s.step_s_by_phase_bound,
            prefix_cache_evictions=evictions,
            **({"dummy_steps": s.dummy_steps, "dummy_busy_s": s.dummy_busy_s,
                "all_to_all_s": s.all_to_all_s} if expert_parallel else {}))

    def to_dict(self) -> dict:
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name in _EP_FIELDS and v is None:
                continue
            out[f.name] = v
        return out

    @classmethod
    def from_dict(cls, d: Mapping) -> ReplicaResult:
        where = f"replicas[{d.get('replica', '?') if isinstance(d, Mapping) else '?'}]"
        kw = {f.name: _need(d, f.name, where) for f in dataclasses.fields(cls)
              if f.name not in _EP_FIELDS}
        kw.update({k: d[k] for k in _EP_FIELDS if k in d})
        return cls(**kw)


@dataclass(frozen=True, slots=True)
class Limits:
    """The engine limits the run resolved (vLLM's defaults filled in)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    num_gpu_blocks: int

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping) -> Limits:
        return cls(**{f.name: _need(d, f.name, "limits") for f in dataclasses.fields(cls)})


@dataclass(frozen=True, slots=True)
class TimeSeriesResult:
    """Per-engine samples at a fixed virtual interval."""

    t_s: list[float]
    kv_cache_usage: list[list[float]]
    num_running: list[list[int]]
    num_waiting: list[list[int]]

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, d: Mapping) -> TimeSeriesResult:
        return cls(**{f.name: _need(d, f.name, "timeseries") for f in dataclasses.fields(cls)})


@dataclass(frozen=True, slots=True)
class ClusterResult:
    """The cluster's summary (`ClusterRuntime.summary` plus the network's share of request
    latency and the KV tier's counters) and the figures that also stand at the top level of
    the result (`simcore.cluster.HEADLINE_METRICS`, the fabric's health)."""

    summary: Mapping[str, Any]
    headline: Mapping[str, Any]

    def share(self, key: str) -> float:
        """A share of the summary (network, fabric or congestion share of step time...)."""
        return _need(self.summary, key, "cluster")

    def fabric(self, key: str) -> Any:
        """A counter of the fabric block (drops, pfc_pause_frames, dcqcn_rate_cuts...)."""
        return _need(_need(self.summary, "fabric", "cluster"), key, "cluster.fabric")


_SECTIONS = ("expert_parallel", "kv_cache", "limits", "replicas", "timeseries", "requests",
             "provenance", "cluster", "trace", "headroom", "envelope")


@dataclass(frozen=True, slots=True)
class RunResult:
    """One configuration's simulated outcome.

    `metrics` holds the top-level values in the result's order (numbers, and a few small
    mappings such as `num_failed_by_error`): `vllm bench serve`'s, the
    engine's, the load trend, utilisation and batching (the cluster's headline figures are in
    `cluster.headline`); `headroom` and `envelope` are added by `simcore.uncertainty`'s
    `simulate_with_envelope`; `extras` holds what other stages add to the JSON (dse's derived
    metrics) and is kept through `from_dict` / `to_dict`.
    """

    name: str
    metrics: Mapping[str, Any]
    kv_cache: Mapping[str, Any]
    limits: Limits
    replicas: tuple[ReplicaResult, ...]
    timeseries: TimeSeriesResult
    requests: Sequence[Mapping[str, Any]]
    """One row a request (`RequestRows` from a run, a tuple of dicts read from JSON)."""
    provenance: Mapping[str, Any]
    expert_parallel: Mapping[str, Any] | None = None
    cluster: ClusterResult | None = None
    trace: Mapping[str, Any] | None = None
    headroom: Mapping[str, Any] | None = None
    """Where the offered load stands against the measured capacity (`simcore.saturation`)."""
    envelope: Mapping[str, Any] | None = None
    """Every metric's range under the model's errors (`simcore.uncertainty`)."""
    extras: Mapping[str, Any] = field(default_factory=dict)

    def metric(self, name: str) -> Any:
        """A top-level number by name (the cluster's headline figures included)."""
        if name in self.metrics:
            return self.metrics[name]
        if self.cluster is not None and name in self.cluster.headline:
            return self.cluster.headline[name]
        if name in self.extras:
            return self.extras[name]
        raise ResultError(f"result {self.name!r}: no metric {name!r}")

    @property
    def num_gpus_per_replica(self) -> int:
        return self.metrics["num_gpus"] // len(self.replicas)

    def to_dict(self, *, plain: bool = True) -> dict:
        """The JSON layout: name, the top-level metrics, the sections, the cluster's headline
        figures after its section, then what later stages added. `plain`: the request rows as
        a list of dicts (plain JSON); False keeps `RequestRows` as they are (columns, a row
        made when read; `json.dump` then needs `simcore.request_rows.json_default`)."""
        out: dict = {"name": self.name, **self.metrics}
        if self.expert_parallel is not None:
            out["expert_parallel"] = self.expert_parallel
        out["kv_cache"] = self.kv_cache
        out["limits"] = self.limits.to_dict()
        out["replicas"] = [r.to_dict() for r in self.replicas]
        out["timeseries"] = self.timeseries.to_dict()
        out["requests"] = (self.requests if not plain and isinstance(self.requests, RequestRows)
                           else list(self.requests))
        out["provenance"] = self.provenance
        if self.cluster is not None:
            out["cluster"] = self.cluster.summary
            out.update(self.cluster.headline)
        if self.trace is not None:
            out["trace"] = self.trace
        if self.headroom is not None:
            out["headroom"] = self.headroom
        if self.envelope is not None:
            out["envelope"] = self.envelope
        out.update(self.extras)
        return out

    @classmethod
    def from_dict(cls, d: Mapping) -> RunResult:
        """Read a `to_dict()` layout back; raises ResultError naming the first missing key."""
        from simcore.cluster import TOP_LEVEL_METRICS

        if not isinstance(d, Mapping):
            raise ResultError("result: expected a mapping")
        headline_keys = set(TOP_LEVEL_METRICS)
        cluster = None
        if "cluster" in d:
            cluster = ClusterResult(d["cluster"], {k: d[k] for k in d if k in headline_keys})
        metrics, extras = {}, {}
        past_sections = False   # scalars after the sections were added by a later stage
        for k, v in d.items():
            if k in _SECTIONS:
                past_sections = True
                continue
            if k == "name" or (cluster is not None and k in headline_keys):
                continue
            if not past_sections:
                metrics[k] = v
            else:
                extras[k] = v
        return cls(
            name=_need(d, "name", "result"), metrics=metrics,
            kv_cache=_need(d, "kv_cache", "result"),
            limits=Limits.from_dict(_need(d, "limits", "result")),
            replicas=tuple(ReplicaResult.from_dict(r) for r in _need(d, "replicas", "result")),
            timeseries=TimeSeriesResult.from_dict(_need(d, "timeseries", "result")),
            requests=rows_of(_need(d, "requests", "result")),
            provenance=_need(d, "provenance", "result"),
            expert_parallel=d.get("expert_parallel"), cluster=cluster, trace=d.get("trace"),
            headroom=d.get("headroom"), envelope=d.get("envelope"), extras=extras)
