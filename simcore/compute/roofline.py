"""A reference (uncalibrated) step-time model: every op of a step timed by the roofline of one GPU.

What is modelled, per GPU of a TP group, summed over all layers of all pipeline stages:
- Each op takes max(FLOPs / (peak FLOP/s x efficiency), bytes / (peak HBM bandwidth x efficiency),
  a minimum kernel time per kernel). Peaks come from the GPU catalog; the efficiency factors,
  latencies and overheads are the declared `RooflineAssumptions`.
- Linear layers (QKV/MLA projections, output projection, dense MLP, shared experts, MoE router):
  2 FLOPs per weight per token; bytes = weights once + activations in and out. fp8 weights run at
  the fp8 peak where the GPU has one, else at the bf16 peak with 1-byte weights (weight-only fp8).
- Attention: 4 x causal query-key pairs x heads x head_dim FLOPs (QK^T and PV), at the bf16 peak
  times its own efficiency; bytes = the KV cache read (kv_tokens_read) + the new KV written +
  queries and outputs. The whole mixed batch is one roofline, as vLLM V1 runs one varlen kernel.
  Sliding-window layers count the pairs and KV reads of the step's window view
  (`simcore.compute.attention_views.windowed_attention`: each query over at most `sliding_window` keys).
  MLA: decode tokens use the absorbed form (attention over the 576-wide latent; the latent
  up-projection applied to the query and output of each decode token), prefill tokens the
  expanded form (the up-projection applied to every KV token of the prefilling requests). The
  step shape does not split KV reads by request kind, so decode reads are estimated as
  num_decode_seqs x kv_tokens_read / num_seqs.
- MoE: router in bf16; routed experts with uniform top-k routing, so num_tokens tokens activate
  E x (1 - (1 - k/E)^num_tokens) distinct experts in expectation, each expert's weights read once;
  expert FLOPs from num_tokens x k. Experts are TP-sharded here. An expert-only weight format
  (mxfp4) reads the experts at its bytes per weight and runs them at the bf16 rate (4-bit
  weights, 16-bit activations, as vLLM's MXFP4 MoE kernels); every other layer is bf16.
- Norms, rotary embedding, activation functions, residual adds: memory-bound passes over the
  activations, with a floor of a few minimum-length kernels per layer.
- LM head and sampling for num_seqs rows (vLLM computes logits for every scheduled request,
  including partial prefill chunks, and discards the unfinished ones).
- TP: 2 all-reduces per layer (+1 for the vocabulary-parallel embedding) of num_tokens x hidden
  activations and a gather of the logits, by the ring formula of nccl-tests' doc/PERFORMANCE.md over the intra-node
  interconnect: 2(n-1)/n x S/B + 2(n-1) x alpha. They sit on the critical path (vLLM does not
  overlap them). With `sequence_parallel_moe` (expert parallelism with DP > 1) each MoE layer's
  all-reduce becomes an all-gather, (n-1)/n x S/B + (n-1) x alpha. A calibrated model adds to
  each the ranks' skew (`compute.collective_skew_s`: every rank waits for the last, sigma x
  E[max of n standard normals] past the mean), which a collective measured alone does not hold.
- PP: a sequential estimate without micro-batching: the step takes the sum of all stage times plus
  (pp - 1) hops sending hidden states and residual (intra-node interconnect, or the declared
  inter-node bandwidth for hops between nodes). vLLM overlaps pp batches; a caller simulating that
  should divide throughput accordingly.
- Overheads: a fixed per-step CPU time not hidden by async scheduling, plus, for steps outside
  full CUDA graphs (anything but decode-only batches up to cuda_graph_max_num_tokens), a
  per-layer launch time that overlaps GPU work and shows only when longer.

Expert parallelism (experts whole on DP x TP GPUs, DP ranks in lock-step, all-to-all dispatch
and combine) is modelled on top of this one in `simcore.compute.expert_parallel`; its ranks use
`op_bounds(..., routed_experts=False)`, `comm_s` and `assemble` from here.

Speculative decoding: a verification (a decode carrying its drafts, `StepShape.num_spec_tokens`)
is a decode with several query tokens: its KV read once, every query's pairs counted, MLA's
absorbed form for all of them; a batch of decodes and verifications runs as a full CUDA graph
as a decode-only batch does. The drafter's own forwards are timed by
`simcore.compute.speculative`.

Not modelled: micro-batch overlap, prefix-cache copy costs, wave quantization and tile effects of
small GEMMs, kernel fusion beyond the counts above, power/clock throttling, multi-node TP. The
result is a reference estimate with a declared uncertainty (`relative_uncertainty`), not a
calibrated profile.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import lru_cache

from simcore.compute.assumptions import RooflineAssumptions
from simcore.compute.attention_views import prefill_prompts_factor, windowed_attention
from simcore.compute.base import OP_CLASSES, StepShape, StepTime, check_op_scale
from simcore.compute.decode_steps import BOUNDS, bound_of, decode_step, decode_step_time
from simcore.errors import ConfigError
from simcore.hardware import GpuSpec
from simcore.host import HostOverheads
from simcore.model.arch import Gemm, ModelArch, dtype_bytes, linear_dtype

_LOGIT_BYTES = 4
"""Logits are fp32 once the LM head has produced them."""

OP_NAMES = ("attention", "mlp", "moe", "elementwise", "lm_head")
"""The ops `RooflineModel.op_bounds(by_op=...)` splits a step into: attention (QKV/output
projections, MLA up-projections, the attention kernel), mlp (dense MLP layers), moe (router,
shared and routed experts), elementwise (norms, rotary, activations, residuals, embedding) and
lm_head (LM head and sampler)."""

_GROUP_OP = {"attn": "attention", "mlp": "mlp", "shared_expert": "moe", "router": "moe"}


@lru_cache(maxsize=None)
def expected_max_of_normals(n: int) -> float:
    """E[max of `n` independent standard normals] (0 for one; 0.564 for two, 1.029 for four,
    1.424 for eight): how far past the mean the last of `n` ranks arrives at a barrier, in
    standard deviations of their arrival times. By the trapezoidal rule over +/-10 sigma of
    n x phi(x) x Phi(x)^(n-1) x x."""
    if n <= 1:
        return 0.0
    xs = [i / 1000.0 for i in range(-10000, 10001)]
    vals = [x * n * math.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
            * (0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))) ** (n - 1) for x in xs]
    return (sum(vals) - 0.5 * (vals[0] + vals[-1])) / 1000.0


def _bound(compute_bound: float, memory_bound: float, comm: float) -> str:
    """What a step's time is bound by: the largest of its three sums (compute on ties with
    memory)."""
    return BOUNDS[bound_of(compute_bound, memory_bound, comm)]


class RooflineModel:
    """StepTimeModel from FLOPs and bytes against one GPU's peaks; immutable after construction.

    All per-op coefficients are computed in __init__; `step_time` is a few dozen float
    operations (it runs once per simulated step).
    """

    __slots__ = (
        "profile_id", "profile_version", "calibrated", "relative_uncertainty", "arch", "gpu", "tp", "pp",
        "weight_dtype", "kv_cache_dtype", "assumptions",
        "_token_gemms", "_token_gemm_ops", "_token_gemm_groups", "_token_gemm_meas",
        "_ew_meas", "_ar_meas", "_gather_meas", "_smp_meas", "_attn_meas", "_moe_meas",
        "_lm_meas", "_e_num", "_e_ln_miss",
        "_e_flop_s_per_token", "_e_byte_s_per_expert",
        "_e_byte_s_per_token", "_e_floor_s",
        "_kvb_flop_s_per_row", "_kvb_byte_s_fixed", "_kvb_byte_s_per_row", "_kvb_floor_s",
        "_mla", "_attn_flop_s_per_pair", "_attn_flop_s_per_decode_pair", "_attn_byte_s_per_kv",
        "_attn_byte_s_per_token", "_attn_floor_s", "_window", "_win_flop_s_per_pair",
        "_win_byte_s_per_kv",
        "_ew_byte_s_per_token", "_ew_floor_s",
        "_lm_flop_s_per_row", "_lm_byte_s_fixed", "_lm_byte_s_per_row", "_lm_floor_s",
        "_smp_byte_s_per_row", "_smp_floor_s",
        "_ar_s_per_token", "_ar_latency_s", "_gather_s_per_row", "_gather_latency_s",
        "_pp_s_per_token", "_pp_latency_s", "_pp_hop_s_per_byte",
        "_step_overhead_s", "_eager_launch_s", "_graph_max_tokens", "op_scale", "host",
        "_linear_cache", "_cscale", "_attn_decode", "_decode_timers", "_triton_context",
        "_ar_skew_s", "_skew_per_collective_s", "_graphless_ar_scale",
    )

    def __init__(self, arch: ModelArch, gpu: GpuSpec, *, tp: int = 1, pp: int = 1,
                 weight_dtype: str = "bf16", kv_cache_dtype: str = "bf16",
                 assumptions: RooflineAssumptions | None = None,
                 sequence_parallel_moe: bool = False, multi_node_tp: bool = False,
                 op_scale: dict[str, float] | None = None, host=None,
                 compute_bound_scale: float = 1.0, collective_skew_s: float = 0.0,
                 graphless_collective_scale: float = 1.0) -> None:
        a = assumptions or RooflineAssumptions()
        arch.check_tp(tp)
        if tp > gpu.gpus_per_node and not multi_node_tp:
            raise ConfigError(f"tensor_parallel_size {tp} exceeds the {gpu.gpus_per_node} GPUs of "
                              f"a {gpu.name} node; the roofline models TP within one node")
        if not 1 <= pp <= arch.num_layers:
            raise ConfigError(f"pipeline_parallel_size {pp} must be between 1 and the model's "
                              f"{arch.num_layers} layers")
        self.arch, self.gpu, self.tp, self.pp = arch, gpu, tp, pp
        # TP across nodes (a cluster run) leaves its collectives to the step DAG over the fabric;
        # comm_s then prices them as if inside a node and is only a reference.
        self.weight_dtype, self.kv_cache_dtype, self.assumptions = weight_dtype, kv_cache_dtype, a
        self.profile_id = f"roofline/{gpu.name}/{weight_dtype}"
        self.profile_version = "reference"
        self.calibrated = False
        self.relative_uncertainty = a.relative_uncertainty

        # Linear layers other than routed experts: an expert-only format keeps them bf16.
        lin = linear_dtype(weight_dtype)
        wb = dtype_bytes(lin)
        hb = max(wb, 2.0)  # embeddings, LM head, routers stay 16-bit in quantized checkpoints
        ab = hb            # activations are 16-bit
        kvb = dtype_bytes(kv_cache_dtype)
        f_gemm = gpu.flops_for(lin) * a.gemm_flops_fraction
        f_bf16 = gpu.bf16_flops * a.gemm_flops_fraction
        f_attn = gpu.bf16_flops * a.attention_flops_fraction
        bw = gpu.hbm_bandwidth_bytes_per_s * a.hbm_bandwidth_fraction
        kmin = a.min_kernel_s
        h = arch.hidden_size
        num_layers = arch.num_layers
        num_moe = arch.num_moe_layers()
        num_dense = num_layers - num_moe
        heads = arch.num_attention_heads // tp

        # Linear layers whose rows are the step's tokens: (flop s/token, fixed byte s,
        # byte s/token, floor s), one entry per group, summed over the layers that have it.
        groups: dict[str, list[float]] = {}

        def add(gemms: tuple[Gemm, ...], num: int, kernels: int, rate: float, wbytes: float,
                group: str) -> None:
            if num == 0 or not gemms:
                return
            params = sum(g.num_params for g in gemms)
            io = sum(g.in_features + g.out_features for g in gemms)
            acc = groups.setdefault(group, [0.0, 0.0, 0.0, 0.0])
            acc[0] += num * 2 * params / rate
            acc[1] += num * params * wbytes / bw
            acc[2] += num * io * ab / bw
            acc[3] += num * kernels * kmin

        attn_gemms = arch.attention_gemms(tp)
        add(tuple(g for g in attn_gemms if g.group == "attn"), num_layers,
            3 if arch.is_mla else 2, f_gemm, wb, "attn")
        dense_idx = next((i for i in range(num_layers) if not arch.is_moe_layer(i)), None)
        dense_mlp = arch.mlp_gemms(dense_idx, tp) if dense_idx is not None else ()
        add(dense_mlp, num_dense, 2, f_gemm, wb, "mlp")
        moe_idx = next((i for i in range(num_layers) if arch.is_moe_layer(i)), None)
        moe_mlp = arch.mlp_gemms(moe_idx, tp) if moe_idx is not None else ()
        add(tuple(g for g in moe_mlp if g.group == "shared_expert"), num_moe, 2, f_gemm, wb,
            "shared_expert")
        add(tuple(g for g in moe_mlp if g.group == "router"), num_moe, 1, f_bf16, hb, "router")
        self._token_gemms = tuple(tuple(v) for v in groups.values())
        self._token_gemm_ops = tuple(_GROUP_OP[g] for g in groups)
        self._token_gemm_groups = tuple(groups)
        # Measured replacements (a calibration profile, see CalibratedModel): per token-GEMM
        # group, the elementwise passes and the TP all-reduces, each a function of the step's
        # tokens; None where the roofline times the op.
        self._token_gemm_meas: tuple = (None,) * len(groups)
        self._ew_meas = None
        self._ar_meas = None
        self._gather_meas = None    # the logits all-gather, of the step's sequences
        # Measured kernels (a kernel profile, see KernelModel): the attention kernel of a step
        # (a function of its shape), the routed experts and the LM head GEMM (of its tokens and
        # of its sequences); each over all layers, None where the roofline times it.
        self._attn_meas = None
        self._moe_meas = None
        self._lm_meas = None
        self._smp_meas = None       # the sampler, of the step's sequences
        # The measured attention of decode-only steps of a batch size: `d -> (kv -> seconds)`,
        # the same floats as `_attn_meas` of such a step; None where `_attn_meas` has no such
        # form (the decode timers then call it with the step's shape).
        self._attn_decode = None
        self._decode_timers: dict = {}

        # Routed experts.
        experts = tuple(g for g in moe_mlp if g.group == "expert")
        if experts:
            k = arch.num_experts_per_tok
            e = arch.num_experts
            per_expert = sum(g.num_params for g in experts) / e
            io = sum(g.in_features + g.out_features for g in experts)
            self._e_num = float(e)
            self._e_ln_miss = math.log1p(-k / e) if k < e else -math.inf
            self._e_flop_s_per_token = num_moe * 2 * k * per_expert / f_gemm
            self._e_byte_s_per_expert = num_moe * per_expert * dtype_bytes(weight_dtype) / bw
            self._e_byte_s_per_token = num_moe * k * io * ab / bw
            self._e_floor_s = num_moe * 2 * kmin
        else:
            self._e_num = 0.0
            self._e_ln_miss = 0.0
            self._e_flop_s_per_token = self._e_byte_s_per_expert = 0.0
            self._e_byte_s_per_token = self._e_floor_s = 0.0

        # Attention (and MLA's latent up-projection, whose rows are KV tokens and decode tokens);
        # sliding-window layers' pairs and KV reads are those of the step's window view.
        self._mla = arch.is_mla
        num_sliding = arch.num_sliding_layers
        num_full = num_layers - num_sliding
        if arch.is_mla:
            kv_b = next(g for g in attn_gemms if g.group == "mla_kv_b")
            self._kvb_flop_s_per_row = num_layers * 2 * kv_b.num_params / f_gemm
            self._kvb_byte_s_fixed = num_layers * kv_b.num_params * wb / bw
            self._kvb_byte_s_per_row = num_layers * (kv_b.in_features + kv_b.out_features) * ab / bw
            self._kvb_floor_s = num_layers * 2 * kmin  # W_UK and W_UV batched GEMMs
            latent = arch.kv_lora_rank + arch.qk_rope_head_dim
            self._attn_flop_s_per_pair = (
                num_layers * 2 * heads * (arch.qk_head_dim + arch.v_head_dim) / f_attn)
            self._attn_flop_s_per_decode_pair = (
                num_layers * 2 * heads * (latent + arch.kv_lora_rank) / f_attn)
            q_and_out = heads * (arch.qk_head_dim + arch.v_head_dim)
        else:
            self._kvb_flop_s_per_row = self._kvb_byte_s_fixed = 0.0
            self._kvb_byte_s_per_row = self._kvb_floor_s = 0.0
            self._attn_flop_s_per_pair = num_full * 4 * heads * arch.head_dim / f_attn
            self._attn_flop_s_per_decode_pair = self._attn_flop_s_per_pair
            q_and_out = 2 * heads * arch.head_dim
        kv_token_bytes = arch.kv_elems_per_token_per_layer(tp) * kvb
        self._attn_byte_s_per_kv = num_full * kv_token_bytes / bw
        self._window = arch.sliding_window if num_sliding else 0
        # A callable (batch, prompt tokens) -> factor on the full-attention layers' prefill
        # query-key pairs, where the attention kernel vLLM runs is timed as another's
        # (`simcore.calibration.triton_attention`); None: the pairs as they are.
        self._triton_context = None
        self._win_flop_s_per_pair = num_sliding * 4 * heads * arch.head_dim / f_attn
        self._win_byte_s_per_kv = num_sliding * kv_token_bytes / bw
        # New KV written once per token, queries read and outputs written.
        self._attn_byte_s_per_token = num_layers * (kv_token_bytes + q_and_out * ab) / bw
        self._attn_floor_s = num_layers * (2 if arch.is_mla else 1) * kmin  # FlashMLA: + combine

        # Elementwise passes (memory-bound): two fused add+RMSNorms (read x and residual, write
        # both), rotary embedding on q and k, the MLP activation, MoE routing and combine.
        rope_elems = (heads * arch.qk_rope_head_dim + arch.qk_rope_head_dim if arch.is_mla
                      else (heads + arch.kv_heads_per_gpu(tp)) * arch.head_dim)
        per_layer = 8 * h + 2 * rope_elems
        if arch.is_mla:
            per_layer += 2 * (arch.q_lora_rank + arch.kv_lora_rank)
        ew_bytes = num_layers * per_layer * ab
        kernels = num_layers * (7 if arch.is_mla else 5)
        if num_dense:
            ew_bytes += num_dense * 3 * (arch.intermediate_size // tp) * ab
        if num_moe:
            k = arch.num_experts_per_tok
            shared = arch.num_shared_experts * arch.shared_expert_intermediate_size // tp
            ew_bytes += num_moe * ab * (3 * k * (arch.moe_intermediate_size // tp)
                                        + (k + 1) * h + 3 * shared)
            ew_bytes += num_moe * 2 * arch.num_experts * _LOGIT_BYTES  # router logits, top-k
            kernels += num_moe * (5 if shared else 4)  # top-k, align, act, sum, shared act
        ew_bytes += 4 * h * ab  # embedding gather and final norm
        self._ew_byte_s_per_token = ew_bytes / bw
        self._ew_floor_s = (kernels + 2) * kmin

        # LM head and sampling, one row per scheduled request.
        vocab_shard = arch.vocab_size / tp
        self._lm_flop_s_per_row = 2 * h * vocab_shard / f_bf16
        self._lm_byte_s_fixed = h * vocab_shard * hb / bw
        self._lm_byte_s_per_row = (h * ab + vocab_shard * _LOGIT_BYTES) / bw
        self._lm_floor_s = kmin
        self._smp_byte_s_per_row = arch.vocab_size * a.sampler_hbm_bytes_per_logit / bw
        self._smp_floor_s = 5 * kmin

        # Communication.
        ic = gpu.interconnect_bandwidth_bytes_per_s * a.interconnect_bandwidth_fraction
        alpha = a.collective_hop_latency_s
        if tp > 1:
            num_ar = 2 * num_layers + 1
            if sequence_parallel_moe and num_moe:
                # vLLM's sequence-parallel MoE (expert parallelism with DP > 1 and TP > 1): each
                # TP rank sends its 1/tp slice of the tokens to the experts, and an all-gather
                # (half an all-reduce's bytes and hops) restores the activations after each MoE
                # layer instead of an all-reduce.
                halves = 2 * (num_ar - num_moe) + num_moe
                self._ar_s_per_token = halves * (tp - 1) / tp * h * ab / ic
                self._ar_latency_s = halves * (tp - 1) * alpha
            else:
                self._ar_s_per_token = num_ar * 2 * (tp - 1) / tp * h * ab / ic
                self._ar_latency_s = num_ar * 2 * (tp - 1) * alpha
            self._gather_s_per_row = (tp - 1) / tp * arch.vocab_size * ab / ic
            self._gather_latency_s = (tp - 1) * alpha
        else:
            num_ar = 0
            self._ar_s_per_token = self._ar_latency_s = 0.0
            self._gather_s_per_row = self._gather_latency_s = 0.0
        # The ranks' skew at each TP all-reduce (`compute.collective_skew_s`): every rank waits
        # there for the last to arrive, sigma x E[max of tp standard normals] past the mean. A
        # wait for the ranks, not link time: `op_scale`'s communication factor leaves it.
        self._skew_per_collective_s = (float(collective_skew_s) * expected_max_of_normals(tp)
                                       if num_ar else 0.0)
        self._ar_skew_s = num_ar * self._skew_per_collective_s
        # The all-reduces of a step not replayed as one full CUDA graph, against the collective
        # measured alone (`compute.graphless_collective_scale`).
        self._graphless_ar_scale = float(graphless_collective_scale) if num_ar else 1.0
        # Hop i (stage i to i + 1; stage s on node s // stages_per_node) leaves its node when
        # i + 1 is a multiple of stages_per_node.
        stages_per_node = max(1, gpu.gpus_per_node // tp)
        crosses = [(i + 1) % stages_per_node == 0 for i in range(pp - 1)]
        if pp > 1:
            cross_hops = sum(crosses)
            local_hops = pp - 1 - cross_hops
            hop_bytes = 2 * h * ab  # hidden states and residual
            self._pp_s_per_token = (local_hops * hop_bytes / ic
                                    + cross_hops * hop_bytes / a.inter_node_bandwidth_bytes_per_s)
            self._pp_latency_s = local_hops * alpha + cross_hops * a.inter_node_latency_s
        else:
            self._pp_s_per_token = self._pp_latency_s = 0.0
        self._pp_hop_s_per_byte = tuple(     # seconds per byte of each hop
            1.0 / a.inter_node_bandwidth_bytes_per_s if cross else 1.0 / ic for cross in crosses)

        self._step_overhead_s = a.step_overhead_s
        self._eager_launch_s = num_layers * a.eager_launch_s_per_layer
        self._graph_max_tokens = a.cuda_graph_max_num_tokens
        self._cscale = float(compute_bound_scale)
        """Multiplier on the time of every op on the compute bound (a calibrated model's
        `compute.compute_bound_scale`; 1 for the roofline)."""
        self._linear_cache: dict[int, tuple[float, float]] | None = None
        """`_linear_bounds` by token count (negative: without routed experts), made on the
        first step timed, once every coefficient and measured curve is set."""
        self.op_scale = check_op_scale(op_scale)
        if any(v != 1.0 for v in self.op_scale.values()):
            self._apply_scale(self.op_scale)
        # The CPU side (`simcore.host.HostConfig`): vLLM's engine and API server costs per step,
        # in place of the declared step_overhead_s; None keeps the declared constant.
        self.host = None if host is None else HostOverheads(
            host[0], async_scheduling=host[1], scale=self.op_scale["overhead"],
            endpoint=host[2] if len(host) > 2 else "completions")

    def _apply_scale(self, f: dict[str, float]) -> None:
        """Multiply every coefficient of each op class by its factor, so that each op's time
        (whichever bound or floor it takes) scales by exactly that factor."""
        self._token_gemms = tuple(tuple(x * f["gemm"] for x in g) for g in self._token_gemms)
        for names, op in (
                (("_e_flop_s_per_token", "_e_byte_s_per_expert", "_e_byte_s_per_token",
                  "_e_floor_s"), "moe"),
                (("_kvb_flop_s_per_row", "_kvb_byte_s_fixed", "_kvb_byte_s_per_row",
                  "_kvb_floor_s"), "gemm"),
                (("_attn_flop_s_per_pair", "_attn_flop_s_per_decode_pair",
                  "_attn_byte_s_per_kv", "_attn_byte_s_per_token", "_attn_floor_s",
                  "_win_flop_s_per_pair", "_win_byte_s_per_kv"), "attention"),
                (("_ew_byte_s_per_token", "_ew_floor_s"), "elementwise"),
                (("_lm_flop_s_per_row", "_lm_byte_s_fixed", "_lm_byte_s_per_row", "_lm_floor_s",
                  "_smp_byte_s_per_row", "_smp_floor_s"), "lm_head"),
                (("_ar_s_per_token", "_ar_latency_s", "_gather_s_per_row", "_gather_latency_s",
                  "_pp_s_per_token", "_pp_latency_s"), "communication"),
                (("_step_overhead_s", "_eager_launch_s"), "overhead")):
            for name in names:
                setattr(self, name, getattr(self, name) * f[op])
        self._pp_hop_s_per_byte = tuple(x * f["communication"] for x in self._pp_hop_s_per_byte)

    def assumption_lines(self) -> list[str]:
        """Where this model's step times come from, in plain words."""
        return [f"step times from the {self.profile_id} roofline (uncalibrated reference "
                f"profile, +/-{self.relative_uncertainty:.0%})"]

    def compute_scale_lines(self) -> list[str]:
        """The assumption lines of `compute.compute_bound_scale` and
        `compute.graphless_collective_scale` where they are not 1 and of
        `compute.collective_skew_s` where it adds time."""
        lines = []
        if self._cscale != 1.0:
            lines.append(f"compute-bound ops x{self._cscale:g}: the tensor cores' sustained "
                         "clock under serving load against the boost clock the kernels were "
                         "measured at (compute.compute_bound_scale; by default fitted on the "
                         "end-to-end validation set's fit part)")
        if self._graphless_ar_scale != 1.0:
            lines.append(f"TP all-reduces x{self._graphless_ar_scale:g} in steps not replayed as "
                         "one full CUDA graph (prefills, mixed and large batches), against the "
                         "collectives measured alone (compute.graphless_collective_scale; by "
                         "default fitted on the end-to-end validation set's fit part)")
        if self._ar_skew_s:
            lines.append(f"each TP all-reduce +{self._skew_per_collective_s * 1e6:.1f} us "
                         f"({self._ar_skew_s * 1e3:.2f} ms a step): the {self.tp} ranks' skew, "
                         "the last rank's arrival past the mean, which a collective measured "
                         "alone does not hold (compute.collective_skew_s; by default fitted on "
                         "the end-to-end validation set's fit part)")
        return lines

    def measured_share(self) -> float:
        """The share of a step's time that comes from measurements: none."""
        return 0.0

    def fallbacks(self) -> list[str]:
        """The parts of a step timed by reference assumptions rather than measurements."""
        return ["every op and collective: roofline reference (no calibration profile)"]

    def assumed_parts(self) -> list[str]:
        """Parts neither measured nor timed by the roofline: none (the roofline times all)."""
        return []

    def op_error_bounds(self) -> dict[str, float]:
        """Relative error bound of each op class (`OP_CLASSES`): the declared roofline bound for
        all of them."""
        return dict.fromkeys(OP_CLASSES, self.relative_uncertainty)

    def step_time(self, shape: StepShape) -> StepTime:
        """Modelled duration of one engine step of `shape` on this deployment. A decode-only
        step (every sequence decodes one token) is timed by its batch size's `decode_timer`."""
        t = shape.num_tokens
        if t <= 0:
            return StepTime(0.0, 0.0, 0.0, "compute")
        kv = shape.kv_tokens_read
        if (t == shape.num_decode_seqs == shape.num_seqs and not shape.num_spec_tokens
                and kv == shape.decode_kv_tokens == shape.attn_qk_pairs):
            timer = self._decode_timers.get(t)
            if timer is None:
                timer = self.decode_timer(t)
            return timer(kv)
        return self._step_time(shape)

    def decode_timer(self, num: int) -> Callable[[int], StepTime]:
        """`kv -> StepTime` of a decode-only step of `num` sequences that read `kv` KV tokens
        in all (`StepShape(num, num, num, kv, kv, kv)`): every part that depends on the batch
        size alone (the linear layers, LM head, sampler, collectives, CPU side) worked out once,
        the attention per call. The same floats as timing the shape op by op, in the same order
        (a test holds them equal); a quiet run times its steps with it. Kept per batch size."""
        timer = self._decode_timers.get(num)
        if timer is None:
            timer = self._decode_timers[num] = self._make_decode_timer(num)
        return timer

    def _make_decode_timer(self, num: int) -> Callable[[int], StepTime]:
        params = self.decode_params(num)
        if params is None:
            general = self._step_time
            return lambda kv: general(StepShape(num, num, num, float(kv), kv, kv))
        c, flat, ax1, g = params
        return lambda kv: decode_step_time(*decode_step(c, flat, ax1, g, kv))

    def decode_params(self, num: int) -> tuple | None:
        """What `simcore.compute.decode_steps.decode_step` times a decode-only step of `num`
        sequences from: its constants, and the generation-attention grid's table, length axis
        and reading at the batch size (empty without a measured attention); None where such a
        step is timed op by op (MLA, sliding windows, an attention measured otherwise)."""
        if self._mla or self._window or (self._attn_meas is not None
                                         and self._attn_decode is None):
            return None
        # op_bounds' parts at this batch size (a probe step has its shape): the linear
        # layers, the elementwise ops, LM head and sampler, and which bound each takes.
        probe = StepShape(num, num, num, float(num), num, num)
        t = s = num
        lin_c, lin_m = self._cached_linear(t, True)
        lm, lm_compute = self._lm_head_s(s)
        host = self.host
        engine = frontend = runner = 0.0
        if host is not None:
            engine = host.engine_s(s, t, num)
            frontend = host.frontend_s(num)
            runner = host.runner_s(s)
        flat, ax1, g, fa = (), (), (), 0.0
        if self._attn_meas is not None:
            gen, fa = self._attn_decode
            flat, ax1, g = gen.along_params(num)
        c = (lin_c, lin_m, probe.spec_qk_pairs, self._attn_flop_s_per_pair,
             self._attn_byte_s_per_kv, t * self._attn_byte_s_per_token, self._attn_floor_s,
             self._cscale, self._elementwise_s(t), lm, self._sampler_s(s), self.comm_s(probe),
             self._eager_launch_s, engine, frontend, runner, self._step_overhead_s, fa,
             float(num), float(self._attn_meas is not None), float(bool(lm_compute)),
             float(probe.runs_full_graph(self._graph_max_tokens)), float(host is not None),
             float(host is not None and host.async_scheduling))
        return c, flat, ax1, g

    def _step_time(self, shape: StepShape) -> StepTime:
        """`step_time` op by op, for any shape."""
        compute_bound, memory_bound = self.op_bounds(shape)
        full_graph = shape.runs_full_graph(self._graph_max_tokens)
        return self.assemble(compute_bound, memory_bound, self.comm_s(shape), full_graph,
                             shape=shape)

    def op_bounds(self, shape: StepShape, *, routed_experts: bool = True,
                  by_op: dict[str, float] | None = None) -> tuple[float, float]:
        """(compute-bound, memory-bound) seconds of every op of a step of `shape` (t > 0).

        Each op's roofline time is added to the sum of the bound that dominates it.
        `routed_experts=False` leaves the routed experts out (an expert-parallel group times
        them over all of its ranks' tokens). A shape with no sequences (a dummy batch) runs no
        attention, LM head or sampler. `by_op`, when given, receives the same seconds split by
        op (see `OP_NAMES`), summed over all layers; its values add up to the two bounds.
        """
        t = shape.num_tokens
        s = shape.num_seqs
        d = shape.num_decode_seqs
        kv = shape.kv_tokens_read
        sc = self._cscale
        if by_op is None:
            compute_bound, memory_bound = self._cached_linear(t, routed_experts)
        else:
            compute_bound, memory_bound = self._linear_bounds(t, routed_experts, by_op)

        if s:
            pairs = shape.attn_qk_pairs
            x = 0.0
            if self._mla:
                decode_kv = d * kv / s
                prefill_pairs = pairs - decode_kv if pairs > decode_kv else 0.0
                # Decode query tokens (drafts under verification included) use the absorbed form.
                rows = d + shape.num_spec_tokens + (kv - decode_kv)
                c = rows * self._kvb_flop_s_per_row
                m = self._kvb_byte_s_fixed + rows * self._kvb_byte_s_per_row
                if c >= m and c >= self._kvb_floor_s:
                    x = c * sc
                    compute_bound += x
                else:
                    x = m if m > self._kvb_floor_s else self._kvb_floor_s
                    memory_bound += x
                c = ((decode_kv + shape.spec_qk_pairs) * self._attn_flop_s_per_decode_pair
                     + prefill_pairs * self._attn_flop_s_per_pair)
            else:
                c = (pairs + shape.spec_qk_pairs) * self._attn_flop_s_per_pair
                tr = self._triton_context
                if tr is not None and s > d:
                    prefill = pairs - shape.decode_kv_tokens
                    if prefill > 0:
                        # Never under the FLOP time: a ratio under 1 (short prompts) is the
                        # measured kernels' fixed costs, which the roofline's floor stands for.
                        r = prefill_prompts_factor(tr, s - d, prefill)
                        if r > 1.0:
                            c += (r - 1.0) * prefill * self._attn_flop_s_per_pair
            m = kv * self._attn_byte_s_per_kv + t * self._attn_byte_s_per_token
            if self._window:
                win = windowed_attention(shape, self._window)
                c += (win.attn_qk_pairs + win.spec_qk_pairs) * self._win_flop_s_per_pair
                m += win.kv_tokens_read * self._win_byte_s_per_kv
            if self._attn_meas is not None:   # measured, on the bound the roofline names
                bound_is_compute = c >= m
                c = self._attn_meas(shape)
                if bound_is_compute:
                    c *= sc
                    compute_bound += c
                else:
                    memory_bound += c
            elif c >= m and c >= self._attn_floor_s:
                c *= sc
                compute_bound += c
            else:
                c = m if m > self._attn_floor_s else self._attn_floor_s
                memory_bound += c
            if by_op is not None:
                by_op["attention"] = by_op.get("attention", 0.0) + x + c

        m = self._elementwise_s(t)
        memory_bound += m
        if by_op is not None:
            by_op["elementwise"] = by_op.get("elementwise", 0.0) + m

        if s:
            x, on_compute = self._lm_head_s(s)
            if on_compute:
                compute_bound += x
            else:
                memory_bound += x
            m = self._sampler_s(s)
            memory_bound += m
            if by_op is not None:
                by_op["lm_head"] = by_op.get("lm_head", 0.0) + x + m
        return compute_bound, memory_bound

    def _cached_linear(self, t: int, routed_experts: bool) -> tuple[float, float]:
        """`_linear_bounds` of `t` tokens, kept by token count (the linear layers' and routed
        experts' sums depend on it alone)."""
        cache = self._linear_cache
        if cache is None:
            cache = self._linear_cache = {}
        key = t if routed_experts else -t
        linear = cache.get(key)
        if linear is None:
            linear = cache[key] = self._linear_bounds(t, routed_experts, None)
        return linear

    def _elementwise_s(self, t: int) -> float:
        """Seconds of the elementwise ops of a step of `t` tokens (memory-bound)."""
        if self._ew_meas is not None:
            return self._ew_meas(t)
        m = t * self._ew_byte_s_per_token
        return m if m > self._ew_floor_s else self._ew_floor_s

    def _lm_head_s(self, s: int) -> tuple[float, bool]:
        """(seconds, whether on the compute bound) of the LM head over `s` sequences."""
        c = s * self._lm_flop_s_per_row
        m = self._lm_byte_s_fixed + s * self._lm_byte_s_per_row
        if self._lm_meas is not None:
            x = self._lm_meas(s)
            return (x * self._cscale, True) if c >= m else (x, False)
        if c >= m and c >= self._lm_floor_s:
            return c * self._cscale, True
        return (m if m > self._lm_floor_s else self._lm_floor_s), False

    def _sampler_s(self, s: int) -> float:
        """Seconds of the sampler over `s` sequences (memory-bound)."""
        if self._smp_meas is not None:
            return self._smp_meas(s)
        m = s * self._smp_byte_s_per_row
        return m if m > self._smp_floor_s else self._smp_floor_s

    def _linear_bounds(self, t: int, routed_experts: bool,
                       by_op: dict[str, float] | None) -> tuple[float, float]:
        """(compute-bound, memory-bound) seconds of the linear layers and (with
        `routed_experts`) the routed experts of a step of `t` tokens, summed in `op_bounds`'s
        order; `by_op` as there."""
        compute_bound = 0.0
        memory_bound = 0.0
        sc = self._cscale
        for (flop_s, fixed_s, byte_s, floor_s), op, meas in zip(
                self._token_gemms, self._token_gemm_ops, self._token_gemm_meas):
            c = t * flop_s
            m = fixed_s + t * byte_s
            if meas is not None:       # a measured time, on the bound the roofline names
                x = meas(t)
                if c >= m:
                    x *= sc
                    compute_bound += x
                else:
                    memory_bound += x
            elif c >= m and c >= floor_s:
                x = c * sc
                compute_bound += x
            else:
                x = m if m > floor_s else floor_s
                memory_bound += x
            if by_op is not None:
                by_op[op] = by_op.get(op, 0.0) + x

        if routed_experts and self._e_num:
            active = self._e_num * (1.0 - math.exp(t * self._e_ln_miss))
            c = t * self._e_flop_s_per_token
            m = active * self._e_byte_s_per_expert + t * self._e_byte_s_per_token
            if self._moe_meas is not None:
                x = self._moe_meas(t)
                if c >= m:
                    x *= sc
                    compute_bound += x
                else:
                    memory_bound += x
            elif c >= m and c >= self._e_floor_s:
                x = c * sc
                compute_bound += x
            else:
                x = m if m > self._e_floor_s else self._e_floor_s
                memory_bound += x
            if by_op is not None:
                by_op["moe"] = by_op.get("moe", 0.0) + x
        return compute_bound, memory_bound

    def comm_s(self, shape: StepShape) -> float:
        """TP collectives and PP hops of a step of `shape`, seconds (on the critical path)."""
        t = shape.num_tokens
        s = shape.num_seqs
        ar = (self._ar_meas(t) if self._ar_meas is not None
              else t * self._ar_s_per_token + self._ar_latency_s)
        if self._graphless_ar_scale != 1.0 and not shape.is_dummy \
                and not shape.runs_full_graph(self._graph_max_tokens):
            # (A dummy batch, an idle DP rank's one-token forward, replays its graph.)
            ar *= self._graphless_ar_scale
        ar += self._ar_skew_s
        gather = (self._gather_meas(s) if self._gather_meas is not None and s
                  else s * self._gather_s_per_row + self._gather_latency_s)
        return (ar + gather
                + t * self._pp_s_per_token + self._pp_latency_s)

    def pp_extra_s(self, bytes_per_hop: Sequence[float]) -> float:
        """Seconds the pipeline's hops take to carry `bytes_per_hop[i]` more bytes from stage i
        to stage i + 1 (in the same message as the hidden states: no latency of their own), at
        each hop's link and the communication op scale."""
        return sum(b * x for b, x in zip(bytes_per_hop, self._pp_hop_s_per_byte))

    @property
    def cuda_graph_max_num_tokens(self) -> int:
        """Largest decode-only batch that runs as one full CUDA graph, tokens."""
        return self._graph_max_tokens

    def assemble(self, compute_bound: float, memory_bound: float, comm: float,
                 full_graph: bool, all_to_all_s: float = 0.0,
                 shape: StepShape | None = None,
                 group: Sequence[StepShape] | None = None) -> StepTime:
        """A StepTime from the op sums: launch time shows when longer than the GPU work outside
        full CUDA graphs; the CPU side is added (the host model's, given the step's `shape`, or
        the shapes of a lock-step `group`'s ranks, or the declared per-step overhead); the
        largest sum names the bound."""
        compute = compute_bound + memory_bound
        gpu = compute + comm
        busy = gpu if full_graph or gpu >= self._eager_launch_s else self._eager_launch_s
        if self.host is not None and shape is not None:
            total = self.host.step_total_s(busy, shape.num_seqs, shape.num_tokens,
                                           shape.num_decode_seqs)
        elif self.host is not None and group is not None:
            total = self.host.group_total_s(busy, group)
        else:
            total = busy + self._step_overhead_s
        return StepTime(total, compute, comm, _bound(compute_bound, memory_bound, comm),
                        total - gpu, all_to_all_s)
