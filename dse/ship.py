"""What the workers of a Ray cluster are sent to run trials: the code, the data and its packages.

Joining a cluster (`execution.ray_address`), trials may run on hosts that have neither this
project nor the study's trace files. With `execution.ship_to_workers` ("files" by default),
the driver passes `ray.init` a runtime environment
(https://docs.ray.io/en/latest/ray-core/handling-dependencies.html): `py_modules` uploads the
`simcore` and `dse` packages (with their package data: model and GPU catalogs, calibration
profiles), and `working_dir` a folder holding a copy of every file the base, a categorical
parameter or a fidelity override names (each under `data/<n>-<name>`, since the files may come
from several folders). With "files_and_packages", `pip` also lists the project's own
requirements, which Ray installs in a virtualenv on top of each node's Python packages (so a
node that has them downloads nothing; Ray needs `virtualenv` there). Ray keeps uploads by
content hash, so a search run again uploads nothing new.

The trials' configurations then name those copies (`Shipment.localize`), relative to the
working folder Ray gives each worker; the storage keeps the parameter values as the study
file wrote them.
"""

from __future__ import annotations

import importlib.metadata
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dse.fingerprint import referenced_files

if TYPE_CHECKING:
    from dse.study import StudyConfig

DISTRIBUTION = "llm-serving-dse"
_NOT_SHIPPED = {"ray"}   # the cluster's own Ray runs the workers
DATA_FOLDER = "data"


@dataclass(frozen=True)
class Shipment:
    """A runtime environment for Ray and how trial configurations name the shipped files.

    `files` maps each path string as written in the study to the file it names on this
    machine; `names` maps it to the copy's path inside the working folder. `stage(folder)`
    copies the files there; `localize` rewrites a configuration mapping (or parameter values)
    to name the copies.
    """

    runtime_env: dict[str, Any]
    files: dict[str, Path] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)

    def stage(self) -> None:
        """Copy the data files into the working folder (created as needed)."""
        folder = self.runtime_env.get("working_dir")
        if folder is None:
            return
        for text, path in self.files.items():
            target = Path(folder) / self.names[text]
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)

    def localize(self, node: Any) -> Any:
        """`node` with every shipped path string replaced by its copy's, and `base_dir` set to
        the worker's working folder (Ray's current directory for the task)."""
        if isinstance(node, str):
            return self.names.get(node, node)
        if isinstance(node, Mapping):
            return {k: "." if k == "base_dir" else self.localize(v) for k, v in node.items()}
        if isinstance(node, (list, tuple)):
            return [self.localize(v) for v in node]
        return node


def requirements() -> list[str]:
    """The project's install requirements (no extras), as pip specifiers, without Ray."""
    try:
        reqs = importlib.metadata.requires(DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:
        return []
    out = []
    for r in reqs:
        spec, _, marker = r.partition(";")
        if "extra" in marker:
            continue
        name = re.split(r"[\s<>=!~\[;(]", spec.strip(), maxsplit=1)[0]
        if name.lower() not in _NOT_SHIPPED:
            out.append(spec.strip().replace(" ", ""))
    return out


def _package_dir(name: str) -> str:
    module = __import__(name)
    return str(Path(module.__file__).resolve().parent)


def _choice_strings(study: StudyConfig) -> list[str]:
    return [c for p in study.space.parameters.values() for c in getattr(p, "choices", ())
            if isinstance(c, str)]


def shipment(study: StudyConfig, working_dir: Path) -> Shipment | None:
    """What to send the workers of `study`'s cluster, staged in `working_dir`; None when
    nothing is shipped (a local Ray, or `execution.ship_to_workers` off). Builds no files:
    call `Shipment.stage()` before the first trial."""
    ship = study.execution.ship_to_workers
    if study.execution.ray_address is None or ship == "none":
        return None
    base_dir = Path(study.base.get("base_dir", study.base_dir))
    files = referenced_files(study.base, base_dir)
    files.update(referenced_files(_choice_strings(study), base_dir))
    files.update(referenced_files([study.fidelity.screen, study.fidelity.confirm], base_dir))
    names = {text: f"{DATA_FOLDER}/{i}-{path.name}" for i, (text, path)
             in enumerate(sorted(files.items()))}
    env: dict[str, Any] = {"py_modules": [_package_dir("simcore"), _package_dir("dse")]}
    if files:
        env["working_dir"] = str(working_dir)
    pip = requirements() if ship == "files_and_packages" else []
    if pip:
        env["pip"] = pip
    return Shipment(runtime_env=env, files=files, names=names)
