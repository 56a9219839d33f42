"""Routes computed per destination on first use: the same next hops as a search from every
host, none computed for idle hosts, and unreachable hosts still refused when the topology is
built."""

from collections import deque

import pytest

from simcore.cluster.network import build_cluster_network
from simcore.cluster.config import ClusterConfig
from simcore.errors import ConfigError
from simcore.fabric import ecmp
from simcore.fabric.topology import HOST, explicit, leaf_spine


def reference_next_hops(topo, dst):
    """An independent BFS: per node, its out-links one hop closer to host dst, through
    switches (and relaying hosts) only."""
    dist = {dst: 0}
    q = deque([dst])
    while q:
        v = q.popleft()
        for link in topo.links:
            if link.dst == v and link.src not in dist:
                dist[link.src] = dist[v] + 1
                node = topo.nodes[link.src]
                if node.kind != HOST or node.forwards:
                    q.append(link.src)
    out = {}
    for u in range(len(topo.nodes)):
        if u == dst or u not in dist:
            continue
        hops = tuple(li for li in topo.out_links[u]
                     if topo.links[li].dst in dist and dist[topo.links[li].dst] == dist[u] - 1)
        if hops:
            out[u] = hops
    return out


def test_routes_match_a_search_from_every_host():
    topo = leaf_spine(4, 4, 3, host_rate_bps=100e9, delay_s=1e-6, oversubscription=2.0)
    for dst in topo.hosts:
        ref = reference_next_hops(topo, dst)
        for u in range(len(topo.nodes)):
            if u in ref:
                assert topo.next_hops[u][dst] == ref[u]
                assert dst in topo.next_hops[u]
            else:
                assert topo.next_hops[u].get(dst) is None
                with pytest.raises(KeyError):
                    topo.next_hops[u][dst]


def test_an_idle_host_costs_no_routes():
    cfg = ClusterConfig.model_validate({"num_nodes": 512})
    net = build_cluster_network(cfg.network, 512, 8, mtu_bytes=4096, header_bytes=62)
    topo = net.topology
    assert len(topo.hosts) >= 4096
    assert topo._toward == {}                  # nothing routed yet
    a, b = net.host_of(0), net.host_of(4095)
    path = ecmp.path(topo, a, b, 12345, ecmp.default_salts(topo))
    assert topo.links[path[0]].src == a and topo.links[path[-1]].dst == b
    assert set(topo._toward) == {b}            # one destination's routes, no more


def test_a_host_that_cannot_reach_another_is_refused_when_built():
    nodes = [("h0", "host"), ("h1", "host"), ("s0", "switch"), ("s1", "switch")]
    cables = [{"a": "h0", "b": "s0", "rate_bps": 1e9, "delay_s": 1e-6},
              {"a": "h1", "b": "s1", "rate_bps": 1e9, "delay_s": 1e-6}]
    with pytest.raises(ConfigError, match="host h0 cannot reach h1"):
        explicit(nodes, cables)
    # Two hosts cabled to each other directly reach each other with no switch between.
    direct = explicit([("h0", "host"), ("h1", "host")],
                      [{"a": "h0", "b": "h1", "rate_bps": 1e9, "delay_s": 1e-6}])
    assert direct.shortest_paths(0, 1) == [[0]]
