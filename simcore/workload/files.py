"""Reading user data files (JSON, JSONL, CSV) so that every error names the file and the line."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from simcore.errors import ConfigError
from simcore.loading import not_utf8, read_text

MAX_WHOLE = 2**31 - 1
"""The largest whole number a data file may give (a token count, a priority): more than any
model's context, and within the engine's 64-bit arrays whatever sums it enters."""
MAX_SECONDS = 1e9
"""The latest time a data file may give, seconds (about 32 years)."""


class _RepeatedKey(ValueError):
    """A JSON object that gives one key twice (`_unique_object`)."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object from its pairs, refusing one that gives a key twice (which json would read
    as its last value)."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _RepeatedKey(key)
            seen.add(key)
    return obj


def _loads(text: str) -> Any:
    return json.loads(text, object_pairs_hook=_unique_object)


def short(value: Any) -> str:
    """`value` for a message: a number too long to read in scientific notation."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) >= 1e15:
        return f"{float(value):.3g}"
    if isinstance(value, str) and len(value) > 40:
        return repr(value[:37] + "...")
    return repr(value)


def resolve(path: str, base_dir: Path) -> Path:
    """The dataset file `path`, relative to `base_dir` unless absolute; it must exist."""
    resolved = Path(path).expanduser()
    if not resolved.is_absolute():
        resolved = Path(base_dir) / resolved
    if resolved.is_dir():
        raise ConfigError(f"{resolved}: is a folder, not a file (workload.dataset.path: "
                          f"{path!r})")
    if not resolved.is_file():
        raise ConfigError(f"{resolved}: no such file (workload.dataset.path: {path!r})")
    return resolved


def iter_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line of a JSON-lines file (a byte-order mark
    at its start passed over); an object that gives a key twice is refused."""
    try:
        with path.open(encoding="utf-8-sig") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    obj = _loads(line)
                except json.JSONDecodeError as e:
                    raise ConfigError(f"{path}: line {lineno}: invalid JSON ({e.msg})") from None
                except _RepeatedKey as e:
                    raise ConfigError(f"{path}: line {lineno}: the key {e.key!r} is given twice "
                                      f"in one object") from None
                if not isinstance(obj, dict):
                    raise ConfigError(f"{path}: line {lineno}: expected a JSON object")
                yield lineno, obj
    except UnicodeDecodeError:
        raise not_utf8(path) from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read ({e.strerror})") from None


def read_json(path: Path) -> Any:
    """The parsed content of a JSON file (a byte-order mark at its start passed over); an object
    that gives a key twice is refused."""
    try:
        return _loads(read_text(path).removeprefix("\ufeff"))
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: line {e.lineno}: invalid JSON ({e.msg})") from None
    except _RepeatedKey as e:
        raise ConfigError(f"{path}: the key {e.key!r} is given twice in one object") from None


def iter_csv(path: Path, required: Sequence[str]) -> Iterator[tuple[int, dict[str, str]]]:
    """(line number, row) for each row of a CSV file with a header naming at least `required`,
    each column once (a byte-order mark at its start passed over); a row with more fields than
    the header is refused."""
    try:
        with path.open(encoding="utf-8-sig", newline="") as f:
            reader = csv.DictReader(f, skipinitialspace=True)
            header = reader.fieldnames
            if not header:
                raise ConfigError(f"{path}: empty file, expected a header with {', '.join(required)}")
            twice = sorted({c for c in header if header.count(c) > 1})
            if twice:
                raise ConfigError(f"{path}: line 1: the header names {', '.join(twice)} more "
                                  f"than once")
            missing = [c for c in required if c not in header]
            if missing:
                raise ConfigError(f"{path}: line 1: missing column(s) {', '.join(missing)} "
                                  f"(the header has {', '.join(map(str, header))})")
            for row in reader:
                extra = row.get(None)   # DictReader's key for fields past the header's
                if extra:
                    raise ConfigError(f"{path}: line {reader.line_num}: "
                                      f"{len(header) + len(extra)} fields, the header has "
                                      f"{len(header)}")
                yield reader.line_num, row
    except csv.Error as e:
        raise ConfigError(f"{path}: invalid CSV ({e})") from None
    except UnicodeDecodeError:
        raise not_utf8(path) from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read ({e.strerror})") from None


def field(obj: Mapping[str, Any], key: str, where: str) -> Any:
    """obj[key], or a ConfigError saying that `where` lacks it."""
    value = obj.get(key)
    if value is None:
        raise ConfigError(f"{where}: missing {key!r}")
    return value


def count_field(obj: Mapping[str, Any], key: str, where: str, minimum: int = 0) -> int:
    """obj[key] as a whole number >= minimum (see as_count), or a ConfigError naming `where`."""
    return as_count(field(obj, key, where), where, key, minimum)


def as_count(value: Any, where: str, key: str, minimum: int = 0) -> int:
    """A whole number >= minimum (and at most `MAX_WHOLE`), from an int, an integral float or a
    decimal string."""
    number = as_whole(value, where, key)
    if number < minimum:
        raise ConfigError(f"{where}: {key} must be at least {minimum}, got {short(value)}")
    return number


def as_whole(value: Any, where: str, key: str, limit: int = MAX_WHOLE) -> int:
    """A whole number of any sign, at most `limit` in size, from an int, an integral float or a
    decimal string."""
    number: int | None = None
    if isinstance(value, bool):
        number = None
    elif isinstance(value, int):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, str):
        try:
            number = int(value.strip())
        except ValueError:
            try:
                as_float = float(value)
            except ValueError:
                as_float = math.nan
            number = int(as_float) if as_float.is_integer() else None
    if number is None:
        raise ConfigError(f"{where}: {key} must be a whole number, got {short(value)}")
    if abs(number) > limit:
        bound = f"at most {limit:,}" if number > 0 else f"at least {-limit:,}"
        raise ConfigError(f"{where}: {key} must be {bound}, got {short(value)}")
    return number


def as_seconds(value: Any, where: str, key: str, units_per_s: float = 1.0) -> float:
    """A finite, non-negative time in units of 1/units_per_s seconds (1000: milliseconds), in
    seconds, at most `MAX_SECONDS`."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(f"{where}: {key} must be a number, got {short(value)}")
    try:
        number = float(value)
    except ValueError:
        raise ConfigError(f"{where}: {key} must be a number, got {short(value)}") from None
    if not math.isfinite(number) or number < 0:
        raise ConfigError(f"{where}: {key} must be a finite, non-negative number, got "
                          f"{short(value)}")
    if number / units_per_s > MAX_SECONDS:
        raise ConfigError(f"{where}: {key} must be at most {MAX_SECONDS * units_per_s:g} "
                          f"({MAX_SECONDS:g} s), got {short(value)}")
    return number / units_per_s


def as_id_list(value: Any, where: str, key: str, maximum: int) -> list[int]:
    """A list of whole numbers in [0, maximum]."""
    if not isinstance(value, list):
        raise ConfigError(f"{where}: {key} must be a list of whole numbers")
    if set(map(type, value)) <= {int}:
        ids = value
        if ids and min(ids) < 0:
            raise ConfigError(f"{where}: {key} values must be at least 0, got {min(ids)}")
    else:
        ids = [as_count(v, where, key, 0) for v in value]
    if ids and max(ids) > maximum:
        raise ConfigError(f"{where}: {key} values must be at most {maximum}, got {max(ids)}")
    return ids
