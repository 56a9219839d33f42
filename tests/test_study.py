"""The study file and its search space, without running a search: one-sentence errors that name
the field, paths relative to the study file, dotted-path overrides, conditional parameters, SLO
semantics, and every shipped study and search space."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import optuna
import pytest
import yaml

from dse.backends import make_sampler
from dse.evaluate import EvalSpec, check_metric_names, static_metric_names
from dse.space import SearchSpace, apply, check_paths, load_space, model_kinds
from dse.study import Constraint, load_study, parse_study
from simcore.config import parse_config
from simcore.errors import ConfigError

TESTS = Path(__file__).parent
DATA = TESTS / "data"
ROOT = TESTS.parent
STUDIES = sorted((ROOT / "studies").glob("*.yaml"))
SPACES = sorted((ROOT / "search_spaces").glob("*.yaml"))

LLAMA_8B = {"name": "meta-llama/Llama-3.1-8B"}
MIXTRAL = {"name": "mistralai/Mixtral-8x7B-v0.1"}
DEEPSEEK_V3 = {"name": "deepseek-ai/DeepSeek-V3"}


def good_study() -> dict:
    """A valid study mapping; each error case below breaks one thing in it."""
    return {
        "name": "s",
        "base": {"model": dict(LLAMA_8B), "hardware": {"gpu": "A100-80GB"},
                 "workload": {"num_prompts": 20,
                              "dataset": {"kind": "random", "input_len": 128, "output_len": 16}}},
        "space": {"parameters": {
            "engine.max_num_seqs": {"type": "int", "low": 8, "high": 64, "log": True},
            "engine.max_num_batched_tokens": {"type": "categorical", "choices": [1024, 2048]}}},
        "objectives": [{"metric": "p99_ttft_ms", "direction": "minimize"},
                       {"metric": "output_throughput_per_gpu", "direction": "maximize"}],
        "constraints": ["p99_tpot_ms <= 50"],
        "budget": {"n_trials": 4},
    }


def write_study(tmp_path: Path, data: dict | str, name: str = "study.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def config_error(tmp_path: Path, data: dict | str) -> tuple[Path, str]:
    """(study file, the ConfigError message) of loading `data` as a study file."""
    path = write_study(tmp_path, data)
    with pytest.raises(ConfigError) as err:
        load_study(path)
    return path, str(err.value)


def params(**decls) -> dict:
    return {k.replace("__", "."): v for k, v in decls.items()}


# -- one sentence naming the field ---------------------------------------------------------------


def _set(path: str, value):
    """A mutation of the good study: set the dotted `path` (list indices as numbers)."""
    def mutate(d: dict) -> None:
        *parents, last = path.split(".")
        node = d
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return mutate


def _param(path: str, decl: dict):
    def mutate(d: dict) -> None:
        d["space"]["parameters"][path] = decl
    return mutate


BAD_STUDIES = {
    "unknown top-level key": (_set("budgett", {"n_trials": 3}),
                              ["budgett", "not a known setting"]),
    "constraint with a bad operator": (_set("constraints", ["p99_tpot_ms =< 50"]),
                                       ["constraints", "'p99_tpot_ms =< 50'", "<="]),
    "constraint mapping with a bad operator": (
        _set("constraints", [{"metric": "p99_tpot_ms", "op": "==", "value": 50}]),
        ["constraints[0].op"]),
    "objective with a bad direction": (_set("objectives.0.direction", "smaller"),
                                       ["objectives[0].direction", "minimize", "maximize"]),
    "objective metric listed twice": (
        _set("objectives.1", {"metric": "p99_ttft_ms", "direction": "minimize"}),
        ["objectives", "twice"]),
    "objective against its metric's better direction": (
        _set("objectives.0", {"metric": "p99_ttft_ms", "direction": "maximize"}),
        ["objectives[0].direction", "maximize p99_ttft_ms", "use minimize"]),
    "no objectives": (_set("objectives", []), ["objectives"]),
    "budget of no trials": (_set("budget", {"n_trials": 0}), ["budget.n_trials"]),
    "unknown sampler": (_set("sampler", {"kind": "cmaes"}), ["sampler.kind", "tpe"]),
    "no workers": (_set("execution", {"workers": 0}), ["execution.workers"]),
    "space path that is not a setting": (
        _param("engine.max_num_seq", {"type": "int", "low": 1, "high": 8}),
        ["space:", "engine.max_num_seq", "'max_num_seq' is not a setting", "known:",
         "max_num_seqs", "max_num_batched_tokens"]),
    "space path into an unknown section": (
        _param("engin.max_num_seqs", {"type": "int", "low": 1, "high": 8}),
        ["space:", "engin.max_num_seqs", "'engin'", "known:", "engine"]),
    "space parameter of an unknown type": (
        _param("engine.max_num_seqs", {"type": "integer", "low": 1, "high": 8}),
        ["space:", "engine.max_num_seqs.type", "'integer'", "one of int, float, categorical"]),
    "int parameter with high below low": (
        _param("engine.max_num_seqs", {"type": "int", "low": 16, "high": 4}),
        ["space:", "engine.max_num_seqs", "high (4) is below low (16)"]),
    "log-scale int parameter from 0": (
        _param("engine.max_num_seqs", {"type": "int", "low": 0, "high": 64, "log": True}),
        ["space:", "engine.max_num_seqs", "log", "low >= 1"]),
    "int parameter with step 0": (
        _param("engine.max_num_seqs", {"type": "int", "low": 8, "high": 64, "step": 0}),
        ["space:", "engine.max_num_seqs", "step"]),
    "log-scale float parameter from 0": (
        _param("engine.gpu_memory_utilization", {"type": "float", "low": 0.0, "high": 0.9,
                                                 "log": True}),
        ["space:", "engine.gpu_memory_utilization", "log", "low > 0"]),
    "categorical parameter without choices": (
        _param("engine.max_num_batched_tokens", {"type": "categorical", "choices": []}),
        ["space:", "engine.max_num_batched_tokens", "choices"]),
    "space without parameters": (_set("space", {"parameters": {}}), ["space:", "parameters"]),
    "space that is a list": (_set("space", ["engine.max_num_seqs"]),
                             ["space:", "mapping", "parameters"]),
    "base that is not a mapping": (_set("base", 5), ["base"]),
    "base on an unknown GPU": (_set("base.hardware.gpu", "Z100"),
                               ["base:", "hardware.gpu", "'Z100'", "A100-80GB"]),
    "base with an unknown setting": (_set("base.engine", {"max_num_seq": 8}),
                                     ["base:", "engine.max_num_seq"]),
}


@pytest.mark.parametrize("mutate, words", BAD_STUDIES.values(), ids=BAD_STUDIES.keys())
def test_a_bad_study_is_one_sentence_naming_the_field(tmp_path, mutate, words):
    data = good_study()
    mutate(data)
    path, msg = config_error(tmp_path, data)
    assert "\n" not in msg, msg
    assert msg.startswith(f"{path}: "), msg
    for w in words:
        assert w in msg, (w, msg)


def test_a_bad_base_file_is_named_with_the_base_field(tmp_path):
    (tmp_path / "sim.yaml").write_text(yaml.safe_dump({**good_study()["base"],
                                                       "hardware": {"gpu": "Z100"}}))
    path, msg = config_error(tmp_path, {**good_study(), "base": "sim.yaml"})
    assert msg.startswith(f"{path}: base: hardware.gpu: "), msg
    assert "'Z100'" in msg and "\n" not in msg


def test_a_missing_base_file_is_named_with_the_base_field(tmp_path):
    path, msg = config_error(tmp_path, {**good_study(), "base": "absent.yaml"})
    assert "\n" not in msg and str(tmp_path / "absent.yaml") in msg and "no such file" in msg
    assert msg.startswith(f"{path}: base: "), (
        f"a missing base file should be reported against the study file's `base` field "
        f"(\"{path}: base: ...absent.yaml: no such file\"), got: {msg}")


def test_a_missing_space_file_is_named_with_the_space_field(tmp_path):
    path, msg = config_error(tmp_path, {**good_study(), "space": "gone.yaml"})
    assert "\n" not in msg and str(tmp_path / "gone.yaml") in msg and "no such file" in msg
    assert msg.startswith(f"{path}: space: "), (
        f"a missing space file should be reported against the study file's `space` field "
        f"(\"{path}: space: ...gone.yaml: no such file\"), got: {msg}")


def test_a_bad_parameter_in_a_space_file_names_the_file_and_the_parameter(tmp_path):
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(
        {"parameters": {"engine.max_num_seqs": {"type": "int", "low": 16, "high": 4}}}))
    _, msg = config_error(tmp_path, {**good_study(), "space": "space.yaml"})
    assert str(tmp_path / "space.yaml") in msg and "engine.max_num_seqs" in msg, msg
    assert "high (4) is below low (16)" in msg and "\n" not in msg


def test_a_path_through_a_single_value_is_rejected_at_load(tmp_path):
    # engine.max_num_seqs is a number: nothing lies below it. Accepting the path only makes
    # every trial infeasible once the search runs.
    data = good_study()
    data["space"]["parameters"]["engine.max_num_seqs.low"] = {"type": "int", "low": 1, "high": 8}
    path = write_study(tmp_path, data)
    try:
        load_study(path)
    except ConfigError as err:
        assert "engine.max_num_seqs.low" in str(err), str(err)
    else:
        pytest.fail("check_paths accepts engine.max_num_seqs.low although engine.max_num_seqs "
                    "is a single value, not a section; the error should come at load time")


def test_a_yaml_syntax_error_names_the_line(tmp_path):
    text = "name: s\nbase:\n  model: {name: meta-llama/Llama-3.1-8B}\n   hardware: {gpu: H200}\n"
    path, msg = config_error(tmp_path, text)
    assert msg.startswith(str(path)) and "line 4" in msg and "not valid YAML" in msg, msg
    assert "\n" not in msg


def test_a_yaml_syntax_error_in_the_space_file_names_its_line(tmp_path):
    (tmp_path / "space.yaml").write_text("parameters:\n  engine.max_num_seqs: {type: int\n")
    _, msg = config_error(tmp_path, {**good_study(), "space": "space.yaml"})
    assert str(tmp_path / "space.yaml") in msg and re.search(r"line \d+", msg), msg


def test_a_study_that_is_not_a_mapping(tmp_path):
    path, msg = config_error(tmp_path, "- name: s\n")
    assert msg == f"{path}: the top level must be a mapping of settings"


def test_a_missing_study_file(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_study(tmp_path / "absent.yaml")


def test_a_float_without_step_cannot_be_gridded():
    space = SearchSpace.model_validate({"parameters": params(
        engine__gpu_memory_utilization={"type": "float", "low": 0.8, "high": 0.95})})
    base = good_study()["base"]
    with pytest.raises(ConfigError) as err:
        space.grid(base)
    msg = str(err.value)
    assert "engine.gpu_memory_utilization" in msg and "step" in msg and "\n" not in msg


def test_a_float_without_step_under_the_grid_sampler_fails_before_any_trial(tmp_path):
    data = good_study()
    data["space"]["parameters"]["engine.gpu_memory_utilization"] = {
        "type": "float", "low": 0.8, "high": 0.95}
    data["sampler"] = {"kind": "grid"}
    study = load_study(write_study(tmp_path, data))
    with pytest.raises(ConfigError, match="engine.gpu_memory_utilization.*step"):
        make_sampler(study)


def test_grid_values():
    space = SearchSpace.model_validate({"parameters": params(
        engine__max_num_seqs={"type": "int", "low": 8, "high": 64, "log": True},
        engine__max_num_batched_tokens={"type": "int", "low": 1024, "high": 4096, "step": 1024},
        engine__gpu_memory_utilization={"type": "float", "low": 0.8, "high": 0.9, "step": 0.05},
        router__policy={"type": "categorical", "choices": ["round_robin", "least_outstanding"]})})
    grid = space.grid(good_study()["base"])
    assert grid["engine.max_num_seqs"] == [8, 16, 32, 64]
    assert grid["engine.max_num_batched_tokens"] == [1024, 2048, 3072, 4096]
    assert grid["engine.gpu_memory_utilization"] == pytest.approx([0.8, 0.85, 0.9])
    assert grid["router.policy"] == ["round_robin", "least_outstanding"]
    # A log grid whose doublings stop short of its high ends at the high.
    short = SearchSpace.model_validate({"parameters": params(
        engine__max_num_seqs={"type": "int", "low": 10, "high": 200, "log": True})})
    assert short.grid(good_study()["base"])["engine.max_num_seqs"] == [10, 20, 40, 80, 160, 200]


def test_a_baseline_off_the_grid_is_not_queued_under_the_grid_sampler():
    from dse.runner import off_grid

    data = {**good_study(), "sampler": {"kind": "grid"},
            "space": {"parameters": params(
                engine__max_num_seqs={"type": "int", "low": 10, "high": 200, "log": True})}}
    study = parse_study(data)
    assert off_grid(study, {"engine.max_num_seqs": 40}) is None
    assert off_grid(study, {"engine.max_num_seqs": 100}) == (
        "engine.max_num_seqs = 100 is not a point of the grid ([10, 20, 40, 80, 160, 200])")


# -- paths relative to the study file ------------------------------------------------------------


def test_paths_resolve_against_the_study_file_not_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    here = DATA / "studies"
    study = load_study(here / "relative_paths.yaml")
    tiny = yaml.safe_load((DATA / "configs" / "tiny.yaml").read_text())
    assert study.base["model"] == tiny["model"] and study.base["workload"] == tiny["workload"]
    # The base's own relative paths (traces, HF configs) resolve against the base file.
    assert Path(study.base["base_dir"]) == (DATA / "configs").resolve()
    shipped = load_space(str(ROOT / "search_spaces" / "engine_batching.yaml"), "space")
    assert study.space == shipped
    assert study.storage_url == f"sqlite:///{(here / 'runs' / 'relative.db').resolve()}"
    assert study.report_dir == (here / "out" / "relative").resolve()
    # The same study loaded by a relative path from elsewhere.
    monkeypatch.chdir(TESTS)
    again = load_study(Path("data") / "studies" / "relative_paths.yaml")
    assert again.storage_url == study.storage_url and again.report_dir == study.report_dir
    assert again.base == study.base and again.space == study.space


def test_storage_defaults_and_schemes_resolve_against_the_study_file(tmp_path, monkeypatch):
    sub = tmp_path / "studies"
    sub.mkdir()
    monkeypatch.chdir(tmp_path)
    data = good_study()
    study = load_study(write_study(sub, data))
    assert study.report_dir == sub / "reports" / "s"
    assert study.storage_url == f"sqlite:///{sub / 'reports' / 's' / 'study.db'}"
    # An inline base resolves its relative paths against the study file.
    assert Path(study.base["base_dir"]) == sub
    cases = {
        "sqlite:///db/s.db": f"sqlite:///{sub / 'db' / 's.db'}",
        f"sqlite:///{tmp_path / 'abs.db'}": f"sqlite:///{tmp_path / 'abs.db'}",
        "journal://logs/s.log": f"journal://{sub / 'logs' / 's.log'}",
        "sqlite:///:memory:": "sqlite:///:memory:",
        "postgresql://u:p@db.example/optuna": "postgresql://u:p@db.example/optuna",
    }
    for given, expected in cases.items():
        study = load_study(write_study(sub, {**data, "storage": given}))
        assert study.storage_url == expected, given
    study = load_study(write_study(sub, {**data, "report": {"dir": "../out"}}))
    assert study.report_dir == tmp_path / "out"
    assert study.storage_url == f"sqlite:///{tmp_path / 'out' / 'study.db'}"


# -- dotted paths --------------------------------------------------------------------------------


def test_apply_sets_dotted_paths_on_a_copy():
    base = good_study()["base"]
    before = copy.deepcopy(base)
    out = apply(base, {"engine.max_num_seqs": 32, "hardware.gpu": "H200",
                       "workload.dataset.input_len": 512,
                       "parallelism.tensor_parallel_size": 2})
    assert base == before                              # the base is not touched
    assert out["engine"] == {"max_num_seqs": 32}       # a missing section is created
    assert out["hardware"] == {"gpu": "H200"}
    assert out["workload"]["dataset"] == {"kind": "random", "input_len": 512, "output_len": 16}
    assert out["workload"]["num_prompts"] == 20        # siblings stay
    assert out["parallelism"] == {"tensor_parallel_size": 2}
    assert apply(base, {}) == base and apply(base, {}) is not base
    # A path through a single value is an error naming the path.
    with pytest.raises(ConfigError, match=r"model\.name\.x: name is not a section"):
        apply(base, {"model.name.x": 1})
    cfg = parse_config(out)
    assert cfg.engine.max_num_seqs == 32 and cfg.workload.dataset.input_len == 512


# -- conditional parameters ----------------------------------------------------------------------


CONDITIONAL = SearchSpace.model_validate({"parameters": {
    "engine.max_num_seqs": {"type": "int", "low": 8, "high": 64, "log": True},
    "model.dtype": {"type": "categorical", "choices": ["bf16", "fp8"], "when": "moe"},
    "engine.max_num_batched_tokens": {"type": "categorical", "choices": [2048, 4096],
                                      "when": "dense"},
    "engine.block_size": {"type": "categorical", "choices": [16, 64], "when": "mla"}}})


@pytest.mark.parametrize("model, kinds, active", [
    (LLAMA_8B, {"dense"}, ["engine.max_num_seqs", "engine.max_num_batched_tokens"]),
    (MIXTRAL, {"moe"}, ["engine.max_num_seqs", "model.dtype"]),
    (DEEPSEEK_V3, {"moe", "mla"}, ["engine.max_num_seqs", "model.dtype", "engine.block_size"]),
], ids=["dense Llama", "MoE Mixtral", "MoE+MLA DeepSeek"])
def test_conditions_follow_the_base_model(model, kinds, active):
    base = {"model": model, "hardware": {"gpu": "H200"}}
    assert model_kinds(base) == kinds
    assert list(CONDITIONAL.active(base)) == active
    assert list(CONDITIONAL.grid(base)) == active
    # An Optuna trial is asked for the active parameters only.
    st = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    trial = st.ask()
    values = CONDITIONAL.suggest(trial, base)
    assert list(values) == active and set(trial.params) == set(active)


def test_a_conditional_parameter_of_a_dense_study_is_dropped(tmp_path):
    data = good_study()
    data["space"]["parameters"]["model.dtype"] = {"type": "categorical",
                                                  "choices": ["bf16", "fp8"], "when": "moe"}
    study = load_study(write_study(tmp_path, data))
    assert "model.dtype" in study.space.parameters
    assert "model.dtype" not in study.space.active(study.base)
    data["base"]["model"] = dict(MIXTRAL)
    data["base"]["hardware"] = {"gpu": "H200"}
    study = load_study(write_study(tmp_path, data))
    assert "model.dtype" in study.space.active(study.base)


def test_an_unknown_condition_is_an_error(tmp_path):
    data = good_study()
    data["space"]["parameters"]["model.dtype"] = {"type": "categorical",
                                                  "choices": ["bf16"], "when": "sparse"}
    _, msg = config_error(tmp_path, data)
    assert "model.dtype" in msg and "when" in msg and "moe" in msg, msg


# -- SLO semantics -------------------------------------------------------------------------------


OPS = {  # op: (x below 50, x at 50, x above 50) -> met?
    "<=": (True, True, False),
    "<": (True, False, False),
    ">=": (False, True, True),
    ">": (False, False, True),
}


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dx", [-1e-6, -7.5, 0.0, 1e-6, 7.5])
def test_constraint_met_and_violation_around_the_threshold(op, dx):
    c = Constraint(metric="p99_tpot_ms", op=op, value=50.0)
    x = 50.0 + dx
    below, at, above = OPS[op]
    met = below if dx < 0 else at if dx == 0 else above
    assert c.met(x) is met
    v = c.violation(x)
    # Optuna's convention: feasible iff every constraint value is <= 0.
    assert (v <= 0) is met
    if met:
        assert v == pytest.approx(-abs(dx))          # minus the slack
    else:
        assert v == pytest.approx(abs(dx), abs=1e-9) and v > 0  # the shortfall, never 0


def test_a_strict_constraint_at_its_threshold_is_violated_by_a_positive_amount():
    for op in ("<", ">"):
        v = Constraint(metric="m", op=op, value=10).violation(10.0)
        assert v > 0 and v == pytest.approx(0, abs=1e-6)
    for op in ("<=", ">="):
        assert Constraint(metric="m", op=op, value=10).violation(10.0) == 0


@pytest.mark.parametrize("text, metric, op, value", [
    ("p99_tpot_ms <= 50", "p99_tpot_ms", "<=", 50.0),
    ("p99_tpot_ms<50", "p99_tpot_ms", "<", 50.0),
    ("  output_throughput_per_gpu >= 2e3 ", "output_throughput_per_gpu", ">=", 2000.0),
    ("failed > -0.5", "failed", ">", -0.5),
    ("gpu_busy_fraction <= .9", "gpu_busy_fraction", "<=", 0.9),
])
def test_constraint_strings(text, metric, op, value):
    data = {**good_study(), "constraints": [text]}
    study = parse_study(data, source="s")
    assert study.constraints == (Constraint(metric=metric, op=op, value=value),)
    assert str(study.constraints[0]) == f"{metric} {op} {value:g}"


@pytest.mark.parametrize("text", ["p99_tpot_ms =< 50", "p99_tpot_ms == 50", "p99_tpot_ms <= fast",
                                  "<= 50", "p99_tpot_ms <= 50 ms"])
def test_malformed_constraint_strings(text):
    with pytest.raises(ConfigError, match=re.escape(repr(text))):
        parse_study({**good_study(), "constraints": [text]}, source="s")


# -- shipped studies and spaces ------------------------------------------------------------------


def test_studies_and_spaces_are_shipped():
    assert {p.stem for p in STUDIES} >= {"quickstart", "llama70b_multinode", "qwen3_moe_h200"}
    assert SPACES


@pytest.mark.parametrize("path", STUDIES, ids=[p.stem for p in STUDIES])
def test_every_shipped_study_loads_with_valid_paths_and_metrics(path):
    study = load_study(path)
    assert study.space.parameters and study.objectives
    check_paths(study.space, str(path))
    assert study.space.active(study.base), "no parameter applies to the study's own model"
    # The fidelity overrides are settings of the simulate config too, and every stage's
    # configuration is valid.
    for overrides in (study.fidelity.screen, study.fidelity.confirm or {}):
        if overrides:
            check_paths(SearchSpace.model_validate({"parameters": {
                p: {"type": "categorical", "choices": [v]} for p, v in overrides.items()}}),
                str(path))
        parse_config(apply(study.base, overrides), source=str(path))
    # Objectives and SLOs name metrics a trial reports.
    check_metric_names(EvalSpec.of(study), static_metric_names(parse_config(study.base)))
    # The report lands in reports/<name> of the repository, as the README says.
    assert study.report_dir == (ROOT / "reports" / study.name).resolve()


@pytest.mark.parametrize("path", SPACES, ids=[p.stem for p in SPACES])
def test_every_shipped_search_space_loads(path):
    space = load_space(str(path), "space")
    assert space.parameters
    for p in space.parameters:
        assert "." in p
    if space.num_gpus is not None:
        assert space.num_gpus >= 1


def test_a_float_grid_must_reach_its_high_and_the_baseline_must_be_on_it():
    from dse.evaluate import _outside
    from dse.space import FloatParam

    with pytest.raises(ValueError, match="step \\(0.07\\) does not divide high - low"):
        FloatParam(type="float", low=0.8, high=0.95, step=0.07)
    p = FloatParam(type="float", low=0.8, high=0.95, step=0.05)
    assert _outside(p, 0.85) is None and _outside(p, 0.95) is None
    # vLLM's default gpu_memory_utilization 0.92 is in the range but off the grid: Optuna could
    # not record it, so it is not queued as the baseline.
    assert "off the space's grid" in _outside(p, 0.92)


@pytest.mark.parametrize("seed", [-1, 2**40])
def test_a_sampler_seed_outside_numpy_range_is_refused(seed):
    from dse.study import Sampler

    with pytest.raises(ValueError, match="seed"):
        Sampler(seed=seed)


def test_confirmation_overrides_that_cannot_run_are_refused_before_any_trial(tmp_path):
    from dse.search_checks import check_confirm

    study = parse_study({
        "name": "c", "base": {"model": {"name": "meta-llama/Llama-3.1-8B"},
                              "hardware": {"gpu": "A100-80GB"},
                              "workload": {"num_prompts": 8}},
        "space": {"parameters": {"engine.max_num_seqs": {"type": "categorical",
                                                         "choices": [8, 16]}}},
        "objectives": [{"metric": "p99_ttft_ms", "direction": "minimize"}],
        "fidelity": {"confirm": {"workload.nm_prompts": 50}},
        "storage": f"sqlite:///{tmp_path / 's.db'}"})
    with pytest.raises(ConfigError, match="^fidelity.confirm: the base with these overrides "
                                          "cannot run .*workload.nm_prompts"):
        check_confirm(study)


@pytest.mark.parametrize("update, message", [
    ({"constraints": ["p99_ttft_ms <= 100", "p99_ttft_ms <= 100"]},
     "constraints: p99_ttft_ms <= 100 is listed twice"),
    ({"constraints": [{"metric": "p99_ttft_ms", "op": "<=", "value": float("inf")}]},
     "constraints[0].value"),
    ({"sampler": {"kind": "nsga2", "n_startup_trials": 5}},
     "sampler.n_startup_trials: only read by the tpe and gp samplers, not nsga2"),
    ({"sampler": {"kind": "random", "population_size": 5}},
     "sampler.population_size: only read by the nsga2 and nsga3 samplers, not random"),
    ({"fidelity": {"confirm_top_k": 2}},
     "fidelity.confirm_top_k: has no effect without confirm"),
])
def test_study_settings_with_no_effect_or_twice_are_refused(update, message):
    data = {"name": "c", "base": {"model": {"name": "meta-llama/Llama-3.1-8B"},
                                  "hardware": {"gpu": "A100-80GB"}},
            "space": {"parameters": {"engine.max_num_seqs": {"type": "categorical",
                                                             "choices": [8, 16]}}},
            "objectives": [{"metric": "p99_ttft_ms", "direction": "minimize"}], **update}
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_study(data)


def test_a_space_that_does_not_apply_to_the_base_is_refused_before_any_trial():
    from dse.search_checks import check_space_applies

    data = {"name": "c", "base": {"model": {"name": "meta-llama/Llama-3.1-8B"},
                                  "hardware": {"gpu": "A100-80GB"},
                                  "workload": {"num_prompts": 8}},
            "objectives": [{"metric": "p99_ttft_ms", "direction": "minimize"}]}
    moe_only = parse_study({**data, "space": {"parameters": {
        "parallelism.enable_expert_parallel": {"type": "categorical", "choices": [True, False],
                                               "when": "moe"}}}})
    with pytest.raises(ConfigError, match="^space: no parameter applies to the base's model"):
        check_space_applies(moe_only)
    pd = parse_study({**data, "space": {"serving": ["aggregated", "disaggregated"],
                                        "parameters": {"engine.max_num_seqs": {
                                            "type": "categorical", "choices": [8, 16]}}}})
    with pytest.raises(ConfigError, match="^space.serving: disaggregated serving moves KV caches"):
        check_space_applies(pd)


def test_searched_values_the_base_refuses_are_refused_before_any_trial(tmp_path):
    from dse.search_checks import check_space_applies

    policies = {"engine.scheduling_policy": {"type": "categorical",
                                             "choices": ["fcfs", "priority"]}}
    data = {"name": "c", "base": {"model": {"name": "meta-llama/Llama-3.1-8B"},
                                  "hardware": {"gpu": "A100-80GB"},
                                  "workload": {"num_prompts": 8}},
            "space": {"parameters": policies},
            "objectives": [{"metric": "p99_ttft_ms", "direction": "minimize"}]}
    # No dataset but a custom file carries priorities: the priority policy would be fcfs.
    with pytest.raises(ConfigError, match=r"^space\.engine\.scheduling_policy: the choice "
                                          r"priority is refused .*priority has no effect"):
        check_space_applies(parse_study(data))
    # A custom file with priorities: vLLM refuses them under fcfs.
    (tmp_path / "p.jsonl").write_text("".join(
        f'{{"prompt_len": 32, "output_len": 4, "priority": {p}}}\n' for p in (0, 1, 2)))
    custom = copy.deepcopy(data)
    custom["base"]["workload"] = {"num_prompts": 3, "dataset": {
        "kind": "custom", "path": str(tmp_path / "p.jsonl")}}
    with pytest.raises(ConfigError, match=r"^space\.engine\.scheduling_policy: the choice fcfs"):
        check_space_applies(parse_study(custom))
    custom["space"]["parameters"] = {"engine.scheduling_policy": {
        "type": "categorical", "choices": ["priority"]}, "engine.max_num_seqs": {
        "type": "categorical", "choices": [8, 16]}}
    check_space_applies(parse_study(custom))
    # compute.moe_routing has no effect on the expert-parallel trials the space searches.
    moe = copy.deepcopy(data)
    moe["base"]["model"] = {"name": "Qwen/Qwen3-30B-A3B"}
    moe["base"]["hardware"] = {"gpu": "H100-SXM"}
    moe["base"]["compute"] = {"moe_routing": "balanced"}
    moe["space"]["parameters"] = {"parallelism.enable_expert_parallel": {
        "type": "categorical", "choices": [False, True], "when": "moe"}}
    with pytest.raises(ConfigError, match=r"^base: compute\.moe_routing: has no effect on the "
                                          r"trials with expert parallelism"):
        check_space_applies(parse_study(moe))
    del moe["base"]["compute"]
    check_space_applies(parse_study(moe))
    # Where a disaggregated role is kept without expert parallelism, the routing still counts.
    moe["base"]["compute"] = {"moe_routing": "balanced"}
    moe["base"]["parallelism"] = {"tensor_parallel_size": 2, "prefill_decode": {
        "num_prefill_instances": 1, "num_decode_instances": 2,
        "prefill_expert_parallel": False}}
    moe["base"]["cluster"] = {"num_nodes": 1}
    check_space_applies(parse_study(moe))
    # A choice written as text is read as the trial reads it: "true" is expert parallelism.
    quoted = copy.deepcopy(data)
    quoted["base"]["model"] = {"name": "Qwen/Qwen3-30B-A3B"}
    quoted["base"]["hardware"] = {"gpu": "H100-SXM"}
    quoted["base"]["compute"] = {"moe_routing": "balanced"}
    quoted["space"]["parameters"] = {"parallelism.enable_expert_parallel": {
        "type": "categorical", "choices": ["false", "true"]}}
    with pytest.raises(ConfigError, match=r"^base: compute\.moe_routing: has no effect"):
        check_space_applies(parse_study(quoted))
    quoted["space"]["parameters"]["parallelism.enable_expert_parallel"]["choices"] = ["false"]
    check_space_applies(parse_study(quoted))
    # A searched routing beside searched expert parallelism, or the base's.
    routing = {"type": "categorical", "choices": ["balanced", "power_law_1.2"]}
    searched = copy.deepcopy(quoted)
    del searched["base"]["compute"]
    searched["space"]["parameters"] = {
        "parallelism.enable_expert_parallel": {"type": "categorical", "choices": [False, True]},
        "compute.moe_routing": routing}
    with pytest.raises(ConfigError, match=r"^space\.compute\.moe_routing: the choice balanced "
                                          r"has no effect on the trials with expert parallelism "
                                          r"that space\.parallelism\.enable_expert_parallel"):
        check_space_applies(parse_study(searched))
    searched["space"]["parameters"] = {"compute.moe_routing": routing}
    check_space_applies(parse_study(searched))
    searched["base"]["parallelism"] = {"tensor_parallel_size": 2, "enable_expert_parallel": True}
    with pytest.raises(ConfigError, match=r"^space\.compute\.moe_routing: the choice balanced "
                                          r"has no effect on the base's expert parallelism"):
        check_space_applies(parse_study(searched))


@pytest.mark.parametrize("path, param, message", [
    ("engine.max_num_seqs", {"type": "categorical", "choices": [8, 0]},
     "the choice 0 is refused by the setting (Input should be greater than or equal to 1)"),
    ("engine.max_num_seqs", {"type": "int", "low": 0, "high": 8},
     "the low end 0 is refused by the setting"),
    ("engine.gpu_memory_utilization", {"type": "float", "low": 0.5, "high": 1.5},
     "the high end 1.5 is refused by the setting (Input should be less than or equal to 1)"),
    ("engine.max_num_seqs", {"type": "categorical", "choices": [True, 8]},
     "the choice true is refused by the setting"),
    ("compute.moe_routing", {"type": "categorical", "choices": ["balanced", "zipf"]},
     "the choice 'zipf' is refused by the setting (Input should be 'balanced'"),
    ("model.dtype", {"type": "categorical", "choices": ["bf16", "fp7"]},
     "the choice 'fp7' is refused by the setting"),
    # A float range over a whole-number setting draws values it refuses between its ends.
    ("engine.max_num_seqs", {"type": "float", "low": 8, "high": 64},
     "a value inside the float range, 25.8254, is refused by the setting (Input should be a "
     "valid integer, got a number with a fractional part); search it with type: int"),
    # A section is no one setting (a whole budget of trials used to fail on it).
    ("engine", {"type": "int", "low": 8, "high": 64},
     "'engine' is a section of settings, not one setting (search one of them: "),
])
def test_searched_values_no_trial_could_run_are_refused_with_the_setting(path, param, message):
    data = {"name": "c", "base": {"model": {"name": "meta-llama/Llama-3.1-8B"},
                                  "hardware": {"gpu": "A100-80GB"},
                                  "workload": {"num_prompts": 8}},
            "space": {"parameters": {path: param}},
            "objectives": [{"metric": "p99_ttft_ms", "direction": "minimize"}]}
    with pytest.raises(ConfigError, match=re.escape(f"parameters.{path}: {message}")):
        parse_study(data)
    # The same setting searched over values it takes is accepted.
    if path == "engine":
        return
    ok = {"categorical": {"type": "categorical", "choices": [None, "balanced"]}
          if path == "compute.moe_routing" else {"type": "categorical", "choices": ["bf16"]}
          if path == "model.dtype" else {"type": "categorical", "choices": [0.5, 0.9]}
          if "memory" in path else {"type": "categorical", "choices": [8, 16]}}
    parse_study({**data, "space": {"parameters": {path: ok["categorical"]}}})
    if path == "engine.max_num_seqs":     # a float range on a whole-number grid is whole
        parse_study({**data, "space": {"parameters": {path: {"type": "float", "low": 8,
                                                             "high": 64, "step": 8}}}})


def test_a_report_dir_that_is_a_file_is_named_as_such(tmp_path):
    from dse.search_checks import check_outputs

    afile = tmp_path / "afile"
    afile.write_text("x")
    study = parse_study({
        "name": "c", "base": {"model": {"name": "meta-llama/Llama-3.1-8B"},
                              "hardware": {"gpu": "A100-80GB"}, "workload": {"num_prompts": 8}},
        "space": {"parameters": {"engine.max_num_seqs": {"type": "categorical",
                                                         "choices": [8, 16]}}},
        "objectives": [{"metric": "p99_ttft_ms", "direction": "minimize"}],
        "report": {"dir": str(afile)}})
    # The storage lives in the report folder by default: the folder is what to fix.
    with pytest.raises(ConfigError, match=f"^report.dir: cannot write the report to {afile}"):
        check_outputs(study)


def test_a_constraint_value_that_is_no_number_is_named():
    data = {"name": "c", "base": {"model": {"name": "meta-llama/Llama-3.1-8B"},
                                  "hardware": {"gpu": "A100-80GB"}},
            "space": {"parameters": {"engine.max_num_seqs": {"type": "categorical",
                                                             "choices": [8, 16]}}},
            "objectives": [{"metric": "p99_ttft_ms", "direction": "minimize"}],
            "constraints": ["p99_tpot_ms <= 50", "p99_ttft_ms <= ."]}
    with pytest.raises(ConfigError, match=re.escape("constraints: 'p99_ttft_ms <= .': '.' is "
                                                    "not a number")):
        parse_study(data)


def test_a_metric_the_base_does_not_report_says_when_it_is_reported():
    from dse.evaluate import EvalSpec, check_metric_names
    from dse.search_checks import base_metric_names

    data = {"name": "c", "base": {"model": {"name": "meta-llama/Llama-3.1-8B"},
                                  "hardware": {"gpu": "A100-80GB"},
                                  "workload": {"num_prompts": 30, "request_rate": 5}},
            "space": {"parameters": {"engine.max_num_seqs": {"type": "categorical",
                                                             "choices": [8, 16]}}},
            "objectives": [{"metric": "p99_ttft_ms", "direction": "minimize"}]}
    for metric, when in (("spec_decode_acceptance_rate", "with engine.speculative_config"),
                         ("network_share_of_request_latency", "with a cluster section"),
                         ("queue_growth_rps", "when arrivals are spread over time")):
        study = parse_study({**data, "constraints": [f"{metric} <= 50"]})
        with pytest.raises(ConfigError, match=re.escape(
                f"constraints[0].metric: {metric!r} is reported only {when}")):
            check_metric_names(EvalSpec.of(study), base_metric_names(study))
    study = parse_study({**data, "constraints": ["p99_ttft_mss <= 50"]})
    with pytest.raises(ConfigError, match="is not a numeric metric of the result"):
        check_metric_names(EvalSpec.of(study), base_metric_names(study))
