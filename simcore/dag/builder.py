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
to step as routing does (loads and traffic are drawn apart, each with its right distribution);
that part is in `simcore.dag.expert_steps`.
"""

from __future__ import annotations

import numpy as np

from simcore.cluster.config import DagConfig
from simcore.cluster.placement import Instance, Placement
from simcore.compute.base import StepShape
from simcore.compute.expert_parallel import ExpertParallelRoofline
from simcore.compute.roofline import RooflineModel
from simcore.dag import collectives as coll
from simcore.dag.expert_steps import DeepEpLayout, ExpertParallelSteps
from simcore.dag.graph import COMM_STREAM, COMPUTE_STREAM, Lane, StepDag
from simcore.model.arch import ModelArch, pp_stage_layers

Scheduled = list[tuple[object, int, int]]


def stage_layers(num_layers: int, pp: int) -> list[range]:
    """vLLM's split of the layers over pipeline stages (`pp_stage_layers`), as each stage's
    range of layer indices."""
    out, start = [], 0
    for n in pp_stage_layers(num_layers, pp):
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


class StepDagBuilder(ExpertParallelSteps):
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
        # Speculative decoding: verifications are decodes carrying drafts, and the drafter's
        # forwards follow the target's on the last stage (an expert-parallel group's wrapper
        # is its group model; its ranks' model is the bare one).
        spec = ep_model if getattr(ep_model, "draft_shapes", None) is not None else model
        self.speculative = getattr(spec, "draft_shapes", None) is not None
        self.shape_of = (StepShape.from_scheduled_spec if self.speculative
                         else StepShape.from_scheduled)
        self.draft = getattr(spec, "draft", None)
        # A drafter with routed experts (an MTP layer of a MoE model) under expert parallelism
        # is a group model of its own: its forwards are lock-step steps with all-to-alls.
        self._draft_ep = (ep_model is not None
                          and getattr(self.draft, "group_parts", None) is not None)
        self._spec = spec
        # Activation vectors per token each PP hop carries: hidden states and residual, plus
        # the EAGLE-3 head's auxiliary hidden states on their way to the last stage.
        aux = getattr(spec, "aux_states_per_hop", ()) or (0,) * (self.pp - 1)
        self._hop_states = tuple(2 + c for c in aux)
        self.alpha = model.assumptions.collective_hop_latency_s
        self._one_node: dict[tuple[int, ...], bool] = {}   # GPU group -> inside one node
        self._lanes: dict[int, list[Lane]] = {}            # instance -> its lanes (immutable)
        self._ops_memo: dict[tuple[StepShape, bool], tuple[StepShape, dict[str, float]]] = {}
        if ep_model is not None:
            self._popularity = self._expert_popularity()
            self._reach: dict[tuple[int, ...], tuple] = {}
            self._layouts: dict[tuple[tuple[int, ...], tuple[int, ...]], DeepEpLayout] = {}
            # Step structures reused (`_build_ep`) where `_ep_values` knows every node's value.
            self._reuse_ep = (self.tp == 1 and self.pp == 1 and self.draft is None
                              and cfg.collectives.all_to_all != "direct")
            self._ep_templates: dict[tuple, tuple] = {}

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
            own = self._lanes.get(inst.index)
            if own is None:
                own = self._lanes[inst.index] = [
                    Lane(f"engine {inst.index} / stage {s}", gpus, inst.index, s)
                    for s, gpus in enumerate(inst.gpus)]
            lane_ids.append(list(range(len(lanes), len(lanes) + len(own))))
            lanes.extend(own)
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
            whole = self.shape_of(sched) if sched else None
            wholes.append(whole)
            mbs = []
            for part in split_batch(sched or [], outer):
                subs = split_batch(part, inner)
                # An unsplit batch is its own shape; an empty sub-batch is a dummy one (every
                # rank of an expert-parallel group joins every all-to-all).
                shapes = [whole if sub is sched else self.shape_of(sub) if sub
                          else dummy for sub in subs]
                if self.ep_model is not None:
                    shapes += [dummy] * (inner - len(shapes))
                mbs.append(shapes)
            plans.append(mbs)
            if whole is not None and not whole.runs_full_graph(limit):
                full_graph = False
        if self.ep_model is not None:
            self._build_ep(dag, batches, plans, lane_ids, comm_stream, wholes)
        else:
            for (inst, _), mbs, ids, whole in zip(batches, plans, lane_ids, wholes):
                self._build_engine(dag, mbs, ids, comm_stream, whole)
        return dag, full_graph, wholes

    _OPS_MEMO_SIZE = 4096
    """Shapes whose op times `_ops` keeps (an expert-parallel group's idle ranks all run the
    dummy shape, and ranks decoding alike share theirs)."""

    def _ops(self, shape: StepShape,
             routed_experts: bool) -> tuple[StepShape, dict[str, float]]:
        """(shape, its op times by op): the model's op_bounds, a pure function of the shape,
        kept for the shapes seen last (callers only read the mapping)."""
        memo = self._ops_memo
        key = (shape, routed_experts)
        hit = memo.get(key)
        if hit is None:
            by_op: dict[str, float] = {}
            self.model.op_bounds(shape, routed_experts=routed_experts, by_op=by_op)
            if len(memo) >= self._OPS_MEMO_SIZE:
                memo.clear()
            hit = memo[key] = (shape, by_op)
        return hit

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
                      comm_stream: int, whole: StepShape | None = None) -> None:
        """One engine (no expert parallelism): stages in order, micro-batches through them;
        with speculative decoding the drafter's forwards over the `whole` batch close the
        last stage."""
        h, ab = self.arch.hidden_size, self.ab
        prev_stage_out: list[list[tuple[int, ...]]] = []   # per outer mb, per sub: ready nodes
        for s, lane in enumerate(lanes):
            stage_out = []
            for m, subs in enumerate(mbs):
                ops = [self._ops(shape, True) for shape in subs]
                ready = [prev_stage_out[m][k] if s else () for k in range(len(subs))]
                if s:
                    ready = [self._pp_hop(dag, lanes[s - 1], lane, ops[k][0].num_tokens,
                                          ready[k], comm_stream, self._hop_states[s - 1])
                             for k in range(len(subs))]
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
        if self.draft is not None and whole is not None:
            last = tuple(n for mb in prev_stage_out for sub in mb for n in sub)
            self._draft_forwards(dag, lanes[-1], whole, last, comm_stream)

    def _draft_forwards(self, dag: StepDag, lane: int, whole: StepShape,
                        deps: tuple[int, ...], comm_stream: int) -> None:
        """The drafter's forwards after the target's (`SpeculativeStepModel.draft_shapes`),
        each as the target's layers are built: the vocabulary-parallel embedding's all-reduce,
        the drafter's attention side and the all-reduces after it, its MLP side and the
        all-reduces after that, its LM head and the logits' all-gather; compute timed by the
        drafter's step model (its launch floor on the attention side), collectives as the
        target's (inside a node by the ring formulas, across nodes over the fabric)."""
        draft = self.draft
        arch = draft.arch
        h, ab, layers = arch.hidden_size, self.ab, arch.num_layers
        tp = self.tp
        ready = deps
        for shape in self._spec.draft_shapes(whole):
            by_op: dict[str, float] = {}
            cb, mb = draft.op_bounds(shape, by_op=by_op)
            gpu = sum(by_op.values())
            # The drafter's step as its model assembles it (launch floor; no CPU time of its
            # own), less its collectives, which the DAG places itself.
            comm = draft.comm_s(shape)
            busy = draft.assemble(cb, mb, comm,
                                  shape.runs_full_graph(draft.cuda_graph_max_num_tokens),
                                  shape=shape).total_s - comm
            attn = by_op.get("attention", 0.0) + by_op.get("elementwise", 0.0) + (busy - gpu)
            mlp = by_op.get("mlp", 0.0) + by_op.get("moe", 0.0)
            size = shape.num_tokens * h * ab
            if tp > 1:
                ready = self._collective(dag, lane, "all_reduce", size, 1, ready, comm_stream)
            ready = (dag.compute(lane, "draft", attn, ready),)
            if tp > 1:
                ready = self._collective(dag, lane, "all_reduce", size, layers, ready,
                                         comm_stream)
            ready = (dag.compute(lane, "draft", mlp, ready),)
            if tp > 1:
                ready = self._collective(dag, lane, "all_reduce", size, layers, ready,
                                         comm_stream)
            ready = (dag.compute(lane, "draft", by_op.get("lm_head", 0.0), ready),)
            if tp > 1 and shape.num_seqs:
                ready = self._collective(dag, lane, "all_gather",
                                         shape.num_seqs * arch.vocab_size * ab, 1, ready,
                                         comm_stream)

    def _pp_hop(self, dag: StepDag, src_lane: int, dst_lane: int, num_tokens: int,
                deps: tuple[int, ...], comm_stream: int, states: int = 2) -> tuple[int, ...]:
        """Hidden states and residual (and any other of the `states` activation vectors per
        token) from one stage to the next: by formula inside a node, else each TP rank sends
        its 1/tp slice to its peer and the receivers all-gather."""
        size = states * self.arch.hidden_size * self.ab * num_tokens
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
