"""The block pool of `simcore.engine.kv_cache.BlockPool` with its state in arrays and its
operations compiled: the same free queue, prefix cache and ref counts, operation for operation.

`BlockPool` spends per block a few dict and list operations (an eviction's `cached.pop`, a free
queue's `popitem`, a release's insertion), about 0.1 us each in Python. A long prompt moves hundreds
of blocks at a time (a Mooncake request about 600), so in an hour-long trace the pool is a third
of the run. Here each operation is one compiled call over arrays, the block lists crossing as
numpy arrays (about 10 ns a block each way).

State (`N` blocks, block 0 the null block):
- `links`, int32 [N + 2, 5]: per block a row of 20 bytes, read together: its ref count
  (`REF`), its neighbours in the free list that holds it (`PRV`, `NXT`), which list that is
  (`WHERE`: 0 none, 1 front, 2 free) and the next block holding the same hash (`DUP`, 0 at the
  end). Rows N and N + 1 are the sentinels of the two circular lists: `front` (freed blocks
  without a hash, the latest freed first) and `free` (freed blocks with one, least recently
  used first). Between them in eviction order come the blocks never handed out, `fresh` to
  N - 1, held as a counter.
- `block_hash`, int64 [N]: the hash each block holds (0: none).
- `counts`, int64 [5]: `fresh`, the lengths of `front` and `free`, the evictions so far, and
  the free blocks in all.
- `table`, int64 [capacity, 3]: the prefix cache as an open-addressing table (Fibonacci
  hashing, linear probing, deletion by backward shift; a key of 0 marks an empty slot, which no
  hash is), each slot a hash (`KEY`) and the first and last blocks cached under it (`HEAD`,
  `TAIL`); the blocks of a hash follow each other by `DUP`, in the order they were cached. A hash
  is in the table iff some block holds it, so it never holds more than N entries; its capacity
  is a power of two of at least 2 N.

Every kernel is plain Python over numpy arrays, compiled by numba where it is installed
(`simcore.compiled.compile_kernel`; cached on disk). The engine uses this pool for
long runs only (`simcore.simulate.COMPILED_MIN_REQUESTS`): numba's import and the kernels'
loading cost about 0.3 s, more than a short run's whole pool. `tests/test_block_pool.py` holds
it to `BlockPool` operation by operation, and whole runs byte-identical.
"""

from __future__ import annotations

import numpy as np

from simcore.compiled import compile_kernel

REF, PRV, NXT, WHERE, DUP = range(5)
KEY, HEAD, TAIL = range(3)
FRESH, NUM_FRONT, NUM_FREE, EVICTIONS, FREE = range(5)
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
def _pop(links, counts, sentinel, count, out, j):
    """Move blocks from the head of the free list at `sentinel` (its length at counts[count])
    into out[j:] until either runs out; the next free position of `out`."""
    n = out.shape[0]
    while j < n and counts[count] > 0:
        b = links[sentinel, NXT]
        nxt = links[b, NXT]
        links[sentinel, NXT] = nxt
        links[nxt, PRV] = sentinel
        links[b, WHERE] = 0
        counts[count] -= 1
        out[j] = b
        j += 1
    return j


@compile_kernel
def _allocate(links, block_hash, counts, table, out):
    """Pop len(out) blocks from the head of the free queue into `out`: `front`, then the fresh
    blocks, then `free`; each gets one reference and loses the hash it held (an eviction)."""
    n = out.shape[0]
    num_blocks = block_hash.shape[0]
    j = _pop(links, counts, num_blocks, NUM_FRONT, out, 0)
    fresh = counts[FRESH]
    take = min(n - j, num_blocks - fresh)
    for b in range(fresh, fresh + take):
        out[j] = b
        j += 1
    counts[FRESH] = fresh + take
    _pop(links, counts, num_blocks + 1, NUM_FREE, out, j)
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
    counts[FREE] -= n


@compile_kernel
def _touch(links, counts, blocks):
    """Take a reference on each of `blocks`, pulling those with none out of their free list."""
    for b in blocks:
        if links[b, REF] == 0:
            p = links[b, PRV]
            nxt = links[b, NXT]
            links[p, NXT] = nxt
            links[nxt, PRV] = p
            if links[b, WHERE] == IN_FREE:
                counts[NUM_FREE] -= 1
            else:
                counts[NUM_FRONT] -= 1
            counts[FREE] -= 1
            links[b, WHERE] = 0
        links[b, REF] += 1


@compile_kernel(inline=True)
def _link_after(links, a, b):
    """Put block `b` into a free list right after `a` (a block or a list's sentinel)."""
    nxt = links[a, NXT]
    links[a, NXT] = b
    links[b, PRV] = a
    links[b, NXT] = nxt
    links[nxt, PRV] = b


@compile_kernel
def _release(links, block_hash, counts, blocks):
    """Drop a reference on each of `blocks`, last first; a block left with none joins the tail
    of `free` if it holds a hash, else the head of `front`."""
    num_blocks = block_hash.shape[0]
    front, free = num_blocks, num_blocks + 1
    for j in range(blocks.shape[0] - 1, -1, -1):
        b = blocks[j]
        r = links[b, REF] - 1
        links[b, REF] = r
        if r == 0:
            if block_hash[b] != 0:      # the tail of `free`: after its last block
                _link_after(links, links[free, PRV], b)
                links[b, WHERE] = IN_FREE
                counts[NUM_FREE] += 1
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

    __slots__ = ("num_blocks", "enable_caching", "links", "hashes", "counts", "table")

    def __init__(self, num_blocks: int, enable_caching: bool) -> None:
        if num_blocks < 2:
            raise ValueError("num_blocks must be at least 2 (block 0 is the null block)")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        links = np.zeros((num_blocks + 2, 5), dtype=np.int32)
        for s in (num_blocks, num_blocks + 1):       # two empty circular lists
            links[s, PRV] = links[s, NXT] = s
        links[0, REF] = 1                            # the null block is never free
        self.links = links
        self.hashes = np.zeros(num_blocks, dtype=np.int64)
        self.counts = np.array([1, 0, 0, 0, num_blocks - 1], dtype=np.int64)
        capacity = 16
        while capacity < 2 * num_blocks:
            capacity *= 2
        self.table = np.zeros((capacity, 3), dtype=np.int64)

    @property
    def num_free(self) -> int:
        return self.counts.item(FREE)

    @property
    def num_evictions(self) -> int:
        return int(self.counts[EVICTIONS])

    @num_evictions.setter
    def num_evictions(self, value: int) -> None:
        self.counts[EVICTIONS] = value

    def _list(self, sentinel: int) -> list[int]:
        links, out = self.links, []
        b = int(links[sentinel, NXT])
        while b != sentinel:
            out.append(b)
            b = int(links[b, NXT])
        return out

    def free_queue(self) -> list[int]:
        """The free blocks in eviction order (the next allocation's first)."""
        n = self.num_blocks
        return [*self._list(n), *range(int(self.counts[FRESH]), n), *self._list(n + 1)]

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
        _allocate(self.links, self.hashes, self.counts, self.table, out)
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
        _release(self.links, self.hashes, self.counts, np.asarray(blocks, dtype=np.int32))
