"""A request inside the engine: its token counts, status and the content hashes of its full blocks."""

from __future__ import annotations

import numpy as np

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

_RUN_KEYS = 1 << 63
"""Keys in [0, _RUN_KEYS) fit the space's int64 columns, so a block of such a key can continue a
run (`BlockHashSpace`)."""

VECTOR_MIN_KEYS = 32
"""Fewest keys `BlockHashSpace.chain` walks with numpy (fewer are walked one by one)."""


def _identity(parent: int, key: int) -> int | tuple[int, int]:
    """The dict key of the block identity (parent, key): the int `parent << KEY_BITS | key` for
    a key in [0, 2**KEY_BITS), else the tuple."""
    return parent << KEY_BITS | key if key >> KEY_BITS == 0 else (parent, key)


_NO_HASHES = np.empty(0, dtype=np.int64)
"""A request's hashes before any is drawn (`Request.block_hashes`)."""


def grown(column: np.ndarray, size: int, fill) -> np.ndarray:
    """`column` extended with `fill` to at least `size` entries, doubling (amortised growth).

    One new array: zeroed by the allocator where `fill` is zero (its pages are written only as
    they are used), else filled past the copy."""
    n = len(column)
    if n >= size:
        return column
    new_size = max(2 * n, size)
    if fill == 0:
        out = np.zeros(new_size, dtype=column.dtype)
    else:
        out = np.empty(new_size, dtype=column.dtype)
        out[n:] = fill
    out[:n] = column
    return out


class BlockHashSpace:
    """Interns chained block hashes to small ints, exactly and without collisions.

    A block's identity is (parent block's hash, content key), as vLLM chains `hash(parent, tokens)`.
    One space per simulated engine pool (never module-global), so independent simulations never
    share state.

    Keyed blocks get ids 1, 2, ... in the order their identities are first seen; blocks whose
    content is unique to one request (no key) get fresh negative ids, so the keyed ids stay
    dense. Chaining interns whole runs: the blocks of a prompt not seen before get consecutive
    ids, each block's parent the id before its own. Such a block, a run's continuation, is
    stored only in two columns indexed by id, its key and a flag saying that its parent is the
    id before it; only the first block of a run (whose parent is any other block) goes into the
    dict, as the int `parent << KEY_BITS | key` (as exact as the pair for every key in
    [0, 2**KEY_BITS), and built, hashed and stored faster than a tuple; a key outside that
    range is stored as the (parent, key) tuple, which no int equals). The identity (p, k) is
    interned exactly when block p + 1 continues a run with key k, or the dict holds it: each
    identity is interned once, so it has one id and one of the two forms. A prompt that repeats
    earlier ones is then walked run by run (numpy compares a run's keys at once) rather than
    block by block, and the dict holds one entry per run. With `compiled` (an engine's compiled
    kernels, `SchedulerConfig.compiled`) a run's keys are compared by a compiled loop that
    stops at the first that differs (`simcore.engine.array_pool.run_match`), the same count.
    """

    __slots__ = ("_ids", "_next", "_key", "_run", "_fresh", "_match")

    def __init__(self, compiled: bool = False) -> None:
        self._match = None
        if compiled:
            from simcore.engine.array_pool import run_match
            self._match = run_match
        self._ids: dict[int | tuple[int, int], int] = {}
        self._next = 1                  # the next keyed id
        self._fresh = -1                # the next unkeyed id (counting down)
        self._key = np.zeros(1024, dtype=np.int64)     # a run continuation's key, by id
        self._run = np.zeros(1024, dtype=bool)         # id continues a run (parent id - 1)

    @property
    def num_keyed(self) -> int:
        """How many keyed ids were given (they are 1 to `num_keyed`)."""
        return self._next - 1

    def lookup(self, parent: int, key: int) -> int | None:
        """The id of the block of content `key` after a block hashed `parent`, or None if that
        identity was never interned."""
        q = parent + 1
        if 0 < q < self._next and 0 <= key < _RUN_KEYS and self._run[q] and self._key[q] == key:
            return q
        return self._ids.get(_identity(parent, key))

    def chain(self, keys, parent: int = 0) -> tuple[np.ndarray, int]:
        """The chained hashes of blocks with content `keys` after a block hashed `parent` (0 =
        none), as an int64 array: each block's identity (its parent's hash, its key) interned, a
        new identity given a fresh id; and how many of the leading blocks were already interned.

        Once one block is new, every later one is: its parent is a fresh id, which no interned
        identity holds. The rest are numbered in one run."""
        runs = self._runs(keys, parent)
        if runs is None:
            out: list[int] = []
            known = self._chain_one_by_one(keys, parent, out)
            return np.array(out, dtype=np.int64), known
        known, segments = runs
        if len(segments) == 1:
            q, r = segments[0]
            return np.arange(q, q + r, dtype=np.int64), known
        return np.concatenate([np.arange(q, q + r, dtype=np.int64) for q, r in segments]), known

    def _chain_one_by_one(self, keys, parent: int, out: list[int]) -> int:
        """`chain`'s work block by block (few keys, or keys outside [0, 2**63)): the hashes
        appended to `out`, the count of leading blocks interned before returned."""
        if isinstance(keys, np.ndarray):    # the keys as Python ints (exact in an identity)
            keys = keys.tolist()
        elif not isinstance(keys, (tuple, list)):     # a BlockKeys: its ints
            keys = list(keys)
        n = len(keys)
        lookup = self.lookup
        append = out.append
        i = 0
        while i < n:
            h = lookup(parent, keys[i])
            if h is None:
                break
            parent = h
            append(h)
            i += 1
        if i < n:
            first = self._next
            self._intern(parent, keys[i], first, n - i)
            key_of, run, ids = self._key, self._run, self._ids
            for h, key in enumerate(keys[i + 1:], first + 1):
                if 0 <= key < _RUN_KEYS:
                    key_of[h] = key
                else:               # stored apart: not a run's continuation
                    run[h] = False
                    ids[_identity(h - 1, key)] = h
            out.extend(range(first, first + n - i))
        return i

    def _runs(self, keys, parent: int) -> tuple[int, list[tuple[int, int]]] | None:
        """`chain`'s work run by run for `VECTOR_MIN_KEYS` or more keys in [0, 2**63): how many
        leading blocks were interned, and the hashes as runs (first id, length); None for fewer
        keys or keys outside that range."""
        n = len(keys)
        if n < VECTOR_MIN_KEYS:
            return None
        try:
            keys = np.asarray(keys, dtype=np.int64)
        except OverflowError:
            return None
        if keys.min() < 0:
            return None
        run, key_of = self._run, self._key
        nxt = self._next
        lookup = self.lookup
        match = self._match
        segments = []
        i = 0
        while i < n:
            q = lookup(parent, int(keys[i]))
            if q is None:
                break
            m = min(n - i, nxt - q)
            r = 1
            if m > 1:
                if match is not None:
                    r = match(run, key_of, keys, q, i, m)
                else:
                    same = run[q + 1:q + m] & (key_of[q + 1:q + m] == keys[i + 1:i + m])
                    r = m if same.all() else 1 + int(same.argmin())
            segments.append((q, r))
            i += r
            parent = q + r - 1
        if i < n:
            first = self._next
            self._intern(parent, int(keys[i]), first, n - i)
            self._key[first + 1:first + n - i] = keys[i + 1:]
            segments.append((first, n - i))
        return i, segments

    def _intern(self, parent: int, key: int, first: int, count: int) -> None:
        """Give the new run of `count` blocks ids `first`, ... (the first block's identity
        (parent, key); each later one a continuation, its key set by the caller)."""
        self._next = first + count
        self._key = grown(self._key, self._next, 0)
        self._run = grown(self._run, self._next, False)
        self._run[first + 1:first + count] = True
        if parent == first - 1 and 0 <= key < _RUN_KEYS:
            self._run[first] = True
            self._key[first] = key
        else:
            self._run[first] = False
            self._ids[_identity(parent, key)] = first

    def fresh(self, n: int) -> int:
        """The first of the hashes of `n` blocks whose tokens no other block has: they are it,
        it - 1, ..., it - n + 1."""
        nxt = self._fresh
        self._fresh = nxt - n
        return nxt


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
                 "num_preemptions", "_hashes", "_num_hashes", "num_cached_tokens",
                 "work_done_tokens",
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
        self._hashes = _NO_HASHES           # int64, its first _num_hashes drawn (see below)
        self._num_hashes = 0
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

    @property
    def block_hashes(self) -> np.ndarray:
        """The hashes drawn so far, of its first full blocks (int64; a view, not to be written).

        They live in a buffer with room for more (`ensure_block_hashes`): a hash once drawn
        never changes, so a view taken earlier stays right, and a request given another's
        hashes may share that buffer (it draws more into a buffer of its own)."""
        return self._hashes[:self._num_hashes]

    @block_hashes.setter
    def block_hashes(self, hashes) -> None:
        hashes = np.asarray(hashes, dtype=np.int64)
        self._hashes = hashes
        self._num_hashes = len(hashes)

    @property
    def num_hashes(self) -> int:
        """How many block hashes are drawn (`len(block_hashes)`)."""
        return self._num_hashes

    def draw_fresh(self, space: BlockHashSpace) -> int:
        """Draw a fresh id as the hash of its next full block, one past its keys (what
        `ensure_block_hashes` draws for it when one more block is full); returns it."""
        n = self._num_hashes
        buf = self._hashes
        if n >= len(buf):
            self._hashes = buf = grown(buf, n + 1, 0)
        h = space.fresh(1)
        buf[n] = h
        self._num_hashes = n + 1
        return h

    def ensure_block_hashes(self, space: BlockHashSpace, block_size: int) -> np.ndarray:
        """Draw the hashes of every full block of the tokens known so far; returns
        `block_hashes`."""
        n_full = (self.prompt_len + self.num_output_tokens) // block_size
        n = self._num_hashes
        buf = self._hashes
        if n < n_full:
            keys = self.block_keys
            if len(buf) < n_full:
                # Room for the blocks its whole reply fills (twice those now at most), so that a
                # request grows its buffer once or not at all.
                cap = (self.prompt_len + self.max_tokens) // block_size
                if cap > 2 * n_full:
                    cap = 2 * n_full
                if cap < n_full:
                    cap = n_full
                if not n and not len(keys):     # all fresh: drawn with the buffer, in one array
                    first = space.fresh(n_full)
                    self._hashes = buf = np.arange(first, first - cap, -1, dtype=np.int64)
                    self._num_hashes = n_full
                    return buf[:n_full]
                grown_buf = np.empty(cap, dtype=np.int64)
                grown_buf[:n] = buf[:n]
                self._hashes = buf = grown_buf
            # Keyed blocks chained, then the blocks past the keys, whose tokens no other block
            # has, numbered fresh.
            if n < len(keys):
                new = space.chain(keys[n:n_full], int(buf[n - 1]) if n else 0)[0]
                m = n + len(new)
                buf[n:m] = new
                n = m
            if n < n_full:
                first = space.fresh(n_full - n)
                if n_full - n == 1:     # a reply's block, the usual case: no array made
                    buf[n] = first
                else:
                    buf[n:n_full] = np.arange(first, first - (n_full - n), -1)
                n = n_full
            self._num_hashes = n
        return buf[:n]

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, {STATUS_NAMES[self.status]}, "
                f"computed={self.num_computed_tokens}/{self.num_tokens})")
