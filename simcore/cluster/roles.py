"""Prefill and decode instances of their own tensor-parallel size and GPU (xPyD): one deployment
per role, each built as `simcore.setup.build_deployment` builds one at that TP on that GPU (its
step-time model, its KV-cache size from the memory left, its batch limits), and a step-DAG
builder per role that dispatches each step to the builder of the stepping instance's role.

Used only when `parallelism.prefill_decode` sets `prefill_tensor_parallel_size`,
`decode_tensor_parallel_size`, `prefill_gpu` or `decode_gpu`; without them a disaggregated run
has one deployment for all instances, as before. A role on a GPU other than `hardware.gpu` takes
that GPU's catalog entry (the overrides of `hardware` describe `hardware.gpu` alone) and nodes of
its own; both kinds of node must hold the same number of GPUs.
"""

from __future__ import annotations

import re

from simcore.cluster.placement import (DECODE, DECODE_TP_FIELD, PREFILL, PREFILL_TP_FIELD,
                                       Instance, Placement, place)
from simcore.config import SimConfig
from simcore.errors import ConfigError
from simcore.hardware import HardwareConfig, get_gpu
from simcore.setup import Deployment, build_deployment

ROLES = (PREFILL, DECODE)
ROLE_TP_FIELDS = {PREFILL: PREFILL_TP_FIELD, DECODE: DECODE_TP_FIELD}
ROLE_GPU_FIELDS = {PREFILL: "parallelism.prefill_decode.prefill_gpu",
                   DECODE: "parallelism.prefill_decode.decode_gpu"}
TP_FIELD = "parallelism.tensor_parallel_size"
EP_FIELD = "parallelism.enable_expert_parallel"
_LEADING_FIELD = re.compile(r"([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)*): ")
"""The dotted field a start-up refusal begins with ("engine.max_num_batched_tokens: ...")."""


def role_gpu_name(cfg: SimConfig, role: str) -> str:
    """The catalog name of the GPU the instances of `role` run on."""
    return cfg.parallelism.role_gpu(role) or get_gpu(cfg.hardware.gpu).name


def separate_role_nodes(cfg: SimConfig) -> bool:
    """Whether prefill and decode instances run on different GPUs, hence on nodes of their own."""
    return role_gpu_name(cfg, PREFILL) != role_gpu_name(cfg, DECODE)


def role_hardware(cfg: SimConfig, role: str) -> HardwareConfig:
    """The hardware section as one instance of `role` sees it: `hardware` itself on its GPU,
    else the role's GPU from the catalog on nodes of `hardware.gpus_per_node` GPUs."""
    gpu = role_gpu_name(cfg, role)
    if gpu == get_gpu(cfg.hardware.gpu).name:
        return cfg.hardware
    return HardwareConfig(gpu=gpu, gpus_per_node=cfg.hardware.gpus_per_node)


def role_gpus_per_node(cfg: SimConfig) -> int:
    """GPUs per node of a disaggregated cluster: both roles' nodes must hold the same number
    (the cluster's GPUs are numbered node x gpus_per_node + local rank)."""
    sizes = {}
    for role in ROLES:
        hw = role_hardware(cfg, role)
        sizes[role] = hw.gpus_per_node or hw.resolve().gpus_per_node
    if sizes[PREFILL] != sizes[DECODE]:
        field = ROLE_GPU_FIELDS[DECODE if cfg.parallelism.role_gpu(DECODE) else PREFILL]
        raise ConfigError(
            f"{field}: {role_gpu_name(cfg, PREFILL)} nodes hold {sizes[PREFILL]} GPUs and "
            f"{role_gpu_name(cfg, DECODE)} nodes {sizes[DECODE]}; set hardware.gpus_per_node to "
            "model nodes of one size")
    return sizes[DECODE]


def role_ep_flags(cfg: SimConfig) -> tuple[bool, bool]:
    """(prefill, decode): whether each role's instances form an expert-parallel group."""
    par = cfg.parallelism
    return par.role_expert_parallel(PREFILL), par.role_expert_parallel(DECODE)


def role_config(cfg: SimConfig, role: str) -> SimConfig:
    """The config as one instance of `role` sees it: the shared TP and GPU replaced by the
    role's; with expert parallelism, the role's instances as the DP ranks of one expert-parallel
    deployment (EP = the role's instances x its TP)."""
    par = cfg.parallelism
    update: dict = {"tensor_parallel_size": par.role_tensor_parallel_size(role),
                    "enable_expert_parallel": par.role_expert_parallel(role)}
    if par.role_expert_parallel(role):
        pd = par.prefill_decode
        update.update(prefill_decode=None, data_parallel_size=(
            pd.num_prefill_instances if role == PREFILL else pd.num_decode_instances))
    return cfg.model_copy(update={
        "parallelism": par.model_copy(update=update),
        "hardware": role_hardware(cfg, role)})


def build_role_deployments(cfg: SimConfig, *, op_scale: dict[str, float] | None = None
                           ) -> dict[str, Deployment]:
    """Role -> its deployment; a start-up check that fails names the role's TP field."""
    pd = cfg.parallelism.prefill_decode
    if pd is None:
        raise ConfigError(f"{PREFILL_TP_FIELD}: per-role TP needs parallelism.prefill_decode")
    if cfg.cluster is None:
        raise ConfigError("parallelism.prefill_decode: disaggregation moves KV caches over a "
                          "network; add a cluster section")
    role_gpus_per_node(cfg)
    out: dict[str, Deployment] = {}
    par = cfg.parallelism
    for role in ROLES:
        explicit = par.role_setting(role, "tensor_parallel_size") is not None
        own_gpu = role_gpu_name(cfg, role) != get_gpu(cfg.hardware.gpu).name
        try:
            out[role] = build_deployment(role_config(cfg, role), op_scale=op_scale)
        except ConfigError as err:
            text = str(err)
            named = _LEADING_FIELD.match(text)
            field = named.group(1) if named else None
            ep_field = f"parallelism.prefill_decode.{role}_expert_parallel"
            own_ep = par.role_setting(role, "expert_parallel") is not None
            if own_ep and field == EP_FIELD:
                text = ep_field + text[len(EP_FIELD):]
            elif explicit and field == TP_FIELD:
                text = ROLE_TP_FIELDS[role] + text[len(TP_FIELD):]
            elif explicit and field is not None:
                # Another setting is responsible (the token budget, max_model_len, ...): it
                # leads, the role said beside it.
                text = f"{field} ({role} instances){text[len(field):]}"
            elif explicit:
                text = f"{ROLE_TP_FIELDS[role]} ({role} instances): {text}"
            elif own_gpu:
                text = (f"{ROLE_GPU_FIELDS[role]} ({role} instances on "
                        f"{role_gpu_name(cfg, role)}): {text}")
            raise ConfigError(text) from None
    return out


def check_layout(cfg: SimConfig) -> Placement | None:
    """The placement of a disaggregated deployment's instances on the cluster's nodes (None
    without a cluster or disaggregation); ConfigError unless they fit (cheap: no simulation)."""
    c = cfg.cluster
    par = cfg.parallelism
    pd = par.prefill_decode
    if c is None or pd is None:
        return None
    return place(num_nodes=c.num_nodes, gpus_per_node=role_gpus_per_node(cfg),
                 tp=par.tensor_parallel_size, pp=par.pipeline_parallel_size, dp=1,
                 expert_parallel=role_ep_flags(cfg), num_prefill=pd.num_prefill_instances,
                 num_decode=pd.num_decode_instances,
                 prefill_tp=par.role_tensor_parallel_size(PREFILL),
                 decode_tp=par.role_tensor_parallel_size(DECODE),
                 separate_roles=separate_role_nodes(cfg))


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
