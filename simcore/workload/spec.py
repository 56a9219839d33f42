"""What a workload generator produces: the requests a client will send, with their content identity."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request as the benchmark client would send it.

    `arrival_s` is the intended send time on the virtual clock (seconds from the run's start),
    before any client-side max-concurrency wait. `block_keys` is the content key of each of the
    prompt's first full `block_size`-token blocks: two prompts whose first k keys agree share their
    first k blocks of tokens (and so can share prefix-cache blocks). Blocks past the keys, the
    partial last block and every generated token are unique to the request.
    """

    request_id: str
    arrival_s: float
    prompt_len: int
    output_len: int
    block_keys: tuple[int, ...] = ()
    priority: int = 0
    session_id: str | None = field(default=None)
