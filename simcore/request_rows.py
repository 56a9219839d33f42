"""The result's row per request, held as columns: a run of a million requests keeps about a
hundred bytes a request instead of a dict of sixteen entries, and each row is built as a dict
when it is read."""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

_NAN = math.nan

# What a row holds beyond the fields every row has (`RequestRows._kind`).
_NO_TOKENS = 0      # no token reached the client (or the request failed)
_ONE_TOKEN = 1      # ttft_ms, e2el_ms, tpot_ms (None)
_TOKENS = 2         # ttft_ms, e2el_ms, tpot_ms, mean_itl_ms, max_itl_ms


def _none(x: float) -> float | None:
    return None if x != x else x


class RequestRows(Sequence[dict]):
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
        """The rows of `RequestRecord`s `records`; `session_turns`, if given, a (session id,
        turn) pair per record."""
        rows = cls()
        ids, errors = rows._ids, rows._errors
        replica, prompt, output, success = (rows._replica.append, rows._prompt.append,
                                            rows._output.append, rows._success.append)
        arrival, send, kind = rows._arrival.append, rows._send.append, rows._kind.append
        ttft_, e2el_, tpot_ = rows._ttft.append, rows._e2el.append, rows._tpot.append
        mean_itl, max_itl = rows._mean_itl.append, rows._max_itl.append
        queue, preempt, cached = rows._queue.append, rows._preempt.append, rows._cached.append
        for i, r in enumerate(records):
            ids.append(r.request_id)
            replica(-1 if r.replica is None else r.replica)
            prompt(r.prompt_len)
            output(r.output_len)
            success(1 if r.success else 0)
            if r.error is not None:
                errors[i] = r.error
            arrival(r.arrival_s)
            send(_NAN if r.send_s is None else r.send_s)
            t = r.token_times_s
            n = len(t)
            if r.success and n:
                ttft = t[0] - r.send_s
                e2el = t[-1] - r.send_s
                ttft_(ttft * 1e3)
                e2el_(e2el * 1e3)
                if n > 1:
                    kind(_TOKENS)
                    tpot_((e2el - ttft) / (n - 1) * 1e3)
                    gaps = np.diff(np.asarray(t))
                    if not gaps.all():
                        # Tokens of one instant are one streamed chunk (several tokens of one
                        # step with speculative decoding): one gap per chunk.
                        gaps = gaps[gaps != 0]
                    if gaps.size:
                        mean_itl(float(gaps.mean()) * 1e3)
                        max_itl(float(gaps.max()) * 1e3)
                    else:
                        mean_itl(_NAN)
                        max_itl(_NAN)
                else:
                    kind(_ONE_TOKEN)
                    tpot_(_NAN)
                    mean_itl(_NAN)
                    max_itl(_NAN)
            else:
                kind(_NO_TOKENS)
                ttft_(_NAN)
                e2el_(_NAN)
                tpot_(_NAN)
                mean_itl(_NAN)
                max_itl(_NAN)
            queue(max(0.0, r.first_scheduled_s - r.send_s - r.server_s) * 1e3
                  if r.first_scheduled_s is not None and r.send_s is not None else _NAN)
            preempt(r.num_preemptions)
            cached(r.num_cached_prompt_tokens)
        if session_turns is not None:
            rows._sessions = [s for s, _ in session_turns]
            rows._turns = array("q", (turn for _, turn in session_turns))
        return rows

    def __len__(self) -> int:
        return len(self._ids)

    def _row(self, i: int) -> dict:
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

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self._row(i) for i in range(*index.indices(len(self)))]
        n = len(self)
        i = index.__index__()
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("request row index out of range")
        return self._row(i)

    def __iter__(self) -> Iterator[dict]:
        return map(self._row, range(len(self)))

    def to_list(self) -> list[dict]:
        """Every row as a dict, in order."""
        return list(self)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"RequestRows({len(self)} rows)"


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
