"""What every `dse` command shares: one clear error and a non-zero exit, and safe writes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from simcore.errors import ConfigError
from simcore.request_rows import json_default_streaming


def _fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(2)


def _fail_in(path: Path, err: ConfigError) -> None:
    """Fail with the error, prefixed by the input file unless it already names it."""
    msg = str(err)
    _fail(msg if msg.startswith(str(path)) else f"{path}: {msg}")


def _write_json(out: Path, data: dict, what: str, **dump_kw) -> None:
    """Write `data` as JSON to `out` (folders created) and say so; a write error fails. The text
    is streamed to the file: a result with a row per request is never one string in memory."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "w") as f:
            json.dump(data, f, indent=1, default=json_default_streaming, **dump_kw)
    except OSError as e:
        _fail(f"{out}: cannot write the {what} ({e.strerror})")
    click.echo(f"{what} written to {out}")


def _check_writable(out: Path | None, what: str) -> None:
    """Fail now, before a long run, if `out` could not be written after it; leaves nothing
    behind (the folders are made when the file is written)."""
    from dse.outputs import write_problem

    problem = write_problem(out, folder=False) if out is not None else None
    if problem:
        _fail(f"{out}: cannot write the {what} ({problem})")
