"""`compute.collective_skew_s`: with TP, every all-reduce of a step waits for the last rank, sigma x
E[max of tp standard normals] past the mean; nothing at TP 1; the default is the fitted value and
the run says so; it is refused where it would have no effect (the roofline, a cluster's fabric)."""

import copy

import numpy as np
import pytest

from simcore.compute.base import StepShape
from simcore.compute.roofline import expected_max_of_normals
from simcore.config import load_config, parse_config
from simcore.errors import ConfigError
from simcore.host import fitted_compute
from simcore.setup import build_deployment

BASE = {"model": {"name": "meta-llama/Llama-3.1-70B", "max_model_len": 4096},
        "hardware": {"gpu": "H100-SXM"}, "parallelism": {"tensor_parallel_size": 4},
        "workload": {"num_prompts": 4, "dataset": {"kind": "random", "input_len": 64,
                                                   "output_len": 8}}}
DECODE = StepShape.from_requests([(1, 500)] * 8)


def model(tp: int = 4, op_scale=None, **compute):
    d = copy.deepcopy(BASE)
    d["parallelism"]["tensor_parallel_size"] = tp
    d["compute"] = {"kind": "calibrated", **compute}
    return build_deployment(parse_config(d), op_scale=op_scale).step_model


def test_expected_max_of_normals_matches_closed_forms_and_sampling():
    assert expected_max_of_normals(1) == 0.0
    assert expected_max_of_normals(2) == pytest.approx(1 / np.sqrt(np.pi), rel=1e-6)
    assert expected_max_of_normals(3) == pytest.approx(1.5 / np.sqrt(np.pi), rel=1e-6)
    draws = np.random.default_rng(7).standard_normal((200_000, 8)).max(axis=1).mean()
    assert expected_max_of_normals(8) == pytest.approx(draws, rel=0.01)
    assert expected_max_of_normals(4) < expected_max_of_normals(8) < expected_max_of_normals(16)


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_every_all_reduce_of_a_step_waits_for_the_last_rank(tp):
    sigma = 2e-5
    none, skewed = model(tp, collective_skew_s=0.0), model(tp, collective_skew_s=sigma)
    extra = (2 * 80 + 1) * sigma * expected_max_of_normals(tp)     # 80 layers, and the last
    assert skewed.comm_s(DECODE) - none.comm_s(DECODE) == pytest.approx(extra, rel=1e-9)
    assert skewed.op_bounds(DECODE) == none.op_bounds(DECODE)       # compute is untouched
    a, b = none.step_time(DECODE), skewed.step_time(DECODE)
    assert b.total_s - a.total_s == pytest.approx(extra, rel=1e-6)
    # A quiet run's decode timer (the compiled path) times the step as op by op does.
    kv = int(DECODE.kv_tokens_read)
    assert skewed.decode_timer(8)(kv).total_s == pytest.approx(
        skewed._step_time(DECODE).total_s, rel=1e-12)
    assert skewed.decode_timer(8)(kv).total_s - none.decode_timer(8)(kv).total_s == \
        pytest.approx(extra, rel=1e-6)
    # A wait for the ranks, not link time: faster collectives leave it.
    fast = model(tp, op_scale={"communication": 0.5}, collective_skew_s=sigma)
    assert fast.comm_s(DECODE) == pytest.approx(0.5 * none.comm_s(DECODE) + extra, rel=1e-9)
    assert "TP all-reduce" in " ".join(skewed.assumption_lines())


def test_one_gpu_has_no_collective_to_wait_at():
    d = copy.deepcopy(BASE)
    d["model"]["name"] = "meta-llama/Llama-3.1-8B"
    d["parallelism"]["tensor_parallel_size"] = 1
    d["compute"] = {"kind": "calibrated"}
    m = build_deployment(parse_config(d)).step_model       # the fitted default: nothing here
    d["compute"]["collective_skew_s"] = 0.0
    assert m.step_time(DECODE) == build_deployment(parse_config(d)).step_model.step_time(DECODE)
    assert "TP all-reduce" not in " ".join(m.assumption_lines())
    d["compute"]["collective_skew_s"] = 1e-4                # set, it would have no effect
    with pytest.raises(ConfigError, match=r"^compute\.collective_skew_s: with tensor_paral"):
        build_deployment(parse_config(d))


def test_the_default_is_the_fitted_value_and_says_so():
    fitted = fitted_compute("collective_skew_s")
    assert 0.0 <= fitted <= 1e-4
    default, explicit = model(), model(collective_skew_s=fitted)
    assert default.comm_s(DECODE) == explicit.comm_s(DECODE)
    assert ("compute.collective_skew_s" in " ".join(default.assumption_lines())) == (fitted > 0)


def test_it_is_refused_where_it_would_have_no_effect():
    d = copy.deepcopy(BASE)
    d["compute"] = {"kind": "roofline", "collective_skew_s": 1e-5}
    with pytest.raises(ConfigError, match="compute.collective_skew_s"):
        parse_config(d)
    d["compute"] = {"collective_skew_s": 1e-5}            # auto: L4 has no kernel profile
    d["hardware"] = {"gpu": "L4"}
    d["model"] = {"name": "meta-llama/Llama-3.1-8B", "max_model_len": 4096}
    d["parallelism"]["tensor_parallel_size"] = 1
    with pytest.raises(ConfigError, match=r"^compute\.collective_skew_s: no kernel profile"):
        build_deployment(parse_config(d))
    cfg = load_config("examples/cluster/dense_pp_8node.yaml")
    raw = cfg.model_dump(mode="json", exclude_unset=True)
    raw["compute"] = {**raw.get("compute", {}), "kind": "calibrated", "collective_skew_s": 1e-5}
    with pytest.raises(ConfigError, match=r"^compute\.collective_skew_s: a cluster"):
        build_deployment(parse_config(raw, base_dir=cfg.base_dir))


PREFILL = StepShape.from_requests([(2048, 0)])


@pytest.mark.parametrize("tp", [2, 8])
def test_graphless_steps_scale_their_all_reduces_and_graph_replays_keep_them(tp):
    # The all-reduces of a step launched op by op (a prefill) take the scale; a decode step
    # replayed as one full CUDA graph keeps the collectives' measured time, and the skew is
    # added after the scale (a wait for the ranks, not the collective's own time).
    one = model(tp, collective_skew_s=1e-5, graphless_collective_scale=1.0)
    two = model(tp, collective_skew_s=1e-5, graphless_collective_scale=2.0)
    assert not PREFILL.runs_full_graph(one.cuda_graph_max_num_tokens)
    assert DECODE.runs_full_graph(one.cuda_graph_max_num_tokens)
    skew = one._ar_skew_s
    gather = one.comm_s(StepShape.from_requests([(2048, 0)])) - one._ar_meas(2048) - skew
    assert two.comm_s(PREFILL) - gather - skew == pytest.approx(
        2.0 * (one.comm_s(PREFILL) - gather - skew), rel=1e-9)
    assert two.comm_s(DECODE) == one.comm_s(DECODE)
    assert two.step_time(DECODE).total_s == one.step_time(DECODE).total_s
    assert two.step_time(PREFILL).total_s > one.step_time(PREFILL).total_s
    assert two.op_bounds(PREFILL) == one.op_bounds(PREFILL)           # compute is untouched
    # A quiet run's decode timer for a batch past the graphs' capture size (launched op by op)
    # times the step as op by op does.
    big = one.cuda_graph_max_num_tokens + 8
    shape = StepShape.from_requests([(1, 300)] * big)
    assert not shape.runs_full_graph(two.cuda_graph_max_num_tokens)
    kv = int(shape.kv_tokens_read)
    assert two.decode_timer(big)(kv).total_s == pytest.approx(
        two._step_time(shape).total_s, rel=1e-12)
    assert two.decode_timer(big)(kv).total_s > one.decode_timer(big)(kv).total_s
    assert "compute.graphless_collective_scale" in " ".join(two.assumption_lines())
    assert "compute.graphless_collective_scale" not in " ".join(one.assumption_lines())


def test_the_graphless_scale_defaults_to_the_fitted_value_and_is_refused_where_inert():
    fitted = fitted_compute("graphless_collective_scale")
    assert 1.0 <= fitted <= 4.0
    default, explicit = model(), model(graphless_collective_scale=fitted)
    assert default.comm_s(PREFILL) == explicit.comm_s(PREFILL)
    d = copy.deepcopy(BASE)
    d["compute"] = {"kind": "roofline", "graphless_collective_scale": 1.5}
    with pytest.raises(ConfigError, match="compute.graphless_collective_scale"):
        parse_config(d)
    d["compute"] = {"kind": "calibrated", "graphless_collective_scale": 0.5}
    with pytest.raises(ConfigError, match="graphless_collective_scale"):
        parse_config(d)
    d["compute"] = {"kind": "calibrated", "graphless_collective_scale": 1.5}
    d["model"] = {"name": "meta-llama/Llama-3.1-8B", "max_model_len": 4096}
    d["parallelism"]["tensor_parallel_size"] = 1
    with pytest.raises(ConfigError, match=r"^compute\.graphless_collective_scale: with tensor_"):
        build_deployment(parse_config(d))
    d["compute"]["graphless_collective_scale"] = 1.0         # no effect either way: accepted
    build_deployment(parse_config(d))
    cfg = load_config("examples/cluster/dense_pp_8node.yaml")
    raw = cfg.model_dump(mode="json", exclude_unset=True)
    raw["compute"] = {**raw.get("compute", {}), "kind": "calibrated",
                      "graphless_collective_scale": 1.5}
    with pytest.raises(ConfigError, match=r"^compute\.graphless_collective_scale: a cluster"):
        build_deployment(parse_config(raw, base_dir=cfg.base_dir))


def test_an_idle_expert_parallel_ranks_dummy_batch_keeps_its_measured_all_reduces():
    # An idle DP rank's dummy batch (one token, no sequence) replays its CUDA graph, so the
    # graphless scale leaves its all-reduces: a decode group step is the same at any scale.
    d = {"model": {"name": "Qwen/Qwen3-235B-A22B"}, "hardware": {"gpu": "H200"},
         "parallelism": {"tensor_parallel_size": 2, "data_parallel_size": 4,
                         "enable_expert_parallel": True},
         "workload": {"num_prompts": 10, "request_rate": 1}}
    one = StepShape(1, 1, 1, 100.0, 100, 100)
    parts = []
    for scale in (1.0, 4.0):
        d["compute"] = {"graphless_collective_scale": scale}
        m = build_deployment(parse_config(d)).step_model
        parts.append((m.group_parts([one] + [StepShape.dummy()] * 3), m.step_time(one).total_s))
    assert parts[0] == parts[1]
