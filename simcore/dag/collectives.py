"""Collective lowering: an all-reduce, reduce-scatter, all-gather, all-to-all or send/recv over a
group of GPUs as point-to-point transfers with dependencies, following NCCL's and DeepEP's
algorithms.

Every function here is pure: it sees GPUs only through `node_of` (which node holds a GPU) and
returns a frozen `CollectivePlan`. Sizes are split into integer parts that sum exactly to the
whole (`size // n + (i < size % n)` for part i), so no byte is lost or invented. A transfer's
`latency_s` is the per-message software cost (alpha) of `LinkCosts`, intra- or inter-node.

Rings (`_ring`). Members 0..n-1 in the order given; edge e is member e -> member e+1 (mod n). At
global step s every edge carries one segment, member e sending segment (e - s - 1) mod n.
Steps 0..n-2 are a reduce-scatter after which member e holds the reduced segment e; steps
n-1..2n-3 are an all-gather that starts from member e holding segment e. An all-reduce runs both.
The transfer of step s on edge e depends on step s-1 on edge e-1 (it forwards what it received)
and on the previous transfer on its own edge (a link sends in order). With `chunks` = c each
segment is split into c sub-transfers sent in (step, chunk) order on each edge: chunk k of step s
on edge e depends on chunk k of step s-1 on edge e-1 (its data) and on the transfer before it on
edge e (chunk k-1 of step s, or the last chunk of step s-1 for k = 0). A chunk moves on as soon as
its own data has arrived, without waiting for the rest of its segment, while each link still
carries one message at a time, so the ring never looks faster than its links allow.

Double binary tree (`_double_tree`), as NCCL's `ncclGetDtree` builds it over positions 0..n-1 of
the group. Tree 0 is NCCL's binary tree rooted at 0: a position r > 0 with lowest set bit b has
parent (r ^ b) | (b << 1), or r ^ b when that is >= n; so the odd positions are its leaves, and
the root has a single child (the largest power of two below n). Tree 1 mirrors it (position r
plays n-1-r) when n is even and shifts it by one (r plays r-1 mod n) when n is odd, so the
positions interior to tree 0 are leaves of tree 1 (for odd n, position 0 is interior to both).
Both trees have depth ceil(log2 n). Tree t carries half t of the buffer (exact integer halves),
split into `chunks` pipelined chunks: a node sends chunk k up once it has received chunk k from
all its children (and sent chunk k-1 up); the root sends chunk k down once it has received chunk k
from all its children; any other node forwards chunk k to each child once it has received chunk
k from its parent; each (node, child) link sends its chunks in order.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass

KINDS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "send_recv")
"""The collectives this module lowers."""

ALGORITHMS: dict[str, tuple[str, ...]] = {
    "all_reduce": ("ring", "tree", "hierarchical"),
    "reduce_scatter": ("ring", "hierarchical"),
    "all_gather": ("ring", "hierarchical"),
    "all_to_all": ("direct", "hierarchical"),
    "send_recv": ("direct",),
}
"""Algorithms each kind accepts besides "auto". A plan that moves nothing between GPUs (a group of
one GPU, a send to oneself) has algorithm "local" whatever was asked."""

LOCAL = "local"

_PLAN_CACHE_SIZE = 4096
"""Plans memoised per process: a simulation lowers the same few collectives over and over, and a
plan is immutable, so sharing one between callers is safe."""


@dataclass(frozen=True, slots=True)
class Transfer:
    """One point-to-point message of a lowered collective.

    Invariants (established by the lowering, not re-checked here for speed): `index` is the
    transfer's position in its plan, `src != dst`, `size_bytes >= 0`, and every dep is < `index`.
    """

    index: int
    src: int
    dst: int
    size_bytes: int
    deps: tuple[int, ...]
    latency_s: float


@dataclass(frozen=True, slots=True)
class CollectivePlan:
    """A collective lowered to transfers in topological order (every dep precedes its dependant).
    `size_bytes` is the collective's nominal size as passed in (all-to-all: the matrix's
    off-diagonal sum); `ranks` are the group's GPUs in rank order."""

    kind: str
    algorithm: str
    ranks: tuple[int, ...]
    transfers: tuple[Transfer, ...]
    size_bytes: int

    def bytes_between(self, same_node: Callable[[int, int], bool]) -> tuple[int, int]:
        """(intra-node bytes, inter-node bytes) summed over transfers."""
        intra_bytes = inter_bytes = 0
        for t in self.transfers:
            if same_node(t.src, t.dst):
                intra_bytes += t.size_bytes
            else:
                inter_bytes += t.size_bytes
        return intra_bytes, inter_bytes

    def sent_bytes_by_rank(self) -> dict[int, int]:
        """Bytes each GPU of the group sends (0 for one that sends nothing)."""
        sent = dict.fromkeys(self.ranks, 0)
        for t in self.transfers:
            sent[t.src] += t.size_bytes
        return sent


@dataclass(frozen=True, slots=True)
class LinkCosts:
    """Per-transfer latencies the lowering attaches (alpha), by whether the two GPUs share a node."""

    intra_node_latency_s: float = 1.5e-6
    inter_node_latency_s: float = 5e-6


_DEFAULT_COSTS = LinkCosts()


def split_bytes(size_bytes: int, num_parts: int) -> tuple[int, ...]:
    """`size_bytes` as `num_parts` integer parts that differ by at most one and sum exactly."""
    base, extra = divmod(size_bytes, num_parts)
    return tuple(base + (i < extra) for i in range(num_parts))


# --- algorithm choice -------------------------------------------------------------------------

def choose_algorithm(kind: str, ranks: Sequence[int], size_bytes: int,
                     node_of: Callable[[int], int], *,
                     tree_threshold_bytes: int = 256 * 1024) -> str:
    """NCCL-like choice. All ranks on one node -> "ring" (all-to-all: "direct").
    Multi-node all_reduce: size <= tree_threshold_bytes -> "tree"; else "hierarchical" if any node
    holds >1 rank of the group, else "ring".
    Multi-node reduce_scatter / all_gather: "hierarchical" if any node holds >1 rank, else "ring".
    Multi-node all_to_all: "hierarchical" if any node holds >1 rank, else "direct".
    send_recv: "direct". A group of one GPU (or a send to oneself) -> "local"."""
    _check_kind(kind)
    ranks = _ranks_tuple(ranks)
    return _choose(kind, tuple(node_of(r) for r in ranks), size_bytes, tree_threshold_bytes)


def _choose(kind: str, nodes: tuple[int, ...], size_bytes: int, tree_threshold_bytes: int) -> str:
    if len(nodes) < 2:
        return LOCAL
    if kind == "send_recv":
        return "direct"
    distinct = set(nodes)
    if len(distinct) == 1:
        return "direct" if kind == "all_to_all" else "ring"
    shared = len(distinct) < len(nodes)
    if kind == "all_reduce" and size_bytes <= tree_threshold_bytes:
        return "tree"
    if shared:
        return "hierarchical"
    return "direct" if kind == "all_to_all" else "ring"


# --- public lowering functions ----------------------------------------------------------------

def all_reduce(ranks: Sequence[int], size_bytes: int, node_of: Callable[[int], int], *,
               algorithm: str = "auto", costs: LinkCosts = _DEFAULT_COSTS,
               chunks: int = 1) -> CollectivePlan:
    """Every rank ends with the reduction of all ranks' `size_bytes` buffers."""
    return _lower("all_reduce", ranks, size_bytes, node_of, algorithm, costs, chunks)


def reduce_scatter(ranks: Sequence[int], size_bytes: int, node_of: Callable[[int], int], *,
                   algorithm: str = "auto", costs: LinkCosts = _DEFAULT_COSTS) -> CollectivePlan:
    """Each rank holds a `size_bytes` input; rank i ends with reduced part i (about size / n)."""
    return _lower("reduce_scatter", ranks, size_bytes, node_of, algorithm, costs, 1)


def all_gather(ranks: Sequence[int], size_bytes: int, node_of: Callable[[int], int], *,
               algorithm: str = "auto", costs: LinkCosts = _DEFAULT_COSTS) -> CollectivePlan:
    """Rank i contributes part i (about size / n); every rank ends with the `size_bytes` whole."""
    return _lower("all_gather", ranks, size_bytes, node_of, algorithm, costs, 1)


def all_to_all(ranks: Sequence[int], bytes_matrix: Sequence[Sequence[int]],
               node_of: Callable[[int], int], *, algorithm: str = "auto",
               costs: LinkCosts = _DEFAULT_COSTS) -> CollectivePlan:
    """Rank i sends `bytes_matrix[i][j]` bytes to rank j (the diagonal is ignored)."""
    ranks = _ranks_tuple(ranks)
    n = len(ranks)
    if len(bytes_matrix) != n or any(len(row) != n for row in bytes_matrix):
        raise ValueError(f"all_to_all bytes_matrix must be {n} x {n} for a group of {n} ranks")
    matrix = tuple(tuple(operator.index(b) for b in row) for row in bytes_matrix)
    if any(b < 0 for row in matrix for b in row):
        raise ValueError("all_to_all bytes_matrix entries must be >= 0")
    _check_algorithm("all_to_all", algorithm)
    return _build_all_to_all(ranks, tuple(node_of(r) for r in ranks), matrix, algorithm, costs)


def send_recv(src: int, dst: int, size_bytes: int, node_of: Callable[[int], int], *,
              costs: LinkCosts = _DEFAULT_COSTS) -> CollectivePlan:
    """One message of `size_bytes` from `src` to `dst` (none when they are the same GPU)."""
    size_bytes = _size(size_bytes)
    if src == dst:
        return CollectivePlan("send_recv", LOCAL, (src,), (), size_bytes)
    latency_s = (costs.intra_node_latency_s if node_of(src) == node_of(dst)
                 else costs.inter_node_latency_s)
    return CollectivePlan("send_recv", "direct", (src, dst),
                          (Transfer(0, src, dst, size_bytes, (), latency_s),), size_bytes)


# --- validation -------------------------------------------------------------------------------

def _check_kind(kind: str) -> None:
    if kind not in ALGORITHMS:
        raise ValueError(f"unknown collective kind {kind!r}; valid: {', '.join(KINDS)}")


def _check_algorithm(kind: str, algorithm: str) -> None:
    if algorithm != "auto" and algorithm not in ALGORITHMS[kind]:
        valid = ", ".join(("auto",) + ALGORITHMS[kind])
        raise ValueError(f"unknown {kind} algorithm {algorithm!r}; valid: {valid}")


def _ranks_tuple(ranks: Sequence[int]) -> tuple[int, ...]:
    ranks = tuple(operator.index(r) for r in ranks)
    if not ranks:
        raise ValueError("a collective needs at least one rank")
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"a collective's ranks must be distinct GPUs, got {ranks}")
    return ranks


def _size(size_bytes: int) -> int:
    size_bytes = operator.index(size_bytes)
    if size_bytes < 0:
        raise ValueError(f"size_bytes must be >= 0, got {size_bytes}")
    return size_bytes


def _lower(kind: str, ranks: Sequence[int], size_bytes: int, node_of: Callable[[int], int],
           algorithm: str, costs: LinkCosts, chunks: int) -> CollectivePlan:
    ranks = _ranks_tuple(ranks)
    size_bytes = _size(size_bytes)
    chunks = operator.index(chunks)
    if chunks < 1:
        raise ValueError(f"chunks must be >= 1, got {chunks}")
    _check_algorithm(kind, algorithm)
    return _build(kind, ranks, tuple(node_of(r) for r in ranks), size_bytes, algorithm, costs,
                  chunks)


# --- construction -----------------------------------------------------------------------------

class _Builder:
    """Accumulates transfers in order, giving each its index and its alpha."""

    __slots__ = ("transfers", "node_by_gpu", "intra_s", "inter_s")

    def __init__(self, ranks: tuple[int, ...], nodes: tuple[int, ...], costs: LinkCosts):
        self.transfers: list[Transfer] = []
        self.node_by_gpu = dict(zip(ranks, nodes))
        self.intra_s = costs.intra_node_latency_s
        self.inter_s = costs.inter_node_latency_s

    def add(self, src: int, dst: int, size_bytes: int, deps: tuple[int, ...]) -> int:
        index = len(self.transfers)
        node_by_gpu = self.node_by_gpu
        latency_s = self.intra_s if node_by_gpu[src] == node_by_gpu[dst] else self.inter_s
        self.transfers.append(Transfer(index, src, dst, size_bytes, deps, latency_s))
        return index


def _node_groups(ranks: tuple[int, ...], nodes: tuple[int, ...]) -> list[list[int]]:
    """The group's GPUs per node: nodes in order of first appearance, GPUs in rank order."""
    by_node: dict[int, list[int]] = {}
    for r, node in zip(ranks, nodes):
        by_node.setdefault(node, []).append(r)
    return list(by_node.values())


def _even_groups(kind: str, ranks: tuple[int, ...], nodes: tuple[int, ...]) -> list[list[int]]:
    groups = _node_groups(ranks, nodes)
    counts = {len(g) for g in groups}
    if len(counts) > 1:
        per_node = {nodes[ranks.index(g[0])]: len(g) for g in groups}
        raise ValueError(f"hierarchical {kind} needs the same number of ranks on every node; "
                         f"ranks per node: {per_node}")
    return groups


@functools.lru_cache(maxsize=_PLAN_CACHE_SIZE)
def _build(kind: str, ranks: tuple[int, ...], nodes: tuple[int, ...], size_bytes: int,
           algorithm: str, costs: LinkCosts, chunks: int) -> CollectivePlan:
    if algorithm == "auto":
        algorithm = _choose(kind, nodes, size_bytes, 256 * 1024)
    n = len(ranks)
    if n == 1:
        return CollectivePlan(kind, LOCAL, ranks, (), size_bytes)
    b = _Builder(ranks, nodes, costs)
    # A zero-byte collective returns at once in NCCL: nothing is sent.
    if size_bytes > 0:
        ready: list[tuple[int, ...]] = [()] * n
        if algorithm == "tree":
            _double_tree(b, ranks, size_bytes, chunks)
        elif algorithm == "ring":
            first_step, num_steps = {"all_reduce": (0, 2 * (n - 1)),
                                     "reduce_scatter": (0, n - 1),
                                     "all_gather": (n - 1, n - 1)}[kind]
            _ring(b, list(ranks), split_bytes(size_bytes, n), first_step, num_steps, chunks, ready)
        elif kind == "all_reduce":
            _hierarchical_all_reduce(b, _even_groups(kind, ranks, nodes), size_bytes, chunks)
        elif kind == "reduce_scatter":
            _hierarchical_reduce_scatter(b, ranks, _even_groups(kind, ranks, nodes), size_bytes)
        else:
            _hierarchical_all_gather(b, ranks, _even_groups(kind, ranks, nodes), size_bytes)
    return CollectivePlan(kind, algorithm, ranks, tuple(b.transfers), size_bytes)


def _ring(b: _Builder, members: list[int], segment_bytes: Sequence[int], first_step: int,
          num_steps: int, chunks: int, ready: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """Steps first_step .. first_step + num_steps - 1 of the ring over `members` (see the module
    docstring). `ready[e]` are the transfers member e's data waits for before its first send.
    Returns, per member, the transfers after which its part of the result is in place: the last
    one into it and the last one out of it (which waits, through its link, for `ready[e]`)."""
    n = len(members)
    if n < 2 or num_steps == 0:
        return list(ready)
    chunk_bytes = [split_bytes(size, chunks) for size in segment_bytes]
    dsts = members[1:] + members[:1]
    add = b.add
    prev: list[list[int]] = []
    for s in range(first_step, first_step + num_steps):
        cur: list[list[int]] = []
        for e in range(n):
            src, dst = members[e], dsts[e]
            sizes = chunk_bytes[(e - s - 1) % n]
            row: list[int] = []
            for k in range(chunks):
                if prev:
                    # prev[e - 1] is edge e-1 (wrapping to n-1 for e = 0): it delivered to e.
                    link = row[k - 1] if k else prev[e][-1]
                    deps: tuple[int, ...] = (prev[e - 1][k], link)
                else:
                    deps = (row[k - 1],) if k else ready[e]
                row.append(add(src, dst, sizes[k], deps))
            cur.append(row)
        prev = cur
    return [(prev[e - 1][-1], prev[e][-1]) for e in range(n)]


def _btree_parent(n: int, r: int) -> int:
    """NCCL's binary tree over positions 0..n-1 (`ncclGetBtree`); -1 for the root 0."""
    if r == 0:
        return -1
    bit = r & -r
    up = (r ^ bit) | (bit << 1)
    return up if up < n else r ^ bit


def double_tree_parents(n: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Parent position of each of positions 0..n-1 in NCCL's two complementary trees (-1: root)."""
    tree0 = tuple(_btree_parent(n, r) for r in range(n))
    if n % 2 == 0:
        mirrored = (_btree_parent(n, n - 1 - r) for r in range(n))
        tree1 = tuple(-1 if p < 0 else n - 1 - p for p in mirrored)
    else:
        shifted = (_btree_parent(n, (r - 1) % n) for r in range(n))
        tree1 = tuple(-1 if p < 0 else (p + 1) % n for p in shifted)
    return tree0, tree1


def _double_tree(b: _Builder, ranks: tuple[int, ...], size_bytes: int, chunks: int) -> None:
    n = len(ranks)
    add = b.add
    for parents, half in zip(double_tree_parents(n), split_bytes(size_bytes, 2)):
        children: list[list[int]] = [[] for _ in range(n)]
        depth = [0] * n
        for r, p in enumerate(parents):
            if p >= 0:
                children[p].append(r)
            q = p
            while q >= 0:
                depth[r] += 1
                q = parents[q]
        root = parents.index(-1)
        top_down = sorted(range(n), key=depth.__getitem__)
        bottom_up = [r for r in reversed(top_down) if r != root]
        sizes = split_bytes(half, chunks)
        up: list[list[int]] = [[] for _ in range(n)]
        down: list[list[int]] = [[] for _ in range(n)]
        for k in range(chunks):
            for r in bottom_up:
                deps = tuple(up[c][k] for c in children[r])
                if k:
                    deps += (up[r][k - 1],)
                up[r].append(add(ranks[r], ranks[parents[r]], sizes[k], deps))
        for k in range(chunks):
            for r in top_down:
                have = tuple(up[c][k] for c in children[r]) if r == root else (down[r][k],)
                for c in children[r]:
                    deps = have + (down[c][k - 1],) if k else have
                    down[c].append(add(ranks[r], ranks[c], sizes[k], deps))


def _hierarchical_all_reduce(b: _Builder, groups: list[list[int]], size_bytes: int,
                             chunks: int) -> None:
    """Intra-node ring reduce-scatter into one shard per local position, an inter-node ring
    all-reduce of shard p over the nodes' p-th GPUs, then an intra-node ring all-gather."""
    local = len(groups[0])
    shard_bytes = split_bytes(size_bytes, local)
    done: dict[int, tuple[int, ...]] = {}
    for g in groups:
        done.update(zip(g, _ring(b, g, shard_bytes, 0, local - 1, chunks, [()] * local)))
    for p in range(local):
        column = [g[p] for g in groups]
        m = len(column)
        done.update(zip(column, _ring(b, column, split_bytes(shard_bytes[p], m), 0, 2 * (m - 1),
                                      chunks, [done[r] for r in column])))
    for g in groups:
        _ring(b, g, shard_bytes, local - 1, local - 1, chunks, [done[r] for r in g])


def _hierarchical_reduce_scatter(b: _Builder, ranks: tuple[int, ...], groups: list[list[int]],
                                 size_bytes: int) -> None:
    """Rank i's result part i is split as in the flat ring. Shard p gathers the parts of the
    nodes' p-th GPUs; an intra-node ring reduce-scatter leaves shard p, reduced over the node, on
    its p-th GPU, and an inter-node ring reduce-scatter over the p-th GPUs leaves each its part.
    Inter-node traffic is (nodes - 1) x size in all, as a flat ring's that crosses nodes once."""
    part_bytes = dict(zip(ranks, split_bytes(size_bytes, len(ranks))))
    local = len(groups[0])
    columns = [[g[p] for g in groups] for p in range(local)]
    shard_bytes = [sum(part_bytes[r] for r in column) for column in columns]
    done: dict[int, tuple[int, ...]] = {}
    for g in groups:
        done.update(zip(g, _ring(b, g, shard_bytes, 0, local - 1, 1, [()] * local)))
    for column in columns:
        m = len(column)
        _ring(b, column, [part_bytes[r] for r in column], 0, m - 1, 1, [done[r] for r in column])


def _hierarchical_all_gather(b: _Builder, ranks: tuple[int, ...], groups: list[list[int]],
                             size_bytes: int) -> None:
    """The reverse of the hierarchical reduce-scatter: an inter-node ring all-gather over the
    nodes' p-th GPUs assembles shard p on each of them, then an intra-node ring all-gather
    shares the shards within each node."""
    part_bytes = dict(zip(ranks, split_bytes(size_bytes, len(ranks))))
    local = len(groups[0])
    columns = [[g[p] for g in groups] for p in range(local)]
    shard_bytes = [sum(part_bytes[r] for r in column) for column in columns]
    done: dict[int, tuple[int, ...]] = {}
    for column in columns:
        m = len(column)
        done.update(zip(column, _ring(b, column, [part_bytes[r] for r in column], m - 1, m - 1, 1,
                                      [()] * m)))
    for g in groups:
        _ring(b, g, shard_bytes, local - 1, local - 1, 1, [done[r] for r in g])


@functools.lru_cache(maxsize=_PLAN_CACHE_SIZE)
def _build_all_to_all(ranks: tuple[int, ...], nodes: tuple[int, ...],
                      matrix: tuple[tuple[int, ...], ...], algorithm: str,
                      costs: LinkCosts) -> CollectivePlan:
    """Direct: one transfer per ordered pair with bytes. Hierarchical (DeepEP-style): GPU i
    sends everything it has for node B in one inter-node message to its relay on B, the GPU at
    i's position among its node's GPUs (modulo B's count), which forwards each final GPU's part
    over NVLink; pairs within a node are direct."""
    n = len(ranks)
    total_bytes = sum(matrix[i][j] for i in range(n) for j in range(n) if i != j)
    if algorithm == "auto":
        algorithm = _choose("all_to_all", nodes, total_bytes, 0)
    if n == 1:
        return CollectivePlan("all_to_all", LOCAL, ranks, (), total_bytes)
    b = _Builder(ranks, nodes, costs)
    add = b.add
    if algorithm == "direct":
        for i in range(n):
            row = matrix[i]
            for j in range(n):
                if i != j and row[j] > 0:
                    add(ranks[i], ranks[j], row[j], ())
        return CollectivePlan("all_to_all", algorithm, ranks, tuple(b.transfers), total_bytes)
    position = {r: i for i, r in enumerate(ranks)}
    groups = _node_groups(ranks, nodes)
    group_of = {r: g for g in groups for r in g}
    for i in range(n):
        src = ranks[i]
        row = matrix[i]
        home = group_of[src]
        local = home.index(src)
        for g in groups:
            if g is home:
                for dst in g:
                    j = position[dst]
                    if dst != src and row[j] > 0:
                        add(src, dst, row[j], ())
                continue
            relay = g[local % len(g)]
            aggregate_bytes = sum(row[position[dst]] for dst in g)
            if aggregate_bytes == 0:
                continue
            hop = add(src, relay, aggregate_bytes, ())
            for dst in g:
                j = position[dst]
                if dst != relay and row[j] > 0:
                    add(relay, dst, row[j], (hop,))
    return CollectivePlan("all_to_all", algorithm, ranks, tuple(b.transfers), total_bytes)
