"""Explanations that survive an intervention: each candidate limiting resource is relaxed by a
fixed factor, the configuration re-simulated, and the causes ranked by the measured effect.

An attribution score says which counter is high; whether relaxing that resource helps is a
different question, answered here by running it. For every candidate that applies to the
configuration (`candidates`), one more run with only that resource relaxed by `FACTOR` and
everything else, the seed included, unchanged (common random numbers):

| resource | relaxed as | applies |
|---|---|---|
| compute | GPU FLOP/s x2 (bf16 and fp8 peaks) | roofline step times |
| hbm_bandwidth | HBM bandwidth x2 | roofline step times |
| gpu_kernels | every measured kernel x1/2 (GEMM, attention, MoE, passes, LM head) | measured profiles |
| intra_node_communication | NVLink bandwidth x2 (roofline) or the measured collectives x1/2 | more than one GPU per replica |
| kv_capacity | twice the KV-cache blocks | always |
| max_num_seqs | x2 | always |
| token_budget | max_num_batched_tokens x2 | always |
| nic_rate | every NIC's rate x2, the leaf-spine links unchanged | cluster runs with more than one node |
| fabric_core | leaf-spine links x2 (spine count pinned, oversubscription /2), the NICs unchanged: congestion in the fabric's core | the same, on a leaf-spine |
| tenant_traffic | the competing tenant traffic removed: congestion from other jobs | a cluster with tenant traffic |
| cpu_side | the host's CPU twice as fast (host_speed x1/2) | host.model vllm |
| api_server | twice the API server processes | an API server |
| offered_load | half the request rate | a finite request rate |

The effect on each objective is its relative improvement in its direction ((base - new) / base
for a metric to minimise, (new - base) / base to maximise); a cause's score is the mean over the
objectives. Causes rank by score, highest first; the words come from the measured numbers.
`offered_load` is not a resource to buy but tells how much of the latency is the load itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dse.study import Objective
from simcore.config import SimConfig
from simcore.metric_catalog import tail_percentile

FACTOR = 2.0
"""How much each candidate is relaxed."""

DEFAULT_OBJECTIVES = (Objective(metric="p99_ttft_ms", direction="minimize"),
                      Objective(metric="p99_tpot_ms", direction="minimize"),
                      Objective(metric="output_throughput", direction="maximize"))
"""What `dse simulate --explain` measures effects on when it is not told (`default_objectives`
takes another tail percentile where a run does not report the 99th)."""


def default_objectives(result: Mapping[str, Any]) -> tuple[Objective, ...]:
    """`DEFAULT_OBJECTIVES` with the tail percentiles `result` carries: the 99th where it
    reports it, else the highest of its `metrics.percentiles`, else the mean."""
    def tail(fam: str) -> str:
        return tail_percentile(result, fam) or f"mean_{fam}_ms"

    return (Objective(metric=tail("ttft"), direction="minimize"),
            Objective(metric=tail("tpot"), direction="minimize"),
            Objective(metric="output_throughput", direction="maximize"))

LABELS = {
    "compute": "GPU compute (FLOP/s)", "hbm_bandwidth": "HBM bandwidth",
    "gpu_kernels": "GPU kernel speed", "intra_node_communication": "NVLink (intra-node collectives)",
    "kv_capacity": "KV-cache capacity", "max_num_seqs": "max_num_seqs",
    "token_budget": "token budget (max_num_batched_tokens)", "nic_rate": "NIC rate (fabric)",
    "fabric_core": "fabric congestion (leaf-spine core bandwidth)",
    "tenant_traffic": "fabric congestion (competing tenant traffic)",
    "cpu_side": "host CPU speed", "api_server": "API server processes",
    "offered_load": "offered load",
}


@dataclass(frozen=True)
class Relaxation:
    """One candidate: the changed config, the op-class scaling of the run, and in words."""

    resource: str
    change: str
    cfg: SimConfig
    op_scale: dict[str, float] | None = None


@dataclass(frozen=True)
class Effect:
    """A relaxed resource and what it did to each objective."""

    resource: str
    label: str
    change: str
    score: float
    improvements: dict[str, float]
    values: dict[str, float]

    def sentence(self) -> str:
        parts = ", ".join(f"{m} {_signed(self.values[m], self.improvements[m])}"
                          for m in self.improvements)
        return f"{self.change}: {parts}"

    def as_dict(self) -> dict:
        return {"resource": self.resource, "label": self.label, "change": self.change,
                "score": self.score, "improvements": self.improvements, "values": self.values}


def _signed(value: float, improvement: float) -> str:
    word = "better" if improvement > 0 else "worse" if improvement < 0 else "unchanged"
    return f"{value:,.4g} ({abs(improvement):.0%} {word})" if improvement else f"{value:,.4g} (unchanged)"


def candidates(cfg: SimConfig, base: dict) -> list[Relaxation]:
    """The relaxations that apply to `cfg` (see the module docstring); `base` is its result."""
    from simcore.setup import build_deployment

    dep = build_deployment(cfg)
    gpu = cfg.hardware.resolve()
    measured = base["provenance"]["calibrated"]
    out = []
    if measured:
        classes = ("gemm", "attention", "moe", "elementwise", "lm_head")
        out.append(Relaxation("gpu_kernels", "every measured GPU kernel twice as fast", cfg,
                              {c: 1 / FACTOR for c in classes}))
    else:
        flops = {"bf16_flops": gpu.bf16_flops * FACTOR}
        if gpu.fp8_flops is not None:
            flops["fp8_flops"] = gpu.fp8_flops * FACTOR
        out.append(Relaxation("compute", "twice the GPU's FLOP/s",
                              cfg.with_section("hardware", **flops)))
        out.append(Relaxation("hbm_bandwidth", "twice the HBM bandwidth", cfg.with_section(
            "hardware", hbm_bandwidth_bytes_per_s=gpu.hbm_bandwidth_bytes_per_s * FACTOR)))
    if dep.gpus_per_replica > 1:
        if measured:
            out.append(Relaxation("intra_node_communication", "collectives twice as fast", cfg,
                                  {"communication": 1 / FACTOR}))
        else:
            out.append(Relaxation("intra_node_communication", "twice the NVLink bandwidth",
                                  cfg.with_section("hardware", interconnect_bandwidth_bytes_per_s=(
                                      gpu.interconnect_bandwidth_bytes_per_s * FACTOR))))
    blocks = dep.num_blocks
    out.append(Relaxation("kv_capacity", f"twice the KV-cache blocks ({blocks:,} -> "
                          f"{blocks * 2:,})",
                          cfg.with_section("engine", num_gpu_blocks_override=blocks * 2)))
    seqs = dep.max_num_seqs
    out.append(Relaxation("max_num_seqs", f"max_num_seqs {seqs} -> {seqs * 2}",
                          cfg.with_section("engine", max_num_seqs=seqs * 2)))
    budget = dep.max_num_batched_tokens
    out.append(Relaxation("token_budget", f"max_num_batched_tokens {budget:,} -> {budget * 2:,}",
                          cfg.with_section("engine", max_num_batched_tokens=budget * 2)))
    if cfg.cluster is not None and cfg.cluster.num_nodes > 1:
        out += _fabric_relaxations(cfg, dep)
    if cfg.cluster is not None and cfg.cluster.tenant_traffic:
        n = len(cfg.cluster.tenant_traffic)
        quiet = cfg.cluster.model_copy(update={"tenant_traffic": ()})
        out.append(Relaxation("tenant_traffic", f"without the {n} competing tenant flow"
                              f"{'s' if n > 1 else ''}", cfg.model_copy(update={"cluster": quiet})))
    if cfg.host.model == "vllm":
        out.append(Relaxation("cpu_side", "a host CPU twice as fast",
                              cfg.with_section("host", host_speed=cfg.host.host_speed / FACTOR)))
    if cfg.host.api_server:
        n = cfg.host.api_server_count
        out.append(Relaxation("api_server", f"api_server_count {n} -> {n * 2}",
                              cfg.with_section("host", api_server_count=n * 2)))
    rate = cfg.workload.request_rate
    if math.isfinite(rate):  # a ramp-up or a trace's own timestamps leave it inf
        out.append(Relaxation("offered_load", f"request rate {rate:g} -> {rate / FACTOR:g} "
                              "req/s", cfg.with_section("workload", request_rate=rate / FACTOR)))
    return out


def _network(cfg: SimConfig, **update) -> SimConfig:
    net = cfg.cluster.network.model_copy(update=update)
    return cfg.model_copy(update={"cluster": cfg.cluster.model_copy(update={"network": net})})


def _fabric_relaxations(cfg: SimConfig, dep) -> list[Relaxation]:
    """The NICs twice as fast, and on a leaf-spine the leaf-spine links twice as fast, each
    with the other unchanged (a leaf-spine link's rate follows the NIC rate, the spine count
    and the oversubscription, so both pin the spine count and move the oversubscription)."""
    from simcore.cluster.network import leaf_spine_num_spines

    net = cfg.cluster.network
    nic = net.nic_gbps
    topo = net.topology
    gpn = cfg.hardware.gpus_per_node or dep.gpu.gpus_per_node
    spines = (leaf_spine_num_spines(net, cfg.cluster.num_nodes, gpn)
              if topo.kind == "leaf_spine" else 0)
    if not spines:  # a fat-tree, or a single leaf where every path is NIC - leaf - NIC
        return [Relaxation("nic_rate", f"NICs at {nic * FACTOR:g} Gb/s instead of {nic:g}",
                           _network(cfg, nic_gbps=nic * FACTOR))]
    over = topo.oversubscription
    return [
        Relaxation("nic_rate", f"NICs at {nic * FACTOR:g} Gb/s instead of {nic:g} (leaf-spine "
                   f"links unchanged)", _network(cfg, nic_gbps=nic * FACTOR, topology=(
                       topo.model_copy(update={"num_spines": spines,
                                               "oversubscription": over * FACTOR})))),
        Relaxation("fabric_core", "leaf-spine links twice as fast (NICs unchanged)",
                   _network(cfg, topology=topo.model_copy(update={
                       "num_spines": spines, "oversubscription": over / FACTOR}))),
    ]


def _improvement(o: Objective, base: float, new: float) -> float:
    if not base:
        return 0.0
    gain = (base - new) / abs(base) if o.direction == "minimize" else (new - base) / abs(base)
    return float(gain)


def counterfactuals(cfg: SimConfig, objectives: Sequence[Objective] = DEFAULT_OBJECTIVES, *,
                    base: dict | None = None, only: Sequence[str] | None = None,
                    metrics_of: Callable[[dict], dict] | None = None,
                    progress: Callable[[int, int], None] | None = None) -> list[Effect]:
    """Every applicable relaxation's measured effect on `objectives`, best first.

    `base` is `simulate(cfg)` when the caller has it; `only` keeps those resources;
    `metrics_of(result)` gives the metrics the objectives name (the result itself by default;
    a study passes its derived per-GPU and per-cost metrics)."""
    from simcore.simulate import simulate

    base = base if base is not None else simulate(cfg)
    plans = [p for p in candidates(cfg, base) if only is None or p.resource in only]
    measure = metrics_of or (lambda r: r)
    b = measure(base)
    effects = []
    for i, p in enumerate(plans):
        r = measure(simulate(p.cfg, op_scale=p.op_scale))
        imp = {o.metric: _improvement(o, float(b[o.metric]), float(r[o.metric]))
               for o in objectives}
        effects.append(Effect(resource=p.resource, label=LABELS[p.resource], change=p.change,
                              score=sum(imp.values()) / len(imp), improvements=imp,
                              values={o.metric: float(r[o.metric]) for o in objectives}))
        if progress is not None:
            progress(i + 1, len(plans))
    return sorted(effects, key=lambda e: (-e.score, e.resource))


def render_effects(effects: Sequence[Effect], objectives: Sequence[Objective],
                   base: dict) -> str:
    """The ranking in words, each line from its run's numbers."""
    now = ", ".join(f"{o.metric} {float(base[o.metric]):,.4g}" for o in objectives)
    lines = [f"Counterfactuals (each resource relaxed x{FACTOR:g}, re-simulated; now: {now}):"]
    for k, e in enumerate(effects, 1):
        lines.append(f"{k:2d}. {e.label} [{e.score:+.0%}]: {e.sentence()}")
    if effects:
        top = effects[0]
        if top.score <= 0.01:
            lines.append("No single resource, relaxed, improves the objectives by more than 1%.")
        else:
            lines.append(f"Limited first by {top.label}: {top.change} improves the objectives by "
                         f"{top.score:.0%} on average.")
    return "\n".join(lines)
