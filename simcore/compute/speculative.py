"""The drafter's time in a speculative-decoding step, on top of the target model's step time.

vLLM V1 runs the drafter right after the target's forward in the same step (the proposer of
`gpu_model_runner.propose_draft_token_ids`): a first draft forward over the step's tokens (the
same requests, prompt chunks and verified tokens alike, which also builds the drafter's own KV),
then k - 1 forwards of one token per request, each drafting the next position. The step's
shape (a `StepShape` with the verifications counted as decodes) is the target's; the draft's
forwards are timed by a step-time model of the drafter built like the target's (same GPU, TP,
compute kind, profile and op scales) with no CPU time of its own (the target's step carries the
engine's CPU side):

- draft_model: the draft model (a preset), whole;
- eagle / eagle3: one decoder layer of the target's width and attention with a dense MLP, plus
  an LM head over the target's vocabulary (EAGLE reuses the target's head, EAGLE-3 has its own:
  taken at the target's vocabulary);
- mtp: one of the target's own MTP layers (a decoder layer of its kind, MoE included) and the
  shared LM head;
- ngram: no GPU time; the n-gram lookup runs on the CPU and is taken as free.

With pipeline parallelism (EAGLE-3 only, as vLLM's Model Runner V2 runs it) the drafter sits
on the last stage's GPUs, and the hidden states its head reads from earlier target layers
(`eagle3_aux_layers`) travel with the hidden states and residual over each hop between the
stage that captured them and the last (`aux_states_per_hop`).
"""

from __future__ import annotations

import dataclasses

from simcore.compute.base import StepShape, StepTime
from simcore.engine.speculative import EAGLE_FAMILY
from simcore.model.arch import pp_stage_layers

AUX_STATE_BYTES = 2.0
"""Bytes per element of an auxiliary hidden state (16-bit activations)."""


def eagle3_aux_layers(num_layers: int) -> tuple[int, ...]:
    """The target layers whose input (hidden states plus residual) an EAGLE-3 head reads:
    vLLM's default, one early, one middle and one late (`get_eagle3_aux_hidden_state_layers`:
    2, num_layers // 2, num_layers - 3)."""
    return (2, num_layers // 2, num_layers - 3)


def aux_states_per_hop(num_layers: int, pp: int) -> tuple[int, ...]:
    """How many EAGLE-3 auxiliary hidden states each pipeline hop (stage i to i + 1) carries to
    the drafter on the last stage: a state captured at the input of layer j travels every hop
    after the stage that holds layer j."""
    aux = eagle3_aux_layers(num_layers)
    out, end = [], 0
    for n in pp_stage_layers(num_layers, pp)[:-1]:
        end += n
        out.append(sum(1 for j in aux if j < end))
    return tuple(out)


def draft_head_arch(arch, method: str):
    """The architecture that times an eagle / eagle3 / mtp drafter: one decoder layer of the
    target's width, attention and vocabulary, full attention. An MTP layer is of the target's
    kind (MoE where the target's later layers are: DeepSeek-V3's is); an EAGLE head's MLP is
    dense, of the target's `intermediate_size`, and its attention has no sinks, as the published
    heads are (Llama decoder layers, gpt-oss's EAGLE-3 heads too)."""
    label = {"eagle": "EAGLE head", "eagle3": "EAGLE-3 head", "mtp": "MTP layer"}[method]
    changes = dict(name=f"{arch.name} {label}", num_layers=1, first_k_dense_layers=0,
                   moe_layer_freq=1, sliding_window=0, sliding_window_layers=(),
                   num_mtp_layers=0)
    if method != "mtp":
        changes.update(num_experts=0, num_experts_per_tok=0, moe_intermediate_size=0,
                       num_shared_experts=0, shared_expert_intermediate_size=0,
                       shared_expert_gate=False, router_bias=False, expert_bias=False,
                       attention_sinks=False)
    return dataclasses.replace(arch, **changes)


class SpeculativeStepModel:
    """A target step-time model plus the drafter's forwards of each step.

    Everything but `step_time` and the assumption lines is the target's (its profile, bounds,
    TP and PP, its CPU-side model).
    """

    __slots__ = ("target", "draft", "method", "k", "draft_label", "aux_states_per_hop",
                 "_aux_s_per_token")

    def __init__(self, target, draft, *, method: str, num_speculative_tokens: int,
                 draft_label: str) -> None:
        self.target = target
        self.draft = draft
        self.method = method
        self.k = num_speculative_tokens
        self.draft_label = draft_label
        pp = getattr(target, "pp", 1)
        self.aux_states_per_hop = (aux_states_per_hop(target.arch.num_layers, pp)
                                   if method == "eagle3" and pp > 1 else ())
        """EAGLE-3's auxiliary hidden states each pipeline hop carries (() without PP)."""
        per_state = target.arch.hidden_size * AUX_STATE_BYTES
        self._aux_s_per_token = (target.pp_extra_s([c * per_state
                                                    for c in self.aux_states_per_hop])
                                 if self.aux_states_per_hop else 0.0)

    def __getattr__(self, name: str):
        if name == "target":        # not set yet (a copy being built)
            raise AttributeError(name)
        return getattr(self.target, name)

    def draft_shapes(self, shape: StepShape) -> list[StepShape]:
        """The shapes of the drafter's forwards after a step of `shape` ([] when it has no GPU
        work): one over the step's tokens, then k - 1 of one token per request, each reading
        the KV of the drafts before it."""
        if self.draft is None or shape.num_seqs <= 0:
            return []
        b = shape.num_seqs
        ctx = shape.kv_tokens_read
        out = [shape]
        for j in range(1, self.k):
            kv = ctx + b * j
            out.append(StepShape(b, b, b, float(kv), kv, kv))
        return out

    def draft_time(self, shape: StepShape) -> StepTime | None:
        """The drafter's forwards after a step of `shape` (None: no GPU time)."""
        shapes = self.draft_shapes(shape)
        if not shapes:
            return None
        draft = self.draft
        first = draft.step_time(shapes[0])
        total, compute, comm = first.total_s, first.compute_s, first.comm_s
        for s in shapes[1:]:
            st = draft.step_time(s)
            total += st.total_s
            compute += st.compute_s
            comm += st.comm_s
        return StepTime(total, compute, comm, first.bound, total - compute - comm)

    def step_time(self, shape: StepShape) -> StepTime:
        """The target's step with the drafter's forwards on the GPU after it, assembled whole
        by the target (its launch floor and its CPU side, async scheduling's overlap and the API
        server's pace, over the target's and the drafter's GPU time together, as a step DAG
        times it)."""
        d = self.draft_time(shape)
        target = self.target
        if d is None:
            return target.step_time(shape)
        cb, mb = target.op_bounds(shape)
        # The drafter's GPU time (its launch floors included) counts on the bound its
        # forwards name; its collectives are communication.
        draft_gpu = d.total_s - d.comm_s
        if d.bound == "compute":
            cb += draft_gpu
        else:
            mb += draft_gpu
        full_graph = shape.runs_full_graph(target.cuda_graph_max_num_tokens)
        comm = target.comm_s(shape) + d.comm_s + shape.num_tokens * self._aux_s_per_token
        return target.assemble(cb, mb, comm, full_graph, shape=shape)

    def assumption_lines(self) -> list[str]:
        lines = list(self.target.assumption_lines())
        k = self.k
        if self.draft is None:
            lines.append(f"speculative decoding ({self.method}, k={k}): drafts proposed on the "
                         "CPU at no modelled cost; every decoding request is taken to get k "
                         "drafts each step (a real n-gram lookup proposes none when it finds "
                         "no match, which the declared acceptance then stands for)")
        else:
            lines.append(f"speculative decoding ({self.method}, k={k}): each step adds the "
                         f"drafter, {self.draft_label}, timed by the same compute model: one "
                         f"forward over the step's tokens and {k - 1} more of one token per "
                         "request; no CPU time of its own, and not overlapped with the target")
            if self.aux_states_per_hop:
                aux = ", ".join(map(str, eagle3_aux_layers(self.target.arch.num_layers)))
                hops = ", ".join(map(str, self.aux_states_per_hop))
                lines.append("speculative decoding with pipeline parallelism: the drafter on "
                             f"the last stage; the EAGLE-3 head's auxiliary hidden states "
                             f"(the inputs of layers {aux}) ride the stage hops with the "
                             f"hidden states ({hops} per hop); the sampled and draft tokens' "
                             "return to the first stage is not timed")
            if self.method in EAGLE_FAMILY:
                lines.append("draft head: the fc that joins the target's hidden states to the "
                             "head's input (EAGLE 2h->h, EAGLE-3 3h->h, MTP's eh_proj) is not "
                             "timed; EAGLE-3's LM head is taken at the target's vocabulary")
        if getattr(self.target, "_attn_meas", None) is not None:
            lines.append("speculative decoding: the measured decode-attention tables time a "
                         "verification as one decode at its KV length (its draft queries add "
                         "no attention time there; the roofline counts their pairs)")
        lines.append("speculative decoding: the acceptance of each draft position is drawn "
                     "from the declared acceptance model (engine.speculative_config), per "
                     "request and output position from the run's seed")
        if self.draft is not None:
            lines.append("speculative decoding: the drafter's weights and its KV (one layer "
                         "per token for a head, the draft model's own layers) come out of the "
                         "KV-cache memory; its activations and CUDA graphs are not counted")
        return lines


class SpeculativeGroupModel(SpeculativeStepModel):
    """An expert-parallel group's step model (`ExpertParallelRoofline`) plus the drafter's
    forwards on every rank of each lock-step step.

    A rank with sequences drafts after its target forward (`draft_shapes`); a rank with none
    (a dummy batch) runs the drafter's dummy forward, as vLLM's dummy run does. A drafter with
    routed experts (an MTP layer of a MoE model) is itself an expert-parallel group model: each
    of its k forwards is a lock-step step of the group, the experts over every rank's tokens
    and its all-to-alls set by the rank with the most. A dense drafter (an EAGLE head, a draft
    model) runs on each rank alone; the group waits for the slowest rank's forwards. The step
    is assembled whole (launch floor, CPU side) over the target's and the drafter's times.
    """

    __slots__ = ()

    def _draft_parts(self, shapes: list[StepShape]) -> tuple[float, float, float, float]:
        """(compute-bound, memory-bound, communication, all-to-all) of the drafter's forwards
        in a step whose ranks run `shapes`."""
        draft = self.draft
        if draft is None:
            return 0.0, 0.0, 0.0, 0.0
        per_rank = [self.draft_shapes(s) for s in shapes]
        if not any(per_rank):
            return 0.0, 0.0, 0.0, 0.0
        group_parts = getattr(draft, "group_parts", None)
        if group_parts is not None:
            dummy = StepShape.dummy()
            cb = mb = comm = a2a = 0.0
            for j in range(self.k):
                parts = group_parts([f[j] if f else dummy for f in per_rank])
                if parts is not None:
                    cb += parts[0]
                    mb += parts[1]
                    comm += parts[2]
                    a2a += parts[3]
            return cb, mb, comm, a2a
        slowest = (0.0, 0.0, 0.0)
        for forwards in per_rank:
            cb = mb = comm = 0.0
            for s in forwards:
                c, m = draft.op_bounds(s)
                cb += c
                mb += m
                comm += draft.comm_s(s)
            if cb + mb + comm > sum(slowest):
                slowest = (cb, mb, comm)
        return (*slowest, 0.0)

    def step_time_group(self, shapes: list[StepShape]) -> StepTime:
        target = self.target
        parts = target.group_parts(shapes)
        if parts is None:
            return StepTime(0.0, 0.0, 0.0, "compute")
        cb, mb, comm, a2a, full_graph = parts
        dc, dm, dcomm, da2a = self._draft_parts(shapes)
        return target.rank_model.assemble(cb + dc, mb + dm, comm + dcomm, full_graph,
                                          a2a + da2a, group=shapes)

    def step_time(self, shape: StepShape) -> StepTime:
        """The group step with one rank running `shape` and every other rank a dummy batch."""
        return self.step_time_group([shape] + [StepShape.dummy()] * (self.num_ranks - 1))
