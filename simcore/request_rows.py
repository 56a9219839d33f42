"""The result's row per request, held as columns: a run of a million requests keeps about a
hundred bytes a request instead of a dict of sixteen entries, and each row is built as a dict
when it is read."""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from simcore.records import ColumnSequence, RecordStore

_NAN = math.nan

# What a row holds beyond the fields every row has (`RequestRows._kind`).
_NO_TOKENS = 0      # no token reached the client (or the request failed)
_ONE_TOKEN = 1      # ttft_ms, e2el_ms, tpot_ms (None)
_TOKENS = 2         # ttft_ms, e2el_ms, tpot_ms, mean_itl_ms, max_itl_ms


_TOKENS_AT_ONCE = 1 << 20
"""Token times made at once for the requests' ITL statistics (`_itl_stats`)."""


def _itl_stats(store: RecordStore, index: np.ndarray, mean_itl: np.ndarray,
               max_itl: np.ndarray) -> None:
    """Mean and max ITL in ms (`mean_itl[i]`, `max_itl[i]`) of each record i in `index` (each
    successful, with several tokens), over its streamed chunks: tokens of one instant are one
    chunk (several tokens of one step with speculative decoding), one gap per chunk; NaN where
    all came at once.

    Requests whose token times are one range of a delivery log (most) are taken together, by
    log and token count: a matrix of their times, a row each, whose rows' means and maxima are
    those of each request alone, to the bit (numpy sums each row of a C-contiguous matrix
    pairwise, as it sums one array). Rows with tokens of one instant, and the other requests,
    are taken one at a time."""

    def one(i: int, gaps: np.ndarray) -> None:
        if not gaps.all():
            gaps = gaps[gaps != 0]
        if gaps.size:
            mean_itl[i] = float(gaps.mean()) * 1e3
            max_itl[i] = float(gaps.max()) * 1e3

    logs, starts = store.ranges(index)
    ranged = logs >= 0
    rest = index[~ranged]
    for a in range(0, rest.size, 4096):
        block = rest[a:a + 4096]
        for i, t in zip(block.tolist(), store.token_arrays(block)):
            one(i, np.diff(t))
    index, logs, starts = index[ranged], logs[ranged], starts[ranged]
    if not index.size:
        return
    counts = store.num_tokens[index]
    order = np.lexsort((counts, logs))
    index, logs, starts, counts = index[order], logs[order], starts[order], counts[order]
    cuts = np.flatnonzero((np.diff(logs) != 0) | (np.diff(counts) != 0)) + 1
    for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), index.size]):
        times, width = store.log_times(int(logs[a])), int(counts[a])
        step = max(1, _TOKENS_AT_ONCE // width)
        for c in range(a, b, step):
            d = min(b, c + step)
            gaps = np.diff(times[starts[c:d, None] + np.arange(width)], axis=1)
            whole = gaps.all(axis=1)
            rows = index[c:d]
            if whole.all():         # most: no row to select (the same rows, the same floats)
                mean_itl[rows] = gaps.mean(axis=1) * 1e3
                max_itl[rows] = gaps.max(axis=1) * 1e3
                continue
            mean_itl[rows[whole]] = gaps[whole].mean(axis=1) * 1e3
            max_itl[rows[whole]] = gaps[whole].max(axis=1) * 1e3
            for r in np.flatnonzero(~whole).tolist():
                one(int(rows[r]), gaps[r])


def _column(typecode: str, values: np.ndarray) -> array:
    """A numpy column as an `array` of `typecode` (its values converted to that C type)."""
    return array(typecode, np.ascontiguousarray(values, dtype=_DTYPE[typecode]).tobytes())


_DTYPE = {"i": np.int32, "b": np.int8, "d": np.float64}


def _none(x: float) -> float | None:
    return None if x != x else x


class RequestRows(ColumnSequence):
    """One row a request, in the run's request order; immutable.

    Each row is a dict, made when it is read: `request_id`, `replica`, `prompt_len`,
    `output_len`, `success`, `error`, `arrival_s`, `send_s`; for a successful request with
    tokens `ttft_ms`, `e2el_ms` and `tpot_ms` (None for one token), and with more than one
    token `mean_itl_ms` and `max_itl_ms` over its streamed chunks (tokens of one instant are
    one chunk, as `summarize` counts ITL; None if all came at once); then `queue_ms`,
    `num_preemptions`, `num_cached_prompt_tokens`; with sessions, `session_id` and `turn`.

    It is a sequence, not a list: `json.dump` needs `to_list()` or `json_default` as its
    `default` (`dse simulate --out` streams the rows without holding them as dicts).
    """

    _noun = "rows"
    __slots__ = ("_ids", "_replica", "_prompt", "_output", "_success", "_errors", "_arrival",
                 "_send", "_kind", "_ttft", "_e2el", "_tpot", "_mean_itl", "_max_itl",
                 "_queue", "_preempt", "_cached", "_sessions", "_turns")

    def __init__(self) -> None:
        self._ids: list[str] = []
        # Counts and indices as C ints (token counts are far below 2**31).
        self._replica = array("i")         # -1: none
        self._prompt = array("i")
        self._output = array("i")
        self._success = array("b")
        self._errors: dict[int, Any] = {}  # the rows whose error is not None
        self._arrival = array("d")
        self._send = array("d")            # NaN: none
        self._kind = array("b")
        self._ttft = array("d")
        self._e2el = array("d")
        self._tpot = array("d")            # NaN: None
        self._mean_itl = array("d")        # NaN: None
        self._max_itl = array("d")
        self._queue = array("d")           # NaN: None
        self._preempt = array("i")
        self._cached = array("i")
        self._sessions: list | None = None
        self._turns: array | None = None

    @classmethod
    def from_records(cls, records, session_turns=None) -> RequestRows:
        """The rows of `RequestRecord`s `records` (a `RecordStore` or a sequence of records);
        `session_turns`, if given, a (session id, turn) pair per record."""
        store = RecordStore.of(records)
        rows = cls()
        n = len(store)
        rows._ids = store.ids
        rows._errors = dict(store.errors)
        rows._replica = _column("i", store.replica)
        rows._prompt = _column("i", store.prompt_len)
        rows._output = _column("i", store.output_len)
        success = store.success
        rows._success = _column("b", success)
        rows._arrival = _column("d", store.arrival_s)
        send = store.send_s
        rows._send = _column("d", send)
        num_tokens = store.num_tokens
        has = success & (num_tokens > 0)
        multi = has & (num_tokens > 1)
        kind = np.full(n, _NO_TOKENS, dtype=np.int8)
        kind[has] = _ONE_TOKEN
        kind[multi] = _TOKENS
        rows._kind = _column("b", kind)
        ttft_s = store.first_token_s[has] - send[has]
        e2el_s = store.last_token_s[has] - send[has]
        ttft, e2el = np.full(n, _NAN), np.full(n, _NAN)
        ttft[has] = ttft_s * 1e3
        e2el[has] = e2el_s * 1e3
        tpot = np.full(n, _NAN)
        several = num_tokens[has] > 1
        tpot[multi] = (e2el_s[several] - ttft_s[several]) / (num_tokens[multi] - 1) * 1e3
        rows._ttft, rows._e2el, rows._tpot = (_column("d", ttft), _column("d", e2el),
                                              _column("d", tpot))
        mean_itl, max_itl = np.full(n, _NAN), np.full(n, _NAN)
        _itl_stats(store, np.flatnonzero(multi), mean_itl, max_itl)
        rows._mean_itl, rows._max_itl = _column("d", mean_itl), _column("d", max_itl)
        first = store.first_scheduled_s
        scheduled = ~np.isnan(first) & ~np.isnan(send)
        queue = first - send - store.server_s
        queue = np.where(queue > 0.0, queue, 0.0) * 1e3     # max(0.0, x), NaN as 0.0
        queue[~scheduled] = _NAN
        rows._queue = _column("d", queue)
        rows._preempt = _column("i", store.num_preemptions)
        rows._cached = _column("i", store.num_cached_prompt_tokens)
        if session_turns is not None:
            rows._sessions = [s for s, _ in session_turns]
            rows._turns = array("q", (turn for _, turn in session_turns))
        return rows

    def __len__(self) -> int:
        return len(self._ids)

    def _item(self, i: int) -> dict:
        replica = self._replica[i]
        send = self._send[i]
        row = {"request_id": self._ids[i], "replica": None if replica < 0 else replica,
               "prompt_len": self._prompt[i], "output_len": self._output[i],
               "success": self._success[i] == 1, "error": self._errors.get(i),
               "arrival_s": self._arrival[i], "send_s": None if send != send else send}
        kind = self._kind[i]
        if kind != _NO_TOKENS:
            row["ttft_ms"] = self._ttft[i]
            row["e2el_ms"] = self._e2el[i]
            row["tpot_ms"] = _none(self._tpot[i])
            if kind == _TOKENS:
                row["mean_itl_ms"] = _none(self._mean_itl[i])
                row["max_itl_ms"] = _none(self._max_itl[i])
        row["queue_ms"] = _none(self._queue[i])
        row["num_preemptions"] = self._preempt[i]
        row["num_cached_prompt_tokens"] = self._cached[i]
        if self._sessions is not None:
            row["session_id"] = self._sessions[i]
            row["turn"] = self._turns[i]
        return row

    def to_list(self) -> list[dict]:
        """Every row as a dict, in order."""
        return list(self)


class _RowStream(list):
    """`RequestRows` handed to `json.dump`'s encoder, which iterates a list lazily: its rows
    are made one at a time as they are written. (Only for `json.dump`, whose encoder is the
    Python one; `json.dumps` without indent reads a list's items directly.)"""

    def __init__(self, rows: RequestRows) -> None:
        super().__init__()
        self._rows = rows

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self) -> Iterator[dict]:
        return iter(self._rows)


def json_default(obj: object) -> Any:
    """`default` for `json.dump` / `json.dumps` of a result: `RequestRows` as their rows."""
    if isinstance(obj, RequestRows):
        return obj.to_list()
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


def json_default_streaming(obj: object) -> Any:
    """`json_default` for `json.dump` (to a file, never `json.dumps`): the rows are written as
    they are made instead of first held as a list of dicts."""
    if isinstance(obj, RequestRows):
        return _RowStream(obj)
    return json_default(obj)


def rows_of(requests: Sequence[Mapping]) -> Sequence[Mapping]:
    """A result's `requests` kept as they are when columns, else as a tuple of their rows."""
    return requests if isinstance(requests, RequestRows) else tuple(requests)
