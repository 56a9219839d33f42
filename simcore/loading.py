"""Reading the user's text files: UTF-8 decoded with the first bad byte named, YAML parsed with
duplicate keys refused, JSON parsed; every failure is one ConfigError naming the file.

Every YAML file the project reads (simulate configs, studies, search spaces, fabric scenarios,
the GPU catalog) goes through `load_yaml` or `parse_yaml`; JSON inputs through `load_json`, and
streamed readers report a decoding error through `not_utf8`. `file_sha256` is the digest by which
calibration profiles and stored studies record the files they were made from.
"""

from __future__ import annotations

import codecs
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import yaml

from simcore.errors import ConfigError

_CHUNK_BYTES = 1 << 20


def read_text(path: str | Path) -> str:
    """The whole file decoded as UTF-8 (a leading byte-order mark dropped)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a folder, not a file") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot be read ({e.strerror})") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise _utf8_error(path, e.start, data.count(b"\n", 0, e.start) + 1) from None


def not_utf8(path: str | Path, opener: Callable[..., IO[bytes]] = open) -> ConfigError:
    """The error for a file a streamed reader failed to decode: it names the offset and the
    line of the first byte that is not UTF-8 (`opener` opens the file for binary reading, e.g.
    gzip.open; offsets count its decompressed bytes)."""
    path = Path(path)
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset, line = 0, 1
    try:
        with opener(path, "rb") as f:
            while True:
                chunk = f.read(_CHUNK_BYTES)
                pending = len(decoder.getstate()[0])
                try:
                    decoder.decode(chunk, final=not chunk)
                except UnicodeDecodeError as e:
                    start = offset - pending + e.start
                    line += chunk.count(b"\n", 0, max(e.start - pending, 0))
                    return _utf8_error(path, start, line)
                if not chunk:
                    break
                offset += len(chunk)
                line += chunk.count(b"\n")
    except OSError as e:
        return ConfigError(f"{path}: cannot be read ({e.strerror or e})")
    return ConfigError(f"{path}: not UTF-8 text")


def _utf8_error(path: Path, offset: int, line: int) -> ConfigError:
    return ConfigError(f"{path}: not UTF-8 text (byte {offset}, on line {line}); save it as "
                       f"UTF-8")


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader, except that a mapping giving the same key twice is refused (PyYAML
    keeps the last value silently). Keys brought in by a merge (`<<: *anchor`) may still be
    overridden, as YAML's merge-key rule intends."""

    source = "YAML"

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        if isinstance(node, yaml.MappingNode):
            first_line: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    first = first_line.get(key)
                except TypeError:       # an unhashable key: SafeLoader reports it
                    continue
                if first is not None:
                    raise ConfigError(f"{self.source}: line {line}: key {key!r} is given twice "
                                      f"in the same mapping (first on line {first}); keep one")
                first_line[key] = line
        return super().construct_mapping(node, deep=deep)


def parse_yaml(text: str, source: str) -> Any:
    """Parse YAML text read from `source` (named in errors), refusing duplicate keys."""
    loader = _UniqueKeyLoader(text)
    loader.source = source
    try:
        return loader.get_single_data()
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError(f"{source}:{where} is not valid YAML ({problem})") from None
    finally:
        loader.dispose()


def load_yaml(path: str | Path) -> Any:
    """Read a YAML file: UTF-8, no duplicate keys; a syntax error names the file and line."""
    return parse_yaml(read_text(path), str(path))


def load_json(path: str | Path) -> Any:
    """Read a JSON file: UTF-8; a syntax error names the file and line."""
    try:
        return json.loads(read_text(path))
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON (line {e.lineno}: {e.msg})") from None


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of a file's bytes, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK_BYTES), b""):
            h.update(chunk)
    return h.hexdigest()
