"""The `cluster:` section of a simulation: nodes, their network and fabric backend, how each engine
step becomes a DAG over it, competing traffic, an external KV tier, and the trace window."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from simcore.cluster.network import NetworkConfig
from simcore.errors import Number, WholeNumber, away_from_default
from simcore.fabric.fidelity import (BACKENDS, MODEL, PACKET_ONLY_TOPOLOGY, backends_ignoring,
                                     changed_settings, off_feature_settings, unread_settings,
                                     unread_topology)
from simcore.fabric.settings import MAX_RATE_GBPS, MAX_TIME_S, FabricSettings

if TYPE_CHECKING:
    from simcore.config import ParallelismConfig

_FROZEN = ConfigDict(extra="forbid", frozen=True)

CLUSTER_UNREAD_SETTINGS = {
    "sample_interval_s": "a cluster result reports each link's busy fraction over the whole "
                         "run (link_utilization_mean, busiest_link), not a sampled series; "
                         "remove it",
    "queue_histogram_bin_bytes": "a cluster result reports the deepest queue, not a queue "
                                 "histogram; remove it",
    "link_disciplines": "a cluster's links are numbered by its builder, which the config does "
                        "not show; set settings.ecn.enabled for every link",
}
"""Fabric settings no backend reads in a cluster run, with what to do instead (refused)."""

FIDELITY_LINES = {backend: f"{backend} fabric: {MODEL[backend]}"
                  for backend in ("analytical", "flow")}
"""The assumption a cluster result states for a fabric backend without queues."""


MAX_CLUSTER_NODES = 1024
"""Most GPU servers a cluster section may have: a 4,096-server cluster's packet fabric alone took
13.6 GB to build and run 16 requests, and 10^12 servers ran the machine out of memory."""

class FabricConfig(BaseModel):
    """Which fabric backend carries the traffic between nodes, and its settings."""

    model_config = _FROZEN

    backend: Literal["analytical", "flow", "packet"] = Field(
        "analytical", description="analytical: messages serialised first come, first served on "
        "each link of their paths (no queueing dynamics beyond that); flow: max-min fair sharing "
        "of links; packet: packets through queues with ECMP, ECN, PFC and DCQCN.")
    settings: FabricSettings = Field(default_factory=FabricSettings, description="Protocol "
                                     "profile (roce, infiniband, slingshot), ECN, PFC, DCQCN, "
                                     "buffers and packet framing, as for `dse fabric`.")
    utilization_interval_s: Number = Field(
        1e-2, gt=0, allow_inf_nan=False, description="Interval at which the fabric samples link "
        "utilization over a serving run, s. A cluster result reports each link's busy fraction "
        "over the whole run, not the samples, so only this default is taken (another value is "
        "refused as having no effect).")

    @model_validator(mode="after")
    def _read_in_a_cluster(self) -> FabricConfig:
        for path in changed_settings(self.settings):
            why = CLUSTER_UNREAD_SETTINGS.get(path)
            if why is not None:
                raise ValueError(f"settings.{path} has no effect in a cluster run: {why}")
        if away_from_default(self, "utilization_interval_s"):
            raise ValueError("utilization_interval_s has no effect: a cluster result reports "
                             "each link's busy fraction over the whole run (link_utilization_mean, "
                             "busiest_link), not a sampled series; remove it")
        return self


class CollectiveConfig(BaseModel):
    """How collectives are lowered to transfers (NCCL-like automatic choice, or fixed)."""

    model_config = _FROZEN

    all_reduce: Literal["auto", "ring", "tree", "hierarchical"] = Field(
        "auto", description="auto: ring inside a node; across nodes the double binary tree up "
        "to tree_threshold_bytes, else hierarchical (intra-node reduce-scatter, inter-node ring, "
        "intra-node all-gather) when a node holds several ranks, else ring.")
    all_gather: Literal["auto", "ring", "hierarchical"] = Field(
        "auto", description="auto: ring inside a node or with one rank per node, else "
                            "hierarchical.")
    all_to_all: Literal["auto", "direct", "hierarchical"] = Field(
        "auto", description="auto: direct inside a node or with one rank per node, else "
        "hierarchical (DeepEP-style: one RDMA message per destination node to the GPU of the "
        "same local rank, then NVLink to the final GPU).")
    tree_threshold_bytes: WholeNumber = Field(
        256 * 1024, ge=0, description="Largest all-reduce that auto sends by tree across nodes, "
        "bytes.")
    chunks: WholeNumber = Field(
        1, ge=1, le=64, description="Pipelined chunks per ring or tree step.")
    intra_node_latency_s: Number | None = Field(
        None, ge=0, le=1.0, description="Latency per transfer over NVLink, s; default: the "
        "roofline's collective_hop_latency_s.")
    inter_node_latency_s: Number | None = Field(
        None, ge=0, le=1.0, description="Software latency per transfer across nodes (the fabric "
        "adds wire and switch time), s; default: the roofline's inter_node_latency_s.")


class MoeRoutingConfig(BaseModel):
    """How the tokens of a step pick their experts (seeded)."""

    model_config = _FROZEN

    popularity: Literal["uniform", "zipf"] = Field("uniform", description="uniform: every "
                                                   "expert equally likely; zipf: expert i "
                                                   "(in a seeded random order) has weight "
                                                   "1 / (i + 1)^zipf_exponent.")
    zipf_exponent: Number = Field(1.0, ge=0, description="Skew of the zipf popularity.")
    dispatch_bytes_per_element: Number = Field(
        2.0, gt=0, description="Bytes per hidden element sent by the dispatch all-to-all (2: "
        "bf16; about 1.03 for DeepEP's fp8 with scales).")
    combine_bytes_per_element: Number = Field(
        2.0, gt=0, description="Bytes per hidden element returned by the combine all-to-all "
        "(bf16).")


class DagConfig(BaseModel):
    """How an engine step becomes a DAG of compute and communication."""

    model_config = _FROZEN

    layer_groups: WholeNumber = Field(
        4, ge=1, description="Consecutive layers of a pipeline stage fused into one DAG layer "
        "(their compute and collectives summed): the stage is cut into this many groups (at most "
        "its layer count). More groups, finer interleaving of traffic, slower runs.")
    overlap: Literal["none", "comm_stream", "two_batch"] = Field(
        "none", description="none: collectives run on the compute stream (vLLM's default); "
        "comm_stream: communication on its own stream, overlapping independent compute; "
        "two_batch: the batch is split into two micro-batches whose compute and communication "
        "interleave (two-batch overlap), communication on its own stream.")
    pp_microbatches: WholeNumber = Field(
        1, ge=1, le=64, description="Micro-batches a step's batch is split into for the pipeline "
        "stages (1: stages run one after another per step; at most 64).")
    collectives: CollectiveConfig = Field(default_factory=CollectiveConfig,
                                          description="Collective algorithms.")
    moe_routing: MoeRoutingConfig = Field(default_factory=MoeRoutingConfig,
                                          description="Token-to-expert routing for expert "
                                                      "parallelism.")


MAX_TENANT_MESSAGES_PER_S = 100_000
"""Most messages a second of one tenant's traffic (100 Gb/s in messages of 128 KB): each is an
event of the serving run, and 4 KB messages at 100 Gb/s (3 million a second) never finished."""


class TenantTraffic(BaseModel):
    """Traffic of another tenant on the same fabric: messages from one NIC to another at a rate."""

    model_config = _FROZEN

    src_gpu: WholeNumber = Field(
        ge=0, description="Global GPU index whose NIC sends (node x gpus_per_node + local rank).")
    dst_gpu: WholeNumber = Field(ge=0, description="Global GPU index whose NIC receives.")
    rate_gbps: Number = Field(gt=0, le=MAX_RATE_GBPS, description="Offered load, Gb/s.")
    message_bytes: WholeNumber = Field(1 << 20, gt=0, description="Size of each message, bytes.")
    start_s: Number = Field(0.0, ge=0, le=MAX_TIME_S, description="First message, s.")
    stop_s: Number | None = Field(
        None, gt=0, le=MAX_TIME_S, description="No message after this time; default: until the "
        "serving run ends.")

    @model_validator(mode="after")
    def _bounded_message_rate(self) -> "TenantTraffic":
        if self.stop_s is not None and self.stop_s <= self.start_s:
            raise ValueError(f"stop_s ({self.stop_s:g}) must come after start_s "
                             f"({self.start_s:g}): the tenant would send nothing")
        per_s = self.rate_gbps * 1e9 / 8 / self.message_bytes
        if per_s > MAX_TENANT_MESSAGES_PER_S:
            raise ValueError(f"rate_gbps / message_bytes: {per_s:,.4g} messages a second, past "
                             f"the {MAX_TENANT_MESSAGES_PER_S:,} a tenant may send (each is an "
                             f"event of the run); send larger messages")
        return self


class KvTierConfig(BaseModel):
    """An external KV-cache tier on the storage nodes (vLLM's offloading KV connectors)."""

    model_config = _FROZEN

    capacity_tokens: WholeNumber = Field(
        gt=0, description="Tokens of KV cache the tier holds (LRU).")
    max_kvc_ready_requests: WholeNumber = Field(
        4, ge=1, description="Most requests per engine holding blocks for fetches at once, so "
        "fetches cannot starve running requests of memory.")
    min_fetch_blocks: WholeNumber = Field(
        1, ge=1, description="Smallest tier hit, in blocks, worth a fetch.")


class TraceConfig(BaseModel):
    """A Chrome/Perfetto trace of a window of steps."""

    model_config = _FROZEN

    first_step: WholeNumber = Field(
        0, ge=0, description="Index of the first traced step (counting every step of every engine "
        "in time order).")
    num_steps: WholeNumber = Field(0, ge=0, description="Steps to trace; 0: no trace.")


class ClusterConfig(BaseModel):
    """A cluster of nodes on a fabric: with it, every engine step runs as a DAG whose transfers
    cross the simulated network, so congestion lengthens steps and changes the next batch."""

    model_config = _FROZEN

    num_nodes: WholeNumber = Field(
        ge=1, le=MAX_CLUSTER_NODES, description="GPU servers (at most 1,024: twice the 512-server "
        "clusters the simulator is sized for).")
    network: NetworkConfig = Field(default_factory=NetworkConfig, description="NICs, topology "
                                   "and storage servers.")
    fabric: FabricConfig = Field(default_factory=FabricConfig, description="Fabric backend and "
                                 "protocol settings.")
    dag: DagConfig = Field(default_factory=DagConfig, description="Step DAG construction.")
    tenant_traffic: tuple[TenantTraffic, ...] = Field((), description="Competing traffic of "
                                                      "other tenants on the same fabric.")
    kv_tier: KvTierConfig | None = Field(None, description="External KV tier on the storage "
                                         "nodes; needs network.num_storage_nodes >= 1.")
    trace: TraceConfig = Field(default_factory=TraceConfig, description="Perfetto trace window.")

    @model_validator(mode="after")
    def _check(self) -> ClusterConfig:
        if self.kv_tier is not None and self.network.num_storage_nodes < 1:
            raise ValueError("kv_tier: an external KV tier needs storage servers; set "
                             "network.num_storage_nodes to at least 1")
        return self

    def unread_settings(self) -> list[str]:
        """The settings of this section, set away from their defaults, that its fabric backend
        does not read, as dotted config paths (e.g. cluster.fabric.settings.dcqcn.g)."""
        backend = self.fabric.backend
        out = [f"cluster.fabric.settings.{p}" for p in unread_settings(backend,
                                                                        self.fabric.settings)]
        out += [f"cluster.network.topology.{p}"
                for p in unread_topology(backend, self.network.topology)]
        return out

    def settings_without_effect(self, par: ParallelismConfig) -> list[tuple[str, str]]:
        """(path, why) of each setting of this section, set away from its default, that the
        engine's parallelism (`par`) or the rest of the section leaves with no effect: the
        expert-parallel settings of the step DAG without expert parallelism, pipeline
        micro-batches without pipeline stages, the tree threshold when all-reduces are not chosen
        automatically, the network of a one-node cluster without storage servers, and the storage
        servers' NIC rate without storage servers. (Storage servers without a KV tier stay
        allowed: the same network with and without the tier is a fair comparison.)"""
        dag, coll, net = self.dag, self.dag.collectives, self.network
        out = []
        if not any(par.role_expert_parallel(r) for r in ("prefill", "decode")):
            for name in away_from_default(dag, "moe_routing"):
                out.append((f"cluster.dag.{name}", "the routing of tokens to experts is drawn only "
                            "for expert-parallel groups (parallelism.enable_expert_parallel)"))
            for name in away_from_default(coll, "all_to_all"):
                out.append((f"cluster.dag.collectives.{name}", "only expert-parallel groups "
                            "(parallelism.enable_expert_parallel) run all-to-alls"))
        if par.pipeline_parallel_size == 1 and away_from_default(dag, "pp_microbatches"):
            out.append(("cluster.dag.pp_microbatches", "with pipeline_parallel_size 1 there are no "
                        "pipeline stages to split a batch over"))
        if coll.all_reduce != "auto" and away_from_default(coll, "tree_threshold_bytes"):
            out.append(("cluster.dag.collectives.tree_threshold_bytes",
                        f"it sets where all_reduce auto switches from tree to hierarchical; "
                        f"all_reduce is {coll.all_reduce}"))
        if self.num_nodes == 1 and net.num_storage_nodes == 0:
            topo = net.topology
            names = [n for n in type(topo).model_fields if n != "kind"]
            for name in away_from_default(net, "nic_gbps") + [
                    f"topology.{n}" for n in away_from_default(topo, *names)]:
                out.append((f"cluster.network.{name}", "a cluster of one node without storage "
                            "servers sends nothing over its network (its GPUs talk over NVLink)"))
        if net.num_storage_nodes == 0 and away_from_default(net, "storage_nic_gbps"):
            out.append(("cluster.network.storage_nic_gbps", "there are no storage servers "
                        "(network.num_storage_nodes 0)"))
        return out

    def assumption_lines(self) -> list[str]:
        """What a result of this section rests on at its fabric fidelity, in plain words, with
        the settings the fidelity ignored."""
        backend = self.fabric.backend
        lines = [FIDELITY_LINES.get(backend) or self._packet_line()]
        unread = self.unread_settings()
        if unread:
            lines.append(f"ignored at fidelity {backend} (no effect on this result): "
                         + ", ".join(unread))
        inert = [f"cluster.fabric.settings.{p}" for p in off_feature_settings(self.fabric.settings)
                 if f"cluster.fabric.settings.{p}" not in unread]
        if inert:
            lines.append("no effect on this result (their feature is off, or the fabric never "
                         "drops): " + ", ".join(inert))
        return lines

    def _packet_line(self) -> str:
        s = self.fabric.settings
        parts = ["ECN marking" if s.ecn.enabled else "drop-tail queues",
                 "PFC" if s.pfc.enabled else "credit flow control" if s.credit.enabled
                 else "lossy links with go-back-N",
                 "DCQCN" if s.dcqcn.enabled else "no congestion control",
                 "adaptive routing" if s.routing == "adaptive" else "ECMP"]
        return f"packet fabric ({s.profile} profile): packets through switch queues with " + \
            ", ".join(parts)


def backends_ignoring_path(path: str) -> tuple[str, ...]:
    """The fabric backends at which the config setting at dotted `path` has no effect in a
    cluster run, in BACKENDS order; () when every backend reads it (or it is not a cluster
    setting)."""
    settings = "cluster.fabric.settings."
    if path.startswith(settings):
        rest = path[len(settings):]
        if rest.split(".", 1)[0] in CLUSTER_UNREAD_SETTINGS:
            return BACKENDS
        return backends_ignoring(rest)
    topology = "cluster.network.topology."
    if path.startswith(topology) and path[len(topology):] in PACKET_ONLY_TOPOLOGY:
        return ("flow", "analytical")
    return ()


def why_ignored(path: str) -> str:
    """Why the setting at `path` has no effect where `backends_ignoring_path` says, in words."""
    settings = "cluster.fabric.settings."
    if path.startswith(settings):
        why = CLUSTER_UNREAD_SETTINGS.get(path[len(settings):].split(".", 1)[0])
        if why is not None:
            return why
    return "only the packet fabric reads it"
