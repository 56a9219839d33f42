"""The search driver on a real Ray (2 CPUs): trials recorded with their attributes, Pareto sets
free of SLO violators, infeasible, failing and timed-out trials, resume after the driver is
killed, same seed same trials, the grid and random samplers, and bad objectives. Without Ray:
the storage writes a trial makes (`BatchedStorage`, against Optuna's per-call writes on each
kind of storage) and how many workers a search gets."""

import itertools
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml

from dse.backends import open_storage
from dse.driver import INTERRUPTED
from dse.runner import best_configs, run_search
from dse.space import SearchSpace
from dse.study import Constraint, load_study, parse_study
from simcore.config import parse_config
from simcore.errors import ConfigError
from simcore.simulate import simulate

TESTS = Path(__file__).parent
DATA = TESTS / "data"
TINY = DATA / "studies" / "tiny.yaml"

LLAMA_8B_ON_A100 = {"model": {"name": "meta-llama/Llama-3.1-8B"},
                    "hardware": {"gpu": "A100-80GB"}}
OBJECTIVES = [{"metric": "p99_ttft_ms", "direction": "minimize"},
              {"metric": "output_throughput_per_gpu", "direction": "maximize"}]


def tiny(tmp_path: Path, **update):
    study = load_study(TINY)
    return study.model_copy(update={"storage": f"sqlite:///{tmp_path / 'tiny.db'}", **update})


def study_from(data: dict, tmp_path: Path, name: str):
    data = {"name": name, "objectives": OBJECTIVES, "storage": f"sqlite:///{tmp_path / 's.db'}",
            **data}
    return parse_study(data, base_dir=DATA)


def load(study) -> optuna.Study:
    return optuna.load_study(study_name=study.name, storage=open_storage(study.storage_url))


def tpot_between_extremes() -> float:
    """A p99 TPOT SLO that the smallest max_num_seqs of the tiny space meets and the largest
    does not (taken from the simulator, so the test follows the model)."""
    base = load_study(TINY).base
    tpot = [simulate(parse_config({**base, "engine": {"max_num_seqs": n}}))["p99_tpot_ms"]
            for n in (8, 256)]
    assert tpot[0] < tpot[1]
    return (tpot[0] + tpot[1]) / 2


# -- a whole search ------------------------------------------------------------------------------


@pytest.mark.slow
def test_tiny_study_records_trials_pareto_set_and_confirmations(ray_address, tmp_path):
    slo = tpot_between_extremes()
    study = tiny(tmp_path, constraints=(Constraint(metric="p99_tpot_ms", op="<=", value=slo),))
    out = run_search(study, progress=False)

    assert out.num_complete == 8 and out.num_failed == out.num_infeasible == 0
    assert out.stopped_by == "n_trials" and out.pareto_trials
    st = load(study)
    assert st.metric_names == ["p99_ttft_ms", "output_throughput_per_gpu"]
    trials = st.get_trials()
    assert trials[0].user_attrs["baseline"] is True
    assert trials[0].params == {"engine.max_num_seqs": 256, "engine.max_num_batched_tokens": 2048}
    for t in trials:
        a = t.user_attrs
        assert t.state == optuna.trial.TrialState.COMPLETE
        assert a["fidelity"] == "screen"
        assert t.values == [a["metrics"]["p99_ttft_ms"], a["metrics"]["output_throughput_per_gpu"]]
        for key in ("request_throughput_per_gpu", "output_tokens_per_dollar",
                    "cost_per_million_output_tokens_usd", "gpu_busy_fraction"):
            assert key in a["metrics"]
        assert {"p99_ttft_ms", "output_throughput_per_gpu", "p99_tpot_ms"} <= set(a["summary"])
        assert a["profile"].startswith("roofline/A100") and a["calibrated"] is False
        name = f"p99_tpot_ms <= {slo:g}"
        # Named (Optuna 5) and, for optuna-dashboard, as the list it reads (keys "0", ...).
        assert set(t.constraints) == {name, "0"}
        assert t.system_attrs["constraints"] == [t.constraints[name]]
        met = a["metrics"]["p99_tpot_ms"] <= slo
        assert a["feasible"] is met and (t.constraints[name] <= 0) is met
        assert (a["violations"] == []) is met
        if not met:
            assert a["violations"][0].startswith("p99_tpot_ms = ")
        if "explanation" in a:
            assert isinstance(a["explanation"], dict)
    assert not trials[0].user_attrs["feasible"]          # the largest batch misses the SLO
    best = st.best_trials
    assert best and [t.number for t in best] == list(out.pareto_trials)
    assert all(t.user_attrs["feasible"] and all(v <= 0 for v in t.constraints.values())
               for t in best)
    assert [c["number"] for c in best_configs(study.storage_url, study.name)] == \
        sorted(out.pareto_trials)

    # Confirmation: the best two feasible screened configurations, re-run at 60 requests.
    assert out.confirm_study_name == "tiny/confirm" and len(out.confirmed_trials) == 2
    assert set(out.pareto_trials) & set(out.confirmed_trials)
    cst = optuna.load_study(study_name="tiny/confirm", storage=study.storage_url)
    screened = {t.number: t for t in trials}
    assert [t.user_attrs["confirms_trial"] for t in cst.trials] == list(out.confirmed_trials)
    for t in cst.trials:
        assert t.state == optuna.trial.TrialState.COMPLETE
        assert t.user_attrs["fidelity"] == "confirm"
        assert t.params == screened[t.user_attrs["confirms_trial"]].params
        assert t.user_attrs["metrics"]["num_prompts"] == 60
        # Confirmations carry envelopes from perturbed re-runs around their own values.
        assert t.user_attrs["envelope_method"] == "bounds"
        lo, hi = t.user_attrs["envelopes"]["mean_tpot_ms"]
        assert lo < t.user_attrs["metrics"]["mean_tpot_ms"] < hi
    assert not any("envelopes" in t.user_attrs for t in trials)   # screening: first order

    # Running it again resumes a finished study: nothing new, nothing lost.
    again = run_search(study, progress=False)
    assert again.num_complete == 8 and len(load(study).trials) == 8
    assert len(optuna.load_study(study_name="tiny/confirm", storage=study.storage_url).trials) == 2
    with pytest.raises(ConfigError, match="already exists"):
        run_search(study, progress=False, resume=False)


@pytest.mark.slow
def test_infeasible_and_timed_out_trials_are_recorded_and_the_study_goes_on(ray_address,
                                                                           tmp_path):
    # Grid over TP x load, trials kept in flight asynchronously: TP 3 does not divide the 32
    # heads (infeasible, never dispatched); 100,000 requests run far past a 3 s trial limit.
    study = study_from({
        "base": {**LLAMA_8B_ON_A100, "engine": {"max_num_seqs": 4},
                 "workload": {"num_prompts": 40, "dataset": {"kind": "random", "input_len": 128,
                                                             "output_len": 32}}},
        "space": {"parameters": {
            "parallelism.tensor_parallel_size": {"type": "categorical", "choices": [1, 3]},
            "workload.num_prompts": {"type": "categorical", "choices": [40, 100000]}}},
        "sampler": {"kind": "grid"}, "baseline": False, "budget": {"n_trials": 10},
        "execution": {"workers": 2, "trial_timeout_s": 3, "deterministic": False},
    }, tmp_path, "faults")
    t0 = time.monotonic()
    out = run_search(study, progress=False)
    assert time.monotonic() - t0 < 30
    assert out.stopped_by == "grid"
    assert (out.num_complete, out.num_failed, out.num_infeasible) == (1, 1, 2)
    by_params = {(t.params["parallelism.tensor_parallel_size"], t.params["workload.num_prompts"]): t
                 for t in load(study).trials}
    assert set(by_params) == {(1, 40), (1, 100000), (3, 40), (3, 100000)}
    assert by_params[1, 40].state == optuna.trial.TrialState.COMPLETE
    timed_out = by_params[1, 100000]
    assert timed_out.state == optuna.trial.TrialState.FAIL
    assert timed_out.user_attrs["failure_reason"] == "timed out after 3 s"
    for n in (40, 100000):
        t = by_params[3, n]
        assert t.state == optuna.trial.TrialState.FAIL and t.user_attrs["feasible"] is False
        assert "tensor_parallel_size" in t.user_attrs["infeasible_reason"]
        assert "failure_reason" not in t.user_attrs


@pytest.mark.slow
def test_a_trial_that_raises_is_failed_with_its_message(ray_address, tmp_path):
    # The trace file is chosen by a categorical parameter; one of them does not exist, which
    # only the simulation finds out. (The space is built directly: `check_paths` does not yet
    # see into the dataset union.)
    space = SearchSpace.model_validate({"parameters": {
        "workload.dataset.path": {"type": "categorical",
                                  "choices": ["mooncake_excerpt.jsonl", "no_such_trace.jsonl"]}}})
    study = study_from({
        "base": {**LLAMA_8B_ON_A100, "workload": {
            "num_prompts": 20, "dataset": {"kind": "mooncake", "path": "mooncake_excerpt.jsonl"}}},
        "space": space, "sampler": {"kind": "grid"}, "baseline": False,
        "budget": {"n_trials": 4},
    }, tmp_path, "raises")
    out = run_search(study, progress=False)
    assert (out.num_complete, out.num_failed, out.num_infeasible) == (1, 1, 0)
    failed = [t for t in load(study).trials if t.state == optuna.trial.TrialState.FAIL]
    assert failed[0].params["workload.dataset.path"] == "no_such_trace.jsonl"
    reason = failed[0].user_attrs["failure_reason"]
    assert "no_such_trace.jsonl" in reason and "\n" not in reason


# -- resume --------------------------------------------------------------------------------------


def _progress(con: sqlite3.Connection) -> tuple[int, int]:
    """(completed trials, running trials with both parameters set, i.e. dispatched)."""
    complete = con.execute("SELECT COUNT(*) FROM trials WHERE state = 'COMPLETE'").fetchone()
    running = con.execute(
        "SELECT COUNT(*) FROM trials t WHERE state = 'RUNNING' AND "
        "(SELECT COUNT(*) FROM trial_params p WHERE p.trial_id = t.trial_id) = 2").fetchone()
    return complete[0], running[0]


@pytest.mark.slow
def test_resume_after_the_driver_is_killed(ray_address, wait_for_storage, tmp_path):
    db = tmp_path / "resume.db"
    path = tmp_path / "resume.yaml"
    path.write_text(yaml.safe_dump({
        "name": "resume",
        "base": {**LLAMA_8B_ON_A100, "base_dir": str(DATA),
                 "workload": {"num_prompts": 4000, "dataset": {"kind": "random", "input_len": 128,
                                                               "output_len": 64}}},
        "space": {"parameters": {
            "engine.max_num_seqs": {"type": "int", "low": 4, "high": 32, "log": True},
            "engine.max_num_batched_tokens": {"type": "categorical", "choices": [256, 512, 1024]}}},
        "objectives": OBJECTIVES, "budget": {"n_trials": 8},
        "sampler": {"kind": "tpe", "seed": 1, "n_startup_trials": 4},
        # The resumed search runs in this process, whose Ray is already up: nothing to ship.
        "execution": {"workers": 2, "ray_address": ray_address, "ship_to_workers": "none"},
        "storage": f"sqlite:///{db}",
    }))
    code = ("import sys; from dse.study import load_study; from dse.runner import run_search; "
            "run_search(load_study(sys.argv[1]), progress=False)")
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    driver = subprocess.Popen([sys.executable, "-c", code, str(path)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_storage(driver, db, lambda con: _progress(con) >= (2, 1), 60)
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()

    study = load_study(path)
    before = {t.number: t for t in load(study).trials}
    completed = {n: t.values for n, t in before.items()
                 if t.state == optuna.trial.TrialState.COMPLETE}
    running = {n: t.params for n, t in before.items()
               if t.state == optuna.trial.TrialState.RUNNING}
    dispatched = [p for p in running.values() if len(p) == 2]
    assert completed and dispatched

    out = run_search(study, progress=False)
    after = load(study).trials
    by_number = {t.number: t for t in after}
    for n, values in completed.items():                 # no completed trial lost or changed
        assert by_number[n].state == optuna.trial.TrialState.COMPLETE
        assert by_number[n].values == values
    for n in running:                                   # in-flight ones failed as interrupted
        assert by_number[n].state == optuna.trial.TrialState.FAIL
        assert by_number[n].user_attrs["failure_reason"] == INTERRUPTED
    # ... and the parameters of those dispatched enqueued once each, then run to completion
    # (one stopped while its parameters were being suggested never ran: not enqueued).
    requeued = [t for t in after if t.number > max(before) and "fixed_params" in t.system_attrs]
    assert sorted(map(sorted_items, (t.params for t in requeued))) == \
        sorted(map(sorted_items, dispatched))
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in requeued)
    counted = [t for t in after if t.state == optuna.trial.TrialState.COMPLETE
               or (t.state == optuna.trial.TrialState.FAIL
                   and t.user_attrs.get("failure_reason") != INTERRUPTED)]
    assert len(counted) == 8 and out.num_complete == 8
    assert out.num_interrupted == len(running)
    assert not [t for t in after if not t.state.is_finished()]


def sorted_items(params: dict) -> tuple:
    return tuple(sorted(params.items()))


# -- samplers ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_same_seed_gives_the_same_trials(ray_address, tmp_path):
    def trials(storage: str) -> list:
        study = tiny(tmp_path, storage=storage, fidelity=load_study(TINY).fidelity.model_copy(
            update={"confirm": None}), budget=load_study(TINY).budget.model_copy(
            update={"n_trials": 6}))
        run_search(study, progress=False)
        return [(t.params, t.values) for t in load(study).trials]

    sqlite_run = trials(f"sqlite:///{tmp_path / 'a.db'}")
    journal_run = trials(f"journal://{tmp_path / 'b.log'}")
    assert len(sqlite_run) == 6
    assert sqlite_run == journal_run


@pytest.mark.slow
def test_a_configuration_proposed_again_is_not_simulated_again(ray_address, tmp_path):
    # Two configurations in all, eight trials: the random sampler proposes each again, in the
    # same batch or a later one; only the first proposal of each is sent to a worker.
    space = {"parameters": {
        "engine.max_num_batched_tokens": {"type": "categorical", "choices": [1024, 2048]}}}
    base = {**LLAMA_8B_ON_A100, "workload": {
        "num_prompts": 20, "dataset": {"kind": "random", "input_len": 128, "output_len": 16}}}
    study = study_from({"base": base, "space": space, "baseline": False,
                        "sampler": {"kind": "random", "seed": 1}, "budget": {"n_trials": 8}},
                       tmp_path, "again")
    out = run_search(study, progress=False)
    trials = load(study).trials
    assert out.num_complete == 8
    simulated = [t for t in trials if "same_config_as" not in t.user_attrs]
    assert len(simulated) == 2 and out.num_reused == 6
    assert "6 answered from an identical earlier configuration" in out.summary()
    by_number = {t.number: t for t in trials}
    for t in trials:
        if "same_config_as" in t.user_attrs:
            first = by_number[t.user_attrs["same_config_as"]]
            assert first.params == t.params and first.values == t.values
            assert t.user_attrs["metrics"] == first.user_attrs["metrics"]
            assert t.user_attrs["elapsed_s"] == 0.0
    # The report ranks and counts each configuration once, as its first trial.
    from dse.report import build_report

    report = build_report(study.storage_url, study.name, study.objectives, study.constraints)
    assert report.counts()["trials"] == 8 and report.counts()["repeats"] == 6
    ranked = [c for c in report.configurations if c.rank is not None]
    assert sorted(c.number for c in ranked) == sorted(t.number for t in simulated)
    assert {c.number for c in report.pareto} <= {t.number for t in simulated}
    assert not report.not_feasible
    assert any("6 trials proposed a configuration already run" in n for n in report.notes)


@pytest.mark.slow
def test_grid_and_random_samplers(ray_address, tmp_path):
    space = {"parameters": {
        "engine.max_num_seqs": {"type": "int", "low": 16, "high": 32, "step": 16},
        "engine.max_num_batched_tokens": {"type": "categorical", "choices": [1024, 2048]}}}
    base = {**LLAMA_8B_ON_A100, "workload": {
        "num_prompts": 20, "dataset": {"kind": "random", "input_len": 128, "output_len": 16}}}
    grid = study_from({"base": base, "space": space, "sampler": {"kind": "grid"},
                       "baseline": False, "budget": {"n_trials": 10}}, tmp_path, "grid")
    out = run_search(grid, progress=False)
    assert out.stopped_by == "grid" and out.num_complete == 4
    seen = {(t.params["engine.max_num_seqs"], t.params["engine.max_num_batched_tokens"])
            for t in load(grid).trials}
    assert seen == set(itertools.product([16, 32], [1024, 2048]))

    rand = study_from({"base": base, "space": space, "sampler": {"kind": "random", "seed": 3},
                       "budget": {"n_trials": 4}}, tmp_path, "random")
    out = run_search(rand, progress=False)
    assert out.num_complete == 4 and out.pareto_trials


def test_a_bad_objective_metric_is_a_config_error_before_anything_runs(tmp_path):
    study = study_from({
        "base": {**LLAMA_8B_ON_A100, "workload": {"num_prompts": 10}},
        "space": {"parameters": {"engine.max_num_seqs": {"type": "int", "low": 8, "high": 64}}},
        "objectives": [{"metric": "p99_ttft_ms", "direction": "minimize"},
                       {"metric": "output_throughput_per_gpux", "direction": "maximize"}],
    }, tmp_path, "bad")
    with pytest.raises(ConfigError, match=r"objectives\[1\]\.metric: 'output_throughput_per_gpux'"
                                          r".*output_throughput_per_gpu"):
        run_search(study, progress=False)
    assert not (tmp_path / "s.db").exists()


def test_gp_sampler_without_torch_is_one_clear_error(tmp_path):
    try:
        import torch  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("torch is installed")
    study = study_from({
        "base": {**LLAMA_8B_ON_A100, "workload": {"num_prompts": 10}},
        "space": {"parameters": {"engine.max_num_seqs": {"type": "int", "low": 8, "high": 64}}},
        "sampler": {"kind": "gp"}}, tmp_path, "gp")
    with pytest.raises(ConfigError, match="the gp sampler needs torch: pip install torch"):
        run_search(study, progress=False)


@pytest.mark.slow
def test_the_wall_clock_limit_stops_asking_and_skips_confirmation(ray_address, tmp_path):
    # Screening at 30,000 requests a trial takes about 10 s: a 10 s limit (which Ray's
    # start-up counts toward) stops the search after a batch or two, and lets the trials in
    # flight finish.
    study = tiny(tmp_path, budget=load_study(TINY).budget.model_copy(
        update={"n_trials": 40, "timeout_s": 10.0}), fidelity=load_study(TINY).fidelity.model_copy(
        update={"screen": {"workload.num_prompts": 30000}}))
    out = run_search(study, progress=False)
    assert out.stopped_by == "timeout" and out.confirm_study_name is None
    # Said, and to be said in the report (`dse search` adds the run's notes to it).
    assert any(n.startswith("budget.timeout_s stopped the search before its budget of trials")
               and "confirmation stage did not run" in n for n in out.notes), out.notes
    trials = load(study).trials
    assert 0 < out.num_complete == len(trials) < 40
    assert all(t.user_attrs["metrics"]["num_prompts"] == 30000 for t in trials)


def test_pareto_ranks_peel_fronts():
    from dse.pareto import pareto_ranks

    points = [[1, 5], [2, 2], [5, 1], [3, 3], [4, 4], [2, 2], [6, 6]]
    assert pareto_ranks(points, ["minimize", "minimize"]).tolist() == [1, 1, 1, 2, 3, 1, 4]
    assert pareto_ranks([[-1, 5], [-2, 2]], ["maximize", "minimize"]).tolist() == [1, 1]


def test_a_relative_storage_file_resolves_against_the_study_file(tmp_path):
    for url, want in [("sqlite:///run/s.db", f"sqlite:///{DATA.resolve() / 'run' / 's.db'}"),
                      ("journal://s.log", f"journal://{DATA.resolve() / 's.log'}"),
                      ("postgresql://u@h/db", "postgresql://u@h/db")]:
        study = study_from({
            "base": {**LLAMA_8B_ON_A100, "workload": {"num_prompts": 10}},
            "space": {"parameters": {"engine.max_num_seqs": {"type": "int", "low": 8,
                                                             "high": 64}}},
            "storage": url}, tmp_path, "paths")
        assert study.storage_url == want


# -- refusing before any trial -------------------------------------------------------------------


def test_a_base_that_dse_simulate_refuses_is_refused_before_any_trial(tmp_path):
    from simcore.setup import build_deployment

    base = {**LLAMA_8B_ON_A100, "model": {"name": "meta-llama/Llama-3.1-70B"},
            "workload": {"num_prompts": 10}}
    with pytest.raises(ConfigError) as simulate_says:
        build_deployment(parse_config(base))
    study = study_from({
        "base": base,
        "space": {"parameters": {"parallelism.tensor_parallel_size": {
            "type": "categorical", "choices": [1, 4, 8]}}}}, tmp_path, "too-big")
    with pytest.raises(ConfigError) as search_says:
        run_search(study, progress=False)
    assert str(search_says.value) == f"base: {simulate_says.value}"
    assert not (tmp_path / "s.db").exists()


def test_a_base_whose_trace_is_missing_is_refused_before_any_trial(tmp_path):
    study = study_from({
        "base": {**LLAMA_8B_ON_A100, "workload": {
            "num_prompts": 10, "dataset": {"kind": "mooncake", "path": "no_such_trace.jsonl"}}},
        "space": {"parameters": {"engine.max_num_seqs": {"type": "int", "low": 8,
                                                         "high": 64}}}}, tmp_path, "no-trace")
    with pytest.raises(ConfigError, match=r"^base: .*no_such_trace\.jsonl"):
        run_search(study, progress=False)
    assert not (tmp_path / "s.db").exists()


def test_screen_overrides_that_break_the_base_are_named(tmp_path):
    study = tiny(tmp_path, fidelity=load_study(TINY).fidelity.model_copy(update={"screen": {
        "parallelism.tensor_parallel_size": 3}}))
    with pytest.raises(ConfigError, match=r"^fidelity\.screen: the base with these overrides "
                                          r"cannot run \(parallelism\.tensor_parallel_size: "):
        run_search(study, progress=False)


# -- a stored study is resumed only with the study it was run with -------------------------------


def _movable_study(folder: Path, trace: str) -> Path:
    """A study file, its base file and the trace it reads, all in `folder` (relative paths);
    the storage is outside it."""
    folder.mkdir(parents=True)
    (folder / "trace.jsonl").write_text(trace)
    (folder / "base.yaml").write_text(yaml.safe_dump({
        **LLAMA_8B_ON_A100, "workload": {"num_prompts": 10, "dataset": {
            "kind": "mooncake", "path": "trace.jsonl"}}}))
    path = folder / "study.yaml"
    path.write_text(yaml.safe_dump({
        "name": "moved", "base": "base.yaml", "objectives": OBJECTIVES, "baseline": False,
        "space": {"parameters": {"engine.max_num_seqs": {"type": "categorical",
                                                         "choices": [8, 16]}}},
        "sampler": {"kind": "grid"}, "budget": {"n_trials": 2},
        "storage": f"sqlite:///{folder.parent / 'shared.db'}"}))
    return path


@pytest.mark.slow
def test_a_changed_study_is_not_resumed_and_a_moved_one_is(ray_address, tmp_path):
    trace = (DATA / "mooncake_excerpt.jsonl").read_text()
    first = _movable_study(tmp_path / "a", trace)
    assert run_search(load_study(first), progress=False).num_complete == 2
    # The same study file and data in another folder: the same study, resumed (nothing new).
    moved = _movable_study(tmp_path / "b", trace)
    assert run_search(load_study(moved), progress=False).num_complete == 2
    # Another space, and another trace content (the path as written is the same).
    data = yaml.safe_load(moved.read_text())
    data["space"]["parameters"]["engine.max_num_seqs"]["choices"] = [8, 32]
    moved.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as err:
        run_search(load_study(moved), progress=False)
    msg = str(err.value)
    assert "was run with another space:" in msg and "another `name` (or `storage`)" in msg
    lines = trace.splitlines()
    (tmp_path / "b" / "trace.jsonl").write_text("\n".join(lines[1:] + lines[:1]) + "\n")
    with pytest.raises(ConfigError, match="was run with another base and space:"):
        run_search(load_study(moved), progress=False)
    for name in ("fidelity", "constraints", "cost"):
        changed = load_study(first).model_copy(update={name: {
            "fidelity": load_study(first).fidelity.model_copy(
                update={"screen": {"workload.num_prompts": 5}}),
            "constraints": (Constraint(metric="p99_tpot_ms", op="<=", value=50),),
            "cost": load_study(first).cost.model_copy(update={"usd_per_gpu_hour": 3.0}),
        }[name]})
        with pytest.raises(ConfigError, match=f"was run with another {name}:"):
            run_search(changed, progress=False)
    assert len(load(load_study(first)).trials) == 2          # nothing ran meanwhile


# -- resuming reproduces -------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("sampler", [{"kind": "tpe", "seed": 7, "n_startup_trials": 3},
                                     {"kind": "random", "seed": 7}], ids=lambda s: s["kind"])
def test_a_resumed_search_proposes_what_an_uninterrupted_one_does(ray_address, tmp_path,
                                                                   monkeypatch, sampler):
    from dse.driver import StageDriver
    from dse.study import Sampler

    def study(db: str):
        return tiny(tmp_path, storage=f"sqlite:///{tmp_path / db}",
                    sampler=Sampler.model_validate(sampler),
                    fidelity=load_study(TINY).fidelity.model_copy(update={"confirm": None}))

    def trials(s) -> list:
        return [(t.params, t.values) for t in load(s).trials
                if t.user_attrs.get("failure_reason") != INTERRUPTED]

    whole = study("whole.db")
    run_search(whole, progress=False)

    # Stop the other one (as Ctrl-C would) while its third batch is in flight, then resume it.
    real_wait = StageDriver.wait

    def wait(self, flights, *, first_only):
        if self.num_told >= 4:
            raise KeyboardInterrupt
        return real_wait(self, flights, first_only=first_only)

    resumed = study("resumed.db")
    monkeypatch.setattr(StageDriver, "wait", wait)
    with pytest.raises(KeyboardInterrupt):
        run_search(resumed, progress=False)
    monkeypatch.undo()
    assert sum(t.user_attrs.get("failure_reason") == INTERRUPTED
               for t in load(resumed).trials) == 2
    run_search(resumed, progress=False)
    assert len(trials(whole)) == 8
    assert trials(resumed) == trials(whole)


# -- failures Ray reports ------------------------------------------------------------------------


@pytest.mark.slow
def test_a_trial_whose_worker_dies_fails_with_rays_report_kept_off_the_terminal(
        ray_address, processes, tmp_path, capfd):
    import threading

    study = tiny(tmp_path, baseline=False,
                 budget=load_study(TINY).budget.model_copy(update={"n_trials": 1}),
                 fidelity=load_study(TINY).fidelity.model_copy(update={
                     "screen": {"workload.num_prompts": 100000}, "confirm": None}))
    killed = []

    def kill_the_worker() -> None:
        deadline = time.monotonic() + 60
        while not killed and time.monotonic() < deadline:
            for pid, cmd in processes.descendants(os.getpid()).items():
                if cmd.startswith("ray::run_trial"):
                    os.kill(pid, signal.SIGKILL)   # as the kernel's OOM killer would
                    killed.append(pid)
                    break
            time.sleep(0.05)

    killer = threading.Thread(target=kill_the_worker)
    killer.start()
    out = run_search(study, progress=False)
    killer.join()
    assert killed, "no worker was found running the trial"
    assert (out.num_complete, out.num_failed) == (0, 1)
    reason = load(study).trials[0].user_attrs["failure_reason"]
    assert reason.startswith(f"the Ray worker (pid {killed[0]}) died, "), reason
    assert out.problem().startswith(f"no trial completed: 1 x {reason[:120]}")
    printed = capfd.readouterr()
    assert "worker died" not in printed.out + printed.err, printed


@pytest.mark.slow
def test_failed_confirmations_are_counted_and_run_again_on_resume(ray_address, tmp_path,
                                                                  monkeypatch):
    from dse.evaluate import TrialOutcome
    from dse.driver import StageDriver

    # Every confirmation run fails the first time (as when its worker dies).
    died = "the Ray worker (pid 1) died, SYSTEM_ERROR"
    real_tell = StageDriver.tell

    def tell(self, f):
        if self.fidelity == "confirm":
            f.outcome = TrialOutcome(status="failed", reason=died)
        real_tell(self, f)

    monkeypatch.setattr(StageDriver, "tell", tell)
    study = tiny(tmp_path)
    out = run_search(study, progress=False)
    monkeypatch.undo()
    assert out.num_complete == 8 and out.num_failed == 0
    assert out.confirmed_trials == () and len(out.confirm_failed) == 2
    assert out.summary().endswith(", 2 confirmation runs failed"), out.summary()
    assert out.problem() == (f"2 of 2 confirmation runs failed (2 x {died}); run the same "
                             f"command to retry them")
    cst = optuna.load_study(study_name="tiny/confirm", storage=study.storage_url)
    assert [t.state for t in cst.trials] == [optuna.trial.TrialState.FAIL] * 2

    # Resumed, the search runs those confirmations again (and no screening trial).
    again = run_search(study, progress=False)
    assert again.confirmed_trials == out.confirm_failed and again.confirm_failed == ()
    assert again.problem() is None and again.summary().endswith(", 2 confirmed")
    cst = optuna.load_study(study_name="tiny/confirm", storage=study.storage_url)
    assert len(cst.trials) == 4 and len(load(study).trials) == 8
    assert sorted(t.user_attrs["confirms_trial"] for t in cst.trials
                  if t.state == optuna.trial.TrialState.COMPLETE) == sorted(out.confirm_failed)


@pytest.mark.parametrize("path", sorted((TESTS.parent / "studies").glob("*.yaml")),
                         ids=lambda p: p.stem)
def test_every_shipped_study_passes_the_checks_made_before_its_search(path):
    from dse.evaluate import EvalSpec, check_metric_names
    from dse.search_checks import base_metric_names, check_base

    study = load_study(path)
    check_base(study)
    check_metric_names(EvalSpec.of(study), base_metric_names(study))


# -- storage writes per trial (no Ray) -----------------------------------------------------------


class WriteCounter:
    """Write transactions a storage makes: SQLite commits that wrote something (Optuna commits
    its read sessions too), appends to a journal file."""

    def __init__(self, raw) -> None:
        self.n = 0
        if isinstance(raw, optuna.storages.RDBStorage):
            import sqlalchemy

            dirty: set[int] = set()

            def executed(conn, cursor, statement, *args) -> None:
                if not statement.lstrip().upper().startswith("SELECT"):
                    dirty.add(id(conn))

            def committed(conn) -> None:
                if id(conn) in dirty:
                    dirty.discard(id(conn))
                    self.n += 1

            sqlalchemy.event.listen(raw.engine, "after_cursor_execute", executed)
            sqlalchemy.event.listen(raw.engine, "commit", committed)
        elif isinstance(raw, optuna.storages.JournalStorage):
            append = raw._backend.append_logs

            def counted(logs) -> None:
                self.n += 1
                append(logs)

            raw._backend.append_logs = counted


def raw_storage(kind: str, tmp_path: Path):
    return {"sqlite": lambda: optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 's.db'}"),
            "journal": lambda: open_storage(f"journal://{tmp_path / 's.log'}"),
            "memory": optuna.storages.InMemoryStorage}[kind]()


def write_a_trial(st: optuna.Study, storage, flush) -> int:
    """One trial as the driver writes it: asked, suggested, its parameters committed, then its
    attributes, a constraint (also as the list optuna-dashboard reads) and the tell."""
    t = st.ask()
    t.suggest_int("engine.max_num_seqs", 8, 256, log=True)
    t.suggest_categorical("engine.max_num_batched_tokens", [512, 1024])
    flush(t._trial_id)
    t.set_user_attr("fidelity", "screen")
    t.set_user_attr("metrics", {"p99_ttft_ms": 12.5, "p99_tpot_ms": 3.0})
    t.set_user_attr("feasible", False)
    t.set_constraint("p99_tpot_ms <= 2", 1.0)
    storage.set_trial_system_attr(t._trial_id, "constraints", [1.0])
    st.tell(t, [12.5, 800.0])
    return t.number


def stored(raw, name: str) -> list[tuple]:
    """Everything of each trial a report or optuna-dashboard reads, attribute order included."""
    return [(t.number, t.state, t.values, t.params, t.distributions,
             list(t.user_attrs.items()), list(t.system_attrs.items()))
            for t in optuna.load_study(study_name=name, storage=raw).get_trials()]


@pytest.mark.parametrize("kind", ["sqlite", "journal", "memory"])
def test_batched_writes_store_the_trials_per_call_writes_do(kind, tmp_path):
    """The same trials (one of them from the queue, with its own attributes), written call by
    call and through a BatchedStorage, are stored the same; on a file storage the batched
    trial takes three write transactions (ask, parameters, tell) instead of nine."""
    from dse.batched_storage import BatchedStorage

    raw = raw_storage(kind, tmp_path)
    writes = WriteCounter(raw)
    per_trial = {}
    for name, batched in (("per-call", False), ("batched", True)):
        storage = BatchedStorage(raw) if batched else optuna.storages.get_storage(raw)
        st = optuna.create_study(storage=storage, study_name=name, sampler=optuna.samplers.
                                 RandomSampler(seed=1), directions=["minimize", "maximize"])
        st.enqueue_trial({"engine.max_num_seqs": 16, "engine.max_num_batched_tokens": 512},
                         user_attrs={"baseline": True})
        flush = (lambda trial_id: storage.flush([trial_id])) if batched else (lambda _: None)
        write_a_trial(st, storage, flush)
        writes.n = 0
        write_a_trial(st, storage, flush)
        per_trial[name] = writes.n
    assert stored(raw, "batched") == stored(raw, "per-call")
    assert BatchedStorage(raw).batched is (kind != "memory")
    if kind != "memory":
        assert per_trial == {"per-call": 9, "batched": 3}


def test_a_held_trial_reads_with_its_writes_until_they_are_committed(tmp_path):
    from dse.batched_storage import BatchedStorage

    raw = raw_storage("sqlite", tmp_path)
    storage = BatchedStorage(raw)
    st = optuna.create_study(storage=storage, study_name="held")
    t = st.ask()
    t.suggest_int("x", 1, 9)
    t.set_user_attr("fidelity", "screen")
    for mine in (storage.get_trial(t._trial_id), st.get_trials(deepcopy=False)[0]):
        assert mine.params == {"x": t.params["x"]} and mine.user_attrs == {"fidelity": "screen"}
    assert optuna.load_study(study_name="held", storage=raw).trials[0].params == {}
    storage.flush([t._trial_id])
    elsewhere = optuna.load_study(study_name="held", storage=raw).trials[0]
    assert elsewhere.params == t.params and elsewhere.user_attrs == {"fidelity": "screen"}
    assert elsewhere.state == optuna.trial.TrialState.RUNNING
    st.tell(t, 1.0)
    assert optuna.load_study(study_name="held", storage=raw).trials[0].value == 1.0


def test_an_interrupted_held_trial_keeps_its_parameters_and_is_queued_again(tmp_path):
    """The driver stopping mid-trial: the reason, the kept writes and the FAIL are committed
    together, and the parameters are enqueued again for the resumed search."""
    from dse.batched_storage import BatchedStorage
    from dse.driver import interrupt_trials, is_interrupted

    raw = raw_storage("sqlite", tmp_path)
    storage = BatchedStorage(raw)
    st = optuna.create_study(storage=storage, study_name="stop")
    t = st.ask()
    params = {"a": t.suggest_int("a", 1, 9), "b": t.suggest_categorical("b", ["u", "v"])}
    storage.flush([t._trial_id])
    t.set_user_attr("same_config_as", 0)
    running = st.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    interrupt_trials(st, storage, running, {"a", "b"})
    failed, queued = optuna.load_study(study_name="stop", storage=raw).trials
    assert is_interrupted(failed) and failed.params == params
    assert failed.user_attrs == {"same_config_as": 0, "failure_reason": INTERRUPTED}
    assert queued.state == optuna.trial.TrialState.WAITING
    assert queued.system_attrs["fixed_params"] == params


class Done:
    """A finished task, as the stand-in pool's reference to it (hashable, as Ray's are)."""

    def __init__(self, outcome) -> None:
        self.outcome = outcome


class InProcessPool:
    """Stands in for RayPool: simulates each trial in this process when it is submitted."""

    made: list["InProcessPool"] = []

    def __init__(self, workers, address, **kwargs) -> None:
        self.workers, self.workers_from = workers or 2, "a stand-in"
        self.started = False
        self.num_starts = 0
        InProcessPool.made.append(self)

    def start(self) -> None:
        self.num_starts += not self.started
        self.started = True

    def submit(self, *args):
        from dse.evaluate import run_trial

        return Done(run_trial(*args))

    def wait(self, refs, timeout_s):
        return refs[:1]

    def result(self, ref):
        return ref.outcome

    def cancel(self, ref) -> None:
        pass

    def close(self) -> None:
        pass


def test_a_search_writes_each_trial_in_a_few_transactions(tmp_path, monkeypatch):
    """The whole tiny search (8 screened, 2 confirmed) through the driver with one pool for
    both stages: at most three write transactions per trial (ask, a batch's parameters, tell),
    where writing call by call took about 20."""
    import dse.runner
    from dse.batched_storage import BatchedStorage

    counters: list[WriteCounter] = []

    def counted(raw):
        counters.append(WriteCounter(raw))
        return BatchedStorage(raw)

    monkeypatch.setattr(dse.runner, "RayPool", InProcessPool)
    monkeypatch.setattr(dse.runner, "BatchedStorage", counted)
    InProcessPool.made = []
    study = tiny(tmp_path)
    out = run_search(study, progress=False)
    assert out.num_complete == 8 and len(out.confirmed_trials) == 2
    assert [p.num_starts for p in InProcessPool.made] == [1]
    assert out.workers_line() == "2 Ray workers (a stand-in)"
    # Besides the trials': creating the two studies with their attributes, and three trials
    # enqueued (the baseline, the two confirmations), 15 transactions in all.
    assert counters[0].n <= 3 * 10 + 15, counters[0].n


# -- workers -------------------------------------------------------------------------------------


def test_workers_default_to_the_cpus_this_process_may_use_and_ray_starts_once(monkeypatch):
    import ray

    from dse.backends import RayPool, available_cpus

    assert available_cpus() == len(os.sched_getaffinity(0))
    inits = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: inits.append(kwargs))
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    pool = RayPool(None, None)
    try:
        pool.start()
        pool.start()            # the confirmation stage: the same Ray
    finally:
        pool.close()
    assert [kw["num_cpus"] for kw in inits] == [available_cpus()]
    assert pool.workers == available_cpus() and pool.started
    assert pool.workers_from == "one per CPU this process may use"
    set_here = RayPool(3, None)
    try:
        set_here.start()
    finally:
        set_here.close()
    assert inits[-1]["num_cpus"] == 3 and set_here.workers_from == "execution.workers"


def test_a_second_search_of_a_study_being_searched_is_refused(tmp_path):
    from dse.backends import sole_search

    study = tiny(tmp_path)
    with sole_search(study.storage_url, study.name):
        with pytest.raises(ConfigError, match=r"study 'tiny' in .*tiny.db is being searched by "
                                              r"another dse search"):
            run_search(study, progress=False)
        # Another study of the same storage is not held.
        with sole_search(study.storage_url, "other"):
            pass
    with sole_search(study.storage_url, study.name):       # released at the end
        pass
