"""Launch files: the exact `vllm serve` commands that start a simulated configuration on real
hardware, for the vLLM release the simulator's scheduler follows (0.33), with the values the
simulation resolved (batch limits per GPU, max_model_len, dtypes) passed explicitly.

Flag names and defaults are vLLM 0.33's (`vllm/engine/arg_utils.py`, `vllm/config/
scheduler.py`, `vllm/entrypoints/common/cli_args.py`); multi-node layouts follow its
data-parallel and distributed-serving guides. Per engine setting:
- vLLM flags: batch limits, chunked prefill, prefix caching, block size, KV-cache and weight
  dtypes, memory utilization, KV-block override, long-prefill cap, priority scheduling,
  `--watermark`, `--no-scheduler-reserve-full-isl`, `--max-num-scheduled-tokens`, async
  scheduling (always explicit: vLLM 0.33 turns it on by default, the simulator off), API
  server count (explicit where vLLM's default, one per DP rank, differs).
- warnings, not refusals (the closest launch is still useful): `preemption_mode:
  least_work_done` and `persistent_batch` (no vLLM option: the simulated engine differs from
  stock vLLM), an offline entrypoint, router policies vLLM's own DP balancer lacks.
- refused (ConfigError naming the field): `cluster.kv_tier` (an external KV tier needs a KV
  connector and a storage service no `vllm serve` flag sets up), and layouts vLLM cannot start
  (ranks straddling nodes unevenly under Ray data parallelism, async scheduling with Ray).

Layout: engines are packed on nodes in vLLM's rank order, a rank of TP x PP GPUs whole on one
node when it fits. One `vllm serve` deployment per replica (or per prefill / decode instance);
one spanning nodes gets per-node commands: vLLM's multi-node data parallelism
(`--data-parallel-size-local`, `--data-parallel-start-rank`, `--headless`) when every rank
fits on a node, else a Ray cluster and `--distributed-executor-backend ray`. Node i's address
is written `node{i}`."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from dse.launch_fabric import FabricRow, fabric_caveats, fabric_rows
from dse.launch_flags import (KV_DTYPES, VLLM_VERSION, engine_flags, model_ref, more_warnings,
                              weight_flags)
from simcore.config import SimConfig
from simcore.errors import ConfigError

API_PORT, DP_RPC_PORT, RAY_PORT, MP_MASTER_PORT, NIXL_PORT, PROXY_PORT = (
    8000, 13345, 6379, 29501, 5600, 8192)
ROUTER_PORT = 30000
"""vllm-router's default port."""
PROXY_SCRIPT = "tests/v1/kv_connector/nixl_integration/toy_proxy_server.py"


def host(node: int) -> str:
    """The placeholder address of node `node` in the commands."""
    return f"node{node}"


@dataclass(frozen=True)
class Command:
    """One command to run on one node: its environment and argument list."""

    node: int
    what: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()

    @property
    def line(self) -> str:
        """The shell-quoted one-line form, environment first."""
        return " ".join([f"{k}={shlex.quote(v)}" for k, v in self.env] + [shlex.join(self.argv)])

    @property
    def is_serve(self) -> bool:
        return self.argv[:2] == ("vllm", "serve")

    def as_dict(self) -> dict:
        return {"node": self.node, "what": self.what, "env": dict(self.env),
                "argv": list(self.argv), "command": self.line}


@dataclass(frozen=True)
class LaunchUnit:
    """One vLLM deployment (a replica, or a prefill or decode instance) and its commands."""

    name: str
    role: str                      # mixed, prefill or decode
    nodes: tuple[int, ...]
    endpoint: str
    commands: tuple[Command, ...]

    def as_dict(self) -> dict:
        return {"name": self.name, "role": self.role, "nodes": list(self.nodes),
                "endpoint": self.endpoint, "commands": [c.as_dict() for c in self.commands]}


@dataclass(frozen=True)
class LaunchPlan:
    """How to start a simulated configuration with vLLM: every command, the network settings,
    what was resolved and what differs."""

    name: str
    vllm_version: str
    model: str
    gpu: str
    gpus_per_node: int
    num_nodes: int
    resolved: tuple[tuple[str, str, str], ...]     # (setting, value, where it came from)
    units: tuple[LaunchUnit, ...]
    front: str
    proxy: Command | None       # what clients talk to: the P/D proxy, or vLLM's router
    fabric: tuple[FabricRow, ...]
    warnings: tuple[str, ...]
    notes: tuple[str, ...]

    @property
    def serve_command(self) -> Command:
        """The first deployment's head-node `vllm serve` command."""
        return next(c for c in self.units[0].commands if c.is_serve)

    @property
    def serve_argv(self) -> tuple[str, ...]:
        return self.serve_command.argv

    def serve_commands(self) -> list[Command]:
        """Every `vllm serve` command of the plan."""
        return [c for u in self.units for c in u.commands if c.is_serve]

    def as_dict(self) -> dict:
        return {"name": self.name, "vllm_version": self.vllm_version, "model": self.model,
                "gpu": self.gpu, "gpus_per_node": self.gpus_per_node,
                "num_nodes": self.num_nodes,
                "resolved": [{"setting": s, "value": v, "source": w}
                             for s, v, w in self.resolved],
                "serve_argv": list(self.serve_argv), "serve_command": self.serve_command.line,
                "deployments": [u.as_dict() for u in self.units], "front": self.front,
                "proxy": self.proxy.as_dict() if self.proxy else None,
                "fabric": [r.as_dict() for r in self.fabric],
                "warnings": list(self.warnings), "notes": list(self.notes)}

    def render(self) -> str:
        """The plan as markdown (reads as plain text too)."""
        return render_plan(self)


def serve_command_line(cfg: SimConfig) -> str:
    """The one-line `vllm serve` command of `cfg`'s first deployment's head node."""
    return launch_plan(cfg).serve_command.line


# --- layout -------------------------------------------------------------------------------

def _pack(num_ranks: int, per: int, gpn: int) -> list[list[tuple[int, int]]]:
    """(node, local GPU) of each rank, in rank order: a rank that fits a node is never split,
    a larger one starts on a fresh node."""
    out, node, used = [], 0, 0
    for _ in range(num_ranks):
        if used and (per > gpn or used + per > gpn):
            node, used = node + 1, 0
        gpus = [(node + (used + k) // gpn, (used + k) % gpn) for k in range(per)]
        out.append(gpus)
        node, used = gpus[-1][0], gpus[-1][1] + 1
        if used == gpn:
            node, used = node + 1, 0
    return out


def _check_placement(cfg: SimConfig, ranks, gpn: int, warnings: list[str]) -> None:
    """The simulated cluster placement against the packed one."""
    from simcore.cluster.placement import place

    c, par = cfg.cluster, cfg.parallelism
    pd = par.prefill_decode
    used = max(n for r in ranks for n, _ in r) + 1
    if used > c.num_nodes:
        raise ConfigError(f"cluster.num_nodes: vLLM runs each rank of TP x PP GPUs whole on one "
                          f"node where it fits, which needs {used} nodes of {gpn} GPUs; the "
                          f"cluster has {c.num_nodes}")
    simulated = place(num_nodes=c.num_nodes, gpus_per_node=gpn, tp=par.tensor_parallel_size,
                      pp=par.pipeline_parallel_size, dp=par.data_parallel_size,
                      expert_parallel=par.enable_expert_parallel,
                      num_replicas=par.num_replicas,
                      num_prefill=pd.num_prefill_instances if pd else 0,
                      num_decode=pd.num_decode_instances if pd else 0)
    moved = [i for i, (inst, r) in enumerate(zip(simulated.instances, ranks))
             if [divmod(g, gpn) for g in inst.all_gpus] != r]
    if moved:
        warnings.append(f"cluster: the simulated placement split engine{'s' * (len(moved) > 1)} "
                        f"{', '.join(map(str, moved))} across nodes; vLLM runs a rank that fits "
                        "a node on one node, so the launch packs ranks whole and the traffic "
                        "between nodes differs from the simulated run")


class _Slots:
    """Ports of deployments sharing a node: the k-th on a node gets base port + k."""

    def __init__(self, ranks, units):
        self.count: dict[int, int] = {}
        self.users: dict[int, set[int]] = {}
        for u, members in enumerate(units):
            for r in members:
                for n, _ in ranks[r]:
                    self.users.setdefault(n, set()).add(u)

    def take(self, nodes: list[int]) -> int:
        k = max(self.count.get(n, 0) for n in nodes)
        for n in nodes:
            self.count[n] = k + 1
        return k

    def shared(self, node: int) -> bool:
        return len(self.users.get(node, ())) > 1


def _unit_commands(name: str, role: str, members: list[int], ranks, cfg: SimConfig, gpn: int,
                   head_args: list[str], tail_args: list[str], slots: _Slots) -> LaunchUnit:
    """The commands of one deployment of `len(members)` DP ranks."""
    par = cfg.parallelism
    per = par.tensor_parallel_size * par.pipeline_parallel_size
    dp = len(members)
    gpus = [g for r in members for g in ranks[r]]
    nodes = sorted({n for n, _ in gpus})
    head = nodes[0]
    k = slots.take(nodes)
    kv = role != "mixed"

    def env(node: int, extra: tuple[tuple[str, str], ...] = ()) -> tuple[tuple[str, str], ...]:
        local = sorted(g for n, g in gpus if n == node)
        out = list(extra)
        if slots.shared(node) or local != list(range(len(local))):
            out.insert(0, ("CUDA_VISIBLE_DEVICES", ",".join(map(str, local))))
        if kv:
            out += [("VLLM_NIXL_SIDE_CHANNEL_HOST", host(node)),
                    ("VLLM_NIXL_SIDE_CHANNEL_PORT", str(NIXL_PORT + k))]
        return tuple(out)

    base = list(head_args) + ["--data-parallel-size", str(dp)]
    api = cfg.host.api_server_count
    front = (["--port", str(API_PORT + k)] if k else []) + (
        ["--api-server-count", str(api)] if api > 1 or dp > 1 else [])
    what = f"{name}: vllm serve"
    cmds: list[Command] = []
    if per <= gpn and len(nodes) == 1:
        cmds.append(Command(head, what, tuple(base + tail_args + front), env(head)))
    elif per <= gpn:
        start = 0
        for node in nodes:
            local = sum(1 for r in members if ranks[r][0][0] == node)
            ranks_here = (f"DP rank {start}" if local == 1
                          else f"DP ranks {start}-{start + local - 1}")
            dpa = ["--data-parallel-size-local", str(local), "--data-parallel-address",
                   host(head), "--data-parallel-rpc-port", str(DP_RPC_PORT + k)]
            if node == head:
                cmds.append(Command(node, f"{what} (API server, {ranks_here})",
                                    tuple(base + dpa + tail_args + front), env(node)))
            else:
                dpa += ["--data-parallel-start-rank", str(start)]
                cmds.append(Command(node, f"{what} --headless ({ranks_here})",
                                    tuple(base + ["--headless"] + dpa + tail_args), env(node)))
            start += local
    elif cfg.engine.async_scheduling:
        if dp > 1:
            raise ConfigError(f"engine.async_scheduling: each of the {dp} DP ranks spans nodes "
                              f"(TP x PP = {per} GPUs, nodes of {gpn}); vLLM starts such ranks "
                              "with Ray, whose executor has no async scheduling; set it false")
        for r, node in enumerate(nodes):
            mp = ["--nnodes", str(len(nodes)), "--node-rank", str(r), "--master-addr",
                  host(head), "--master-port", str(MP_MASTER_PORT + k)]
            argv = base + mp + tail_args + (front if r == 0 else ["--headless"])
            cmds.append(Command(node, f"{what} (node rank {r})", tuple(argv), env(node)))
    else:
        if dp > 1 and per % gpn:
            raise ConfigError(f"parallelism.pipeline_parallel_size: ranks of TP x PP = {per} "
                              f"GPUs span nodes of {gpn} unevenly; vLLM's Ray data-parallel "
                              f"backend places a rank that spans nodes on whole nodes only "
                              f"(TP x PP a multiple of {gpn})")
        cmds.append(Command(head, f"{name}: Ray head", ("ray", "start", "--head",
                                                        f"--port={RAY_PORT}"), env(head)))
        for node in nodes[1:]:
            cmds.append(Command(node, f"{name}: Ray worker",
                                ("ray", "start", f"--address={host(head)}:{RAY_PORT}"),
                                env(node)))
        ray = ["--distributed-executor-backend", "ray"]
        extra: tuple[tuple[str, str], ...] = ()
        if dp > 1:
            ray += ["--data-parallel-backend", "ray"]
            extra = (("VLLM_RAY_DP_PACK_STRATEGY", "span"),)
        cmds.append(Command(head, f"{what} (after every Ray node has joined)",
                            tuple(base + ray + tail_args + front), env(head, extra)))
    return LaunchUnit(name, role, tuple(nodes), f"{host(head)}:{API_PORT + k}", tuple(cmds))


# --- the plan -----------------------------------------------------------------------------

def _role_ranks(cfg: SimConfig, gpn: int) -> list[list[tuple[int, int]]]:
    """(node, local GPU) of each instance of a disaggregated deployment whose roles have their
    own TP or GPU, as the simulation placed them (`simcore.cluster.roles.check_layout`)."""
    from simcore.cluster.roles import check_layout

    return [[divmod(g, gpn) for g in inst.all_gpus] for inst in check_layout(cfg).instances]


def _one_role_tp(cfg: SimConfig) -> SimConfig:
    """`cfg` with prefill and decode TP sizes that are set but equal folded into the shared
    tensor_parallel_size (the same deployment, which the plan below can write)."""
    par = cfg.parallelism
    pd = par.prefill_decode
    if not par.per_role_tp:
        return cfg
    tp = par.role_tensor_parallel_size("prefill")
    if tp != par.role_tensor_parallel_size("decode"):
        return cfg
    return cfg.model_copy(update={"parallelism": par.model_copy(update={
        "tensor_parallel_size": tp,
        "prefill_decode": pd.model_copy(update={"prefill_tensor_parallel_size": None,
                                                "decode_tensor_parallel_size": None})})})


def launch_plan(cfg: SimConfig) -> LaunchPlan:
    """The launch of `cfg` with vLLM 0.33: ConfigError (naming the field) when the config has no
    `vllm serve` equivalent or the simulator would refuse it."""
    from simcore.setup import build_deployment

    if cfg.cluster is not None and cfg.cluster.kv_tier is not None:
        raise ConfigError("cluster.kv_tier: an external KV tier has no `vllm serve` equivalent "
                          "(it needs a KV connector and a storage service, e.g. LMCache, set "
                          "up beside vLLM); remove it to get the launch of the engines alone")
    cfg = _one_role_tp(cfg)
    roles = None
    warnings: list[str] = []
    notes: list[str] = []
    resolved: list[tuple[str, str, str]] = []
    if cfg.parallelism.per_role:
        # Prefill and decode instances of different TP or GPU: each role's commands at its TP,
        # on the GPUs the simulation placed it on.
        from simcore.cluster.roles import build_role_deployments, role_gpus_per_node
        roles = build_role_deployments(cfg)
        dep = roles["decode"]
        p_tp = cfg.parallelism.role_tensor_parallel_size("prefill")
        d_tp = cfg.parallelism.role_tensor_parallel_size("decode")
        if p_tp != d_tp:
            warnings.append(f"parallelism.prefill_decode: prefill instances of TP {p_tp} hand "
                            f"their KV caches to decode instances of TP {d_tp}; the NIXL "
                            "connector must support that pair of TP sizes (heterogeneous TP) in "
                            "the vLLM release deployed: check its KV-transfer documentation")
        p_gpu, d_gpu = roles["prefill"].gpu.name, dep.gpu.name
        if p_gpu != d_gpu:
            resolved.append(("GPU per role", f"prefill {p_gpu}, decode {d_gpu}",
                             "parallelism.prefill_decode"))
            notes.append(f"prefill instances run on {p_gpu} nodes and decode instances on "
                         f"{d_gpu} nodes (no node holds both); the KV cache crosses the fabric "
                         "between them, so both kinds of node need NICs on the same network")
        gpn = role_gpus_per_node(cfg)
    else:
        dep = build_deployment(cfg)
        gpn = cfg.hardware.gpus_per_node or dep.gpu.gpus_per_node
    par = cfg.parallelism
    tp, pp = par.tensor_parallel_size, par.pipeline_parallel_size
    model, quant = model_ref(cfg, dep.arch, warnings, notes)
    weights = weight_flags(cfg.model.dtype, quant, model, warnings, notes)
    kv = KV_DTYPES[cfg.model.kv_cache_dtype]
    resolved += [("model.dtype", cfg.model.dtype, "config" if "dtype" in
                  cfg.model.model_fields_set else "default" if cfg.model.dtype == "bf16"
                  else "default: the checkpoint's quantization_config"),
                 ("model.kv_cache_dtype", f"{cfg.model.kv_cache_dtype} ({dep.kv_cache_dtype})",
                  "config" if "kv_cache_dtype" in cfg.model.model_fields_set
                  else "default: the activation dtype, as vLLM's auto")]
    if cfg.model.dtype == "mxfp4":
        from simcore.model.arch import default_mxfp4_moe_layout

        layout = cfg.model.resolved_mxfp4_moe_layout(dep.gpu.name)
        stock = default_mxfp4_moe_layout(dep.gpu.name)
        chosen = cfg.model.mxfp4_moe_layout != "auto"
        resolved.append(("model.mxfp4_moe_layout", layout, "config" if chosen else
                         f"default: vLLM's MXFP4 MoE backend on {dep.gpu.name}"))
        if layout != stock:
            notes.append(f"model.mxfp4_moe_layout is {layout}, not vLLM's default on "
                         f"{dep.gpu.name} ({stock}): vLLM picks its MXFP4 MoE backend itself "
                         "(VLLM_MXFP4_USE_MARLIN=1 forces Marlin; Triton needs the "
                         "triton_kernels package); check its start-up log for the backend used")
    engine = engine_flags(cfg, dep, warnings, resolved)
    e = cfg.engine
    for key, stock in (("block_size", "16 on most attention backends"),
                       ("gpu_memory_utilization", "the same")):
        resolved.append((f"engine.{key}", f"{getattr(e, key):g}", "config" if key in
                         e.model_fields_set else f"default (vLLM {VLLM_VERSION}'s: {stock})"))
    if not e.profile_cuda_graph_memory:
        resolved.append(("engine.profile_cuda_graph_memory", "false", "config"))
        notes.append("engine.profile_cuda_graph_memory is false: run vLLM with "
                     "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0 so that it sizes the KV cache "
                     "before capturing the CUDA graphs, as the simulation did")
    resolved.append(("KV-cache blocks per engine (simulated)",
                     f"{dep.num_blocks:,} of {dep.block_size} tokens",
                     "engine.num_gpu_blocks_override" if dep.memory is None
                     else "vLLM's memory formula"))
    prefill_tail = None
    if roles is not None:
        pre = roles["prefill"]
        resolved.append(("KV-cache blocks per prefill engine (simulated; the row above: per "
                         "decode engine)", f"{pre.num_blocks:,} of {pre.block_size} tokens",
                         "vLLM's memory formula at the prefill TP"
                         + (f" on {pre.gpu.name}" if pre.gpu.name != dep.gpu.name else "")))
        if pre.gpu.name != dep.gpu.name:
            # The prefill instances' batch limits are their GPU's (the rows above: decode's).
            rows: list[tuple[str, str, str]] = []
            prefill_tail = (weights + ["--kv-cache-dtype", kv]
                            + engine_flags(cfg, pre, warnings, rows))
            resolved += [(f"{k} (prefill instances, {pre.gpu.name})", v, w)
                         for k, v, w in rows if k.startswith("engine.")]
    resolved.append(("GPUs per node", str(gpn), "hardware.gpus_per_node"
                     if cfg.hardware.gpus_per_node else f"catalog ({dep.gpu.name})"))
    if dep.memory is not None:
        notes.append(f"vLLM logs its own KV-cache size at start-up ('GPU KV cache size: N "
                     f"tokens'); the simulation assumed {(dep.num_blocks - 1) * dep.block_size:,}"
                     f" tokens per engine. If vLLM's differs, --num-gpu-blocks-override "
                     f"{dep.num_blocks} makes it match the simulation")
    head_args = ["vllm", "serve", model, "--tensor-parallel-size", str(tp),
                 "--pipeline-parallel-size", str(pp)]
    if par.enable_expert_parallel:
        head_args.append("--enable-expert-parallel")
    tail = weights + ["--kv-cache-dtype", kv] + engine

    pd = par.prefill_decode
    units: list[tuple[str, str, list[int]]] = []
    if pd is not None:
        # An expert-parallel role is one vLLM deployment whose DP ranks form its group; the
        # instances of another role are deployments of their own.
        first = {"prefill": 0, "decode": pd.num_prefill_instances}
        for role, n in (("prefill", pd.num_prefill_instances),
                        ("decode", pd.num_decode_instances)):
            members = list(range(first[role], first[role] + n))
            if par.role_expert_parallel(role):
                units.append((role, role, members))
            else:
                units += [(f"{role} {i}", role, [m]) for i, m in enumerate(members)]
    else:
        dp, reps = par.data_parallel_size, par.num_replicas
        units = [(f"replica {r}" if reps > 1 else "deployment", "mixed",
                  list(range(r * dp, (r + 1) * dp))) for r in range(reps)]
    num_ranks = sum(len(m) for _, _, m in units)
    if roles is not None:
        ranks = _role_ranks(cfg, gpn)
    else:
        ranks = _pack(num_ranks, tp * pp, gpn)
    if cfg.cluster is not None and roles is None:
        _check_placement(cfg, ranks, gpn, warnings)
    num_nodes = max(n for r in ranks for n, _ in r) + 1
    if cfg.cluster is None and num_nodes > 1:
        notes.append(f"the config has no cluster section: the plan lays the {num_ranks * tp * pp}"
                     f" GPUs on {num_nodes} nodes of {gpn}")
    slots = _Slots(ranks, [m for _, _, m in units])
    built = []
    for name, role, members in units:
        extra = []
        if role != "mixed":
            producer = "kv_producer" if role == "prefill" else "kv_consumer"
            extra = ["--kv-transfer-config", json.dumps(
                {"kv_connector": "NixlConnector", "kv_role": producer}, separators=(",", ":"))]
        if roles is not None:
            role_tp = cfg.parallelism.role_tensor_parallel_size(role)
            unit_cfg = cfg.with_section("parallelism", tensor_parallel_size=role_tp)
            unit_head = [a for a in head_args if a != "--enable-expert-parallel"]
            unit_head[unit_head.index("--tensor-parallel-size") + 1] = str(role_tp)
            if par.role_expert_parallel(role):
                unit_head.insert(unit_head.index("--pipeline-parallel-size") + 2,
                                 "--enable-expert-parallel")
            role_tail = prefill_tail if role == "prefill" and prefill_tail else tail
            built.append(_unit_commands(name, role, members, ranks, unit_cfg, gpn, unit_head,
                                        role_tail + extra, slots))
            continue
        built.append(_unit_commands(name, role, members, ranks, cfg, gpn, head_args,
                                    tail + extra, slots))
    front, proxy = _front(cfg, built, warnings, notes)
    more_warnings(cfg, num_nodes, warnings, notes)
    fabric: list[FabricRow] = []
    if cfg.cluster is not None:
        fabric = fabric_rows(cfg.cluster)
        notes.extend(fabric_caveats(cfg.cluster))
    gpu_label = dep.gpu.name
    if roles is not None and roles["prefill"].gpu.name != dep.gpu.name:
        gpu_label = f"{roles['prefill'].gpu.name} (prefill) and {dep.gpu.name} (decode)"
    return LaunchPlan(cfg.name, VLLM_VERSION, model, gpu_label, gpn, num_nodes,
                      tuple(resolved), tuple(built), front, proxy, tuple(fabric),
                      tuple(warnings), tuple(notes))


def _front(cfg: SimConfig, units: list[LaunchUnit], warnings: list[str],
           notes: list[str]) -> tuple[str, Command | None]:
    """What clients talk to: one endpoint, a load balancer over replicas, or the P/D proxy."""
    par, policy = cfg.parallelism, cfg.router.policy
    if par.prefill_decode is not None:
        pre = [u for u in units if u.role == "prefill"]
        dec = [u for u in units if u.role == "decode"]
        argv = ["python", PROXY_SCRIPT, "--port", str(PROXY_PORT), "--prefiller-hosts",
                *[u.endpoint.split(":")[0] for u in pre], "--prefiller-ports",
                *[u.endpoint.split(":")[1] for u in pre], "--decoder-hosts",
                *[u.endpoint.split(":")[0] for u in dec], "--decoder-ports",
                *[u.endpoint.split(":")[1] for u in dec]]
        proxy = Command(0, "P/D proxy (from vLLM's source tree)", tuple(argv))
        if policy != "round_robin":
            warnings.append(f"router.policy {policy}: the simulation chose prefill instances by "
                            f"{policy}; vLLM's example proxy takes them in turn")
        return (f"Clients send requests to the proxy at {host(0)}:{PROXY_PORT}: it sends each "
                "one to a prefill instance to compute its KV cache, then to a decode instance, "
                "which pulls the KV cache over NIXL and generates the output (the proxy in "
                f"vLLM's source tree at {PROXY_SCRIPT}, or any P/D router that speaks vLLM's "
                "kv_transfer_params)", proxy)
    inside = (par.data_parallel_size > 1 and policy != "least_outstanding")
    if inside:
        warnings.append(f"router.policy {policy}: inside one deployment vLLM's own load balancer "
                        "picks the data-parallel rank (fewest running + waiting requests, "
                        "counting its own in-flight ones), closest to least_outstanding; "
                        f"vLLM has no {policy} option for it")
    if par.num_replicas > 1:
        if cfg.host.api_server_count > 1:
            notes.append(f"host.api_server_count {cfg.host.api_server_count}: the simulation "
                         "shared these API server processes among all replicas; each replica "
                         "below runs its own")
        if policy == "cache_aware":
            r = cfg.router
            argv = ["vllm-router", "--host", "0.0.0.0", "--port", str(ROUTER_PORT),
                    "--policy", "cache_aware", "--cache-threshold", f"{r.cache_threshold:g}",
                    "--balance-abs-threshold", str(r.balance_abs_threshold),
                    "--balance-rel-threshold", f"{r.balance_rel_threshold:g}",
                    "--worker-urls", *[f"http://{u.endpoint}" for u in units]]
            router = Command(0, "vLLM's router (pip install vllm-router)", tuple(argv))
            return (f"{par.num_replicas} independent deployments behind vLLM's router at "
                    f"{host(0)}:{ROUTER_PORT} with its cache_aware policy (as router.policy; "
                    "the simulated router matched prompts by KV block, the real one matches "
                    "their text): " + ", ".join(u.endpoint for u in units), router)
        reports = ("; the simulated router saw load reports every "
                   f"{cfg.router.periodic_infra_update_time_s:g} s" if policy != "round_robin"
                   else "")          # round robin reads no load
        return (f"{par.num_replicas} independent deployments behind a load balancer with the "
                f"{policy} policy (as router.policy{reports}): "
                + ", ".join(u.endpoint for u in units), None)
    return f"One OpenAI-compatible endpoint: {units[0].endpoint}", None


# --- rendering ----------------------------------------------------------------------------

def _pretty(cmd: Command) -> str:
    """A command for a shell script: environment and each flag on its own continued line."""
    parts = [f"{k}={shlex.quote(v)}" for k, v in cmd.env]
    head: list[str] = []
    flags: list[str] = []
    for tok in cmd.argv:
        if tok.startswith("--") or flags:
            if tok.startswith("--"):
                flags.append(shlex.quote(tok))
            else:
                flags[-1] += " " + shlex.quote(tok)
        else:
            head.append(shlex.quote(tok))
    return " \\\n    ".join([" ".join(parts + head)] + flags)


def render_plan(p: LaunchPlan) -> str:
    """The plan as markdown: resolved settings, commands per deployment and node, the front
    end, the network settings, warnings and notes."""
    out = [f"# Launch plan: {p.name}", "",
           f"vLLM {p.vllm_version} (`vllm serve`), model `{p.model}`, {p.gpu} x "
           f"{p.gpus_per_node} per node, {p.num_nodes} node{'s' * (p.num_nodes > 1)}. "
           "`nodeN` stands for the address of node N.", "",
           "## Resolved settings", "", "| setting | value | from |", "|---|---|---|"]
    out += [f"| {s} | {v} | {w} |" for s, v, w in p.resolved]
    out += ["", "## Commands", ""]
    for u in p.units:
        out += [f"### {u.name} ({u.role}; node{'s' * (len(u.nodes) > 1)} "
                f"{', '.join(map(str, u.nodes))}; endpoint {u.endpoint})", ""]
        for c in u.commands:
            out += [f"On node{c.node}, {c.what}:", "", "```bash", _pretty(c), "```", ""]
    out += ["## Clients", "", p.front, ""]
    if p.proxy is not None:
        out += [f"On node{p.proxy.node}, {p.proxy.what}:", "", "```bash", _pretty(p.proxy),
                "```", ""]
    if p.fabric:
        out += ["## Network fabric settings", "",
                "| setting | value | unit | set on | config field |", "|---|---|---|---|---|"]
        out += [f"| {r.setting} | {r.value} | {r.unit} | {r.applies_to} | `{r.field}` |"
                for r in p.fabric]
        out.append("")
    for title, items in (("Warnings", p.warnings), ("Notes", p.notes)):
        if items:
            out += [f"## {title}", ""] + [f"- {w}" for w in items] + [""]
    return "\n".join(out)
