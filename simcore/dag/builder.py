"""From a scheduler's step plan, the model and the placement to the step's DAG: per layer group the
compute ops, TP collectives, EP dispatch and combine with sampled per-peer bytes, PP activation
transfers between stages with micro-batches, and the waits that join them.

Durations of compute ops are the roofline's per-op times (`RooflineModel.op_bounds(by_op=...)`)
shared out over the layers that run them, so with every collective inside one node and one
micro-batch the DAG's critical path is the roofline's step time exactly. Collectives whose ranks
share a node are timed by the roofline's ring formulas (one node per lane); collectives across
nodes are lowered to transfers (`simcore.dag.collectives`) that cross the fabric.

Layer groups: `layer_groups` consecutive layers are fused into one DAG layer (their compute
summed, their collectives one message carrying every layer's bytes and paying every layer's
latency); bytes are exact, the interleaving of traffic is that coarse. Expert routing is sampled
once per layer group and step: expert loads from a multinomial over the experts' popularity for
all of the group's token-expert assignments; all-to-all traffic as DeepEP sends it, each token
once to every GPU (inside a node) or node (across nodes) holding any of its top-k experts, with
binomial counts from those probabilities. So per-GPU expert loads and all-to-all bytes vary step
to step as routing does (loads and traffic are drawn apart, each with its right distribution).
"""

from __future__ import annotations

import numpy as np

from simcore.cluster.config import DagConfig
from simcore.cluster.placement import Instance, Placement
from simcore.compute.base import StepShape
from simcore.compute.expert_parallel import ExpertParallelRoofline
from simcore.compute.roofline import RooflineModel
from simcore.dag import collectives as coll
from simcore.dag.graph import COMM_STREAM, COMPUTE_STREAM, LOCAL, Lane, StepDag
from simcore.model.arch import ModelArch

Scheduled = list[tuple[object, int, int]]


def stage_layers(num_layers: int, pp: int) -> list[range]:
    """vLLM's split of the layers over pipeline stages (`get_pp_indices`): equal shares, the
    remainder going to the stages before the last, from the second-to-last backwards."""
    parts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        parts[-i] += 1
    out, start = [], 0
    for n in parts:
        out.append(range(start, start + n))
        start += n
    return out


def split_batch(scheduled: Scheduled, parts: int) -> list[Scheduled]:
    """Cut a batch into at most `parts` consecutive micro-batches of about equal tokens."""
    if parts <= 1 or len(scheduled) <= 1:
        return [scheduled]
    total = sum(n for _, n, _ in scheduled)
    out: list[Scheduled] = [[]]
    acc = 0
    for item in scheduled:
        if out[-1] and acc >= total * len(out) / parts and len(out) < parts:
            out.append([])
        out[-1].append(item)
        acc += item[1]
    return out


class StepDagBuilder:
    """Builds one StepDag per step for the engines of a placement; immutable settings, a seeded
    generator for expert routing (so a run is reproducible)."""

    def __init__(self, *, arch: ModelArch, model: RooflineModel, placement: Placement,
                 cfg: DagConfig, interconnect_bytes_per_s: float, costs: coll.LinkCosts,
                 rng: np.random.Generator, ep_model: ExpertParallelRoofline | None = None,
                 activation_bytes: float = 2.0) -> None:
        self.arch, self.model, self.placement, self.cfg = arch, model, placement, cfg
        self.ic = interconnect_bytes_per_s
        self.costs = costs
        self.rng = rng
        self.ep_model = ep_model
        self.ab = activation_bytes
        self.tp, self.pp = placement.tp, placement.pp
        self.stages = stage_layers(arch.num_layers, self.pp)
        g = cfg.layer_groups
        self.groups = []                  # per stage: (layers, dense layers, MoE layers) per group
        for rng_layers in self.stages:
            n = len(rng_layers)
            k = min(g, n)
            bounds = [rng_layers.start + n * j // k for j in range(k + 1)]
            self.groups.append([(b - a, (b - a) - arch.num_moe_layers(a, b - a),
                                 arch.num_moe_layers(a, b - a))
                                for a, b in zip(bounds, bounds[1:])])
        self.num_moe = arch.num_moe_layers()
        self.num_dense = arch.num_layers - self.num_moe
        self.alpha = model.assumptions.collective_hop_latency_s
        self._one_node: dict[tuple[int, ...], bool] = {}   # GPU group -> inside one node
        if ep_model is not None:
            self._popularity = self._expert_popularity()
            self._reach: dict[tuple[int, ...], tuple] = {}

    # -- collectives --------------------------------------------------------------------------

    def _local_s(self, kind: str, n: int, size: float, count: int) -> float:
        """The roofline's ring formula for a collective of n ranks inside one node."""
        if n <= 1 or count == 0:
            return 0.0
        if kind == "all_reduce":
            return count * (2 * (n - 1) / n * size / self.ic + 2 * (n - 1) * self.alpha)
        return count * ((n - 1) / n * size / self.ic + (n - 1) * self.alpha)

    def _collective(self, dag: StepDag, lane: int, kind: str, size: float, count: int,
                    deps: tuple[int, ...], stream: int) -> tuple[int, ...]:
        """A TP collective of one lane; returns the node(s) consumers depend on."""
        gpus = dag.lanes[lane].gpus
        n = len(gpus)
        if n <= 1 or count == 0:
            return deps
        node_of = self.placement.node_of
        one_node = self._one_node.get(gpus)
        if one_node is None:
            one_node = self._one_node[gpus] = len({node_of(g) for g in gpus}) == 1
        if one_node:
            return (dag.local(lane, kind, self._local_s(kind, n, size, count), deps, stream),)
        total = int(round(size * count))
        c = self.cfg.collectives
        costs = coll.LinkCosts(self.costs.intra_node_latency_s * count,
                               self.costs.inter_node_latency_s * count)
        if kind == "all_reduce":
            plan = coll.all_reduce(gpus, total, node_of, algorithm=c.all_reduce, costs=costs,
                                   chunks=c.chunks)
        else:
            plan = coll.all_gather(gpus, total, node_of, algorithm=c.all_gather, costs=costs)
        ids = self._lower(dag, lane, kind, plan, {g: deps for g in gpus}, {g: lane for g in gpus})
        return (dag.barrier(lane, kind, tuple(ids), stream),)

    def _lower(self, dag: StepDag, lane: int, op: str, plan: coll.CollectivePlan,
               ready: dict[int, tuple[int, ...]], lane_of_gpu: dict[int, int]) -> list[int]:
        """Append a plan's transfers; a first transfer waits for its sender's `ready` nodes."""
        ids: list[int] = []
        fabric = any(self.placement.node_of(t.src) != self.placement.node_of(t.dst)
                     for t in plan.transfers)
        for t in plan.transfers:
            deps = tuple(ids[d] for d in t.deps) if t.deps else ready[t.src]
            ids.append(dag.transfer(lane_of_gpu.get(t.src, lane), op, t.src, t.dst,
                                    t.size_bytes, t.latency_s, deps, fabric))
        return ids

    # -- one step ----------------------------------------------------------------------------

    def build(self, batches: list[tuple[Instance, Scheduled | None]]
              ) -> tuple[StepDag, bool, list[StepShape | None]]:
        """The DAG of one step in which each listed instance runs its batch (None: a dummy batch
        of an expert-parallel group); returns it, whether the step runs as full CUDA graphs
        (every batch decode-only within the graph size), and each batch's shape (None for a
        dummy batch)."""
        lanes: list[Lane] = []
        lane_ids: list[list[int]] = []
        for inst, _ in batches:
            ids = []
            for s, gpus in enumerate(inst.gpus):
                ids.append(len(lanes))
                lanes.append(Lane(f"engine {inst.index} / stage {s}", gpus, inst.index, s))
            lane_ids.append(ids)
        dag = StepDag(lanes)
        cfg = self.cfg
        inner = 2 if cfg.overlap == "two_batch" else 1
        # Expert-parallel groups run each rank's batch whole through the stages (the ranks'
        # all-to-alls pair up micro-batch by micro-batch, which PP micro-batches would break).
        outer = cfg.pp_microbatches if self.pp > 1 and self.ep_model is None else 1
        comm_stream = COMPUTE_STREAM if cfg.overlap == "none" else COMM_STREAM
        full_graph = True
        limit = self.model.cuda_graph_max_num_tokens
        plans = []                  # per batch, per micro-batch, the shapes of its sub-batches
        wholes: list[StepShape | None] = []
        dummy = StepShape.dummy()
        for inst, sched in batches:
            whole = StepShape.from_scheduled(sched) if sched else None
            wholes.append(whole)
            mbs = []
            for part in split_batch(sched or [], outer):
                subs = split_batch(part, inner)
                # An unsplit batch is its own shape; an empty sub-batch is a dummy one (every
                # rank of an expert-parallel group joins every all-to-all).
                shapes = [whole if sub is sched else StepShape.from_scheduled(sub) if sub
                          else dummy for sub in subs]
                if self.ep_model is not None:
                    shapes += [dummy] * (inner - len(shapes))
                mbs.append(shapes)
            plans.append(mbs)
            if whole is not None and (whole.num_decode_seqs != whole.num_tokens
                                      or whole.num_tokens > limit):
                full_graph = False
        if self.ep_model is not None:
            self._build_ep(dag, batches, plans, lane_ids, comm_stream)
        else:
            for (inst, _), mbs, ids in zip(batches, plans, lane_ids):
                self._build_engine(dag, mbs, ids, comm_stream)
        return dag, full_graph, wholes

    def _ops(self, shape: StepShape,
             routed_experts: bool) -> tuple[StepShape, dict[str, float]]:
        by_op: dict[str, float] = {}
        self.model.op_bounds(shape, routed_experts=routed_experts, by_op=by_op)
        return shape, by_op

    def _layer_s(self, by_op: dict[str, float], n: int, nd: int, nm: int,
                 routed: bool) -> tuple[float, float]:
        """(attention-side, MLP-side) seconds of a group of n layers (nd dense, nm MoE)."""
        L = self.arch.num_layers
        attn = (by_op.get("attention", 0.0) + by_op.get("elementwise", 0.0)) * n / L
        mlp = by_op.get("mlp", 0.0) * nd / self.num_dense if nd else 0.0
        if nm:
            mlp += by_op.get("moe", 0.0) * nm / self.num_moe
        return attn, mlp

    def _build_engine(self, dag: StepDag, mbs: list[list[StepShape]], lanes: list[int],
                      comm_stream: int) -> None:
        """One engine (no expert parallelism): stages in order, micro-batches through them."""
        h, ab = self.arch.hidden_size, self.ab
        prev_stage_out: list[list[tuple[int, ...]]] = []   # per outer mb, per sub: ready nodes
        for s, lane in enumerate(lanes):
            stage_out = []
            for m, subs in enumerate(mbs):
                ops = [self._ops(shape, True) for shape in subs]
                ready = [prev_stage_out[m][k] if s else () for k in range(len(subs))]
                if s:
                    ready = [self._pp_hop(dag, lanes[s - 1], lane, ops[k][0].num_tokens,
                                          ready[k], comm_stream) for k in range(len(subs))]
                if s == 0 and self.tp > 1:      # the vocabulary-parallel embedding's all-reduce
                    ready = [self._collective(dag, lane, "all_reduce", ops[k][0].num_tokens * h
                                              * ab, 1, ready[k], comm_stream)
                             for k in range(len(subs))]
                for n, nd, nm in self.groups[s]:
                    for phase in (0, 1):
                        for k, (shape, by_op) in enumerate(ops):
                            attn, mlp = self._layer_s(by_op, n, nd, nm, True)
                            node = dag.compute(lane, "attention" if phase == 0 else "mlp",
                                               attn if phase == 0 else mlp, ready[k])
                            ready[k] = (node,)
                        if self.tp > 1:
                            for k, (shape, _) in enumerate(ops):
                                ready[k] = self._collective(dag, lane, "all_reduce",
                                                            shape.num_tokens * h * ab, n,
                                                            ready[k], comm_stream)
                if s == self.pp - 1:
                    for k, (shape, by_op) in enumerate(ops):
                        node = dag.compute(lane, "lm_head", by_op.get("lm_head", 0.0), ready[k])
                        ready[k] = (node,)
                        if self.tp > 1 and shape.num_seqs:
                            ready[k] = self._collective(dag, lane, "all_gather", shape.num_seqs
                                                        * self.arch.vocab_size * ab, 1,
                                                        ready[k], comm_stream)
                stage_out.append(ready)
            prev_stage_out = stage_out

    def _pp_hop(self, dag: StepDag, src_lane: int, dst_lane: int, num_tokens: int,
                deps: tuple[int, ...], comm_stream: int) -> tuple[int, ...]:
        """Hidden states and residual from one stage to the next: by formula inside a node,
        else each TP rank sends its 1/tp slice to its peer and the receivers all-gather."""
        size = 2 * self.arch.hidden_size * self.ab * num_tokens
        src = dag.lanes[src_lane].gpus
        dst = dag.lanes[dst_lane].gpus
        node_of = self.placement.node_of
        if node_of(src[0]) == node_of(dst[0]):
            dur = size / self.ic + self.alpha
            return (dag.local(dst_lane, "pp_send", dur, deps, comm_stream),)
        total = int(round(size))
        n = len(src)
        ids = []
        for r in range(n):
            part = total // n + (r < total % n)
            ids.append(dag.transfer(src_lane, "pp_send", src[r], dst[r], part,
                                    self.costs.inter_node_latency_s, deps, True))
        wait = (dag.barrier(dst_lane, "pp_send", tuple(ids), comm_stream),)
        if n > 1:
            wait = (dag.local(dst_lane, "all_gather", self._local_s("all_gather", n, size, 1),
                              wait, comm_stream),)
        return wait

    # -- expert parallelism --------------------------------------------------------------------

    def _expert_popularity(self) -> np.ndarray:
        r = self.cfg.moe_routing
        e = self.arch.num_experts
        if r.popularity == "uniform":
            return np.full(e, 1.0 / e)
        w = 1.0 / np.arange(1, e + 1) ** r.zipf_exponent
        w = w[self.rng.permutation(e)]
        return w / w.sum()

    def _build_ep(self, dag: StepDag, batches, plans, lane_ids, comm_stream: int) -> None:
        """An expert-parallel group in lock-step: per stage and layer group, each rank's attention,
        the dispatch all-to-all over every GPU of the stage, each GPU's experts, the combine."""
        ep = self.ep_model
        arch = self.arch
        h, k_top = arch.hidden_size, arch.num_experts_per_tok
        ranks = len(batches)
        num_sub = len(plans[0][0])
        epg = ep.experts_per_gpu
        for s in range(self.pp):
            lanes = [ids[s] for ids in lane_ids]
            gpus = [g for ln in lanes for g in dag.lanes[ln].gpus]
            lane_of = {g: ln for ln in lanes for g in dag.lanes[ln].gpus}
            gidx = {g: i for i, g in enumerate(gpus)}
            ep_size = len(gpus)
            ops = [[self._ops(shape, False) for shape in plans[r][0]] for r in range(ranks)]
            ready = [[() for _ in range(num_sub)] for _ in range(ranks)]
            if s:
                for r in range(ranks):
                    for k in range(num_sub):
                        ready[r][k] = self._pp_hop(dag, lane_ids[r][s - 1], lanes[r],
                                                   ops[r][k][0].num_tokens, ready[r][k],
                                                   comm_stream)
            for n, nd, nm in self.groups[s]:
                for r in range(ranks):           # attention (and any dense MLP)
                    for k in range(num_sub):
                        attn, mlp = self._layer_s(ops[r][k][1], n, nd, nm, False)
                        node = dag.compute(lanes[r], "attention", attn + mlp, ready[r][k])
                        ready[r][k] = (node,)
                        if self.tp > 1 and nm == 0:
                            ready[r][k] = self._collective(
                                dag, lanes[r], "all_reduce", ops[r][k][0].num_tokens * h
                                * self.ab, 2 * n, ready[r][k], comm_stream)
                if nm == 0:
                    continue
                for k in range(num_sub):
                    # Routing. Expert loads: the group's token-expert assignments (a multinomial
                    # over the experts' popularity). Traffic: a token goes once to each GPU
                    # holding any of its experts (DeepEP deduplicates per rank), and across
                    # nodes once to each node holding any (per node, then NVLink inside it).
                    trials = sum(nm * ops[r][k][0].num_tokens * k_top for r in range(ranks))
                    per_expert = self.rng.multinomial(trials, self._popularity)
                    starts = np.arange(0, arch.num_experts, epg)
                    loads = [0] * ep_size
                    loads[:len(starts)] = np.add.reduceat(per_expert, starts).tolist()
                    active_per_gpu = [0] * ep_size
                    active_per_gpu[:len(starts)] = np.add.reduceat(
                        (per_expert > 0).astype(np.int64), starts).tolist()
                    held = np.zeros(ep_size, dtype=np.int64)     # layer-tokens on each GPU
                    for r in range(ranks):
                        src = [gidx[g] for g in dag.lanes[lanes[r]].gpus]
                        t = nm * ops[r][k][0].num_tokens
                        for j, gi in enumerate(src):     # each TP rank holds 1/tp of the tokens
                            held[gi] += t * (j + 1) // len(src) - t * j // len(src)
                    sent = {ln: ready[r][k] for r, ln in enumerate(lanes)}
                    arrived, back_of = self._all_to_all(dag, gpus, held, sent, lanes, lane_of,
                                                        comm_stream, nm)
                    expert_nodes = {}
                    for r, ln in enumerate(lanes):
                        dur = max(self._expert_s(loads[gidx[g]], active_per_gpu[gidx[g]], nm)
                                  for g in dag.lanes[ln].gpus)
                        expert_nodes[ln] = dag.compute(ln, "experts", dur, arrived[ln])
                    back = back_of({ln: (expert_nodes[ln],) for ln in lanes})
                    for r, ln in enumerate(lanes):
                        ready[r][k] = back[ln]
                        if self.tp > 1:          # sequence-parallel MoE: gather the tokens
                            ready[r][k] = self._collective(
                                dag, ln, "all_gather", ops[r][k][0].num_tokens * h * self.ab,
                                nm, ready[r][k], comm_stream)
            if s == self.pp - 1:
                for r, ln in enumerate(lanes):
                    for k in range(num_sub):
                        shape, by_op = ops[r][k]
                        ready[r][k] = (dag.compute(ln, "lm_head", by_op.get("lm_head", 0.0),
                                                   ready[r][k]),)

    def _gpu_reach(self, gpus: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(node of each GPU, P(a token needs GPU j), P(a token needs node n)) for a stage's
        EP group: a token's top-k experts drawn from the popularity, GPU j holding experts
        j x experts_per_gpu onward."""
        key = tuple(gpus)
        hit = self._reach.get(key)
        if hit is None:
            ep = len(gpus)
            epg = self.ep_model.experts_per_gpu
            k = self.arch.num_experts_per_tok
            mass = np.zeros(ep)
            m = np.add.reduceat(self._popularity, np.arange(0, self.arch.num_experts, epg))
            mass[:len(m)] = m
            nodes = np.array([self.placement.node_of(g) for g in gpus])
            node_ids = sorted(set(nodes.tolist()))
            node_mass = np.array([mass[nodes == n].sum() for n in node_ids])
            hit = self._reach[key] = (nodes, 1.0 - (1.0 - mass) ** k,
                                      1.0 - (1.0 - node_mass) ** k)
        return hit

    def _all_to_all(self, dag: StepDag, gpus: list[int], held: np.ndarray,
                    ready: dict[int, tuple[int, ...]], lanes: list[int],
                    lane_of: dict[int, int], stream: int, count: int):
        """The dispatch of one MoE layer group (`held[i]`: layer-tokens on gpus[i]); returns,
        per lane, what its experts wait for, and a function that, given each lane's expert
        node, builds the combine and returns what each lane's next op waits for.

        Sampled per step: tokens from GPU i to GPU j ~ Binomial(held_i, P(token needs j)), and
        to node n ~ Binomial(held_i, P(token needs n)). "direct" across nodes: one transfer per
        GPU pair each way. Otherwise (auto, hierarchical, or a single node) DeepEP-style: one
        fabric message per other node, to the GPU of the sender's local position there (the
        relay), and NVLink traffic (same-node pairs, relays forwarding to their final GPUs) as
        one timed phase per node, its busiest GPU's bytes (expected) over the per-GPU NVLink
        bandwidth; the combine mirrors it (NVLink reduce inside the node first, then one
        message per node back). Combine carries the same tokens at its own bytes per element.
        """
        rc = self.cfg.moe_routing
        h = self.arch.hidden_size
        d_b, c_b = h * rc.dispatch_bytes_per_element, h * rc.combine_bytes_per_element
        nodes, q_gpu, q_node = self._gpu_reach(gpus)
        node_ids = sorted(set(nodes.tolist()))
        multi = len(node_ids) > 1
        rng = self.rng
        if multi and self.cfg.collectives.all_to_all == "direct":
            tokens = rng.binomial(held[:, None], q_gpu[None, :])
            np.fill_diagonal(tokens, 0)
            disp = (tokens * d_b).astype(np.int64)
            arrived = self._pairwise(dag, gpus, disp, ready, lanes, lane_of, "dispatch",
                                     stream, count)

            def combine_direct(expert_ready):
                comb = (tokens.T * c_b).astype(np.int64)
                return self._pairwise(dag, gpus, comb, expert_ready, lanes, lane_of, "combine",
                                      stream, count)
            return arrived, combine_direct
        ep = len(gpus)
        col = {n: c for c, n in enumerate(node_ids)}
        ncol = np.array([col[n] for n in nodes.tolist()])
        members = {n: np.flatnonzero(nodes == n) for n in node_ids}
        position = np.empty(ep, dtype=np.int64)
        for js in members.values():
            position[js] = np.arange(len(js))
        # Same-node tokens over NVLink, expected: sum over the node's other GPUs of held x P.
        same = nodes[:, None] == nodes[None, :]
        reach = np.where(same, q_gpu[None, :], 0.0)
        np.fill_diagonal(reach, 0.0)
        nvlink_tokens = held * reach.sum(axis=1)
        inter = rng.binomial(held[:, None], q_node[None, :]) if multi else None
        transfers = []                           # (src index, relay index, tokens)
        if multi:
            inter[np.arange(ep), ncol] = 0
            for n, js in members.items():
                c = col[n]
                relay = js[position % len(js)]
                src = np.flatnonzero(inter[:, c] > 0)
                # A relay forwards to its node's other GPUs the tokens that need them.
                forward = q_gpu[js].sum() / q_node[c]
                for i in src.tolist():
                    r = int(relay[i])
                    t = int(inter[i, c])
                    transfers.append((i, r, t))
                    nvlink_tokens[r] += t * (forward - q_gpu[r] / q_node[c])
            transfers.sort()
        a_intra = self.costs.intra_node_latency_s * count
        a_inter = self.costs.inter_node_latency_s * count
        phase_stream = -1 if stream == COMPUTE_STREAM else COMM_STREAM
        node_lanes = {n: list(dict.fromkeys(lane_of[gpus[j]] for j in js))
                      for n, js in members.items()}

        def phase(n: int, deps: tuple[int, ...], op: str, per_token: float) -> int:
            b = float(nvlink_tokens[members[n]].max()) * per_token
            dur = b / self.ic + a_intra if b > 0 else 0.0
            return dag._add(LOCAL, node_lanes[n][0], phase_stream, dur, deps, op, fabric=multi)

        into: dict[int, list[int]] = {n: [] for n in node_ids}
        for i, r, t in transfers:
            src_lane = lane_of[gpus[i]]
            tid = dag.transfer(src_lane, "dispatch", gpus[i], gpus[r], int(t * d_b), a_inter,
                               ready[src_lane], True)
            into[int(nodes[r])].append(tid)
        arrived = {}
        for n in node_ids:
            deps = tuple(d for ln in node_lanes[n] for d in ready[ln]) + tuple(into[n])
            p = phase(n, deps, "dispatch", d_b)
            for ln in node_lanes[n]:
                arrived[ln] = (p,)

        def combine(expert_ready: dict[int, tuple[int, ...]]) -> dict[int, tuple[int, ...]]:
            # Reduce inside each node over NVLink, then one message per token and node back.
            phases = {n: phase(n, tuple(d for ln in node_lanes[n] for d in expert_ready[ln]),
                               "combine", c_b) for n in node_ids}
            back: dict[int, list[int]] = {ln: [] for ln in lanes}
            for i, r, t in transfers:
                tid = dag.transfer(lane_of[gpus[r]], "combine", gpus[r], gpus[i], int(t * c_b),
                                   a_inter, (phases[int(nodes[r])],), True)
                back[lane_of[gpus[i]]].append(tid)
            return {ln: tuple(back[ln]) + (phases[n],) for n in node_ids
                    for ln in node_lanes[n]}
        return arrived, combine

    def _pairwise(self, dag: StepDag, gpus: list[int], matrix: np.ndarray,
                  ready: dict[int, tuple[int, ...]], lanes: list[int], lane_of: dict[int, int],
                  op: str, stream: int, count: int) -> dict[int, tuple[int, ...]]:
        """One transfer per GPU pair with bytes (`collectives.all_to_all`, direct)."""
        costs = coll.LinkCosts(self.costs.intra_node_latency_s * count,
                               self.costs.inter_node_latency_s * count)
        plan = coll.all_to_all(tuple(gpus), matrix.tolist(), self.placement.node_of,
                               algorithm="direct", costs=costs)
        ids = self._lower(dag, lanes[0], op, plan, {g: ready[lane_of[g]] for g in gpus},
                          lane_of)
        return self._arrivals(dag, plan, ids, lanes, lane_of, op, stream)

    def _arrivals(self, dag: StepDag, plan: coll.CollectivePlan, ids: list[int],
                  lanes: list[int], lane_of: dict[int, int], op: str,
                  stream: int) -> dict[int, tuple[int, ...]]:
        """Per lane, a wait node for every transfer it sends or receives in the plan."""
        touching: dict[int, list[int]] = {ln: [] for ln in lanes}
        for t, i in zip(plan.transfers, ids):
            touching[lane_of[t.src]].append(i)
            if lane_of[t.dst] != lane_of[t.src]:
                touching[lane_of[t.dst]].append(i)
        return {ln: (dag.barrier(ln, op, tuple(touching[ln]), stream),) for ln in lanes}

    def _expert_s(self, load: int, active: int, nm: int) -> float:
        """Routed-expert GEMMs of one GPU over nm MoE layers: `load` token-expert assignments,
        `active` distinct experts hit (weights read once per layer)."""
        ep = self.ep_model
        if load <= 0:
            return 0.0
        share = nm / self.num_moe
        per_layer_load = load / nm
        cpu = per_layer_load * ep._flop_s_per_assignment * share
        mem = (active * ep._byte_s_per_expert + per_layer_load * ep._byte_s_per_assignment) * share
        floor = ep._floor_s * share
        return max(cpu, mem, floor)
