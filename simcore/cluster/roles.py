"""Prefill and decode instances of their own tensor-parallel size (xPyD): one deployment per role,
each built as `simcore.setup.build_deployment` builds one at that TP (its step-time model, its
KV-cache size from the memory left at that TP, its batch limits), and a step-DAG builder per
role that dispatches each step to the builder of the stepping instance's role.

Used only when `parallelism.prefill_decode` sets `prefill_tensor_parallel_size` or
`decode_tensor_parallel_size`; without them a disaggregated run has one deployment for all
instances, as before.
"""

from __future__ import annotations

from simcore.cluster.placement import (DECODE, DECODE_TP_FIELD, PREFILL, PREFILL_TP_FIELD,
                                       Instance, place)
from simcore.config import SimConfig
from simcore.errors import ConfigError
from simcore.setup import Deployment, build_deployment

ROLES = (PREFILL, DECODE)
ROLE_TP_FIELDS = {PREFILL: PREFILL_TP_FIELD, DECODE: DECODE_TP_FIELD}
TP_FIELD = "parallelism.tensor_parallel_size"


def role_config(cfg: SimConfig, role: str) -> SimConfig:
    """The config as one instance of `role` sees it: the shared TP replaced by the role's."""
    par = cfg.parallelism
    tp = par.role_tensor_parallel_size(role)
    return cfg.model_copy(update={"parallelism": par.model_copy(
        update={"tensor_parallel_size": tp})})


def build_role_deployments(cfg: SimConfig, *, op_scale: dict[str, float] | None = None
                           ) -> dict[str, Deployment]:
    """Role -> its deployment; a start-up check that fails names the role's TP field."""
    pd = cfg.parallelism.prefill_decode
    if pd is None:
        raise ConfigError(f"{PREFILL_TP_FIELD}: per-role TP needs parallelism.prefill_decode")
    if cfg.cluster is None:
        raise ConfigError("parallelism.prefill_decode: disaggregation moves KV caches over a "
                          "network; add a cluster section")
    out: dict[str, Deployment] = {}
    for role in ROLES:
        explicit = (pd.prefill_tensor_parallel_size if role == PREFILL
                    else pd.decode_tensor_parallel_size) is not None
        try:
            out[role] = build_deployment(role_config(cfg, role), op_scale=op_scale)
        except ConfigError as err:
            text = str(err)
            if explicit and text.startswith(TP_FIELD + ":"):
                text = ROLE_TP_FIELDS[role] + text[len(TP_FIELD):]
            elif explicit:
                text = f"{ROLE_TP_FIELDS[role]} ({role} instances): {text}"
            raise ConfigError(text) from None
    return out


def check_layout(cfg: SimConfig) -> None:
    """Raise ConfigError unless the instances fit the cluster's nodes (cheap: no simulation)."""
    c = cfg.cluster
    par = cfg.parallelism
    pd = par.prefill_decode
    if c is None or pd is None:
        return
    gpu = cfg.hardware.resolve()
    place(num_nodes=c.num_nodes, gpus_per_node=cfg.hardware.gpus_per_node or gpu.gpus_per_node,
          tp=par.tensor_parallel_size, pp=par.pipeline_parallel_size, dp=1,
          expert_parallel=False, num_prefill=pd.num_prefill_instances,
          num_decode=pd.num_decode_instances,
          prefill_tp=par.role_tensor_parallel_size(PREFILL),
          decode_tp=par.role_tensor_parallel_size(DECODE))


class RoleBuilders:
    """A step-DAG builder per role behind the one-builder interface `ClusterRuntime` calls:
    a step of a disaggregated deployment runs one instance (no lock-step groups), so it goes to
    that instance's role's builder whole."""

    def __init__(self, builders: dict[str, object]) -> None:
        self.builders = builders

    def for_instance(self, inst: Instance):
        return self.builders[inst.role]

    def build(self, batches):
        roles = {inst.role for inst, _ in batches}
        if len(roles) != 1:
            raise ValueError(f"one step mixes instances of roles {sorted(roles)}")
        return self.builders[roles.pop()].build(batches)

    @property
    def model(self):
        """The decode role's step model (what a caller asking for one model gets)."""
        return self.builders[DECODE].model
