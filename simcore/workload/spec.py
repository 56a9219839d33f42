"""What a workload generator produces: the requests a client will send, with their content identity."""

from __future__ import annotations

from dataclasses import dataclass, field

from simcore.workload.keys import BlockKeys


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request as the benchmark client would send it.

    `arrival_s` is the intended send time on the virtual clock (seconds from the run's start),
    before any client-side max-concurrency wait. `block_keys` is the content key of each of the
    prompt's first full `block_size`-token blocks: two prompts whose first k keys agree share their
    first k blocks of tokens (and so can share prefix-cache blocks). Blocks past the keys, the
    partial last block and every generated token are unique to the request, unless
    `output_block_keys` says otherwise. Keys expanded from a trace's hash ids are a
    `BlockKeys` (an int64 array that reads as the tuple of its keys).

    `output_block_keys` (sessions, `simcore.workload.sessions`) continues `block_keys` past the
    prompt: the keys of the full blocks after the prompt's `prompt_len // block_size` ones, which
    hold the prompt's tail and the generated tokens, so that a later turn whose prompt repeats
    this conversation can hit the blocks this request computed. It is non-empty only when
    `block_keys` has a key for every full block of the prompt. `session_id` and `turn` name the
    session and the 0-based turn a request belongs to (None and 0 outside sessions).
    """

    request_id: str
    arrival_s: float
    prompt_len: int
    output_len: int
    block_keys: tuple[int, ...] | BlockKeys = ()
    priority: int = 0
    session_id: str | None = field(default=None)
    output_block_keys: tuple[int, ...] | BlockKeys = ()
    turn: int = 0
