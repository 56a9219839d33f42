"""A run's request records: `RequestRecord`, what the benchmark client observed of one request,
and `RecordStore`, the run's records in request order, each an object while its request is in
flight and columns once it is done (a run of a million requests keeps about 180 bytes a
request instead of some 450 in objects)."""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from simcore.token_times import TokenTimes, _float_array

_NAN = float("nan")


@dataclass(slots=True)
class RequestRecord:
    """What the benchmark client (and, for the extras, the engine) observed of one request.

    Lifecycle: created when the request arrives at the client (`arrival_s`, the intended send
    time); `send_s` is set when it leaves the client, after any `--max-concurrency` wait; one
    time is added to `token_times_s` (a `TokenTimes`; a list in hand-made records) each time
    an output token reaches the client, in order; at the end `success` is set, or `error`
    says why the request failed. Tokens that reach the client at the same instant count as
    one streamed chunk, as several tokens in one server-sent event do for vLLM's client. The
    engine fills `first_scheduled_s` (first time the scheduler gave it tokens),
    `num_preemptions`, `num_cached_prompt_tokens` (prefix-cache hit at first admission) and
    `replica`.

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
    """The part of `server_s` beyond the request's own work on the API server: the other
    requests sharing its process."""
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
        """When the client was done with it: `finished_s`, else the last token, else the send
        (or arrival)."""
        if self.finished_s is not None:
            return self.finished_s
        if len(self.token_times_s):
            return float(self.token_times_s[-1])
        return self.send_s if self.send_s is not None else self.arrival_s


# How a done record's token times are held (`RecordStore._log_of`): one range of a delivery log
# (the log's index, >= 0), none, or the times object itself (`_EXTRA`).
_EMPTY = -1
_EXTRA = -2


def _nan_if_none(x) -> float:
    return _NAN if x is None else x


def _none_if_nan(x: float) -> float | None:
    return None if x != x else x


class ColumnSequence(Sequence):
    """An immutable-looking sequence whose items are made when read (`_item(i)`, `len`):
    indexing (negative, slices as lists), iteration, equality with any sequence of equal
    items."""

    __slots__ = ()
    _noun = "items"

    def _item(self, i: int):
        raise NotImplementedError

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self._item(i) for i in range(*index.indices(len(self)))]
        n = len(self)
        i = index.__index__()
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"{type(self).__name__} index out of range")
        return self._item(i)

    def __iter__(self) -> Iterator:
        return map(self._item, range(len(self)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self)} {self._noun})"


class RecordStore(ColumnSequence):
    """The run's `RequestRecord`s in request order, as a sequence of records.

    A record is an object while its request is in flight (`append`, then written by the client
    and the engine). Once its request is done (`done`) and the simulated instant of that has
    passed, nothing writes to it any more: it is moved into columns (`_seal`), the object
    dropped. Reading `store[i]` gives the object while it lives, else a `RequestRecord` made
    from the columns, equal to the one sealed. `seal_all` ends the run; then the columns are
    read as numpy arrays (`success`, `send_s`, ...) by the summaries, without a record object
    each. Token times held as one range of a delivery log (most of them) are kept as the range.

    `RecordStore.of(records)` gives the columns of any sequence of records (a list of
    hand-made ones, or a store whose run has ended).
    """

    __slots__ = ("_live", "_pending", "_num_live", "_ids", "_prompt", "_output", "_arrival",
                 "_send", "_finished", "_first_scheduled", "_server", "_server_wait",
                 "_network", "_success", "_errors", "_preempt", "_cached", "_external",
                 "_replica", "_num_tokens", "_first_token", "_last_token", "_log_of",
                 "_range_a", "_logs", "_log_index", "_extra_times")
    _noun = "records"

    def __init__(self) -> None:
        self._live: list[RequestRecord | None] = []     # None once sealed
        self._pending: deque[tuple[float, int]] = deque()   # (when done, index), in time order
        self._num_live = 0
        self._ids: list[str] = []
        self._prompt, self._output = array("q"), array("q")
        # Times in seconds; NaN for None.
        self._arrival, self._send, self._finished = array("d"), array("d"), array("d")
        self._first_scheduled, self._server = array("d"), array("d")
        self._server_wait, self._network = array("d"), array("d")
        self._success = array("b")
        self._errors: dict[int, str] = {}               # the records whose error is not None
        self._preempt, self._cached, self._external = array("q"), array("q"), array("q")
        self._replica = array("q")                      # -1: None
        # Token times: their count, first and last (NaN: none).
        self._num_tokens = array("q")
        self._first_token, self._last_token = array("d"), array("d")
        # The times themselves: log index (or _EMPTY, _EXTRA) and the range's start; the range
        # ends at start + count.
        self._log_of, self._range_a = array("i"), array("q")
        self._logs: list = []                           # the delivery logs ranges refer to
        self._log_index: dict[int, int] = {}            # id(log) -> its index in _logs
        self._extra_times: dict[int, object] = {}       # _EXTRA: the times object

    # -- during the run --------------------------------------------------------------------

    def append(self, rec: RequestRecord) -> None:
        """The next record, in flight."""
        self._live.append(rec)
        self._num_live += 1
        self._ids.append(rec.request_id)

    def _grow(self, size: int) -> None:
        """Every column at least `size` long (zeros past the records sealed)."""
        for column in self._columns():
            if len(column) < size:
                k = max(size - len(column), len(column) // 8, 1024)
                column.frombytes(bytes(k * column.itemsize))

    def _columns(self) -> tuple[array, ...]:
        return (self._prompt, self._output, self._preempt, self._cached, self._external,
                self._replica, self._num_tokens, self._range_a, self._arrival, self._send,
                self._finished, self._first_scheduled, self._server, self._server_wait,
                self._network, self._first_token, self._last_token, self._success,
                self._log_of)

    def done(self, index: int, now: float) -> None:
        """Record `index`'s request is done at `now`: it is sealed once the simulated clock has
        moved past `now` (observers of the step that finished it may still write to it then),
        checked at each call."""
        pending = self._pending
        pending.append((now, index))
        while pending[0][0] < now:
            self._seal(pending.popleft()[1])

    def seal_all(self) -> None:
        """The run has ended: every record into the columns."""
        self._pending.clear()
        if self._num_live:
            for i, rec in enumerate(self._live):
                if rec is not None:
                    self._seal(i)
        self._grow(len(self._ids))

    def _seal(self, i: int) -> None:
        rec = self._live[i]
        if rec is None:
            return
        self._live[i] = None
        self._num_live -= 1
        if i >= len(self._success):
            self._grow(i + 1)
        self._prompt[i] = rec.prompt_len
        self._output[i] = rec.output_len
        self._arrival[i] = rec.arrival_s
        self._send[i] = _nan_if_none(rec.send_s)
        self._finished[i] = _nan_if_none(rec.finished_s)
        self._first_scheduled[i] = _nan_if_none(rec.first_scheduled_s)
        self._server[i] = rec.server_s
        self._server_wait[i] = rec.server_wait_s
        self._network[i] = rec.network_s
        self._success[i] = 1 if rec.success else 0
        if rec.error is not None:
            self._errors[i] = rec.error
        self._preempt[i] = rec.num_preemptions
        self._cached[i] = rec.num_cached_prompt_tokens
        self._external[i] = rec.num_external_prompt_tokens
        self._replica[i] = -1 if rec.replica is None else rec.replica
        times = rec.token_times_s
        n = len(times)
        self._num_tokens[i] = n
        if n:
            self._first_token[i] = times[0]
            self._last_token[i] = times[-1]
        else:
            self._first_token[i] = self._last_token[i] = _NAN
        span = times.single_range() if type(times) is TokenTimes else None
        if span is not None:
            log, a, _ = span
            k = self._log_index.get(id(log))
            if k is None:
                k = self._log_index[id(log)] = len(self._logs)
                self._logs.append(log)
            self._log_of[i] = k
            self._range_a[i] = a
        elif n or type(times) is not TokenTimes:
            self._log_of[i] = _EXTRA
            self._extra_times[i] = times
        else:
            self._log_of[i] = _EMPTY

    # -- reading ---------------------------------------------------------------------------

    @classmethod
    def of(cls, records: Sequence[RequestRecord]) -> RecordStore:
        """The columns of `records`: the store itself once its run has ended, else a store of
        them all, sealed."""
        if isinstance(records, RecordStore):
            if records._num_live:
                raise RuntimeError("the run's records are read while requests are in flight")
            return records
        store = cls()
        for i, rec in enumerate(records):
            store.append(rec)
            store._seal(i)
        store._grow(len(store))
        return store

    def __len__(self) -> int:
        return len(self._ids)

    def _item(self, i: int) -> RequestRecord:
        """Record i: the live object, or once sealed a `RequestRecord` made from the columns,
        equal to the one sealed."""
        rec = self._live[i]
        if rec is not None:
            return rec
        replica = self._replica[i]
        return RequestRecord(
            request_id=self._ids[i], prompt_len=self._prompt[i], output_len=self._output[i],
            arrival_s=self._arrival[i], send_s=_none_if_nan(self._send[i]),
            token_times_s=self.token_times(i), success=self._success[i] == 1,
            error=self._errors.get(i), finished_s=_none_if_nan(self._finished[i]),
            first_scheduled_s=_none_if_nan(self._first_scheduled[i]),
            server_s=self._server[i], server_wait_s=self._server_wait[i],
            num_preemptions=self._preempt[i], num_cached_prompt_tokens=self._cached[i],
            num_external_prompt_tokens=self._external[i],
            replica=None if replica < 0 else replica, network_s=self._network[i])

    def token_times(self, i: int):
        """Sealed record i's token times (a `TokenTimes`, or the hand-made sequence it had)."""
        k = self._log_of[i]
        if k >= 0:
            a = self._range_a[i]
            return TokenTimes.of_range(self._logs[k], a, a + self._num_tokens[i])
        if k == _EXTRA:
            return self._extra_times[i]
        return TokenTimes()

    def token_arrays(self, indices: np.ndarray) -> list[np.ndarray]:
        """The token times of the records `indices`, a float64 array each."""
        out = []
        log_of, range_a = self._log_of, self._range_a
        num_tokens, logs = self._num_tokens, self._logs
        for i in indices.tolist():
            k = log_of[i]
            if k >= 0:
                a = range_a[i]
                out.append(np.frombuffer(logs[k].times[a:a + num_tokens[i]], dtype=np.float64))
            elif k == _EXTRA:
                out.append(_float_array(self._extra_times[i]))
            else:
                out.append(np.empty(0, dtype=np.float64))
        return out

    def token_block(self, indices: np.ndarray) -> np.ndarray:
        """The token times of the records `indices`, concatenated in order (a new float64
        array): where each is one range of a delivery log, gathered from the logs at once, a
        log at a time."""
        log_of, starts = self.ranges(indices)
        if not log_of.size or log_of.min() < 0:
            parts = self.token_arrays(indices)
            return np.concatenate(parts) if parts else np.empty(0, dtype=np.float64)
        counts = self.num_tokens[indices]
        out_at = np.cumsum(counts) - counts       # each record's first token in the block
        logs = np.unique(log_of)
        if logs.size == 1:
            times = self.log_times(int(logs[0]))
            return times[np.repeat(starts - out_at, counts) + np.arange(int(counts.sum()))]
        out = np.empty(int(counts.sum()), dtype=np.float64)
        for k in logs.tolist():
            sel = np.flatnonzero(log_of == k)
            c = counts[sel]
            within = np.arange(int(c.sum())) - np.repeat(np.cumsum(c) - c, c)
            out[np.repeat(out_at[sel], c) + within] = \
                self.log_times(k)[np.repeat(starts[sel], c) + within]
        return out

    def ranges(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For the records `indices`: the delivery log their token times are a range of (an
        index for `log_times`; negative where they are not one range) and the range's start
        (it ends at start + `num_tokens`)."""
        n = len(self._ids)
        return (np.frombuffer(self._log_of, dtype=np.int32)[:n][indices],
                np.frombuffer(self._range_a, dtype=np.int64)[:n][indices])

    def log_times(self, k: int) -> np.ndarray:
        """Delivery log k's times (see `ranges`)."""
        return np.frombuffer(self._logs[k].times, dtype=np.float64)

    @property
    def ids(self) -> list[str]:
        return self._ids

    @property
    def errors(self) -> dict[int, str]:
        """Index -> error, for the records whose error is not None."""
        return self._errors

    def _floats(self, column: array) -> np.ndarray:
        return np.frombuffer(column, dtype=np.float64)[:len(self._ids)]

    def _ints(self, column: array) -> np.ndarray:
        return np.frombuffer(column, dtype=np.int64)[:len(self._ids)]

    # Columns as numpy arrays over the store's own buffers (read once the run has ended).
    success = property(lambda self: np.frombuffer(self._success, dtype=np.int8)[:len(self._ids)]
                       == 1)
    prompt_len = property(lambda self: self._ints(self._prompt))
    output_len = property(lambda self: self._ints(self._output))
    arrival_s = property(lambda self: self._floats(self._arrival))
    send_s = property(lambda self: self._floats(self._send), doc="NaN: not sent")
    first_scheduled_s = property(lambda self: self._floats(self._first_scheduled),
                                 doc="NaN: never scheduled")
    server_s = property(lambda self: self._floats(self._server))
    server_wait_s = property(lambda self: self._floats(self._server_wait))
    network_s = property(lambda self: self._floats(self._network))
    num_preemptions = property(lambda self: self._ints(self._preempt))
    num_cached_prompt_tokens = property(lambda self: self._ints(self._cached))
    num_external_prompt_tokens = property(lambda self: self._ints(self._external))
    replica = property(lambda self: self._ints(self._replica), doc="-1: none")
    num_tokens = property(lambda self: self._ints(self._num_tokens))
    first_token_s = property(lambda self: self._floats(self._first_token), doc="NaN: no token")
    last_token_s = property(lambda self: self._floats(self._last_token), doc="NaN: no token")

    @property
    def end_s(self) -> np.ndarray:
        """`RequestRecord.end_s` of each record: when the client saw it end, else its last
        token, else its send, else its arrival."""
        send = self.send_s
        end = np.where(np.isnan(send), self.arrival_s, send)
        end = np.where(self.num_tokens > 0, self.last_token_s, end)
        finished = self._floats(self._finished)
        return np.where(np.isnan(finished), end, finished)
