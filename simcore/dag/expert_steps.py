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

    node_ids: list[int]                  # the group's nodes, ascending
    node_col: list[int]                  # column of each GPU's node (nodes in ascending order)
    members: dict[int, list[int]]        # node -> its GPUs
    same_node_reach: np.ndarray          # per GPU: sum over its node's other GPUs of P(need)
    relay: dict[int, list[int]]          # node -> per sending GPU, its relay there
    forward: dict[int, list[float]]      # node -> per relay, tokens forwarded per token received
    node_lanes: dict[int, list[int]]     # node -> the lanes of its GPUs, in order
    node_of_idx: list[int]
    lane_of_idx: list[int]


REUSE_STEP_DAGS = True
"""Whether expert-parallel steps adopt a known structure (`ExpertParallelSteps._build_ep`); off,
every step is built node by node (the same DAGs: the tests and benchmarks compare the two)."""


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
        drafts on its own lane.

        Structure reuse (one stage, TP 1, no drafter, DeepEP-style all-to-alls): a step's DAG has
        the structure of any earlier step of the same group with as many sub-batches and the
        same fabric messages in each all-to-all, so `_ep_values` works out every node's
        duration, size and latency in node order (drawing the routing as the full build does)
        and a known structure is adopted with them. An unknown one is built in full from the
        same draws (the generator rewound), checked against those values, and kept."""
        if not (self._reuse_ep and REUSE_STEP_DAGS):
            self._build_ep_nodes(dag, batches, plans, lane_ids, comm_stream, wholes)
            return
        state = self.rng.bit_generator.state
        key, dur, size, latency = self._ep_values(dag, batches, plans, lane_ids)
        templates = self._ep_templates
        hit = templates.get(key)
        if hit is not None:
            dag.adopt(hit, dur, size, latency)
            return
        self.rng.bit_generator.state = state
        self._build_ep_nodes(dag, batches, plans, lane_ids, comm_stream, wholes)
        if dag.dur_s != dur or dag.size_bytes != size or dag.latency_s != latency:
            raise AssertionError("an expert-parallel step's values differ from its full build")
        if len(templates) >= self._TEMPLATES:
            templates.clear()
        templates[key] = dag.template()

    _TEMPLATES = 256
    """Step structures an expert-parallel builder keeps (each a few hundred nodes' lists)."""

    def _ep_group(self, dag: StepDag, lanes: list[int]):
        """(GPUs of the group in lane order, each GPU's lane, each lane's GPUs by their index in
        the group) of one stage's lanes."""
        gpus = [g for ln in lanes for g in dag.lanes[ln].gpus]
        lane_of = {g: ln for ln in lanes for g in dag.lanes[ln].gpus}
        gidx = {g: i for i, g in enumerate(gpus)}
        return gpus, lane_of, [[gidx[g] for g in dag.lanes[ln].gpus] for ln in lanes]

    def _ep_values(self, dag: StepDag, batches, plans, lane_ids):
        """(structure key, durations, sizes, latencies) of every node `_build_ep_nodes` adds for
        one stage at TP 1 without a drafter, in its order, with the routing drawn as it draws
        it: per layer group each rank's attention; per MoE group and sub-batch the dispatch
        messages, the per-node NVLink phases, each lane's experts, the combine phases and
        messages; the LM heads. The key names the group's engines, the sub-batches and each
        all-to-all's messages (sender, relay): what the structure depends on."""
        rc = self.cfg.moe_routing
        h = self.arch.hidden_size
        d_b, c_b = h * rc.dispatch_bytes_per_element, h * rc.combine_bytes_per_element
        ranks = len(batches)
        num_sub = len(plans[0][0])
        lanes = [ids[0] for ids in lane_ids]
        gpus, lane_of, lane_idx = self._ep_group(dag, lanes)
        ops = [[self._ops(shape, False) for shape in plans[r][0]] for r in range(ranks)]
        costs = self.costs
        key: list = [tuple(inst.index for inst, _ in batches), num_sub]
        dur: list[float] = []
        size: list[int] = []
        latency: list[float] = []
        for n, nd, nm in self.groups[0]:
            for r in range(ranks):
                for k in range(num_sub):
                    attn, mlp = self._layer_s(ops[r][k][1], n, nd, nm, False)
                    dur.append(attn + mlp)
            size.extend([0] * (ranks * num_sub))
            latency.extend([0.0] * (ranks * num_sub))
            if nm == 0:
                continue
            a_intra, a_inter = costs.intra_node_latency_s * nm, costs.inter_node_latency_s * nm
            for k in range(num_sub):
                loads, active, held = self._route(len(gpus), lane_idx,
                                                  [ops[r][k][0].num_tokens for r in range(ranks)],
                                                  nm)
                lay, nvlink_tokens, transfers = self._deepep_traffic(gpus, held, lanes, lane_of)
                expert_s = self._experts_s(loads, active, nm)
                key.append(tuple((i, r) for i, r, _ in transfers))
                node_ids = lay.node_ids
                m, p = len(transfers), len(node_ids)
                dur.extend([0.0] * m)
                size.extend([int(t * d_b) for _, _, t in transfers])
                latency.extend([a_inter] * m)
                dur.extend([self._phase_s(lay, x, nvlink_tokens, d_b, a_intra) for x in node_ids])
                dur.extend(expert_s)        # at TP 1, lane r is GPU r of the group
                dur.extend([self._phase_s(lay, x, nvlink_tokens, c_b, a_intra) for x in node_ids])
                size.extend([0] * (2 * p + ranks))
                latency.extend([0.0] * (2 * p + ranks))
                dur.extend([0.0] * m)
                size.extend([int(t * c_b) for _, _, t in transfers])
                latency.extend([a_inter] * m)
        for r in range(ranks):
            for k in range(num_sub):
                dur.append(ops[r][k][1].get("lm_head", 0.0))
        size.extend([0] * (ranks * num_sub))
        latency.extend([0.0] * (ranks * num_sub))
        return tuple(key), dur, size, latency

    def _build_ep_nodes(self, dag: StepDag, batches, plans, lane_ids, comm_stream: int,
                        wholes=None) -> None:
        """`_build_ep`, node by node."""
        h = self.arch.hidden_size
        ranks = len(batches)
        num_sub = len(plans[0][0])
        for s in range(self.pp):
            lanes = [ids[s] for ids in lane_ids]
            gpus, lane_of, lane_idx = self._ep_group(dag, lanes)
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
        loads, active_per_gpu, held = self._route(len(gpus), lane_idx, tokens, nm, ep)
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

    def _route(self, ep_size: int, lane_idx: list[list[int]], tokens: list[int], nm: int,
               ep=None) -> tuple[list[int], list[int], np.ndarray]:
        """(token-expert assignments on each GPU, distinct experts hit on each, layer-tokens each
        holds) for `nm` MoE layers of a batch of `tokens[r]` tokens on each rank, the expert
        loads drawn (`_moe_layers`)."""
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
        return loads, active_per_gpu, np.array(held_by, dtype=np.int64)

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
        if self.cfg.collectives.all_to_all == "direct" and len(set(nodes.tolist())) > 1:
            tokens = self.rng.binomial(held[:, None], q_gpu[None, :])
            np.fill_diagonal(tokens, 0)
            disp = (tokens * d_b).astype(np.int64)
            arrived = self._pairwise(dag, gpus, disp, ready, lanes, lane_of, "dispatch",
                                     stream, count)

            def combine_direct(expert_ready):
                comb = (tokens.T * c_b).astype(np.int64)
                return self._pairwise(dag, gpus, comb, expert_ready, lanes, lane_of, "combine",
                                      stream, count)
            return arrived, combine_direct
        lay, nvlink_tokens, transfers = self._deepep_traffic(gpus, held, lanes, lane_of)
        node_ids = lay.node_ids
        multi = len(node_ids) > 1
        a_intra = self.costs.intra_node_latency_s * count
        a_inter = self.costs.inter_node_latency_s * count
        phase_stream = -1 if stream == COMPUTE_STREAM else COMM_STREAM
        node_lanes, node_of_idx = lay.node_lanes, lay.node_of_idx
        lane_of_idx = lay.lane_of_idx

        def phase(n: int, deps: tuple[int, ...], op: str, per_token: float) -> int:
            dur = self._phase_s(lay, n, nvlink_tokens, per_token, a_intra)
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

    def _deepep_traffic(self, gpus: list[int], held: np.ndarray, lanes: list[int],
                        lane_of: dict[int, int]) -> tuple[DeepEpLayout, list[float], list]:
        """A DeepEP-style dispatch over `gpus` (`_all_to_all`): its layout, the tokens each GPU
        moves over NVLink (expected), and the fabric messages (sender index, relay index,
        tokens) in order, their counts drawn."""
        nodes, q_gpu, q_node = self._gpu_reach(gpus)
        lay = self._deepep_layout(gpus, lanes, lane_of, nodes, q_gpu, q_node)
        # Same-node tokens over NVLink, expected: sum over the node's other GPUs of held x P.
        nvlink_tokens = (held * lay.same_node_reach).tolist()
        transfers = []                           # (src index, relay index, tokens)
        if len(lay.node_ids) > 1:
            inter = self.rng.binomial(held[:, None], q_node[None, :]).tolist()
            node_col = lay.node_col
            for c, n in enumerate(lay.node_ids):
                relay, forward = lay.relay[n], lay.forward[n]
                for i in range(len(gpus)):
                    t = inter[i][c]
                    if t > 0 and node_col[i] != c:
                        # A relay forwards to its node's other GPUs the tokens that need them.
                        r = relay[i]
                        transfers.append((i, r, t))
                        nvlink_tokens[r] += t * forward[r]
            transfers.sort()
        return lay, nvlink_tokens, transfers

    def _phase_s(self, lay: DeepEpLayout, n: int, nvlink_tokens: list[float], per_token: float,
                 latency_s: float) -> float:
        """An NVLink phase of node n: its busiest GPU's bytes over the per-GPU bandwidth."""
        b = max(nvlink_tokens[j] for j in lay.members[n]) * per_token
        return b / self.ic + latency_s if b > 0 else 0.0

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
            node_ids=node_ids, node_col=[col[n] for n in nodes.tolist()],
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
