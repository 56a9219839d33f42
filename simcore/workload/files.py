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


def resolve(path: str, base_dir: Path) -> Path:
    """The dataset file `path`, relative to `base_dir` unless absolute; it must exist."""
    resolved = Path(path).expanduser()
    if not resolved.is_absolute():
        resolved = Path(base_dir) / resolved
    if not resolved.is_file():
        raise ConfigError(f"{resolved}: no such file (workload.dataset.path: {path!r})")
    return resolved


def iter_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line of a JSON-lines file."""
    try:
        with path.open(encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ConfigError(f"{path}: line {lineno}: invalid JSON ({e.msg})") from None
                if not isinstance(obj, dict):
                    raise ConfigError(f"{path}: line {lineno}: expected a JSON object")
                yield lineno, obj
    except UnicodeDecodeError:
        raise not_utf8(path) from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read ({e.strerror})") from None


def read_json(path: Path) -> Any:
    """The parsed content of a JSON file."""
    try:
        return json.loads(read_text(path))
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: line {e.lineno}: invalid JSON ({e.msg})") from None


def iter_csv(path: Path, required: Sequence[str]) -> Iterator[tuple[int, dict[str, str]]]:
    """(line number, row) for each row of a CSV file with a header naming at least `required`."""
    try:
        with path.open(encoding="utf-8", newline="") as f:
            reader = csv.DictReader(f, skipinitialspace=True)
            header = reader.fieldnames
            if not header:
                raise ConfigError(f"{path}: empty file, expected a header with {', '.join(required)}")
            missing = [c for c in required if c not in header]
            if missing:
                raise ConfigError(f"{path}: line 1: missing column(s) {', '.join(missing)} "
                                  f"(the header has {', '.join(map(str, header))})")
            for row in reader:
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
    """A whole number >= minimum, from an int, an integral float or a decimal string."""
    number = as_whole(value, where, key)
    if number < minimum:
        raise ConfigError(f"{where}: {key} must be at least {minimum}, got {value!r}")
    return number


def as_whole(value: Any, where: str, key: str) -> int:
    """A whole number of any sign, from an int, an integral float or a decimal string."""
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
        raise ConfigError(f"{where}: {key} must be a whole number, got {value!r}")
    return number


def as_seconds(value: Any, where: str, key: str, units_per_s: float = 1.0) -> float:
    """A finite, non-negative time in units of 1/units_per_s seconds (1000: milliseconds), in seconds."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(f"{where}: {key} must be a number, got {value!r}")
    try:
        number = float(value)
    except ValueError:
        raise ConfigError(f"{where}: {key} must be a number, got {value!r}") from None
    if not math.isfinite(number) or number < 0:
        raise ConfigError(f"{where}: {key} must be a finite, non-negative number, got {value!r}")
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
