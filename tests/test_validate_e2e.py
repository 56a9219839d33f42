"""The end-to-end validation set: its rows, how each becomes a simulation, the declared split,
and the held-out statistics `dse validate --suite end_to_end` reports."""

import json

import pytest

from dse.validate_e2e import (
    FAMILIES, GUARDS, case_config, load_cases, load_rows, row_case, split_of, summarize, evaluate)
from simcore.host import FITTED

FORBIDDEN = ("github.com/ROCm/vllm", "benchmark_vllm_060", "LambdaLabsML/vllm-benchmark",
             "vllm-project/vllm/issues/12315")


@pytest.fixture(scope="module")
def cases():
    return load_cases()


def test_every_row_cites_a_source_and_none_is_reserved():
    rows = load_rows()
    assert len(rows) >= 70
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids))
    for r in rows:
        src = r["source"]
        assert src["url"].startswith("https://") and src["quote"], r["id"]
        assert not any(f.lower() in src["url"].lower() for f in FORBIDDEN), r["id"]


def test_cases_and_skips_cover_every_row(cases):
    ok, skipped = cases
    assert len(ok) + len(skipped) == len(load_rows())
    assert len(ok) >= 25
    assert all(reason for _, reason in skipped)
    fams = {f for c in ok for f in c.measured}
    assert fams == set(FAMILIES)


def test_the_split_is_declared_by_the_id_hash_and_used_by_the_fit(cases):
    ok, _ = cases
    assert {c.split for c in ok} == {"fit", "held_out"}
    for c in ok:
        assert c.split == split_of(c.id)
    fitted = json.loads(FITTED.read_text())
    assert sorted(fitted["fit_cases"]) == sorted(c.id for c in ok if c.split == "fit")
    assert set(fitted["residuals"]) == set(FAMILIES)


def test_a_latency_row_is_one_batch_of_fixed_lengths():
    row = next(r for r in load_rows() if r["id"] == "bk9555-latency-llama8B_tp1-h100")
    c = row_case(row)
    w = c.config["workload"]
    assert w["num_prompts"] == 8 and w["request_rate"] == "inf"
    assert w["dataset"] == {"kind": "random", "input_len": 32, "output_len": 128}
    assert c.keys == {"e2e": "duration"} and c.measured["e2e"] == pytest.approx(0.9975, rel=1e-3)
    assert c.config["hardware"]["gpu"] == "H100-SXM"


def test_a_serving_row_takes_the_measured_mean_lengths(tmp_path):
    row = next(r for r in load_rows()
               if r["id"] == "gpustack-qwen3-235b-a22b-bf16-tp8-h100sxm-rand4000x200")
    c = row_case(row)
    extra = row["metrics"]["extra"]
    ds = c.config["workload"]["dataset"]
    assert ds["input_len"] == round(extra["total_input_tokens"] / extra["successful_requests"])
    assert ds["output_len"] == round(extra["total_generated_tokens"] /
                                     extra["successful_requests"])
    share = next(r for r in load_rows()
                 if r["id"] == "gpustack-qwen3-8b-bf16-tp1-h100sxm-sharegpt100-conc4")
    s = row_case(share)
    prompts, outputs = s.lengths
    extra = share["metrics"]["extra"]
    done = extra["successful_requests"]
    assert sum(prompts) / len(prompts) == pytest.approx(extra["total_input_tokens"] / done,
                                                         rel=0.02)
    cfg = case_config(s, tmp_path)
    assert cfg.workload.dataset.kind == "custom" and cfg.workload.max_concurrency == 4


def test_rows_the_simulator_cannot_represent_say_why(cases):
    _, skipped = cases
    reasons = dict(skipped)
    assert "no architecture for openai/gpt-oss-120b" in reasons[
        "gpustack-gpt-oss-120b-tp1-h100sxm-sharegpt"]
    assert "kernel profile" in reasons["recipe-ministral3-8b-tp1-mi300x"]


@pytest.mark.slow
def test_held_out_statistics_stay_within_their_regression_bounds(cases):
    ok, _ = cases
    outcomes = [evaluate(c) for c in ok if c.split == "held_out"]
    stats = summarize(outcomes)
    for fam, st in stats.items():
        g = GUARDS[fam]
        assert st["median_abs"] <= g["median_abs"], (fam, st)
        assert abs(st["median_signed"]) <= g["median_signed"], (fam, st)
        assert 1 - st["coverage"] <= g["outside"], (fam, st)
