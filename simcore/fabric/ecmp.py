"""ECMP: a switch picks one of its equal-cost next hops by hashing the flow's 5-tuple with its salt."""

from __future__ import annotations

from simcore.fabric.topology import Topology

_MASK = (1 << 64) - 1
ROCE_UDP_PORT = 4791
"""RoCEv2's UDP destination port: part of every flow's 5-tuple."""


def mix64(x: int) -> int:
    """SplitMix64's finaliser: a fast, well-spread 64-bit hash of an integer (deterministic)."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def flow_hash(src: int, dst: int, src_port: int, dst_port: int = ROCE_UDP_PORT,
              proto: int = 17) -> int:
    """Hash of a flow's 5-tuple (hosts stand for their addresses)."""
    h = mix64(src)
    for v in (dst, src_port, dst_port, proto):
        h = mix64(h ^ v)
    return h


def source_port(flow_key: int) -> int:
    """The UDP source port a NIC gives a queue pair / flow (RoCEv2 varies it per QP for ECMP)."""
    return 49152 + mix64(flow_key) % 16384


def choose(topology: Topology, node: int, dst: int, fhash: int, salt: int) -> int:
    """The out-link `node` sends flow `fhash` on toward host `dst`."""
    hops = topology.hops(node, dst)
    if len(hops) == 1:
        return hops[0]
    return hops[mix64(fhash ^ salt) % len(hops)]


def path(topology: Topology, src: int, dst: int, fhash: int, salts: list[int]) -> list[int]:
    """The links a flow takes from host src to host dst, switch by switch (salts per node)."""
    links = []
    u = src
    while u != dst:
        li = choose(topology, u, dst, fhash, salts[u])
        links.append(li)
        u = topology.links[li].dst
    return links


def default_salts(topology: Topology, seed: int = 0) -> list[int]:
    """One salt per node, derived from the seed (so two switches do not polarise)."""
    return [mix64(seed * 1_000_003 + i) for i in range(len(topology.nodes))]
