"""A request inside the engine: its token counts, status and the content hashes of its full blocks."""

from __future__ import annotations

import itertools

WAITING = 0
RUNNING = 1
PREEMPTED = 2
FINISHED = 3
WAITING_FOR_REMOTE_KVS = 4
FINISHED_ABORTED = 5
"""Aborted by the client before it finished (vLLM's RequestStatus.FINISHED_ABORTED)."""
STATUS_NAMES = {WAITING: "waiting", RUNNING: "running", PREEMPTED: "preempted",
                FINISHED: "finished", WAITING_FOR_REMOTE_KVS: "waiting_for_remote_kvs",
                FINISHED_ABORTED: "finished_aborted"}


KEY_BITS = 64
"""Content keys in [0, 2**KEY_BITS) are interned as the int `parent << KEY_BITS | key`."""


class BlockHashSpace:
    """Interns chained block hashes to small ints, exactly and without collisions.

    A block's identity is (parent block's hash, content key), as vLLM chains `hash(parent, tokens)`.
    Blocks whose content is unique to one request get fresh ids. One space per simulated engine
    pool (never module-global), so independent simulations never share state.

    The identity is stored as one int, `parent << KEY_BITS | key`, which is as exact as the pair
    for every key in [0, 2**KEY_BITS) (the workload's keys are 63-bit) and is built, hashed and
    stored faster than a tuple; a key outside that range is stored as the (parent, key) tuple,
    which no int equals.
    """

    __slots__ = ("_ids", "_next")

    def __init__(self) -> None:
        self._ids: dict[int | tuple[int, int], int] = {}
        self._next = 1

    def chain(self, keys, parent: int, out: list[int]) -> int:
        """Append to `out` the chained hashes of blocks with content `keys` after a block hashed
        `parent` (0 = none): each block's identity (its parent's hash, its key) interned, a new
        identity given a fresh id; returns how many of the leading blocks were already interned.

        Once one block is new, every later one is: its parent is a fresh id, which no interned
        identity holds. The rest are then numbered in one pass, with no lookup."""
        ids = self._ids
        get = ids.get
        append = out.append
        i = 0
        n = len(keys)
        while i < n:
            key = keys[i]
            h = get(parent << KEY_BITS | key if key >> KEY_BITS == 0 else (parent, key))
            if h is None:
                break
            parent = h
            append(h)
            i += 1
        if i < n:
            new = self.fresh(n - i)
            ids.update(zip([p << KEY_BITS | k if k >> KEY_BITS == 0 else (p, k)
                            for p, k in zip(itertools.chain((parent,), new), keys[i:])], new))
            out.extend(new)
        return i

    def fresh(self, n: int) -> range:
        """Hashes of `n` blocks whose tokens no other block has."""
        nxt = self._next
        self._next = nxt + n
        return range(nxt, nxt + n)


class Request:
    """One request's engine-side state.

    Lifecycle: WAITING -> RUNNING -> (PREEMPTED -> RUNNING)* -> FINISHED; with a KV connector, a
    waiting or preempted request may first pass through WAITING_FOR_REMOTE_KVS while its external
    KV loads, and returns to its previous status when the load is done. From any status but
    FINISHED an abort (`Scheduler.finish_requests`) ends it in FINISHED_ABORTED.
    `skip_reading_prefix_cache` (vLLM's sampling parameter of that name) makes admission look up
    no prefix-cache hit for it; its own blocks are still cached for others. Invariants:
    `0 <= num_computed_tokens <= num_tokens`, `num_tokens = prompt_len + num_output_tokens`,
    `block_hashes[i]` is the chained hash of full block i of prompt + generated tokens and is
    stable for the request's lifetime (so a preempted request can hit its own cached blocks).
    With speculative decoding `num_spec_tokens` drafts wait to be verified after its tokens
    (vLLM's `num_tokens_with_spec = num_tokens + len(spec_token_ids)`); the KV of drafts
    scheduled but not yet verified may count in `num_computed_tokens` until the step's update.
    """

    __slots__ = ("request_id", "index", "prompt_len", "max_tokens", "block_keys", "priority",
                 "arrival", "status", "num_computed_tokens", "num_output_tokens",
                 "num_preemptions", "block_hashes", "num_cached_tokens", "work_done_tokens",
                 "num_external_tokens", "remote_prefill_tokens", "client",
                 "skip_reading_prefix_cache", "num_spec_tokens", "spec_key")

    def __init__(self, request_id: str, index: int, prompt_len: int, max_tokens: int,
                 block_keys: tuple[int, ...] = (), priority: int = 0, arrival: float = 0.0,
                 client: object = None, remote_prefill_tokens: int = 0,
                 skip_reading_prefix_cache: bool = False) -> None:
        self.request_id = request_id
        self.index = index                  # admission-order tie-breaker (vLLM's arrival_time)
        self.prompt_len = prompt_len
        self.max_tokens = max_tokens        # output tokens to generate (ignore_eos semantics)
        self.block_keys = block_keys
        self.priority = priority
        self.arrival = arrival
        self.status = WAITING
        self.num_computed_tokens = 0
        self.num_output_tokens = 0
        self.num_preemptions = 0
        self.block_hashes: list[int] = []
        self.num_cached_tokens = -1         # prefix hit at first admission (-1: not admitted yet)
        self.work_done_tokens = 0           # tokens computed in total, recomputation included
        self.num_external_tokens = 0        # tokens of its latest external KV load
        self.remote_prefill_tokens = remote_prefill_tokens   # prompt tokens prefilled elsewhere (P/D)
        self.client = client                # opaque slot for the simulator's per-request record
        self.skip_reading_prefix_cache = skip_reading_prefix_cache
        self.num_spec_tokens = 0            # draft tokens proposed for its next step (vLLM's
                                            # len(spec_token_ids)); always 0 without speculation
        self.spec_key: int | None = None    # key of its acceptance draws (set on first use)

    @property
    def num_tokens(self) -> int:
        return self.prompt_len + self.num_output_tokens

    def ensure_block_hashes(self, space: BlockHashSpace, block_size: int) -> list[int]:
        """Extend `block_hashes` to cover every full block of the tokens known so far."""
        hashes = self.block_hashes
        n_full = (self.prompt_len + self.num_output_tokens) // block_size
        i = len(hashes)
        if i < n_full:
            # Keyed blocks chained, then the blocks past the keys, whose tokens no other block
            # has, numbered fresh.
            space.chain(self.block_keys[i:n_full], hashes[-1] if hashes else 0, hashes)
            if len(hashes) < n_full:
                hashes.extend(space.fresh(n_full - len(hashes)))
        return hashes

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, {STATUS_NAMES[self.status]}, "
                f"computed={self.num_computed_tokens}/{self.num_tokens})")
