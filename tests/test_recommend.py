"""The decision a report opens with (`dse.recommend`): the configuration to deploy under the
SLOs, its margins, the runner-up and the launch line."""

from __future__ import annotations

import json

import pytest

from dse.capacity import DEFAULT_SLOS
from dse.recommend import recommend
from dse.report import build_report, write_report
from dse.study import parse_study
from tests.test_report import BASE, CONSTRAINTS, OBJECTIVES, make_study


def _study(url: str, out_dir, constraints=CONSTRAINTS):
    return parse_study({
        "name": "unit", "base": BASE, "objectives": [o.model_dump() for o in OBJECTIVES],
        "constraints": [str(c) for c in constraints],
        "space": {"parameters": {"engine.max_num_seqs": {"type": "categorical",
                                                         "choices": [2, 4, 8, 32, 256]}}},
        "storage": url, "report": {"dir": str(out_dir)}})


@pytest.fixture(scope="module")
def url(tmp_path_factory) -> str:
    u = f"sqlite:///{tmp_path_factory.mktemp('rec') / 'study.db'}"
    make_study(u)
    return u


def test_the_recommendation_meets_every_slo_and_is_best_on_the_first_objective(url, tmp_path):
    report = build_report(url, "unit", OBJECTIVES, CONSTRAINTS)
    rec = recommend(report, _study(url, tmp_path))
    assert rec is not None and not rec.default_slos
    best = next(c for c in report.configurations if c.number == rec.number)
    assert best.feasible
    # Confirmed configurations come first; among the pool, the lowest p99 TTFT.
    pool = [c for c in report.feasible if c.confirmed] or report.feasible
    assert best in pool
    assert best.latest.value_of("p99_ttft_ms") == min(c.latest.value_of("p99_ttft_ms")
                                                      for c in pool
                                                      if c.latest.value_of("p99_tpot_ms") <= 13)
    tpot = best.latest.value_of("p99_tpot_ms")
    assert rec.margins == {"p99_tpot_ms": pytest.approx((13.0 - tpot) / 13.0)}
    assert rec.basis == ("confirmation" if best.confirmed else "screening")
    if rec.runner_up is not None:
        assert rec.runner_up != rec.number
        assert rec.trade_off.startswith(f"Runner-up: trial #{rec.runner_up}, ")
    lines = rec.lines()
    assert lines[0].startswith(f"Recommended: trial #{rec.number} (")


def test_without_slos_the_default_ones_are_used_and_said(url, tmp_path):
    report = build_report(url, "unit", OBJECTIVES, ())
    rec = recommend(report, _study(url, tmp_path, constraints=()))
    assert rec is not None and rec.default_slos
    assert set(rec.margins) == {"p99_ttft_ms", "p99_tpot_ms"}
    assert any(", ".join(DEFAULT_SLOS) in line for line in rec.lines())


def test_nothing_meets_the_slos_nothing_is_recommended(url, tmp_path):
    from dse.study import Constraint

    impossible = (Constraint(metric="p99_tpot_ms", op="<=", value=0.001),)
    report = build_report(url, "unit", OBJECTIVES, impossible)
    assert recommend(report, _study(url, tmp_path, constraints=impossible)) is None


def test_the_report_files_open_with_the_decision(url, tmp_path):
    paths = write_report(_study(url, tmp_path))
    html = paths["html"].read_text()
    first_h2 = html.index("<h2>")
    assert html[first_h2:].startswith("<h2>Recommended: trial #")
    assert html.index('class="decision"') < html.index("Pareto front")
    md = paths["md"].read_text()
    assert md.split("\n## ", 1)[1].startswith("Recommended: trial #")
    rec = json.loads(paths["json"].read_text())["recommendation"]
    assert rec["trial"] == int(md.split("trial #", 1)[1].split(" ", 1)[0])
    assert rec["launch"].startswith("vllm serve meta-llama/Llama-3.1-8B ")
    assert "--max-num-seqs" in rec["launch"] and rec["launch"] in html.replace("&#x27;", "'")
    plan = paths["launch"].read_text()
    assert paths["launch"].name == "launch.md" and plan.startswith("# Launch plan")


def test_the_recommendation_names_what_limits_it_by_intervention(url, tmp_path):
    report = build_report(url, "unit", OBJECTIVES, CONSTRAINTS)
    rec = recommend(report, _study(url, tmp_path))
    assert rec.causes and rec.causes[0].startswith("Limited first by ")
    assert "(measured: " in rec.causes[0]
    assert all(c in rec.lines() for c in rec.causes)


def test_configurations_measured_the_same_are_equivalents_not_the_runner_up(url, tmp_path):
    from dataclasses import replace as dc_replace

    report = build_report(url, "unit", OBJECTIVES, CONSTRAINTS)
    rec = recommend(report, _study(url, tmp_path))
    best = next(c for c in report.configurations if c.number == rec.number)
    twin = dc_replace(best, number=999, params={**best.params, "engine.max_num_seqs": 31})
    twin_report = dc_replace(report, configurations=report.configurations + (twin,))
    again = recommend(twin_report, None)
    assert again.number == rec.number and again.runner_up != 999
    assert "Measured the same: #999 (" in again.why


def test_every_pareto_card_carries_its_causes_measured_by_intervention(url, tmp_path):
    from dse.report_files import decided_report
    from dse.report_groups import MAX_CARDS, pareto_groups

    paths = write_report(_study(url, tmp_path))
    data = json.loads(paths["json"].read_text())
    report = decided_report(_study(url, tmp_path))
    heads = [g[0].number for g in pareto_groups(report)[:MAX_CARDS]]
    assert sorted(int(k) for k in data["causes"]) == sorted(heads)
    for k, lines in data["causes"].items():
        assert lines and lines[0].startswith("Limited first by ")
    assert "Measured by intervention:" in paths["html"].read_text()
    assert "**Measured by intervention:**" in paths["md"].read_text()


def test_the_chance_of_doing_better_is_measured_over_shared_error_draws(url, tmp_path):
    from dataclasses import replace as dc_replace

    from dse.recommend import BEAT_SAMPLES, beat_probabilities

    study = _study(url, tmp_path)
    report = build_report(url, "unit", OBJECTIVES, CONSTRAINTS)
    rec = recommend(report, study)
    best = next(c for c in report.configurations if c.number == rec.number)
    # Against itself, under the same draws, every draw is a tie: one half.
    same = beat_probabilities(study, report, best, dc_replace(best, number=998), samples=3)
    assert same == {o.metric: 0.5 for o in OBJECTIVES}
    if rec.runner_up is not None:
        other = next(c for c in report.configurations if c.number == rec.runner_up)
        p = beat_probabilities(study, report, best, other, samples=3)
        assert set(p) == {o.metric for o in OBJECTIVES}
        assert all(0.0 <= v <= 1.0 for v in p.values())
        assert f"over {BEAT_SAMPLES} draws of the step-time errors" in rec.trade_off


def test_the_runner_up_comparison_is_read_from_the_front_matrix(tmp_path, monkeypatch):
    import dse.recommend as recommend_module
    from dse.report_files import decided_report

    # Without confirmations the recommendation, its runner-up and the front all stand on their
    # screening runs: the matrix runs the two, and nothing is drawn for them apart.
    u = f"sqlite:///{tmp_path / 'screen.db'}"
    make_study(u, confirm=False)

    def not_again(*args, **kwargs):
        raise AssertionError("the runner-up comparison was drawn apart from the matrix")

    monkeypatch.setattr(recommend_module, "beat_probabilities", not_again)
    report = decided_report(_study(u, tmp_path))
    rec, pairs = report.recommendation, report.pairs
    assert rec.runner_up is not None and pairs.fidelity == "screening"
    assert pairs.numbers[:2] == (rec.number, rec.runner_up)     # drawn first, run once each
    assert len(set(pairs.numbers)) == len(pairs.numbers)
    beats = pairs.beats(rec.number, rec.runner_up)
    assert set(beats) == {o.metric for o in OBJECTIVES}
    assert (f"over {pairs.draws} draws of the step-time errors shared by both, at the screening "
            "fidelity: " + ", ".join(f"{m} {p:.0%}" for m, p in beats.items())) in rec.trade_off


def test_a_screened_only_pick_says_that_every_confirmed_configuration_missed(url, tmp_path):
    from dataclasses import replace

    report = build_report(url, "unit", OBJECTIVES, CONSTRAINTS)
    confirmed = [c for c in report.configurations if c.confirmed]
    assert confirmed, "the unit study confirms some configurations"
    # Every confirmation missed an SLO: the pick falls back to a configuration only screened.
    missed = tuple(replace(c, confirm=replace(c.confirm, feasible=False), rank=None)
                   if c.confirmed else c for c in report.configurations)
    rec = recommend(replace(report, configurations=missed), _study(url, tmp_path))
    if rec is None:
        pytest.skip("no screened-only configuration meets the SLOs in the unit study")
    assert rec.basis == "screening"
    assert (f"None of the {len(confirmed)} confirmed configuration" in rec.why
            and "only screened" in rec.why), rec.why
    # With a confirmed configuration that meets them, no such caveat.
    assert "only screened" not in recommend(report, _study(url, tmp_path)).why
