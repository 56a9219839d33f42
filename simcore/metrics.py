"""What the benchmark client saw of each request, summarized with `vllm bench serve`'s exact definitions."""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain

import numpy as np

from simcore.errors import ConfigError

GOODPUT_SLO_NAMES = ("ttft", "tpot", "e2el")
"""Metrics a goodput SLO may bound (`vllm bench serve --goodput NAME:MS`)."""

MS_PER_S = 1000
"""vLLM scales seconds to milliseconds by multiplying by this after taking each statistic."""


class TokenTimes:
    """A request's token arrival times as they reach the client, in order, held as ranges of
    its engine's delivery log (`DeliveryLog`: one entry per step that delivered tokens, shared
    by every request of the engine) where they come from one, and as single times otherwise, so
    that a request costs a few words however many tokens it streams. Reads like a sequence of
    floats: `len`, iteration (flat, in order), `[i]` and `numpy.asarray`."""

    __slots__ = ("_parts", "_log", "_a", "_b", "_n")

    def __init__(self, times: Iterable[float] = ()) -> None:
        self._parts: list = [float(t) for t in times]   # single times and closed (log, a, b)
        self._log = None                                  # the open range: _log[_a:_b]
        self._a = self._b = 0
        self._n = len(self._parts)

    def _close(self) -> None:
        if self._b > self._a:
            self._parts.append((self._log, self._a, self._b))
        self._log = None
        self._a = self._b = 0

    def append(self, t: float) -> None:
        """One token at `t`, not from a delivery log."""
        if self._log is not None:
            self._close()
        self._parts.append(t)
        self._n += 1

    def extend(self, times: Iterable[float]) -> None:
        for t in times:
            self.append(t)

    def add_range(self, log: "DeliveryLog", a: int, b: int) -> None:
        """One token at each of `log`'s entries a .. b - 1 (a < b)."""
        if log is self._log and a == self._b:
            self._b = b
        else:
            if self._log is not None:
                self._close()
            if a < b:
                self._log, self._a, self._b = log, a, b
        self._n += b - a

    def _chunks(self):
        for p in self._parts:
            if type(p) is tuple:
                log, a, b = p
                yield log.times[a:b]
            else:
                yield (p,)
        if self._b > self._a:
            yield self._log.times[self._a:self._b]

    def __len__(self) -> int:
        return self._n

    def __iter__(self):
        return chain.from_iterable(self._chunks())

    def __getitem__(self, i: int) -> float:
        if not isinstance(i, int):
            raise TypeError("token times are indexed by an integer")
        n = self._n
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("token index out of range")
        if i == n - 1 and self._b > self._a:
            return self._log.times[self._b - 1]
        for c in self._chunks():
            if i < len(c):
                return c[i]
            i -= len(c)
        raise IndexError("token index out of range")   # unreachable: counts are kept

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return np.fromiter(self, dtype=np.float64 if dtype is None else dtype, count=self._n)

    def __eq__(self, other) -> bool:
        try:
            return len(other) == self._n and all(a == b for a, b in zip(self, other))
        except TypeError:
            return NotImplemented

    __hash__ = None

    def __repr__(self) -> str:
        return f"TokenTimes({list(self)!r})"


class DeliveryLog:
    """An engine's token-delivery instants, one per step that delivered tokens to clients, in
    order (`array('d')`, 8 bytes a step); requests' `TokenTimes` hold ranges of it."""

    __slots__ = ("times",)

    def __init__(self) -> None:
        self.times = array("d")

    def __len__(self) -> int:
        return len(self.times)


@dataclass(slots=True)
class RequestRecord:
    """What the benchmark client (and, for the extras, the engine) observed of one request.

    Lifecycle: created when the request arrives at the client (`arrival_s`, the intended send
    time); `send_s` is set when it leaves the client, after any `--max-concurrency` wait; one
    time is added to `token_times_s` (a `TokenTimes`; a list in hand-made records) each time
    an output token reaches the client, in order; at the end `success` is set, or `error` says why the request failed. Tokens that
    reach the client at the same instant count as one streamed chunk, as several tokens in
    one server-sent event do for vLLM's client. The engine fills `first_scheduled_s` (first
    time the scheduler gave it tokens), `num_preemptions`, `num_cached_prompt_tokens`
    (prefix-cache hit at first admission) and `replica`.

    Invariants when `success` is true: `send_s` is set, `token_times_s` is non-empty,
    non-decreasing and not before `send_s`.
    """

    request_id: str
    prompt_len: int
    output_len: int
    arrival_s: float
    send_s: float | None = None
    token_times_s: TokenTimes | list[float] | np.ndarray = field(default_factory=TokenTimes)
    success: bool = False
    error: str | None = None
    finished_s: float | None = None
    """When the client saw the response end (last token or error); None: derive it."""
    first_scheduled_s: float | None = None
    server_s: float = 0.0
    """Time on the API server's path between the send and the engine (its wait for a free
    server process, its work there, the path's latency): part of TTFT, not of the engine's
    queue."""
    server_wait_s: float = 0.0
    """The part of `server_s` spent waiting for a free API server process."""
    num_preemptions: int = 0
    num_cached_prompt_tokens: int = 0
    num_external_prompt_tokens: int = 0
    """Prompt tokens whose KV was loaded from outside the engine (a KV-tier fetch, or the P/D
    handoff from the prefill instance) instead of computed or found in its prefix cache."""
    replica: int | None = None
    network_s: float = 0.0
    """Cluster runs: time of this request's steps spent on exposed communication (each step's
    communication share of its duration, summed over the steps that scheduled it), plus the
    time it waited for its KV cache to cross the network (P/D handoff, KV-tier fetch)."""

    @property
    def end_s(self) -> float:
        """When the client was done with it: `finished_s`, else the last token, else the send (or arrival)."""
        if self.finished_s is not None:
            return self.finished_s
        if len(self.token_times_s):
            return float(self.token_times_s[-1])
        return self.send_s if self.send_s is not None else self.arrival_s


def percentile_word(p: float) -> str:
    """vLLM's spelling of a percentile in a key: 99 -> "99", 99.9 -> "99.9", 50.0 -> "50"."""
    p = float(p)
    return str(int(p)) if int(p) == p else str(p)


def pairwise_sum(x: np.ndarray | None, part=None, leaf: int = 1 << 16,
                 size: int | None = None) -> float:
    """`np.add.reduce(x)` of a contiguous float64 array to the bit, by numpy's own pairwise
    summation tree (halves rounded down to a multiple of 8, recursively), reducing leaves of at
    most `leaf` (at least 128) elements with numpy itself: the same tree, with `part(a, b)`
    (default `x[a:b]`) giving each leaf's values, so that a sum of a transform of `x`, or of
    values made as they are read (`size` of them, no `x`), never holds all of them. Leaves are
    asked for in order, each starting where the last ended."""
    get = part if part is not None else (lambda a, b: x[a:b])
    leaf = max(leaf, 128)       # numpy sums at most 128 elements without splitting

    def rec(a: int, m: int) -> float:
        if m <= leaf:
            return np.add.reduce(get(a, a + m))
        m2 = m // 2
        m2 -= m2 % 8
        left = rec(a, m2)
        return left + rec(a + m2, m - m2)
    return rec(0, x.size if size is None else size)


def _std(x: np.ndarray) -> np.float64:
    """`np.std(x)` to the bit without its full-size temporary (x - mean)**2: the same
    deviations, squared a block at a time and summed in numpy's tree (`pairwise_sum`)."""
    if x.size <= _BLOCK:
        return np.std(x)
    n = x.size
    mean = np.add.reduce(x) / n
    return np.sqrt(pairwise_sum(x, lambda a, b: np.square(x[a:b] - mean), leaf=_BLOCK) / n)


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
        f"std_{metric}_ms": float(_std(x) * MS_PER_S),
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
    itl: "_PooledGaps"  # every gap between consecutive chunks of a request, request after request
    max_output_tokens_per_s: float  # `_Peaks`
    max_concurrent_requests: int


_BLOCK = 1 << 20
"""Elements per pass of the array work on per-token arrays (bounds their temporaries)."""

_KEY_SHIFT = 44
"""Order statistics of the pooled gaps are found by the top 20 bits of their float64 patterns
(sign, exponent and 8 bits of mantissa: buckets 0.4% wide), which order non-negative floats."""


class _PooledGaps:
    """The pooled ITLs of a run: the gaps between consecutive chunks of each successful request,
    request after request (`np.diff` of the chunk times without the gaps that cross from one
    request to the next), made from the requests' token times a block of requests at a time
    (`blocks`, as often as asked) and never all held. Made by `_pack`'s pass, which counts them
    (`size`) and the top bits of their floats (`key_counts`)."""

    __slots__ = ("_successes", "_num_tokens", "size", "key_counts")

    def __init__(self, successes, num_tokens: np.ndarray) -> None:
        self._successes = successes
        self._num_tokens = num_tokens
        self.size = 0
        self.key_counts = np.zeros(1 << (64 - _KEY_SHIFT), dtype=np.int64)

    def _chunk_blocks(self):
        """(chunk times, chunks per request, first request, end request) per block of whole
        requests of about `_BLOCK` tokens (one request of more tokens is a block of its own);
        the chunk times are the block's own buffer."""
        recs, nt = self._successes, self._num_tokens
        ends = np.cumsum(nt)
        i, n = 0, len(recs)
        while i < n:
            base = ends[i] - nt[i]
            j = max(i + 1, int(np.searchsorted(ends, base + _BLOCK, side="right")))
            k = int(ends[j - 1] - base)
            times = np.fromiter(chain.from_iterable(r.token_times_s for r in recs[i:j]),
                                dtype=np.float64, count=k)
            last = ends[i:j] - base - 1
            first = last - nt[i:j] + 1
            # A token that arrives at the same instant as the previous one of its request
            # travels in the same chunk: vLLM's client times chunks, not tokens.
            new_chunk = np.empty(k, dtype=bool)
            np.not_equal(times[1:], times[:-1], out=new_chunk[1:])
            new_chunk[first] = True
            chunks = np.add.reduceat(new_chunk, first, dtype=np.int64)
            # Every token its own chunk (no speculative decoding): the token times are the
            # chunk times.
            chunk_times = times if new_chunk.all() else times[new_chunk]
            yield chunk_times, chunks, i, j
            i = j

    def blocks(self):
        """The gaps, in order, an array per block."""
        for chunk_times, chunks, _, _ in self._chunk_blocks():
            yield _gaps_within(chunk_times, chunks)

    def _count(self, gaps: np.ndarray) -> None:
        if gaps.size and gaps.min() < 0:
            raise ValueError("a request's token times decrease")
        self.size += gaps.size
        self.key_counts += np.bincount(gaps.view(np.int64) >> _KEY_SHIFT,
                                       minlength=self.key_counts.size)


class _Reader:
    """Consecutive ranges of the concatenation of `blocks` (each range starting where the last
    ended), as `pairwise_sum` asks for its leaves."""

    __slots__ = ("_blocks", "_block", "_at", "_pos", "transform")

    def __init__(self, blocks, transform=None) -> None:
        self._blocks = iter(blocks)
        self._block = np.empty(0)
        self._at = 0          # position in the current block
        self._pos = 0         # position in the concatenation
        self.transform = transform

    def take(self, a: int, b: int) -> np.ndarray:
        if a != self._pos:
            raise ValueError("ranges must be read in order")
        parts = []
        m = b - a
        while m:
            blk, at = self._block, self._at
            if at == blk.size:
                self._block = blk = next(self._blocks)
                if self.transform is not None:
                    self._block = blk = self.transform(blk)
                self._at = at = 0
                continue
            k = min(m, blk.size - at)
            parts.append(blk[at:at + k])
            self._at = at + k
            m -= k
        self._pos = b
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _kth_values(pooled: _PooledGaps, ranks: set[int], blocks=None) -> dict[int, float]:
    """The order statistics of the pooled gaps at `ranks` (0 the smallest), exactly: the
    buckets that hold them by `key_counts`, then those buckets' distinct values and counts
    over a pass (`blocks`, default a fresh one)."""
    cum = np.cumsum(pooled.key_counts)
    where = {r: int(np.searchsorted(cum, r, side="right")) for r in ranks}
    keys = np.array(sorted(set(where.values())), dtype=np.int64)
    found_v, found_c = [], []
    for gaps in (blocks if blocks is not None else pooled.blocks()):
        sel = gaps[np.isin(gaps.view(np.int64) >> _KEY_SHIFT, keys)]
        if sel.size:
            v, c = np.unique(sel, return_counts=True)
            found_v.append(v)
            found_c.append(c)
    values, inverse = np.unique(np.concatenate(found_v), return_inverse=True)
    counts = np.bincount(inverse, weights=np.concatenate(found_c)).astype(np.int64)
    value_keys = values.view(np.int64) >> _KEY_SHIFT
    out = {}
    for r in ranks:
        key = where[r]
        in_key = value_keys == key
        c = counts[in_key]
        # The rank of each distinct value's first copy: the gaps in the buckets below its
        # own, then the copies before it in its bucket.
        start = (cum[key - 1] if key > 0 else 0) + np.cumsum(c) - c
        out[r] = float(values[in_key][int(np.searchsorted(start, r, side="right")) - 1])
    return out


def _percentile_of(kth: Callable[[int], float], n: int, q: float) -> np.float64:
    """`np.percentile` (linear) of n values whose k-th smallest is `kth(k)`, to the bit:
    numpy's virtual index (n - 1) x q / 100 and its two-sided interpolation."""
    quantile = np.true_divide(np.float64(q), 100)
    virtual = (n - 1) * quantile
    lo = int(np.floor(virtual))
    hi = min(lo + 1, n - 1)
    gamma = virtual - lo
    a, b = np.float64(kth(lo)), np.float64(kth(hi))
    diff = b - a
    if gamma >= 0.5:
        return b - diff * (1 - gamma)
    return a + diff * gamma


def _median_of(kth: Callable[[int], float], n: int) -> np.float64:
    """`np.median` of n values whose k-th smallest is `kth(k)`, to the bit."""
    if n % 2:
        return np.float64(kth(n // 2))
    return np.add.reduce(np.array([kth(n // 2 - 1), kth(n // 2)])) / 2


def pooled_latency_stats(pooled: _PooledGaps, metric: str,
                         percentiles: Sequence[float]) -> dict[str, float]:
    """`latency_stats` of the pooled gaps, the same floats, with no per-token array: the mean
    and the std by numpy's pairwise summation over the gaps made a block at a time (a pass
    each), the median and percentiles from the order statistics (`_kth_values`, a pass)."""
    n = pooled.size
    if n == 0:
        return latency_stats(np.empty(0), metric, percentiles)
    total = pairwise_sum(None, _Reader(pooled.blocks()).take, leaf=_BLOCK, size=n)
    mean = total / n
    dev = _Reader(pooled.blocks(), transform=lambda g: np.square(g - mean))
    std = np.sqrt(pairwise_sum(None, dev.take, leaf=_BLOCK, size=n) / n)
    ranks = {n // 2} | ({n // 2 - 1} if n % 2 == 0 else set())
    for p in percentiles:
        lo = int(np.floor((n - 1) * np.true_divide(np.float64(p), 100)))
        ranks |= {lo, min(lo + 1, n - 1)}
    kth = _kth_values(pooled, ranks).__getitem__
    stats = {
        f"mean_{metric}_ms": float(mean * MS_PER_S),
        f"median_{metric}_ms": float(_median_of(kth, n) * MS_PER_S),
        f"std_{metric}_ms": float(std * MS_PER_S),
    }
    for p in percentiles:
        stats[f"p{percentile_word(p)}_{metric}_ms"] = float(_percentile_of(kth, n, float(p))
                                                            * MS_PER_S)
    return stats


def _pack(successes: Sequence[RequestRecord]) -> _Streams:
    n = len(successes)
    num_tokens = np.fromiter((len(r.token_times_s) for r in successes), dtype=np.int64, count=n)
    empty = [r.request_id for r, k in zip(successes, num_tokens) if k == 0]
    if empty:
        raise ValueError(f"request {empty[0]!r} is marked successful but received no token")
    unsent = [r.request_id for r in successes if r.send_s is None]
    if unsent:
        raise ValueError(f"request {unsent[0]!r} is marked successful but has no send_s")
    send = np.fromiter((r.send_s for r in successes), dtype=np.float64, count=n)
    first = np.fromiter((r.token_times_s[0] for r in successes), dtype=np.float64, count=n)
    last = np.fromiter((r.token_times_s[-1] for r in successes), dtype=np.float64, count=n)
    ttft_s, e2el_s = first - send, last - send
    del first, last
    # One pass over the tokens, a block of requests at a time: the chunks per request, the
    # one-second buckets of the chunk times, the pooled gaps counted.
    itl = _PooledGaps(successes, num_tokens)
    peaks = _Peaks(send, e2el_s)
    for chunk_times, chunks, _, _ in itl._chunk_blocks():
        peaks.add(chunk_times)
        itl._count(_gaps_within(chunk_times, chunks))
    peak_tokens, peak_requests = peaks.result()
    return _Streams(
        send_s=send,
        prompt_len=np.fromiter((r.prompt_len for r in successes), dtype=np.int64, count=n),
        num_output_tokens=num_tokens,
        ttft_s=ttft_s,
        e2el_s=e2el_s,
        itl=itl,
        max_output_tokens_per_s=peak_tokens,
        max_concurrent_requests=peak_requests,
    )


def _gaps_within(chunk_times: np.ndarray, chunks: np.ndarray) -> np.ndarray:
    """The gaps between consecutive chunks of each request, request after request (the gap
    before each request's first chunk left out): `np.diff` of `chunk_times` without the gaps
    that cross from one request to the next, computed in `chunk_times`' own buffer, block by
    block, which it consumes (a view of it is returned)."""
    c = chunk_times
    m = c.size - 1
    if m <= 0:
        return c[:0]
    # c[i] = c[i + 1] - c[i], front to back: each block reads the next element before a later
    # block writes it (numpy copies an overlapping block's operands first).
    for a in range(0, m, _BLOCK):
        b = min(a + _BLOCK, m)
        np.subtract(c[a + 1:b + 1], c[a:b], out=c[a:b])
    # Drop the gap at each request's last chunk (but the last request's), keeping the order.
    cross = (np.cumsum(chunks) - chunks)[1:] - 1
    w = 0
    for a in range(0, m, _BLOCK):
        b = min(a + _BLOCK, m)
        lo, hi = np.searchsorted(cross, (a, b))
        if lo == hi and w == a:
            w = b
            continue
        keep = np.ones(b - a, dtype=bool)
        keep[cross[lo:hi] - a] = False
        block = c[a:b][keep]
        c[w:w + block.size] = block
        w += block.size
    return c[:w]


def _validate_slos(goodput_slos_ms: Mapping[str, float]) -> None:
    for name, value_ms in goodput_slos_ms.items():
        if name not in GOODPUT_SLO_NAMES:
            raise ConfigError(f"goodput SLO {name!r} is not one of {list(GOODPUT_SLO_NAMES)}")
        if value_ms < 0:
            raise ConfigError(f"goodput SLO {name!r} is {value_ms} ms; it must be non-negative")


class _Peaks:
    """vLLM's `max_output_tokens_per_s` and `max_concurrent_requests`, from one-second buckets,
    the chunk times added a block at a time.

    Buckets start at the earliest send of a successful request. A chunk counts once in the
    bucket `int(t - t0)`; a request counts as in flight in every bucket from `int(send - t0)`
    to `int(send + e2el - t0)`, both included.
    """

    __slots__ = ("send_s", "end_s", "t0", "tokens_per_bucket")

    def __init__(self, send_s: np.ndarray, e2el_s: np.ndarray) -> None:
        self.send_s = send_s
        self.end_s = send_s + e2el_s
        self.t0 = float(send_s.min()) if send_s.size else 0.0
        num_buckets = int(np.ceil(self.end_s.max() - self.t0)) + 1 if send_s.size else 0
        self.tokens_per_bucket = np.zeros(num_buckets, dtype=np.int64)

    def add(self, chunk_times_s: np.ndarray) -> None:
        num_buckets = self.tokens_per_bucket.size
        for a in range(0, chunk_times_s.size, _BLOCK):      # per block: bounded temporaries
            bucket = (chunk_times_s[a:a + _BLOCK] - self.t0).astype(np.int64)  # as int()
            bucket = bucket[(bucket >= 0) & (bucket < num_buckets)]
            self.tokens_per_bucket += np.bincount(bucket, minlength=num_buckets)

    def result(self) -> tuple[float, int]:
        if self.send_s.size == 0:
            return 0.0, 0
        num_buckets = self.tokens_per_bucket.size
        first_bucket = (self.send_s - self.t0).astype(np.int64)
        last_bucket = (self.end_s - self.t0).astype(np.int64)
        in_flight_delta = np.bincount(first_bucket, minlength=num_buckets + 1) - np.bincount(
            last_bucket + 1, minlength=num_buckets + 1
        )
        in_flight = np.cumsum(in_flight_delta)[:num_buckets]
        return float(self.tokens_per_bucket.max()), int(in_flight.max())


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

    successes = [r for r in records if r.success]
    s = _pack(successes)
    tpot_mask = s.num_output_tokens > 1
    tpot_s = (s.e2el_s[tpot_mask] - s.ttft_s[tpot_mask]) / (s.num_output_tokens[tpot_mask] - 1)

    duration_s = max(r.end_s for r in records) - benchmark_start_s
    completed = len(successes)
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
        arrival = np.fromiter((r.arrival_s for r in successes), dtype=np.float64, count=completed)
        client_queue_s = s.send_s - arrival
        result |= latency_stats(client_queue_s, "client_queue_time", percentiles)
        if request_rate < math.inf:
            result |= latency_stats(s.e2el_s + client_queue_s, "e2el_including_client_queue", percentiles)
    return result


def engine_summary(
    records: Sequence[RequestRecord], *, selected_percentiles: Iterable[float] = (50, 99)
) -> dict:
    """What the engine did to the run's requests, in keys that do not clash with vLLM's.

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
    scheduled = [r for r in records if r.first_scheduled_s is not None and r.send_s is not None]
    queue_s = np.fromiter(
        (max(0.0, r.first_scheduled_s - r.send_s - r.server_s) for r in scheduled),
        dtype=np.float64, count=len(scheduled)
    )
    server_s = np.fromiter((r.server_s for r in scheduled), dtype=np.float64,
                           count=len(scheduled))
    prompt_tokens = sum(r.prompt_len for r in scheduled)
    cached_tokens = sum(r.num_cached_prompt_tokens for r in scheduled)
    external_tokens = sum(r.num_external_prompt_tokens for r in scheduled)
    failed_by_error: dict[str, int] = {}
    for r in records:
        if not r.success:
            reason = r.error or "unknown"
            failed_by_error[reason] = failed_by_error.get(reason, 0) + 1
    num_completed = sum(1 for r in records if r.success)
    summary: dict = {
        "num_requests": len(records),
        "num_completed": num_completed,
        "num_failed": len(records) - num_completed,
        "num_failed_by_error": failed_by_error,
        "total_preemptions": sum(r.num_preemptions for r in records),
        "num_preempted_requests": sum(1 for r in records if r.num_preemptions > 0),
        "num_prompt_tokens_scheduled": prompt_tokens,
        "num_cached_prompt_tokens": cached_tokens,
        "prefix_cache_hit_rate": cached_tokens / prompt_tokens if prompt_tokens else 0.0,
        "num_external_prompt_tokens": external_tokens,
        "external_kv_hit_rate": external_tokens / prompt_tokens if prompt_tokens else 0.0,
        "mean_api_server_ms": 1e3 * float(server_s.mean()) if len(scheduled) else 0.0,
        "mean_api_server_wait_ms": (1e3 * float(np.mean([r.server_wait_s for r in scheduled]))
                                    if len(scheduled) else 0.0),
    }
    summary |= latency_stats(queue_s, "queue", percentiles)
    return summary
