"""Disaggregated expert parallelism: the prefill instances one expert-parallel group and the
decode instances another, each a deployment of its own EP size (experts per GPU, memory),
stepping in lock-step within its role, with KV handed from prefill to decode ranks."""

import pytest

from simcore.cluster.placement import place_roles
from simcore.cluster.roles import build_role_deployments
from simcore.config import parse_config
from simcore.errors import ConfigError
from simcore.simulate import simulate

QWEN3_MOE = "Qwen/Qwen3-235B-A22B"          # 128 routed experts


def mapping(n_p=4, n_d=8, *, tp=1, model=QWEN3_MOE, prompts=48, **pd):
    return {
        "name": "pd-ep", "seed": 0,
        "model": {"name": model, "dtype": "fp8", "max_model_len": 8192},
        "hardware": {"gpu": "H200"},
        "parallelism": {"tensor_parallel_size": tp, "enable_expert_parallel": True,
                        "prefill_decode": {"num_prefill_instances": n_p,
                                           "num_decode_instances": n_d, **pd}},
        "workload": {"num_prompts": prompts, "request_rate": 16,
                     "dataset": {"kind": "random", "input_len": 2000, "output_len": 64}},
        "host": {"model": "constant"},
        "cluster": {"num_nodes": 2, "fabric": {"backend": "analytical"}},
    }


def test_each_roles_instances_are_one_expert_parallel_group():
    p = place_roles(num_nodes=2, gpus_per_node=8, pp=1, num_prefill=4, num_decode=8,
                    prefill_tp=1, decode_tp=1, expert_parallel=True)
    assert p.ep_groups == ((0, 1, 2, 3), tuple(range(4, 12)))
    # Three TP-4 prefill ranks: 8 GPUs on one node and 4 on the next, so the group's experts
    # cannot spread evenly.
    with pytest.raises(ConfigError, match="parallelism.prefill_decode.num_prefill_instances: an "
                                          "expert-parallel group of 12 GPUs spreads unevenly"):
        place_roles(num_nodes=4, gpus_per_node=8, pp=1, num_prefill=3, num_decode=2,
                    prefill_tp=4, decode_tp=8, expert_parallel=True)


def test_each_role_is_an_expert_parallel_deployment_of_its_own_size():
    roles = build_role_deployments(parse_config(mapping()))
    pre, dec = roles["prefill"], roles["decode"]
    assert (pre.ep_size, dec.ep_size) == (4, 8)
    assert (pre.step_model.experts_per_gpu, dec.step_model.experts_per_gpu) == (32, 16)
    # Twice the experts per GPU leave the prefill ranks less memory for the KV cache.
    assert pre.num_blocks < dec.num_blocks


def test_ranks_of_a_role_step_together_and_hand_their_kv_to_decode_ranks():
    r = simulate(parse_config(mapping()))
    assert r["completed"] == 48
    steps = [x["num_steps"] for x in r["replicas"]]
    # Lock-step within a role: every rank of a group takes the same steps (idle ranks dummy
    # ones); the two groups step independently.
    assert len(set(steps[:4])) == 1 and len(set(steps[4:])) == 1
    assert steps[0] != steps[4]
    assert all(x["dummy_steps"] > 0 for x in r["replicas"])
    assert r["cluster"]["kv_transfers"]["num"] == 48
    ep = r["expert_parallel"]
    assert ep["roles"]["prefill"] == {"ep_size": 4, "num_lockstep_ranks": 4,
                                      "experts_per_gpu": 32, "ep_gpus_per_node": 4}
    assert ep["roles"]["decode"]["ep_size"] == 8
    assert r["num_gpus"] == 12
    # Prefill ranks run prompts only, decode ranks one-token steps only.
    assert all(x["num_decode_tokens"] == 0 for x in r["replicas"][:4])
    assert all(x["num_prefill_tokens"] == 0 for x in r["replicas"][4:])
    assert sum(x["num_decode_tokens"] for x in r["replicas"][4:]) > 0


def test_expert_parallelism_of_a_dense_model_is_refused_with_disaggregation():
    with pytest.raises(ConfigError, match="enable_expert_parallel: .* is a dense model"):
        simulate(parse_config(mapping(model="meta-llama/Llama-3.1-8B")))


def test_the_launch_plan_starts_each_role_as_one_data_parallel_deployment():
    from dse.launch import launch_plan

    plan = launch_plan(parse_config(mapping()))
    assert [u.name for u in plan.units] == ["prefill", "decode"]
    for unit, dp in zip(plan.units, (4, 8)):
        argv = list(unit.commands[0].argv)
        assert "--enable-expert-parallel" in argv
        assert argv[argv.index("--data-parallel-size") + 1] == str(dp)


def test_expert_parallelism_may_be_one_roles_alone():
    # One TP-4 prefill instance without expert parallelism, eight decode ranks of EP 8.
    cfg = parse_config(mapping(n_p=1, n_d=8, prefill_tensor_parallel_size=4,
                               decode_tensor_parallel_size=1, prefill_expert_parallel=False))
    roles = build_role_deployments(cfg)
    assert not roles["prefill"].expert_parallel and roles["decode"].ep_size == 8
    r = simulate(cfg)
    assert r["completed"] == 48
    steps = [x["num_steps"] for x in r["replicas"]]
    assert len(set(steps[1:])) == 1                 # the decode group in lock-step
    assert r["replicas"][0]["dummy_steps"] == 0     # the prefill instance steps alone
    assert set(r["expert_parallel"]["roles"]) == {"decode"}
    assert r["num_gpus"] == 12

    from dse.launch import launch_plan

    plan = launch_plan(cfg)
    assert [u.name for u in plan.units] == ["prefill 0", "decode"]
    pre, dec = (list(u.commands[0].argv) for u in plan.units)
    assert "--enable-expert-parallel" not in pre and "--enable-expert-parallel" in dec
    assert pre[pre.index("--tensor-parallel-size") + 1] == "4"


def test_a_roles_own_expert_parallelism_of_a_dense_model_names_its_field():
    m = mapping(model="meta-llama/Llama-3.1-8B", decode_expert_parallel=True)
    m["parallelism"]["enable_expert_parallel"] = False
    with pytest.raises(ConfigError, match=r"^parallelism.prefill_decode.decode_expert_parallel: "
                                          ".* is a dense model"):
        simulate(parse_config(m))
