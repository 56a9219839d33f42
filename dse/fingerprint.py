"""What a stored study was run with: a digest of each resolved part, and the files its base reads.

A study in the storage keeps `study_digest(study)` as a user attribute; resuming it with another
base, space, objectives, constraints, fidelity or prices would put trials measured under two
setups into one Pareto set, so the driver compares the digests part by part first.

The digest is of what the study file says once its `base` and `space` files are read: the
study file's own location does not count (relative paths stay as written, and the folder they
resolve against is left out), but every file the study names (a trace, an HF config, a profile,
in the base, a categorical choice or a fidelity override) counts by its content, so editing a
trace is a change and moving the study together with its data is not.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simcore.loading import file_sha256

if TYPE_CHECKING:
    from dse.study import StudyConfig

PARTS = ("base", "space", "objectives", "constraints", "fidelity", "cost")
"""The parts of a study whose change makes its stored trials incomparable with new ones."""
DIGEST_ATTR = "study_digest"
"""Study user attribute: `study_digest` of the study file it was run with."""


def _strings(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, Mapping):
        for v in node.values():
            yield from _strings(v)
    elif isinstance(node, (list, tuple)):
        for v in node:
            yield from _strings(v)


def _as_file(text: str, base_dir: Path) -> Path | None:
    if not text or "\n" in text or len(text) > 4096:
        return None
    try:
        path = Path(text) if Path(text).is_absolute() else base_dir / text
        return path.resolve() if path.is_file() else None
    except (OSError, ValueError):
        return None


def referenced_files(node: Any, base_dir: Path) -> dict[str, Path]:
    """Every string in `node` (a config mapping, or a list of parameter choices) that names an
    existing file, relative to `base_dir` or absolute: {string as written: resolved path}."""
    out = {}
    for text in _strings(node):
        path = _as_file(text, base_dir)
        if path is not None:
            out[text] = path
    return out


def _with_file_contents(node: Any, files: Mapping[str, Path]) -> Any:
    if isinstance(node, str) and node in files:
        return {"file_sha256": file_sha256(files[node])}
    if isinstance(node, Mapping):
        return {k: _with_file_contents(v, files) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return [_with_file_contents(v, files) for v in node]
    return node


def _sha256_json(data: Any) -> str:
    text = json.dumps(data, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def study_digest(study: StudyConfig) -> dict[str, str]:
    """{part: sha256} for each of `PARTS` of the resolved study (see the module docstring)."""
    base_dir = Path(study.base.get("base_dir", study.base_dir))

    def by_content(node: Any) -> Any:
        return _with_file_contents(node, referenced_files(node, base_dir))

    parts = {
        "base": by_content({k: v for k, v in study.base.items() if k != "base_dir"}),
        "space": by_content(study.space.model_dump(mode="json")),
        "objectives": [f"{o.metric} {o.direction}" for o in study.objectives],
        "constraints": [str(c) for c in study.constraints],
        "fidelity": by_content({"screen": study.fidelity.screen,
                                "confirm": study.fidelity.confirm}),
        # Prices per GPU type only when set: a study stored before they existed resumes.
        "cost": study.cost.model_dump(
            mode="json", exclude={"usd_per_gpu_hour_by_gpu"}
            if not study.cost.usd_per_gpu_hour_by_gpu else None),
    }
    return {name: _sha256_json(parts[name]) for name in PARTS}


def changed_parts(stored: Mapping[str, str], now: Mapping[str, str]) -> list[str]:
    """The parts whose digest differs (a part missing from `stored` counts as unchanged: the
    study was stored before that part was digested)."""
    return [p for p in PARTS if p in stored and stored[p] != now.get(p)]


def changed_words(changed: list[str]) -> str:
    """The changed parts in words: "base", "base and space", "base, space and cost"."""
    return " and ".join(", ".join(changed).rsplit(", ", 1))
