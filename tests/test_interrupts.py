"""Ctrl-C and SIGTERM during a search stop it, but never in the middle of a storage write."""

import os
import signal
from pathlib import Path

import optuna
import pytest

from dse.backends import open_storage
from dse.interrupts import search_signals, storage_writes
from dse.runner import run_search
from dse.study import load_study

TINY = Path(__file__).parent / "data" / "studies" / "tiny.yaml"


def _tiny(tmp_path):
    return load_study(TINY).model_copy(update={"storage": f"sqlite:///{tmp_path / 's.db'}"})


def _stopped_search_trials(study, monkeypatch) -> list:
    """Run the search until the signal a patched Optuna method sends stops it; its trials."""
    with pytest.raises(KeyboardInterrupt):
        run_search(study, progress=False)
    monkeypatch.undo()
    return optuna.load_study(study_name=study.name, storage=open_storage(study.storage_url)).trials


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_storage_writes_is_raised_when_they_end(sig):
    reached = []
    with search_signals():
        with pytest.raises(KeyboardInterrupt):
            with storage_writes():
                with storage_writes():
                    os.kill(os.getpid(), sig)
                    reached.append("inner")
                reached.append("outer")          # the inner block's end does not raise
    assert reached == ["inner", "outer"]


def test_a_signal_outside_storage_writes_is_raised_at_once():
    with search_signals():
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            pytest.fail("the interrupt was held back")


def test_the_previous_handlers_come_back_and_nothing_stays_pending():
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with search_signals():
        assert signal.getsignal(signal.SIGTERM) is not before[0]
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    with storage_writes():
        pass                                      # no interrupt left over to raise


@pytest.mark.slow
def test_a_signal_that_comes_while_a_trial_is_told_lets_the_tell_finish(ray_address, tmp_path,
                                                                        monkeypatch):
    """SIGTERM sent from inside Study.tell, as if it came during the storage commit: the tell
    completes, the search stops with KeyboardInterrupt, and the storage holds the trial."""
    study = _tiny(tmp_path)
    real_tell = optuna.Study.tell
    told = []

    def tell_under_a_signal(self, trial, *args, **kwargs):
        if not told:
            os.kill(os.getpid(), signal.SIGTERM)
        told.append(trial)
        return real_tell(self, trial, *args, **kwargs)

    monkeypatch.setattr(optuna.Study, "tell", tell_under_a_signal)
    trials = _stopped_search_trials(study, monkeypatch)
    first = told[0]
    number = first if isinstance(first, int) else first.number
    assert trials[number].state == optuna.trial.TrialState.COMPLETE
    assert not [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]


@pytest.mark.slow
def test_a_signal_that_comes_while_a_trial_is_asked_leaves_no_trial_running(
        ray_address, tmp_path, monkeypatch):
    """SIGTERM sent from inside Study.ask (the third ask): the interrupt is raised once the ask
    is written, before the driver holds the trial in flight; the trial is still marked
    interrupted, not left RUNNING."""
    study = _tiny(tmp_path)
    real_ask = optuna.Study.ask
    asked = []

    def ask_under_a_signal(self, *args, **kwargs):
        trial = real_ask(self, *args, **kwargs)
        asked.append(trial.number)
        if len(asked) == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return trial

    monkeypatch.setattr(optuna.Study, "ask", ask_under_a_signal)
    trials = _stopped_search_trials(study, monkeypatch)
    assert not [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    signalled = trials[asked[2]]
    assert signalled.state == optuna.trial.TrialState.FAIL
    assert signalled.user_attrs["failure_reason"] == "interrupted"
