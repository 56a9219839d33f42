"""Golden scenarios: the scheduler makes exactly vLLM 0.33's decisions, step for step."""

import math

import pytest

from simcore.engine.conformance import compare, load_scenario, read_steps, replay
from simcore.engine.kv_cache import KVCacheManager
from simcore.engine.request import PREEMPTED, RUNNING, WAITING
from simcore.engine.scheduler import Scheduler
from simcore.errors import ConfigError
from simcore.reference_data import CONFORMANCE_DIR

DATA = CONFORMANCE_DIR
NAMES = sorted(p.name.removesuffix(".json.gz") for p in (DATA / "scenarios").glob("*.json.gz"))


def test_every_scenario_is_shipped():
    assert NAMES == ["abort", "abort_priority", "basic", "full_isl_idle", "max_scheduled",
                     "mooncake_head", "nochunk", "noprefixcache", "prefix", "pressure", "priority",
                     "priority_self_preempt", "skip_prefix", "threshold", "watermark_idle"]


@pytest.mark.parametrize("name", NAMES)
def test_every_step_matches_vllm(name):
    ours = list(replay(load_scenario(DATA / "scenarios" / f"{name}.json.gz")))
    golden = read_steps(DATA / "golden" / f"{name}.jsonl.gz")
    assert compare(ours, golden) is None
    assert ours == [dict(g) for g in golden]


@pytest.mark.parametrize("name", NAMES)
def test_every_step_matches_vllm_with_the_compiled_block_pool(name, monkeypatch):
    """The block pool in arrays (`simcore.engine.array_pool`, long runs' pool) makes the same
    decisions, step for step."""
    import dataclasses

    from simcore.engine import conformance

    base = conformance.scheduler_config
    monkeypatch.setattr(conformance, "scheduler_config",
                        lambda cfg: dataclasses.replace(base(cfg), compiled=True))
    ours = list(replay(load_scenario(DATA / "scenarios" / f"{name}.json.gz")))
    assert ours == [dict(g) for g in read_steps(DATA / "golden" / f"{name}.jsonl.gz")]


def test_goldens_discriminate_behaviours():
    """Turning off full-prompt admission changes the decisions: the comparison can fail."""
    sc = load_scenario(DATA / "scenarios" / "pressure.json.gz")
    golden = read_steps(DATA / "golden" / "pressure.jsonl.gz")
    diff = compare(list(replay(sc, reserve_full_isl=False)), golden)
    assert diff is not None and diff.startswith("step 3: scheduled differs")


def scenario(name):
    return load_scenario(DATA / "scenarios" / f"{name}.json.gz")


def golden(name):
    return read_steps(DATA / "golden" / f"{name}.jsonl.gz")


def test_priority_golden_continues_after_a_self_preemption(monkeypatch):
    """vLLM goes on scheduling the requests after a running request that preempted itself; the
    rule before (stop the running loop there) makes other decisions at step 22."""
    self_preempted = []
    pick = Scheduler._pick_victim

    def recording(sched, req, scheduled):
        victim = pick(sched, req, scheduled)
        if victim is req:
            self_preempted.append((sched.num_steps, req.request_id,
                                   [r.request_id for r in sched.running[sched.running.index(req) + 1:]]))
        return victim

    monkeypatch.setattr(Scheduler, "_pick_victim", recording)
    steps = list(replay(scenario("priority_self_preempt")))
    assert steps == golden("priority_self_preempt")
    step, rid, after = self_preempted[0]
    assert (step, rid) == (22, "low2")
    # Under the old rule nothing after low2 ran in that step; vLLM ran all of them.
    assert set(after) <= set(steps[22]["scheduled"]) and len(after) == 6
    assert len(steps[22]["scheduled"]) == 8


def _watermark_always(monkeypatch, blocks):
    """The rule before: every admission (waiting-side allocation) keeps `blocks` free."""
    allocate = KVCacheManager.allocate_slots

    def always(kv, req, n, hit=None, full=False, reserved=0):
        return allocate(kv, req, n, hit, full, blocks if hit is not None else reserved)

    monkeypatch.setattr(KVCacheManager, "allocate_slots", always)


def test_watermark_golden_admits_a_large_prompt_with_nothing_running(monkeypatch):
    sc, ref = scenario("watermark_idle"), golden("watermark_idle")
    cfg = sc["config"]
    watermark = int(cfg["watermark"] * cfg["num_blocks"])
    big = sc["requests"][0]
    assert math.ceil(big["prompt_len"] / cfg["block_size"]) > cfg["num_blocks"] - 1 - watermark
    assert ref[0]["scheduled"] == {"big0": big["prompt_len"]}
    _watermark_always(monkeypatch, watermark)
    with pytest.raises(ConfigError, match="stuck"):
        list(replay(sc))


def test_full_sequence_golden_refuses_a_prompt_larger_than_the_pool(monkeypatch):
    """vLLM checks that the whole prompt fits even with nothing running: big0 (more blocks than
    the pool) never starts, the queue behind it waits until it is aborted at step 30."""
    sc, ref = scenario("full_isl_idle"), golden("full_isl_idle")
    assert all(not r["scheduled"] for r in ref[:30]) and "big0" in ref[30]["finished"]
    allocate = KVCacheManager.allocate_slots

    def only_while_running(kv, req, n, hit=None, full=False, reserved=0):
        return allocate(kv, req, n, hit, full and bool(kv.req_blocks), reserved)

    monkeypatch.setattr(KVCacheManager, "allocate_slots", only_while_running)
    assert compare(list(replay(sc)), ref).startswith("step 0: scheduled differs")


@pytest.mark.parametrize("name", ["abort", "abort_priority"])
def test_abort_goldens_cover_waiting_running_and_preempted_requests(name, monkeypatch):
    statuses = set()
    finish = Scheduler.finish_requests

    def recording(sched, reqs):
        statuses.update(r.status for r in reqs)
        return finish(sched, reqs)

    monkeypatch.setattr(Scheduler, "finish_requests", recording)
    sc = scenario(name)
    assert list(replay(sc)) == golden(name)
    assert {WAITING, RUNNING, PREEMPTED} <= statuses
    # Without the aborts the decisions differ from the first abort on.
    first = min(r["abort_step"] for r in sc["requests"] if r["abort_step"] is not None)
    kept = {**sc, "requests": [{**r, "abort_step": None} for r in sc["requests"]]}
    assert compare(list(replay(kept)), golden(name)).startswith(f"step {first}: ")


def test_max_num_scheduled_tokens_golden_bounds_the_step():
    sc, ref = scenario("max_scheduled"), golden("max_scheduled")
    limit = sc["config"]["max_num_scheduled_tokens"]
    totals = [sum(r["scheduled"].values()) for r in ref]
    assert max(totals) == limit < sc["config"]["max_num_batched_tokens"]
    assert compare(list(replay(sc, max_num_scheduled_tokens=None)), ref) is not None


def test_skip_reading_prefix_cache_golden_finds_no_hits():
    sc, ref = scenario("skip_prefix"), golden("skip_prefix")
    skipping = {r["id"] for r in sc["requests"] if r["skip_reading_prefix_cache"]}
    hits = {rid: n for step in ref for rid, n in step["computed_on_admit"].items()}
    assert skipping and all(hits[rid] == 0 for rid in skipping if rid in hits)
    assert any(n > 0 for rid, n in hits.items() if rid not in skipping)
    read_all = {**sc, "requests": [{**r, "skip_reading_prefix_cache": False}
                                   for r in sc["requests"]]}
    assert "computed_on_admit differs" in compare(list(replay(read_all)), ref)


def test_bad_scenarios_name_the_problem(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"config": {"max_num_seqs": 4}, "requests": []}')
    with pytest.raises(ConfigError, match="config.max_num_batched_tokens is missing"):
        load_scenario(bad)
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_scenario(bad)
    with pytest.raises(ConfigError, match="no such scenario file"):
        load_scenario(tmp_path / "missing.json")
    bad.write_text('{"config": {"max_num_seqs": 4, "max_num_batched_tokens": 64, "num_blocks": 10},'
                   ' "requests": [{"id": "a", "arrive_step": 0, "prompt_len": 0, "output_len": 3}]}')
    with pytest.raises(ConfigError, match=r"requests\[0\].prompt_len"):
        load_scenario(bad)


@pytest.mark.parametrize("request_fields, message", [
    # true/false and text are not counts or flags (they replayed as 1, 0 and 157).
    ({"prompt_len": True}, r"requests\[0\].prompt_len"),
    ({"arrive_step": False}, r"requests\[0\].arrive_step"),
    ({"prompt_len": "157"}, r"requests\[0\].prompt_len"),
    ({"block_keys": [True]}, r"requests\[0\].block_keys"),
    ({"skip_reading_prefix_cache": 1}, r"requests\[0\].skip_reading_prefix_cache"),
    # Longer than max_model_len: refused up front, naming the request (the run used to stall
    # and blame the pool).
    ({"prompt_len": 2000}, r"requests\[0\].prompt_len: 2000 prompt and 3 output tokens pass "
                           r"config.max_model_len \(1000\)"),
])
def test_scenario_requests_are_read_strictly(tmp_path, request_fields, message):
    import json

    bad = tmp_path / "bad.json"
    request = {"id": "a", "arrive_step": 0, "prompt_len": 32, "output_len": 3, **request_fields}
    bad.write_text(json.dumps({"config": {"max_num_seqs": 4, "max_num_batched_tokens": 1000,
                                          "num_blocks": 400, "max_model_len": 1000},
                               "requests": [request]}))
    with pytest.raises(ConfigError, match=message):
        load_scenario(bad)


@pytest.mark.parametrize("config_fields, message", [
    # Flags and counts of the config are read as strictly as the requests' (a flag of "yes" or
    # 1 replayed as true).
    ({"enable_prefix_caching": "yes"},
     r"config\.enable_prefix_caching: expected true or false \(got 'yes'\)"),
    ({"enable_chunked_prefill": 1},
     r"config\.enable_chunked_prefill: expected true or false \(got 1\)"),
    ({"max_num_seqs": "4"}, r"config\.max_num_seqs"),
])
def test_scenario_config_flags_are_read_strictly(tmp_path, config_fields, message):
    import json

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"config": {"max_num_seqs": 4, "max_num_batched_tokens": 1000,
                                          "num_blocks": 400, **config_fields},
                               "requests": []}))
    with pytest.raises(ConfigError, match=message):
        load_scenario(bad)


def test_a_log_whose_lines_are_no_steps_is_refused_and_a_users_log_is_not_called_vllms(
        tmp_path):
    log = tmp_path / "g.jsonl"
    log.write_text("[1, 2]\n")
    with pytest.raises(ValueError, match="line 1: expected a JSON object"):
        read_steps(log)
    with pytest.raises(ValueError, match="step 0 holds none of scheduled"):
        compare([{"step": 0, "scheduled": {"a": 1}}], [{"step": 0, "foo": 1}])
    diff = compare([{"step": 0, "scheduled": {"a": 1}}], [{"step": 0, "scheduled": {"a": 2}}],
                   reference="the log")
    assert diff == "step 0: scheduled differs: ours {'a': 1}, the log {'a': 2}"
