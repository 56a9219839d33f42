"""The study report: non-dominated ranks, feasibility, and the HTML, Markdown, CSV and JSON files.

`make_study` writes a study the way the runner does (ask/tell, user attributes, constraints)
from real `simulate` results of small configurations, so these tests need neither Ray nor the
runner: one storage call at a time, as the runner wrote studies before it batched its writes,
or through a `BatchedStorage`, as it writes them now.
"""

from __future__ import annotations

import copy
import csv
import dataclasses
import io
import json
import re
from pathlib import Path

import numpy as np
import optuna
import pytest

from dse.backends import open_storage
from dse.batched_storage import BatchedStorage
from dse.report import build_report, envelope, open_existing_storage, pareto_ranks, write_report
from dse.report_render import render_csv, render_html, render_markdown, report_json
from dse.study import Constraint, Objective, parse_study
from simcore.config import parse_config
from simcore.errors import ConfigError
from simcore.simulate import simulate


BASE = {
    "name": "small", "seed": 1,
    "model": {"name": "meta-llama/Llama-3.1-8B"},
    "hardware": {"gpu": "A100-80GB"},
    # The roofline: the SLO and the front below are set against its step times.
    "compute": {"kind": "roofline"},
    "workload": {"num_prompts": 30, "request_rate": 20,
                 "dataset": {"kind": "random", "input_len": 256, "output_len": 64}},
    "engine": {"max_num_seqs": 256},
}
OBJECTIVES = (Objective(metric="p99_ttft_ms", direction="minimize"),
              Objective(metric="output_throughput_per_gpu", direction="maximize"))
# TP=1 with 32 sequences has the best throughput and TTFT but misses this TPOT SLO.
CONSTRAINTS = (Constraint(metric="p99_tpot_ms", op="<=", value=13.0),)
MAX_NUM_SEQS = optuna.distributions.CategoricalDistribution([2, 4, 8, 32, 256])
TP = optuna.distributions.CategoricalDistribution([1, 2, 3])
HOSTILE = "<script>alert('x')</script> & \"quoted\""


def _run(params: dict, num_prompts: int = 30) -> dict:
    cfg = copy.deepcopy(BASE)
    cfg["engine"]["max_num_seqs"] = params["engine.max_num_seqs"]
    cfg["parallelism"] = {"tensor_parallel_size": params["parallelism.tensor_parallel_size"]}
    cfg["workload"]["num_prompts"] = num_prompts
    return simulate(parse_config(cfg))


def _tell(study: optuna.Study, fidelity: str, *, baseline: bool = False,
          confirms: int | None = None, num_prompts: int = 30) -> None:
    """Run the next (enqueued) trial and record it as the runner does."""
    t = study.ask()
    for name, dist in (("engine.max_num_seqs", MAX_NUM_SEQS),
                       ("parallelism.tensor_parallel_size", TP)):
        t.suggest_categorical(name, dist.choices)
    t.set_user_attr("fidelity", fidelity)
    t.set_user_attr("baseline", baseline)
    if confirms is not None:
        t.set_user_attr("confirms_trial", confirms)
    if t.params["parallelism.tensor_parallel_size"] == 3:
        t.set_user_attr("infeasible_reason",
                        "parallelism.tensor_parallel_size: 3 does not divide the 32 attention "
                        "heads")
        study.tell(t, state=optuna.trial.TrialState.FAIL)
        return
    r = _run(t.params, num_prompts)
    metrics = {k: float(v) for k, v in r.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
    metrics["step_time_relative_uncertainty"] = r["provenance"]["step_time_relative_uncertainty"]
    violations = [f"{c} not met ({c.metric} = {metrics[c.metric]:.3g})"
                  for c in CONSTRAINTS if not c.met(metrics[c.metric])]
    for c in CONSTRAINTS:
        t.set_constraint(c.metric, c.violation(metrics[c.metric]))
    t.set_user_attr("metrics", metrics)
    t.set_user_attr("summary", {k: metrics[k] for k in ("mean_ttft_ms", "p99_tpot_ms",
                                                        "output_throughput", "num_gpus")})
    t.set_user_attr("feasible", not violations)
    t.set_user_attr("violations", violations)
    t.set_user_attr("profile", r["provenance"]["compute_profile"])
    t.set_user_attr("calibrated", r["provenance"]["calibrated"])
    t.set_user_attr("explanation", {
        "bottleneck": "decode compute" if metrics["gpu_busy_fraction"] > 0.9 else "queueing",
        "sentences": f"The GPUs are busy {metrics['gpu_busy_fraction']:.0%} of the time. "
                     + HOSTILE,
        "factors": [], "assumptions": r["provenance"]["assumptions"]})
    study.tell(t, [metrics[o.metric] for o in OBJECTIVES])


# (max_num_seqs, tp): the baseline first, one undeployable TP, one that raises.
TRIALS = [(256, 1), (2, 1), (4, 1), (8, 1), (32, 1), (2, 2), (4, 2), (8, 2), (32, 2), (8, 3)]


def make_study(storage_url: str, name: str = "unit", *, confirm: bool = True,
               batched: bool = False) -> None:
    """A study as the runner writes it, plus a confirmation study re-running one trial; with
    `batched`, each trial's writes are committed together (`BatchedStorage`)."""
    storage = BatchedStorage(open_storage(storage_url)) if batched else storage_url
    study = optuna.create_study(study_name=name, storage=storage,
                                directions=[o.direction for o in OBJECTIVES],
                                sampler=optuna.samplers.RandomSampler(seed=0))
    for i, (mns, tp) in enumerate(TRIALS):
        study.enqueue_trial({"engine.max_num_seqs": mns, "parallelism.tensor_parallel_size": tp})
        _tell(study, "screen", baseline=(i == 0))
    t = study.ask()
    t.suggest_categorical("engine.max_num_seqs", MAX_NUM_SEQS.choices)
    t.suggest_categorical("parallelism.tensor_parallel_size", TP.choices)
    t.set_user_attr("fidelity", "screen")
    t.set_user_attr("failure_reason", "simulation timed out after 300 s " + HOSTILE)
    study.tell(t, state=optuna.trial.TrialState.FAIL)
    if confirm:
        cstudy = optuna.create_study(study_name=f"{name}/confirm", storage=storage,
                                     directions=[o.direction for o in OBJECTIVES])
        cstudy.enqueue_trial({"engine.max_num_seqs": 32, "parallelism.tensor_parallel_size": 2})
        _tell(cstudy, "confirm", confirms=8, num_prompts=60)


@pytest.fixture(scope="module")
def storage_url(tmp_path_factory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('study') / 'study.db'}"
    make_study(url)
    return url


@pytest.fixture(scope="module")
def report(storage_url):
    return build_report(storage_url, "unit", OBJECTIVES, CONSTRAINTS)


@pytest.fixture(scope="module")
def files(storage_url, tmp_path_factory) -> dict[str, Path]:
    study = parse_study({
        "name": "unit", "base": BASE, "objectives": [o.model_dump() for o in OBJECTIVES],
        "constraints": [str(c) for c in CONSTRAINTS],
        "space": {"parameters": {"engine.max_num_seqs": {"type": "categorical",
                                                         "choices": [2, 4, 8, 32, 256]}}},
        "storage": storage_url,
        "report": {"dir": str(tmp_path_factory.mktemp("report"))}})
    return write_report(study)


# --- non-dominated sorting -------------------------------------------------------------------

def test_ranks_on_a_hand_made_front():
    # minimise latency, maximise throughput
    pts = [(10, 100),   # 0 front
           (20, 200),   # 1 front
           (30, 300),   # 2 front
           (20, 150),   # 3 dominated by 1 -> rank 2
           (35, 250),   # 4 dominated by 2 -> rank 2
           (40, 140),   # 5 dominated by 3 (and 1) -> rank 3
           (20, 200),   # 6 equal to 1 -> shares rank 1
           (10, 90)]    # 7 dominated by 0 -> rank 2
    ranks = pareto_ranks(np.array(pts), ["minimize", "maximize"])
    assert ranks.tolist() == [1, 1, 1, 2, 2, 3, 1, 2]


def test_ranks_agree_with_optuna_best_trials():
    rng = np.random.default_rng(0)
    pts = rng.random((60, 3))
    dirs = ["minimize", "maximize", "minimize"]
    study = optuna.create_study(directions=dirs)
    for p in pts:
        study.add_trial(optuna.trial.create_trial(values=list(p)))
    ranks = pareto_ranks(pts, dirs)
    assert {t.number for t in study.best_trials} == set(np.flatnonzero(ranks == 1).tolist())
    # Every rank-k point is dominated by some rank-(k-1) point.
    loss = pts * np.array([1, -1, 1])
    for i in np.flatnonzero(ranks > 1):
        prev = loss[ranks == ranks[i] - 1]
        assert ((prev <= loss[i]).all(axis=1) & (prev < loss[i]).any(axis=1)).any()


def test_ranks_of_nothing_and_of_one_objective():
    assert pareto_ranks(np.zeros((0, 2)), ["minimize", "minimize"]).tolist() == []
    assert pareto_ranks([[3.0], [1.0], [2.0], [1.0]], ["minimize"]).tolist() == [3, 1, 2, 1]


# --- the report's data -----------------------------------------------------------------------

def test_infeasible_and_failed_configurations_are_not_ranked(report):
    by_number = {c.number: c for c in report.configurations}
    assert len(report.configurations) == len(TRIALS) + 1
    slo_miss = by_number[TRIALS.index((32, 1))]
    assert slo_miss.rank is None and not slo_miss.feasible
    assert any("p99_tpot_ms" in r for r in slo_miss.reasons)
    undeployable = by_number[TRIALS.index((8, 3))]
    assert undeployable.rank is None and "does not divide" in undeployable.reasons[0]
    timed_out = by_number[len(TRIALS)]
    assert timed_out.rank is None and "timed out" in timed_out.reasons[0]
    # The SLO-violating point would dominate the rest, but it may not be in the Pareto set.
    assert slo_miss.number not in {c.number for c in report.pareto}


def test_pareto_set_holds_every_slo_and_matches_optuna(report, storage_url):
    assert report.pareto
    for c in report.pareto:
        for run in (c.screen, c.confirm) if c.confirmed else (c.screen,):
            for con in CONSTRAINTS:
                assert con.met(run.value_of(con.metric))
    study = optuna.load_study(study_name="unit", storage=storage_url)
    assert {t.number for t in study.best_trials} == {c.number for c in report.pareto}


def test_confirmed_configuration_keeps_both_measurements(report):
    c = next(c for c in report.configurations if c.confirm is not None)
    assert c.number == TRIALS.index((32, 2))
    assert c.confirmed and c.fidelity == "screen + confirm" and c.confirm_rank == 1
    assert c.screen.fidelity == "screen" and c.confirm.fidelity == "confirm"
    assert c.confirm.metrics["num_prompts"] == 60 and c.screen.metrics["num_prompts"] == 30
    assert c.values == c.screen.values and c.latest is c.confirm


def _synthetic(url: str, screen: list[tuple[float, float]],
               confirm: dict[int, tuple[tuple[float, float], bool]]) -> None:
    """A study of given screen values (all feasible) and confirmation runs (values, feasible)."""
    dirs = [o.direction for o in OBJECTIVES]
    study = optuna.create_study(study_name="syn", storage=url, directions=dirs)
    for v in screen:
        study.add_trial(optuna.trial.create_trial(
            values=list(v), user_attrs={"fidelity": "screen", "feasible": True},
            constraints={str(CONSTRAINTS[0]): -1.0}))
    cstudy = optuna.create_study(study_name="syn/confirm", storage=url, directions=dirs)
    for number, (v, ok) in confirm.items():
        cstudy.add_trial(optuna.trial.create_trial(
            values=list(v), constraints={str(CONSTRAINTS[0]): -1.0 if ok else 4.0},
            user_attrs={"fidelity": "confirm", "confirms_trial": number, "feasible": ok,
                        "violations": [] if ok else ["p99_tpot_ms = 17 > 13"]}))


def test_a_confirmation_that_misses_an_slo_leaves_the_pareto_set(tmp_path):
    url = f"sqlite:///{tmp_path / 'syn.db'}"
    # Screen: 0 and 1 on the front, 2 dominated by 1. Confirmation: 0 misses the SLO; 1 holds
    # it with worse values (still ranked on its screen values, like everyone else).
    _synthetic(url, [(10, 100), (20, 200), (30, 150)],
               {0: ((11, 90), False), 1: ((25, 180), True)})
    r = build_report(url, "syn", OBJECTIVES, CONSTRAINTS)
    c0, c1, c2 = r.configurations
    assert not c0.feasible and c0.rank is None
    assert c0.reasons == ("at confirm fidelity: p99_tpot_ms = 17 > 13",)
    assert (c1.rank, c1.confirm_rank, c2.rank) == (1, 1, 2)
    assert [c.number for c in r.pareto] == [1]
    assert [c.number for c in r.confirmed] == [1, 0]


def test_envelopes_follow_the_declared_uncertainty(report):
    assert envelope("p99_ttft_ms", 100.0, 0.35) == pytest.approx((65.0, 135.0))
    lo, hi = envelope("output_throughput", 100.0, 0.35)
    assert lo == pytest.approx(100 / 1.35) and hi == pytest.approx(100 / 0.65)
    assert envelope("num_gpus", 2.0, 0.35) is None
    assert envelope("p99_ttft_ms", 100.0, None) is None
    assert all(c.screen.relative_uncertainty == 0.35 for c in report.pareto)
    for o in report.envelope_overlaps():
        assert set(o["overlapping"]) | set(o["separate"]) == {x.metric for x in OBJECTIVES}


def test_missing_study_and_storage_are_one_sentence(storage_url, tmp_path):
    with pytest.raises(ConfigError, match="no study named 'nope'"):
        build_report(storage_url, "nope", OBJECTIVES)
    with pytest.raises(ConfigError, match="run `dse search` first"):
        open_existing_storage(f"sqlite:///{tmp_path / 'absent.db'}")
    assert not (tmp_path / "absent.db").exists()
    with pytest.raises(ConfigError, match="directions"):
        build_report(storage_url, "unit", OBJECTIVES[::-1])


def test_journal_storage_reads_the_same(tmp_path):
    from optuna.storages.journal import JournalFileBackend

    path = tmp_path / "study.log"
    study = optuna.create_study(
        study_name="j", directions=["minimize", "maximize"],
        storage=optuna.storages.JournalStorage(JournalFileBackend(str(path))))
    for v in ((1.0, 1.0), (2.0, 3.0), (3.0, 2.0)):
        study.add_trial(optuna.trial.create_trial(values=list(v)))
    r = build_report(f"journal://{path}", "j", OBJECTIVES)
    assert [c.rank for c in r.configurations] == [1, 1, 2]


def test_one_objective_and_no_feasible_trial(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    study = optuna.create_study(study_name="one", storage=url)
    for v in (3.0, 1.0):
        t = study.ask()
        t.set_user_attr("feasible", False)
        t.set_user_attr("violations", ["p99_tpot_ms <= 50 not met"])
        study.tell(t, v)
    r = build_report(url, "one", (Objective(metric="p99_ttft_ms", direction="minimize"),))
    assert r.pareto == [] and r.reference_point is None
    assert "no Pareto set" in render_html(r) and "no Pareto set" in render_markdown(r)


# --- the files -------------------------------------------------------------------------------

def test_all_formats_are_written(files):
    assert set(files) == {"html", "md", "csv", "json", "launch"}
    for p in files.values():
        assert p.is_file() and p.stat().st_size > 0


def test_html_is_self_contained_and_escaped(files, report):
    page = files["html"].read_text()
    assert page.count("<script") == page.count("</script>")
    # No external script, stylesheet, image or frame.
    assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)\s*=\s*[\"']?(https?:)?//",
                         page, re.I)
    assert page.count("Plotly.newPlot") >= 4            # front, hypervolume, 2 parallel coords
    assert HOSTILE not in page and html_escaped(HOSTILE) in page
    for c in report.pareto:
        assert f'id="trial-{c.number}"' in page
    slo_miss = TRIALS.index((32, 1))
    assert f'id="trial-{slo_miss}"' not in page
    assert "confirm #0" in page and "Limited by:" in page
    assert "Reference point" in page


def html_escaped(s: str) -> str:
    import html

    return html.escape(s, quote=True)


def test_csv_has_one_row_per_trial_with_ranks(files, report):
    rows = list(csv.DictReader(io.StringIO(files["csv"].read_text())))
    assert [int(r["number"]) for r in rows] == list(range(len(TRIALS) + 1))
    pareto = {c.number for c in report.pareto}
    for r in rows:
        n = int(r["number"])
        assert (r["rank"] == "1") == (n in pareto)
        if r["feasible"] == "False":
            assert r["rank"] == "" and r["reasons"]
    assert "params_engine.max_num_seqs" in rows[0] and "values_p99_ttft_ms" in rows[0]
    confirmed = rows[TRIALS.index((32, 2))]
    assert confirmed["fidelity"] == "screen + confirm" and confirmed["confirm_rank"] == "1"
    assert confirmed["confirm_p99_ttft_ms"] != confirmed["values_p99_ttft_ms"]


def test_json_holds_everything(files, report):
    data = json.loads(files["json"].read_text())
    assert data["study"] == "unit"
    assert data["pareto"] == [c.number for c in report.pareto]
    assert len(data["trials"]) == len(TRIALS) + 1
    assert data["hypervolume_reference_point"] is not None
    t = data["trials"][TRIALS.index((32, 2))]
    assert t["screen"]["fidelity"] == "screen" and t["confirm"]["fidelity"] == "confirm"
    assert set(t["confirm_values"]) == {o.metric for o in OBJECTIVES}
    assert "p99_ttft_ms" in t["envelopes"]


def test_markdown_has_cards_without_plots(files, report):
    md = files["md"].read_text()
    assert "<script" not in md
    for c in report.pareto:
        assert f"### Trial #{c.number}" in md
    assert "Infeasible and failed" in md and "does not divide" in md


def test_renderers_are_pure_functions_of_the_report(report):
    assert render_csv(report) == render_csv(report)
    assert report_json(report) == report_json(report)


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_a_study_written_in_batches_reports_as_one_written_call_by_call(report, tmp_path,
                                                                         kind):
    """Both ways of writing leave the same trials, so studies stored before the runner batched
    its writes and studies stored since give the same report, byte for byte."""
    url = (f"sqlite:///{tmp_path / 'batched.db'}" if kind == "sqlite"
           else f"journal://{tmp_path / 'batched.log'}")
    make_study(url, batched=True)
    batched = build_report(url, "unit", OBJECTIVES, CONSTRAINTS)
    batched = dataclasses.replace(batched, storage=report.storage,
                                  generated_at=report.generated_at)
    assert render_csv(batched) == render_csv(report)
    assert render_markdown(batched) == render_markdown(report)
    assert json.dumps(report_json(batched)) == json.dumps(report_json(report))


def _measurement(number, values, metrics, *, envelopes=None, study="s", state="COMPLETE"):
    from dse.report import Measurement

    return Measurement(study_name=study, number=number, fidelity="screen", state=state,
                       values=values, metrics=metrics, summary={}, feasible=True, reasons=(),
                       constraint_values={}, explanation=None, profile="p", calibrated=False,
                       relative_uncertainty=0.35, envelopes=envelopes or {},
                       envelope_method="bounds" if envelopes else None)


def test_confirmation_envelopes_from_re_runs_decide_the_overlaps():
    from dse.report import Configuration, StudyReport

    obj = (Objective(metric="mean_tpot_ms", direction="minimize"),)
    # Screen values 10 and 14 overlap at +/-35% first order; the confirmations' propagated
    # envelopes are narrow and apart.
    a = Configuration(number=0, params={}, distributions={}, baseline=False,
                      screen=_measurement(0, (10.0,), {"mean_tpot_ms": 10.0}),
                      confirm=_measurement(0, (10.0,), {"mean_tpot_ms": 10.0}, study="s/c",
                                           envelopes={"mean_tpot_ms": (9.5, 10.6)}), rank=1)
    b = Configuration(number=1, params={}, distributions={}, baseline=False,
                      screen=_measurement(1, (14.0,), {"mean_tpot_ms": 14.0}),
                      confirm=_measurement(1, (14.0,), {"mean_tpot_ms": 14.0}, study="s/c",
                                           envelopes={"mean_tpot_ms": (13.1, 15.0)}), rank=1)
    rep = StudyReport(study_name="s", storage="x", objectives=obj, constraints=(),
                      configurations=(a, b), reference_point=None, notes=(), generated_at="",
                      view=None)
    (o,) = rep.envelope_overlaps()
    assert o["basis"] == "confirmation re-runs" and o["separate"] == ["mean_tpot_ms"]
    assert a.confirm.envelope("mean_tpot_ms") == (9.5, 10.6)
    assert a.screen.envelope("mean_tpot_ms") == pytest.approx((6.5, 13.5))
    # Without re-runs, the first-order envelopes overlap.
    a2 = Configuration(number=0, params={}, distributions={}, baseline=False,
                       screen=a.screen, rank=1)
    rep2 = StudyReport(study_name="s", storage="x", objectives=obj, constraints=(),
                       configurations=(a2, b), reference_point=None, notes=(), generated_at="",
                       view=None)
    (o2,) = rep2.envelope_overlaps()
    assert o2["basis"] == "first order" and o2["overlapping"] == ["mean_tpot_ms"]


def test_every_format_carries_the_pairwise_matrix(files, report):
    from dse.report_pairs import PAIR_DRAWS

    data = json.loads(files["json"].read_text())["pairwise"]
    assert data["draws"] == PAIR_DRAWS and data["fidelity"] == "screening" and data["seeds"]
    assert {c.number for c in report.pareto} <= set(data["configs"])
    n = len(data["configs"])
    for o in OBJECTIVES:
        p = data["p"][o.metric]
        assert all(p[i][i] is None for i in range(n))
        assert all(p[i][j] + p[j][i] == pytest.approx(1.0)
                   for i in range(n) for j in range(n) if i != j)
    page = files["html"].read_text()
    # The decision stays first; the pairwise heatmap stands where the overlap one was.
    assert page.index('class="decision"') < page.index("Chance of doing better, pairwise")
    assert "Envelope overlaps between Pareto configurations" not in page
    assert "Mean chance of doing better than the other" in page
    md = files["md"].read_text()
    assert "### Chance of doing better, pairwise" in md and "| row better than | #" in md


def test_a_study_file_other_than_the_one_run_is_refused_as_a_resumed_search_is(tmp_path):
    from dse.fingerprint import DIGEST_ATTR, study_digest
    from dse.report_files import decided_report

    url = f"sqlite:///{tmp_path / 's.db'}"
    data = {"name": "d", "base": BASE, "objectives": [o.model_dump() for o in OBJECTIVES],
            "constraints": [str(c) for c in CONSTRAINTS], "storage": url,
            "space": {"parameters": {"engine.max_num_seqs": {"type": "categorical",
                                                             "choices": [2, 4]}}},
            "report": {"dir": str(tmp_path / "r")}}
    run_with = parse_study(data)
    study = optuna.create_study(study_name="d", storage=url,
                                directions=[o.direction for o in OBJECTIVES])
    study.set_user_attr(DIGEST_ATTR, study_digest(run_with))
    for v in ((3.0, 1.0), (1.0, 2.0)):
        t = study.ask()
        t.set_user_attr("feasible", True)
        study.tell(t, list(v))
    decided_report(run_with)        # the study file it was run with
    # Another constraint, objective or base would label the stored trials with what they were
    # not run under (the report used to be written, mislabelled, with exit 0).
    for change, part in ((dict(constraints=["p99_tpot_ms <= 50"]), "constraints"),
                         (dict(objectives=[{"metric": "mean_ttft_ms", "direction": "minimize"},
                                           OBJECTIVES[1].model_dump()]), "objectives"),
                         (dict(base={**BASE, "engine": {"max_num_seqs": 256,
                                                        "gpu_memory_utilization": 0.5}}),
                          "base")):
        with pytest.raises(ConfigError, match=f"^study 'd' in .* was run with another {part}: "
                                              f"its report would label the stored trials"):
            decided_report(parse_study({**data, **change}))


def test_the_baseline_is_the_base_configurations_completed_run(tmp_path):
    # A search interrupted while the base ran, then resumed, runs the base again: the report
    # compares every trial with the completed run, not the interrupted one.
    url = f"sqlite:///{tmp_path / 's.db'}"
    study = optuna.create_study(study_name="b", storage=url,
                                directions=[o.direction for o in OBJECTIVES])
    t = study.ask()
    t.suggest_categorical("engine.max_num_seqs", [2, 256])
    t.set_user_attr("baseline", True)
    t.set_user_attr("failure_reason", "interrupted")
    study.tell(t, state=optuna.trial.TrialState.FAIL)
    for baseline, v in ((True, (2.0, 2.0)), (False, (1.0, 3.0))):
        t = study.ask()
        t.suggest_categorical("engine.max_num_seqs", [2, 256])
        t.set_user_attr("baseline", baseline)
        t.set_user_attr("feasible", True)
        study.tell(t, list(v))
    r = build_report(url, "b", OBJECTIVES)
    assert r.baseline.number == 1
    assert "baseline #1" in render_markdown(r) and "baseline #0" not in render_markdown(r)


def test_a_repeated_configuration_is_plotted_once_as_it_is_ranked_once(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    study = optuna.create_study(study_name="r", storage=url,
                                directions=[o.direction for o in OBJECTIVES])
    for v, twin in (((1.0, 1.0), None), ((2.0, 3.0), None), ((1.0, 1.0), 0)):
        t = study.ask()
        t.set_user_attr("feasible", True)
        if twin is not None:
            t.set_user_attr("same_config_as", twin)
        study.tell(t, list(v))
    r = build_report(url, "r", OBJECTIVES)
    assert sorted(c.number for c in r.pareto) == [0, 1]
    # The plots' study holds the same front: the repeat is not one more point on it.
    assert sorted(t.number for t in r.view.best_trials) == [0, 1]


def test_searched_settings_read_as_a_config_writes_them():
    from dse.report import setting_text

    # 8192 and 16384 alike (a measured number reads 16,384), a fraction as written.
    assert [setting_text(v) for v in (8192, 16384, 16384.0, 0.85, 1e-05, "fp8", None, True)] == \
        ["8192", "16384", "16384", "0.85", "1e-05", "fp8", "", "True"]


def test_a_report_written_while_trials_run_says_none_has_finished_yet(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    study = optuna.create_study(study_name="w", storage=url,
                                directions=[o.direction for o in OBJECTIVES])
    t = study.ask()
    t.set_user_attr("feasible", False)
    t.set_user_attr("violations", ["p99_tpot_ms <= 13 not met"])
    study.tell(t, [1.0, 1.0])
    study.ask()                     # a trial still running
    r = build_report(url, "w", OBJECTIVES)
    assert r.recommendation is None
    text = ("No finished configuration meets every SLO yet (1 trial is still running): "
            "nothing to recommend so far.")
    assert r.no_recommendation() == text
    assert text in render_markdown(r) and text in render_html(r)
