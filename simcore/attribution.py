"""Bottleneck attribution: which resource limits a simulated configuration, scored from its result.

`attribute(result)` reads the counters a typed `simcore.result.RunResult` already holds (a
`simulate()` dict is read back strictly first) and ranks eleven limiting factors. Every score
lies in [0, 1]; higher means the factor limits the run more. The scores are fractions of measured quantities, not a fitted model, so they are deterministic and
cheap (linear in the result's replicas, requests and time-series samples).

Quantities used (summed over replicas unless said otherwise):

- `b`: `gpu_busy_fraction` (mean over replicas of busy time / duration).
- `c`, `k`: `compute_s / busy_s` and `comm_s / busy_s` (`communication_fraction_of_busy`).
- `p`: the prefill share of busy time: time of steps that carry prefill tokens / busy time
  (the replicas' `step_s_by_phase_bound`).
- `f_seqs`, `f_kv`, `f_budget`: the share of busy time in steps that left requests waiting
  with the batch at `max_num_seqs`, with the token budget used up, or for any other reason,
  counted as KV blocks (with chunked prefill on, the one other reason vLLM's scheduler leaves a
  request waiting): the replicas' `busy_s_waiting_*` over their busy time.
- `f_budget_mem`: the part of `f_budget` spent in steps that were not compute-bound; a full
  budget in compute-bound steps only chunks prefill work whose cost is the compute, so it is
  not a limit of its own (the replicas' `num_steps_waiting_at_token_budget_compute_bound`).
- `limit = min(1, f_seqs + f_kv + f_budget_mem)`: the share of steps in which a configured
  engine limit, not the GPU, held waiting work back. `free = 1 - limit`.
- `sat` (`saturated_fraction_of_busy`): `min(1, f_seqs + f_kv + f_budget)`, the share of busy
  time in steps that left requests waiting at an engine limit, a full token budget in
  compute-bound steps included.
- `fill` (`batch_fill_fraction`): the mean batch (sequences per step, weighted by step time)
  over `max_num_seqs`; `token_fill`: the mean tokens per step over `max_num_batched_tokens`.
- `engine_load`, how hard the engine works, apart from how long its steps run: "saturated"
  when `sat >= 0.5`; else "idle" when `b < 0.9`; else "low_batch" when `fill` and
  `token_fill` are both under 0.5 (a step runs all the time, with a small batch: busy 1.00 at
  light load); else "below_limits".
- `q`: `mean_queue_ms / mean_ttft_ms`, the share of TTFT spent waiting to be scheduled.
- `o`: the share of the serving span that arrivals outran service: (drain - service) / span,
  where span = duration - first arrival, drain = duration - last arrival, and service = mean
  E2EL - mean queueing delay (what a request needs once scheduled). About 0 when the engine
  keeps up, 1 - capacity / offered rate when it does not, and near 1 when everything arrives
  at once.

Scores:

- `underloaded` = 1 - b: the GPUs are idle; the offered load, not the configuration, limits.
- `prefill_compute` = b * c * p * free; labelled "HBM bandwidth (prefill in small chunks)" when
  prefill steps are memory-bound (per-phase counters say so, or no step was compute-bound).
- `decode_compute` = b * c * (1 - p) * free; labelled "HBM bandwidth (decode)" when decode
  steps are mostly memory-bound.
- `communication` = b * k * free * (1 - f_fab): collectives inside nodes. Cluster runs split
  the exposed communication by medium: `f_fab` = fabric share / network share of step time
  (0 without a cluster), and of the fabric's part `g` = congestion share / fabric share (the
  part beyond each transfer's time alone on an idle network).
- `fabric_communication` = b * k * free * f_fab * (1 - g).
- `network_congestion` = b * k * free * f_fab * g.
- `kv_cache_capacity` = max(f_kv, preempted requests / requests).
- `scheduler_max_num_seqs` = f_seqs.
- `scheduler_token_budget` = f_budget_mem.
- `queueing` = max(q, o) * free: waiting that no engine limit explains, i.e. arrivals beyond
  the compute capacity (or bursts).
- `api_server` = `mean_api_server_wait_ms / mean_ttft_ms`: the share of TTFT spent waiting on
  the API server before the engine sees a request (a burst whose paths share a process's CPU;
  `host.request_overhead_s`, `host.api_server_count`). The path's own handling time
  is a fixed latency, not a limit that load reaches.

The GPU-time factors and queueing are scaled by `free` because while an engine limit keeps
requests waiting, the time the GPU spends is a consequence of that limit, not its cause.
Ties rank in `FACTOR_KEYS` order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from simcore.result import RunResult

FACTOR_KEYS = (
    "kv_cache_capacity", "scheduler_max_num_seqs", "scheduler_token_budget",
    "prefill_compute", "decode_compute", "communication", "fabric_communication",
    "network_congestion", "api_server", "queueing", "underloaded",
)
"""Every factor, in tie-break order (engine limits first: they are the causes to act on)."""

LABELS = {
    "kv_cache_capacity": "KV-cache capacity",
    "scheduler_max_num_seqs": "scheduler limit max_num_seqs",
    "scheduler_token_budget": "scheduler token budget (max_num_batched_tokens)",
    "prefill_compute": "prefill compute",
    "decode_compute": "decode compute",
    "communication": "communication (TP all-reduce)",
    "fabric_communication": "communication across nodes (fabric)",
    "network_congestion": "network congestion (shared fabric links)",
    "api_server": "API server (each request's path before the engine)",
    "queueing": "queueing",
    "underloaded": "offered load (underloaded)",
}
"""Plain-word name of each factor; prefill and decode are relabelled when memory-bound."""

SATURATED_SHARE = 0.5
"""Share of busy time at an engine limit from which an engine counts as saturated."""
CONTINUOUS_BUSY = 0.9
"""Busy fraction from which an engine counts as running continuously."""
LOW_BATCH = 0.5
"""Batch and token-budget fill under which a continuously running engine runs at low batch."""

INTRA_NODE_COMM_LABEL = "communication inside nodes (NVLink collectives)"
"""The communication factor's label for cluster runs, which split off the fabric's part."""
HBM_DECODE_LABEL = "HBM bandwidth (decode)"
HBM_PREFILL_LABEL = "HBM bandwidth (prefill in small chunks)"

_LOAD_NUMBERS = ("engine_load", "saturated_fraction_of_busy", "batch_fill_fraction",
                 "token_budget_fill_fraction")
"""The numbers behind `engine_load`, listed with every factor of GPU time."""

_NUMBERS = {
    "kv_cache_capacity": ("steps_waiting_for_kv_fraction", "total_preemptions",
                          "preempted_request_fraction", "max_kv_cache_usage", "num_gpu_blocks",
                          "queue_fraction_of_ttft"),
    "scheduler_max_num_seqs": ("steps_waiting_at_max_num_seqs_fraction", "max_num_seqs",
                               "max_num_running", "max_kv_cache_usage", "queue_fraction_of_ttft"),
    "scheduler_token_budget": ("steps_waiting_at_token_budget_fraction",
                               "steps_waiting_at_token_budget_memory_bound_fraction",
                               "max_num_batched_tokens", "queue_fraction_of_ttft"),
    "prefill_compute": ("gpu_busy_fraction", "prefill_fraction_of_busy",
                        "compute_fraction_of_busy", "compute_bound_step_fraction",
                        "prefix_cache_hit_rate", "queue_fraction_of_ttft", "mean_ttft_ms",
                        *_LOAD_NUMBERS),
    "decode_compute": ("gpu_busy_fraction", "decode_fraction_of_busy",
                       "memory_bound_step_fraction", "compute_bound_step_fraction",
                       "max_num_running", "mean_num_running", "max_num_seqs",
                       "queue_fraction_of_ttft", "mean_tpot_ms", *_LOAD_NUMBERS),
    "communication": ("communication_fraction_of_busy", "communication_bound_step_fraction",
                      "gpus_per_replica", "gpu_busy_fraction", *_LOAD_NUMBERS),
    "fabric_communication": ("communication_fraction_of_busy", "fabric_fraction_of_comm",
                             "network_share_of_request_latency", "gpu_busy_fraction"),
    "network_congestion": ("fabric_fraction_of_comm", "congestion_fraction_of_fabric",
                           "dcqcn_rate_cuts", "pfc_pause_frames", "fabric_drops"),
    "api_server": ("api_server_wait_fraction_of_ttft", "mean_api_server_wait_ms",
                   "mean_api_server_ms", "mean_ttft_ms", "arrival_span_s",
                   "offered_request_rate"),
    "queueing": ("queue_fraction_of_ttft", "overload_fraction", "mean_queue_ms", "mean_ttft_ms",
                 "arrival_span_s", "serve_span_s", "offered_request_rate",
                 "served_request_rate", "max_num_waiting", "gpu_busy_fraction"),
    "underloaded": ("gpu_busy_fraction", "idle_fraction", "queue_fraction_of_ttft",
                    "max_num_running", "max_num_seqs", *_LOAD_NUMBERS),
}


@dataclass(frozen=True, slots=True)
class Factor:
    """One limiting factor: its key, its plain-word label, its score and the numbers behind it."""

    key: str
    label: str
    score: float
    numbers: Mapping[str, float | int | str | None]

    def as_dict(self) -> dict:
        return {"key": self.key, "label": self.label, "score": self.score,
                "numbers": dict(self.numbers)}


@dataclass(frozen=True, slots=True)
class Attribution:
    """Every factor ranked by score (highest first) and the derived signals.

    Invariants: `factors` holds each key of `FACTOR_KEYS` once, scores in [0, 1], sorted by
    descending score with ties in `FACTOR_KEYS` order.
    """

    factors: tuple[Factor, ...]
    signals: Mapping[str, float | int | str | None]

    @property
    def top(self) -> Factor:
        return self.factors[0]

    def factor(self, key: str) -> Factor:
        for f in self.factors:
            if f.key == key:
                return f
        raise KeyError(key)

    def as_dict(self) -> dict:
        return {"factors": [f.as_dict() for f in self.factors], "signals": dict(self.signals)}


def _clip(x: float) -> float:
    return 0.0 if x != x or x < 0.0 else (1.0 if x > 1.0 else float(x))


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else 0.0


def _merge(dicts: Iterable[Mapping[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = out.get(k, 0.0) + v
    return out


def _num(run: RunResult, name: str) -> float:
    """A top-level number of `run`; None (nothing measured, e.g. no request completed) is 0."""
    v = run.metric(name)
    return 0.0 if v is None else v


def signals(result: RunResult | Mapping) -> dict:
    """The derived quantities the scores are built from (see the module docstring), by name."""
    run = as_run(result)
    reps = run.replicas
    limits = run.limits
    rows = run.requests
    num_steps = sum(r.num_steps for r in reps)
    busy_s = sum(r.busy_s for r in reps)
    compute_s = sum(r.compute_s for r in reps)
    comm_s = sum(r.comm_s for r in reps)
    b = _clip(_num(run, "gpu_busy_fraction"))
    by_bound = _merge(r.steps_by_bound for r in reps)
    n_compute = by_bound.get("compute", 0)
    n_memory = by_bound.get("memory", 0)
    n_comm = by_bound.get("communication", 0)

    # Prefill share of busy time, and whether decode steps are memory-bound.
    phase = _merge(r.step_s_by_phase_bound for r in reps)
    pre = sum(v for k, v in phase.items() if k.startswith("prefill/"))
    dec = sum(v for k, v in phase.items() if k.startswith("decode/"))
    p = _ratio(pre, pre + dec)
    decode_memory_bound = (phase.get("decode/memory", 0.0) >= phase.get("decode/compute", 0.0)
                           and n_memory > 0)
    prefill_memory_bound = (phase.get("prefill/memory", 0.0) > phase.get("prefill/compute", 0.0)
                            and n_memory > 0)
    prefill_compute_bound_share = _ratio(phase.get("prefill/compute", 0.0), pre)

    # Time of the steps that left requests waiting, by reason.
    f_seqs = _clip(_ratio(sum(r.busy_s_waiting_at_max_num_seqs for r in reps), busy_s))
    f_budget = _clip(_ratio(sum(r.busy_s_waiting_at_token_budget for r in reps), busy_s))
    f_kv = _clip(_ratio(sum(r.busy_s_waiting_for_kv_blocks for r in reps), busy_s))
    n_budget = sum(r.num_steps_waiting_at_token_budget for r in reps)
    n_budget_cb = sum(r.num_steps_waiting_at_token_budget_compute_bound for r in reps)
    budget_mem_share = 1.0 - _ratio(n_budget_cb, n_budget) if n_budget else 0.0
    f_budget_mem = f_budget * budget_mem_share

    saturated = min(1.0, f_seqs + f_kv + f_budget)
    max_seqs = limits.max_num_seqs

    # Queueing and overload.
    ttft = _num(run, "mean_ttft_ms")
    queue = _num(run, "mean_queue_ms")
    server = _num(run, "mean_api_server_ms")
    server_wait = _num(run, "mean_api_server_wait_ms")
    q = _clip(_ratio(queue, ttft))
    duration = _num(run, "duration")
    arrivals = [row["arrival_s"] for row in rows]
    o = 0.0
    arrival_span = serve_span = None
    offered = served = None
    if arrivals and duration > 0:
        first, last = min(arrivals), max(arrivals)
        arrival_span = last - first
        serve_span = duration - first
        service_s = max(0.0, _num(run, "mean_e2el_ms") - queue) / 1e3
        o = _clip(_ratio((duration - last) - service_s, serve_span))
        if arrival_span > 0:
            offered = (len(arrivals) - 1) / arrival_span
        if serve_span > 0:
            served = _num(run, "completed") / serve_span

    # Batch occupancy from the time series (samples where a replica had anything running).
    ts = run.timeseries
    running = [n for sample in ts.num_running for n in sample if n > 0]
    waiting_samples = ts.num_waiting
    mean_running = sum(running) / len(running) if running else 0.0
    fill = _num(run, "batch_fill_fraction")
    token_fill = _num(run, "token_budget_fill_fraction")
    cl = run.cluster
    net_share = cl.share("network_share_of_step_time") if cl else 0.0
    fabric_share = cl.share("fabric_share_of_step_time") if cl else 0.0
    congestion_share = cl.share("congestion_share_of_step_time") if cl else 0.0
    return {
        "cluster": cl is not None,
        "fabric_fraction_of_comm": _clip(_ratio(fabric_share, net_share)),
        "congestion_fraction_of_fabric": _clip(_ratio(congestion_share, fabric_share)),
        "network_share_of_request_latency": (cl.share("network_share_of_request_latency")
                                             if cl else None),
        "dcqcn_rate_cuts": cl.fabric("dcqcn_rate_cuts") if cl else None,
        "pfc_pause_frames": cl.fabric("pfc_pause_frames") if cl else None,
        "fabric_drops": cl.fabric("drops") if cl else None,
        "gpu_busy_fraction": b,
        "idle_fraction": 1.0 - b,
        "compute_fraction_of_busy": _clip(_ratio(compute_s, busy_s)),
        "communication_fraction_of_busy": _clip(_ratio(comm_s, busy_s)),
        "step_overhead_fraction_of_busy": _clip(1.0 - _ratio(compute_s + comm_s, busy_s))
        if busy_s > 0 else 0.0,
        "prefill_fraction_of_busy": p,
        "decode_fraction_of_busy": 1.0 - p if busy_s > 0 or num_steps else 0.0,
        "decode_memory_bound": decode_memory_bound,
        "prefill_memory_bound": prefill_memory_bound,
        "prefill_compute_bound_share": prefill_compute_bound_share,
        "compute_bound_step_fraction": _ratio(n_compute, num_steps),
        "memory_bound_step_fraction": _ratio(n_memory, num_steps),
        "communication_bound_step_fraction": _ratio(n_comm, num_steps),
        "steps_waiting_at_max_num_seqs_fraction": f_seqs,
        "steps_waiting_at_token_budget_fraction": f_budget,
        "steps_waiting_at_token_budget_memory_bound_fraction": f_budget_mem,
        "steps_waiting_for_kv_fraction": f_kv,
        "engine_limit_fraction": min(1.0, f_seqs + f_kv + f_budget_mem),
        "saturated_fraction_of_busy": saturated,
        "mean_batch_seqs": _num(run, "mean_batch_seqs"),
        "batch_fill_fraction": fill,
        "token_budget_fill_fraction": token_fill,
        "engine_load": engine_load(b, saturated, fill, token_fill),
        "queue_fraction_of_ttft": q,
        "api_server_wait_fraction_of_ttft": _clip(_ratio(server_wait, ttft)),
        "mean_api_server_ms": server,
        "mean_api_server_wait_ms": server_wait,
        "overload_fraction": o,
        "mean_queue_ms": queue,
        "mean_ttft_ms": ttft,
        "mean_tpot_ms": run.metric("mean_tpot_ms"),
        "arrival_span_s": arrival_span,
        "serve_span_s": serve_span,
        "offered_request_rate": offered,
        "served_request_rate": served,
        "total_preemptions": _num(run, "total_preemptions"),
        "preempted_request_fraction": _clip(_ratio(_num(run, "num_preempted_requests"),
                                                   _num(run, "num_requests"))),
        "max_kv_cache_usage": run.metric("max_kv_cache_usage"),
        "num_gpu_blocks": limits.num_gpu_blocks,
        "max_num_seqs": max_seqs,
        "max_num_batched_tokens": limits.max_num_batched_tokens,
        "max_num_running": max((r.max_num_running for r in reps), default=0),
        "mean_num_running": mean_running,
        "max_num_waiting": max((r.max_num_waiting for r in reps), default=0),
        "waiting_sample_fraction": _ratio(sum(1 for s in waiting_samples if any(s)),
                                          len(waiting_samples)),
        "prefix_cache_hit_rate": run.metric("prefix_cache_hit_rate"),
        "gpus_per_replica": run.num_gpus_per_replica if reps else None,
    }


def as_run(result: RunResult | Mapping) -> RunResult:
    """`result` as a typed RunResult (a `simulate()` dict is read back strictly)."""
    return result if isinstance(result, RunResult) else RunResult.from_dict(result)


def engine_load(busy: float, saturated: float, fill: float, token_fill: float) -> str:
    """How hard the engine works: "saturated", "idle", "low_batch" or "below_limits" (the
    module docstring's `engine_load`)."""
    if saturated >= SATURATED_SHARE:
        return "saturated"
    if busy < CONTINUOUS_BUSY:
        return "idle"
    if fill < LOW_BATCH and token_fill < LOW_BATCH:
        return "low_batch"
    return "below_limits"


def scores(s: Mapping) -> dict[str, float]:
    """Each factor's score from `signals(...)` (formulas in the module docstring)."""
    b = s["gpu_busy_fraction"]
    c = s["compute_fraction_of_busy"]
    p = s["prefill_fraction_of_busy"]
    free = 1.0 - s["engine_limit_fraction"]
    comm = b * s["communication_fraction_of_busy"] * free
    fabric = s["fabric_fraction_of_comm"]
    congestion = s["congestion_fraction_of_fabric"]
    return {
        "kv_cache_capacity": max(s["steps_waiting_for_kv_fraction"],
                                 s["preempted_request_fraction"]),
        "scheduler_max_num_seqs": s["steps_waiting_at_max_num_seqs_fraction"],
        "scheduler_token_budget": s["steps_waiting_at_token_budget_memory_bound_fraction"],
        "prefill_compute": b * c * p * free,
        "decode_compute": b * c * (1.0 - p) * free,
        "communication": comm * (1.0 - fabric),
        "fabric_communication": comm * fabric * (1.0 - congestion),
        "network_congestion": comm * fabric * congestion,
        "api_server": s["api_server_wait_fraction_of_ttft"],
        "queueing": max(s["queue_fraction_of_ttft"], s["overload_fraction"]) * free,
        "underloaded": s["idle_fraction"],
    }


def attribute(result: RunResult | Mapping) -> Attribution:
    """Rank the factors that limit the run behind `result` (a RunResult, or a `simulate()`
    dict, which must hold every section: a missing one raises `ResultError` naming it)."""
    s = signals(result)
    sc = scores(s)
    order = {k: i for i, k in enumerate(FACTOR_KEYS)}
    factors = []
    for key in FACTOR_KEYS:
        label = LABELS[key]
        if key == "decode_compute" and s["decode_memory_bound"]:
            label = HBM_DECODE_LABEL
        elif key == "prefill_compute" and s["prefill_memory_bound"]:
            label = HBM_PREFILL_LABEL
        elif key == "communication" and s["cluster"]:
            label = INTRA_NODE_COMM_LABEL
        factors.append(Factor(key, label, _clip(sc[key]),
                              {name: s[name] for name in _NUMBERS[key]}))
    factors.sort(key=lambda f: (-f.score, order[f.key]))
    return Attribution(tuple(factors), s)
