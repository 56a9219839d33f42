"""From a validated config and its deployment to a cluster runtime: placement, network, fabric
backend and step-DAG builder, with impossible combinations refused in one sentence."""

from __future__ import annotations

import dataclasses

import numpy as np
import simpy

from simcore.cluster.network import build_cluster_network
from simcore.cluster.placement import place
from simcore.cluster.runtime import ClusterRuntime
from simcore.config import SimConfig
from simcore.dag.builder import StepDagBuilder
from simcore.dag.collectives import LinkCosts
from simcore.errors import ConfigError
from simcore.fabric.run import make_fabric
from simcore.model.arch import dtype_bytes
from simcore.setup import Deployment


def check_tenants_share_of_nics(tenants, nic_gbps: float) -> None:
    """Refuse tenants whose rates, at some time, add up past one NIC's rate, sent from it or to
    it (each alone within it, `build_cluster` checks): their messages would queue without end.
    A tenant sends from `start_s` until `stop_s` (the end of the run where null)."""
    for side in ("src_gpu", "dst_gpu"):
        by_nic: dict[int, list[int]] = {}
        for i, t in enumerate(tenants):
            by_nic.setdefault(getattr(t, side), []).append(i)
        for gpu, members in by_nic.items():
            if len(members) < 2:
                continue
            # Sweep the windows' ends in time order, stops before starts at the same instant.
            events = sorted([(tenants[i].start_s, 1, i) for i in members]
                            + [(tenants[i].stop_s, 0, i) for i in members
                               if tenants[i].stop_s is not None])
            active: list[int] = []
            for _, starts, i in events:
                if not starts:
                    active.remove(i)
                    continue
                active.append(i)
                total = sum(tenants[j].rate_gbps for j in active)
                if total > nic_gbps:
                    which = ", ".join(f"[{j}]" for j in sorted(active))
                    verb = "send from" if side == "src_gpu" else "send to"
                    raise ConfigError(f"cluster.tenant_traffic{which}: together they {verb} "
                                      f"GPU {gpu}'s NIC at {total:g} Gb/s, past its "
                                      f"{nic_gbps:g} (cluster.network.nic_gbps): their "
                                      f"messages would queue without end")


def build_cluster(env: simpy.Environment, cfg: SimConfig, dep: Deployment, *,
                  roles: dict[str, Deployment] | None = None) -> ClusterRuntime:
    """The runtime of `cfg.cluster` for deployment `dep` on clock `env`; with `roles` (prefill
    and decode instances of their own TP, `simcore.cluster.roles`) each role's instances are
    placed at, and step by the model of, that role's deployment."""
    c = cfg.cluster
    assert c is not None
    par = cfg.parallelism
    pd = par.prefill_decode
    per_role = roles is not None and pd is not None
    if per_role:
        from simcore.cluster.roles import check_layout
        placement = check_layout(cfg)
        # A role's expert-parallel group is modelled by its deployment.
        assert all(roles[inst.role].expert_parallel for g in placement.ep_groups
                   for inst in (placement.instances[i] for i in g))
    else:
        placement = place(num_nodes=c.num_nodes,
                          gpus_per_node=cfg.hardware.gpus_per_node or dep.gpu.gpus_per_node,
                          tp=par.tensor_parallel_size, pp=par.pipeline_parallel_size,
                          dp=par.data_parallel_size, expert_parallel=par.enable_expert_parallel,
                          num_replicas=par.num_replicas,
                          num_prefill=pd.num_prefill_instances if pd else 0,
                          num_decode=pd.num_decode_instances if pd else 0)
    gpn = placement.gpus_per_node
    num_gpus = c.num_nodes * gpn
    for i, t in enumerate(c.tenant_traffic):
        for name in ("src_gpu", "dst_gpu"):
            if getattr(t, name) >= num_gpus:
                raise ConfigError(f"cluster.tenant_traffic[{i}].{name}: GPU {getattr(t, name)} "
                                  f"is not in the cluster of {num_gpus} GPUs")
        if t.src_gpu // gpn == t.dst_gpu // gpn:
            raise ConfigError(f"cluster.tenant_traffic[{i}]: src_gpu and dst_gpu are on the same "
                              f"node; tenant traffic crosses the fabric between nodes")
        if t.rate_gbps > c.network.nic_gbps:
            raise ConfigError(f"cluster.tenant_traffic[{i}].rate_gbps: {t.rate_gbps:g} Gb/s is "
                              f"past its NIC's {c.network.nic_gbps:g} (cluster.network.nic_gbps): "
                              f"its messages would queue without end")
    check_tenants_share_of_nics(c.tenant_traffic, c.network.nic_gbps)
    settings = c.fabric.settings.model_copy(
        update={"sample_interval_s": c.fabric.utilization_interval_s})
    network = build_cluster_network(c.network, c.num_nodes, gpn, mtu_bytes=settings.mtu_bytes,
                                    header_bytes=settings.header_bytes)
    # Expert-parallel groups across nodes send a message per GPU and node pair in every
    # all-to-all: their steps run as jobs of the compiled analytical fabric (the same
    # results). A step of a few messages costs more set up as a job than sent one by one.
    insts = placement.instances
    across = any(placement.nodes_spanned(tuple(g for i in group for g in insts[i].all_gpus)) > 1
                 for group in placement.ep_groups)
    fabric = make_fabric(c.fabric.backend, network.topology, settings, seed=cfg.seed,
                         compiled=across)
    a = cfg.compute.roofline
    ic = dep.gpu.interconnect_bandwidth_bytes_per_s * a.interconnect_bandwidth_fraction
    # Each role's TP collectives run over its own GPU's intra-node interconnect.
    role_ic = {role: d.gpu.interconnect_bandwidth_bytes_per_s * a.interconnect_bandwidth_fraction
               for role, d in (roles or {}).items()}
    cc = c.dag.collectives
    costs = LinkCosts(a.collective_hop_latency_s if cc.intra_node_latency_s is None
                      else cc.intra_node_latency_s,
                      a.inter_node_latency_s if cc.inter_node_latency_s is None
                      else cc.inter_node_latency_s)
    ep_model = dep.step_model if dep.expert_parallel else None
    rank_model = ep_model.rank_model if ep_model is not None else dep.step_model
    builder = StepDagBuilder(arch=dep.arch, model=rank_model, placement=placement, cfg=c.dag,
                             interconnect_bytes_per_s=ic, costs=costs,
                             rng=np.random.default_rng([cfg.seed, 0xDA6]), ep_model=ep_model,
                             activation_bytes=max(2.0, dtype_bytes(dep.weight_dtype)))
    if per_role:
        from simcore.cluster.roles import RoleBuilders
        builder = RoleBuilders({
            role: StepDagBuilder(
                arch=d.arch, model=d.step_model.rank_model if d.expert_parallel else d.step_model,
                placement=dataclasses.replace(placement,
                                              tp=par.role_tensor_parallel_size(role)),
                cfg=c.dag, interconnect_bytes_per_s=role_ic[role], costs=costs,
                rng=np.random.default_rng([cfg.seed, 0xDA6, k]),
                ep_model=d.step_model if d.expert_parallel else None,
                activation_bytes=max(2.0, dtype_bytes(d.weight_dtype)))
            for k, (role, d) in enumerate(sorted(roles.items()))})
        rank_model = builder.model
    gpu_ic = None
    if per_role and len(set(role_ic.values())) > 1:
        by_gpu = {g: role_ic[inst.role] for inst in placement.instances for g in inst.all_gpus}
        node_ic = {placement.node_of(g): v for g, v in by_gpu.items()}
        gpu_ic = tuple(node_ic.get(placement.node_of(g), ic) for g in range(network.num_gpus))
    return ClusterRuntime(env, c, placement=placement, network=network, fabric=fabric,
                          builder=builder, model=rank_model, interconnect_bytes_per_s=ic,
                          host=rank_model.host, gpu_interconnect_bytes_per_s=gpu_ic)

