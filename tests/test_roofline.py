"""The roofline step-time model: shape properties, bounds, parallelism and known magnitudes."""

import math
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from simcore.compute.base import StepShape, StepTime
from simcore.compute.decode_steps import BOUNDS, compiled_steps
from simcore.compute.assumptions import RooflineAssumptions
from simcore.compute.roofline import RooflineModel
from simcore.errors import ConfigError
from simcore.hardware import get_gpu
from simcore.model.hf import arch_from_hf_dict, load_hf_config
from simcore.model.presets import load_preset

TINY = Path(__file__).parent / "data" / "tinymodel_config.json"


def model(name="llama-3.1-8b", gpu="H100-SXM", **kw):
    return RooflineModel(load_preset(name), get_gpu(gpu), **kw)


def decode(batch, ctx=1024):
    return StepShape.from_requests([(1, ctx)] * batch)


def prefill(tokens, ctx=0):
    return StepShape.from_requests([(tokens, ctx)])


def test_is_an_uncalibrated_reference_profile():
    m = model()
    assert m.profile_id == "roofline/H100-SXM/bf16"
    assert m.calibrated is False
    assert m.relative_uncertainty == pytest.approx(0.35)
    assert model(weight_dtype="fp8", gpu="A100-80GB").profile_id == "roofline/A100-80GB/fp8"
    st = m.step_time(decode(8))
    assert isinstance(st, StepTime)
    assert st.total_s == pytest.approx(st.compute_s + st.comm_s + st.overhead_s)


def test_monotone_in_tokens_and_context():
    m = model()
    times = [m.step_time(prefill(n)).total_s for n in (1, 16, 128, 512, 2048, 8192)]
    assert times == sorted(times) and len(set(times)) == len(times)
    times = [m.step_time(decode(32, ctx)).total_s for ctx in (0, 128, 1024, 8192, 65536)]
    assert times == sorted(times) and len(set(times)) == len(times)
    times = [m.step_time(decode(b)).total_s for b in (1, 8, 64, 256)]
    assert times == sorted(times)


def test_decode_is_memory_bound_and_large_prefill_compute_bound():
    m = model()
    assert m.step_time(decode(1)).bound == "memory"
    assert m.step_time(decode(64)).bound == "memory"
    assert m.step_time(prefill(4096)).bound == "compute"


def test_llama_8b_on_h100_magnitudes():
    m = model()
    # Decode batch 1: ~16 GB of weights at ~2.7 TB/s effective, plus kernel floors and overhead.
    assert 6e-3 < m.step_time(decode(1)).total_s < 8e-3
    # 4096-token prefill: ~4096 x 2 x 7e9 FLOP at 0.7 x 989 TFLOP/s, plus attention.
    assert 80e-3 < m.step_time(prefill(4096)).total_s < 120e-3


def test_llama_8b_on_a100_is_slower_than_on_h100():
    a100, h100 = model(gpu="A100-80GB"), model()
    for shape in (decode(1), decode(64), prefill(4096)):
        assert a100.step_time(shape).total_s > h100.step_time(shape).total_s


def test_tp1_has_no_communication_and_tp8_speeds_up_a_big_prefill():
    tp1, tp8 = model(tp=1), model(tp=8)
    assert tp1.step_time(prefill(4096)).comm_s == 0.0
    assert tp8.step_time(prefill(4096)).comm_s > 0.0
    assert tp8.step_time(prefill(4096)).total_s < tp1.step_time(prefill(4096)).total_s / 2


def test_pipeline_parallel_adds_transfers_but_not_work():
    m = model("llama-3.1-70b", tp=4)
    pp = model("llama-3.1-70b", tp=4, pp=2)
    a, b = m.step_time(prefill(2048)), pp.step_time(prefill(2048))
    assert b.compute_s == pytest.approx(a.compute_s, rel=1e-9)
    assert b.comm_s > a.comm_s


def test_fp8_weights():
    bf16, fp8 = model(), model(weight_dtype="fp8")
    assert fp8.step_time(decode(1)).total_s < 0.7 * bf16.step_time(decode(1)).total_s
    assert fp8.step_time(prefill(4096)).total_s < 0.8 * bf16.step_time(prefill(4096)).total_s
    # A100 has no fp8 tensor cores: weight-only fp8 helps decode, not compute-bound prefill.
    a_bf16, a_fp8 = model(gpu="A100-80GB"), model(gpu="A100-80GB", weight_dtype="fp8")
    assert a_fp8.step_time(decode(1)).total_s < 0.7 * a_bf16.step_time(decode(1)).total_s
    assert a_fp8.step_time(prefill(4096)).total_s == pytest.approx(
        a_bf16.step_time(prefill(4096)).total_s, rel=0.05)


def test_fp8_kv_cache_speeds_up_long_context_decode():
    bf16, fp8 = model(), model(kv_cache_dtype="fp8")
    assert fp8.step_time(decode(64, 8192)).total_s < 0.8 * bf16.step_time(decode(64, 8192)).total_s


def test_moe_reads_more_experts_as_the_batch_grows():
    m = model("mixtral-8x7b-v0.1", tp=2)
    one, many = m.step_time(decode(1)).total_s, m.step_time(decode(64)).total_s
    # Batch 1 touches 2 of 8 experts per layer, batch 64 nearly all of them.
    assert many > 2.5 * one
    assert m.step_time(decode(256)).total_s < 1.6 * many


def test_mla_model_steps():
    m = model("deepseek-v3", gpu="H200", tp=8, weight_dtype="fp8")
    short, long = m.step_time(decode(32, 1024)), m.step_time(decode(32, 32768))
    assert 0 < short.total_s < long.total_s
    mixed = StepShape.from_requests([(1024, 0)] + [(1, 2048)] * 16)
    assert m.step_time(mixed).total_s > short.total_s


def test_tiny_model_is_dominated_by_overheads():
    m = RooflineModel(load_hf_config(TINY), get_gpu("H100-SXM"))
    a = RooflineAssumptions()
    st = m.step_time(decode(1))
    assert st.total_s == pytest.approx(st.compute_s + a.step_overhead_s)
    # Outside full CUDA graphs the per-layer launch time shows when the GPU has little to do.
    slow_launch = RooflineModel(load_hf_config(TINY), get_gpu("H100-SXM"),
                                assumptions=RooflineAssumptions(eager_launch_s_per_layer=1e-3))
    st = slow_launch.step_time(prefill(600))
    assert st.total_s == pytest.approx(2 * 1e-3 + a.step_overhead_s)
    # Decode-only batches replay a full CUDA graph: no per-layer launch time.
    assert slow_launch.step_time(decode(1)).total_s == pytest.approx(m.step_time(decode(1)).total_s)


def test_empty_step_takes_no_time():
    assert model().step_time(StepShape(0, 0, 0, 0.0, 0)).total_s == 0.0


def test_assumptions_are_declared_and_overridable():
    slow = RooflineAssumptions(gemm_flops_fraction=0.35, step_overhead_s=0.0)
    base = model(assumptions=RooflineAssumptions(step_overhead_s=0.0))
    half = model(assumptions=slow)
    ratio = half.step_time(prefill(8192)).total_s / base.step_time(prefill(8192)).total_s
    assert 1.6 < ratio < 2.0
    for field in RooflineAssumptions.model_fields.values():
        assert field.description
    with pytest.raises(ValidationError):
        RooflineAssumptions(hbm_bandwidth_fraction=1.5)


def test_invalid_parallelism():
    with pytest.raises(ConfigError, match="does not divide"):
        model(tp=3)
    with pytest.raises(ConfigError, match="node"):
        model("llama-3.1-405b", tp=16)
    with pytest.raises(ConfigError, match="pipeline_parallel_size"):
        RooflineModel(load_hf_config(TINY), get_gpu("H100-SXM"), pp=3)


def test_interleaved_moe_layers_time_both_mlp_kinds():
    base = dict(model_type="deepseek_v2", hidden_size=2048, num_attention_heads=16,
                num_hidden_layers=4, intermediate_size=8192, vocab_size=32000,
                max_position_embeddings=4096, n_routed_experts=16, num_experts_per_tok=2,
                moe_intermediate_size=1024, kv_lora_rank=512, q_lora_rank=0,
                qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128)
    all_moe = arch_from_hf_dict(base, "test")
    interleaved = arch_from_hf_dict({**base, "moe_layer_freq": 2}, "test")
    assert interleaved.num_moe_layers() == 2
    h100 = get_gpu("H100-SXM")
    big_prefill = prefill(8192)
    # A dense layer (intermediate 8192) costs more than a MoE layer activating 2 x 1024.
    assert (RooflineModel(interleaved, h100).step_time(big_prefill).compute_s
            > RooflineModel(all_moe, h100).step_time(big_prefill).compute_s)


@pytest.mark.parametrize("example", ["quickstart.yaml", "llama70b_a100_calibrated.yaml",
                                     "qwen3_moe_h200.yaml", "deepseek_v3_fp8_h200.yaml"])
def test_linear_sums_are_cached_only_once_the_model_is_built(example):
    """`op_bounds` keeps the linear layers' sums by token count: nothing may time a step while
    a model (roofline, measured kernels) is still setting its coefficients, and a cached sum
    is the sum computed afresh, to the bit."""
    from simcore.config import load_config
    from simcore.setup import build_deployment

    model = build_deployment(load_config(Path(__file__).parent.parent / "examples" / example)
                             ).step_model
    assert model._linear_cache is None
    shapes = [StepShape.from_requests([(1, 100 + i) for i in range(n)]) for n in (1, 7, 64)]
    shapes.append(StepShape.from_requests([(512, 0), (1, 40)]))
    first = [model.op_bounds(s) for s in shapes]
    assert model._linear_cache
    assert [model.op_bounds(s) for s in shapes] == first
    by_op: dict[str, float] = {}
    assert [model.op_bounds(s, by_op=by_op) for s in shapes] == first


@pytest.mark.parametrize("example", ["quickstart.yaml", "llama70b_a100_calibrated.yaml",
                                     "qwen3_moe_h200.yaml", "deepseek_v3_fp8_h200.yaml",
                                     "llama70b_h100_tp4_sharegpt.yaml"])
@pytest.mark.parametrize("variant", ["as_shipped", "roofline", "async_offline", "constant_host",
                                     "scaled"])
def test_a_decode_timer_gives_the_step_time_of_its_shape_to_the_bit(example, variant):
    """A decode-only step timed by its batch size's `decode_timer` (as `step_time` and a quiet
    run time it) takes the StepTime that timing its shape op by op gives, to the last bit."""
    from simcore.config import load_config
    from simcore.setup import build_deployment

    cfg = load_config(Path(__file__).parent.parent / "examples" / example)
    update: dict = {}
    if variant == "roofline":
        update["compute"] = cfg.compute.model_copy(update={"kind": "roofline"})
    elif variant == "async_offline":
        update["engine"] = cfg.engine.model_copy(update={"async_scheduling": True})
        update["host"] = cfg.host.model_copy(update={"entrypoint": "offline"})
    elif variant == "constant_host":
        update["host"] = cfg.host.model_copy(update={"model": "constant"})
    cfg = cfg.model_copy(update=update)
    scale = ({"attention": 1.3, "gemm": 0.8, "overhead": 1.7, "lm_head": 1.1}
             if variant == "scaled" else None)
    model = build_deployment(cfg, op_scale=scale).step_model
    for num in (1, 3, 16, 100, 257, 1024):
        timer = model.decode_timer(num)
        assert model.decode_timer(num) is timer
        for ctx in (2, 17, 900, 4095, 30000, 200000):
            kv = num * ctx + (num // 2)
            shape = StepShape(num, num, num, float(kv), kv, kv)
            want = model._step_time(shape)
            assert timer(kv) == want
            assert model.step_time(shape) == want
            # The same step as the scheduler shapes it.
            assert model.step_time(StepShape.from_scheduled(
                [(None, 1, c) for c in [ctx - 1] * (num - 1) + [kv - (num - 1) * ctx - 1]]
            )) == want
        # A compiled quiet run times the same steps to the bit, and stops where the first one
        # ends at or after its limit.
        params = model.decode_params(num)
        if params is None:
            continue
        c, flat, ax1, g = (np.asarray(a, dtype=float) for a in params)
        k, kv0, t0 = 64, num * 900 + 3, 1.25
        cols = [np.zeros(k), np.zeros(k), np.zeros(k), np.zeros(k, dtype=np.int64), np.zeros(k)]
        assert compiled_steps()(c, flat, ax1, g, kv0, num, k, t0, math.inf, *cols) == k
        t = t0
        for j in range(k):
            st = timer(kv0 + j * num)
            t += st.total_s
            assert (cols[0][j], cols[1][j], cols[2][j], BOUNDS[cols[3][j]], cols[4][j]) == (
                st.total_s, st.compute_s, st.comm_s, st.bound, t)
        limit = float(cols[4][k // 2])
        assert compiled_steps()(c, flat, ax1, g, kv0, num, k, t0, limit, *cols) == k // 2


@pytest.mark.parametrize("gpu, rate", [("B200", "at the FP4 tensor-core peak"),
                                       ("H100-SXM", "at the bf16 tensor-core rate")])
def test_the_roofline_times_nvfp4_at_the_fp4_peak_where_the_gpu_has_one(gpu, rate):
    """Blackwell's FP4 tensor cores run NVFP4 GEMMs at 4x the bf16 peak (9 PFLOPS dense on an
    HGX B200); the catalog had no FP4 peak and timed them at the bf16 rate there too."""
    from simcore.config import parse_config
    from simcore.setup import build_deployment

    def dep(dtype):
        return build_deployment(parse_config({
            "model": {"name": "meta-llama/Llama-3.1-70B", "dtype": dtype,
                      "max_model_len": 8192},
            "hardware": {"gpu": gpu}, "compute": {"kind": "roofline"},
            "parallelism": {"tensor_parallel_size": 2}, "workload": {"num_prompts": 4}}))

    def lines(dtype):
        return [a for a in dep(dtype).assumptions() if a.startswith("nvfp4 linear layers")]

    assert len(lines("nvfp4")) == 1 and rate in lines("nvfp4")[0]
    assert lines("fp8") == []
    # A compute-bound prefill: the GEMMs' share runs at the FP4 peak only where there is one.
    prefill = StepShape.from_requests([(8192, 0)])
    by = {d: dep(d).step_model.op_bounds(prefill)[0] for d in ("nvfp4", "bf16")}
    if gpu == "B200":
        assert by["nvfp4"] < 0.5 * by["bf16"]
    else:
        assert by["nvfp4"] == pytest.approx(by["bf16"], rel=0.01)


def test_a_peak_override_the_weights_never_run_at_is_refused_and_one_they_do_is_read():
    from simcore.config import parse_config
    from simcore.setup import build_deployment

    def dep(dtype, **hardware):
        return build_deployment(parse_config({
            "model": {"name": "meta-llama/Llama-3.1-8B", "dtype": dtype, "max_model_len": 8192},
            "hardware": {"gpu": "B200", **hardware}, "compute": {"kind": "roofline"},
            "workload": {"num_prompts": 4}}))

    for dtype, peak in (("bf16", "fp4_flops"), ("bf16", "fp8_flops"), ("nvfp4", "fp8_flops"),
                        ("fp8", "fp4_flops")):
        with pytest.raises(ConfigError, match=rf"^hardware\.{peak}: only .* weights run at this "
                                              rf"peak, not model\.dtype {dtype}; remove it"):
            dep(dtype, **{peak: 1e15})
    prefill = StepShape.from_requests([(8192, 0)])
    catalog = dep("nvfp4").step_model.op_bounds(prefill)[0]
    halved = dep("nvfp4", fp4_flops=4.5e15).step_model.op_bounds(prefill)[0]
    assert halved > catalog
