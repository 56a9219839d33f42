"""The watchdog that stops what a search's local Ray started once the driver is gone."""

import subprocess
import sys
import time

from dse.reaper import Reaper, children_of, descendants, process_table

# A parent that starts a child which ignores SIGTERM (so only SIGKILL ends it), then sleeps.
TREE = ("import signal, subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import signal, time; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'])\n"
        "time.sleep(600)\n")


def _tree() -> tuple[subprocess.Popen, set[int]]:
    parent = subprocess.Popen([sys.executable, "-c", TREE])
    deadline = time.monotonic() + 20
    while not children_of(parent.pid):
        assert time.monotonic() < deadline, "the child did not start"
        time.sleep(0.05)
    return parent, descendants(process_table(), {parent.pid})


def _wait_gone(pids: set[int], timeout_s: float) -> set[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = descendants(process_table(), pids) & pids
        if not left:
            return set()
        time.sleep(0.1)
    return left


def test_the_followed_processes_and_their_descendants_are_stopped_once_the_pipe_closes():
    parent, tree = _tree()
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    reaper = Reaper.start({parent.pid}, grace_s=0.2)
    try:
        assert reaper is not None and len(tree) == 2
        time.sleep(1.0)                       # the watchdog has seen the whole tree
        assert _wait_gone(tree, 0.3) == tree, "stopped before the pipe closed"
        reaper.close()
        assert _wait_gone(tree, 10) == set(), "the tree was left running"
        assert reaper.proc.wait(timeout=10) == 0
        assert bystander.poll() is None, "a process outside the tree was stopped"
    finally:
        for p in (parent, bystander):
            p.kill()
            p.wait()
        reaper.close()


def test_processes_that_end_by_themselves_get_no_signal():
    quick = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    reaper = Reaper.start({quick.pid}, grace_s=5.0)
    try:
        time.sleep(0.8)
        assert quick.wait(timeout=5) == 0       # ended on its own, not by a signal
        reaper.close()
        assert reaper.proc.wait(timeout=10) == 0
    finally:
        reaper.close()


def test_nothing_to_follow_starts_no_watchdog():
    assert Reaper.start(set()) is None
