"""What the benchmark client saw of each request, summarized with `vllm bench serve`'s exact definitions."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from simcore.errors import ConfigError
from simcore import token_times as _tt
from simcore.records import RecordStore, RequestRecord
from simcore.token_times import (PooledGaps, blockwise_std, median_of, median_ranks,
                                 percentile_of, percentile_points)

GOODPUT_SLO_NAMES = ("ttft", "tpot", "e2el")
"""Metrics a goodput SLO may bound (`vllm bench serve --goodput NAME:MS`)."""

MS_PER_S = 1000
"""vLLM scales seconds to milliseconds by multiplying by this after taking each statistic."""


def percentile_word(p: float) -> str:
    """vLLM's spelling of a percentile in a key: 99 -> "99", 99.9 -> "99.9", 50.0 -> "50"."""
    p = float(p)
    return str(int(p)) if int(p) == p else str(p)


def latency_stats(values_s: np.ndarray, metric: str,
                  percentiles: Sequence[float]) -> dict[str, float]:
    """`mean_/median_/std_/p{P}_{metric}_ms` of latencies given in seconds, as vLLM reports them.

    Population std (ddof 0), percentiles by numpy's linear interpolation, each statistic taken
    in seconds and then multiplied by 1000. An empty list gives 0 everywhere: vLLM takes its
    statistics of `values or 0`. (A run's pooled ITLs, one per token, are not an array:
    `pooled_latency_stats`.)
    """
    x = values_s if values_s.size else np.zeros(1)
    stats = {
        f"mean_{metric}_ms": float(np.mean(x) * MS_PER_S),
        f"median_{metric}_ms": float(np.median(x) * MS_PER_S),
        f"std_{metric}_ms": float(blockwise_std(x) * MS_PER_S),
    }
    for p in percentiles:
        stats[f"p{percentile_word(p)}_{metric}_ms"] = float(np.percentile(x, float(p)) * MS_PER_S)
    return stats


@dataclass(frozen=True, slots=True)
class _Streams:
    """Successful requests' token streams reduced to what `summarize` reports (the per-token
    arrays are made a block at a time and not kept)."""

    send_s: np.ndarray  # per successful request
    prompt_len: np.ndarray  # per successful request
    num_output_tokens: np.ndarray  # per successful request: tokens received
    ttft_s: np.ndarray  # per successful request
    e2el_s: np.ndarray  # per successful request
    itl: PooledGaps  # every gap between consecutive chunks of a request, request after request
    max_output_tokens_per_s: float  # `_Peaks`
    max_concurrent_requests: int


def pooled_latency_stats(pooled: PooledGaps, metric: str,
                         percentiles: Sequence[float]) -> dict[str, float]:
    """`latency_stats` of the pooled gaps, the same floats, with no per-token array: the mean
    and the std by numpy's pairwise summation over the gaps made a block at a time, the median
    and percentiles from their order statistics (`PooledGaps`)."""
    n = pooled.size
    if n == 0:
        return latency_stats(np.empty(0), metric, percentiles)
    mean, std = pooled.mean_std()
    ranks = set(median_ranks(n))
    for p in percentiles:
        ranks |= set(percentile_points(n, float(p))[:2])
    kth = pooled.order_statistics(ranks).__getitem__
    stats = {
        f"mean_{metric}_ms": float(mean * MS_PER_S),
        f"median_{metric}_ms": float(median_of(kth, n) * MS_PER_S),
        f"std_{metric}_ms": float(std * MS_PER_S),
    }
    for p in percentiles:
        stats[f"p{percentile_word(p)}_{metric}_ms"] = float(percentile_of(kth, n, float(p))
                                                            * MS_PER_S)
    return stats


def _pack(records: Sequence[RequestRecord], ok: np.ndarray | None = None,
          role_chunk: bool = False) -> _Streams:
    """The successful requests' streams of `records` (a `RecordStore` or a sequence of records);
    `ok`, the successful ones' indices if already known; `role_chunk`, `summarize`'s."""
    store = RecordStore.of(records)
    if ok is None:
        ok = np.flatnonzero(store.success)
    n = ok.size
    num_tokens = store.num_tokens[ok]
    empty = ok[num_tokens == 0]
    if empty.size:
        raise ValueError(f"request {store.ids[empty[0]]!r} is marked successful but received "
                         "no token")
    send = store.send_s[ok]
    unsent = ok[np.isnan(send)]
    if unsent.size:
        raise ValueError(f"request {store.ids[unsent[0]]!r} is marked successful but has no "
                         "send_s")
    ttft_s, e2el_s = store.first_token_s[ok] - send, store.last_token_s[ok] - send
    # One pass over the tokens, a block of requests at a time: the chunks per request, the
    # one-second buckets of the chunk times, the pooled gaps counted.
    itl = PooledGaps(lambda i, j: store.token_block(ok[i:j]), num_tokens, role_chunk)
    peaks = _Peaks(send, e2el_s)
    itl.scan(peaks.add)
    peak_tokens, peak_requests = peaks.result()
    return _Streams(
        send_s=send,
        prompt_len=store.prompt_len[ok],
        num_output_tokens=num_tokens,
        ttft_s=ttft_s,
        e2el_s=e2el_s,
        itl=itl,
        max_output_tokens_per_s=peak_tokens,
        max_concurrent_requests=peak_requests,
    )


def _validate_slos(goodput_slos_ms: Mapping[str, float]) -> None:
    for name, value_ms in goodput_slos_ms.items():
        if name not in GOODPUT_SLO_NAMES:
            raise ConfigError(f"goodput SLO {name!r} is not one of {list(GOODPUT_SLO_NAMES)}")
        if value_ms < 0:
            raise ConfigError(f"goodput SLO {name!r} is {value_ms} ms; it must be non-negative")


DENSE_PEAK_BUCKETS = 2_000_000
"""Runs of up to this many seconds (23 days) count their peaks in arrays a second (some 64 MB at
most); longer ones (requests spread over years) count only the seconds that have something, the
same peaks."""


class _Peaks:
    """vLLM's `max_output_tokens_per_s` and `max_concurrent_requests`, from one-second buckets,
    the chunk times added a block at a time.

    Buckets start at the earliest send of a successful request. A chunk counts once in the
    bucket `int(t - t0)`; a request counts as in flight in every bucket from `int(send - t0)`
    to `int(send + e2el - t0)`, both included. Past `DENSE_PEAK_BUCKETS` buckets only those
    holding a chunk or a request's first or last bucket are kept (the same maxima).
    """

    __slots__ = ("send_s", "end_s", "t0", "num_buckets", "tokens_per_bucket")

    def __init__(self, send_s: np.ndarray, e2el_s: np.ndarray) -> None:
        self.send_s = send_s
        self.end_s = send_s + e2el_s
        self.t0 = float(send_s.min()) if send_s.size else 0.0
        self.num_buckets = (int(np.ceil(self.end_s.max() - self.t0)) + 1 if send_s.size
                            else 0)
        # An array a bucket, or a dict of the buckets that have chunks.
        self.tokens_per_bucket = (np.zeros(self.num_buckets, dtype=np.int64)
                                  if self.num_buckets <= DENSE_PEAK_BUCKETS else {})

    def add(self, chunk_times_s: np.ndarray) -> None:
        num_buckets = self.num_buckets
        counts = self.tokens_per_bucket
        block = _tt._BLOCK
        for a in range(0, chunk_times_s.size, block):      # per block: bounded temporaries
            bucket = (chunk_times_s[a:a + block] - self.t0).astype(np.int64)  # as int()
            bucket = bucket[(bucket >= 0) & (bucket < num_buckets)]
            if isinstance(counts, dict):
                for b, n in zip(*(x.tolist() for x in np.unique(bucket, return_counts=True))):
                    counts[b] = counts.get(b, 0) + n
            else:
                counts += np.bincount(bucket, minlength=num_buckets)

    def result(self) -> tuple[float, int]:
        if self.send_s.size == 0:
            return 0.0, 0
        num_buckets = self.num_buckets
        first_bucket = (self.send_s - self.t0).astype(np.int64)
        last_bucket = (self.end_s - self.t0).astype(np.int64)
        counts = self.tokens_per_bucket
        if isinstance(counts, dict):
            # The count in flight changes only where a request's first bucket or the one after
            # its last is; between them it holds.
            at, inverse = np.unique(np.concatenate([first_bucket, last_bucket + 1]),
                                    return_inverse=True)
            delta = np.bincount(inverse, weights=np.concatenate(
                [np.ones(first_bucket.size), -np.ones(last_bucket.size)]))
            in_flight = np.cumsum(delta)[at < num_buckets]
            return float(max(counts.values(), default=0)), int(in_flight.max())
        in_flight_delta = np.bincount(first_bucket, minlength=num_buckets + 1) - np.bincount(
            last_bucket + 1, minlength=num_buckets + 1
        )
        in_flight = np.cumsum(in_flight_delta)[:num_buckets]
        return float(counts.max()), int(in_flight.max())


def summarize(
    records: Sequence[RequestRecord],
    *,
    selected_percentiles: Iterable[float] = (99,),
    goodput_slos_ms: Mapping[str, float] | None = None,
    request_rate: float = math.inf,
    burstiness: float = 1.0,
    max_concurrency: int | None = None,
    model_id: str | None = None,
    benchmark_start_s: float = 0.0,
    role_chunk: bool = False,
) -> dict:
    """The result JSON of `vllm bench serve` (vLLM 0.33, `vllm/benchmarks/serve.py`) for these records.

    Keys and definitions are vLLM's (`calculate_metrics` and the result assembly in `benchmark`
    and `main`); `records` are all requests of the run, in send order:

    - `duration`: from `benchmark_start_s` (the origin of the arrival schedule, where vLLM starts
      its clock before the first inter-arrival delay) to the end of the last request, failed
      ones included.
    - Only successful requests enter token counts and latencies; `failed` counts the rest.
      TTFT = first token - send; E2EL = last token - send; ITL = every gap between consecutive
      chunks of a request, all requests pooled; TPOT = (E2EL - TTFT) / (tokens - 1) for requests
      with more than one token.
    - Throughputs divide by `duration` (0 when the duration is 0, where vLLM would divide by zero).
    - `request_goodput`: requests meeting every given SLO (`slo_ms / 1000 >= value_s`; TPOT
      counts as 0 for one-token outputs), per second; None when no SLO is given.
    - `max_output_tokens_per_s` and `max_concurrent_requests`: peaks over one-second buckets
      (see `_Peaks`); the concurrency peak need not be in the token peak's second.
    - With `role_chunk` (chat completions), each stream opens with vLLM's server's role chunk,
      which holds no token, at its first token's time: vLLM's client takes TTFT at it, counts
      the first token's chunk as an ITL of 0 after it, and counts both chunks in the
      per-second buckets (measured on vLLM 0.11's server: the first token's chunk followed the
      role chunk by 0.0035 ms in median).
    - Statistics for all of ttft, tpot, itl and e2el, whatever vLLM's `--percentile-metrics`
      default ("ttft,tpot,itl") would print; with `max_concurrency`, also `client_queue_time`
      (send - arrival) and, for a finite rate, `e2el_including_client_queue`, as vLLM reports
      them when selected.
    - `request_rate` is the string "inf" for an unbounded rate, as in vLLM's JSON.

    vLLM's per-request lists (`ttfts`, `itls`, `latencies`, ...) and `rtfx` are left out: the
    records themselves hold that detail.
    """
    if not records:
        raise ValueError("cannot summarize a run without requests")
    slos = dict(goodput_slos_ms or {})
    _validate_slos(slos)
    percentiles = [float(p) for p in selected_percentiles]

    store = RecordStore.of(records)
    ok = np.flatnonzero(store.success)
    s = _pack(store, ok, role_chunk)
    tpot_mask = s.num_output_tokens > 1
    tpot_s = (s.e2el_s[tpot_mask] - s.ttft_s[tpot_mask]) / (s.num_output_tokens[tpot_mask] - 1)

    duration_s = float(store.end_s.max()) - benchmark_start_s
    completed = int(ok.size)
    total_input = int(s.prompt_len.sum())
    total_output = int(s.num_output_tokens.sum())

    def per_s(count: int) -> float:
        return count / duration_s if duration_s > 0 else 0.0

    request_goodput = None
    if slos:
        good = np.ones(completed, dtype=bool)
        if "ttft" in slos:
            good &= slos["ttft"] / MS_PER_S >= s.ttft_s
        if "tpot" in slos:
            tpot_or_zero_s = np.zeros(completed)
            tpot_or_zero_s[tpot_mask] = tpot_s
            good &= slos["tpot"] / MS_PER_S >= tpot_or_zero_s
        if "e2el" in slos:
            good &= slos["e2el"] / MS_PER_S >= s.e2el_s
        request_goodput = per_s(int(good.sum()))

    max_output_tokens_per_s = s.max_output_tokens_per_s
    max_concurrent_requests = s.max_concurrent_requests

    result: dict = {
        "model_id": model_id,
        "num_prompts": len(records),
        "request_rate": request_rate if request_rate < math.inf else "inf",
        "burstiness": burstiness,
        "max_concurrency": max_concurrency,
        "duration": duration_s,
        "completed": completed,
        "failed": len(records) - completed,
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": per_s(completed),
        "request_goodput": request_goodput,
        "output_throughput": per_s(total_output),
        "total_token_throughput": per_s(total_input + total_output),
        "max_output_tokens_per_s": max_output_tokens_per_s,
        "max_concurrent_requests": max_concurrent_requests,
    }
    result |= latency_stats(s.ttft_s, "ttft", percentiles)
    result |= latency_stats(tpot_s, "tpot", percentiles)
    result |= pooled_latency_stats(s.itl, "itl", percentiles)
    result |= latency_stats(s.e2el_s, "e2el", percentiles)
    if max_concurrency is not None:
        client_queue_s = s.send_s - store.arrival_s[ok]
        result |= latency_stats(client_queue_s, "client_queue_time", percentiles)
        if request_rate < math.inf:
            result |= latency_stats(s.e2el_s + client_queue_s, "e2el_including_client_queue", percentiles)
    return result


def engine_summary(
    records: Sequence[RequestRecord], *, selected_percentiles: Iterable[float] = (50, 99),
    template_tokens: int = 0,
) -> dict:
    """What the engine did to the run's requests, in keys that do not clash with vLLM's.
    `template_tokens`: what the chat template adds to each prompt the engine sees (the records
    hold the client's counts); prompt tokens here are the engine's.

    - `*_queue_ms`: queueing delay, first scheduled - send, over every request the engine
      scheduled at least once (failed or not); same statistics as `latency_stats`.
    - `total_preemptions`, `num_preempted_requests`.
    - `prefix_cache_hit_rate`: cached prompt tokens at first admission / prompt tokens, over
      requests the engine scheduled (0 when none was); the local prefix cache only.
    - `external_kv_hit_rate`: prompt tokens loaded from outside the engine (KV-tier fetches,
      P/D handoffs) / prompt tokens.
    - `mean_api_server_ms`: the mean time a scheduled request spent on the API server's path
      before the engine saw it (the wait for a free server process, its work there and the
      path's latency); `mean_api_server_wait_ms`, the wait alone.
    - `num_requests`, `num_completed`, `num_failed`, and `num_failed_by_error` (error text ->
      count; a failure without text counts under "unknown").
    """
    percentiles = [float(p) for p in selected_percentiles]
    store = RecordStore.of(records)
    send, first = store.send_s, store.first_scheduled_s
    scheduled = ~np.isnan(first) & ~np.isnan(send)
    queue_s = first[scheduled] - send[scheduled] - store.server_s[scheduled]
    queue_s = np.where(queue_s > 0.0, queue_s, 0.0)      # max(0.0, x), -0.0 and NaN as 0.0
    server_s = store.server_s[scheduled]
    prompt_tokens = int(store.prompt_len[scheduled].sum()) + template_tokens * int(
        scheduled.sum())
    cached_tokens = int(store.num_cached_prompt_tokens[scheduled].sum())
    external_tokens = int(store.num_external_prompt_tokens[scheduled].sum())
    success = store.success
    failed_by_error: dict[str, int] = {}
    errors = store.errors
    for i in np.flatnonzero(~success).tolist():
        reason = errors.get(i) or "unknown"
        failed_by_error[reason] = failed_by_error.get(reason, 0) + 1
    num_completed = int(success.sum())
    preemptions = store.num_preemptions
    num_scheduled = int(scheduled.sum())
    summary: dict = {
        "num_requests": len(store),
        "num_completed": num_completed,
        "num_failed": len(store) - num_completed,
        "num_failed_by_error": failed_by_error,
        "total_preemptions": int(preemptions.sum()),
        "num_preempted_requests": int((preemptions > 0).sum()),
        "num_prompt_tokens_scheduled": prompt_tokens,
        "num_cached_prompt_tokens": cached_tokens,
        "prefix_cache_hit_rate": cached_tokens / prompt_tokens if prompt_tokens else 0.0,
        "num_external_prompt_tokens": external_tokens,
        "external_kv_hit_rate": external_tokens / prompt_tokens if prompt_tokens else 0.0,
        "mean_api_server_ms": 1e3 * float(server_s.mean()) if num_scheduled else 0.0,
        "mean_api_server_wait_ms": (1e3 * float(np.mean(store.server_wait_s[scheduled]))
                                    if num_scheduled else 0.0),
    }
    summary |= latency_stats(queue_s, "queue", percentiles)
    return summary
