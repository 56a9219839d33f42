"""Collective lowering: exact bytes per rank and in total for every algorithm, dependencies that
form a DAG, NCCL's double binary tree, and textbook completion times on an uncontended fabric."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simcore.dag.collectives import (ALGORITHMS, CollectivePlan, LinkCosts, all_gather,
                                     all_reduce, all_to_all, choose_algorithm,
                                     double_tree_parents, reduce_scatter, send_recv, split_bytes)

COSTS = LinkCosts(intra_node_latency_s=2e-6, inter_node_latency_s=7e-6)


def _per_node(gpus_per_node):
    return lambda gpu: gpu // gpus_per_node


def _same_node(gpus_per_node):
    return lambda a, b: a // gpus_per_node == b // gpus_per_node


def _assert_well_formed(plan: CollectivePlan, node_of, costs=COSTS):
    """Indices are positions, deps point backwards (so the transfers form a DAG), endpoints are
    distinct GPUs of the group, and each transfer carries the alpha of its node pair."""
    group = set(plan.ranks)
    for i, t in enumerate(plan.transfers):
        assert t.index == i
        assert t.src != t.dst and t.src in group and t.dst in group
        assert isinstance(t.size_bytes, int) and t.size_bytes >= 0
        assert all(0 <= d < i for d in t.deps)
        assert len(set(t.deps)) == len(t.deps)
        expected = (costs.intra_node_latency_s if node_of(t.src) == node_of(t.dst)
                    else costs.inter_node_latency_s)
        assert t.latency_s == expected


def _completion_s(plan: CollectivePlan, bytes_per_s: float) -> float:
    """Longest path: a transfer starts when its deps are done and takes latency + bytes / B."""
    done = []
    for t in plan.transfers:
        start = max((done[d] for d in t.deps), default=0.0)
        done.append(start + t.latency_s + t.size_bytes / bytes_per_s)
    return max(done, default=0.0)


def _total(plan):
    return sum(t.size_bytes for t in plan.transfers)


# --- sizes --------------------------------------------------------------------------------------

@given(st.integers(0, 10**12), st.integers(1, 300))
def test_split_bytes_is_exact_and_even(size, n):
    parts = split_bytes(size, n)
    assert len(parts) == n and sum(parts) == size
    assert max(parts) - min(parts) <= 1


# --- ring ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_ring_all_reduce_sends_two_n_minus_one_over_n_of_the_buffer_per_rank(n):
    size = 1024 * n
    plan = all_reduce(tuple(range(n)), size, _per_node(8), algorithm="ring", costs=COSTS)
    _assert_well_formed(plan, _per_node(8))
    assert plan.algorithm == "ring" and plan.kind == "all_reduce"
    assert len(plan.transfers) == 2 * (n - 1) * n
    assert plan.sent_bytes_by_rank() == {r: 2 * (n - 1) * size // n for r in range(n)}


@settings(max_examples=60)
@given(n=st.integers(2, 12), size=st.integers(1, 10**7), chunks=st.integers(1, 4))
def test_ring_all_reduce_total_is_exact_for_any_size_and_chunking(n, size, chunks):
    plan = all_reduce(tuple(range(n)), size, _per_node(4), algorithm="ring", costs=COSTS,
                      chunks=chunks)
    _assert_well_formed(plan, _per_node(4))
    assert len(plan.transfers) == 2 * (n - 1) * n * chunks
    assert _total(plan) == 2 * (n - 1) * size


def test_ring_all_reduce_dependencies_are_the_step_synchronous_ring():
    n = 4
    ranks = (10, 11, 12, 13)
    plan = all_reduce(ranks, 4000, _per_node(100), algorithm="ring")
    by_step_edge = {(i // n, i % n): t for i, t in enumerate(plan.transfers)}
    for (s, e), t in by_step_edge.items():
        assert (t.src, t.dst) == (ranks[e], ranks[(e + 1) % n])
        if s == 0:
            assert t.deps == ()
        else:
            assert set(t.deps) == {by_step_edge[s - 1, (e - 1) % n].index,
                                   by_step_edge[s - 1, e].index}


@pytest.mark.parametrize("n", [2, 3, 5, 8])
@pytest.mark.parametrize("chunks", [1, 3])
def test_ring_all_reduce_completes_at_the_textbook_time(n, chunks):
    """2(n-1) steps of alpha + S / (n B); chunking keeps the bandwidth term and pays c alphas."""
    size, bytes_per_s = 3 * 7 * 8 * 5 * 1024, 100e9
    plan = all_reduce(tuple(range(n)), size, _per_node(8), algorithm="ring", costs=COSTS,
                      chunks=chunks)
    alpha = COSTS.intra_node_latency_s
    expected = 2 * (n - 1) * (chunks * alpha + size / (n * bytes_per_s))
    assert _completion_s(plan, bytes_per_s) == pytest.approx(expected, rel=1e-12)


def test_ring_chunks_pipeline_data_within_a_step():
    """Chunk k of step s waits for chunk k of step s-1 from the neighbour and for chunk k-1 on its
    own link, not for the neighbour's whole segment."""
    n, chunks = 3, 2
    plan = all_reduce((0, 1, 2), 600, _per_node(8), algorithm="ring", chunks=chunks)
    index = {}
    for i, t in enumerate(plan.transfers):
        s, rest = divmod(i, n * chunks)
        e, k = divmod(rest, chunks)
        index[s, e, k] = t
    for (s, e, k), t in index.items():
        link = index[s, e, k - 1].index if k else (index[s - 1, e, chunks - 1].index if s else None)
        recv = index[s - 1, (e - 1) % n, k].index if s else None
        assert set(t.deps) == {d for d in (link, recv) if d is not None}


@pytest.mark.parametrize("n", [2, 3, 6, 8])
def test_ring_reduce_scatter_and_all_gather_send_n_minus_one_over_n_per_rank(n):
    size = 512 * n
    for lower in (reduce_scatter, all_gather):
        plan = lower(tuple(range(n)), size, _per_node(8), algorithm="ring", costs=COSTS)
        _assert_well_formed(plan, _per_node(8))
        assert len(plan.transfers) == (n - 1) * n
        assert plan.sent_bytes_by_rank() == {r: (n - 1) * size // n for r in range(n)}


@given(n=st.integers(2, 16), size=st.integers(1, 10**9))
def test_ring_reduce_scatter_and_all_gather_totals_are_exact(n, size):
    for lower in (reduce_scatter, all_gather):
        plan = lower(tuple(range(n)), size, _per_node(4), algorithm="ring")
        _assert_well_formed(plan, _per_node(4), LinkCosts())
        assert _total(plan) == (n - 1) * size


def test_ring_all_gather_completes_in_n_minus_one_steps():
    n, size, bytes_per_s = 4, 4096, 1e9
    plan = all_gather((0, 1, 2, 3), size, _per_node(8), algorithm="ring", costs=COSTS)
    expected = (n - 1) * (COSTS.intra_node_latency_s + size / n / bytes_per_s)
    assert _completion_s(plan, bytes_per_s) == pytest.approx(expected)


# --- double binary tree -------------------------------------------------------------------------

def test_double_tree_matches_nccl_for_eight_and_seven_ranks():
    # NCCL trees.cc: 0-4, 4-{2,6}, 2-{1,3}, 6-{5,7}; even n mirrors, odd n shifts by one.
    assert double_tree_parents(8) == ((-1, 2, 4, 2, 0, 6, 4, 6), (1, 3, 1, 7, 5, 3, 5, -1))
    assert double_tree_parents(7) == ((-1, 2, 4, 2, 0, 6, 4), (5, -1, 3, 5, 3, 1, 0))


def _depth(parents):
    def d(r):
        return 0 if parents[r] < 0 else 1 + d(parents[r])
    return max(d(r) for r in range(len(parents)))


@pytest.mark.parametrize("n", list(range(2, 40)) + [64, 100, 128])
def test_double_tree_is_two_complementary_trees_of_depth_ceil_log2(n):
    trees = double_tree_parents(n)
    interior = []
    for parents in trees:
        assert sum(p < 0 for p in parents) == 1
        assert _depth(parents) == math.ceil(math.log2(n))  # also proves there is no cycle
        children = [sum(p == r for p in parents) for r in range(n)]
        assert max(children) <= 2
        interior.append({r for r in range(n) if children[r]})
    # Complementary: a rank interior to one tree is a leaf of the other (odd n: except rank 0).
    assert len(interior[0] & interior[1]) <= (0 if n % 2 == 0 else 1)


@settings(max_examples=60)
@given(n=st.integers(2, 40), size=st.integers(1, 10**7), chunks=st.integers(1, 4))
def test_tree_all_reduce_moves_each_half_up_and_down_every_edge_once(n, size, chunks):
    plan = all_reduce(tuple(range(100, 100 + n)), size, _per_node(4), algorithm="tree",
                      costs=COSTS, chunks=chunks)
    _assert_well_formed(plan, lambda g: (g - 100) // 4)
    assert plan.algorithm == "tree"
    # n-1 edges per tree, each carrying its half up once and down once, in `chunks` pieces.
    assert len(plan.transfers) == 2 * 2 * (n - 1) * chunks
    assert _total(plan) == 2 * (n - 1) * size
    halves = split_bytes(size, 2)
    up_bytes = {}
    for parents, half in zip(double_tree_parents(n), halves):
        for r, p in enumerate(parents):
            if p >= 0:
                up_bytes[100 + r, 100 + p] = up_bytes.get((100 + r, 100 + p), 0) + half
                up_bytes[100 + p, 100 + r] = up_bytes.get((100 + p, 100 + r), 0) + half
    carried = {}
    for t in plan.transfers:
        carried[t.src, t.dst] = carried.get((t.src, t.dst), 0) + t.size_bytes
    assert carried == up_bytes


def test_tree_sends_up_only_after_hearing_from_all_children():
    n = 8
    plan = all_reduce(tuple(range(n)), 1000, _per_node(8), algorithm="tree")
    tree0, _ = double_tree_parents(n)
    first_half = plan.transfers[:2 * (n - 1)]
    up = {t.src: t for t in first_half[:n - 1]}
    for r, t in up.items():
        assert t.dst == tree0[r]
        kids = {c for c, p in enumerate(tree0) if p == r}
        assert {plan.transfers[d].src for d in t.deps} == kids
    for t in first_half[n - 1:]:
        assert tree0[t.dst] == t.src
        if t.src == 0:
            assert {plan.transfers[d].src for d in t.deps} == {4}
        else:
            assert [(plan.transfers[d].src, plan.transfers[d].dst) for d in t.deps] == [
                (tree0[t.src], t.src)]


@pytest.mark.parametrize("n", [2, 3, 4, 7, 8, 13, 16])
@pytest.mark.parametrize("chunks", [1, 4])
def test_tree_all_reduce_takes_two_depth_levels_plus_the_pipeline_fill(n, chunks):
    """Up D = ceil(log2 n) levels and down D levels for the first chunk, then one per chunk."""
    size, bytes_per_s = 2 * 4 * 1000, 25e9
    plan = all_reduce(tuple(range(n)), size, _per_node(1), algorithm="tree", costs=COSTS,
                      chunks=chunks)
    depth = math.ceil(math.log2(n))
    step_s = COSTS.inter_node_latency_s + size / 2 / chunks / bytes_per_s
    assert _completion_s(plan, bytes_per_s) == pytest.approx((2 * depth + chunks - 1) * step_s)


# --- hierarchical -------------------------------------------------------------------------------

@settings(max_examples=60)
@given(num_nodes=st.integers(1, 5), per_node=st.integers(1, 8), size=st.integers(1, 10**8),
       chunks=st.integers(1, 3))
def test_hierarchical_all_reduce_bytes_are_the_three_rings(num_nodes, per_node, size, chunks):
    n = num_nodes * per_node
    if n < 2:
        return
    plan = all_reduce(tuple(range(n)), size, _per_node(per_node), algorithm="hierarchical",
                      costs=COSTS, chunks=chunks)
    _assert_well_formed(plan, _per_node(per_node))
    intra, inter = plan.bytes_between(_same_node(per_node))
    # Inter-node: a ring all-reduce over the nodes of each of the per_node shards.
    assert inter == 2 * (num_nodes - 1) * size
    # Intra-node: a ring reduce-scatter and a ring all-gather of the whole buffer on every node.
    assert intra == 2 * num_nodes * (per_node - 1) * size
    assert _total(plan) == 2 * (n - 1) * size


def test_hierarchical_all_reduce_orders_its_phases_per_rank():
    per_node, num_nodes = 4, 2
    plan = all_reduce(tuple(range(8)), 8 * 1024, _per_node(per_node), algorithm="hierarchical")
    same = _same_node(per_node)
    ts = plan.transfers
    inter = [t for t in ts if not same(t.src, t.dst)]
    first_inter = min(t.index for t in inter)
    last_inter = max(t.index for t in inter)
    for x in range(8):
        rs_into_x = [t.index for t in ts[:first_inter] if t.dst == x]
        first_inter_of_x = min((t for t in inter if t.src == x), key=lambda t: t.index)
        # x's first inter-node send waits (transitively) for every reduce-scatter delivery to x.
        assert set(rs_into_x) <= _ancestors(plan, first_inter_of_x.index)
        inter_into_x = {t.index for t in inter if t.dst == x}
        first_ag_of_x = min(t.index for t in ts[last_inter + 1:] if t.src == x)
        assert inter_into_x <= _ancestors(plan, first_ag_of_x)
    assert len(inter) == per_node * 2 * (num_nodes - 1) * num_nodes


def _ancestors(plan, index):
    seen, stack = set(), list(plan.transfers[index].deps)
    while stack:
        d = stack.pop()
        if d not in seen:
            seen.add(d)
            stack.extend(plan.transfers[d].deps)
    return seen


def test_hierarchical_all_reduce_completes_as_its_three_rings():
    num_nodes, per_node, bytes_per_s = 3, 4, 50e9
    size = num_nodes * per_node * 4096
    plan = all_reduce(tuple(range(12)), size, _per_node(per_node), algorithm="hierarchical",
                      costs=COSTS)
    intra_step = COSTS.intra_node_latency_s + size / per_node / bytes_per_s
    inter_step = COSTS.inter_node_latency_s + size / per_node / num_nodes / bytes_per_s
    expected = 2 * (per_node - 1) * intra_step + 2 * (num_nodes - 1) * inter_step
    assert _completion_s(plan, bytes_per_s) == pytest.approx(expected)


@settings(max_examples=60)
@given(num_nodes=st.integers(1, 5), per_node=st.integers(1, 8), size=st.integers(1, 10**8))
def test_hierarchical_reduce_scatter_and_all_gather_cross_nodes_once(num_nodes, per_node, size):
    n = num_nodes * per_node
    if n < 2:
        return
    for lower in (reduce_scatter, all_gather):
        plan = lower(tuple(range(n)), size, _per_node(per_node), algorithm="hierarchical",
                     costs=COSTS)
        _assert_well_formed(plan, _per_node(per_node))
        intra, inter = plan.bytes_between(_same_node(per_node))
        assert inter == (num_nodes - 1) * size
        assert intra == num_nodes * (per_node - 1) * size
        assert _total(plan) == (n - 1) * size


def test_hierarchical_reduce_scatter_runs_intra_then_inter_and_all_gather_the_reverse():
    same = _same_node(4)
    rs = reduce_scatter(tuple(range(8)), 8000, _per_node(4), algorithm="hierarchical")
    ag = all_gather(tuple(range(8)), 8000, _per_node(4), algorithm="hierarchical")
    assert [same(t.src, t.dst) for t in rs.transfers] == sorted(
        (same(t.src, t.dst) for t in rs.transfers), reverse=True)
    assert [same(t.src, t.dst) for t in ag.transfers] == sorted(
        same(t.src, t.dst) for t in ag.transfers)
    rs_sent = rs.sent_bytes_by_rank()
    assert sum(rs_sent.values()) == 7 * 8000


def test_hierarchical_rejects_unequal_nodes():
    node_of = {0: 0, 1: 0, 2: 0, 3: 1}.__getitem__
    for lower in (all_reduce, reduce_scatter, all_gather):
        with pytest.raises(ValueError, match="same number of ranks on every node"):
            lower((0, 1, 2, 3), 1 << 20, node_of, algorithm="hierarchical")


# --- all-to-all ---------------------------------------------------------------------------------

_matrices = st.integers(2, 10).flatmap(
    lambda n: st.lists(st.lists(st.integers(0, 10**6), min_size=n, max_size=n),
                       min_size=n, max_size=n))


@given(_matrices, st.integers(1, 4))
def test_direct_all_to_all_sends_each_nonzero_pair_once(matrix, per_node):
    n = len(matrix)
    plan = all_to_all(tuple(range(n)), matrix, _per_node(per_node), algorithm="direct",
                      costs=COSTS)
    _assert_well_formed(plan, _per_node(per_node))
    off_diagonal = sum(matrix[i][j] for i in range(n) for j in range(n) if i != j)
    assert plan.size_bytes == _total(plan) == off_diagonal
    assert all(t.deps == () for t in plan.transfers)
    assert {(t.src, t.dst): t.size_bytes for t in plan.transfers} == {
        (i, j): matrix[i][j] for i in range(n) for j in range(n) if i != j and matrix[i][j]}


@given(_matrices, st.integers(1, 4))
def test_hierarchical_all_to_all_aggregates_per_node_and_forwards_over_nvlink(matrix, per_node):
    n = len(matrix)
    node_of = _per_node(per_node)
    plan = all_to_all(tuple(range(n)), matrix, node_of, algorithm="hierarchical", costs=COSTS)
    _assert_well_formed(plan, node_of)
    intra, inter = plan.bytes_between(_same_node(per_node))
    cross = sum(matrix[i][j] for i in range(n) for j in range(n) if node_of(i) != node_of(j))
    assert inter == cross
    inter_transfers = [t for t in plan.transfers if node_of(t.src) != node_of(t.dst)]
    num_nodes = len({node_of(r) for r in range(n)})
    assert len(inter_transfers) <= num_nodes * (num_nodes - 1) * per_node
    assert len({(t.src, node_of(t.dst)) for t in inter_transfers}) == len(inter_transfers)
    # Every byte reaches its destination: what each GPU receives, less what it forwards, is its
    # column of the matrix.
    received = [0] * n
    for t in plan.transfers:
        received[t.dst] += t.size_bytes
        if t.deps:
            received[t.src] -= t.size_bytes
    assert received == [sum(matrix[i][j] for i in range(n) if i != j) for j in range(n)]
    for t in plan.transfers:
        if t.deps:
            (hop,) = t.deps
            relay_in = plan.transfers[hop]
            assert relay_in.dst == t.src and node_of(relay_in.src) != node_of(t.src)
            assert node_of(t.dst) == node_of(t.src)


def test_hierarchical_all_to_all_uses_the_same_position_on_the_other_node():
    n = 8
    matrix = [[1 if i != j else 0 for j in range(n)] for i in range(n)]
    plan = all_to_all(tuple(range(n)), matrix, _per_node(4), algorithm="hierarchical")
    relays = {(t.src, t.dst) for t in plan.transfers if t.src // 4 != t.dst // 4}
    assert relays == {(i, (i + 4) % 8) for i in range(8)}
    for t in plan.transfers:
        if (t.src, t.dst) in relays:
            assert t.size_bytes == 4


def test_hierarchical_all_to_all_wraps_positions_on_smaller_nodes():
    node_of = {0: 0, 1: 0, 2: 0, 3: 1}.__getitem__
    matrix = [[0, 0, 0, 5]] * 3 + [[1, 2, 3, 0]]
    plan = all_to_all((0, 1, 2, 3), matrix, node_of, algorithm="hierarchical")
    hops = [(t.src, t.dst, t.size_bytes) for t in plan.transfers if not t.deps]
    assert sorted(hops) == [(0, 3, 5), (1, 3, 5), (2, 3, 5), (3, 0, 6)]
    forwards = sorted((t.src, t.dst, t.size_bytes) for t in plan.transfers if t.deps)
    assert forwards == [(0, 1, 2), (0, 2, 3)]


def test_all_to_all_skips_zero_parts_and_rejects_bad_matrices():
    plan = all_to_all((0, 1), [[9, 0], [0, 9]], _per_node(1))
    assert plan.transfers == () and plan.size_bytes == 0
    with pytest.raises(ValueError, match="2 x 2"):
        all_to_all((0, 1), [[0, 1]], _per_node(1))
    with pytest.raises(ValueError, match=">= 0"):
        all_to_all((0, 1), [[0, -1], [0, 0]], _per_node(1))


# --- send/recv, single GPU, single node ---------------------------------------------------------

def test_send_recv_is_one_transfer_with_the_pair_latency():
    plan = send_recv(3, 9, 1234, _per_node(8), costs=COSTS)
    (t,) = plan.transfers
    assert (plan.kind, plan.algorithm, plan.ranks) == ("send_recv", "direct", (3, 9))
    assert (t.src, t.dst, t.size_bytes, t.deps) == (3, 9, 1234, ())
    assert t.latency_s == COSTS.inter_node_latency_s
    assert send_recv(3, 4, 1, _per_node(8), costs=COSTS).transfers[0].latency_s == 2e-6
    assert send_recv(5, 5, 10, _per_node(8)).transfers == ()


@pytest.mark.parametrize("lower", [all_reduce, reduce_scatter, all_gather])
def test_one_rank_or_zero_bytes_moves_nothing(lower):
    plan = lower((7,), 1 << 20, _per_node(8))
    assert plan.transfers == () and plan.algorithm == "local" and plan.size_bytes == 1 << 20
    assert lower((0, 1, 2), 0, _per_node(8)).transfers == ()
    assert all_to_all((7,), [[5]], _per_node(8)).transfers == ()


@pytest.mark.parametrize("lower", [all_reduce, reduce_scatter, all_gather])
def test_a_single_node_group_has_no_inter_node_bytes(lower):
    plan = lower(tuple(range(8)), 10**9 + 7, _per_node(8))
    assert plan.algorithm == "ring"
    intra, inter = plan.bytes_between(_same_node(8))
    assert inter == 0 and intra > 0
    a2a = all_to_all(tuple(range(8)), [[3] * 8] * 8, _per_node(8))
    assert a2a.algorithm == "direct" and a2a.bytes_between(_same_node(8))[1] == 0


# --- algorithm choice and errors ----------------------------------------------------------------

@pytest.mark.parametrize("kind, ranks, size, per_node, expected", [
    ("all_reduce", range(8), 1 << 30, 8, "ring"),
    ("all_reduce", range(8), 1024, 8, "ring"),
    ("all_reduce", range(16), 256 * 1024, 8, "tree"),
    ("all_reduce", range(16), 256 * 1024 + 1, 8, "hierarchical"),
    ("all_reduce", (0, 8, 16), 1 << 30, 8, "ring"),
    ("all_reduce", (0, 8, 16), 1024, 8, "tree"),
    ("reduce_scatter", range(16), 1024, 8, "hierarchical"),
    ("reduce_scatter", (0, 8), 1 << 30, 8, "ring"),
    ("all_gather", range(4), 1 << 30, 8, "ring"),
    ("all_gather", range(16), 1 << 30, 8, "hierarchical"),
    ("all_to_all", range(8), 1 << 30, 8, "direct"),
    ("all_to_all", range(16), 1024, 8, "hierarchical"),
    ("all_to_all", (0, 8), 1024, 8, "direct"),
    ("send_recv", (0, 8), 1024, 8, "direct"),
    ("all_reduce", (5,), 1024, 8, "local"),
])
def test_choose_algorithm(kind, ranks, size, per_node, expected):
    assert choose_algorithm(kind, tuple(ranks), size, _per_node(per_node)) == expected


def test_choose_algorithm_honours_the_tree_threshold():
    assert choose_algorithm("all_reduce", range(16), 10**6, _per_node(8),
                            tree_threshold_bytes=10**6) == "tree"


def test_auto_plans_use_the_chosen_algorithm():
    assert all_reduce(range(16), 1 << 30, _per_node(8)).algorithm == "hierarchical"
    assert all_reduce(range(16), 1024, _per_node(8)).algorithm == "tree"
    assert all_gather(range(16), 1 << 30, _per_node(8)).algorithm == "hierarchical"
    assert all_to_all(range(16), [[1] * 16] * 16, _per_node(8)).algorithm == "hierarchical"


def test_unknown_algorithms_and_kinds_are_named():
    with pytest.raises(ValueError, match=r"'tree'.*auto, ring, hierarchical"):
        all_gather(range(4), 100, _per_node(8), algorithm="tree")
    with pytest.raises(ValueError, match=r"'ring'.*auto, direct, hierarchical"):
        all_to_all(range(2), [[0, 1], [1, 0]], _per_node(8), algorithm="ring")
    with pytest.raises(ValueError, match="'broadcast'"):
        choose_algorithm("broadcast", range(2), 100, _per_node(8))
    assert set(ALGORITHMS) == {"all_reduce", "reduce_scatter", "all_gather", "all_to_all",
                               "send_recv"}


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="distinct"):
        all_reduce((0, 1, 1), 100, _per_node(8))
    with pytest.raises(ValueError, match="at least one rank"):
        all_reduce((), 100, _per_node(8))
    with pytest.raises(ValueError, match="size_bytes must be >= 0"):
        reduce_scatter((0, 1), -1, _per_node(8))
    with pytest.raises(ValueError, match="chunks must be >= 1"):
        all_reduce((0, 1), 100, _per_node(8), chunks=0)
    with pytest.raises(TypeError):
        all_reduce((0, 1), 100.0, _per_node(8))


def test_identical_requests_share_one_immutable_plan():
    a = all_reduce([0, 1, 2, 3], 4096, _per_node(8))
    b = all_reduce((0, 1, 2, 3), 4096, _per_node(8))
    assert a is b
    with pytest.raises(AttributeError):
        a.transfers[0].size_bytes = 1
