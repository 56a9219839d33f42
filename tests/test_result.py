"""The typed result: its JSON layout reads back exactly, a missing key is named, and the
figures of a few small runs of each engine path stay as pinned (the serving loop's parts are
refactored under these)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from simcore.attribution import attribute
from simcore.config import parse_config
from simcore.result import ReplicaResult, ResultError, RunResult
from simcore.simulate import simulate, simulate_run

ROOT = Path(__file__).resolve().parents[1]

PINNED_CASES = {
    "dense": ("examples/quickstart.yaml", {"workload.num_prompts": 60}),
    "dense_timeout": ("examples/quickstart.yaml", {"workload.num_prompts": 60,
                                                   "workload.request_rate": 40,
                                                   "workload.request_timeout_s": 3.2}),
    "dense_max_concurrency": ("examples/quickstart.yaml", {"workload.num_prompts": 40,
                                                           "workload.max_concurrency": 4}),
    "expert_parallel": ("examples/qwen3_moe_h200.yaml",
                        {"workload.num_prompts": 40, "parallelism.tensor_parallel_size": 4,
                         "parallelism.data_parallel_size": 2,
                         "parallelism.enable_expert_parallel": True}),
    "pd_cluster": ("examples/cluster/pd_disaggregation.yaml", {"workload.num_prompts": 24}),
}
"""Small runs of each path through the serving loop: a replica timed by its model, client
timeouts, a concurrency limit, an expert-parallel lock-step group, and P/D disaggregation with
steps as DAGs over a fabric."""


def pinned_figures(r: dict) -> dict:
    """The figures a case pins: the headline numbers and every replica's counters."""
    keys = ("duration", "completed", "failed", "num_steps", "mean_ttft_ms", "p99_ttft_ms",
            "mean_tpot_ms", "p99_tpot_ms", "mean_e2el_ms", "output_throughput",
            "gpu_busy_fraction", "saturated_fraction", "mean_batch_seqs", "total_preemptions",
            "prefix_cache_hit_rate", "mean_queue_ms")
    return {"metrics": {k: r[k] for k in keys},
            "replicas": [{k: v for k, v in rep.items() if isinstance(v, (int, float))}
                         for rep in r["replicas"]]}


def _config(path: str, overrides: dict):
    data = yaml.safe_load((ROOT / path).read_text())
    # The pins hold the serving loop's paths; the roofline keeps them apart from profile refits.
    overrides = {"compute.kind": "roofline", **overrides}
    for key, value in overrides.items():
        node = data
        *parents, last = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return parse_config(data, base_dir=os.path.dirname(ROOT / path))


@pytest.fixture(scope="module")
def pinned() -> dict:
    return json.loads((ROOT / "tests/data/pinned/results.json").read_text())


@pytest.mark.parametrize("case", sorted(PINNED_CASES))
def test_runs_keep_their_pinned_figures(case, pinned):
    r = simulate(_config(*PINNED_CASES[case]))
    got = pinned_figures(r)
    want = pinned[case]
    assert got["metrics"] == pytest.approx(want["metrics"], rel=1e-9, abs=1e-12)
    assert len(got["replicas"]) == len(want["replicas"])
    for g, w in zip(got["replicas"], want["replicas"]):
        assert g == pytest.approx(w, rel=1e-9, abs=1e-12)


@pytest.fixture(scope="module")
def small() -> RunResult:
    return simulate_run(_config("examples/quickstart.yaml", {"workload.num_prompts": 30}))


def test_the_json_layout_reads_back_exactly(small):
    d = small.to_dict()
    again = RunResult.from_dict(json.loads(json.dumps(d)))
    assert json.dumps(again.to_dict()) == json.dumps(d)
    assert list(d)[:2] == ["name", "model_id"]
    assert list(d)[-5:] == ["limits", "replicas", "timeseries", "requests", "provenance"]


def test_typed_sections(small):
    (rep,) = small.replicas
    assert isinstance(rep, ReplicaResult)
    assert rep.busy_s == pytest.approx(sum(rep.step_s_by_phase_bound.values()))
    assert rep.num_steps == sum(rep.steps_by_bound.values())
    assert rep.dummy_steps is None and "dummy_steps" not in rep.to_dict()
    assert small.limits.max_num_seqs == small.to_dict()["limits"]["max_num_seqs"]
    assert small.metric("completed") == 30
    with pytest.raises(ResultError, match="no metric 'nonsense'"):
        small.metric("nonsense")
    assert attribute(small).top.key == attribute(small.to_dict()).top.key


def test_a_missing_key_is_named(small):
    d = small.to_dict()
    del d["replicas"][0]["busy_s_waiting_for_kv_blocks"]
    with pytest.raises(ResultError, match="replicas\\[0\\]: the result has no "
                                          "'busy_s_waiting_for_kv_blocks'"):
        RunResult.from_dict(d)
    d = small.to_dict()
    del d["timeseries"]
    with pytest.raises(ResultError, match="'timeseries'"):
        RunResult.from_dict(d)


def test_later_sections_and_extras_keep_their_place(small):
    d = small.to_dict()
    d["headroom"] = {"state": "headroom"}
    d["envelope"] = {"method": "first_order"}
    d["output_tokens_per_dollar"] = 1.0
    r = RunResult.from_dict(d)
    assert r.headroom == {"state": "headroom"} and r.envelope["method"] == "first_order"
    assert r.extras == {"output_tokens_per_dollar": 1.0}
    assert list(r.to_dict()) == list(d)


@pytest.mark.parametrize("case", ["dense_timeout", "pd_cluster"])
def test_a_single_engine_loop_steps_as_the_group_loop_does(case, monkeypatch):
    """`EngineLoop._single` is the group loop without its per-rank lists: forcing every loop
    through `_group` changes no figure of a run."""
    from simcore.serve.loop import EngineLoop

    fast = simulate(_config(*PINNED_CASES[case]))
    monkeypatch.setattr(EngineLoop, "process", lambda self: self._group())
    general = simulate(_config(*PINNED_CASES[case]))
    for r in (fast, general):
        r["provenance"].pop("python", None)
    assert json.dumps(general) == json.dumps(fast)
