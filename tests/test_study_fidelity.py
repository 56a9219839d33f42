"""Searched parameters that have no effect at a stage's fidelity: the report says at which stage
and fabric, and a search refuses one that has no effect at every stage, before any trial runs."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import optuna
import pytest

from dse.fidelity import (check_parameters_have_effect, inert_notes, inert_parameters,
                          stage_backends)
from dse.report import write_report
from dse.runner import run_search
from dse.study import load_study, parse_study
from simcore.errors import ConfigError

ROOT = Path(__file__).parent.parent
CNP = "cluster.fabric.settings.dcqcn.cnp_interval_s"


def study_data(screen_backend="analytical", confirm=None, *, storage=None, report=None) -> dict:
    """A small cluster study whose space holds a DCQCN knob beside an engine knob."""
    d = {
        "name": "inert",
        "base": {"model": {"name": "meta-llama/Llama-3.1-8B"},
                 "hardware": {"gpu": "H100-SXM", "gpus_per_node": 2},
                 "parallelism": {"tensor_parallel_size": 4},
                 "workload": {"num_prompts": 8, "dataset": {"kind": "random",
                                                            "input_len": 64,
                                                            "output_len": 8}},
                 "cluster": {"num_nodes": 2, "fabric": {"backend": screen_backend}}},
        "space": {"parameters": {
            "engine.max_num_seqs": {"type": "categorical", "choices": [8, 16]},
            CNP: {"type": "categorical", "choices": [4e-6, 5e-5]}}},
        "objectives": [{"metric": "p99_ttft_ms", "direction": "minimize"}],
        "budget": {"n_trials": 2},
    }
    if confirm is not None:
        d["fidelity"] = {"confirm": confirm}
    if storage is not None:
        d["storage"] = storage
    if report is not None:
        d["report"] = {"dir": report}
    return d


def test_a_packet_only_knob_screened_on_analytical_is_inert_there_only():
    study = parse_study(study_data(confirm={"cluster.fabric.backend": "packet"}), source="s")
    assert stage_backends(study) == {"screen": ("analytical",), "confirm": ("packet",)}
    assert inert_parameters(study) == {CNP: [("screen", "analytical")]}
    (note,) = inert_notes(study)
    assert note.startswith(f"Searched parameter {CNP} had no effect at the fidelity of "
                           f"screening on the analytical fabric (only the packet fabric reads "
                           f"it)")


def test_a_searched_backend_makes_the_knob_inert_on_the_choices_without_packets():
    data = study_data()
    data["space"]["parameters"]["cluster.fabric.backend"] = {
        "type": "categorical", "choices": ["analytical", "packet"]}
    study = parse_study(data, source="s")
    assert inert_parameters(study) == {CNP: [("screen", "analytical")]}


@pytest.mark.parametrize("confirm", [None, {"cluster.fabric.backend": "flow"}])
def test_a_search_refuses_a_knob_inert_at_every_fidelity_before_any_trial(tmp_path, confirm):
    study = parse_study(study_data(confirm=confirm, storage=f"sqlite:///{tmp_path / 's.db'}"),
                        source="s", base_dir=tmp_path)
    with pytest.raises(ConfigError) as err:
        run_search(study, progress=False)
    msg = str(err.value)
    assert msg.startswith(f"space.parameters.{CNP}: has no effect at any fidelity this study "
                          f"runs (screening on the analytical fabric")
    assert "only the packet fabric reads it" in msg and "\n" not in msg
    assert not (tmp_path / "s.db").exists()


def test_the_report_lists_the_knob_and_the_fidelity_it_had_no_effect_at(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    st = optuna.create_study(study_name="inert", storage=url, directions=["minimize"])
    for v in (10.0, 12.0):
        st.add_trial(optuna.trial.create_trial(
            values=[v], user_attrs={"fidelity": "screen", "feasible": True}))
    study = parse_study(study_data(confirm={"cluster.fabric.backend": "packet"}, storage=url,
                                   report=str(tmp_path / "report")), source="s")
    paths = write_report(study)
    (note,) = inert_notes(study)
    assert note in json.loads(paths["json"].read_text())["notes"]
    assert CNP in paths["md"].read_text()
    assert "screening on the analytical fabric" in " ".join(paths["html"].read_text().split())


def test_the_shipped_network_study_searches_no_inert_knob():
    study = load_study(ROOT / "studies" / "cluster_network.yaml")
    assert stage_backends(study) == {"screen": ("analytical",), "confirm": ("flow",)}
    assert inert_parameters(study) == {}


def test_the_shipped_network_study_would_refuse_a_dcqcn_knob():
    study = load_study(ROOT / "studies" / "cluster_network.yaml")
    params = dict(study.space.parameters)
    params[CNP] = parse_study(study_data(), source="s").space.parameters[CNP]
    bigger = study.model_copy(update={"space": study.space.model_copy(
        update={"parameters": params})})
    with pytest.raises(ConfigError, match="screening on the analytical fabric; confirmation on "
                                          "the flow fabric"):
        check_parameters_have_effect(bigger)


def test_a_study_without_a_cluster_has_no_fabric_stage():
    data = copy.deepcopy(study_data())
    del data["base"]["cluster"]
    data["space"]["parameters"].pop(CNP)
    study = parse_study(data, source="s")
    assert stage_backends(study) == {} and inert_parameters(study) == {}
