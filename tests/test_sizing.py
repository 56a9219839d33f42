"""Fewest GPUs for a target rate (`dse capacity --target-rate`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from dse.capacity import parse_slos
from dse.cli import main
from dse.sizing import BOUND_MARGIN, fewest_gpus, render_sizing
from simcore.config import load_config, parse_config
from simcore.errors import ConfigError

QUICKSTART = Path(__file__).resolve().parent.parent / "examples" / "quickstart.yaml"
SLOS = parse_slos("p99_ttft_ms<=1000,p99_tpot_ms<=50")


@pytest.fixture(scope="module")
def sized():
    return fewest_gpus(load_config(QUICKSTART), 30.0, SLOS, max_gpus=8, window_s=60)


def test_the_answer_is_the_first_gpu_count_where_a_layout_meets_the_target(sized):
    best = sized.best
    assert best is not None and best.run.meets and best.run.rate == 30.0
    fewer = [o for o in sized.tried if o.num_gpus < best.num_gpus]
    assert fewer and all(o.run is None or not o.run.meets for o in fewer)
    assert all(o.num_gpus <= best.num_gpus for o in sized.tried)
    # Its own capacity is measured, from the target up: at least the rate it serves.
    assert sized.capacity.rate >= 30.0
    assert render_sizing(sized).splitlines()[1].count("x the target)") == 1


def test_a_target_no_layout_approaches_is_answered_after_one_run_per_tp():
    s = fewest_gpus(load_config(QUICKSTART), 1e6, SLOS, max_gpus=8, window_s=30,
                    max_prompts=1000)
    assert s.best is None
    run = [o for o in s.tried if o.run is not None]
    assert sorted((o.tp, o.dp) for o in run) == [(1, 1), (2, 1), (4, 1), (8, 1)]
    skipped = [o for o in s.tried if o.skipped]
    assert len(skipped) == len(s.tried) - len(run) > 0
    for o in skipped:
        alone = next(r for r in run if r.tp == o.tp).run.request_throughput
        assert o.served_alone == alone and 1e6 > BOUND_MARGIN * o.dp * alone
    text = render_sizing(s)
    assert "TP 1 x PP 1 x DP 2-8 (2-8 GPUs): not run: DP replicas serve at most" in text
    assert s.as_dict()["tried"][1]["skipped"] is True


def test_layouts_that_might_reach_the_target_are_all_run(sized):
    # 30 req/s: every layout up to the answer's GPU count is within a factor 4 of it.
    assert not any(o.skipped for o in sized.tried)


def test_layouts_that_cannot_be_deployed_are_skipped_with_their_reason():
    cfg = parse_config({"name": "big", "model": {"name": "meta-llama/Llama-3.1-70B",
                                                 "max_model_len": 8192},
                        "hardware": {"gpu": "A100-80GB"},
                        "workload": {"num_prompts": 200, "request_rate": 1,
                                     "dataset": {"kind": "random", "input_len": 256,
                                                 "output_len": 32}}})
    s = fewest_gpus(cfg, 1.0, SLOS, max_gpus=4, window_s=30)
    one = next(o for o in s.tried if o.num_gpus == 1)
    assert one.run is None and ("does not fit" in one.reason or "GiB" in one.reason)
    assert s.best is not None and s.best.num_gpus > 1 and s.best.run.meets


def test_a_bad_target_is_refused():
    with pytest.raises(ConfigError, match="--target-rate"):
        fewest_gpus(load_config(QUICKSTART), 0.0, SLOS)


@pytest.mark.parametrize("rate", [float("inf"), float("nan"), -1.0])
def test_a_target_that_is_not_a_finite_positive_rate_is_refused(rate):
    with pytest.raises(ConfigError, match="--target-rate: must be a positive, finite"):
        fewest_gpus(load_config(QUICKSTART), rate, SLOS)


def test_a_workload_of_sessions_is_refused():
    # Its rate is session starts and each turn waits for the last reply.
    cfg = load_config(QUICKSTART.parent / "multi_turn_chat.yaml")
    with pytest.raises(ConfigError, match="^workload.dataset: sessions"):
        fewest_gpus(cfg, 2.0, SLOS)
    # Agentic sessions alike.
    agent = cfg.with_section("workload", dataset=parse_config({
        **cfg.model_dump(mode="json", exclude={"base_dir"}),
        "workload": {"dataset": {"kind": "agent_sessions", "num_sessions": 4}}}).workload.dataset)
    with pytest.raises(ConfigError, match="^workload.dataset: agent_sessions: the request rate"):
        fewest_gpus(agent, 2.0, SLOS)


def test_a_layout_is_one_replica_whatever_the_config_replicates():
    cfg = load_config(QUICKSTART).with_section("parallelism", num_replicas=4)
    s = fewest_gpus(cfg, 1.0, SLOS, max_gpus=1, window_s=10, max_prompts=400)
    assert s.best is not None and s.best.num_gpus == 1
    assert s.capacity.num_gpus == 1


def test_disaggregated_layouts_keep_the_roles_gpus_and_expert_parallelism():
    from dse.sizing import Option, _option_config

    cfg = load_config(QUICKSTART.parent / "cluster" / "pd_disaggregation.yaml")
    pd = cfg.parallelism.prefill_decode.model_copy(update={"decode_gpu": "H200",
                                                           "decode_expert_parallel": False})
    cfg = cfg.with_section("parallelism", prefill_decode=pd)
    lay = _option_config(cfg, Option(2, 1, 1, None, num_prefill=3, num_decode=1,
                                     prefill_tp=1))
    got = lay.parallelism.prefill_decode
    assert (got.num_prefill_instances, got.num_decode_instances) == (3, 1)
    assert (got.prefill_tensor_parallel_size, got.decode_tensor_parallel_size) == (1, 2)
    assert got.decode_gpu == "H200" and got.decode_expert_parallel is False


def test_cli_target_rate(tmp_path):
    out = tmp_path / "sizing.json"
    res = CliRunner().invoke(main, ["capacity", str(QUICKSTART), "--target-rate", "5",
                                    "--max-gpus", "2", "--window", "30", "--quiet",
                                    "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert res.output.startswith("Fewest GPUs for 5 req/s within p99_ttft_ms <= 1000")
    assert out.is_file()


@pytest.mark.parametrize("args, message", [
    (["--max-gpus", "4"], "--max-gpus: only used with --target-rate"),
    (["--target-rate", "5", "--no-envelope"], "--no-envelope: --target-rate measures"),
])
def test_cli_refuses_options_that_would_have_no_effect(args, message):
    res = CliRunner().invoke(main, ["capacity", str(QUICKSTART), *args])
    assert res.exit_code == 2 and message in res.output


def test_a_target_far_below_the_capacity_is_answered_and_bounded_by_it():
    s = fewest_gpus(load_config(QUICKSTART), 0.001, SLOS, max_gpus=1, window_s=10,
                    max_prompts=400)
    assert s.best is not None and s.best.num_gpus == 1
    assert s.capacity.rate >= 0.001 and s.capacity.rate > 1.0


def test_no_layout_is_skipped_by_a_bound_taken_where_clients_time_out():
    cfg = load_config(QUICKSTART)
    cfg = cfg.model_copy(update={"workload": cfg.workload.model_copy(
        update={"request_timeout_s": 5.0})})
    s = fewest_gpus(cfg, 1e6, SLOS, max_gpus=2, window_s=10, max_prompts=400)
    assert s.best is None
    assert not any(o.skipped for o in s.tried) and len(s.tried) == 3


def test_no_layout_is_skipped_by_a_bound_taken_with_expert_parallelism():
    # DP ranks of an expert-parallel group share the experts: more of them hold more KV cache
    # each, so one rank's run does not bound DP of them.
    cfg = parse_config({"name": "moe", "model": {"name": "Qwen/Qwen3-30B-A3B",
                                                 "max_model_len": 2048},
                        "hardware": {"gpu": "H100-SXM"},
                        "parallelism": {"enable_expert_parallel": True},
                        "workload": {"num_prompts": 200, "request_rate": 1,
                                     "dataset": {"kind": "random", "input_len": 128,
                                                 "output_len": 16}}})
    s = fewest_gpus(cfg, 1e6, SLOS, max_gpus=2, window_s=10, max_prompts=300)
    assert s.best is None
    assert not any(o.skipped for o in s.tried) and len(s.tried) == 3


def test_a_run_that_stopped_is_listed_as_stopped_not_undeployable():
    from dse.sizing import Option, Sizing

    s = Sizing(5.0, SLOS, None, None, (
        Option(1, 1, 1, None, reason="model does not fit"),
        Option(2, 1, 1, None, reason="the KV cache cannot hold one request", stopped=True)))
    text = render_sizing(s)
    assert "TP 1 x PP 1 x DP 1 (1 GPUs): cannot be deployed (model does not fit)" in text
    assert ("TP 2 x PP 1 x DP 1 (2 GPUs): the run stopped (the KV cache cannot hold one "
            "request)") in text
    assert [o["stopped"] for o in s.as_dict()["tried"]] == [False, True]
