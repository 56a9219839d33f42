"""optuna-dashboard over a study's storage: its REST API lists the study, in-process and by HTTP."""

from __future__ import annotations

import io
import json
import socket
import threading
import time
import urllib.request
from wsgiref.util import setup_testing_defaults

import optuna
import pytest

from dse.dashboard import dashboard_app, dashboard_url, serve_dashboard
from simcore.errors import ConfigError


@pytest.fixture(scope="module")
def storage_url(tmp_path_factory) -> str:
    """A study of 11 trials (10 complete, 1 failed) and its confirmation study, as a search
    stores them."""
    url = f"sqlite:///{tmp_path_factory.mktemp('dash') / 'study.db'}"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="dash", storage=url,
                                directions=["minimize", "maximize"])
    for i in range(10):
        t = study.ask()
        t.suggest_categorical("engine.max_num_seqs", [2, 4, 8, 32, 256])
        t.set_user_attr("fidelity", "screen")
        study.tell(t, [100.0 + 10 * i, 2000.0 - 50 * i])
    t = study.ask()
    t.set_user_attr("failure_reason", "simulation timed out after 300 s")
    study.tell(t, state=optuna.trial.TrialState.FAIL)
    confirm = optuna.create_study(study_name="dash/confirm", storage=url,
                                  directions=["minimize", "maximize"])
    t = confirm.ask()
    t.set_user_attr("confirms_trial", 3)
    confirm.tell(t, [131.0, 1850.0])
    return url


def _get(app, path: str) -> tuple[str, dict]:
    environ: dict = {}
    setup_testing_defaults(environ)
    environ.update({"REQUEST_METHOD": "GET", "PATH_INFO": path, "wsgi.input": io.BytesIO()})
    status = []

    def start_response(s, headers, exc_info=None):
        status.append(s)

    body = b"".join(app(environ, start_response))
    return status[0], json.loads(body)


def test_wsgi_app_lists_the_study_and_its_confirmation(storage_url):
    status, data = _get(dashboard_app(storage_url), "/api/studies")
    assert status.startswith("200")
    names = {s["study_name"] for s in data["study_summaries"]}
    assert names == {"dash", "dash/confirm"}
    study = next(s for s in data["study_summaries"] if s["study_name"] == "dash")
    assert study["directions"] == ["minimize", "maximize"]
    status, detail = _get(dashboard_app(storage_url), f"/api/studies/{study['study_id']}")
    assert status.startswith("200") and len(detail["trials"]) == 11


def test_missing_storage_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError):
        dashboard_app(f"sqlite:///{tmp_path / 'none.db'}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_server_answers_on_localhost(storage_url):
    port = _free_port()
    threading.Thread(target=serve_dashboard, args=(storage_url,),
                     kwargs={"host": "127.0.0.1", "port": port}, daemon=True).start()
    url = dashboard_url("127.0.0.1", port).replace("/dashboard", "/api/studies")
    for _ in range(100):
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                data = json.load(r)
            break
        except OSError:
            time.sleep(0.05)
    else:
        pytest.fail("the dashboard did not answer")
    assert "dash" in {s["study_name"] for s in data["study_summaries"]}
