"""The cluster network: one fabric host per GPU NIC (plus storage servers), rails under their own
leaf, spines between rails, oversubscribed uplinks, fat-tree sizing, and errors naming the
field."""

import pytest
from pydantic import ValidationError

from simcore.cluster.network import ClusterFatTree, ClusterLeafSpine, NetworkConfig, \
    build_cluster_network
from simcore.errors import ConfigError
from simcore.fabric.topology import HOST, SWITCH

GBPS = 1e9


def _net(num_nodes=4, gpus_per_node=8, mtu_bytes=4096, header_bytes=62, **cfg):
    return build_cluster_network(NetworkConfig.model_validate(cfg), num_nodes, gpus_per_node,
                                 mtu_bytes=mtu_bytes, header_bytes=header_bytes)


def _name(net, index):
    return net.topology.nodes[index].name


def _leaf_of(net, host):
    """The switch a host's only cable goes to."""
    (li,) = net.topology.out_links[host]
    return net.topology.links[li].dst


def _path_nodes(net, src, dst):
    """Every shortest path between two hosts, as node names."""
    t = net.topology
    return [[_name(net, src)] + [_name(net, t.links[li].dst) for li in path]
            for path in t.shortest_paths(src, dst)]


def _switches(net, prefix):
    return [nd.index for nd in net.topology.nodes
            if nd.kind == SWITCH and nd.name.startswith(prefix)]


# -- hosts -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("topology", [{"kind": "leaf_spine"},
                                      {"kind": "leaf_spine", "rails": False},
                                      {"kind": "fat_tree"}])
def test_one_host_per_nic_and_storage_server(topology):
    net = _net(3, 4, topology=topology, num_storage_nodes=2)
    hosts = net.topology.hosts
    assert len(hosts) == 3 * 4 + 2
    assert len(net.gpu_host) == 12 and len(net.storage_hosts) == 2
    # gpu_host is a bijection onto the NIC hosts; the storage hosts are the rest.
    assert len(set(net.gpu_host)) == 12
    assert set(net.gpu_host) | set(net.storage_hosts) == set(hosts)
    assert not set(net.gpu_host) & set(net.storage_hosts)
    for gpu in range(12):
        assert net.host_of(gpu) == net.gpu_host[gpu]
        assert net.node_of(gpu) == gpu // 4
        assert _name(net, net.host_of(gpu)) == f"n{gpu // 4}nic{gpu % 4}"
    assert [_name(net, h) for h in net.storage_hosts] == ["storage0", "storage1"]
    assert all(net.topology.nodes[h].kind == HOST for h in hosts)


def test_gpu_outside_the_cluster_is_an_index_error():
    net = _net(2, 2)
    with pytest.raises(IndexError, match="GPU 4 is not in this cluster of 4 GPUs"):
        net.host_of(4)
    with pytest.raises(IndexError):
        net.node_of(-1)


def test_topology_carries_the_framing():
    net = _net(mtu_bytes=9000, header_bytes=80)
    assert (net.topology.mtu_bytes, net.topology.header_bytes) == (9000, 80)


# -- rails -----------------------------------------------------------------------------------------

def test_nic_g_of_every_node_is_on_rail_g():
    net = _net(4, 8)
    rails = _switches(net, "rail")
    assert len(rails) == 8
    for gpu in range(32):
        assert _name(net, _leaf_of(net, net.host_of(gpu))) == f"rail{gpu % 8}"
    for r in rails:
        hosts_under = [li for li in net.topology.out_links[r]
                       if net.topology.nodes[net.topology.links[li].dst].kind == HOST]
        assert len(hosts_under) == 4


def test_same_rail_is_nic_leaf_nic_and_cross_rail_crosses_a_spine():
    net = _net(4, 8)
    # GPU 1 of node 0 and GPU 1 of node 3: one rail switch between them.
    assert _path_nodes(net, net.host_of(1), net.host_of(3 * 8 + 1)) == [
        ["n0nic1", "rail1", "n3nic1"]]
    # GPU 1 of node 0 to GPU 2 of node 3: up to any spine and down rail 2, four links.
    paths = _path_nodes(net, net.host_of(1), net.host_of(3 * 8 + 2))
    spines = _switches(net, "spine")
    assert len(paths) == len(spines) > 1
    for p in paths:
        assert len(p) == 5
        assert p[:2] == ["n0nic1", "rail1"] and p[3:] == ["rail2", "n3nic2"]
        assert p[2].startswith("spine")


def test_next_hops_from_a_rail_spread_over_every_spine():
    net = _net(4, 8)
    t = net.topology
    rail0 = t.node_index("rail0")
    hops = t.next_hops[rail0][net.host_of(5)]
    assert sorted(_name(net, t.links[li].dst) for li in hops) == sorted(
        _name(net, s) for s in _switches(net, "spine"))


def test_default_spines_run_uplinks_at_the_nic_rate():
    net = _net(4, 8, nic_gbps=400)
    spines = _switches(net, "spine")
    assert len(spines) == 4                               # ceil(4 NICs per rail / 1.0)
    t = net.topology
    up = t.link(t.node_index("rail0"), spines[0])
    assert up.rate_bps == pytest.approx(400 * GBPS)
    assert t.link(spines[0], t.node_index("rail0")).rate_bps == pytest.approx(400 * GBPS)
    # Every rail is cabled to every spine.
    assert all(t.link(r, s) for r in _switches(net, "rail") for s in spines)


@pytest.mark.parametrize("oversubscription, num_spines, expected_gbps", [
    (2.0, 2, 16 * 400 / (2 * 2.0)),
    (4.0, 8, 16 * 400 / (8 * 4.0)),
    (1.0, 1, 16 * 400),
])
def test_oversubscription_sets_the_uplink_rate(oversubscription, num_spines, expected_gbps):
    net = _net(16, 8, topology={"kind": "leaf_spine", "oversubscription": oversubscription,
                                "num_spines": num_spines})
    t = net.topology
    spines = _switches(net, "spine")
    assert len(spines) == num_spines
    for r in _switches(net, "rail"):
        for s in spines:
            assert t.link(r, s).rate_bps == pytest.approx(expected_gbps * GBPS)
    # Downlink over uplink bandwidth of a rail is the oversubscription.
    rail = _switches(net, "rail")[0]
    up_total = sum(t.link(rail, s).rate_bps for s in spines)
    assert 16 * 400 * GBPS / up_total == pytest.approx(oversubscription)


def test_default_spine_count_follows_the_oversubscription():
    net = _net(16, 8, topology={"kind": "leaf_spine", "oversubscription": 3.0})
    assert len(_switches(net, "spine")) == 6              # ceil(16 / 3)
    t = net.topology
    assert t.link(t.node_index("rail0"), t.node_index("spine0")).rate_bps == pytest.approx(
        16 * 400 * GBPS / (6 * 3.0))


def test_one_rail_needs_no_spine():
    net = _net(4, 1)
    assert _switches(net, "spine") == []
    assert len(_switches(net, "rail")) == 1


# -- leaves of whole nodes -------------------------------------------------------------------------

def test_without_rails_whole_nodes_share_a_leaf():
    net = _net(8, 4, topology={"kind": "leaf_spine", "rails": False, "nodes_per_leaf": 2})
    leaves = _switches(net, "leaf")
    assert len(leaves) == 4
    for gpu in range(32):
        assert _name(net, _leaf_of(net, net.host_of(gpu))) == f"leaf{net.node_of(gpu) // 2}"
    # Nodes 0 and 1 share leaf0: NIC-leaf-NIC, even between different local ranks.
    assert _path_nodes(net, net.host_of(0), net.host_of(4 + 3)) == [["n0nic0", "leaf0", "n1nic3"]]
    # Nodes 0 and 2 do not: through a spine.
    paths = _path_nodes(net, net.host_of(0), net.host_of(2 * 4))
    assert paths and all(len(p) == 5 and p[2].startswith("spine") for p in paths)
    # Default spines: ceil(8 NICs per leaf / 1.0), each uplink at the NIC rate.
    spines = _switches(net, "spine")
    assert len(spines) == 8
    assert net.topology.link(leaves[0], spines[0]).rate_bps == pytest.approx(400 * GBPS)


def test_default_four_nodes_per_leaf_and_a_partly_filled_last_leaf():
    net = _net(6, 8, topology={"kind": "leaf_spine", "rails": False})
    leaves = _switches(net, "leaf")
    assert len(leaves) == 2
    counts = {}
    for gpu in range(48):
        leaf = _name(net, _leaf_of(net, net.host_of(gpu)))
        counts[leaf] = counts.get(leaf, 0) + 1
    assert counts == {"leaf0": 32, "leaf1": 16}
    # The partial leaf is the same switch: uplinks sized for its 32 ports.
    t = net.topology
    spines = _switches(net, "spine")
    assert len(spines) == 32
    assert t.link(leaves[1], spines[0]).rate_bps == t.link(leaves[0], spines[0]).rate_bps


# -- storage ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("topology", [{"kind": "leaf_spine"},
                                      {"kind": "leaf_spine", "rails": False},
                                      {"kind": "leaf_spine", "num_spines": 1},
                                      {"kind": "fat_tree"}])
def test_storage_reaches_every_gpu_and_back(topology):
    net = _net(3, 4, topology=topology, num_storage_nodes=3)
    t = net.topology
    for s in net.storage_hosts:
        for gpu in range(12):
            h = net.host_of(gpu)
            assert t.shortest_paths(s, h, limit=1) and t.shortest_paths(h, s, limit=1)
            assert h in t.next_hops[s] and s in t.next_hops[h]


def test_storage_servers_have_their_own_leaf_under_the_spines():
    net = _net(4, 8, num_storage_nodes=2, storage_nic_gbps=200)
    t = net.topology
    leaf = t.node_index("storage_leaf")
    for s in net.storage_hosts:
        assert _leaf_of(net, s) == leaf
        assert t.link(s, leaf).rate_bps == pytest.approx(200 * GBPS)
    spines = _switches(net, "spine")
    # Uplinks of the storage leaf from its own ports: 2 x 200 Gb/s over 4 spines.
    assert all(t.link(leaf, sp).rate_bps == pytest.approx(2 * 200 * GBPS / 4) for sp in spines)
    paths = _path_nodes(net, net.storage_hosts[0], net.host_of(0))
    assert len(paths) == len(spines)
    assert all(p[1] == "storage_leaf" and p[2].startswith("spine") and p[3] == "rail0"
               for p in paths)


# -- one node --------------------------------------------------------------------------------------

@pytest.mark.parametrize("topology", [{"kind": "leaf_spine"},
                                      {"kind": "leaf_spine", "rails": False}])
def test_a_single_node_has_its_nics_under_one_leaf(topology):
    net = _net(1, 8, topology=topology)
    t = net.topology
    switches = [nd for nd in t.nodes if nd.kind == SWITCH]
    assert [nd.name for nd in switches] == ["leaf0"]
    assert len(t.hosts) == 8
    assert {_leaf_of(net, net.host_of(g)) for g in range(8)} == {switches[0].index}
    assert _path_nodes(net, net.host_of(0), net.host_of(7)) == [["n0nic0", "leaf0", "n0nic7"]]


def test_a_single_node_with_storage_keeps_rails_and_spines():
    net = _net(1, 8, num_storage_nodes=1)
    assert len(_switches(net, "rail")) == 8
    assert len(_switches(net, "spine")) == 1
    assert len(net.topology.hosts) == 9


def test_a_single_gpu_cluster_is_valid():
    net = _net(1, 1)
    assert net.gpu_host == (net.topology.hosts[0],)


# -- fat-tree --------------------------------------------------------------------------------------

@pytest.mark.parametrize("num_hosts, k", [(1, 2), (2, 2), (3, 4), (16, 4), (17, 6), (54, 6),
                                          (55, 8), (128, 8)])
def test_fat_tree_default_k_is_the_smallest_that_fits(num_hosts, k):
    net = _net(num_hosts, 1, topology={"kind": "fat_tree"})
    t = net.topology
    assert len(_switches(net, "core")) == (k // 2) ** 2
    assert len(_switches(net, "edge")) == k * k // 2
    assert len(t.hosts) == num_hosts


def test_fat_tree_fills_host_ports_in_gpu_order_then_storage():
    net = _net(2, 4, topology={"kind": "fat_tree", "k": 4}, num_storage_nodes=2,
               storage_nic_gbps=100)
    t = net.topology
    # k=4: two host ports per edge switch, edges taken pod by pod.
    edges = [_name(net, _leaf_of(net, h)) for h in net.gpu_host + net.storage_hosts]
    assert edges == ["edge0_0", "edge0_0", "edge0_1", "edge0_1", "edge1_0", "edge1_0",
                     "edge1_1", "edge1_1", "edge2_0", "edge2_0"]
    s = net.storage_hosts[0]
    assert t.link(s, _leaf_of(net, s)).rate_bps == pytest.approx(100 * GBPS)
    assert t.link(t.node_index("edge0_0"), t.node_index("agg0_0")).rate_bps == pytest.approx(
        400 * GBPS)
    # GPUs in different pods: edge-agg-core-agg-edge, 6 links, over every (agg, core) choice.
    paths = t.shortest_paths(net.host_of(0), net.host_of(7))
    assert len(paths) == 4 and all(len(p) == 6 for p in paths)


def test_fat_tree_too_small_is_a_config_error_naming_k():
    with pytest.raises(ConfigError, match=r"^cluster\.network\.topology\.k: a fat-tree of k=4 "
                                          r"has 16 host ports, fewer than the 18 NICs"):
        _net(2, 8, topology={"kind": "fat_tree", "k": 4}, num_storage_nodes=2)


def test_uplinks_derived_past_the_fastest_link_are_refused():
    # 8 rails of 16 NICs at 50 Tb/s over one spine at oversubscription 0.01: 8 x 10^7 Gb/s
    # uplinks, which the packet kernel cannot frame; at oversubscription 1 they are 800 Tb/s.
    for over in (0.01, 1.0):
        with pytest.raises(ConfigError, match=r"^cluster\.network\.topology: the leaf_spine "
                                              r"network derives links of .* Gb/s"):
            _net(16, 8, nic_gbps=5e4, topology={"kind": "leaf_spine", "num_spines": 1,
                                                "oversubscription": over})
    # Spread over enough spines the same NICs fit.
    net = _net(16, 8, nic_gbps=5e4, topology={"kind": "leaf_spine"})
    assert max(link.rate_bps for link in net.topology.links) == 5e4 * GBPS
    # The refusal names the link: here a storage leaf of 4,096 servers over spines sized for a
    # rail of 2 NICs.
    with pytest.raises(ConfigError, match=r"storage_leaf to spine0\), past the most"):
        _net(2, 8, num_storage_nodes=4096)


def test_uplinks_derived_under_the_slowest_link_are_refused():
    # 1 Gb/s NICs, one spine, oversubscription 1,000: 4 NICs' uplink at 4 Mb/s fits, 1 at 1 Mb/s
    # fits, whole nodes of 1 GPU with a leaf each at 1/1,000 Gb/s is the least.
    _net(4, 1, nic_gbps=1, topology={"kind": "leaf_spine", "rails": False, "nodes_per_leaf": 1,
                                     "num_spines": 1, "oversubscription": 1000})
    with pytest.raises(ConfigError, match=r"derives links of 0\.0005 Gb/s .*under the least"):
        _net(4, 1, nic_gbps=1, topology={"kind": "leaf_spine", "rails": False,
                                         "nodes_per_leaf": 1, "num_spines": 2,
                                         "oversubscription": 1000})


@pytest.mark.parametrize("gpus_per_node, k, nodes", [(8, 64, 2 * 8 + 64 * 64 + 32 * 32),
                                                      (8, None, 2 * 8 + 4 * 4 + 2 * 2)])
def test_a_fat_tree_is_sized_by_the_hosts_it_builds(gpus_per_node, k, nodes):
    # An explicit k=64 builds a host per NIC only (its 65,536 host ports stay empty), so it is
    # not refused for 16 NICs.
    topology = {"kind": "fat_tree"} | ({"k": k} if k else {})
    net = _net(2, gpus_per_node, topology=topology)
    assert len(net.topology.nodes) == nodes


def test_a_fat_tree_past_the_node_bound_is_refused_before_it_is_built():
    # 1,024 servers of 64 GPUs: k = 64 takes the 65,536 NICs, with 5,120 switches past the bound.
    with pytest.raises(ConfigError, match=r"^cluster: the network of 1,024 servers of 64 GPUs "
                                          r"\(65,536 NICs\) comes to 70,656 nodes"):
        _net(1024, 64, topology={"kind": "fat_tree"})


def test_errors_name_the_place_given():
    with pytest.raises(ConfigError, match=r"^cluster\.prefill\.network\.topology\.k:"):
        build_cluster_network(NetworkConfig(topology=ClusterFatTree(kind="fat_tree", k=2)), 2,
                              8, where="cluster.prefill.network")
    with pytest.raises(ConfigError, match=r"^cluster\.num_nodes: must be at least 1, got 0"):
        build_cluster_network(NetworkConfig(), 0, 8)
    with pytest.raises(ConfigError, match=r"^cluster\.gpus_per_node: must be at least 1"):
        build_cluster_network(NetworkConfig(), 2, 0)


# -- buffers ---------------------------------------------------------------------------------------

def test_buffers_apply_to_every_link():
    net = _net(2, 2, mtu_bytes=4096, topology={"kind": "leaf_spine", "buffer_packets": 10})
    assert {lk.buffer_bytes for lk in net.topology.links} == {40960}
    net = _net(2, 2, topology={"kind": "fat_tree", "buffer_bytes": "1e6"})
    assert {lk.buffer_bytes for lk in net.topology.links} == {1_000_000}
    assert {lk.delay_s for lk in _net(2, 2).topology.links} == {1e-6}


# -- validation ------------------------------------------------------------------------------------

def test_defaults():
    cfg = NetworkConfig()
    assert cfg.nic_gbps == 400
    assert cfg.num_storage_nodes == 0
    assert cfg.topology == ClusterLeafSpine(kind="leaf_spine")
    assert cfg.topology.rails and cfg.topology.oversubscription == 1.0


def test_every_field_has_a_description():
    for model in (NetworkConfig, ClusterLeafSpine, ClusterFatTree):
        for name, info in model.model_fields.items():
            assert info.description, f"{model.__name__}.{name}"


def test_topology_kind_is_a_discriminated_union():
    cfg = NetworkConfig.model_validate({"topology": {"kind": "fat_tree", "k": 8}})
    assert isinstance(cfg.topology, ClusterFatTree) and cfg.topology.k == 8
    with pytest.raises(ValidationError, match="does not match any of the expected tags"):
        NetworkConfig.model_validate({"topology": {"kind": "torus"}})


@pytest.mark.parametrize("data, field, message", [
    ({"topology": {"kind": "leaf_spine", "nodes_per_leaf": 2}}, "topology.leaf_spine",
     "nodes_per_leaf applies only with rails: false"),
    ({"topology": {"kind": "leaf_spine", "rails": False, "nodes_per_leaf": 0}},
     "topology.leaf_spine.nodes_per_leaf", "greater than or equal to 1"),
    ({"topology": {"kind": "leaf_spine", "num_spines": 0}}, "topology.leaf_spine.num_spines",
     "greater than or equal to 1"),
    ({"topology": {"kind": "leaf_spine", "oversubscription": 0}},
     "topology.leaf_spine.oversubscription", "greater than or equal to 0.01"),
    ({"topology": {"kind": "leaf_spine", "num_spines": 10**8}}, "topology.leaf_spine.num_spines",
     "less than or equal to 4096"),
    ({"topology": {"kind": "fat_tree", "k": 2000}}, "topology.fat_tree.k",
     "less than or equal to 64"),
    ({"topology": {"kind": "leaf_spine", "buffer_bytes": 10, "buffer_packets": 2}},
     "topology.leaf_spine", "give buffer_bytes or buffer_packets, not both"),
    ({"topology": {"kind": "fat_tree", "k": 5}}, "topology.fat_tree", "k must be even"),
    ({"topology": {"kind": "fat_tree", "delay_s": 0}}, "topology.fat_tree.delay_s",
     "greater than 0"),
    ({"nic_gbps": 0}, "nic_gbps", "greater than or equal to 1"),
    ({"storage_nic_gbps": 1e-6}, "storage_nic_gbps", "greater than or equal to 1"),
    ({"topology": {"kind": "leaf_spine", "oversubscription": float("inf")}},
     "topology.leaf_spine.oversubscription", "less than or equal to 1000"),
    ({"num_storage_nodes": -1}, "num_storage_nodes", "greater than or equal to 0"),
    ({"nic_rate": 400}, "nic_rate", "Extra inputs are not permitted"),
])
def test_bad_values_are_validation_errors(data, field, message):
    with pytest.raises(ValidationError) as err:
        NetworkConfig.model_validate(data)
    first = err.value.errors()[0]
    assert ".".join(str(p) for p in first["loc"]) == field
    assert message in first["msg"]


def test_config_is_frozen():
    cfg = NetworkConfig()
    with pytest.raises(ValidationError):
        cfg.nic_gbps = 100
