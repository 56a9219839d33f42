"""The expert-parallel part of a step DAG: a lock-step EP group's attention per rank, the
dispatch and combine all-to-alls with routing sampled as DeepEP sends tokens, and each GPU's
experts (see `simcore.dag.builder` for the rest of the step)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simcore.compute.base import StepShape
from simcore.dag import collectives as coll
from simcore.dag.graph import COMM_STREAM, COMPUTE_STREAM, LOCAL, StepDag


@dataclass(frozen=True, slots=True)
class DeepEpLayout:
    """The step-independent part of a DeepEP-style all-to-all over one stage's EP group; GPUs by
    their index in the group."""

    node_col: list[int]                  # column of each GPU's node (nodes in ascending order)
    members: dict[int, list[int]]        # node -> its GPUs
    same_node_reach: np.ndarray          # per GPU: sum over its node's other GPUs of P(need)
    relay: dict[int, list[int]]          # node -> per sending GPU, its relay there
    forward: dict[int, list[float]]      # node -> per relay, tokens forwarded per token received
    node_lanes: dict[int, list[int]]     # node -> the lanes of its GPUs, in order
    node_of_idx: list[int]
    lane_of_idx: list[int]


class ExpertParallelSteps:
    """Methods of `StepDagBuilder` for expert-parallel groups; they use its settings (`arch`,
    `cfg`, `placement`, `costs`, `ic`, `rng`, `ep_model`) and its dense-step helpers (`_ops`,
    `_layer_s`, `_collective`, `_pp_hop`, `_lower`)."""

    def _expert_popularity(self) -> np.ndarray:
        r = self.cfg.moe_routing
        e = self.arch.num_experts
        if r.popularity == "uniform":
            return np.full(e, 1.0 / e)
        w = 1.0 / np.arange(1, e + 1) ** r.zipf_exponent
        w = w[self.rng.permutation(e)]
        return w / w.sum()

    def _build_ep(self, dag: StepDag, batches, plans, lane_ids, comm_stream: int,
                  wholes=None) -> None:
        """An expert-parallel group in lock-step: per stage and layer group, each rank's attention,
        the dispatch all-to-all over every GPU of the stage, each GPU's experts, the combine;
        with a dense speculative drafter, each rank with a batch (its shape in `wholes`) then
        drafts on its own lane."""
        h = self.arch.hidden_size
        ranks = len(batches)
        num_sub = len(plans[0][0])
        for s in range(self.pp):
            lanes = [ids[s] for ids in lane_ids]
            gpus = [g for ln in lanes for g in dag.lanes[ln].gpus]
            lane_of = {g: ln for ln in lanes for g in dag.lanes[ln].gpus}
            gidx = {g: i for i, g in enumerate(gpus)}
            lane_idx = [[gidx[g] for g in dag.lanes[ln].gpus] for ln in lanes]
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
                    done = self._moe_layers(dag, gpus, lanes, lane_of, lane_idx,
                                            [ops[r][k][0].num_tokens for r in range(ranks)], nm,
                                            [ready[r][k] for r in range(ranks)], comm_stream,
                                            "experts")
                    for r in range(ranks):
                        ready[r][k] = done[r]
            if s == self.pp - 1:
                for r, ln in enumerate(lanes):
                    for k in range(num_sub):
                        shape, by_op = ops[r][k]
                        ready[r][k] = (dag.compute(ln, "lm_head", by_op.get("lm_head", 0.0),
                                                   ready[r][k]),)
                    whole = wholes[r] if wholes else None
                    if self.draft is not None and whole is not None and not self._draft_ep:
                        self._draft_forwards(dag, ln, whole,
                                             tuple(n for sub in ready[r] for n in sub),
                                             comm_stream)
                if self._draft_ep and wholes:
                    self._ep_draft_forwards(dag, gpus, lanes, lane_of, lane_idx, wholes,
                                            [tuple(n for sub in ready[r] for n in sub)
                                             for r in range(ranks)], comm_stream)

    def _ep_draft_forwards(self, dag: StepDag, gpus: list[int], lanes: list[int],
                           lane_of: dict[int, int], lane_idx: list[list[int]], wholes,
                           ready: list[tuple[int, ...]], comm_stream: int) -> None:
        """The forwards of a drafter with routed experts (an MTP layer of a MoE model) on the
        last stage's EP group, each a lock-step step of the group as the target's layers are
        built: per rank the vocabulary-parallel embedding's all-reduce and the layer's attention
        side (shared experts and router included), the dispatch all-to-all of the layer's
        routed tokens, each GPU's experts (timed by the drafter's group model), the combine
        (and the sequence-parallel all-gather with TP), the LM head and the logits' all-gather.
        A rank with no batch runs the drafter's dummy forward (`StepShape.dummy()`), as vLLM's
        dummy run does, and joins every all-to-all."""
        draft = self.draft
        rank_model = draft.rank_model
        arch = draft.arch
        h, ab = arch.hidden_size, self.ab
        per_rank = [self._spec.draft_shapes(w) if w is not None else [] for w in wholes]
        if not any(per_rank):
            return
        dummy = StepShape.dummy()
        for j in range(self._spec.k):
            shapes = [f[j] if f else dummy for f in per_rank]
            ops = []
            for r, ln in enumerate(lanes):
                by_op: dict[str, float] = {}
                rank_model.op_bounds(shapes[r], routed_experts=False, by_op=by_op)
                ops.append(by_op)
                size = shapes[r].num_tokens * h * ab
                if self.tp > 1:
                    ready[r] = self._collective(dag, ln, "all_reduce", size, 1, ready[r],
                                                comm_stream)
                side = (by_op.get("attention", 0.0) + by_op.get("elementwise", 0.0)
                        + by_op.get("mlp", 0.0) + by_op.get("moe", 0.0))
                ready[r] = (dag.compute(ln, "draft", side, ready[r]),)
            ready = self._moe_layers(dag, gpus, lanes, lane_of, lane_idx,
                                     [sh.num_tokens for sh in shapes], 1, ready, comm_stream,
                                     "draft", ep=draft)
            for r, ln in enumerate(lanes):
                ready[r] = (dag.compute(ln, "draft", ops[r].get("lm_head", 0.0), ready[r]),)
                if self.tp > 1 and shapes[r].num_seqs:
                    ready[r] = self._collective(dag, ln, "all_gather", shapes[r].num_seqs
                                                * arch.vocab_size * ab, 1, ready[r],
                                                comm_stream)

    def _moe_layers(self, dag: StepDag, gpus: list[int], lanes: list[int],
                    lane_of: dict[int, int], lane_idx: list[list[int]], tokens: list[int],
                    nm: int, ready: list[tuple[int, ...]], comm_stream: int, op: str,
                    ep=None) -> list[tuple[int, ...]]:
        """The routed experts of `nm` MoE layers for one batch of each rank (`tokens[r]` its
        tokens): routing, the dispatch all-to-all over the stage's GPUs, each GPU's experts
        (compute op `op`, timed by the group model `ep`, default the target's), the combine,
        and with TP the sequence-parallel all-gather; returns what each rank's next op waits
        for.

        Routing. Expert loads: the group's token-expert assignments (a multinomial over the
        experts' popularity). Traffic: a token goes once to each GPU holding any of its experts
        (DeepEP deduplicates per rank), and across nodes once to each node holding any (per
        node, then NVLink inside it)."""
        ep_size = len(gpus)
        starts = np.arange(0, self.arch.num_experts,
                           (ep or self.ep_model).experts_per_gpu)
        k_top = self.arch.num_experts_per_tok
        trials = sum(nm * t * k_top for t in tokens)
        per_expert = self.rng.multinomial(trials, self._popularity)
        loads = [0] * ep_size
        loads[:len(starts)] = np.add.reduceat(per_expert, starts).tolist()
        active_per_gpu = [0] * ep_size
        active_per_gpu[:len(starts)] = np.add.reduceat(
            (per_expert > 0).astype(np.int64), starts).tolist()
        held_by = [0] * ep_size                          # layer-tokens on each GPU
        for r, src in enumerate(lane_idx):
            t = nm * tokens[r]
            for j, gi in enumerate(src):     # each TP rank holds 1/tp of the tokens
                held_by[gi] += t * (j + 1) // len(src) - t * j // len(src)
        held = np.array(held_by, dtype=np.int64)
        sent = {ln: ready[r] for r, ln in enumerate(lanes)}
        arrived, back_of = self._all_to_all(dag, gpus, held, sent, lanes, lane_of,
                                            comm_stream, nm)
        expert_s = self._experts_s(loads, active_per_gpu, nm, ep=ep)
        expert_nodes = {ln: dag.compute(ln, op, max(expert_s[gi] for gi in lane_idx[r]),
                                        arrived[ln])
                        for r, ln in enumerate(lanes)}
        back = back_of({ln: (node,) for ln, node in expert_nodes.items()})
        out = []
        for r, ln in enumerate(lanes):
            done = back[ln]
            if self.tp > 1:          # sequence-parallel MoE: gather the tokens
                done = self._collective(dag, ln, "all_gather", tokens[r] * self.arch.hidden_size
                                        * self.ab, nm, done, comm_stream)
            out.append(done)
        return out

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
        lay = self._deepep_layout(gpus, lanes, lane_of, nodes, q_gpu, q_node)
        ep = len(gpus)
        # Same-node tokens over NVLink, expected: sum over the node's other GPUs of held x P.
        nvlink_tokens = (held * lay.same_node_reach).tolist()
        transfers = []                           # (src index, relay index, tokens)
        if multi:
            inter = rng.binomial(held[:, None], q_node[None, :]).tolist()
            for c, n in enumerate(node_ids):
                relay, forward = lay.relay[n], lay.forward[n]
                for i in range(ep):
                    t = inter[i][c]
                    if t > 0 and lay.node_col[i] != c:
                        # A relay forwards to its node's other GPUs the tokens that need them.
                        r = relay[i]
                        transfers.append((i, r, t))
                        nvlink_tokens[r] += t * forward[r]
            transfers.sort()
        a_intra = self.costs.intra_node_latency_s * count
        a_inter = self.costs.inter_node_latency_s * count
        phase_stream = -1 if stream == COMPUTE_STREAM else COMM_STREAM
        members, node_lanes, node_of_idx = lay.members, lay.node_lanes, lay.node_of_idx
        lane_of_idx = lay.lane_of_idx

        def phase(n: int, deps: tuple[int, ...], op: str, per_token: float) -> int:
            b = max(nvlink_tokens[j] for j in members[n]) * per_token
            dur = b / self.ic + a_intra if b > 0 else 0.0
            return dag._add(LOCAL, node_lanes[n][0], phase_stream, dur, deps, op, fabric=multi)

        into: dict[int, list[int]] = {n: [] for n in node_ids}
        for i, r, t in transfers:
            src_lane = lane_of_idx[i]
            tid = dag.transfer(src_lane, "dispatch", gpus[i], gpus[r], int(t * d_b), a_inter,
                               ready[src_lane], True)
            into[node_of_idx[r]].append(tid)
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
                tid = dag.transfer(lane_of_idx[r], "combine", gpus[r], gpus[i], int(t * c_b),
                                   a_inter, (phases[node_of_idx[r]],), True)
                back[lane_of_idx[i]].append(tid)
            return {ln: tuple(back[ln]) + (phases[n],) for n in node_ids
                    for ln in node_lanes[n]}
        return arrived, combine

    def _deepep_layout(self, gpus: list[int], lanes: list[int], lane_of: dict[int, int],
                       nodes: np.ndarray, q_gpu: np.ndarray, q_node: np.ndarray) -> DeepEpLayout:
        """What a DeepEP-style all-to-all over `gpus` (lanes `lanes`) needs that does not depend
        on the step, computed once per group."""
        key = (tuple(gpus), tuple(lanes))
        hit = self._layouts.get(key)
        if hit is not None:
            return hit
        node_ids = sorted(set(nodes.tolist()))
        col = {n: c for c, n in enumerate(node_ids)}
        members = {n: np.flatnonzero(nodes == n) for n in node_ids}
        position = np.empty(len(gpus), dtype=np.int64)
        for js in members.values():
            position[js] = np.arange(len(js))
        same = nodes[:, None] == nodes[None, :]
        reach = np.where(same, q_gpu[None, :], 0.0)
        np.fill_diagonal(reach, 0.0)
        relay, forward = {}, {}
        for n, js in members.items():
            c = col[n]
            relay[n] = js[position % len(js)].tolist()
            # Per relay r on node n: the tokens it forwards per token it receives, beyond its own.
            forward[n] = [float(q_gpu[js].sum() / q_node[c] - q_gpu[r] / q_node[c])
                          for r in range(len(gpus))]
        hit = self._layouts[key] = DeepEpLayout(
            node_col=[col[n] for n in nodes.tolist()],
            members={n: js.tolist() for n, js in members.items()},
            same_node_reach=reach.sum(axis=1), relay=relay, forward=forward,
            node_lanes={n: list(dict.fromkeys(lane_of[gpus[j]] for j in js))
                        for n, js in members.items()},
            node_of_idx=nodes.tolist(), lane_of_idx=[lane_of[g] for g in gpus])
        return hit

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

    def _experts_s(self, loads: list[int], active: list[int], nm: int,
                   ep=None) -> list[float]:
        """Routed-expert GEMMs of each GPU over nm MoE layers: `loads` token-expert assignments,
        `active` distinct experts hit (weights read once per layer); 0 for a GPU with none.
        Elementwise the same operations, in the same order, as one GPU at a time. `ep`: the
        group model whose experts these are (default the target's)."""
        if ep is None:
            ep, share = self.ep_model, nm / self.num_moe
        else:
            share = nm / ep._num_moe
        # Per GPU, in floats (a few dozen GPUs: array operations would cost more than they
        # save).
        flop_s, expert_s = float(ep._flop_s_per_assignment), float(ep._byte_s_per_expert)
        assignment_s, floor = float(ep._byte_s_per_assignment), float(ep._floor_s) * share
        out = []
        for load, hit in zip(loads, active):
            if load > 0:
                per_layer = load / nm
                t = max(per_layer * flop_s * share, (hit * expert_s + per_layer * assignment_s)
                        * share)
                out.append(t if t >= floor else floor)
            else:
                out.append(0.0)
        return out
