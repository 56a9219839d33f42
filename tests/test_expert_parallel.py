"""Expert parallelism (vLLM's wide EP): config, weights and KV blocks, the lock-step group step
model, the lock-step serving loop with dummy batches, and an end-to-end EP simulation."""

import math

import numpy as np
import pytest

from simcore.compute.base import StepShape, StepTime
from simcore.compute.expert_parallel import ExpertParallelRoofline
from simcore.compute.roofline import expected_max_of_normals
from simcore.compute.assumptions import RooflineAssumptions
from simcore.compute.roofline import RooflineModel
from simcore.config import parse_config
from simcore.engine.scheduler import SchedulerConfig
from simcore.errors import ConfigError
from simcore.hardware import get_gpu
from simcore.model.arch import dtype_bytes
from simcore.model.memory import activation_peak_bytes
from simcore.model.presets import load_preset
from simcore.serve import run_serving
from simcore.setup import build_deployment
from simcore.simulate import simulate
from simcore.workload.spec import RequestSpec

DSV3 = {"name": "deepseek-ai/DeepSeek-V3", "dtype": "fp8", "max_model_len": 32768}
QWEN3 = {"name": "Qwen/Qwen3-235B-A22B", "dtype": "bf16", "max_model_len": 16384}
WORKLOAD = {"num_prompts": 40, "request_rate": 8, "dataset": {"kind": "random",
                                                              "input_len": 512,
                                                              "output_len": 32}}


def config(model=DSV3, gpu="H200", **par):
    return parse_config({"model": model, "hardware": {"gpu": gpu}, "parallelism": par,
                         "workload": WORKLOAD})


def ep_model(name="deepseek-ai/DeepSeek-V3", *, tp=1, dp=8, pp=1, dtype="fp8", gpu="H200"):
    return ExpertParallelRoofline(load_preset(name), get_gpu(gpu), tp=tp, dp=dp, pp=pp,
                                  weight_dtype=dtype)


def decode(batch, ctx=1024):
    return StepShape.from_requests([(1, ctx)] * batch)


def prefill(tokens):
    return StepShape.from_requests([(tokens, 0)])


# -- configuration ---------------------------------------------------------------------------


def test_expert_parallel_is_refused_on_a_dense_model_naming_the_field():
    cfg = config({"name": "meta-llama/Llama-3.1-8B"}, gpu="H100-SXM",
                 enable_expert_parallel=True, data_parallel_size=2)
    with pytest.raises(ConfigError) as err:
        build_deployment(cfg)
    assert str(err.value).startswith("parallelism.enable_expert_parallel: ")
    assert "dense" in str(err.value)
    with pytest.raises(ConfigError):
        ExpertParallelRoofline(load_preset("llama-3.1-8b"), get_gpu("H100-SXM"), dp=2)


def test_ep_size_is_dp_times_tp_and_pipeline_stages_are_accepted():
    cfg = config(tensor_parallel_size=2, data_parallel_size=4, enable_expert_parallel=True)
    assert cfg.parallelism.expert_parallel_size == 8
    assert config(tensor_parallel_size=2, data_parallel_size=4).parallelism \
        .expert_parallel_size == 1
    # vLLM builds one EP group of DP x TP GPUs per pipeline stage; it does not refuse PP + EP.
    dep = build_deployment(config(QWEN3, tensor_parallel_size=4, pipeline_parallel_size=2,
                                  data_parallel_size=2, enable_expert_parallel=True))
    assert dep.ep_size == 8 and dep.step_model.pp == 2
    assert dep.step_model.experts_per_gpu == 16


# -- weights and KV cache --------------------------------------------------------------------


def _expert_bytes(arch, dtype, per_gpu_experts, inter):
    return arch.num_moe_layers() * per_gpu_experts * 3 * arch.hidden_size * inter \
        * dtype_bytes(dtype)


@pytest.mark.parametrize("model, tp, dp", [(DSV3, 1, 8), (DSV3, 2, 4), (DSV3, 1, 16),
                                           (QWEN3, 8, 2), (QWEN3, 4, 4)])
def test_weights_per_gpu_are_non_expert_over_tp_plus_experts_over_ep(model, tp, dp):
    arch = load_preset(model["name"])
    dtype = model["dtype"]
    e, inter = arch.num_experts, arch.moe_intermediate_size
    ep = dp * tp
    on = build_deployment(config(model, tensor_parallel_size=tp, data_parallel_size=dp,
                                 enable_expert_parallel=True))
    # Without EP every GPU holds 1/tp of every expert; with it, ceil(E / EP) whole experts.
    tp_sharded = arch.weight_bytes_per_gpu(dtype, tp)
    non_expert = tp_sharded - _expert_bytes(arch, dtype, e, inter // tp)
    assert on.memory.weight_bytes == non_expert + _expert_bytes(arch, dtype, -(-e // ep), inter)
    assert on.step_model.experts_per_gpu == -(-e // ep)
    # The KV pool is what the same formula leaves once the new weights are paid for.
    mem = on.memory
    assert on.num_blocks == int((mem.requested_bytes - mem.weight_bytes - mem.activation_peak_bytes
                                 - mem.cuda_graph_bytes - mem.non_torch_bytes)
                                // mem.bytes_per_block)
    assert on.memory.weight_bytes < tp_sharded
    try:
        off = build_deployment(config(model, tensor_parallel_size=tp, data_parallel_size=dp))
    except ConfigError as err:          # without EP the model does not fit at this TP
        assert "weights" in str(err)
        return
    assert off.memory.weight_bytes == tp_sharded
    assert mem.bytes_per_block == off.memory.bytes_per_block
    assert on.num_blocks > off.num_blocks


def test_deepseek_v3_fp8_on_8_h200_dp_attention_trades_weights_for_kv_capacity():
    tp8 = build_deployment(config(tensor_parallel_size=8))
    dp8 = build_deployment(config(tensor_parallel_size=1, data_parallel_size=8,
                                  enable_expert_parallel=True))
    arch = load_preset("deepseek-v3")
    # TP 8 splits everything by 8; EP 8 with DP 8 keeps the non-expert weights whole per GPU.
    non_expert_tp1 = arch.weight_bytes("fp8") - _expert_bytes(arch, "fp8", 256, 2048)
    assert dp8.memory.weight_bytes == non_expert_tp1 + _expert_bytes(arch, "fp8", 32, 2048)
    assert dp8.memory.weight_bytes > tp8.memory.weight_bytes
    assert dp8.num_blocks < tp8.num_blocks
    # ... but the MLA cache is replicated over TP ranks, so eight DP ranks hold far more tokens.
    assert 8 * dp8.num_blocks > 5 * tp8.num_blocks


def test_activation_peak_with_ep_equals_tp_at_tp1_and_shrinks_with_tp():
    arch = load_preset("qwen3-235b-a22b")
    kw = dict(act_dtype_bytes=2, max_num_batched_tokens=8192, max_num_seqs=16, last_stage=False)
    assert activation_peak_bytes(arch, tp=1, ep=8, **kw) == activation_peak_bytes(arch, tp=1, **kw)
    k, inter, h = arch.num_experts_per_tok, arch.moe_intermediate_size, arch.hidden_size
    assert activation_peak_bytes(arch, tp=4, ep=16, **kw) == 8192 * 2 * (
        2 * h + max(k * (3 * inter + h) / 4, (2 * 16 + 2 * 1) * arch.head_dim))


# -- the group step model --------------------------------------------------------------------


def test_expected_max_load_normal_approximation_and_a_seeded_monte_carlo():
    m = ep_model()                                  # 256 experts, top-8, EP 8 -> 8 cells
    assert expected_max_of_normals(1) == 0.0
    z8 = expected_max_of_normals(8)
    a = 64 * 8
    assert m.expected_max_load(64) == pytest.approx(a / 8 + z8 * math.sqrt(a / 8 * 7 / 8),
                                                    rel=1e-12)
    assert m.expected_max_load(0) == 0.0
    # One cell (EP 1) takes every assignment; a single token sends at most k to one GPU.
    one = ep_model("qwen3-235b-a22b", tp=1, dp=1, dtype="fp8")
    assert one.expected_max_load(10) == 10 * 8
    assert ep_model(dp=16).expected_max_load(1) <= 8
    # Uniform top-k routing without replacement, sampled: the approximation is within 5%.
    rng = np.random.default_rng(0)
    for tokens in (16, 256):
        maxima = []
        for _ in range(400):
            experts = np.argpartition(rng.random((tokens, 256)), 8, axis=1)[:, :8]
            maxima.append(np.bincount(experts.ravel() // 32, minlength=8).max())
        assert m.expected_max_load(tokens) == pytest.approx(np.mean(maxima), rel=0.05)


def test_all_to_all_bytes_and_time_match_the_formula():
    a = RooflineAssumptions()
    h200 = get_gpu("H200")
    arch = load_preset("deepseek-v3")
    k, h, moe = arch.num_experts_per_tok, arch.hidden_size, arch.num_moe_layers()
    # One node: EP 8 (TP 2 x DP 4); each GPU holds ceil(t / tp) tokens (sequence-parallel MoE).
    m = ep_model(tp=2, dp=4)
    assert m.ep == 8 and m.ep_local == 8
    for t in (1, 7, 64, 1000):
        assert m.all_to_all_bytes(t) == math.ceil(t / 2) * k * h * 2 * 7 / 8
    ic = h200.interconnect_bandwidth_bytes_per_s * a.interconnect_bandwidth_fraction
    sent = 32 * k * h * 2
    assert m.all_to_all_s(64) == pytest.approx(
        2 * moe * (sent * 7 / 8 / ic + a.collective_hop_latency_s), rel=1e-12)
    # Two nodes: EP 16 (DP 16); 7 of 15 peers are local, 8 across the network, at once.
    wide = ep_model(tp=1, dp=16)
    assert wide.ep_local == 8
    sent = 64 * k * h * 2
    local = sent * 7 / 16 / ic + a.collective_hop_latency_s
    remote = sent * 8 / 16 / a.inter_node_bandwidth_bytes_per_s + a.inter_node_latency_s
    assert remote > local
    assert wide.all_to_all_s(64) == pytest.approx(2 * moe * remote, rel=1e-12)
    assert wide.all_to_all_bytes(64) == 64 * k * h * 2 * 15 / 16
    # One DP rank: vLLM sends no all-to-all (tokens are replicated over TP, then all-reduced).
    single = ep_model(tp=8, dp=1)
    assert single.all_to_all_bytes(64) == 0.0 and single.all_to_all_s(64) == 0.0
    st = single.step_time(decode(32))
    assert st.all_to_all_s == 0.0 and st.comm_s > 0


def test_group_step_is_slowest_rank_plus_moe_of_all_tokens_plus_all_to_all():
    m = ep_model(tp=2, dp=4)
    shapes = [prefill(2048), decode(32), decode(4), StepShape.dummy()]
    st = m.step_time_group(shapes)
    assert isinstance(st, StepTime)
    parts = [m.rank_time(s) for s in shapes]
    for cb, mb, comm in parts:
        assert st.total_s >= cb + mb + comm
    cb, mb, comm = max(parts, key=sum)
    moe_c, moe_m = m.moe_bounds(2048 + 32 + 4 + 1)
    a2a = m.all_to_all_s(2048)
    assert st.all_to_all_s == a2a > 0
    assert st.comm_s == pytest.approx(comm + a2a, rel=1e-12)
    assert st.compute_s == pytest.approx(cb + moe_c + mb + moe_m, rel=1e-12)
    assert st.total_s == pytest.approx(st.compute_s + st.comm_s + st.overhead_s)
    # More work on any rank never makes the group faster.
    assert m.step_time_group([prefill(2048), decode(64), decode(4), decode(1)]).total_s \
        >= st.total_s
    with pytest.raises(ValueError):
        m.step_time_group(shapes[:2])


def test_a_dummy_batch_reads_the_weights_but_runs_no_attention_or_sampler():
    m = ep_model(tp=1, dp=8)
    cb, mb, comm = m.rank_time(StepShape.dummy())
    assert cb == 0.0 and comm == 0.0
    one = m.rank_time(decode(1, ctx=4096))
    assert 0 < mb < one[1]
    # Everyone idle but one decode: the group waits for the experts of 8 tokens (7 dummies).
    st = m.step_time(decode(1))
    assert st.total_s == m.step_time_group([decode(1)] + [StepShape.dummy()] * 7).total_s


def test_ep_with_tp_only_matches_tp_outside_the_experts():
    # DP 1: EP = TP; the non-expert ops and the TP collectives are the plain roofline's.
    arch, gpu = load_preset("qwen3-235b-a22b"), get_gpu("H200")
    ep = ExpertParallelRoofline(arch, gpu, tp=8, dp=1)
    tp = RooflineModel(arch, gpu, tp=8)
    for shape in (decode(64), prefill(4096)):
        assert ep.rank_time(shape)[:2] == tp.op_bounds(shape, routed_experts=False)
        assert ep.rank_time(shape)[2] == tp.comm_s(shape)
    # With DP > 1 and TP > 1 the MoE all-reduce becomes an all-gather (sequence-parallel MoE).
    sp = ExpertParallelRoofline(arch, gpu, tp=8, dp=2)
    assert sp.rank_time(decode(64))[2] < tp.comm_s(decode(64))


# -- the lock-step serving loop ----------------------------------------------------------------

S = 1 / 64


class ConstantGroup:
    """Stub group model: every lock-step step takes S seconds; records what it was given."""

    profile_id = "stub/group"
    calibrated = False
    relative_uncertainty = 0.0

    def __init__(self, num_ranks):
        self.num_ranks = num_ranks
        self.calls: list[list[StepShape]] = []

    def step_time_group(self, shapes):
        self.calls.append(list(shapes))
        return StepTime(total_s=S, compute_s=S, comm_s=0.0, bound="compute")

    def step_time(self, shape):
        return self.step_time_group([shape] + [StepShape.dummy()] * (self.num_ranks - 1))


def serve_group(specs, num_ranks=2):
    model = ConstantGroup(num_ranks)
    cfg = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=2048, num_blocks=1000,
                          block_size=16, max_model_len=4096)
    run = run_serving(list(specs), sched_config=cfg, num_replicas=num_ranks, step_model=model,
                      router_policy="round_robin", report_interval_s=4 * S,
                      balance_threshold=16, max_concurrency=None, max_model_len=4096,
                      sample_interval_s=1.0, lockstep_groups=[tuple(range(num_ranks))])
    return run, model


def spec(rid, arrival_s, prompt_len, output_len):
    return RequestSpec(request_id=rid, arrival_s=arrival_s, prompt_len=prompt_len,
                       output_len=output_len, block_keys=())


def test_an_idle_rank_runs_dummy_steps_in_lock_step():
    # One request, arriving at 1 s, goes to rank 0; rank 1 has nothing and runs dummies.
    run, model = serve_group([spec("a", 1.0, 100, 4)])
    r0, r1 = run.replicas
    assert run.records[0].token_times_s == [1.0 + i * S for i in (1, 2, 3, 4)]
    assert r0.num_steps == r1.num_steps == 4
    assert r0.dummy_steps == 0 and r1.dummy_steps == 4
    assert r1.dummy_busy_s == r1.busy_s == 4 * S
    assert r1.num_tokens == 0 and r1.step_s_by_phase_bound == {"dummy/compute": 4 * S}
    assert all(call[1] == StepShape.dummy() for call in model.calls)
    assert model.calls[0][0] == StepShape.from_requests([(100, 0)])


def test_ranks_with_different_work_stay_in_step_until_the_last_finishes():
    # Rank 0 decodes 6 tokens, rank 1 only 2: rank 1 then runs 4 dummy steps.
    run, model = serve_group([spec("a", 0.0, 64, 6), spec("b", 0.0, 64, 2)])
    r0, r1 = run.replicas
    assert [r.replica for r in run.records] == [0, 1]
    assert run.records[0].token_times_s == [i * S for i in range(1, 7)]
    assert run.records[1].token_times_s == [S, 2 * S]
    assert r0.num_steps == r1.num_steps == 6
    assert (r0.dummy_steps, r1.dummy_steps) == (0, 4)
    assert len(model.calls) == 6 and run.end_s == 6 * S


def test_nothing_steps_while_every_rank_is_idle():
    run, model = serve_group([spec("a", 0.0, 16, 2), spec("b", 5.0, 16, 2)])
    assert run.records[1].token_times_s == [5.0 + S, 5.0 + 2 * S]
    assert len(model.calls) == 4
    assert [r.num_steps for r in run.replicas] == [4, 4]


def test_lockstep_groups_must_partition_the_replicas():
    with pytest.raises(ValueError, match="partition"):
        run_serving([], sched_config=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=2048,
                                                     num_blocks=100, block_size=16,
                                                     max_model_len=1024),
                    num_replicas=2, step_model=ConstantGroup(1), router_policy="round_robin",
                    report_interval_s=1.0, balance_threshold=16, max_concurrency=None,
                    max_model_len=1024, sample_interval_s=1.0, lockstep_groups=[(0,)])


# -- end to end --------------------------------------------------------------------------------


QWEN3_FP8 = {**QWEN3, "dtype": "fp8"}


@pytest.fixture(scope="module")
def ep_result():
    return simulate(config(QWEN3_FP8, tensor_parallel_size=1, data_parallel_size=4,
                           enable_expert_parallel=True))


def test_a_small_ep_simulation_completes_every_request(ep_result):
    r = ep_result
    assert r["completed"] == 40 and r["failed"] == 0
    assert r["ep_size"] == 4 and r["num_gpus"] == 4
    reps = r["replicas"]
    assert len(reps) == 4
    assert len({rep["num_steps"] for rep in reps}) == 1          # lock-step
    assert sum(rep["dummy_steps"] for rep in reps) == r["expert_parallel"]["num_dummy_steps"] > 0
    assert all(rep["all_to_all_s"] > 0 for rep in reps)
    assert 0 < r["dummy_busy_fraction"] < 1
    assert 0 < r["all_to_all_fraction_of_busy"] <= r["communication_fraction_of_busy"]
    assert r["expert_parallel"]["all_to_all"] == "intra-node"
    assert any("lock-step" in a for a in r["provenance"]["assumptions"])


def test_ep_simulation_is_deterministic(ep_result):
    again = simulate(config(QWEN3_FP8, tensor_parallel_size=1, data_parallel_size=4,
                            enable_expert_parallel=True))
    assert again == ep_result


def test_explanation_works_on_an_ep_result(ep_result):
    from dse.explain import explain

    out = explain(ep_result)
    assert out["bottleneck"] is not None and out["sentences"]


def test_the_shipped_moe_study_searches_expert_parallelism_for_moe_models_only():
    from pathlib import Path

    from dse.evaluate import precheck
    from dse.study import load_study

    study = load_study(Path(__file__).parent.parent / "studies" / "moe_expert_parallel.yaml")
    param = study.space.parameters["parallelism.enable_expert_parallel"]
    assert param.when == "moe" and set(param.choices) == {False, True}
    assert "parallelism.enable_expert_parallel" in study.space.active(study.base)
    dense = {**study.base, "model": {"name": "meta-llama/Llama-3.1-70B"}}
    assert "parallelism.enable_expert_parallel" not in study.space.active(dense)
    # DP is derived from the 16 GPUs; DeepSeek-V3 fits one GPU's share only with EP (or TP 8).
    screen = study.fidelity.screen
    for tp in (1, 2, 4):
        assert "weights" in precheck(study.base, {"parallelism.tensor_parallel_size": tp,
                                                  "parallelism.enable_expert_parallel": False},
                                     screen, study)
        assert precheck(study.base, {"parallelism.tensor_parallel_size": tp,
                                     "parallelism.enable_expert_parallel": True},
                        screen, study) is None


@pytest.mark.parametrize("dp", [1, 2])
def test_the_rank_model_reports_the_routed_experts_as_the_group_times_them(dp):
    # At any DP an expert-parallel group's roofline times the routed experts (uniform routing):
    # the rank model's provenance and error bound do not claim a measured fused-MoE table.
    d = {"model": {"name": "Qwen/Qwen3-30B-A3B"}, "hardware": {"gpu": "H100-SXM"},
         "parallelism": {"tensor_parallel_size": 2, "data_parallel_size": dp,
                         "enable_expert_parallel": True},
         "workload": {"num_prompts": 10, "request_rate": 1}}
    m = build_deployment(parse_config(d)).step_model
    assert m.rank_model.moe_routing is None
    assert "routed experts: roofline, uniform routing (expert parallelism)" in m.fallbacks()
