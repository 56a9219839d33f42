"""The roofline's declared efficiency factors, latencies and overheads (`compute.roofline` of a
config), with where their defaults come from."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from simcore.errors import Number, WholeNumber


class RooflineAssumptions(BaseModel):
    """Declared efficiency factors, latencies and overheads of the roofline model (all overridable).

    Defaults: GEMM and bandwidth fractions match per-op timings of vLLM's kernels on A100/H100
    (Vidur's profiles: large bf16 GEMMs at ~65-75% of peak, single-token GEMMs at ~80-85% of peak
    HBM bandwidth); NCCL all-reduce bus bandwidth reaches ~75-80% of NVLink peak.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    gemm_flops_fraction: Number = Field(
        0.7, gt=0, le=1, description="Achieved fraction of peak FLOP/s in linear layers.")
    attention_flops_fraction: Number = Field(
        0.5, gt=0, le=1,
        description="Achieved fraction of the bf16 peak FLOP/s in attention kernels.")
    hbm_bandwidth_fraction: Number = Field(
        0.8, gt=0, le=1, description="Achieved fraction of peak HBM bandwidth.")
    interconnect_bandwidth_fraction: Number = Field(
        0.8, gt=0, le=1,
        description="Achieved fraction of the intra-node interconnect bandwidth in collectives.")
    collective_hop_latency_s: Number = Field(
        1.5e-6, ge=0, le=1e-2,
        description="Per-hop latency alpha of ring collectives and PP sends, s.")
    min_kernel_s: Number = Field(
        3e-6, ge=0, le=1e-2,
        description="Shortest duration of a GPU kernel inside a CUDA graph, s (small kernels "
                    "take ~1-6 us on A100/H100).")
    step_overhead_s: Number = Field(
        0.5e-3, ge=0, le=1.0,
        description="CPU time per step not hidden by async scheduling (input preparation, "
                    "sampler launch, output processing), s.")
    eager_launch_s_per_layer: Number = Field(
        20e-6, ge=0, le=1e-2,
        description="CPU time to launch one layer outside a full CUDA graph (piecewise graphs "
                    "plus eager attention), s; overlaps GPU work.")
    cuda_graph_max_num_tokens: WholeNumber = Field(
        512, ge=0, description="Largest decode-only batch run as a full CUDA graph, tokens.")
    sampler_hbm_bytes_per_logit: Number = Field(
        16.0, ge=0,
        description="HBM traffic of sampling per vocabulary entry of each sampled row, bytes "
                    "(fp32 logits read and written by temperature, softmax, top-k/top-p).")
    inter_node_bandwidth_bytes_per_s: Number = Field(
        50e9, gt=0,
        description="Per-GPU network bandwidth for PP hops and the expert-parallel all-to-all "
                    "between nodes, bytes/s (400 Gb/s NIC).")
    inter_node_latency_s: Number = Field(
        5e-6, ge=0, le=1.0,
        description="Latency of one PP hop, or of one all-to-all phase, between nodes, s.")
    relative_uncertainty: Number = Field(
        0.35, gt=0, lt=1,
        description="Declared symmetric bound on the relative error of a step time, a fraction "
                    "under 1 (0.35, not 35): an uncalibrated roofline is typically within "
                    "+/-35% of measured vLLM steps.")
