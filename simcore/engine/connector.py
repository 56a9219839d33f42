"""The KV-connector protocol the scheduler asks about external KV, and the decode side of P/D disaggregation.

A connector tells the scheduler how many tokens of a request being admitted, beyond its local
prefix-cache hit, have KV somewhere else (another instance, a CPU or storage tier), and whether
loading them is asynchronous (vLLM's `KVConnectorBase_V1` scheduler side,
`vllm/distributed/kv_transfer/kv_connector/v1/base.py`: `get_num_new_matched_tokens`). The
scheduler allocates the blocks; the caller simulates the transfer and reports its end with
`Scheduler.finish_remote_load`.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from simcore.engine.request import Request


@runtime_checkable
class KVConnector(Protocol):
    """What the scheduler asks of a KV connector, in the order it asks.

    For a waiting request with no computed tokens, after the local prefix lookup:
    `get_num_new_matched_tokens`; then, once blocks for the request are allocated,
    `update_state_after_alloc` (with 0 when nothing is loaded); when the request finishes,
    `request_finished`. A request may be asked about again (a later step, or after preemption)
    until blocks are allocated for it.
    """

    def get_num_new_matched_tokens(self, req: Request,
                                   num_local_computed_tokens: int) -> tuple[int, bool]:
        """(tokens after the local hit whose KV can be loaded, whether the load is asynchronous).

        A synchronous load must leave at least one token of the request to compute; an
        asynchronous one may cover them all (the scheduler recomputes the last token).
        """
        ...

    def update_state_after_alloc(self, req: Request, num_external_tokens: int) -> None:
        """Blocks are allocated for the request, `num_external_tokens` of them to be loaded."""
        ...

    def request_finished(self, req: Request) -> bool | None:
        """The request finished: save or release its state. A true result keeps its blocks
        allocated until the caller calls `Scheduler.finish_sending` (vLLM's delay_free_blocks:
        the KV is still to be read by another instance)."""
        ...


class DisaggDecodeConnector:
    """The decode instance's side of prefill/decode disaggregation (vLLM's NIXL connector with
    `do_remote_prefill`).

    A request with `remote_prefill_tokens = N` had its first N prompt tokens prefilled on a
    prefill instance. At its first admission the decode instance loads their KV asynchronously,
    past its own local hit; afterwards the scheduler recomputes at least the last token, which
    samples the first output. Later admissions (after a preemption) recompute locally, as vLLM
    clears `do_remote_prefill` once blocks are allocated. Loads are counted in whole blocks, as
    vLLM accounts loaded KV by blocks: N short of the whole prompt is rounded down to a block
    boundary (the partial block is recomputed), N covering the prompt loads all of it.
    """

    __slots__ = ("block_size", "loaded_tokens", "num_loaded_tokens", "_allocated")

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.loaded_tokens: dict[str, int] = {}     # request id -> tokens loaded, all loads
        self.num_loaded_tokens = 0
        self._allocated: set[str] = set()           # requests whose remote prefill is used up

    def get_num_new_matched_tokens(self, req: Request,
                                   num_local_computed_tokens: int) -> tuple[int, bool]:
        n = req.remote_prefill_tokens
        if n <= 0 or req.request_id in self._allocated:
            return 0, False
        if n >= req.prompt_len:
            n = req.prompt_len
        else:
            n -= n % self.block_size
        n -= num_local_computed_tokens
        return (n, True) if n > 0 else (0, False)

    def update_state_after_alloc(self, req: Request, num_external_tokens: int) -> None:
        if req.remote_prefill_tokens > 0:
            self._allocated.add(req.request_id)
        if num_external_tokens:
            rid = req.request_id
            self.loaded_tokens[rid] = self.loaded_tokens.get(rid, 0) + num_external_tokens
            self.num_loaded_tokens += num_external_tokens

    def request_finished(self, req: Request) -> None:
        self._allocated.discard(req.request_id)


class DisaggPrefillConnector:
    """The prefill instance's side of prefill/decode disaggregation (vLLM's NIXL connector with
    `do_remote_decode`): it loads nothing, and a finished prompt keeps its blocks until the
    decode instance has read them (`Scheduler.finish_sending`), so a backed-up decode side
    leaves prefill memory held, as it does in vLLM."""

    __slots__ = ()

    def get_num_new_matched_tokens(self, req: Request,
                                   num_local_computed_tokens: int) -> tuple[int, bool]:
        return 0, False

    def update_state_after_alloc(self, req: Request, num_external_tokens: int) -> None:
        return None

    def request_finished(self, req: Request) -> bool:
        return True
