"""Max-min fair rates by progressive filling that walks the links in order of fill level, so that
a round costs what freezes in it rather than a pass over every flow and link.

Progressive filling in rounds (`simcore.fabric.flow.MaxMinSolver`) ranks the links by fill level
(capacity left over frozen flows, over unfrozen flows) and freezes, each round, every flow on the
longest prefix of that ranking in which no unfrozen flow crosses two links. Finding the prefix
by ranks costs a pass over every unfrozen flow, and an all-to-all needs about one round per
distinct level: some fifty per solve on average at 128 hosts, a hundred at 256.

The same prefix is found by walking the links from the lowest level, each one's flows listed
beside it: a link joins the prefix unless a flow marked in this round crosses it, and then marks
its unfrozen flows. A link's level changes only when one of its flows freezes, so the walk keeps
the links in a binary heap and re-keys only the links of the flows frozen. Freezing adds the
frozen rates to `used` hop row by hop row, flows in order, as the rounds do, so every level and
rate is the same to the bit. A solve thus costs a few passes over the flows and their links
(listing them by link, marking, sorting each round's few runs, freezing) and a heap operation per
link a frozen flow crosses, whatever the number of rounds.

Links of equal level are ranked in numpy's argsort order, which no heap reproduces. That order
decides the prefix only when the prefix would end inside a group of equal levels: part of the
group in, part out; or the group's first link blocked (crossed by a marked flow) and another not.
Elsewhere the prefix is the same in every order. A round that ends inside such a group is walked
again in numpy's order (`order`), which then costs one argsort of the levels, as every round did.

The kernels call no helper that takes arrays inside a loop over flows: numba counts a reference
up and down per array argument per call, and those atomic counts once took most of the solve.
"""

from __future__ import annotations

import numpy as np

from simcore.compiled import compile_kernel


def _prefetch(array, index):
    """Ask the CPU to bring array[index] (a 1-D array) into cache ahead of its use; nothing in
    Python. A kernel that reads flows in an order it knows ahead of time, but scattered over
    megabytes, waits on memory for most of its time without it."""


def _compile_prefetch() -> None:
    """`_prefetch` in compiled kernels: llvm.prefetch of the element's address (read, high
    locality, data cache)."""
    try:
        from llvmlite import ir
        from numba.core import cgutils, types
        from numba.extending import intrinsic, overload
    except ImportError:  # pragma: no cover - exercised only where numba is absent
        return

    @intrinsic
    def llvm_prefetch(typingctx, array, index):
        def codegen(context, builder, signature, args):
            array_type = signature.args[0]
            view = context.make_array(array_type)(context, builder, args[0])
            address = cgutils.get_item_pointer(context, builder, array_type, view, [args[1]],
                                               wraparound=False)
            byte_ptr = ir.IntType(8).as_pointer()
            i32 = ir.IntType(32)
            fn = builder.module.declare_intrinsic(
                "llvm.prefetch", fnty=ir.FunctionType(ir.VoidType(), [byte_ptr, i32, i32, i32]))
            builder.call(fn, [builder.bitcast(address, byte_ptr), ir.Constant(i32, 0),
                              ir.Constant(i32, 3), ir.Constant(i32, 1)])
            return context.get_dummy_value()
        return types.void(array, index), codegen

    @overload(_prefetch)
    def prefetch_compiled(array, index):
        def impl(array, index):
            llvm_prefetch(array, index)
        return impl


_compile_prefetch()

_AHEAD = 16
"""How many flows ahead of its use a kernel prefetches a flow's data."""


_NEED_ORDER = -1
"""What `_solve` returns when a round's prefix depends on numpy's order of equal levels."""

# The solver's work arrays travel to the kernel as a few 2-D arrays, a row each, since numba's
# dispatch costs about 0.1 us per argument and a fabric solves a few flows very often.
_COUNTS, _USED, _LEVEL, _KEY = range(4)                     # rows of `links` (float)
_START, _SEEN, _HEAP, _HEAP_POS, _PREFIX, _GROUP, _CHANGED = range(7)   # of `link_ints`
_MARK, _FROZEN, _SPARE = range(3)                           # of `flow_ints`
_HEAP_SIZE, _LEFT, _ROUND, _HOPS = range(4)                 # entries of `state`


class LevelOrderSolver:
    """Max-min fair rates to the bit of `MaxMinSolver`'s rounds, each round walking the links by
    fill level from a heap instead of ranking them all.

    Lifecycle: built for a fixed number of links (padding index, which must have infinite
    capacity, last); `solve` may be called any number of times, and the rates it returns live in
    a buffer the next call reuses. Between calls nothing carries over but the buffers and the
    round counter, which keeps counting.

    Invariants during a solve: the heap holds every link with unfrozen flows, each keyed by its
    level or less (see `_heap_top`), and no other link; the members of link l, its flows in
    ascending order, frozen ones included, lie between its start and the next link's; a flow's
    mark is -1 while it is unfrozen, else the round it froze in; every entry of `row_sum` is
    -0.0 between rounds.
    """

    def __init__(self, num_links: int) -> None:
        self.links = np.zeros((4, num_links))
        self.link_ints = np.zeros((7, num_links + 1), dtype=np.int64)
        self.state = np.zeros(4, dtype=np.int64)
        self.no_order = np.zeros(0, dtype=np.int64)
        self._size(4, 64)

    def _size(self, num_hops: int, num_flows: int) -> None:
        num_links = self.links.shape[1]
        self.row_sum = np.full((num_hops, num_links), -0.0)
        self.flow_ints = np.zeros((3, num_flows), dtype=np.int64)
        self.records = np.zeros((num_flows, num_hops), dtype=np.int32)   # links by hop
        self.members = np.zeros(num_hops * num_flows, dtype=np.int32)
        self.rates = np.zeros(num_flows)

    def solve(self, hops: np.ndarray, capacity: np.ndarray, flows: np.ndarray) -> np.ndarray:
        """Max-min fair rates, over links `capacity`, of the flows whose links are the columns
        `flows` of `hops` (see `simcore.fabric.flow.max_min_rates`); one rate per entry of
        `flows`, in its order."""
        num_hops, num_flows = hops.shape[0], len(flows)
        if num_hops > self.row_sum.shape[0] or num_flows > len(self.rates):
            self._size(max(num_hops, self.row_sum.shape[0]), max(num_flows, 2 * len(self.rates)))
        links, link_ints, flow_ints = self.links, self.link_ints, self.flow_ints
        records, members, rates = self.records, self.members, self.rates
        row_sum, state = self.row_sum, self.state
        left = _solve(hops, flows, self.no_order, capacity, links, link_ints, flow_ints, records,
                      members, rates, row_sum, state)
        while left == _NEED_ORDER:
            left = _solve(hops, self.no_order, np.argsort(links[_LEVEL]), capacity, links,
                          link_ints, flow_ints, records, members, rates, row_sum, state)
        return rates[:num_flows]


# -- the heap of links, keyed by (key, index) -----------------------------------------------------
# A link's key is its level or, after the level rose, lower: the heap's top is then re-keyed
# before it is used, so that a link is re-sorted only when it comes up rather than whenever its
# level rises.

@compile_kernel
def _sift(heap, heap_pos, key, size, li):
    """Move link li, in the heap at heap_pos[li], up or down to its place."""
    i = heap_pos[li]
    own = key[li]
    while i > 0:
        parent = (i - 1) >> 1
        above = heap[parent]
        if not (own < key[above] or (own == key[above] and li < above)):
            break
        heap[i] = above
        heap_pos[above] = i
        i = parent
    while True:
        child = 2 * i + 1
        if child >= size:
            break
        below = heap[child]
        if child + 1 < size:
            other = heap[child + 1]
            if key[other] < key[below] or (key[other] == key[below] and other < below):
                child += 1
                below = other
        if not (key[below] < own or (key[below] == own and below < li)):
            break
        heap[i] = below
        heap_pos[below] = i
        i = child
    heap[i] = li
    heap_pos[li] = i


@compile_kernel
def _heap_push(heap, heap_pos, key, state, li):
    size = state[_HEAP_SIZE]
    heap[size] = li
    heap_pos[li] = size
    state[_HEAP_SIZE] = size + 1
    _sift(heap, heap_pos, key, size + 1, li)


@compile_kernel
def _heap_remove(heap, heap_pos, key, state, li):
    i = heap_pos[li]
    size = state[_HEAP_SIZE] - 1
    state[_HEAP_SIZE] = size
    heap_pos[li] = -1
    if i < size:
        last = heap[size]
        heap[i] = last
        heap_pos[last] = i
        _sift(heap, heap_pos, key, size, last)


@compile_kernel
def _heap_top(heap, heap_pos, key, level, state):
    """The link of lowest (level, index), or -1 if the heap is empty. A key may lag below its
    link's level (see `_freeze`): such a link is re-keyed when it comes to the top."""
    while state[_HEAP_SIZE] > 0:
        li = heap[0]
        if key[li] == level[li]:
            return li
        key[li] = level[li]
        _sift(heap, heap_pos, key, state[_HEAP_SIZE], li)
    return -1


# -- progressive filling --------------------------------------------------------------------------

@compile_kernel
def _solve(hops, flows, order, capacity, links, link_ints, flow_ints, records, members, rates,
           row_sum, state):
    """Set up the filling of the flows `flows` (columns of `hops`), unless `flows` is empty, and
    run rounds of it until every flow is frozen (returns 0), or until a round's prefix depends
    on numpy's order of equal levels (returns _NEED_ORDER, having undone that round): the caller
    then passes `order`, the argsort of the levels, and the next round walks it instead of the
    heap.

    A flow's mark is -1 until it freezes, then the round it froze in, which numbers the rounds
    of every solve in turn. A round's prefix links, in walk order, go to `group`; where each
    one's flows start in `frozen`, to `prefix`, which makes `frozen` a run of ascending flows
    per prefix link."""
    counts, used, level, key = links[_COUNTS], links[_USED], links[_LEVEL], links[_KEY]
    start, seen = link_ints[_START], link_ints[_SEEN]
    heap, heap_pos = link_ints[_HEAP], link_ints[_HEAP_POS]
    prefix, group, changed = link_ints[_PREFIX], link_ints[_GROUP], link_ints[_CHANGED]
    mark, frozen, spare = flow_ints[_MARK], flow_ints[_FROZEN], flow_ints[_SPARE]
    if len(flows):
        state[_LEFT] = _start(hops, flows, capacity, counts, used, level, key, start, heap,
                              heap_pos, mark, records, members, rates, state)
    ordered = len(order) > 0
    while state[_LEFT] > 0:
        state[_ROUND] += 1
        marked = state[_ROUND]
        num_prefix = num_frozen = 0
        if ordered:
            for p in range(len(order)):
                li = order[p]
                if counts[li] <= 0 or _blocked(li, start, members, mark, marked):
                    break
                _heap_remove(heap, heap_pos, key, state, li)
                group[num_prefix] = li
                prefix[num_prefix] = num_frozen
                num_prefix += 1
                num_frozen = _mark(li, start, members, mark, marked, frozen, num_frozen)
            ordered = False
        else:
            blocked = -1
            while True:
                li = _heap_top(heap, heap_pos, key, level, state)
                if li < 0:
                    break
                if _blocked(li, start, members, mark, marked):
                    blocked = li
                    break
                _heap_remove(heap, heap_pos, key, state, li)
                group[num_prefix] = li
                prefix[num_prefix] = num_frozen
                num_prefix += 1
                num_frozen = _mark(li, start, members, mark, marked, frozen, num_frozen)
            if blocked >= 0 and _depends_on_order(blocked, num_prefix, level, start, members,
                                                  mark, marked, heap, heap_pos, key, group,
                                                  state):
                for k in range(num_frozen):
                    mark[frozen[k] >> 32] = -1
                for k in range(num_prefix):
                    _heap_push(heap, heap_pos, key, state, group[k])
                return _NEED_ORDER
        prefix[num_prefix] = num_frozen
        _merge_runs(frozen, spare, prefix, num_prefix)
        _freeze(frozen[:num_frozen], state[_ROUND], capacity, counts, used, level, key, records,
                state[_HOPS], seen, changed, heap, heap_pos, row_sum, state, rates)
        state[_LEFT] -= num_frozen
    return 0


@compile_kernel
def _start(hops, flows, capacity, counts, used, level, key, start, heap, heap_pos, mark, records,
           members, rates, state):
    """Set up the filling of the flows `flows` (columns of `hops`): each one unmarked, its
    links in its record, each link's members listed, flows per link (the padding index counts
    none), nothing used yet, the first levels, and the heap of links with flows. A lone flow
    gets its slowest link's capacity at once. Returns how many flows are left to fill."""
    num_hops, num_flows = hops.shape[0], len(flows)
    if num_flows == 1:
        lowest = np.inf
        for j in range(num_hops):
            c = capacity[hops[j, flows[0]]]
            if c < lowest:
                lowest = c
        rates[0] = lowest
        return 0
    state[_HOPS] = num_hops
    num_links = len(counts)
    pad = num_links - 1
    counts[:] = 0.0
    for f in range(num_flows):
        mark[f] = -1
        for j in range(num_hops):
            li = hops[j, flows[f]]
            records[f, j] = li
            counts[li] += 1.0
    counts[pad] = 0.0
    at = 0
    for li in range(num_links):
        start[li] = at
        at += int(counts[li])
    start[num_links] = at
    for f in range(num_flows):
        for j in range(num_hops):
            li = records[f, j]
            if li != pad:
                members[start[li]] = f
                start[li] += 1
    for li in range(num_links - 1, 0, -1):
        start[li] = start[li - 1]
    start[0] = 0
    used[:] = 0.0
    state[_HEAP_SIZE] = 0
    for li in range(num_links):
        heap_pos[li] = -1
        if counts[li] > 0:
            level[li] = key[li] = capacity[li] / counts[li]
            _heap_push(heap, heap_pos, key, state, li)
        else:
            level[li] = np.inf
    return num_flows


@compile_kernel
def _blocked(li, start, members, mark, marked):
    """Whether a flow marked in the current round (`marked`) crosses link li."""
    end = start[li + 1]
    for k in range(start[li], end):
        if k + _AHEAD < end:
            _prefetch(mark, members[k + _AHEAD])
        if mark[members[k]] == marked:
            return True
    return False


@compile_kernel
def _mark(li, start, members, mark, marked, frozen, num_frozen):
    """Put link li in the round's prefix: mark its unfrozen flows as freezing at its level, and
    list each as flow << 32 | li in `frozen`. Returns the new number of marked flows."""
    end = start[li + 1]
    for k in range(start[li], end):
        if k + _AHEAD < end:
            _prefetch(mark, members[k + _AHEAD])
        f = members[k]
        if mark[f] < 0:
            mark[f] = marked
            frozen[num_frozen] = (np.int64(f) << 32) | li
            num_frozen += 1
    return num_frozen


@compile_kernel
def _depends_on_order(blocked, num_prefix, level, start, members, mark, marked, heap, heap_pos,
                      key, group, state):
    """Whether numpy's order of equal levels could change the round's prefix, which the walk
    ended at link `blocked` (at the top of the heap) after the links group[:num_prefix]: yes if
    the last of those ties with `blocked`, or if a link tied with `blocked` is not blocked. The
    tied links are taken off the heap to be looked at and put back."""
    if num_prefix > 0 and level[group[num_prefix - 1]] == level[blocked]:
        return True
    tied = False
    num_group = 0
    while True:
        li = _heap_top(heap, heap_pos, key, level, state)
        if li < 0 or level[li] != level[blocked]:
            break
        _heap_remove(heap, heap_pos, key, state, li)
        group[num_prefix + num_group] = li
        num_group += 1
        if not _blocked(li, start, members, mark, marked):
            tied = True
            break
    for k in range(num_prefix, num_prefix + num_group):
        _heap_push(heap, heap_pos, key, state, group[k])
    return tied


@compile_kernel
def _merge_runs(frozen, spare, bounds, num_runs):
    """Sort frozen[:bounds[num_runs]], made of the ascending runs between consecutive `bounds`,
    by merging neighbouring runs pass by pass (`spare` the other buffer; `bounds` is consumed)."""
    src, dst = frozen, spare
    in_spare = False
    while num_runs > 1:
        merged = 0
        for r in range(0, num_runs, 2):
            lo = bounds[r]
            if r + 1 == num_runs:
                hi = end = bounds[r + 1]
            else:
                hi, end = bounds[r + 1], bounds[r + 2]
            a, b, out = lo, hi, lo
            while a < hi and b < end:
                if src[b] < src[a]:
                    dst[out] = src[b]
                    b += 1
                else:
                    dst[out] = src[a]
                    a += 1
                out += 1
            while a < hi:
                dst[out] = src[a]
                a += 1
                out += 1
            while b < end:
                dst[out] = src[b]
                b += 1
                out += 1
            bounds[merged] = lo
            merged += 1
        bounds[merged] = bounds[num_runs]
        num_runs = merged
        src, dst = dst, src
        in_spare = not in_spare
    if in_spare:
        frozen[:bounds[1]] = spare[:bounds[1]]


@compile_kernel
def _freeze(frozen, stamp, capacity, counts, used, level, key, records, num_hops, seen, changed,
            heap, heap_pos, row_sum, state, rates):
    """Freeze the marked flows `frozen` (flow << 32 | prefix link, ascending) at their prefix
    links' levels: their rates,
    the used capacity and flow counts of the links they cross, and those links' new levels,
    re-keyed in the heap (a link left without flows leaves it). `changed` lists those links,
    each once (it is seen with the round's stamp).

    Sums run as `MaxMinSolver`'s rounds run them: per hop row, the frozen flows in order, the
    row's total then added to `used`, rows in order. A row's total starts from -0.0, which no
    rate changes (-0.0 + r is r) and which, added to `used`, leaves it as it is: so a link no
    frozen flow crosses at some hop takes nothing from that row, as in the rounds."""
    pad = len(counts) - 1
    num_changed = 0
    num_frozen = len(frozen)
    flat, width = records.reshape(-1), records.shape[1]
    for k in range(min(num_frozen, _AHEAD)):
        _prefetch(flat, (frozen[k] >> 32) * width)
    for k in range(num_frozen):
        if k + _AHEAD < num_frozen:
            ahead = frozen[k + _AHEAD] >> 32
            _prefetch(flat, ahead * width)
            _prefetch(rates, ahead)
        f = frozen[k] >> 32
        rate = level[frozen[k] & 0xFFFFFFFF]
        rates[f] = rate
        for j in range(num_hops):
            li = records[f, j]
            if li != pad:
                row_sum[j, li] += rate
                counts[li] -= 1.0
                if seen[li] != stamp:
                    seen[li] = stamp
                    changed[num_changed] = li
                    num_changed += 1
    for j in range(num_hops):
        for k in range(num_changed):
            li = changed[k]
            used[li] += row_sum[j, li]
            row_sum[j, li] = -0.0
    for k in range(num_changed):
        li = changed[k]
        if counts[li] > 0:
            level[li] = (capacity[li] - used[li]) / counts[li]
            if level[li] < key[li]:
                # Rounding can lower a level that rises in exact arithmetic: a key must not lag
                # above its level, so this one moves now.
                key[li] = level[li]
                _sift(heap, heap_pos, key, state[_HEAP_SIZE], li)
        else:
            level[li] = np.inf
            if heap_pos[li] >= 0:
                _heap_remove(heap, heap_pos, key, state, li)
