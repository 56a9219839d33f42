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
          expert_parallel: bool, num_replicas: int = 1, num_prefill: int = 0,
          num_decode: int = 0) -> Placement:
    """Lay engines out on the cluster (replica after replica, DP rank after DP rank); impossible
    layouts raise ConfigError naming the field."""
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
    if expert_parallel:
        groups = tuple(tuple(range(k * dp, (k + 1) * dp)) for k in range(num_replicas))
        ep = dp * tp
        for g in groups:
            for s in range(pp):          # each stage's experts spread over its own GPUs
                nodes = [gpu // gpus_per_node for i in g for gpu in instances[i].gpus[s]]
                counts = {n: nodes.count(n) for n in nodes}
                if len(set(counts.values())) > 1:
                    where = f" in pipeline stage {s}" if pp > 1 else ""
                    raise ConfigError(f"parallelism.data_parallel_size: an expert-parallel "
                                      f"group of {ep} GPUs{where} spreads unevenly over nodes "
                                      f"of {gpus_per_node} GPUs ({sorted(counts.values())})")
    return Placement(num_nodes, gpus_per_node, tp, pp, tuple(instances), groups)
