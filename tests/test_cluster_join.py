"""Joining a Ray cluster (`execution.ray_address`): the driver asks whether the cluster answers
before ray.init (which would retry for minutes), and what a runtime_env sends the workers
(simcore, dse, the study's data files, optionally the project's requirements)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import pytest
import yaml

import dse
import simcore
from dse.backends import open_storage
from dse.ray_connect import probe_ray_address
from dse.ship import requirements, shipment
from dse.study import load_study, parse_study
from simcore.errors import ConfigError

DATA = Path(__file__).parent / "data"
OBJECTIVES = [{"metric": "p99_ttft_ms", "direction": "minimize"}]


def study_with(execution: dict, other: Path = DATA / "custom.jsonl", **update):
    """A study whose base reads a trace relative to tests/data and whose space chooses between
    that one and `other` (an absolute path)."""
    return parse_study({
        "name": "cluster", "objectives": OBJECTIVES, "execution": execution,
        "base": {"model": {"name": "meta-llama/Llama-3.1-8B"}, "hardware": {"gpu": "A100-80GB"},
                 "workload": {"num_prompts": 10, "dataset": {
                     "kind": "mooncake", "path": "mooncake_excerpt.jsonl"}}},
        "space": {"parameters": {"workload.dataset.path": {
            "type": "categorical",
            "choices": ["mooncake_excerpt.jsonl", str(other)]}}},
        **update}, base_dir=DATA)


# -- what the workers are sent -------------------------------------------------------------------


def test_a_ray_client_address_ships_the_packages_and_the_data_files(tmp_path):
    ship = shipment(study_with({"ray_address": "ray://head:10001"}), tmp_path)
    env = ship.runtime_env
    assert env["py_modules"] == [str(Path(simcore.__file__).resolve().parent),
                                 str(Path(dse.__file__).resolve().parent)]
    assert env["working_dir"] == str(tmp_path)
    assert "pip" not in env                     # "files": the nodes have the packages
    # Every file the base or a choice names, relative or absolute, under data/ in the folder.
    assert set(ship.files) == {"mooncake_excerpt.jsonl", str(DATA / "custom.jsonl")}
    assert sorted(ship.names.values()) == ["data/0-custom.jsonl", "data/1-mooncake_excerpt.jsonl"]
    ship.stage()
    for text, name in ship.names.items():
        assert (tmp_path / name).read_bytes() == ship.files[text].read_bytes()
    # Trials name the copies, relative to the worker's working folder.
    base = ship.localize(study_with({"ray_address": "ray://head:10001"}).base)
    assert base["base_dir"] == "."
    assert base["workload"]["dataset"]["path"] == ship.names["mooncake_excerpt.jsonl"]
    assert ship.localize({"workload.dataset.path": str(DATA / "custom.jsonl")}) == \
        {"workload.dataset.path": "data/0-custom.jsonl"}


def test_packages_are_shipped_on_request_and_nothing_without_a_cluster(tmp_path):
    ship = shipment(study_with({"ray_address": "ray://head:10001",
                                "ship_to_workers": "files_and_packages"}), tmp_path)
    pip = ship.runtime_env["pip"]
    names = {p.split(">")[0].split("=")[0].split("<")[0] for p in pip}
    assert {"numpy", "pydantic", "optuna", "simpy"} <= names and "ray" not in names
    assert pip == requirements()
    assert shipment(study_with({"ray_address": "auto", "ship_to_workers": "none"}),
                    tmp_path) is None
    assert shipment(study_with({}), tmp_path) is None


def test_cluster_settings_without_a_cluster_are_refused():
    for key, value in (("connect_timeout_s", 5), ("ship_to_workers", "none")):
        with pytest.raises(ConfigError, match=rf"execution: {key} has no effect without "
                                              r"ray_address"):
            study_with({key: value})


# -- the reachability probe ----------------------------------------------------------------------


def _server(reply: bytes | None):
    """A local TCP server that answers every connection with `reply` (None: says nothing)."""
    sock = socket.create_server(("127.0.0.1", 0))

    def serve():
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            if reply is not None:
                conn.sendall(reply)
            threading.Timer(10, conn.close).start()

    threading.Thread(target=serve, daemon=True).start()
    return sock


def test_nothing_listening_is_one_sentence_at_once():
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=rf"^execution\.ray_address: no Ray cluster answers at "
                                          rf"ray://127\.0\.0\.1:{port} \(.*\); start it"):
        probe_ray_address(f"ray://127.0.0.1:{port}", 5)
    assert time.monotonic() - t0 < 5


def test_a_silent_server_times_out_within_the_limit():
    sock = _server(None)
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=r"no answer within 0\.5 s.*connect_timeout_s"):
        probe_ray_address(f"ray://127.0.0.1:{sock.getsockname()[1]}", 0.5)
    assert time.monotonic() - t0 < 3
    sock.close()


def test_a_server_that_is_not_grpc_is_named():
    sock = _server(b"SSH-2.0-OpenSSH_9.6\r\n")
    with pytest.raises(ConfigError, match=r"something else listens on 127\.0\.0\.1:\d+ \(not a "
                                          r"gRPC server\)"):
        probe_ray_address(f"ray://127.0.0.1:{sock.getsockname()[1]}", 2)
    sock.close()


# -- a real cluster ------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_search_joining_a_cluster_runs_on_the_shipped_files(ray_address, tmp_path):
    probe_ray_address(ray_address, 5)          # Ray's GCS answers the probe
    other = tmp_path / "elsewhere" / "trace.jsonl"
    other.parent.mkdir()
    other.write_bytes((DATA / "mooncake_excerpt.jsonl").read_bytes())
    study = study_with({"ray_address": ray_address, "connect_timeout_s": 5}, other,
                       sampler={"kind": "grid"}, baseline=False, budget={"n_trials": 2},
                       storage=f"sqlite:///{tmp_path / 'c.db'}",
                       report={"dir": str(tmp_path / "report")})
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study.model_dump(mode="json")))
    code = ("import sys; from dse.study import load_study; from dse.runner import run_search; "
            "o = run_search(load_study(sys.argv[1]), progress=False); print(o.summary())")
    p = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                       timeout=240, env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    assert p.returncode == 0, (p.stdout, p.stderr)
    st = optuna.load_study(study_name="cluster", storage=open_storage(load_study(path)
                                                                      .storage_url))
    states = {t.params["workload.dataset.path"]: (t.state, t.user_attrs.get("failure_reason"))
              for t in st.trials}
    assert states == {c: (optuna.trial.TrialState.COMPLETE, None)
                      for c in ("mooncake_excerpt.jsonl", str(other))}, states
