"""The block pool of `simcore.engine.kv_cache.BlockPool` with its state in arrays and its
operations compiled: the same free queue, prefix cache and ref counts, operation for operation.

`BlockPool` spends per block a few dict and list operations (an eviction's `cached.pop`, a free
queue's `popitem`, a release's insertion), about 0.1 us each in Python. A long prompt moves hundreds
of blocks at a time (a Mooncake request about 600), so in an hour-long trace the pool is a third
of the run. Here each operation is one compiled call over arrays, the block lists crossing as
numpy arrays (about 10 ns a block each way).

State (`N` blocks, block 0 the null block):
- `links`, int32 [N + 1, 6]: per block a row of 24 bytes, read together: its ref count
  (`REF`), its neighbours in `front` while it is there (`PRV`, `NXT`), which free part holds it
  (`WHERE`: 0 none, 1 front, 2 free), the next block holding the same hash (`DUP`, 0 at the
  end) and its slot in `queue` while it is in `free` (`SLOT`). Row N is the sentinel of the
  circular list `front` (freed blocks without a hash, the latest freed first).
- `queue`, int32 [Q] (Q a power of two of at least 2 N): `free`, the freed blocks with a hash,
  least recently used first, as a ring read from `counts[QHEAD]` to `counts[QTAIL]` (positions
  that only grow; a position's slot is it modulo Q). A prefix hit that takes a block out of
  `free` only marks the block (`WHERE` 0): its entry stays in the ring, stale, and is passed
  over where it is read (an entry is live iff its block is in `free` with that `SLOT`). So an
  allocation reads the blocks it pops one after another from the ring rather than chasing a
  linked list block by block (each block a dependent load, most of them missing the cache: the
  pool of one engine is megabytes), and a release appends at the tail. When the ring is full,
  its live entries (at most N - 1) are moved together to its head, and the stale ones dropped.
  Between `front` and `free` in eviction order come the blocks never handed out, `fresh` to
  N - 1, held as a counter.
- `block_hash`, int64 [N]: the hash each block holds (0: none).
- `counts`, int64 [8]: `fresh`, the lengths of `front` and `free` (its live entries), the
  evictions so far, the free blocks in all, the ring's head and tail positions, and a scratch
  slot that an allocation's warming passes (below) write, so that the compiler keeps their loads.
- `table`, int64 [capacity, 3]: the prefix cache as an open-addressing table (Fibonacci
  hashing, linear probing, deletion by backward shift; a key of 0 marks an empty slot, which no
  hash is), each slot a hash (`KEY`) and the first and last blocks cached under it (`HEAD`,
  `TAIL`); the blocks of a hash follow each other by `DUP`, in the order they were cached. A hash
  is in the table iff some block holds it, so it never holds more than N entries; its capacity
  is a power of two of at least 2 N.

An allocation reads its blocks first in passes of independent loads (the ring's next blocks'
rows, the popped blocks' hashes, those hashes' home slots in `table`), summed into the scratch
slot, before the pass that evicts them: the blocks come in eviction order, scattered over
megabytes, and the loads of a pass with no branch on what it reads are in flight together,
where the evicting pass's would wait for one another (about 15-20% off the allocations' time in
the hour-long Mooncake trace; the same warming did nothing measurable for caching and release).

Every kernel is plain Python over numpy arrays, compiled by numba where it is installed
(`simcore.compiled.compile_kernel`; cached on disk). The engine uses this pool for
long runs only (`simcore.simulate.COMPILED_MIN_REQUESTS`): numba's import and the kernels'
loading cost about 0.3 s, more than a short run's whole pool. `tests/test_block_pool.py` holds
it to `BlockPool` operation by operation, and whole runs byte-identical.
"""

from __future__ import annotations

import numpy as np

from simcore.compiled import compile_kernel

REF, PRV, NXT, WHERE, DUP, SLOT = range(6)
KEY, HEAD, TAIL = range(3)
FRESH, NUM_FRONT, NUM_FREE, EVICTIONS, FREE, QHEAD, QTAIL, SCRATCH = range(8)
IN_FRONT, IN_FREE = 1, 2


@compile_kernel(inline=True)
def _home(h, mask):
    """The slot a probe for hash `h` starts at: Fibonacci hashing, which spreads the runs of
    consecutive ids the hash space gives (the slot of h itself would pack them into one
    cluster, and every deletion would walk it)."""
    return ((h * 2654435761) >> 16) & mask


@compile_kernel(inline=True)
def _find(table, h):
    """The slot of hash `h` in the table, or -1."""
    mask = table.shape[0] - 1
    i = _home(h, mask)
    while True:
        k = table[i, KEY]
        if k == h:
            return i
        if k == 0:
            return -1
        i = (i + 1) & mask


@compile_kernel(inline=True)
def _insert(links, table, h, b):
    """Cache block `b` under hash `h`, after any block already cached under it."""
    mask = table.shape[0] - 1
    i = _home(h, mask)
    links[b, DUP] = 0
    while True:
        k = table[i, KEY]
        if k == 0:
            table[i, KEY] = h
            table[i, HEAD] = b
            table[i, TAIL] = b
            return
        if k == h:
            links[table[i, TAIL], DUP] = b
            table[i, TAIL] = b
            return
        i = (i + 1) & mask


@compile_kernel(inline=True)
def _evict(links, table, h, b):
    """Take block `b` out of the blocks cached under hash `h`; the hash leaves the table with its
    last block (the slots after it shifted back so that every probe still reaches its key)."""
    mask = table.shape[0] - 1
    i = _find(table, h)
    head = table[i, HEAD]
    nxt = links[b, DUP]
    links[b, DUP] = 0
    if head != b:
        c = head
        while links[c, DUP] != b:
            c = links[c, DUP]
        links[c, DUP] = nxt
        if table[i, TAIL] == b:
            table[i, TAIL] = c
        return
    if nxt != 0:
        table[i, HEAD] = nxt
        return
    j = i
    while True:
        j = (j + 1) & mask
        k = table[j, KEY]
        if k == 0:
            break
        home = _home(k, mask)
        # The key at j stays if its home slot lies cyclically in (i, j].
        if (i < j and i < home <= j) or (i > j and (home > i or home <= j)):
            continue
        table[i, KEY] = k
        table[i, HEAD] = table[j, HEAD]
        table[i, TAIL] = table[j, TAIL]
        i = j
    table[i, KEY] = 0
    table[i, HEAD] = 0
    table[i, TAIL] = 0


@compile_kernel(inline=True)
def _pop_front(links, counts, out, j):
    """Move blocks from the head of `front` into out[j:] until either runs out; the next free
    position of `out`."""
    n = out.shape[0]
    sentinel = links.shape[0] - 1
    while j < n and counts[NUM_FRONT] > 0:
        b = links[sentinel, NXT]
        nxt = links[b, NXT]
        links[sentinel, NXT] = nxt
        links[nxt, PRV] = sentinel
        links[b, WHERE] = 0
        counts[NUM_FRONT] -= 1
        out[j] = b
        j += 1
    return j


@compile_kernel(inline=True)
def _pop_free(links, queue, counts, out, j):
    """Move blocks from the head of `free` into out[j:] until either runs out, passing over
    stale entries; the next free position of `out`."""
    n = out.shape[0]
    mask = queue.shape[0] - 1
    p = counts[QHEAD]
    while j < n and counts[NUM_FREE] > 0:
        s = p & mask
        b = queue[s]
        p += 1
        if links[b, WHERE] == IN_FREE and links[b, SLOT] == s:
            links[b, WHERE] = 0
            counts[NUM_FREE] -= 1
            out[j] = b
            j += 1
    counts[QHEAD] = p
    return j


@compile_kernel(inline=True)
def _append_free(links, queue, counts, b):
    """Put block `b` at the tail of `free`; a full ring first keeps only its live entries,
    moved together to its head in their order."""
    mask = queue.shape[0] - 1
    tail = counts[QTAIL]
    if tail - counts[QHEAD] > mask:
        k = counts[QHEAD]
        for p in range(k, tail):
            s = p & mask
            c = queue[s]
            # A block's stale entries all come before its live one, so a block moved here has
            # no entry left to read.
            if links[c, WHERE] == IN_FREE and links[c, SLOT] == s:
                queue[k & mask] = c
                links[c, SLOT] = k & mask
                k += 1
        tail = k
    s = tail & mask
    queue[s] = b
    links[b, SLOT] = s
    links[b, WHERE] = IN_FREE
    counts[QTAIL] = tail + 1
    counts[NUM_FREE] += 1


@compile_kernel
def _allocate(links, block_hash, counts, table, queue, out):
    """Pop len(out) blocks from the head of the free queue into `out`: `front`, then the fresh
    blocks, then `free`; each gets one reference and loses the hash it held (an eviction)."""
    n = out.shape[0]
    num_blocks = block_hash.shape[0]
    j = _pop_front(links, counts, out, 0)
    fresh = counts[FRESH]
    take = min(n - j, num_blocks - fresh)
    for b in range(fresh, fresh + take):
        out[j] = b
        j += 1
    counts[FRESH] = fresh + take
    # Warming passes (see the module's docstring): the rows of the ring's next blocks, then the
    # popped blocks' hashes and those hashes' home slots.
    qmask = queue.shape[0] - 1
    head = counts[QHEAD]
    touched = 0
    for p in range(head, min(head + n - j, counts[QTAIL])):
        touched += links[queue[p & qmask], WHERE]
    _pop_free(links, queue, counts, out, j)
    mask = table.shape[0] - 1
    for j in range(n):
        touched += block_hash[out[j]]
    for j in range(n):
        touched += table[_home(block_hash[out[j]], mask), KEY]
    evicted = 0
    for j in range(n):
        b = out[j]
        links[b, REF] = 1
        h = block_hash[b]
        if h != 0:
            _evict(links, table, h, b)
            block_hash[b] = 0
            evicted += 1
    counts[EVICTIONS] += evicted
    counts[SCRATCH] = touched
    counts[FREE] -= n


@compile_kernel
def _touch(links, counts, blocks):
    """Take a reference on each of `blocks`, taking those with none out of their free part (a
    block in `free` only marked: its entry in the ring goes stale)."""
    for b in blocks:
        if links[b, REF] == 0:
            if links[b, WHERE] == IN_FREE:
                counts[NUM_FREE] -= 1
            else:
                p = links[b, PRV]
                nxt = links[b, NXT]
                links[p, NXT] = nxt
                links[nxt, PRV] = p
                counts[NUM_FRONT] -= 1
            counts[FREE] -= 1
            links[b, WHERE] = 0
        links[b, REF] += 1


@compile_kernel(inline=True)
def _link_after(links, a, b):
    """Put block `b` into `front` right after `a` (a block or the list's sentinel)."""
    nxt = links[a, NXT]
    links[a, NXT] = b
    links[b, PRV] = a
    links[b, NXT] = nxt
    links[nxt, PRV] = b


@compile_kernel
def _release(links, block_hash, counts, queue, blocks):
    """Drop a reference on each of `blocks`, last first; a block left with none joins the tail
    of `free` if it holds a hash, else the head of `front`."""
    front = links.shape[0] - 1
    for j in range(blocks.shape[0] - 1, -1, -1):
        b = blocks[j]
        r = links[b, REF] - 1
        links[b, REF] = r
        if r == 0:
            if block_hash[b] != 0:      # the tail of `free`
                _append_free(links, queue, counts, b)
            else:                       # the head of `front`
                _link_after(links, front, b)
                links[b, WHERE] = IN_FRONT
                counts[NUM_FRONT] += 1
            counts[FREE] += 1


@compile_kernel
def _cache_many(links, block_hash, table, blocks, hashes):
    """Block blocks[i] now holds the full block of hash hashes[i], for each i in order."""
    for j in range(blocks.shape[0]):
        b = blocks[j]
        h = hashes[j]
        block_hash[b] = h
        _insert(links, table, h, b)


@compile_kernel
def _cache_one(links, block_hash, table, b, h):
    block_hash[b] = h
    _insert(links, table, h, b)


@compile_kernel
def _longest(table, hashes, out):
    """How many of `hashes` from the first are cached (each one's first block into `out`)."""
    for j in range(out.shape[0]):
        i = _find(table, hashes[j])
        if i < 0:
            return j
        out[j] = table[i, HEAD]
    return out.shape[0]


@compile_kernel
def run_match(run, key_of, keys, q, i, m):
    """How many of `m` blocks with keys `keys[i]`, ... continue the run of hash space ids from
    `q`: 1 (id q, found by the caller) plus each next id whose parent is the id before it (`run`)
    and whose key (`key_of`) is the next key, up to the first that is not
    (`simcore.engine.request.BlockHashSpace`'s walk of a prompt run by run)."""
    r = 1
    while r < m and run[q + r] and key_of[q + r] == keys[i + r]:
        r += 1
    return r


@compile_kernel
def _num_evictable(links, blocks):
    """How many of `blocks` no request holds (a hit on them takes a block from the free queue)."""
    n = 0
    for b in blocks:
        if links[b, REF] == 0:
            n += 1
    return n


@compile_kernel
def _get(table, h):
    i = _find(table, h)
    return table[i, HEAD] if i >= 0 else 0


class ArrayBlockPool:
    """`BlockPool`'s interface and behaviour over arrays (see the module's docstring). The
    Python views (`ref_cnt`, `block_hash`, `cached`, `free_queue()`) are built on each read,
    for tests and checks; the engine calls the operations."""

    __slots__ = ("num_blocks", "enable_caching", "links", "hashes", "counts", "table", "queue")

    def __init__(self, num_blocks: int, enable_caching: bool) -> None:
        if num_blocks < 2:
            raise ValueError("num_blocks must be at least 2 (block 0 is the null block)")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        links = np.zeros((num_blocks + 1, 6), dtype=np.int32)
        links[num_blocks, PRV] = links[num_blocks, NXT] = num_blocks    # `front`, empty
        links[0, REF] = 1                            # the null block is never free
        self.links = links
        self.hashes = np.zeros(num_blocks, dtype=np.int64)
        self.counts = np.array([1, 0, 0, 0, num_blocks - 1, 0, 0, 0], dtype=np.int64)
        capacity = 16
        while capacity < 2 * num_blocks:
            capacity *= 2
        self.table = np.zeros((capacity, 3), dtype=np.int64)
        self.queue = np.zeros(capacity, dtype=np.int32)

    @property
    def num_free(self) -> int:
        return self.counts.item(FREE)

    @property
    def num_evictions(self) -> int:
        return int(self.counts[EVICTIONS])

    @num_evictions.setter
    def num_evictions(self, value: int) -> None:
        self.counts[EVICTIONS] = value

    def _front(self) -> list[int]:
        """The blocks of `front`, head first."""
        links, out = self.links, []
        sentinel = self.num_blocks
        b = int(links[sentinel, NXT])
        while b != sentinel:
            out.append(b)
            b = int(links[b, NXT])
        return out

    def _free(self) -> list[int]:
        """The live entries of the ring, head first."""
        links, queue = self.links, self.queue
        mask = len(queue) - 1
        out = []
        for p in range(int(self.counts[QHEAD]), int(self.counts[QTAIL])):
            b = int(queue[p & mask])
            if links[b, WHERE] == IN_FREE and links[b, SLOT] == p & mask:
                out.append(b)
        return out

    def free_queue(self) -> list[int]:
        """The free blocks in eviction order (the next allocation's first)."""
        n = self.num_blocks
        return [*self._front(), *range(int(self.counts[FRESH]), n), *self._free()]

    def is_free(self, b: int) -> bool:
        return b >= self.counts[FRESH] or bool(self.links[b, WHERE])

    @property
    def ref_cnt(self) -> list[int]:
        return self.links[:self.num_blocks, REF].tolist()

    @property
    def block_hash(self) -> list[int]:
        return self.hashes.tolist()

    @property
    def cached(self) -> dict[int, list[int]]:
        """hash -> the blocks holding it, first cached first."""
        out = {}
        dup = self.links[:, DUP]
        for h, b, _ in self.table.tolist():
            if h:
                blocks = out[h] = [b]
                while dup[b]:
                    b = int(dup[b])
                    blocks.append(b)
        return out

    def get_cached(self, h: int) -> int:
        """A block holding content hash `h`, or 0 if none is cached."""
        return int(_get(self.table, h))

    def longest_cached(self, hashes) -> list[int]:
        """The first block cached under each of `hashes` (an int64 array, as a request holds
        them, or a list), from the first up to the first hash not cached."""
        if not len(hashes) or not _get(self.table, hashes[0]):     # a miss at once: no array
            return []
        hashes = np.asarray(hashes, dtype=np.int64)
        out = np.empty(len(hashes), dtype=np.int32)
        return out[:_longest(self.table, hashes, out)].tolist()

    def num_evictable(self, blocks: list[int]) -> int:
        """How many of `blocks` no request holds."""
        return int(_num_evictable(self.links, np.array(blocks, dtype=np.int32)))

    def allocate(self, n: int) -> list[int]:
        """Pop `n` blocks from the head of the free queue (caller checked there are enough)."""
        return self.take(n).tolist()

    def take(self, n: int) -> np.ndarray:
        """`allocate`, the blocks as an int32 array (which `cache_many` takes as it is)."""
        out = np.empty(n, dtype=np.int32)
        _allocate(self.links, self.hashes, self.counts, self.table, self.queue, out)
        return out

    def touch(self, blocks: list[int]) -> None:
        """Take a reference on prefix-hit blocks, pulling free ones out of the free queue."""
        _touch(self.links, self.counts, np.array(blocks, dtype=np.int32))

    def cache(self, b: int, h: int) -> None:
        """Record that block `b` now holds the full block of content hash `h`."""
        _cache_one(self.links, self.hashes, self.table, b, h)

    def cache_many(self, blocks, hashes) -> None:
        """`cache(b, h)` for each pair of `blocks` (a list, or an int32 array) and `hashes` (a
        list, or an int64 array), in order."""
        _cache_many(self.links, self.hashes, self.table,
                    np.asarray(blocks, dtype=np.int32), np.asarray(hashes, dtype=np.int64))

    def release(self, blocks) -> None:
        """Drop one reference on each of `blocks` (a list, or an int32 array), walking them from
        last to first."""
        _release(self.links, self.hashes, self.counts, self.queue,
                 np.asarray(blocks, dtype=np.int32))
