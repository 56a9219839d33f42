"""A dataset's request before the client gives it a send time."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Sample:
    """One request as a dataset yields it: lengths, content identity and, for timed traces, a time.

    `timestamp_s` is the request's time in the replayed trace window (time scale applied), or None
    for datasets without timing; `block_keys` follow `RequestSpec`'s meaning.
    """

    request_id: str
    prompt_len: int
    output_len: int
    block_keys: tuple[int, ...] = ()
    timestamp_s: float | None = None
