"""Launch plans (`dse launch`): the `vllm serve` commands of a configuration, flag for flag as
the simulation resolved it, across nodes, with P/D disaggregation, and the network settings."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from dse.cli import main
from dse.launch import launch_plan, serve_command_line
from simcore.config import load_config, parse_config
from simcore.errors import ConfigError
from simcore.setup import build_deployment

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "examples" / "quickstart.yaml"
CLUSTER = ROOT / "examples" / "cluster"
DENSE_PP = CLUSTER / "dense_pp_8node.yaml"
MOE_EP = CLUSTER / "moe_ep_8node.yaml"
PD = CLUSTER / "pd_disaggregation.yaml"
KV_TIER = CLUSTER / "kv_tier.yaml"
WORKLOAD = {"num_prompts": 10, "request_rate": 1,
            "dataset": {"kind": "random", "input_len": 128, "output_len": 16}}


def _cfg(**sections):
    data = {"model": {"name": "meta-llama/Llama-3.1-8B"}, "hardware": {"gpu": "H100-SXM"},
            "workload": WORKLOAD, **sections}
    return parse_config(data, base_dir=ROOT)


def _flag(argv, name):
    """The value after flag `name` in an argument list (None when absent)."""
    argv = list(argv)
    return argv[argv.index(name) + 1] if name in argv else None


def _all_plans():
    """Every plan the tests exercise, for the check against vLLM's own parser."""
    plans = [launch_plan(load_config(p)) for p in (QUICKSTART, DENSE_PP, MOE_EP, PD)]
    plans += [launch_plan(load_config(p)) for p in sorted((ROOT / "examples").glob("*.yaml"))]
    plans += [launch_plan(c) for c in (
        _cfg(model={"name": "meta-llama/Llama-3.1-8B", "dtype": "fp8", "kv_cache_dtype": "fp8"}),
        _cfg(model={"name": "meta-llama/Llama-3.1-8B", "dtype": "fp8_block"}),
        _cfg(engine={"scheduling_policy": "priority", "watermark": 0.05,
                     "scheduler_reserve_full_isl": False, "num_gpu_blocks_override": 20000,
                     "max_num_scheduled_tokens": 1024, "enable_prefix_caching": False,
                     "enable_chunked_prefill": False, "max_num_batched_tokens": 131072,
                     "async_scheduling": True},
             host={"api_server_count": 4}, parallelism={"data_parallel_size": 2}),
        _cfg(parallelism={"tensor_parallel_size": 8, "pipeline_parallel_size": 2},
             engine={"async_scheduling": True}),
        _cfg(parallelism={"tensor_parallel_size": 4, "num_replicas": 2}))]
    return plans


# --- the quickstart: flags match the resolved deployment ------------------------------------

def test_quickstart_command_matches_its_resolved_deployment():
    cfg = load_config(QUICKSTART)
    dep = build_deployment(cfg)
    plan = launch_plan(cfg)
    argv = plan.serve_argv
    assert argv[:3] == ("vllm", "serve", "meta-llama/Llama-3.1-8B")
    assert int(_flag(argv, "--max-num-seqs")) == dep.max_num_seqs == 128
    assert int(_flag(argv, "--max-num-batched-tokens")) == dep.max_num_batched_tokens == 4096
    assert int(_flag(argv, "--max-model-len")) == dep.max_model_len
    assert _flag(argv, "--dtype") == "bfloat16" and "--quantization" not in argv
    assert _flag(argv, "--kv-cache-dtype") == "auto"
    assert _flag(argv, "--tensor-parallel-size") == "1"
    assert _flag(argv, "--block-size") == "16"
    assert float(_flag(argv, "--gpu-memory-utilization")) == cfg.engine.gpu_memory_utilization
    for flag in ("--enable-chunked-prefill", "--enable-prefix-caching", "--no-async-scheduling"):
        assert flag in argv
    for absent in ("--headless", "--api-server-count", "--scheduling-policy", "--watermark",
                   "--num-gpu-blocks-override", "--long-prefill-token-threshold"):
        assert absent not in argv
    assert len(plan.units) == 1 and len(plan.units[0].commands) == 1 and plan.num_nodes == 1
    assert serve_command_line(cfg) == plan.serve_command.line
    assert serve_command_line(cfg).startswith("vllm serve meta-llama/Llama-3.1-8B ")
    assert plan.fabric == ()


def test_defaults_the_simulator_resolved_are_passed_and_named():
    plan = launch_plan(_cfg(hardware={"gpu": "B200"}))
    argv = plan.serve_argv
    assert _flag(argv, "--max-num-seqs") == "1024"
    # vLLM 0.28 and later give GPUs of 160 GiB or more a token budget of 16,384, which the
    # simulation uses too: the command passes it and names it.
    assert _flag(argv, "--max-num-batched-tokens") == "16384"
    seqs = next(w for w in plan.warnings if w.startswith("engine.max_num_seqs not set"))
    assert "1024" in seqs
    tokens = next(w for w in plan.warnings if w.startswith("engine.max_num_batched_tokens"))
    assert "the simulation used 16384 for B200; the command passes 16384" in tokens
    assert "stock vLLM" not in tokens
    assert ("engine.max_num_seqs", "1024", "simulator default for B200") in plan.resolved
    assert _flag(launch_plan(_cfg()).serve_argv, "--max-num-batched-tokens") == "8192"


# --- dtypes -------------------------------------------------------------------------------

def test_fp8_weights_and_kv_cache_map_to_their_flags():
    plan = launch_plan(_cfg(model={"name": "meta-llama/Llama-3.1-8B", "dtype": "fp8",
                                   "kv_cache_dtype": "fp8"}))
    argv = plan.serve_argv
    assert _flag(argv, "--quantization") == "fp8"
    assert _flag(argv, "--dtype") == "bfloat16"
    assert _flag(argv, "--kv-cache-dtype") == "fp8"
    plan = launch_plan(_cfg(model={"name": "meta-llama/Llama-3.1-8B", "kv_cache_dtype": "bf16"}))
    assert _flag(plan.serve_argv, "--kv-cache-dtype") == "bfloat16"
    plan = launch_plan(_cfg(model={"name": "meta-llama/Llama-3.1-8B", "dtype": "fp16"}))
    assert _flag(plan.serve_argv, "--dtype") == "float16"


def test_block_fp8_comes_from_the_checkpoint_or_online_block_quantization():
    carried = launch_plan(_cfg(model={"name": "Qwen/Qwen3-32B-FP8", "dtype": "fp8_block"}))
    assert "--quantization" not in carried.serve_argv
    assert any("carries the quantization" in n for n in carried.notes)
    online = launch_plan(_cfg(model={"name": "meta-llama/Llama-3.1-8B", "dtype": "fp8_block"}))
    assert _flag(online.serve_argv, "--quantization") == "fp8_per_block"


def test_a_checkpoint_quantized_otherwise_than_simulated_is_warned_about():
    cfg = load_config(ROOT / "examples" / "deepseek_v3_fp8_h200.yaml")
    assert cfg.model.dtype == "fp8_block"       # the checkpoint's, as shipped
    plan = launch_plan(cfg.model_copy(update={"model": cfg.model.model_copy(
        update={"dtype": "fp8"})}))
    assert "--quantization" not in plan.serve_argv
    assert any(w.startswith("model.dtype fp8:") and "fp8_block" in w for w in plan.warnings)
    plan = launch_plan(_cfg(model={"name": "meta-llama/Llama-3.1-8B", "dtype": "int4"}))
    assert "--quantization" not in plan.serve_argv
    assert any(w.startswith("model.dtype int4:") and "AWQ or GPTQ" in w for w in plan.warnings)


def test_the_mxfp4_expert_layout_is_named_and_a_non_default_one_explained():
    gpt_oss = {"name": "openai/gpt-oss-120b", "dtype": "mxfp4", "max_model_len": 8192}
    # 256 sequences: at vLLM's 1,024 the sampler's profiling run leaves one H100 no KV cache.
    engine = {"max_num_seqs": 256}
    plan = launch_plan(_cfg(model=gpt_oss, engine=engine))
    assert ("model.mxfp4_moe_layout", "triton",
            "default: vLLM's MXFP4 MoE backend on H100-SXM") in plan.resolved
    assert not any("mxfp4_moe_layout" in n for n in plan.notes)
    plan = launch_plan(_cfg(model={**gpt_oss, "mxfp4_moe_layout": "marlin"}, engine=engine))
    assert ("model.mxfp4_moe_layout", "marlin", "config") in plan.resolved
    assert any("VLLM_MXFP4_USE_MARLIN=1" in n for n in plan.notes)


def test_gpt_oss_is_launched_from_its_own_mxfp4_checkpoint_which_its_dtype_defaults_to():
    """The checkpoint's mxfp4 quantization_config was read as nvfp4, and the plan told the user
    to replace gpt-oss with an NVFP4 checkpoint."""
    plan = launch_plan(_cfg(model={"name": "openai/gpt-oss-120b", "max_model_len": 8192},
                            engine={"max_num_seqs": 256}))
    assert ("model.dtype", "mxfp4", "default: the checkpoint's quantization_config") \
        in plan.resolved
    assert plan.serve_argv[2] == "openai/gpt-oss-120b" and "--quantization" not in plan.serve_argv
    assert not any("NVFP4" in w or "replace" in w for w in plan.warnings), plan.warnings
    assert any(n.startswith("model.dtype mxfp4: the checkpoint openai/gpt-oss-120b carries")
               for n in plan.notes)


def test_a_local_hf_config_is_served_from_its_folder(tmp_path):
    (tmp_path / "config.json").write_text(
        (ROOT / "tests" / "data" / "tinymodel_config.json").read_text())
    plan = launch_plan(_cfg(model={"hf_config": str(tmp_path / "config.json")},
                            hardware={"gpu": "H100-SXM", "memory_bytes": 40 * 2**30}))
    assert plan.serve_argv[2] == str(tmp_path)
    assert any(n.startswith("model.hf_config") for n in plan.notes)
    assert any(w.startswith("hardware:") and "memory_bytes" in w for w in plan.warnings)


# --- engine settings ----------------------------------------------------------------------

def test_engine_settings_map_to_vllm_flags():
    plan = launch_plan(_cfg(engine={"scheduling_policy": "priority", "watermark": 0.05,
                                    "scheduler_reserve_full_isl": False,
                                    "num_gpu_blocks_override": 20000,
                                    "long_prefill_token_threshold": 512,
                                    "max_num_scheduled_tokens": 1024,
                                    "enable_prefix_caching": False,
                                    "enable_chunked_prefill": False,
                                    "max_num_batched_tokens": 131072, "max_num_seqs": 64,
                                    "block_size": 32, "gpu_memory_utilization": 0.85,
                                    "async_scheduling": True},
                            host={"api_server_count": 4}))
    argv = plan.serve_argv
    assert _flag(argv, "--scheduling-policy") == "priority"
    assert _flag(argv, "--watermark") == "0.05"
    assert _flag(argv, "--num-gpu-blocks-override") == "20000"
    assert _flag(argv, "--long-prefill-token-threshold") == "512"
    assert _flag(argv, "--max-num-scheduled-tokens") == "1024"
    assert _flag(argv, "--block-size") == "32"
    assert _flag(argv, "--gpu-memory-utilization") == "0.85"
    assert _flag(argv, "--api-server-count") == "4"
    for flag in ("--no-scheduler-reserve-full-isl", "--no-enable-prefix-caching",
                 "--no-enable-chunked-prefill", "--async-scheduling"):
        assert flag in argv
    assert not plan.warnings   # every setting above is a vLLM flag


def test_a_draft_model_named_by_a_presets_short_name_is_launched_by_its_hugging_face_id():
    spec = {"method": "draft_model", "model": "Llama-3.1-8B", "num_speculative_tokens": 4,
            "acceptance_rate": 0.6}
    plan = launch_plan(parse_config({"model": {"name": "meta-llama/Llama-3.1-70B"},
                                     "hardware": {"gpu": "H100-SXM"},
                                     "parallelism": {"tensor_parallel_size": 4},
                                     "engine": {"speculative_config": spec},
                                     "workload": WORKLOAD}, base_dir=ROOT))
    config = json.loads(_flag(plan.serve_argv, "--speculative-config"))
    assert config == {"method": "draft_model", "model": "meta-llama/Llama-3.1-8B",
                      "num_speculative_tokens": 4}
    assert any("engine.speculative_config.model 'Llama-3.1-8B' is a preset's short name"
               in w for w in plan.warnings)


def test_simulator_only_options_are_warned_about_not_dropped():
    plan = launch_plan(_cfg(engine={"preemption_mode": "least_work_done",
                                    "persistent_batch": True},
                            host={"entrypoint": "offline"}))
    text = " ".join(plan.warnings)
    assert "engine.preemption_mode least_work_done: not a vLLM option" in text
    assert "engine.persistent_batch: not a vLLM option" in text
    assert "host.entrypoint offline" in text
    assert plan.serve_argv[:2] == ("vllm", "serve")


def test_router_policy_vllm_lacks_is_warned_about():
    plan = launch_plan(load_config(ROOT / "examples" / "mooncake_prefix_affinity.yaml"))
    assert _flag(plan.serve_argv, "--data-parallel-size") == "4"
    assert _flag(plan.serve_argv, "--api-server-count") == "1"   # vLLM would start 4
    assert any(w.startswith("router.policy prefix_affinity") for w in plan.warnings)


def test_replicas_are_independent_deployments_behind_the_router():
    plan = launch_plan(_cfg(parallelism={"tensor_parallel_size": 4, "num_replicas": 2},
                            router={"policy": "least_outstanding"}))
    assert [u.name for u in plan.units] == ["replica 0", "replica 1"]
    first, second = (u.commands[0] for u in plan.units)
    assert dict(first.env)["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    assert dict(second.env)["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    assert "--port" not in first.argv and _flag(second.argv, "--port") == "8001"
    assert "2 independent deployments" in plan.front and "least_outstanding" in plan.front
    assert "node0:8000" in plan.front and "node0:8001" in plan.front


def test_cache_aware_replicas_get_vllm_router_with_the_simulated_thresholds():
    plan = launch_plan(_cfg(parallelism={"tensor_parallel_size": 4, "num_replicas": 2},
                            router={"policy": "cache_aware", "cache_threshold": 0.5,
                                    "balance_abs_threshold": 8}))
    argv = plan.proxy.argv
    assert argv[0] == "vllm-router" and _flag(argv, "--policy") == "cache_aware"
    assert _flag(argv, "--cache-threshold") == "0.5"
    assert _flag(argv, "--balance-abs-threshold") == "8"
    assert _flag(argv, "--balance-rel-threshold") == "1.5"
    urls = argv[argv.index("--worker-urls") + 1:]
    assert urls == ("http://node0:8000", "http://node0:8001")
    assert "vLLM's router" in plan.front
    assert not any("router.policy" in w for w in plan.warnings)


# --- multi-node ---------------------------------------------------------------------------

def test_data_parallel_across_nodes_gives_consistent_ranks_and_addresses():
    cfg = load_config(MOE_EP)
    plan = launch_plan(cfg)
    par = cfg.parallelism
    assert len(plan.units) == par.num_replicas == 4
    assert "least_outstanding" in plan.front
    for u in plan.units:
        cmds = [c for c in u.commands if c.is_serve]
        assert len(cmds) == len(u.nodes) == 2
        head, worker = cmds
        assert head.node == u.nodes[0] and "--headless" not in head.argv
        assert "--headless" in worker.argv
        for c in cmds:
            assert "--enable-expert-parallel" in c.argv
            assert _flag(c.argv, "--data-parallel-size") == str(par.data_parallel_size)
            assert _flag(c.argv, "--data-parallel-address") == f"node{u.nodes[0]}"
            assert _flag(c.argv, "--data-parallel-rpc-port") == \
                _flag(head.argv, "--data-parallel-rpc-port")
        local = [int(_flag(c.argv, "--data-parallel-size-local")) for c in cmds]
        assert sum(local) == par.data_parallel_size and local == [8, 8]
        assert _flag(head.argv, "--data-parallel-start-rank") is None
        assert _flag(worker.argv, "--data-parallel-start-rank") == "8"
        assert u.endpoint == f"node{u.nodes[0]}:8000"
    assert sorted(n for u in plan.units for n in u.nodes) == list(range(8))


def test_ranks_spanning_nodes_start_on_a_ray_cluster():
    plan = launch_plan(load_config(DENSE_PP))
    (unit,) = plan.units
    ray = [c for c in unit.commands if c.argv[0] == "ray"]
    assert ray[0].argv == ("ray", "start", "--head", "--port=6379") and ray[0].node == 0
    assert {c.node for c in ray[1:]} == set(range(1, 8))
    assert all(c.argv[2] == "--address=node0:6379" for c in ray[1:])
    serve = plan.serve_command
    assert serve.node == 0 and unit.commands[-1] is serve
    assert _flag(serve.argv, "--distributed-executor-backend") == "ray"
    assert _flag(serve.argv, "--data-parallel-backend") == "ray"
    assert dict(serve.env)["VLLM_RAY_DP_PACK_STRATEGY"] == "span"
    assert (_flag(serve.argv, "--tensor-parallel-size"), _flag(serve.argv,
            "--pipeline-parallel-size"), _flag(serve.argv, "--data-parallel-size")) == \
        ("8", "2", "4")
    assert any("pp_microbatches" in w for w in plan.warnings)


def test_one_engine_over_two_nodes_uses_ray_or_multiprocessing_with_async_scheduling():
    plan = launch_plan(_cfg(parallelism={"tensor_parallel_size": 8,
                                         "pipeline_parallel_size": 2}))
    assert [c.argv[:2] for c in plan.units[0].commands] == \
        [("ray", "start"), ("ray", "start"), ("vllm", "serve")]
    assert "--data-parallel-backend" not in plan.serve_argv
    plan = launch_plan(_cfg(parallelism={"tensor_parallel_size": 8,
                                         "pipeline_parallel_size": 2},
                            engine={"async_scheduling": True}))
    head, other = plan.serve_commands()
    assert "--distributed-executor-backend" not in head.argv
    assert (_flag(head.argv, "--nnodes"), _flag(head.argv, "--node-rank")) == ("2", "0")
    assert (_flag(other.argv, "--node-rank"), _flag(other.argv, "--master-addr")) == \
        ("1", "node0")
    assert "--headless" in other.argv and "--headless" not in head.argv


def test_layouts_vllm_cannot_start_are_refused_naming_the_field():
    with pytest.raises(ConfigError, match=r"^engine\.async_scheduling"):
        launch_plan(_cfg(parallelism={"tensor_parallel_size": 8, "pipeline_parallel_size": 2,
                                      "data_parallel_size": 2},
                         engine={"async_scheduling": True}))
    with pytest.raises(ConfigError, match=r"^parallelism\.pipeline_parallel_size"):
        launch_plan(_cfg(parallelism={"tensor_parallel_size": 4, "pipeline_parallel_size": 3,
                                      "data_parallel_size": 2}))
    with pytest.raises(ConfigError, match=r"^cluster\.kv_tier"):
        launch_plan(load_config(KV_TIER))


# --- P/D disaggregation -------------------------------------------------------------------

def test_prefill_decode_gives_separate_commands_with_kv_transfer_configs():
    cfg = load_config(PD)
    plan = launch_plan(cfg)
    pd = cfg.parallelism.prefill_decode
    roles = [u.role for u in plan.units]
    assert roles == ["prefill"] * pd.num_prefill_instances + ["decode"] * pd.num_decode_instances
    for u in plan.units:
        (cmd,) = u.commands
        kv = json.loads(_flag(cmd.argv, "--kv-transfer-config"))
        assert kv == {"kv_connector": "NixlConnector",
                      "kv_role": "kv_producer" if u.role == "prefill" else "kv_consumer"}
        env = dict(cmd.env)
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == f"node{cmd.node}"
        assert _flag(cmd.argv, "--quantization") == "fp8"
    # two instances of TP 4 per node: their GPUs, API and side-channel ports do not collide
    by_node: dict[int, list] = {}
    for u in plan.units:
        by_node.setdefault(u.nodes[0], []).append(u.commands[0])
    for cmds in by_node.values():
        gpus = [set(dict(c.env)["CUDA_VISIBLE_DEVICES"].split(",")) for c in cmds]
        assert not gpus[0] & gpus[1]
        assert len({dict(c.env)["VLLM_NIXL_SIDE_CHANNEL_PORT"] for c in cmds}) == 2
    assert len({u.endpoint for u in plan.units}) == len(plan.units)
    proxy = plan.proxy
    assert proxy is not None and "proxy" in plan.front
    pre = [u.endpoint.split(":") for u in plan.units if u.role == "prefill"]
    i = proxy.argv.index("--prefiller-hosts")
    assert list(proxy.argv[i + 1:i + 1 + len(pre)]) == [h for h, _ in pre]
    assert any("flow" in n and "did not read" in n for n in plan.notes)


# --- the network table --------------------------------------------------------------------

def test_fabric_settings_are_listed_with_units_and_their_config_fields():
    cfg = load_config(DENSE_PP)
    rows = {r.setting: r for r in launch_plan(cfg).fabric}
    assert rows["NIC line rate"].value == "400" and rows["NIC line rate"].unit == "Gb/s"
    assert rows["NIC line rate"].field == "cluster.network.nic_gbps"
    mtu = next(r for k, r in rows.items() if k.startswith("MTU"))
    assert (mtu.value, mtu.unit) == ("4,096", "bytes")
    kmin = rows["ECN Kmin at 400 Gb/s ports"]
    assert (kmin.value, kmin.unit) == ("1,600,000", "bytes")   # 100 KB per 25 Gb/s
    assert rows["PFC (802.1Qbb)"].value == "on"
    assert rows["switch shared buffer"].value == "128,000,000"
    cnp = rows["CNP interval per flow (NP min_time_between_cnps)"]
    assert (cnp.value, cnp.unit, cnp.field) == ("4", "us",
                                                "cluster.fabric.settings.dcqcn.cnp_interval_s")
    assert rows["additive increase R_AI (RP rpg_ai_rate)"].unit == "Mb/s"
    assert all(r.field.startswith("cluster.") and r.applies_to for r in rows.values())


# --- the command --------------------------------------------------------------------------

def test_cli_prints_and_writes_the_plan(tmp_path):
    runner = CliRunner()
    res = runner.invoke(main, ["launch", str(QUICKSTART), "--out", str(tmp_path / "p.json")])
    assert res.exit_code == 0, res.output
    assert "vllm serve meta-llama/Llama-3.1-8B" in res.output
    data = json.loads((tmp_path / "p.json").read_text())
    assert data["serve_argv"][:2] == ["vllm", "serve"]
    assert data["serve_command"] == serve_command_line(load_config(QUICKSTART))
    res = runner.invoke(main, ["launch", str(PD), "--out", str(tmp_path / "sub" / "p.md")])
    assert res.exit_code == 0, res.output
    text = (tmp_path / "sub" / "p.md").read_text()
    assert text.startswith("# Launch plan") and "## Network fabric settings" in text


@pytest.mark.parametrize("args, message", [
    (["launch", "missing.yaml"], "missing.yaml"),
    (["launch", str(KV_TIER)], "cluster.kv_tier"),
    (["launch", str(QUICKSTART), "--out", "plan.txt"], "--out must end in .md"),
])
def test_cli_fails_cleanly(args, message):
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2
    assert message in res.output and "Traceback" not in res.output
    assert res.output.startswith("error: ")


# --- vLLM's own parser --------------------------------------------------------------------

def test_every_generated_command_parses_with_vllms_own_parser(monkeypatch):
    """Each `vllm serve` argument list goes through the parser `vllm serve` builds (its model
    tag, the front end's and the engine's flags); runs where vLLM is importable."""
    monkeypatch.setenv("VLLM_TARGET_DEVICE", os.environ.get("VLLM_TARGET_DEVICE", "cpu"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    pytest.importorskip("vllm")
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    try:
        from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args
    except ImportError:   # releases before the entrypoints reorganisation
        from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
    parser = make_arg_parser(FlexibleArgumentParser())
    checked = 0
    for plan in _all_plans():
        for cmd in plan.serve_commands():
            argv = list(cmd.argv[2:])
            try:
                args = parser.parse_args(argv)
            except SystemExit:
                pytest.fail(f"vLLM's parser refused: {cmd.line}")
            validate_parsed_serve_args(args)
            assert args.model_tag == plan.model
            assert args.tensor_parallel_size == int(_flag(argv, "--tensor-parallel-size"))
            assert args.max_num_seqs == int(_flag(argv, "--max-num-seqs"))
            assert args.max_num_batched_tokens == int(_flag(argv, "--max-num-batched-tokens"))
            assert args.max_model_len == int(_flag(argv, "--max-model-len"))
            assert args.enable_prefix_caching == ("--enable-prefix-caching" in argv)
            assert args.async_scheduling == ("--async-scheduling" in argv)
            assert args.headless == ("--headless" in argv)
            if "--kv-transfer-config" in argv:
                assert args.kv_transfer_config.kv_connector == "NixlConnector"
            checked += 1
    assert checked >= 20


def test_cuda_graph_memory_left_out_of_the_kv_sizing_is_carried_to_the_plan():
    plan = launch_plan(_cfg(engine={"profile_cuda_graph_memory": False}))
    assert ("engine.profile_cuda_graph_memory", "false", "config") in plan.resolved
    assert any("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0" in n for n in plan.notes)
    assert not any("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS" in n
                   for n in launch_plan(_cfg()).notes)
