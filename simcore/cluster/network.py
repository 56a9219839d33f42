"""The scale-out network of a GPU cluster: one NIC per GPU (and optional storage servers) as the
hosts of a leaf-spine or fat-tree fabric."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Literal, Union

from pydantic import Field, model_validator

from simcore.errors import ConfigError, Number, WholeNumber
from simcore.fabric.settings import (MAX_DELAY_S, MAX_RATE_GBPS, OVERSUBSCRIPTION_RANGE,
                                     Oversubscription, _Buffered, _Frozen)
from simcore.fabric.topology import (HOST, MAX_NODES, SWITCH, Topology, _Builder, check_rates,
                                     check_size, fat_tree_size)

DEFAULT_NODES_PER_LEAF = 4
MIN_NIC_GBPS = 1.0
"""Slowest NIC of a cluster, Gb/s: a server's KV caches (hundreds of MB) and collectives on a
slower one hold a serving run's requests for ever (a NIC of 10^-6 Gb/s filled 4 GB)."""
"""Whole nodes under one leaf without rails: 4 nodes of 8 GPUs fill the 32 downlinks of a 64-port
switch whose other 32 ports go up (a non-blocking ToR)."""


class ClusterLeafSpine(_Buffered):
    """A 2-tier Clos. With rails, NIC g of every node hangs off leaf g (the rail switch), so GPUs
    of equal local rank talk through one switch and traffic between rails crosses a spine (NVLink
    is not in this fabric, so there is no PXN relay). Without rails, whole nodes share a leaf
    (a ToR). Storage servers get a leaf of their own, joined to every spine like the others."""

    kind: Literal["leaf_spine"] = Field(description="Topology variant tag.")
    rails: bool = Field(True, description="Rail-optimized: NIC g of every node under leaf g. "
                        "false: nodes_per_leaf whole nodes under each leaf.")
    nodes_per_leaf: WholeNumber | None = Field(
        None, ge=1, description="Whole nodes under each leaf; only with rails: false. The last "
        f"leaf may be partly filled. Default {DEFAULT_NODES_PER_LEAF}.")
    num_spines: WholeNumber | None = Field(
        None, ge=1, le=4096, description="Spine switches (at most 4,096). Default: enough for "
        "leaf uplinks at the NIC rate, ceil(NICs per leaf / oversubscription), as in a Clos of "
        "one switch model; none when the whole fabric is one leaf.")
    oversubscription: Oversubscription = Field(
        1.0, description=f"Downlink over uplink bandwidth of a leaf ({OVERSUBSCRIPTION_RANGE}): "
        "each leaf-spine link runs at NIC ports per leaf x NIC rate / (num_spines x "
        "oversubscription).")
    delay_s: Number = Field(
        1e-6, gt=0, le=MAX_DELAY_S, description="Propagation delay of every link, seconds.")

    @model_validator(mode="after")
    def _grouping(self) -> ClusterLeafSpine:
        if self.rails and self.nodes_per_leaf is not None:
            raise ValueError("nodes_per_leaf applies only with rails: false (a rail leaf holds "
                             "one NIC of every node)")
        return self


class ClusterFatTree(_Buffered):
    """A 3-tier k-ary fat-tree (full bisection bandwidth); NICs fill its host ports in GPU order,
    then the storage servers."""

    kind: Literal["fat_tree"] = Field(description="Topology variant tag.")
    k: WholeNumber | None = Field(
        None, ge=2, le=64, description="Switch radix (even, at most 64), for k^3/4 host ports. "
        "Default: the smallest even k with a port for every NIC.")
    delay_s: Number = Field(
        1e-6, gt=0, le=MAX_DELAY_S, description="Propagation delay of every link, seconds.")

    @model_validator(mode="after")
    def _even(self) -> ClusterFatTree:
        if self.k is not None and self.k % 2:
            raise ValueError(f"k must be even for a fat-tree, got {self.k}")
        return self


ClusterTopologyConfig = Annotated[Union[ClusterLeafSpine, ClusterFatTree],
                                  Field(discriminator="kind")]


class NetworkConfig(_Frozen):
    """The cluster's scale-out fabric: NIC rate, topology and storage servers (packet framing comes
    from the fabric settings)."""

    nic_gbps: Number = Field(
        400.0, ge=MIN_NIC_GBPS, le=MAX_RATE_GBPS, description="Rate of each GPU's NIC, Gb/s "
        "(ConnectX-7: 400; at least 1).")
    topology: ClusterTopologyConfig = Field(ClusterLeafSpine(kind="leaf_spine"),
                                            description="How the NICs are switched: leaf_spine "
                                            "(rail-optimized by default) or fat_tree.")
    num_storage_nodes: WholeNumber = Field(
        0, ge=0, le=4096, description="Storage servers of an external KV-cache tier on this "
        "fabric (at most 4,096); 0: none.")
    storage_nic_gbps: Number = Field(
        400.0, ge=MIN_NIC_GBPS, le=MAX_RATE_GBPS, description="NIC rate of each storage server, "
        "Gb/s (at least 1).")


@dataclass(frozen=True)
class ClusterNetwork:
    """The fabric of a cluster and where its GPUs and storage servers sit on it.

    GPU g (global index: node x gpus_per_node + local rank) sends and receives through its NIC,
    the fabric host `gpu_host[g]` (named `n{node}nic{local}`); storage server i is the host
    `storage_hosts[i]` (named `storage{i}`). Every one of these hosts reaches every other.
    """

    topology: Topology
    gpu_host: tuple[int, ...]
    storage_hosts: tuple[int, ...]
    num_nodes: int
    gpus_per_node: int

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node

    def node_of(self, gpu: int) -> int:
        """The node GPU `gpu` belongs to."""
        self._check(gpu)
        return gpu // self.gpus_per_node

    def host_of(self, gpu: int) -> int:
        """The fabric host (the NIC) of GPU `gpu`."""
        self._check(gpu)
        return self.gpu_host[gpu]

    def _check(self, gpu: int) -> None:
        if not 0 <= gpu < self.num_gpus:
            raise IndexError(f"GPU {gpu} is not in this cluster of {self.num_gpus} GPUs")


def build_cluster_network(cfg: NetworkConfig, num_nodes: int, gpus_per_node: int, *,
                          mtu_bytes: int = 4096, header_bytes: int = 62,
                          where: str = "cluster.network") -> ClusterNetwork:
    """The fabric for `num_nodes` servers of `gpus_per_node` GPUs (one NIC each) plus the
    configured storage servers, with the packet framing of the fabric settings (the RoCE
    profile's by default). Bad sizes raise ConfigError naming the field under `where`."""
    parent = where.rpartition(".")[0] or where
    for name, value in (("num_nodes", num_nodes), ("gpus_per_node", gpus_per_node)):
        if value < 1:
            raise ConfigError(f"{parent}.{name}: must be at least 1, got {value}")
    spec = cfg.topology
    _check_size(cfg, num_nodes, gpus_per_node, where)
    b = _Builder(f"cluster_{spec.kind}")
    match spec:
        case ClusterLeafSpine():
            gpu_host, storage = _leaf_spine(b, cfg, spec, num_nodes, gpus_per_node, mtu_bytes)
        case ClusterFatTree():
            gpu_host, storage = _fat_tree(b, cfg, spec, num_nodes, gpus_per_node, mtu_bytes,
                                          where)
        case _:
            raise AssertionError(f"unhandled cluster topology kind {spec.kind}")
    topology = b.build(mtu_bytes, header_bytes)
    check_rates(topology, f"{where}.topology: the {spec.kind} network")
    return ClusterNetwork(topology, tuple(gpu_host), tuple(storage), num_nodes, gpus_per_node)


def _check_size(cfg: NetworkConfig, num_nodes: int, gpus_per_node: int, where: str) -> None:
    """Refuse, before anything is built, a fabric past the simulator's bounds
    (`simcore.fabric.topology.check_size`): its NICs, then its switches and cables. `where`:
    the network section's place (its parent names the refusal)."""
    nics = num_nodes * gpus_per_node + cfg.num_storage_nodes
    nodes = cables = nics
    spec = cfg.topology
    if nics <= MAX_NODES:
        if isinstance(spec, ClusterLeafSpine):
            groups, _, _ = _leaves(cfg, spec, num_nodes, gpus_per_node)
            leaves = len(groups) + (1 if cfg.num_storage_nodes else 0)
            spines = leaf_spine_num_spines(cfg, num_nodes, gpus_per_node)
            nodes, cables = nics + leaves + spines, nics + leaves * spines
        else:
            # Every switch of the radix, and a host (and its cable) only per NIC.
            k = _fat_tree_k(cfg, spec, num_nodes * gpus_per_node, where)
            switches, switch_cables = (n - k ** 3 // 4 for n in fat_tree_size(k))
            nodes, cables = nics + switches, nics + switch_cables
    parent = where.rpartition(".")[0] or where
    check_size(nodes, cables, f"{parent}: the network of {num_nodes:,} servers of "
                              f"{gpus_per_node:,} GPUs ({nics:,} NICs)")


def _nic_name(gpu: int, gpus_per_node: int) -> str:
    return f"n{gpu // gpus_per_node}nic{gpu % gpus_per_node}"


def _leaves(cfg: NetworkConfig, spec: ClusterLeafSpine, num_nodes: int,
            gpus_per_node: int) -> tuple[list[list[int]], list[str], int]:
    """groups[i]: the GPUs under compute leaf i, its name, and the NIC ports of one such leaf."""
    num_gpus = num_nodes * gpus_per_node
    if num_nodes == 1 and not cfg.num_storage_nodes:
        # One node's NICs under one leaf: a valid fabric its GPUs never need (NVLink joins them).
        return [list(range(num_gpus))], ["leaf0"], num_gpus
    if spec.rails:
        groups = [[n * gpus_per_node + g for n in range(num_nodes)]
                  for g in range(gpus_per_node)]
        return groups, [f"rail{g}" for g in range(gpus_per_node)], num_nodes
    per_leaf = spec.nodes_per_leaf or DEFAULT_NODES_PER_LEAF
    step = per_leaf * gpus_per_node
    groups = [list(range(s, min(s + step, num_gpus))) for s in range(0, num_gpus, step)]
    # A partly filled last leaf is the same switch with the same uplinks.
    ports = min(per_leaf, num_nodes) * gpus_per_node
    return groups, [f"leaf{i}" for i in range(len(groups))], ports


def leaf_spine_num_spines(cfg: NetworkConfig, num_nodes: int, gpus_per_node: int) -> int:
    """The spine switches of a leaf-spine network: `num_spines` when set, else enough for the
    leaf's ports at its oversubscription (0 with a single leaf)."""
    spec = cfg.topology
    groups, _, ports = _leaves(cfg, spec, num_nodes, gpus_per_node)
    num_leaves = len(groups) + (1 if cfg.num_storage_nodes else 0)
    if spec.num_spines is not None:
        return spec.num_spines
    if num_leaves > 1:
        return max(1, math.ceil(ports / spec.oversubscription))
    return 0


def _leaf_spine(b: _Builder, cfg: NetworkConfig, spec: ClusterLeafSpine, num_nodes: int,
                gpus_per_node: int, mtu_bytes: int) -> tuple[list[int], list[int]]:
    """Leaves of NICs (rails or whole nodes), a storage leaf, every leaf cabled to every spine."""
    nic_bps = cfg.nic_gbps * 1e9
    buffer = spec.buffer(mtu_bytes)
    num_gpus = num_nodes * gpus_per_node
    groups, names, ports = _leaves(cfg, spec, num_nodes, gpus_per_node)
    num_spines = leaf_spine_num_spines(cfg, num_nodes, gpus_per_node)
    spines = [b.node(f"spine{j}", SWITCH, 2) for j in range(num_spines)]

    def uplinks(leaf: int, leaf_bps: float) -> None:
        for s in spines:
            b.cable(leaf, s, leaf_bps / (num_spines * spec.oversubscription), spec.delay_s,
                    buffer)

    gpu_host = [0] * num_gpus
    for name, group in zip(names, groups):
        leaf = b.node(name, SWITCH, 1)
        for gpu in group:
            gpu_host[gpu] = b.node(_nic_name(gpu, gpus_per_node), HOST)
            b.cable(gpu_host[gpu], leaf, nic_bps, spec.delay_s, buffer)
        uplinks(leaf, ports * nic_bps)
    storage: list[int] = []
    if cfg.num_storage_nodes:
        storage_bps = cfg.storage_nic_gbps * 1e9
        leaf = b.node("storage_leaf", SWITCH, 1)
        for i in range(cfg.num_storage_nodes):
            storage.append(b.node(f"storage{i}", HOST))
            b.cable(storage[-1], leaf, storage_bps, spec.delay_s, buffer)
        uplinks(leaf, cfg.num_storage_nodes * storage_bps)
    return gpu_host, storage


def _fat_tree_k(cfg: NetworkConfig, spec: ClusterFatTree, num_gpus: int, where: str) -> int:
    """The fat-tree's radix: `k` when set (refused with fewer host ports than NICs), else the
    smallest even k whose k^3/4 host ports take every NIC."""
    num_hosts = num_gpus + cfg.num_storage_nodes
    k = spec.k
    if k is None:
        k = 2
        while k ** 3 // 4 < num_hosts:
            k += 2
    elif k ** 3 // 4 < num_hosts:
        raise ConfigError(f"{where}.topology.k: a fat-tree of k={k} has {k ** 3 // 4} host "
                          f"ports, fewer than the {num_hosts} NICs ({num_gpus} GPUs + "
                          f"{cfg.num_storage_nodes} storage); raise k or leave it out")
    return k


def _fat_tree(b: _Builder, cfg: NetworkConfig, spec: ClusterFatTree, num_nodes: int,
              gpus_per_node: int, mtu_bytes: int, where: str) -> tuple[list[int], list[int]]:
    """A k-ary fat-tree whose host ports take the NICs in GPU order, then the storage servers;
    ports left over stay empty. Switch links run at the GPU NIC rate."""
    num_gpus = num_nodes * gpus_per_node
    k = _fat_tree_k(cfg, spec, num_gpus, where)
    nic_bps, storage_bps = cfg.nic_gbps * 1e9, cfg.storage_nic_gbps * 1e9
    buffer = spec.buffer(mtu_bytes)
    half = k // 2
    cores = [b.node(f"core{i}", SWITCH, 3) for i in range(half * half)]
    gpu_host: list[int] = []
    storage: list[int] = []
    for p in range(k):
        aggs = [b.node(f"agg{p}_{a}", SWITCH, 2) for a in range(half)]
        for a, agg in enumerate(aggs):
            for c in range(half):
                b.cable(agg, cores[a * half + c], nic_bps, spec.delay_s, buffer)
        for e in range(half):
            edge = b.node(f"edge{p}_{e}", SWITCH, 1)
            for agg in aggs:
                b.cable(edge, agg, nic_bps, spec.delay_s, buffer)
            for _ in range(half):
                if len(gpu_host) < num_gpus:
                    gpu_host.append(b.node(_nic_name(len(gpu_host), gpus_per_node), HOST))
                    b.cable(gpu_host[-1], edge, nic_bps, spec.delay_s, buffer)
                elif len(storage) < cfg.num_storage_nodes:
                    storage.append(b.node(f"storage{len(storage)}", HOST))
                    b.cable(storage[-1], edge, storage_bps, spec.delay_s, buffer)
    return gpu_host, storage
