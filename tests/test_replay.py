"""Open-loop replay of recorded scheduler-step logs through the step DAG and the fabric."""

import gzip
import json
from functools import cache

import pytest

from simcore.cluster.replay import logged_batches, read_step_log, replay_steps
from simcore.compute.base import StepShape
from simcore.config import SimConfig
from simcore.engine import conformance
from simcore.engine.conformance import load_scenario, read_steps, step_log_header
from simcore.engine.scheduler import Scheduler
from simcore.errors import ConfigError
from simcore.setup import build_deployment
from simcore.reference_data import CONFORMANCE_DIR as DATA

GOLDEN = DATA / "golden"
NAMES = sorted(p.name.removesuffix(".json.gz") for p in (DATA / "scenarios").glob("*.json.gz"))


def config(*, num_nodes=1, tp=1, pp=1, dp=1, backend="analytical", trace=None) -> SimConfig:
    """A small cluster config: Llama-3.1-8B on H100-SXM nodes."""
    cluster = {"num_nodes": num_nodes, "fabric": {"backend": backend}}
    if trace is not None:
        cluster["trace"] = trace
    return SimConfig.model_validate({
        "name": "replay", "seed": 0,
        "model": {"name": "meta-llama/Llama-3.1-8B"}, "hardware": {"gpu": "H100-SXM"},
        "parallelism": {"tensor_parallel_size": tp, "pipeline_parallel_size": pp,
                        "data_parallel_size": dp},
        "workload": {"num_prompts": 20, "request_rate": 10,
                     "dataset": {"kind": "random", "input_len": 128, "output_len": 16}},
        "cluster": cluster})


@cache
def scheduler_plans(name: str) -> tuple:
    """Every step's (request id, new tokens, computed before) as the scheduler itself planned it
    on the scenario whose vLLM decisions the golden log records; () for a step with nothing to
    run (the scheduler is not asked then)."""
    plans = []

    class Recording(Scheduler):
        def schedule(self):
            out = super().schedule()
            if out.scheduled:       # a step that runs nothing (e.g. all wait for blocks) has no plan
                plans.append(tuple((r.request_id, n, c) for r, n, c in out.scheduled))
            return out

    saved = conformance.Scheduler
    conformance.Scheduler = Recording
    try:
        steps = list(conformance.replay(load_scenario(DATA / "scenarios" / f"{name}.json.gz")))
    finally:
        conformance.Scheduler = saved
    it = iter(plans)
    return tuple(next(it) if s["scheduled"] else () for s in steps)


def write_log(path, lines) -> str:
    path.write_text("".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n"
                            for ln in lines))
    return str(path)


# -- what each step runs -----------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_rebuilt_batches_are_the_schedulers_own(name):
    """The computed tokens rebuilt from the log are those the scheduler had (it matches vLLM)."""
    batches, num_assumed = logged_batches(read_step_log(GOLDEN / f"{name}.jsonl.gz"))
    assert [tuple(b) for b in batches] == list(scheduler_plans(name))
    assert num_assumed == 0


def test_preemption_restarts_and_missing_fields_are_derived():
    steps = [
        {"step": 0, "scheduled": {"a": 100}, "new": ["a"], "computed_on_admit": {"a": 32}},
        {"step": 1, "scheduled": {"a": 1, "b": 50}, "new": ["b"]},            # no hit logged
        {"step": 2, "scheduled": {"b": 1}, "preempted": ["a"]},
        {"step": 3, "scheduled": {"b": 1, "a": 69}, "resumed": ["a"],
         "computed_on_admit": {"a": 64}, "finished": ["b"]},
        {"step": 4, "scheduled": {"a": 1, "c": 5}},                           # c: never admitted
    ]
    batches, num_assumed = logged_batches([(i + 1, s) for i, s in enumerate(steps)])
    assert batches == [[("a", 100, 32)], [("a", 1, 132), ("b", 50, 0)], [("b", 1, 50)],
                       [("b", 1, 51), ("a", 69, 64)], [("a", 1, 133), ("c", 5, 0)]]
    assert num_assumed == 2


# -- on the clock --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_one_node_replay_equals_the_roofline(name):
    """With one node and the analytical fabric the step DAG is the roofline, step for step."""
    cfg = config()
    r = replay_steps(cfg, GOLDEN / f"{name}.jsonl.gz")
    model = build_deployment(cfg).step_model
    plans = scheduler_plans(name)
    assert r["num_steps"] == len(plans) == len(r["step_times_s"])
    assert r["num_executed_steps"] == sum(1 for p in plans if p)
    for t, plan in zip(r["step_times_s"], plans):
        if plan:
            ref = model.step_time(StepShape.from_requests([(n, c) for _, n, c in plan])).total_s
            assert t == pytest.approx(ref, rel=1e-9)
        else:
            assert t == 0.0
    assert r["total_s"] == pytest.approx(sum(r["step_times_s"]), rel=1e-9)
    assert r["cluster"]["fabric"]["payload_bytes"] == 0
    assert r["num_prefill_tokens"] + r["num_decode_tokens"] == sum(
        n for plan in plans for _, n, _ in plan)


def test_one_node_tensor_parallel_replay_equals_the_roofline():
    cfg = config(tp=4)
    r = replay_steps(cfg, GOLDEN / "basic.jsonl.gz")
    model = build_deployment(cfg).step_model
    for t, plan in zip(r["step_times_s"], scheduler_plans("basic")):
        if plan:
            ref = model.step_time(StepShape.from_requests([(n, c) for _, n, c in plan])).total_s
            assert t == pytest.approx(ref, rel=1e-9)
    assert r["comm_s"] > 0


@pytest.mark.parametrize("backend", ["analytical", "flow", "packet"])
def test_pipeline_across_two_nodes_crosses_the_fabric(backend):
    one = replay_steps(config(tp=8, pp=2, num_nodes=2, backend="analytical"),
                       GOLDEN / "basic.jsonl.gz")
    r = replay_steps(config(tp=8, pp=2, num_nodes=2, backend=backend), GOLDEN / "basic.jsonl.gz")
    c = r["cluster"]
    assert c["backend"] == backend and c["num_nodes"] == 2 and c["gpus_used"] == 16
    assert c["num_steps"] == r["num_executed_steps"] == 288
    assert c["fabric"]["payload_bytes"] > 0 and c["fabric"]["num_step_messages"] > 0
    assert c["exposed_gpu_s"].get("pp_send/fabric", 0) > 0
    assert 0 < c["fabric_share_of_step_time"] <= c["network_share_of_step_time"] < 1
    # No other traffic: every fabric at least as slow as each message alone on the network.
    assert r["total_s"] >= one["total_s"] * (1 - 1e-9)


def test_any_engine_of_the_placement_can_replay():
    cfg = config(dp=2)
    a = replay_steps(cfg, GOLDEN / "nochunk.jsonl.gz", instance=0)
    b = replay_steps(cfg, GOLDEN / "nochunk.jsonl.gz", instance=1)
    assert b["instance"] == 1
    assert b["step_times_s"] == pytest.approx(a["step_times_s"], rel=1e-12)
    with pytest.raises(ConfigError, match="instance 2: the placement has 2 engines"):
        replay_steps(cfg, GOLDEN / "nochunk.jsonl.gz", instance=2)


def test_trace_window_counts_executed_steps():
    r = replay_steps(config(tp=8, pp=2, num_nodes=2, trace={"first_step": 4, "num_steps": 3}),
                     GOLDEN / "prefix.jsonl.gz")
    ev = r["trace"]["traceEvents"]
    assert r["trace"]["displayTimeUnit"] == "ms"
    spans = [e for e in ev if e["ph"] == "X"]
    assert spans and {e["args"]["step"] for e in spans} == {4, 5, 6}
    assert any(e["args"].get("medium") == "fabric" for e in spans)
    assert "trace" not in replay_steps(config(), GOLDEN / "prefix.jsonl.gz")


def test_a_logged_header_is_read_and_changes_nothing(tmp_path):
    steps = read_steps(GOLDEN / "basic.jsonl.gz")
    path = write_log(tmp_path / "h.jsonl", [step_log_header(), *steps])
    with_header = replay_steps(config(), path)
    without = replay_steps(config(), GOLDEN / "basic.jsonl.gz")
    assert with_header["step_times_s"] == without["step_times_s"]
    gz = tmp_path / "h.jsonl.gz"
    with gzip.open(gz, "wt") as f:
        f.write(json.dumps(step_log_header()) + "\n")
    with pytest.raises(ConfigError, match="holds no steps"):
        replay_steps(config(), gz)


# -- bad input -----------------------------------------------------------------------------------


STEP = {"step": 0, "scheduled": {"a": 8}, "new": ["a"]}


@pytest.mark.parametrize("lines, words", [
    ([{"format": "scheduler-step-log", "version": 2}, STEP], ["line 1", "version 2"]),
    ([{"format": "other-log", "version": 1}, STEP], ["line 1", "'other-log'"]),
    ([STEP, {"format": "scheduler-step-log", "version": 1}], ["line 2", "only come first"]),
    ([STEP, "{not json"], ["line 2", "not valid JSON"]),
    ([STEP, "", "[1, 2]"], ["line 3", "must be a JSON object"]),
    ([STEP, {"step": 1, "new": ["b"]}], ["line 2", "scheduled", "missing"]),
    ([STEP, {"step": 1, "scheduled": {"a": 0}}], ["line 2", "scheduled['a']", "positive"]),
    ([STEP, {"step": 1, "scheduled": {"a": "1"}}], ["line 2", "scheduled['a']"]),
    ([STEP, {"step": 1, "scheduled": {}, "preempted": "a"}], ["line 2", "preempted"]),
    ([STEP, {"step": 1, "scheduled": {}, "computed_on_admit": {"a": -1}}],
     ["line 2", "computed_on_admit"]),
    ([STEP, {"step": 0, "scheduled": {"a": 1}}], ["line 2", "step 0 does not follow step 0"]),
    ([STEP, {"step": "1", "scheduled": {"a": 1}}], ["line 2", "step must be"]),
    ([], ["holds no steps"]),
])
def test_bad_logs_name_the_file_and_line(tmp_path, lines, words):
    path = write_log(tmp_path / "bad.jsonl", lines)
    with pytest.raises(ConfigError) as e:
        replay_steps(config(), path)
    msg = str(e.value)
    assert msg.startswith(path) and "\n" not in msg
    for w in words:
        assert w in msg, (w, msg)


def test_missing_log_and_missing_cluster(tmp_path):
    with pytest.raises(ConfigError, match="no such step log"):
        replay_steps(config(), tmp_path / "none.jsonl")
    with pytest.raises(ConfigError, match="is a folder"):
        replay_steps(config(), tmp_path)
    plain = config().model_copy(update={"cluster": None})
    with pytest.raises(ConfigError, match="^cluster: "):
        replay_steps(plain, GOLDEN / "basic.jsonl.gz")


def test_a_log_past_the_configs_engine_limits_is_refused_naming_the_step(tmp_path):
    # The basic log schedules several requests and hundreds of tokens a step: a config of two
    # sequences and 64 tokens could not have scheduled it (its step times were reported as if).
    base = config()
    tight = base.model_copy(update={"engine": base.engine.model_copy(
        update={"max_num_seqs": 2, "max_num_batched_tokens": 64})})
    with pytest.raises(ConfigError, match=r"basic.jsonl.gz: step \d+ schedules \d+ "
                                          r"(requests, more than the config's max_num_seqs \(2\)"
                                          r"|tokens, more than the config's "
                                          r"max_num_batched_tokens \(64\))"):
        replay_steps(tight, GOLDEN / "basic.jsonl.gz")
    huge = tmp_path / "huge.jsonl"
    huge.write_text(json.dumps({"step": 0, "scheduled": {"a": 100_000_000}, "new": ["a"]}) + "\n")
    with pytest.raises(ConfigError, match=r"step 0 schedules 100000000 tokens"):
        replay_steps(base, huge)
