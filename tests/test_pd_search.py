"""Prefill and decode instances of their own TP (xPyD): placement, the KV shard mapping between
TP sizes, the handoff time against a hand computation on the analytical fabric, the serving
mode as a search dimension, and the report's aggregated-against-disaggregated comparison."""

import copy
import json
import math
from pathlib import Path

import pytest

from dse.evaluate import EvalSpec, precheck, trial_mapping
from dse.space import SERVING, SearchSpace, apply_serving, load_space
from simcore.cluster.kvpaths import kv_heads_of_rank, shard_plan
from simcore.cluster.placement import DECODE, PREFILL, place, place_roles
from simcore.config import parse_config
from simcore.errors import ConfigError
from simcore.loading import load_yaml
from simcore.model.presets import load_preset
from simcore.simulate import simulate

ROOT = Path(__file__).resolve().parents[1]
LLAMA_70B = "meta-llama/Llama-3.1-70B"

# Llama-3.1-70B: 80 layers, 8 KV heads of 128 dims, bf16 KV cache: 80 x 2 x 8 x 128 x 2 bytes.
KV_BYTES_PER_TOKEN = 80 * 2 * 8 * 128 * 2
NIC_BYTES_PER_S = 400e9 / 8
HOP_DELAY_S = 1e-6
MTU, HEADER = 4096, 62                      # RoCE framing, the fabric's default


def pd_config(prefill_tp, decode_tp, *, num_prefill=1, num_decode=1, prompt_len=4000,
              num_prompts=1, rate=None, tp=8):
    pd = {"num_prefill_instances": num_prefill, "num_decode_instances": num_decode}
    if prefill_tp is not None:
        pd["prefill_tensor_parallel_size"] = prefill_tp
    if decode_tp is not None:
        pd["decode_tensor_parallel_size"] = decode_tp
    return parse_config({
        "name": "xpyd", "seed": 0,
        "model": {"name": LLAMA_70B, "dtype": "bf16", "max_model_len": 8192},
        "hardware": {"gpu": "H100-SXM"},
        "parallelism": {"tensor_parallel_size": tp, "prefill_decode": pd},
        "engine": {"max_num_seqs": 64, "max_num_batched_tokens": 8192},
        "workload": {"num_prompts": num_prompts,
                     **({"request_rate": rate} if rate is not None else {}),
                     "dataset": {"kind": "random", "input_len": prompt_len, "output_len": 8,
                                 "range_ratio": 0.0}},
        "cluster": {"num_nodes": 2,
                    "network": {"nic_gbps": 400, "topology": {"kind": "leaf_spine",
                                                              "rails": True}},
                    "fabric": {"backend": "analytical"}},
    })


# -- placement ------------------------------------------------------------------------------------

def test_roles_of_their_own_tp_are_placed_whole_inside_nodes():
    p = place_roles(num_nodes=2, gpus_per_node=8, pp=1, num_prefill=2, num_decode=1,
                    prefill_tp=4, decode_tp=8)
    assert [i.role for i in p.instances] == [PREFILL, PREFILL, DECODE]
    assert p.instances[2].all_gpus == tuple(range(8))            # the larger TP first
    assert p.instances[0].all_gpus == (8, 9, 10, 11)
    assert p.instances[1].all_gpus == (12, 13, 14, 15)
    for inst in p.instances:
        assert p.nodes_spanned(inst.all_gpus) == 1
    assert p.num_gpus_used == 16


def test_equal_role_tps_place_as_before():
    old = place(num_nodes=2, gpus_per_node=8, tp=4, pp=1, dp=1, expert_parallel=False,
                num_prefill=2, num_decode=2)
    new = place(num_nodes=2, gpus_per_node=8, tp=4, pp=1, dp=1, expert_parallel=False,
                num_prefill=2, num_decode=2, prefill_tp=4, decode_tp=4)
    assert [i.all_gpus for i in new.instances] == [i.all_gpus for i in old.instances]


def test_a_layout_that_does_not_fit_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match="prefill_tensor_parallel_size: 3 does not divide"):
        place_roles(num_nodes=2, gpus_per_node=8, pp=1, num_prefill=1, num_decode=1,
                    prefill_tp=3, decode_tp=8)
    with pytest.raises(ConfigError, match="cluster.num_nodes: 3 prefill instances of TP 4 "
                                          r"\+ 1 decode instance of TP 8 \(PP 1\) need 20 GPUs"):
        place_roles(num_nodes=2, gpus_per_node=8, pp=1, num_prefill=3, num_decode=1,
                    prefill_tp=4, decode_tp=8)
    with pytest.raises(ConfigError, match="decode_tensor_parallel_size: model .* does not "
                                          "divide"):
        simulate(pd_config(8, 3))


def test_a_role_memory_refusal_leads_with_the_setting_responsible():
    from simcore.cluster.roles import build_role_deployments

    # The token budget's activations leave the TP-4 prefill instances no KV cache: the budget
    # is named, with the role beside it (not the role's TP before it).
    cfg = pd_config(4, 8).with_section("engine", max_num_batched_tokens=10**9)
    with pytest.raises(ConfigError, match=r"^engine\.max_num_batched_tokens \(prefill "
                                          r"instances\): no memory left for the KV cache"):
        build_role_deployments(cfg)
    # 131 GiB of weights on one GPU: the role's TP is what to change.
    with pytest.raises(ConfigError, match=r"^parallelism\.prefill_decode\."
                                          r"prefill_tensor_parallel_size: model weights"):
        build_role_deployments(pd_config(1, 8))


# -- KV shard mapping -----------------------------------------------------------------------------

def test_kv_heads_by_rank_follow_vllm():
    assert [list(kv_heads_of_rank(8, 4, r)) for r in range(4)] == [[0, 1], [2, 3], [4, 5],
                                                                   [6, 7]]
    assert [list(kv_heads_of_rank(8, 16, r)) for r in (0, 1, 2, 15)] == [[0], [0], [1], [7]]


@pytest.mark.parametrize("src_tp,dst_tp", [(4, 8), (8, 4), (2, 8), (8, 16), (16, 8), (4, 4)])
def test_each_decode_shard_reads_its_heads_from_the_prefill_shards_holding_them(src_tp, dst_tp):
    arch = load_preset(LLAMA_70B)
    plan = shard_plan(arch, "bf16", arch.num_layers, src_tp, dst_tp)
    per_head = KV_BYTES_PER_TOKEN / 8
    for r in range(dst_tp):
        want = set(kv_heads_of_rank(8, dst_tp, r))
        got = {q: b for q, rr, b in plan if rr == r}
        # Every source holds what it sends, and the reads add up to the decode shard.
        assert sum(got.values()) == pytest.approx(len(want) * per_head)
        for q, b in got.items():
            assert b / per_head <= len(set(kv_heads_of_rank(8, src_tp, q)) & want)
    if src_tp == dst_tp:
        assert [(q, r) for q, r, _ in plan] == [(r, r) for r in range(dst_tp)]
    if src_tp == 4 and dst_tp == 8:
        assert [(q, r) for q, r, _ in plan] == [(r // 2, r) for r in range(8)]
    if src_tp == 8 and dst_tp == 4:
        assert [(q, r) for q, r, _ in plan] == [(2 * r + k, r) for r in range(4)
                                                for k in range(2)]


# -- the handoff against a hand computation -------------------------------------------------------

def wire_bytes(payload):
    """Bytes a message puts on every link: payload plus one header a packet."""
    return payload + math.ceil(payload / (MTU - HEADER)) * HEADER


def handoff(cfg):
    r = simulate(cfg)
    kv = r["cluster"]["kv_transfers"]
    assert kv["num"] == 1
    return r, kv


def test_equal_tp_handoff_is_one_message_per_rail_at_nic_rate():
    # 1 prefill + 1 decode instance of TP 8 on nodes 1 and 0: decode GPU r reads its shard
    # (one KV head: L x 40,960 bytes) from prefill GPU r, the same rail: NIC -> rail leaf ->
    # NIC, two hops, alone on them. Analytical time: 2 x (d + L1 / C) + (W - L1) / C.
    L = 4000
    shard = L * KV_BYTES_PER_TOKEN // 8
    r, kv = handoff(pd_config(8, 8, prompt_len=L))
    assert kv["bytes"] == L * KV_BYTES_PER_TOKEN == 8 * shard
    W = wire_bytes(shard)
    expected = 2 * (HOP_DELAY_S + MTU / NIC_BYTES_PER_S) + (W - MTU) / NIC_BYTES_PER_S
    assert kv["mean_s"] == pytest.approx(expected, rel=1e-9)
    assert expected == pytest.approx(shard / NIC_BYTES_PER_S, rel=0.02)   # ~3.3 ms


def test_tp4_to_tp8_handoff_serialises_two_shards_on_each_prefill_nic():
    # 1 prefill instance of TP 4 (node 1, GPUs 8-11) and 1 decode instance of TP 8 (node 0):
    # prefill rank q holds heads 2q and 2q+1, and decode ranks 2q and 2q+1 each read one of
    # them from it, so each prefill NIC sends two messages of L x 40,960 bytes, one after the
    # other on its link to the rail leaf. The later one crosses rails (NIC, rail leaf, spine,
    # rail leaf, NIC: four hops), so the handoff ends after 2 W / C + 4 d + 3 L1 / C.
    L = 4000
    shard = L * KV_BYTES_PER_TOKEN // 8
    r, kv = handoff(pd_config(4, 8, prompt_len=L))
    assert kv["bytes"] == L * KV_BYTES_PER_TOKEN
    W = wire_bytes(shard)
    expected = 2 * W / NIC_BYTES_PER_S + 4 * HOP_DELAY_S + 3 * MTU / NIC_BYTES_PER_S
    assert kv["mean_s"] == pytest.approx(expected, rel=1e-9)
    assert r["num_gpus"] == 12
    roles = r["kv_cache"]["roles"]
    assert roles["prefill"]["tensor_parallel_size"] == 4
    assert roles["decode"]["kv_bytes_per_token_per_gpu"] == KV_BYTES_PER_TOKEN / 8
    assert roles["prefill"]["kv_bytes_per_token_per_gpu"] == KV_BYTES_PER_TOKEN / 4
    # The prefill role's smaller TP leaves less memory per GPU for the KV cache, and it has
    # half the GPUs: fewer tokens fit.
    assert roles["prefill"]["num_kv_tokens"] < roles["decode"]["num_kv_tokens"]


def test_the_handoff_is_the_ttft_difference_to_the_prefill_instance_alone():
    # The same request through a TP 4 prefill instance and a TP 8 decode instance: TTFT is the
    # prefill step, the handoff, then the decode instance's one-token step. Stretching the
    # handoff (a slower NIC) moves TTFT by exactly the handoff's change.
    L = 4000
    fast = simulate(pd_config(4, 8, prompt_len=L))
    slow_cfg = pd_config(4, 8, prompt_len=L)
    slow_cfg = slow_cfg.model_copy(update={"cluster": slow_cfg.cluster.model_copy(update={
        "network": slow_cfg.cluster.network.model_copy(update={"nic_gbps": 200.0})})})
    slow = simulate(slow_cfg)
    d_kv = slow["cluster"]["kv_transfers"]["mean_s"] - fast["cluster"]["kv_transfers"]["mean_s"]
    assert d_kv > 0.005
    assert slow["mean_ttft_ms"] - fast["mean_ttft_ms"] == pytest.approx(d_kv * 1e3, rel=1e-6)


def test_without_the_new_fields_a_pd_run_is_unchanged():
    plain = simulate(pd_config(None, None, tp=4, num_prompts=6, rate=4))
    same = simulate(pd_config(4, 4, tp=4, num_prompts=6, rate=4))
    # The explicit per-role path places and times equal TPs as the shared one does.
    for key in ("mean_ttft_ms", "p99_tpot_ms", "output_throughput", "num_gpus"):
        assert same[key] == pytest.approx(plain[key], rel=1e-12), key
    assert "roles" not in plain["kv_cache"]


# -- the search dimension -------------------------------------------------------------------------

SPACE = {
    "serving": ["aggregated", "disaggregated"],
    "parameters": {
        "parallelism.tensor_parallel_size": {"type": "categorical", "choices": [4, 8],
                                             "when": "aggregated"},
        "parallelism.prefill_decode.num_prefill_instances": {"type": "int", "low": 1,
                                                             "high": 3,
                                                             "when": "disaggregated"},
        "parallelism.prefill_decode.prefill_tensor_parallel_size": {
            "type": "categorical", "choices": [4, 8], "when": "disaggregated"},
        "parallelism.prefill_decode.decode_tensor_parallel_size": {
            "type": "categorical", "choices": [4, 8], "when": "disaggregated"},
    },
    "num_gpus": 16,
}


def test_the_serving_mode_needs_declaring_and_conditions_name_it():
    load_space(SPACE, "space")
    bad = copy.deepcopy(SPACE)
    del bad["serving"]
    with pytest.raises(ConfigError, match="when: aggregated needs serving to list aggregated"):
        load_space(bad, "space")
    bad = copy.deepcopy(SPACE)
    del bad["parameters"]["parallelism.prefill_decode.num_prefill_instances"]["when"]
    with pytest.raises(ConfigError, match="needs when: disaggregated"):
        load_space(bad, "space")


def test_a_trial_draws_the_mode_then_only_its_parameters():
    import optuna

    space = SearchSpace.model_validate(SPACE)
    assert list(space.active({}))[0] == SERVING
    st = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    seen = set()
    for _ in range(12):
        values = space.suggest(st.ask(), {})
        mode = values[SERVING]
        seen.add(mode)
        other = "disaggregated" if mode == "aggregated" else "aggregated"
        assert not any(p.when == other for k, p in space.parameters.items() if k in values)
    assert seen == {"aggregated", "disaggregated"}


def base_mapping():
    return {"model": {"name": LLAMA_70B, "dtype": "bf16", "max_model_len": 8192},
            "hardware": {"gpu": "H100-SXM"},
            "parallelism": {"tensor_parallel_size": 8, "data_parallel_size": 2},
            "workload": {"num_prompts": 4, "dataset": {"kind": "random", "input_len": 100,
                                                       "output_len": 4}},
            "cluster": {"num_nodes": 2, "fabric": {"backend": "analytical"}}}


def test_gpu_counts_derive_dp_or_decode_instances_and_refuse_the_rest():
    spec = EvalSpec(objectives=(), num_gpus=16, derive_dp=True, derive_decode=True)
    base = base_mapping()
    agg = {SERVING: "aggregated", "parallelism.tensor_parallel_size": 4}
    assert precheck(base, agg, {}, spec) is None
    # 2 prefill instances of TP 4 leave 8 GPUs: one decode instance of TP 8.
    dis = {SERVING: "disaggregated", "parallelism.prefill_decode.num_prefill_instances": 2,
           "parallelism.prefill_decode.prefill_tensor_parallel_size": 4,
           "parallelism.prefill_decode.decode_tensor_parallel_size": 8}
    assert precheck(base, dis, {}, spec) is None
    mapping = trial_mapping(base, dis, {})
    assert mapping["parallelism"]["data_parallel_size"] == 1
    # 3 prefill instances of TP 4 leave 4 GPUs: no whole decode instance of TP 8.
    reason = precheck(base, {**dis, "parallelism.prefill_decode.num_prefill_instances": 3},
                      {}, spec)
    assert "leave 4 of the space's num_gpus = 16" in reason
    at_most = EvalSpec(objectives=(), max_gpus=12)
    reason = precheck(base, {**dis, "parallelism.prefill_decode.num_decode_instances": 1},
                      {}, at_most)
    assert "use 16 GPUs, but the space allows at most max_gpus = 12" in reason
    # An aggregated trial drops the base's disaggregation and any prefill/decode value.
    pd_base = copy.deepcopy(base)
    pd_base["parallelism"] = {"tensor_parallel_size": 4,
                              "prefill_decode": {"num_prefill_instances": 2}}
    out, vals = apply_serving(pd_base, {**dis, SERVING: "aggregated"})
    assert "prefill_decode" not in out["parallelism"] and not vals


# -- the study and its report ---------------------------------------------------------------------

def test_a_reduced_study_names_the_winner_and_its_margin(tmp_path):
    from dse.report_files import decided_report, write_report_files
    from dse.runner import run_search
    from dse.study import parse_study

    src = ROOT / "studies" / "pd_vs_aggregated_70b.yaml"
    data = load_yaml(src)
    # The shipped space, cut to two aggregated and four disaggregated layouts (two too large
    # for the 16 GPUs), on 60 requests, every point run once by the grid.
    space = load_yaml(ROOT / "search_spaces" / "pd_vs_aggregated_16gpu.yaml")
    cut = {"parallelism.data_parallel_size": {"low": 1, "high": 2},
           "parallelism.tensor_parallel_size": {"choices": [8]},
           "engine.max_num_batched_tokens": {"choices": [4096]},
           "parallelism.prefill_decode.num_prefill_instances": {"low": 2, "high": 2},
           "parallelism.prefill_decode.num_decode_instances": {"low": 1, "high": 1}}
    for path, narrow in cut.items():
        space["parameters"][path].update(narrow)
    data["space"] = space
    data["base"]["workload"]["num_prompts"] = 60
    data["budget"] = {"n_trials": 8}
    data["sampler"] = {"kind": "grid", "seed": 0}
    data["execution"] = {"workers": 1, "trial_timeout_s": 300}
    data["report"] = {"dir": str(tmp_path / "report")}
    data["storage"] = f"sqlite:///{tmp_path / 'study.db'}"
    study = parse_study(data, source=str(src), base_dir=src.parent)
    run_search(study, progress=False)
    report = decided_report(study)
    write_report_files(report, study.report_dir, ("md", "json"))
    cmp = json.loads((tmp_path / "report" / "report.json").read_text())["serving_comparison"]
    assert cmp is not None and cmp["metric"] == "output_throughput_per_gpu"
    trials = {t["number"]: t for t in json.loads(
        (tmp_path / "report" / "report.json").read_text())["trials"]}
    sides = {m: cmp[m] for m in ("aggregated", "disaggregated")}
    assert len(trials) == 6                       # every grid point once, then no more asked
    assert sides["aggregated"]["num_trials"] == 2
    assert sides["disaggregated"]["num_trials"] == 2       # 2P(TP8)+1D(4 or 8) do not fit
    for mode, s in sides.items():
        ran = [t for t in trials.values() if t["params"].get(SERVING) == mode
               and t["state"] == "COMPLETE"]
        ok = [t for t in ran if t["feasible"]]
        assert s["num_trials"] == len(ran) and s["num_feasible"] == len(ok)
        if ok:
            best = max(ok, key=lambda t: t["values"]["output_throughput_per_gpu"])
            assert s["value"] == best["values"]["output_throughput_per_gpu"]
            assert s["trial"] == trials[s["trial"]]["number"]
        else:
            assert s["trial"] is None
    md = (tmp_path / "report" / "report.md").read_text()
    assert "## Aggregated against disaggregated serving" in md
    assert cmp["sentence"] in md.replace("\\", "")
    assert cmp["winner"] is not None          # both modes have a layout within the SLOs here
    if cmp["winner"] is not None:
        win, lose = sides[cmp["winner"]], sides[
            "aggregated" if cmp["winner"] == "disaggregated" else "disaggregated"]
        assert win["value"] >= lose["value"]
        assert cmp["margin"] == pytest.approx(win["value"] / lose["value"] - 1)
        assert cmp["sentence"].startswith(cmp["winner"].capitalize() + " " + win["layout"])
        if cmp["tie"]:
            assert cmp["margin"] < 0.005 and "within 0.5% of each other" in cmp["sentence"]
        else:
            assert f"{cmp['margin']:.0%} more output tokens/s per GPU" in cmp["sentence"]
    else:
        assert "met the SLOs" in cmp["sentence"] or "ran" in cmp["sentence"]


# -- fewest GPUs for a rate, disaggregated layouts included ---------------------------------------

def test_sizing_with_a_cluster_tries_disaggregated_layouts_and_says_why():
    from dse.capacity import parse_slos
    from dse.sizing import fewest_gpus, render_sizing

    cfg = parse_config({
        "name": "sizing", "seed": 0,
        "model": {"name": "meta-llama/Llama-3.1-8B", "dtype": "bf16", "max_model_len": 8192},
        "hardware": {"gpu": "H100-SXM", "gpus_per_node": 2},
        "parallelism": {"tensor_parallel_size": 1},
        "engine": {"max_num_seqs": 128, "max_num_batched_tokens": 8192},
        "workload": {"num_prompts": 100, "request_rate": 10,
                     "dataset": {"kind": "random", "input_len": 3000, "output_len": 150,
                                 "range_ratio": 0.25}},
        "cluster": {"num_nodes": 2, "fabric": {"backend": "analytical"}},
    })
    s = fewest_gpus(cfg, 14.0, parse_slos("p99_ttft_ms<=1000,p99_tpot_ms<=20"), window_s=15,
                    min_prompts=100, max_prompts=400)
    assert s.with_disaggregated and s.best is not None
    tried = [o for o in s.tried if o.run is not None]
    assert any(o.disaggregated for o in tried) and any(not o.disaggregated for o in tried)
    # Nothing on fewer GPUs meets; the answer has the widest margin among those of its count.
    assert all(not o.run.meets for o in tried if o.num_gpus < s.best.num_gpus)
    same = [o for o in tried if o.run.meets and o.num_gpus == s.best.num_gpus]
    assert s.best.margin(s.slos) == max(o.margin(s.slos) for o in same)
    mode = "disaggregated" if s.best.disaggregated else "aggregated"
    assert s.why().startswith(f"chose {mode}: no layout of fewer GPUs meets")
    assert s.as_dict()["best"]["serving"] == mode
    text = render_sizing(s)
    assert s.why() in text and "prefill x TP" in text
    # 4 GPUs at most: the cluster's.
    assert max(o.num_gpus for o in s.tried) <= 4


def test_the_launch_plan_gives_each_role_its_tp_on_its_simulated_gpus():
    from dse.launch import launch_plan

    plan = launch_plan(pd_config(4, 8, num_prefill=2, num_decode=1))
    units = {u.name: u for u in plan.units}
    assert set(units) == {"prefill 0", "prefill 1", "decode 0"}

    def tp_of(u):
        argv = list(u.commands[0].argv)
        return int(argv[argv.index("--tensor-parallel-size") + 1])

    assert [tp_of(units[n]) for n in ("prefill 0", "prefill 1", "decode 0")] == [4, 4, 8]
    assert units["decode 0"].nodes == (0,) and units["prefill 0"].nodes == (1,)
    assert dict(units["prefill 1"].commands[0].env)["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    assert any("heterogeneous TP" in w for w in plan.warnings)
    # Equal TPs set per role are the plain disaggregated plan.
    same = launch_plan(pd_config(4, 4, num_prefill=2, num_decode=2))
    assert not any("heterogeneous TP" in w for w in same.warnings)
