"""Step time of an expert-parallel group: vLLM's wide EP, with DP ranks stepping in lock-step.

With `enable_expert_parallel`, vLLM runs attention data-parallel (each of the `dp` ranks has its
own scheduler, KV cache and batch, TP-sharded over `tp` GPUs) and the MoE layers expert-parallel
over all EP = dp x tp GPUs of a pipeline stage: each GPU holds ceil(E / EP) routed experts whole.
Every MoE layer is a collective over the group, so the ranks step together: a rank with nothing
to run executes a dummy batch (one token, `StepShape.dummy()`).

One lock-step step of shapes s_1..s_dp (t_r tokens each, T = sum t_r) takes

    max_r (non-MoE compute_r + TP/PP communication_r)      slowest rank, RooflineModel's ops
  + MoE(T)                                                 the hottest GPU's routed experts
  + all-to-all(max_r t_r)                                  dispatch + combine (dp > 1 only)

plus the per-step CPU overhead and launch time of the rank roofline (`RooflineModel.assemble`).

- MoE(T): T x k expert assignments, uniform at random over E experts held in `cells` =
  min(EP, E) equal groups. The hottest GPU's load is the expected maximum of a multinomial
  (A = T k trials over `cells` cells), by the normal approximation
      L(A) = A / cells + z_cells * sqrt(A (1 / cells) (1 - 1 / cells)),
  with z_n the expected largest of n standard normals (`roofline.expected_max_of_normals`, the
  same E[max] as a TP all-reduce's rank skew; z_1 = 0: one cell takes everything), capped at
  T x min(k, experts per GPU).
  Its GEMMs take max(2 x L x params per expert / FLOP/s, (active experts x expert bytes +
  L x expert activations) / HBM bandwidth, kernel floors) per MoE layer, where the GPU's
  active experts are ceil(E / EP) x (1 - (1 - k / E)^T). The roofline is deterministic: no
  routing is sampled. Within-token sampling without replacement makes the true variance a
  little smaller, so L slightly overestimates the imbalance.
- all-to-all (only with dp > 1; with dp = 1 vLLM keeps the TP all-reduce and sends no
  all-to-all): each GPU of rank r holds ceil(t_r / tp) tokens (vLLM's sequence-parallel MoE
  when tp > 1) and sends each to its k experts: per MoE layer and direction
      bytes_out = ceil(t_r / tp) x k x hidden x activation bytes x (EP - 1) / EP
  leaving the GPU, DeepEP-style (no per-destination de-duplication). Of the EP - 1 peers,
  `ep_local` - 1 share the GPU's node (intra-node interconnect at its achieved fraction) and
  EP - ep_local are on other nodes (`inter_node_bandwidth_bytes_per_s`, a declared per-GPU
  network bandwidth); both parts move at once, so one direction takes
      max(local bytes / interconnect + alpha, remote bytes / network + network latency).
  Dispatch and combine carry the same bytes, for every MoE layer; the busiest rank (max t_r)
  sets the time. The network-aware cluster model will replace this with the fabric.
- `ep_local`: vLLM orders ranks DP, then PP, then TP, so a node of G GPUs holds
  min(EP, max(tp, G // pp)) GPUs of one stage's EP group.

Dummy batches are one token; vLLM's padding of every rank to the largest batch for CUDA graphs is
not modelled, nor redundant experts (EPLB), nor overlap of the all-to-all with compute.
"""

from __future__ import annotations

import math

from simcore.compute.base import StepShape, StepTime, check_op_scale
from simcore.compute.assumptions import RooflineAssumptions
from simcore.compute.roofline import RooflineModel, expected_max_of_normals
from simcore.errors import ConfigError
from simcore.hardware import GpuSpec
from simcore.model.arch import ModelArch, dtype_bytes


class ExpertParallelRoofline:
    """GroupStepTimeModel of one EP group of `dp` ranks x `tp` GPUs (x `pp` stages); immutable.

    `step_time_group(shapes)` takes one shape per rank (`StepShape.dummy()` for an idle rank).
    `step_time(shape)` is the group step with this one rank busy and the others idle.
    """

    __slots__ = ("profile_id", "profile_version", "op_scale", "calibrated", "relative_uncertainty", "arch", "gpu", "tp", "pp",
                 "dp", "ep", "num_ranks", "experts_per_gpu", "ep_local", "rank_model",
                 "_k", "_cells", "_z", "_ln_miss", "_flop_s_per_assignment",
                 "_byte_s_per_expert", "_byte_s_per_assignment", "_floor_s", "_max_per_token",
                 "_a2a_bytes_per_token", "_a2a_local_s_per_byte", "_a2a_remote_s_per_byte",
                 "_a2a_local_latency_s", "_a2a_remote_latency_s", "_num_moe", "_graph_max_tokens")

    def __init__(self, arch: ModelArch, gpu: GpuSpec, *, tp: int = 1, pp: int = 1, dp: int = 1,
                 weight_dtype: str = "bf16", kv_cache_dtype: str = "bf16",
                 assumptions: RooflineAssumptions | None = None,
                 multi_node_tp: bool = False, op_scale: dict[str, float] | None = None,
                 rank_model: RooflineModel | None = None) -> None:
        """`rank_model` times each rank's non-expert part (default: the roofline with these
        settings and sequence-parallel MoE when dp > 1); `op_scale` scales op classes as
        `RooflineModel` does, here the routed experts (`moe`) and the all-to-all
        (`communication`)."""
        if not arch.is_moe:
            raise ConfigError(f"expert parallelism needs a mixture-of-experts model; {arch.name} "
                              "is dense")
        if dp < 1:
            raise ConfigError(f"data_parallel_size must be at least 1, got {dp}")
        a = assumptions or RooflineAssumptions()
        if rank_model is None:
            rank_model = RooflineModel(arch, gpu, tp=tp, pp=pp, weight_dtype=weight_dtype,
                                       kv_cache_dtype=kv_cache_dtype, assumptions=a,
                                       sequence_parallel_moe=dp > 1,
                                       multi_node_tp=multi_node_tp, op_scale=op_scale)
        self.rank_model = rank_model
        self.arch, self.gpu, self.tp, self.pp, self.dp = arch, gpu, tp, pp, dp
        self.ep = ep = dp * tp
        self.num_ranks = dp
        self.profile_id = rank_model.profile_id
        self.profile_version = rank_model.profile_version
        self.calibrated = rank_model.calibrated
        self.relative_uncertainty = rank_model.relative_uncertainty
        self.op_scale = scale = check_op_scale(op_scale)

        e = arch.num_experts
        k = arch.num_experts_per_tok
        self.experts_per_gpu = -(-e // ep)
        self._k = k
        self._cells = min(ep, e)
        self._z = expected_max_of_normals(self._cells)
        self._ln_miss = math.log1p(-k / e) if k < e else -math.inf
        self._max_per_token = min(k, self.experts_per_gpu)
        self._num_moe = num_moe = arch.num_moe_layers()

        wb = dtype_bytes(weight_dtype)
        ab = max(wb, 2.0)  # activations are 16-bit
        f_gemm = gpu.flops_for(weight_dtype) * a.gemm_flops_fraction
        bw = gpu.hbm_bandwidth_bytes_per_s * a.hbm_bandwidth_fraction
        moe_idx = next(i for i in range(arch.num_layers) if arch.is_moe_layer(i))
        experts = [g for g in arch.mlp_gemms(moe_idx, tp, ep) if g.group == "expert"]
        count = experts[0].count
        per_expert = sum(g.num_params for g in experts) / count   # one whole expert
        io = sum(g.in_features + g.out_features for g in experts)
        fm = scale["moe"]
        self._flop_s_per_assignment = fm * num_moe * 2 * per_expert / f_gemm
        self._byte_s_per_expert = fm * num_moe * per_expert * wb / bw
        self._byte_s_per_assignment = fm * num_moe * io * ab / bw
        self._floor_s = fm * num_moe * 2 * a.min_kernel_s

        g = gpu.gpus_per_node
        self.ep_local = min(ep, max(tp, g // pp))
        self._a2a_bytes_per_token = k * arch.hidden_size * ab
        ic = gpu.interconnect_bandwidth_bytes_per_s * a.interconnect_bandwidth_fraction
        net = a.inter_node_bandwidth_bytes_per_s
        if dp > 1:
            fc = scale["communication"]
            self._a2a_local_s_per_byte = fc * (self.ep_local - 1) / ep / ic
            self._a2a_remote_s_per_byte = fc * (ep - self.ep_local) / ep / net
            self._a2a_local_latency_s = (fc * a.collective_hop_latency_s if self.ep_local > 1
                                         else 0.0)
            self._a2a_remote_latency_s = (fc * a.inter_node_latency_s if ep > self.ep_local
                                          else 0.0)
        else:
            self._a2a_local_s_per_byte = self._a2a_remote_s_per_byte = 0.0
            self._a2a_local_latency_s = self._a2a_remote_latency_s = 0.0
        self._graph_max_tokens = self.rank_model.cuda_graph_max_num_tokens

    # -- the parts of a group step, exposed for checks and reports ------------------------------

    # Where the times come from: as the rank model says (the experts and the all-to-all are
    # the roofline's in every case, and the rank model's error bounds already say so).

    def op_error_bounds(self) -> dict[str, float]:
        return self.rank_model.op_error_bounds()

    def fallbacks(self) -> list[str]:
        return self.rank_model.fallbacks()

    def assumed_parts(self) -> list[str]:
        return self.rank_model.assumed_parts()

    def measured_share(self) -> float:
        return self.rank_model.measured_share()

    def assumption_lines(self) -> list[str]:
        return self.rank_model.assumption_lines()

    def expected_max_load(self, num_tokens: int) -> float:
        """Expected expert assignments on the hottest GPU when the group runs `num_tokens`."""
        if num_tokens <= 0:
            return 0.0
        n = num_tokens * self._k
        p = 1.0 / self._cells
        load = n * p + self._z * math.sqrt(n * p * (1.0 - p))
        cap = num_tokens * self._max_per_token
        return load if load < cap else float(cap)

    def moe_bounds(self, num_tokens: int) -> tuple[float, float]:
        """(compute-bound, memory-bound) seconds of the routed experts on the hottest GPU."""
        if num_tokens <= 0:
            return 0.0, 0.0
        load = self.expected_max_load(num_tokens)
        active = self.experts_per_gpu * (1.0 - math.exp(num_tokens * self._ln_miss))
        c = load * self._flop_s_per_assignment
        m = active * self._byte_s_per_expert + load * self._byte_s_per_assignment
        if c >= m and c >= self._floor_s:
            return c * self.rank_model._cscale, 0.0
        return 0.0, (m if m > self._floor_s else self._floor_s)

    def all_to_all_bytes(self, num_tokens: int) -> float:
        """Bytes leaving one GPU of a rank with `num_tokens` tokens, per MoE layer and direction.

        ceil(num_tokens / tp) x top-k x hidden x activation bytes x (EP - 1) / EP; 0 with dp = 1.
        """
        if self.dp == 1 or num_tokens <= 0:
            return 0.0
        per_gpu = -(-num_tokens // self.tp)
        return per_gpu * self._a2a_bytes_per_token * (self.ep - 1) / self.ep

    def all_to_all_s(self, max_rank_tokens: int) -> float:
        """Dispatch plus combine of every MoE layer, set by the rank with the most tokens."""
        if self.dp == 1 or max_rank_tokens <= 0:
            return 0.0
        sent = -(-max_rank_tokens // self.tp) * self._a2a_bytes_per_token
        local = sent * self._a2a_local_s_per_byte + self._a2a_local_latency_s
        remote = sent * self._a2a_remote_s_per_byte + self._a2a_remote_latency_s
        return 2 * self._num_moe * (local if local > remote else remote)

    def rank_time(self, shape: StepShape) -> tuple[float, float, float]:
        """(compute-bound, memory-bound, communication) seconds of one rank's non-MoE part."""
        if shape.num_tokens <= 0:
            return 0.0, 0.0, 0.0
        m = self.rank_model
        cb, mb = m.op_bounds(shape, routed_experts=False)
        return cb, mb, m.comm_s(shape)

    # -- step times -----------------------------------------------------------------------------

    def group_parts(self, shapes: list[StepShape]
                    ) -> tuple[float, float, float, float, bool] | None:
        """(compute-bound, memory-bound, communication, all-to-all, full CUDA graph) of one
        lock-step step in which rank r runs `shapes[r]`: the slowest rank's non-MoE part, the
        experts over the group's tokens and the all-to-alls (in the communication too); None
        when no rank has a token."""
        if len(shapes) != self.num_ranks:
            raise ValueError(f"expected {self.num_ranks} shapes (one per DP rank), "
                             f"got {len(shapes)}")
        slowest = (0.0, 0.0, 0.0)
        slowest_s = -1.0
        total_tokens = max_tokens = 0
        full_graph = True
        for shape in shapes:
            t = shape.num_tokens
            if t <= 0:
                continue
            total_tokens += t
            if t > max_tokens:
                max_tokens = t
            if not shape.is_dummy and not shape.runs_full_graph(self._graph_max_tokens):
                full_graph = False
            part = self.rank_time(shape)
            s = part[0] + part[1] + part[2]
            if s > slowest_s:
                slowest, slowest_s = part, s
        if total_tokens == 0:
            return None
        moe_c, moe_m = self.moe_bounds(total_tokens)
        a2a = self.all_to_all_s(max_tokens)
        return slowest[0] + moe_c, slowest[1] + moe_m, slowest[2] + a2a, a2a, full_graph

    def step_time_group(self, shapes: list[StepShape]) -> StepTime:
        """The common duration of one lock-step step in which rank r runs `shapes[r]`."""
        parts = self.group_parts(shapes)
        if parts is None:
            return StepTime(0.0, 0.0, 0.0, "compute")
        cb, mb, comm, a2a, full_graph = parts
        return self.rank_model.assemble(cb, mb, comm, full_graph, a2a, group=shapes)

    def step_time(self, shape: StepShape) -> StepTime:
        """The group step with one rank running `shape` and every other rank a dummy batch."""
        return self.step_time_group([shape] + [StepShape.dummy()] * (self.num_ranks - 1))
