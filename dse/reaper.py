"""A watchdog that stops the Ray processes a search started on this machine once the search's
driver is gone, however it ended.

A driver that exits normally, or on Ctrl-C or SIGTERM, shuts Ray down itself. One killed by
SIGKILL (or the out-of-memory killer, or a crash) cannot, and Ray's agents (`ray::DashboardAgent`,
`ray::RuntimeEnvAgent`) then run on for ever. So, right after starting a local Ray, the driver
starts this watchdog in a session of its own (a Ctrl-C on the terminal does not reach it) with the
read end of a pipe as its standard input and the pids of the processes Ray started. The watchdog
follows those processes and their descendants while the driver lives; when the pipe reports end
of file (the driver closed it after shutting Ray down, or the kernel closed it as the driver
died) it gives them `GRACE_S` to end by themselves, then sends SIGTERM, then SIGKILL, and exits.
It follows only what Ray started, each process known by its pid and start time, so no other
process is touched, even one that later reuses a pid. Linux only (it reads /proc); elsewhere
nothing is started.

    python -m dse.reaper [--grace-s S] PID [PID ...]
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

GRACE_S = 5.0
"""Time the followed processes get to end by themselves after the driver is gone."""

TERM_WAIT_S = 2.0
"""Time between SIGTERM and SIGKILL."""

POLL_S = 0.5
"""How often the watchdog looks for new descendants while the driver lives."""

Process = tuple[int, str, int, str]
"""(parent pid, state letter, start time in clock ticks since boot, command line)."""


def process_table() -> dict[int, Process]:
    """Every process now running, read from /proc: {pid: (ppid, state, start time, command)}."""
    out: dict[int, Process] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()      # after "pid (name) "
        out[int(entry.name)] = (int(fields[1]), fields[0], int(fields[19]), cmd.strip())
    return out


def descendants(table: dict[int, Process], roots: set[int]) -> set[int]:
    """The pids of `roots` that are alive, and of all their living descendants."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = set(), [p for p in roots if p in table]
    while todo:
        pid = todo.pop()
        if pid in out or table[pid][1] == "Z":
            continue
        out.add(pid)
        todo.extend(children.get(pid, ()))
    return out


def children_of(pid: int) -> set[int]:
    """The living children of process `pid` (empty where /proc cannot be read)."""
    if not Path("/proc/self/stat").exists():
        return set()
    return {p for p, (ppid, state, _, _) in process_table().items()
            if ppid == pid and state != "Z"}


class Reaper:
    """The driver's side: start the watchdog for the processes `pids`, close it when done.

    `start` returns None where /proc does not exist. `close()` (after Ray is shut down) lets the
    watchdog clean up whatever is left and exit; if the driver dies first, the kernel closes the
    pipe and the same happens."""

    def __init__(self, proc: subprocess.Popen, write_fd: int) -> None:
        self.proc = proc
        self._write_fd: int | None = write_fd

    @classmethod
    def start(cls, pids: set[int], *, grace_s: float = GRACE_S) -> Reaper | None:
        if not pids or not Path("/proc/self/stat").exists():
            return None
        read_fd, write_fd = os.pipe()     # neither end is inherited by later children
        try:
            proc = subprocess.Popen([sys.executable, "-m", "dse.reaper", "--grace-s", str(grace_s),
                                     *map(str, sorted(pids))],
                                    stdin=read_fd, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, start_new_session=True)
        except OSError:
            os.close(write_fd)
            return None
        finally:
            os.close(read_fd)
        return cls(proc, write_fd)

    def close(self) -> None:
        if self._write_fd is not None:
            os.close(self._write_fd)
            self._write_fd = None


def _alive(followed: dict[int, int]) -> dict[int, int]:
    """Those of `followed` ({pid: start time}) still running as the same process."""
    table = process_table()
    return {p: t for p, t in followed.items()
            if p in table and table[p][2] == t and table[p][1] != "Z"}


def _signal_all(followed: dict[int, int], sig: int) -> None:
    for pid in _alive(followed):
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def watch(roots: set[int], stdin_fd: int = 0, grace_s: float = GRACE_S) -> None:
    """Follow `roots` and their descendants until `stdin_fd` reports end of file, then stop
    whatever of them is left."""
    followed: dict[int, int] = {}
    while True:
        table = process_table()
        for pid in descendants(table, roots | set(followed)):
            followed.setdefault(pid, table[pid][2])
        ready, _, _ = select.select([stdin_fd], [], [], POLL_S)
        if ready and not os.read(stdin_fd, 4096):
            break
    for wait_s, sig in ((grace_s, signal.SIGTERM), (TERM_WAIT_S, signal.SIGKILL)):
        deadline = time.monotonic() + wait_s
        while _alive(followed) and time.monotonic() < deadline:
            time.sleep(0.1)
        _signal_all(followed, sig)


def main(argv: list[str]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    grace_s = GRACE_S
    if argv[:1] == ["--grace-s"]:
        grace_s, argv = float(argv[1]), argv[2:]
    watch({int(a) for a in argv}, grace_s=grace_s)


if __name__ == "__main__":
    main(sys.argv[1:])
