"""Every top-level metric a result can carry, declared once.

A result of `simcore.simulate.simulate` is a dict whose top level holds `vllm bench serve`'s
keys (`simcore.metrics.summarize`), the engine's (`engine_summary`), the deployment's
(`simcore.simulate.assemble_result`), the load trend (`simcore.saturation.load_trend`), and with
a cluster its headline and fabric-health figures (`simcore.cluster`). `dse.evaluate` adds a few
per-GPU and per-cost figures and, when a study names one, the capacity search's. Each is
declared here with:

- `unit`, and a one-line `description`;
- `better`: "minimize" or "maximize" where one end is plainly better, None for inputs, counts
  and figures that describe the load rather than rate it;
- `scaling`: how it moves with step time, +1 proportionally (latencies, cost per token), -1
  inversely (throughputs, tokens per dollar), 0 not simply (counts, fractions, rates set by the
  arrivals): what a first-order envelope scales;
- `kind`: "prediction" (a figure the step-time model moves: enveloped), "input" (set by the
  configuration or the arrivals), "count" (a tally of requests or tokens sent and completed) or
  "flag" (a true/false verdict, not a number a study can rank: `over_capacity`);
- `when`: the condition under which a result carries it (`CONDITIONS`);
- `by_dse`: computed by `dse.evaluate` from the result, not by the simulator.

The latency statistics are families, not names: `{mean,median,std,pP}_{quantity}_ms` for each
percentile P of `metrics.percentiles` (spelled as `simcore.metrics.percentile_word` spells it:
p99, p99.9). `metric_names(cfg)` lists the numeric names a result of `cfg` will have, without
simulating; `lookup(name)` finds a name's declaration, a family member's included.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from simcore.config import SimConfig

Direction = Literal["minimize", "maximize"] | None
Kind = Literal["prediction", "input", "count", "flag"]

CONDITIONS = {
    "always": "in every result",
    "finite_rate": "with a finite workload.request_rate (inf is reported as the string 'inf')",
    "max_concurrency": "with workload.max_concurrency set",
    "max_concurrency_finite_rate": "with workload.max_concurrency set and a finite "
                                   "workload.request_rate",
    "ramp_up": "with a workload.ramp_up_strategy",
    "goodput": "with goodput SLOs (metrics.goodput)",
    "load_trend": "when arrivals are spread over time (a finite rate, a ramp-up or a trace's own "
                  "timestamps) and number at least simcore.saturation.MIN_REQUESTS",
    "expert_parallel": "with parallelism.enable_expert_parallel",
    "speculative": "with engine.speculative_config",
    "cluster": "with a cluster section",
    "capacity": "in a search trial whose study names one (dse.capacity.find_capacity per trial)",
}
"""When a metric is present: condition key -> the words for it."""


@dataclass(frozen=True, slots=True)
class Metric:
    """One top-level metric of a result."""

    name: str
    unit: str
    better: Direction
    scaling: Literal[-1, 0, 1]
    kind: Kind
    description: str
    when: str = "always"
    by_dse: bool = False

    @property
    def enveloped(self) -> bool:
        """Whether an envelope gives its range (a prediction, not an input or a count)."""
        return self.kind == "prediction"

    @property
    def numeric(self) -> bool:
        """Whether it is a number a study can rank or bound (a flag is not)."""
        return self.kind != "flag"


def _m(name: str, unit: str, better: Direction, scaling: Literal[-1, 0, 1], kind: Kind,
       description: str, when: str = "always", by_dse: bool = False) -> Metric:
    return Metric(name, unit, better, scaling, kind, description, when, by_dse)


MIN, MAX = "minimize", "maximize"

METRICS: tuple[Metric, ...] = (
    # -- vllm bench serve (simcore.metrics.summarize) ------------------------------------------
    _m("num_prompts", "requests", None, 0, "input", "Requests the client sends."),
    _m("request_rate", "requests/s", None, 0, "input", "The configured mean request rate.",
       "finite_rate"),
    _m("burstiness", "gamma shape", None, 0, "input",
       "Gamma shape of the gaps between sends (1 = Poisson)."),
    _m("max_concurrency", "requests", None, 0, "input",
       "The most requests the client keeps in flight.", "max_concurrency"),
    _m("duration", "s", MIN, 0, "prediction",
       "Start of the arrival schedule to the end of the last request (bounded below by the "
       "arrival window, so it does not scale simply)."),
    _m("completed", "requests", MAX, 0, "count", "Requests that succeeded."),
    _m("failed", "requests", MIN, 0, "count",
       "Requests that failed (refused as too long, timed out)."),
    _m("total_input_tokens", "tokens", None, 0, "count", "Prompt tokens of the successful "
       "requests, as the client counts them (a chat request's message text, without its chat "
       "template's tokens)."),
    _m("total_output_tokens", "tokens", None, 0, "count", "Output tokens the successful "
       "requests received."),
    _m("request_throughput", "requests/s", MAX, -1, "prediction",
       "Successful requests per second of the duration."),
    _m("request_goodput", "requests/s", MAX, -1, "prediction",
       "Requests meeting every goodput SLO, per second.", "goodput"),
    _m("output_throughput", "tokens/s", MAX, -1, "prediction",
       "Output tokens per second of the duration."),
    _m("total_token_throughput", "tokens/s", MAX, -1, "prediction",
       "Prompt and output tokens per second of the duration."),
    _m("max_output_tokens_per_s", "tokens/s", MAX, -1, "prediction",
       "Output tokens of the busiest one-second bucket."),
    _m("max_concurrent_requests", "requests", None, 0, "prediction",
       "The most requests in flight in any one-second bucket."),
    _m("ramp_up_start_rps", "requests/s", None, 0, "input",
       "Rate of the first request under the ramp-up.", "ramp_up"),
    _m("ramp_up_end_rps", "requests/s", None, 0, "input",
       "Rate of the last request under the ramp-up.", "ramp_up"),
    # -- the engine (simcore.metrics.engine_summary) -------------------------------------------
    _m("num_requests", "requests", None, 0, "input", "Requests of the run, failed ones "
       "included."),
    _m("num_completed", "requests", MAX, 0, "count", "Requests that succeeded."),
    _m("num_failed", "requests", MIN, 0, "count", "Requests that failed."),
    _m("total_preemptions", "preemptions", MIN, 0, "prediction",
       "Preemptions of running requests (KV blocks ran out)."),
    _m("num_preempted_requests", "requests", MIN, 0, "prediction",
       "Requests preempted at least once."),
    _m("num_prompt_tokens_scheduled", "tokens", None, 0, "count",
       "Prompt tokens of the requests the engine scheduled, as the engine sees them (a chat "
       "request's rendered by its chat template)."),
    _m("num_cached_prompt_tokens", "tokens", MAX, 0, "prediction",
       "Prompt tokens found in the local prefix cache at first admission."),
    _m("prefix_cache_hit_rate", "fraction", MAX, 0, "prediction",
       "Cached prompt tokens over the prompt tokens scheduled."),
    _m("num_external_prompt_tokens", "tokens", None, 0, "prediction",
       "Prompt tokens whose KV was loaded from outside the engine (KV tier, P/D handoff)."),
    _m("external_kv_hit_rate", "fraction", None, 0, "prediction",
       "Externally loaded prompt tokens over the prompt tokens scheduled."),
    _m("mean_api_server_ms", "ms", MIN, 1, "prediction",
       "Mean time on the API server's path before the engine saw a request."),
    _m("mean_api_server_wait_ms", "ms", MIN, 1, "prediction",
       "Mean time on the API server's path beyond the request's own work (the requests "
       "sharing its process)."),
    # -- the deployment (simcore.simulate.assemble_result) -------------------------------------
    _m("num_gpus", "GPUs", None, 0, "input", "GPUs of the deployment."),
    _m("gpu_busy_fraction", "fraction", None, 0, "prediction",
       "Fraction of wall time a step is running, mean over engines."),
    _m("saturated_fraction", "fraction", None, 0, "prediction",
       "Fraction of wall time a step ran while requests waited at an engine limit."),
    _m("mean_batch_seqs", "sequences", None, 0, "prediction",
       "Sequences per step, weighted by step time."),
    _m("batch_fill_fraction", "fraction", None, 0, "prediction",
       "mean_batch_seqs over max_num_seqs."),
    _m("mean_batch_tokens", "tokens", None, 0, "prediction", "Tokens per (non-dummy) step."),
    _m("token_budget_fill_fraction", "fraction", None, 0, "prediction",
       "mean_batch_tokens over max_num_batched_tokens."),
    _m("offered_request_rate", "requests/s", None, 0, "input",
       "Arrivals per second over the second half of the arrival window.", "load_trend"),
    _m("served_request_rate", "requests/s", MAX, 0, "prediction",
       "Requests finished per second over the second half of the arrival window.",
       "load_trend"),
    _m("queue_growth_rps", "requests/s", MIN, 0, "prediction",
       "Slope of the number of requests in the system over that half.", "load_trend"),
    _m("over_capacity", "bool", None, 0, "flag",
       "Whether the queue kept growing (the run did not keep up with its arrivals).",
       "load_trend"),
    _m("output_throughput_per_gpu", "tokens/s/GPU", MAX, -1, "prediction",
       "output_throughput over num_gpus."),
    _m("total_token_throughput_per_gpu", "tokens/s/GPU", MAX, -1, "prediction",
       "total_token_throughput over num_gpus."),
    _m("mean_kv_cache_usage", "fraction", None, 0, "prediction",
       "Mean KV-cache usage over the sampled times."),
    _m("max_kv_cache_usage", "fraction", None, 0, "prediction",
       "Peak KV-cache usage over the sampled times."),
    _m("num_steps", "steps", None, 0, "prediction", "Engine steps, all engines."),
    _m("num_routed_by_prefix", "requests", None, 0, "prediction",
       "Requests the router placed by prefix affinity (prefix_affinity, cache_aware)."),
    _m("communication_fraction_of_busy", "fraction", MIN, 0, "prediction",
       "Share of busy time spent on exposed communication."),
    _m("ep_size", "GPUs", None, 0, "input", "Expert-parallel group size (DP x TP).",
       "expert_parallel"),
    _m("dummy_busy_fraction", "fraction", MIN, 0, "prediction",
       "Share of busy time spent in dummy batches of idle lock-step ranks.", "expert_parallel"),
    _m("all_to_all_fraction_of_busy", "fraction", MIN, 0, "prediction",
       "Share of busy time spent in the MoE all-to-all.", "expert_parallel"),
    # -- speculative decoding (simcore.engine.speculative.spec_decode_summary) -----------------
    _m("spec_decode_num_drafts", "verifications", None, 0, "count",
       "Verifications with at least one draft, all engines (vLLM's spec-decode num_drafts).",
       "speculative"),
    _m("spec_decode_num_draft_tokens", "tokens", None, 0, "count",
       "Draft tokens verified, all engines.", "speculative"),
    _m("spec_decode_num_accepted_tokens", "tokens", None, 0, "count",
       "Draft tokens accepted, all engines.", "speculative"),
    _m("spec_decode_acceptance_rate", "fraction", None, 0, "input",
       "Accepted over verified draft tokens, as drawn from the declared acceptance model.",
       "speculative"),
    _m("spec_decode_acceptance_length", "tokens/step", None, 0, "input",
       "Tokens a verification emits on average: 1 + accepted / drafts (from the declared "
       "acceptance model).", "speculative"),
    # -- the cluster (simcore.cluster HEADLINE_METRICS, FABRIC_HEALTH_METRICS) -----------------
    _m("network_share_of_request_latency", "fraction", MIN, 0, "prediction",
       "Share of request latency spent on exposed communication and KV transfers.", "cluster"),
    _m("network_share_of_step_time", "fraction", MIN, 0, "prediction",
       "Share of step time spent on exposed communication.", "cluster"),
    _m("congestion_share_of_step_time", "fraction", MIN, 0, "prediction",
       "Share of step time spent waiting on fabric congestion.", "cluster"),
    _m("fabric_pfc_pause_frames", "frames", MIN, 0, "prediction",
       "PFC pause frames the fabric sent.", "cluster"),
    _m("fabric_drops", "packets", MIN, 0, "prediction", "Packets the fabric dropped.",
       "cluster"),
    _m("fabric_dcqcn_rate_cuts", "rate cuts", MIN, 0, "prediction",
       "DCQCN sending-rate cuts.", "cluster"),
    _m("fabric_ecn_marks", "marks", MIN, 0, "prediction", "ECN-marked packets.", "cluster"),
    _m("fabric_p99_step_slowdown", "ratio", MIN, 0, "prediction",
       "p99 of the engines' message times over their time alone on an idle network.",
       "cluster"),
    # -- computed by dse.evaluate from the result ----------------------------------------------
    _m("request_throughput_per_gpu", "requests/s/GPU", MAX, -1, "prediction",
       "request_throughput over num_gpus.", by_dse=True),
    _m("output_tokens_per_dollar", "tokens/USD", MAX, -1, "prediction",
       "Output tokens per dollar of GPU time at the study's price.", by_dse=True),
    _m("cost_per_million_output_tokens_usd", "USD/1M tokens", MIN, 1, "prediction",
       "GPU cost of a million output tokens at the study's price.", by_dse=True),
    _m("step_time_relative_uncertainty", "fraction", None, 0, "input",
       "The compute model's declared step-time error bound.", by_dse=True),
    _m("max_sustainable_rate", "requests/s", MAX, -1, "prediction",
       "Highest request rate that meets the study's latency bounds.", "capacity", True),
    _m("max_sustainable_rate_per_gpu", "requests/s/GPU", MAX, -1, "prediction",
       "max_sustainable_rate over num_gpus.", "capacity", True),
    _m("max_sustainable_requests_per_dollar", "requests/USD", MAX, -1, "prediction",
       "Requests per dollar of GPU time at max_sustainable_rate.", "capacity", True),
)

_BY_NAME = {m.name: m for m in METRICS}


@functools.cache
def _family_pattern(quantity: str) -> re.Pattern[str]:
    return re.compile(rf"^(mean|median|std|p\d+(?:\.\d+)?)_{re.escape(quantity)}_ms$")


def percentile_of(name: str, quantity: str) -> float | None:
    """The percentile P of `name` when it is latency `quantity`'s `p{P}_{quantity}_ms`, else
    None (its mean, median, std, or another metric)."""
    match = _family_pattern(quantity).match(name)
    if match is None or not match.group(1).startswith("p"):
        return None
    return float(match.group(1)[1:])


def tail_percentile(names: Iterable[str], quantity: str) -> str | None:
    """Of `names` (a result's keys), the tail percentile of latency `quantity` to read: its
    99th where there is one, else its highest (metrics.percentiles without 99); None when
    `names` hold no percentile of it."""
    pcts = {name: p for name in names if (p := percentile_of(name, quantity)) is not None}
    if f"p99_{quantity}_ms" in pcts:
        return f"p99_{quantity}_ms"
    return max(pcts, key=pcts.__getitem__) if pcts else None


@dataclass(frozen=True, slots=True)
class Family:
    """The statistics of one latency: `mean_`, `median_`, `std_` and `p{P}_{quantity}_ms` for
    each selected percentile P (population std; numpy's linear percentiles; milliseconds)."""

    quantity: str
    description: str
    when: str = "always"
    unit: str = "ms"
    better: Direction = MIN
    scaling: Literal[-1, 0, 1] = 1
    kind: Kind = "prediction"

    @property
    def pattern(self) -> re.Pattern[str]:
        """What its names match: the statistic, then the quantity."""
        return _family_pattern(self.quantity)

    def names(self, percentiles: Iterable[float]) -> list[str]:
        """Its names for these percentiles, mean, median and std first."""
        from simcore.metrics import percentile_word

        stats = ["mean", "median", "std", *(f"p{percentile_word(p)}" for p in percentiles)]
        return [f"{s}_{self.quantity}_ms" for s in stats]

    def member(self, name: str) -> Metric | None:
        """The declaration of `name` if it is one of this family's statistics."""
        match = self.pattern.match(name)
        if match is None:
            return None
        stat = match.group(1)
        words = {"mean": "Mean", "median": "Median", "std": "Standard deviation of"}.get(
            stat, f"{stat[1:]}th percentile of")
        return Metric(name, self.unit, self.better, self.scaling, self.kind,
                      f"{words} {self.description}.", self.when)


FAMILIES: tuple[Family, ...] = (
    Family("ttft", "time to first token (send to first token)"),
    Family("tpot", "time per output token after the first, per request of two or more tokens"),
    Family("itl", "inter-token latency (gaps between a request's streamed chunks, pooled)"),
    Family("e2el", "end-to-end latency (send to last token)"),
    Family("queue", "engine queueing delay (send to first scheduled, the API server's path "
           "left out)"),
    Family("client_queue_time", "the client's wait under max_concurrency (arrival to send)",
           "max_concurrency"),
    Family("e2el_including_client_queue", "end-to-end latency including the client's wait",
           "max_concurrency_finite_rate"),
)


def lookup(name: str) -> Metric | None:
    """The declaration of a top-level metric name (a family member's included); None if the
    name is not one."""
    m = _BY_NAME.get(name)
    if m is not None:
        return m
    for f in FAMILIES:
        m = f.member(name)
        if m is not None:
            return m
    return None


def scaling(name: str) -> int:
    """How `name` moves with step time (+1, -1, 0); 0 for a name the catalog does not know."""
    m = lookup(name)
    return m.scaling if m is not None else 0


def enveloped(name: str) -> bool:
    """Whether `name` is a prediction an envelope ranges (False for inputs, counts, flags and
    names the catalog does not know)."""
    m = lookup(name)
    return m is not None and m.enveloped


def better_direction(name: str) -> Direction:
    """"minimize" or "maximize" where one end of `name` is plainly better, else None."""
    m = lookup(name)
    return m.better if m is not None else None


def names_when(condition: str) -> tuple[str, ...]:
    """The numeric single metrics (not families) present under `condition`, in catalog order."""
    return tuple(m.name for m in METRICS if m.when == condition and m.numeric)


def dse_metrics() -> tuple[str, ...]:
    """The metrics dse computes from a result for every trial (capacity ones left out)."""
    return tuple(m.name for m in METRICS if m.by_dse and m.when == "always")


def conditions(cfg: SimConfig) -> set[str]:
    """The `CONDITIONS` that hold for a result of `cfg` (its simulation, not a search's)."""
    w = cfg.workload
    finite = math.isfinite(w.request_rate)
    holds = {"always"}
    if finite:
        holds.add("finite_rate")
    if w.max_concurrency is not None:
        holds.add("max_concurrency")
        if finite:
            holds.add("max_concurrency_finite_rate")
    if w.ramp_up_strategy is not None:
        holds.add("ramp_up")
    if cfg.metrics.goodput:
        holds.add("goodput")
    if cfg.parallelism.enable_expert_parallel:
        holds.add("expert_parallel")
    if cfg.engine.speculative_config is not None:
        holds.add("speculative")
    if cfg.cluster is not None:
        holds.add("cluster")
    if shows_load_trend(cfg):
        holds.add("load_trend")
    return holds


def shows_load_trend(cfg: SimConfig) -> bool:
    """Whether `simcore.saturation.load_trend` is defined for a run of `cfg`: at least
    MIN_REQUESTS requests whose arrivals do not all fall at one instant.

    Synthetic and sampled datasets send exactly the resolved num_prompts; their arrivals are
    spread by a finite rate or a ramp-up. A timed trace's requests (how many fall in its window,
    when) are read from its file, as the run reads them; a file that cannot be read raises the
    run's ConfigError.
    """
    from simcore.saturation import MIN_REQUESTS
    from simcore.workload.config import TIMED_TRACES

    w = cfg.workload
    timed = isinstance(w.dataset, TIMED_TRACES) and w.dataset.use_timestamps
    n = w.resolved_num_prompts
    if not timed and n is not None:
        return n >= MIN_REQUESTS and (math.isfinite(w.request_rate)
                                      or w.ramp_up_strategy is not None)
    from simcore.workload.generate import config_requests

    stream = config_requests(cfg)
    if len(stream) < MIN_REQUESTS:
        return False
    arrivals = [r.arrival_s for r in stream]
    span = (max(arrivals) - min(arrivals)) / 2
    return span > 0 and math.isfinite(span)


def metric_names(cfg: SimConfig, *, dse: bool = False) -> set[str]:
    """The numeric top-level names a result of `cfg` will have (ints and floats; not the flag
    `over_capacity`, not strings, not None), without simulating it. With `dse`, also those
    `dse.evaluate` computes for a search trial (the capacity ones included: a study may name
    them)."""
    holds = conditions(cfg) | ({"capacity"} if dse else set())
    names = {m.name for m in METRICS
             if m.numeric and m.when in holds and (dse or not m.by_dse)}
    for f in FAMILIES:
        if f.when in holds:
            names.update(f.names(cfg.metrics.percentiles))
    return names
