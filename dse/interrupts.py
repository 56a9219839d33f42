"""Ctrl-C and SIGTERM during a search: both stop it as KeyboardInterrupt, but never in the middle
of a write to the study's storage.

An interrupt raised inside a storage call (an SQLite commit, say) leaves the connection half
done, and the clean-up that follows (marking the running trials interrupted) then fails with the
storage's own error and a traceback. So while a search runs (`search_signals()`), SIGINT and
SIGTERM go to one handler: outside a `storage_writes()` block it raises KeyboardInterrupt at
once, as Python's default SIGINT handler does (a wait on Ray stops at once); inside one it is
held back and raised as the outermost block ends, after the write completed.

Signal handlers belong to the process, so this state is the process's too: one module-level
`_State`, changed only from the main thread.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _State:
    """How deep in storage writes the main thread is, and whether an interrupt waits."""

    depth = 0
    pending = False


def _handle(signum: int, frame: object) -> None:
    if _State.depth:
        _State.pending = True
    else:
        raise KeyboardInterrupt


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def search_signals() -> Iterator[None]:
    """SIGINT and SIGTERM raise KeyboardInterrupt, held back during `storage_writes()`, until the
    block ends (the previous handlers are then restored). Off the main thread, where signals
    cannot be handled, nothing changes."""
    if not _main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in _SIGNALS}
    for s in _SIGNALS:
        signal.signal(s, _handle)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _State.pending = False


@contextmanager
def storage_writes() -> Iterator[None]:
    """A block of storage writes that an interrupt must not cut; one that came meanwhile is
    raised when the outermost block ends."""
    if not _main_thread():
        yield
        return
    _State.depth += 1
    try:
        yield
    finally:
        _State.depth -= 1
    if _State.depth == 0 and _State.pending:
        _State.pending = False
        raise KeyboardInterrupt
