"""Engines placed on the GPUs of a cluster by a parallelism declaration (TP, PP, DP, EP and
prefill/decode disaggregation), in vLLM's rank order."""

from __future__ import annotations

from dataclasses import dataclass

from simcore.errors import ConfigError

MIXED, PREFILL, DECODE = "mixed", "prefill", "decode"


@dataclass(frozen=True, slots=True)
class Instance:
    """One engine (a vLLM instance or one DP rank of it): its GPUs by pipeline stage and TP rank.

    `gpus[stage][tp_rank]` is a global GPU index (node x gpus_per_node + local rank).
    """

    index: int
    role: str                             # MIXED, PREFILL or DECODE
    gpus: tuple[tuple[int, ...], ...]

    @property
    def all_gpus(self) -> tuple[int, ...]:
        return tuple(g for stage in self.gpus for g in stage)


@dataclass(frozen=True, slots=True)
class Placement:
    """Every engine instance on the cluster, and which of them step in lock-step.

    vLLM orders ranks DP, then PP, then TP, so instance i's stage s TP rank r is GPU
    i x PP x TP + s x TP + r; prefill instances come first, then decode instances. An expert-
    parallel group is every DP rank (`ep_groups`), its experts spread over all their GPUs of a
    stage. Invariants: no GPU holds two engines; a TP group never straddles nodes unevenly.
    """

    num_nodes: int
    gpus_per_node: int
    tp: int
    pp: int
    instances: tuple[Instance, ...]
    ep_groups: tuple[tuple[int, ...], ...]    # instance indices stepping together; () without EP

    def node_of(self, gpu: int) -> int:
        return gpu // self.gpus_per_node

    @property
    def num_gpus_used(self) -> int:
        return sum(len(i.all_gpus) for i in self.instances)

    def instances_of(self, role: str) -> list[Instance]:
        return [i for i in self.instances if i.role == role]

    def nodes_spanned(self, gpus: tuple[int, ...]) -> int:
        return len({self.node_of(g) for g in gpus})


def place(*, num_nodes: int, gpus_per_node: int, tp: int, pp: int, dp: int,
          expert_parallel: bool | tuple[bool, bool], num_replicas: int = 1, num_prefill: int = 0,
          num_decode: int = 0, prefill_tp: int | None = None,
          decode_tp: int | None = None, separate_roles: bool = False) -> Placement:
    """Lay engines out on the cluster (replica after replica, DP rank after DP rank); impossible
    layouts raise ConfigError naming the field. `prefill_tp` / `decode_tp` give the instances of
    a disaggregated deployment a TP of their own, `separate_roles` nodes of their own per role
    (`place_roles`)."""
    if ((prefill_tp is not None or decode_tp is not None or separate_roles
            or any(_pair(expert_parallel))) and num_prefill + num_decode > 0):
        return place_roles(num_nodes=num_nodes, gpus_per_node=gpus_per_node, pp=pp,
                           num_prefill=num_prefill, num_decode=num_decode,
                           prefill_tp=prefill_tp or tp, decode_tp=decode_tp or tp,
                           separate_roles=separate_roles, expert_parallel=expert_parallel)
    disagg = num_prefill + num_decode > 0
    num_instances = num_prefill + num_decode if disagg else dp * num_replicas
    per_instance = tp * pp
    needed = num_instances * per_instance
    available = num_nodes * gpus_per_node
    what = (f"{num_prefill} prefill + {num_decode} decode instances" if disagg
            else f"{num_replicas} replica{'s' if num_replicas > 1 else ''} of {dp} DP "
                 f"rank{'s' if dp > 1 else ''}")
    if needed > available:
        raise ConfigError(f"cluster.num_nodes: {what} of TP {tp} x PP {pp} need {needed} GPUs; "
                          f"{num_nodes} node{'s' if num_nodes > 1 else ''} of {gpus_per_node} "
                          f"have {available}")
    if tp > gpus_per_node:
        if tp % gpus_per_node:
            raise ConfigError(f"parallelism.tensor_parallel_size: {tp} spans nodes of "
                              f"{gpus_per_node} GPUs unevenly; use a multiple of "
                              f"{gpus_per_node}")
    elif gpus_per_node % tp:
        raise ConfigError(f"parallelism.tensor_parallel_size: {tp} does not divide the "
                          f"{gpus_per_node} GPUs of a node, so TP groups would straddle nodes")
    instances = []
    for i in range(num_instances):
        base = i * per_instance
        gpus = tuple(tuple(base + s * tp + r for r in range(tp)) for s in range(pp))
        role = MIXED if not disagg else (PREFILL if i < num_prefill else DECODE)
        instances.append(Instance(i, role, gpus))
    groups: tuple[tuple[int, ...], ...] = ()
    if expert_parallel is True:
        groups = tuple(tuple(range(k * dp, (k + 1) * dp)) for k in range(num_replicas))
        for g in groups:
            check_ep_group(instances, g, pp, gpus_per_node, "parallelism.data_parallel_size")
    return Placement(num_nodes, gpus_per_node, tp, pp, tuple(instances), groups)


def _pair(flag: bool | tuple[bool, bool]) -> tuple[bool, bool]:
    """(prefill, decode) expert-parallel flags from one flag for both or a pair."""
    return flag if isinstance(flag, tuple) else (flag, flag)


def check_ep_group(instances, group: tuple[int, ...], pp: int, gpus_per_node: int,
                   field: str) -> None:
    """Raise ConfigError (naming `field`) unless each pipeline stage of the expert-parallel
    group `group` (instance indices) holds the same number of GPUs on every node it uses: the
    stage's experts spread evenly over its GPUs."""
    ep = sum(len(instances[i].gpus[0]) for i in group)
    for s in range(pp):          # each stage's experts spread over its own GPUs
        nodes = [gpu // gpus_per_node for i in group for gpu in instances[i].gpus[s]]
        counts = {n: nodes.count(n) for n in nodes}
        if len(set(counts.values())) > 1:
            where = f" in pipeline stage {s}" if pp > 1 else ""
            raise ConfigError(f"{field}: an expert-parallel group of {ep} GPUs{where} spreads "
                              f"unevenly over nodes of {gpus_per_node} GPUs "
                              f"({sorted(counts.values())})")


PREFILL_TP_FIELD = "parallelism.prefill_decode.prefill_tensor_parallel_size"
DECODE_TP_FIELD = "parallelism.prefill_decode.decode_tensor_parallel_size"


def place_roles(*, num_nodes: int, gpus_per_node: int, pp: int, num_prefill: int,
                num_decode: int, prefill_tp: int, decode_tp: int,
                separate_roles: bool = False,
                expert_parallel: bool | tuple[bool, bool] = False) -> Placement:
    """Prefill and decode instances of their own TP on the cluster.

    Instance indices keep the order prefill first, then decode. GPUs are handed out to the
    instances of the larger TP first, each instance starting on a multiple of its TP (of the
    node size for TP across nodes), so no TP group straddles nodes and, TP sizes being divisors
    or multiples of the node size, no GPU is left between instances. With `separate_roles`
    (prefill and decode on different GPUs) the prefill instances fill the first nodes and the
    decode instances start on the next whole node, so no node holds both. With
    `expert_parallel` (one flag for both roles, or a (prefill, decode) pair) each such role's
    instances are one expert-parallel group (`ep_groups`, prefill's first), stepping in
    lock-step. `Placement.tp` is the
    decode instances' TP; an instance's own is `len(instance.gpus[0])`.
    """
    gpn = gpus_per_node
    for tp, name in ((prefill_tp, PREFILL_TP_FIELD), (decode_tp, DECODE_TP_FIELD)):
        if tp > gpn:
            if tp % gpn:
                raise ConfigError(f"{name}: {tp} spans nodes of {gpn} GPUs unevenly; use a "
                                  f"multiple of {gpn}")
        elif gpn % tp:
            raise ConfigError(f"{name}: {tp} does not divide the {gpn} GPUs of a node, so TP "
                              f"groups would straddle nodes")
    tps = [prefill_tp] * num_prefill + [decode_tp] * num_decode
    needed = sum(tps) * pp
    available = num_nodes * gpn
    if needed > available:
        raise ConfigError(f"cluster.num_nodes: {num_prefill} prefill instance"
                          f"{'s' if num_prefill > 1 else ''} of TP {prefill_tp} + {num_decode} "
                          f"decode instance{'s' if num_decode > 1 else ''} of TP {decode_tp} "
                          f"(PP {pp}) need {needed} GPUs; {num_nodes} node"
                          f"{'s' if num_nodes > 1 else ''} of {gpn} have {available}")
    first: dict[int, int] = {}
    cursor = 0
    pools = ([list(range(num_prefill)), list(range(num_prefill, len(tps)))] if separate_roles
             else [list(range(len(tps)))])
    for pool in pools:
        cursor = -(-cursor // gpn) * gpn if separate_roles else cursor
        for i in sorted(pool, key=lambda i: -tps[i]):
            align = min(tps[i], gpn)
            cursor = -(-cursor // align) * align
            first[i] = cursor
            cursor += tps[i] * pp
    if cursor > available:
        how = ("with each role on nodes of its own and every TP group inside a node"
               if separate_roles else "aligning every TP group inside a node")
        raise ConfigError(f"cluster.num_nodes: {how}, the "
                          f"{num_prefill} prefill and {num_decode} decode instances need "
                          f"{-(-cursor // gpn) * gpn if separate_roles else cursor} GPUs; "
                          f"the cluster has {available}")
    instances = tuple(
        Instance(i, PREFILL if i < num_prefill else DECODE,
                 tuple(tuple(first[i] + s * tps[i] + r for r in range(tps[i]))
                       for s in range(pp)))
        for i in range(len(tps)))
    groups: list[tuple[int, ...]] = []
    for g, role, on in zip((tuple(range(num_prefill)), tuple(range(num_prefill, len(tps)))),
                           (PREFILL, DECODE), _pair(expert_parallel)):
        if on:
            check_ep_group(instances, g, pp, gpn,
                           f"parallelism.prefill_decode.num_{role}_instances")
            groups.append(g)
    return Placement(num_nodes, gpn, decode_tp, pp, instances, tuple(groups))


def instance_tp(instance: Instance) -> int:
    """The TP of one placed instance (its GPUs per pipeline stage)."""
    return len(instance.gpus[0])
