"""Network topologies as directed links between nodes, with equal-cost next hops toward every host.

Builders: `dumbbell`, `star`, `leaf_spine` (2-tier Clos with an oversubscription ratio),
`fat_tree` (3-tier k-ary), `rail_optimized` (GPU i of every node on rail i, with the intra-node
NVLink/NVSwitch domain as links) and `explicit` (nodes and links given one by one). Every cable
is two directed links; a link's egress queue lives at its source node.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from simcore.errors import ConfigError
from simcore.fabric.settings import MAX_RATE_GBPS, MIN_RATE_GBPS

HOST = "host"
SWITCH = "switch"


@dataclass(frozen=True, slots=True)
class Node:
    """A host (an endpoint that sends and receives: a server, a GPU, a NIC) or a switch."""

    index: int
    name: str
    kind: str                       # HOST or SWITCH
    tier: int = 0                   # 0 for hosts; 1 leaf / ToR, 2 spine / aggregation, 3 core
    forwards: bool = False          # a host that relays others' traffic (a GPU doing PXN)


@dataclass(frozen=True, slots=True)
class Link:
    """One direction of a cable: serialisation at `rate_bps`, then `delay_s` of propagation.

    `buffer_bytes` bounds the egress queue at `src` (None: unbounded). `kind` labels the medium
    ("fabric", "nvlink", "pcie", ...) for reports.
    """

    index: int
    src: int
    dst: int
    rate_bps: float
    delay_s: float
    buffer_bytes: int | None = None
    kind: str = "fabric"

    @property
    def rate_bytes_per_s(self) -> float:
        return self.rate_bps / 8


class _Routes:
    """`Topology.next_hops[node]`: a read-only mapping of host -> the node's equal-cost out-links
    toward it, each destination's routes computed on first use (`Topology.hops`)."""

    __slots__ = ("_topology", "_node")

    def __init__(self, topology: Topology, node: int) -> None:
        self._topology = topology
        self._node = node

    def __getitem__(self, dst: int) -> tuple[int, ...]:
        hops = self._topology.hops(self._node, dst)
        if not hops:
            raise KeyError(dst)
        return hops

    def get(self, dst: int, default=None):
        hops = self._topology.hops(self._node, dst) if dst in self._topology.host_set else ()
        return hops if hops else default

    def __contains__(self, dst: object) -> bool:
        return self.get(dst) is not None


class _NextHops:
    """`Topology.next_hops`: per node, its routes (`_Routes`)."""

    __slots__ = ("_topology",)

    def __init__(self, topology: Topology) -> None:
        self._topology = topology

    def __getitem__(self, node: int) -> _Routes:
        return _Routes(self._topology, node)

    def __len__(self) -> int:
        return len(self._topology.nodes)


@dataclass
class Topology:
    """Nodes, directed links and, per (node, destination host), the equal-cost next-hop links.

    Invariants: links come in pairs (u->v and v->u); every host can reach every other host;
    `next_hops[node][dst]` lists, in link-index order, the out-links of `node` on a shortest path
    (in hops) to host `dst`. The routes toward a host are computed the first time any node's are
    asked for (one breadth-first search), so a large fabric whose hosts are mostly idle costs
    only its nodes and links. MTU and header overhead are per topology (one fabric, one
    setting).
    """

    name: str
    nodes: list[Node]
    links: list[Link]
    mtu_bytes: int = 4096
    header_bytes: int = 48
    out_links: list[list[int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.nodes)
        self.out_links = [[] for _ in range(n)]
        self._in_links: list[list[int]] = [[] for _ in range(n)]
        for link in self.links:
            self.out_links[link.src].append(link.index)
            self._in_links[link.dst].append(link.index)
        self.host_set = frozenset(nd.index for nd in self.nodes if nd.kind == HOST)
        self._toward: dict[int, list[tuple[int, ...]]] = {}
        self._check_reachable()

    @property
    def hosts(self) -> list[int]:
        return [nd.index for nd in self.nodes if nd.kind == HOST]

    @property
    def next_hops(self) -> _NextHops:
        """`next_hops[node][dst]`: the out-links of `node` on a shortest path to host `dst`."""
        return _NextHops(self)

    def hops(self, node: int, dst: int) -> tuple[int, ...]:
        """The out-links of `node` on a shortest path (in hops) to host `dst`, in link-index
        order; () where there is none (node == dst, or dst unreachable from node)."""
        toward = self._toward.get(dst)
        if toward is None:
            if dst not in self.host_set:
                raise KeyError(dst)
            toward = self._toward[dst] = self._route_to(dst)
        return toward[node]

    def node_index(self, name: str) -> int:
        for nd in self.nodes:
            if nd.name == name:
                return nd.index
        raise ConfigError(f"topology {self.name}: no node named {name!r}")

    def link(self, src: int, dst: int) -> Link:
        """The (first) link from src to dst."""
        for li in self.out_links[src]:
            if self.links[li].dst == dst:
                return self.links[li]
        raise ConfigError(f"topology {self.name}: no link {self.nodes[src].name} -> "
                          f"{self.nodes[dst].name}")

    def _distances_to(self, dst: int) -> list[int]:
        """Hops from every node to host `dst` (-1: none): BFS over reversed links, through
        nodes that forward (switches, relaying hosts) only."""
        n = len(self.nodes)
        links, nodes, in_links = self.links, self.nodes, self._in_links
        dist = [-1] * n
        dist[dst] = 0
        q = deque([dst])
        while q:
            v = q.popleft()
            for li in in_links[v]:
                u = links[li].src
                if dist[u] < 0:
                    dist[u] = dist[v] + 1
                    # Hosts do not forward (unless they relay, as PXN GPUs do).
                    if nodes[u].kind != HOST or nodes[u].forwards:
                        q.append(u)
        return dist

    def _route_to(self, dst: int) -> list[tuple[int, ...]]:
        """Per node, its next hops toward host `dst`."""
        dist = self._distances_to(dst)
        links, out_links = self.links, self.out_links
        toward: list[tuple[int, ...]] = []
        for u, d in enumerate(dist):
            if u == dst or d < 0:
                toward.append(())
                continue
            toward.append(tuple(li for li in out_links[u] if dist[links[li].dst] == d - 1))
        return toward

    def _check_reachable(self) -> None:
        """ConfigError unless every host reaches every other host. Cheap when the nodes that
        forward, taken together, touch every host (every fabric the builders make): any two
        hosts then meet in that connected set. Otherwise each host is searched from."""
        nodes, links = self.nodes, self.links
        fwd = [nd.kind != HOST or nd.forwards for nd in nodes]
        parent = list(range(len(nodes)))

        def root(x: int) -> int:
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        for link in links:
            if fwd[link.src] and fwd[link.dst]:
                a, b = root(link.src), root(link.dst)
                if a != b:
                    parent[a] = b
        touching: set[int] | None = None
        for h in self.host_set:
            comps = {root(h)} if fwd[h] else set()
            comps.update(root(links[li].dst) for li in self.out_links[h] if fwd[links[li].dst])
            touching = comps if touching is None else touching & comps
            if not touching:
                break
        if touching or len(self.host_set) < 2:
            return
        dist = {d: self._distances_to(d) for d in self.hosts}
        for s in self.hosts:
            for d in self.hosts:
                if s != d and dist[d][s] < 0:
                    raise ConfigError(f"topology {self.name}: host {self.nodes[s].name} cannot "
                                      f"reach {self.nodes[d].name}")

    def shortest_paths(self, src: int, dst: int, limit: int = 64) -> list[list[int]]:
        """Up to `limit` equal-cost paths from host src to host dst, as lists of link indices."""
        paths: list[list[int]] = []

        def walk(u: int, acc: list[int]) -> None:
            if len(paths) >= limit:
                return
            if u == dst:
                paths.append(list(acc))
                return
            for li in self.hops(u, dst):
                acc.append(li)
                walk(self.links[li].dst, acc)
                acc.pop()

        walk(src, [])
        return paths


class _Builder:
    def __init__(self, name: str) -> None:
        self.name = name
        self.nodes: list[Node] = []
        self.links: list[Link] = []

    def node(self, name: str, kind: str, tier: int = 0, forwards: bool | None = None) -> int:
        fw = kind == SWITCH if forwards is None else forwards
        self.nodes.append(Node(len(self.nodes), name, kind, tier, fw))
        return len(self.nodes) - 1

    def cable(self, a: int, b: int, rate_bps: float, delay_s: float,
              buffer_bytes: int | None = None, kind: str = "fabric") -> None:
        for s, d in ((a, b), (b, a)):
            self.links.append(Link(len(self.links), s, d, rate_bps, delay_s, buffer_bytes, kind))

    def build(self, mtu_bytes: int, header_bytes: int) -> Topology:
        return Topology(self.name, self.nodes, self.links, mtu_bytes, header_bytes)


MAX_NODES = 65_536
"""Most nodes (hosts and switches) a fabric may have, and MAX_CABLES the most cables: sixteen
times a 512-server, 4,096-GPU rail-optimized fabric, past which building it alone would not fit
in memory or time (`check_size`, before a builder runs)."""
MAX_CABLES = 262_144


def check_size(nodes: int, cables: int, what: str) -> None:
    """Refuse `what` (naming its field and size) of `nodes` nodes and `cables` cables past
    MAX_NODES or MAX_CABLES."""
    if nodes > MAX_NODES or cables > MAX_CABLES:
        raise ConfigError(f"{what} comes to {nodes:,} nodes and {cables:,} cables, past the most "
                          f"the fabric simulator builds ({MAX_NODES:,} nodes, {MAX_CABLES:,} "
                          f"cables)")


def check_rates(topology: "Topology", what: str) -> None:
    """Refuse `what` (naming its field) when its builder derived a link faster than
    `simcore.fabric.settings.MAX_RATE_GBPS` (a leaf-spine's uplinks at a small oversubscription
    over few spines, or a storage leaf of many servers) or slower than `MIN_RATE_GBPS` (at a
    large oversubscription), as a rate given directly is refused; the message names the link."""
    if not topology.links:
        return
    slow = min(topology.links, key=lambda link: link.rate_bps)
    fast = max(topology.links, key=lambda link: link.rate_bps)
    for link, bad, bound in ((fast, fast.rate_bps / 1e9 > MAX_RATE_GBPS, "past the most"),
                             (slow, slow.rate_bps / 1e9 < MIN_RATE_GBPS, "under the least")):
        if bad:
            nodes = topology.nodes
            limit = MAX_RATE_GBPS if link is fast else MIN_RATE_GBPS
            raise ConfigError(
                f"{what} derives links of {link.rate_bps / 1e9:,.4g} Gb/s (from its rates, "
                f"oversubscription and port counts: {nodes[link.src].name} to "
                f"{nodes[link.dst].name}), {bound} the fabric simulator takes "
                f"({limit:,.4g} Gb/s)")


def fat_tree_size(k: int) -> tuple[int, int]:
    """(nodes, cables) of `fat_tree(k)`: k^3/4 hosts, k^2 edge and aggregation switches and
    (k/2)^2 cores; a cable per host and per switch-to-switch pair below the cores."""
    return k ** 3 // 4 + k * k + k * k // 4, 3 * k ** 3 // 4


def _check_positive(**kw: float) -> None:
    for k, v in kw.items():
        if v is None or v <= 0:
            raise ConfigError(f"topology.{k} must be positive, got {v!r}")


def dumbbell(num_left: int, num_right: int, *, rate_bps: float, delay_s: float,
             bottleneck_rate_bps: float | None = None, buffer_bytes: int | None = None,
             mtu_bytes: int = 1500, header_bytes: int = 52) -> Topology:
    """Left hosts -- switch L == bottleneck == switch R -- right hosts."""
    _check_positive(num_left=num_left, num_right=num_right, rate_bps=rate_bps, delay_s=delay_s)
    b = _Builder("dumbbell")
    sl = b.node("swL", SWITCH, 1)
    sr = b.node("swR", SWITCH, 1)
    for i in range(num_left):
        b.cable(b.node(f"L{i}", HOST), sl, rate_bps, delay_s, buffer_bytes)
    for i in range(num_right):
        b.cable(b.node(f"R{i}", HOST), sr, rate_bps, delay_s, buffer_bytes)
    b.cable(sl, sr, bottleneck_rate_bps or rate_bps, delay_s, buffer_bytes)
    return b.build(mtu_bytes, header_bytes)


def star(num_hosts: int, *, rate_bps: float, delay_s: float, buffer_bytes: int | None = None,
         mtu_bytes: int = 1500, header_bytes: int = 52) -> Topology:
    """Hosts on one switch (the incast topology)."""
    _check_positive(num_hosts=num_hosts, rate_bps=rate_bps, delay_s=delay_s)
    b = _Builder("star")
    sw = b.node("sw", SWITCH, 1)
    for i in range(num_hosts):
        b.cable(b.node(f"h{i}", HOST), sw, rate_bps, delay_s, buffer_bytes)
    return b.build(mtu_bytes, header_bytes)


def leaf_spine(num_leaves: int, hosts_per_leaf: int, num_spines: int, *, host_rate_bps: float,
               delay_s: float, oversubscription: float = 1.0, spine_rate_bps: float | None = None,
               buffer_bytes: int | None = None, mtu_bytes: int = 4096,
               header_bytes: int = 48) -> Topology:
    """2-tier Clos: every leaf connects to every spine.

    Uplink rate per leaf-spine cable: hosts_per_leaf x host_rate / (num_spines x
    oversubscription), unless `spine_rate_bps` fixes it (then the ratio follows from it).
    """
    _check_positive(num_leaves=num_leaves, hosts_per_leaf=hosts_per_leaf, num_spines=num_spines,
                    host_rate_bps=host_rate_bps, delay_s=delay_s,
                    oversubscription=oversubscription)
    up = spine_rate_bps or hosts_per_leaf * host_rate_bps / (num_spines * oversubscription)
    b = _Builder("leaf_spine")
    spines = [b.node(f"spine{j}", SWITCH, 2) for j in range(num_spines)]
    for i in range(num_leaves):
        leaf = b.node(f"leaf{i}", SWITCH, 1)
        for k in range(hosts_per_leaf):
            b.cable(b.node(f"h{i * hosts_per_leaf + k}", HOST), leaf, host_rate_bps, delay_s,
                    buffer_bytes)
        for s in spines:
            b.cable(leaf, s, up, delay_s, buffer_bytes)
    return b.build(mtu_bytes, header_bytes)


def fat_tree(k: int, *, rate_bps: float, delay_s: float, buffer_bytes: int | None = None,
             mtu_bytes: int = 4096, header_bytes: int = 48) -> Topology:
    """3-tier k-ary fat-tree: k pods of k/2 edge and k/2 aggregation switches, (k/2)^2 cores,
    k^3/4 hosts, full bisection bandwidth."""
    _check_positive(k=k, rate_bps=rate_bps, delay_s=delay_s)
    if k % 2:
        raise ConfigError(f"topology.k must be even for a fat-tree, got {k}")
    half = k // 2
    b = _Builder("fat_tree")
    cores = [b.node(f"core{i}", SWITCH, 3) for i in range(half * half)]
    h = 0
    for p in range(k):
        aggs = [b.node(f"agg{p}_{a}", SWITCH, 2) for a in range(half)]
        for a, agg in enumerate(aggs):
            for c in range(half):
                b.cable(agg, cores[a * half + c], rate_bps, delay_s, buffer_bytes)
        for e in range(half):
            edge = b.node(f"edge{p}_{e}", SWITCH, 1)
            for agg in aggs:
                b.cable(edge, agg, rate_bps, delay_s, buffer_bytes)
            for _ in range(half):
                b.cable(b.node(f"h{h}", HOST), edge, rate_bps, delay_s, buffer_bytes)
                h += 1
    return b.build(mtu_bytes, header_bytes)


def rail_optimized(num_nodes: int, gpus_per_node: int, *, nic_rate_bps: float,
                   nvlink_rate_bps: float, delay_s: float, nvlink_delay_s: float = 1e-6,
                   num_spines: int = 0, oversubscription: float = 1.0,
                   pcie_rate_bps: float | None = None, pcie_delay_s: float = 1e-6,
                   buffer_bytes: int | None = None, mtu_bytes: int = 4096,
                   header_bytes: int = 48) -> Topology:
    """Rail-optimized multi-plane fabric: GPU i of every node has a NIC on rail switch i; GPUs of
    one node share an NVSwitch. Without spines, traffic between rails crosses NVLink to the GPU
    on the destination's rail and leaves through its NIC (PXN): GPUs relay. With `num_spines` > 0
    the rails also join through spines.

    Hosts are the GPUs (`n{node}g{gpu}`); each GPU's NIC link and NVLink port are its links.
    With `pcie_rate_bps`, each GPU reaches its NIC (`n{node}nic{gpu}`, which forwards) over a
    PCIe link first, so GPU-to-NIC bandwidth and latency are on the path too.
    """
    _check_positive(num_nodes=num_nodes, gpus_per_node=gpus_per_node, nic_rate_bps=nic_rate_bps,
                    nvlink_rate_bps=nvlink_rate_bps, delay_s=delay_s)
    if pcie_rate_bps is not None:
        _check_positive(pcie_rate_bps=pcie_rate_bps, pcie_delay_s=pcie_delay_s)
    b = _Builder("rail_optimized")
    rails = [b.node(f"rail{i}", SWITCH, 1) for i in range(gpus_per_node)]
    for n in range(num_nodes):
        nvs = b.node(f"nvswitch{n}", SWITCH, 0)
        for g in range(gpus_per_node):
            gpu = b.node(f"n{n}g{g}", HOST, forwards=True)
            b.cable(gpu, nvs, nvlink_rate_bps, nvlink_delay_s, None, "nvlink")
            nic = gpu
            if pcie_rate_bps:
                nic = b.node(f"n{n}nic{g}", SWITCH, 0)
                b.cable(gpu, nic, pcie_rate_bps, pcie_delay_s, None, "pcie")
            b.cable(nic, rails[g], nic_rate_bps, delay_s, buffer_bytes)
    if num_spines:
        up = num_nodes * nic_rate_bps / (num_spines * oversubscription)
        spines = [b.node(f"spine{j}", SWITCH, 2) for j in range(num_spines)]
        for r in rails:
            for s in spines:
                b.cable(r, s, up, delay_s, buffer_bytes)
    return b.build(mtu_bytes, header_bytes)


def explicit(nodes: list[tuple[str, str]], cables: list[dict], *, mtu_bytes: int = 1500,
             header_bytes: int = 52, name: str = "explicit") -> Topology:
    """Nodes as (name, kind) pairs; cables as dicts {a, b, rate_bps, delay_s, buffer_bytes?,
    kind?} naming nodes; each cable is a link in each direction."""
    b = _Builder(name)
    index = {}
    for nm, kind in nodes:
        if kind not in (HOST, SWITCH):
            raise ConfigError(f"topology.nodes.{nm}: kind must be host or switch, got {kind!r}")
        if nm in index:
            raise ConfigError(f"topology.nodes: {nm!r} is declared twice")
        index[nm] = b.node(nm, kind, 0 if kind == HOST else 1)
    for i, c in enumerate(cables):
        for end in ("a", "b"):
            if c.get(end) not in index:
                raise ConfigError(f"topology.links[{i}].{end}: unknown node {c.get(end)!r}")
        _check_positive(**{f"links[{i}].rate_bps": c.get("rate_bps"),
                           f"links[{i}].delay_s": c.get("delay_s")})
        b.cable(index[c["a"]], index[c["b"]], float(c["rate_bps"]), float(c["delay_s"]),
                c.get("buffer_bytes"), c.get("kind", "fabric"))
    return b.build(mtu_bytes, header_bytes)
