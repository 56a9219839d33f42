"""Whether an output can be written, checked before a long run rather than after it: a result or
trace file, a study's storage file, a report folder. Nothing is left behind by the check."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_problem(path: Path, *, folder: bool) -> str | None:
    """Why `path` (a file, or a folder when `folder`) cannot be created or written, or None.

    Nothing is left behind: an existing file is opened for appending and closed, and a probe
    file is created and removed in the nearest folder that exists.
    """
    path = Path(os.path.abspath(path))
    try:
        if path.exists():
            if folder != path.is_dir():
                return f"it is {'a file' if folder else 'a folder'}"
            if not folder:
                with open(path, "ab"):
                    pass
            parent = path if folder else path.parent
        else:
            parent = path.parent
            while not parent.exists():
                parent = parent.parent
            if not parent.is_dir():
                return f"{parent} is a file, not a folder"
    except OSError as err:
        return f"{err.filename or path} cannot be written ({err.strerror or err})"
    try:
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as err:
        return f"no file can be created in {parent} ({err.strerror or err})"
    return None
