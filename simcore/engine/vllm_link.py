"""The live link to an installed vLLM: run vLLM's own V1 scheduler on a conformance scenario
and read back its decisions, step by step, to compare them with the simulator's
(`dse conformance SCENARIO --record-with-installed-vllm`).

vLLM runs in its own interpreter (`python`, default this one), which executes the standalone
recorder `vllm_recorder.py` shipped beside this module: it needs vLLM and torch (a CPU build
suffices; `scripts/vllm_conformance/setup.sh DIR [VERSION]` builds such an environment from the
package registry) and nothing of this project, so the simulator's environment need not hold
vLLM's dependencies. `vllm_path` is put first on that interpreter's PYTHONPATH (setup.sh's
unpacked `DIR/src`).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from simcore.errors import ConfigError

RECORDER = Path(__file__).with_name("vllm_recorder.py")
"""The recorder script the vLLM interpreter runs (it prints "vllm VERSION" first)."""

SETUP_HINT = ("build a CPU-only vLLM environment with scripts/vllm_conformance/setup.sh DIR "
              "[VERSION] and pass --vllm-python DIR/venv/bin/python --vllm-path DIR/src")


def vllm_environ(vllm_path: str | Path | None) -> dict[str, str]:
    """This process's environment with `vllm_path` (if any) first on PYTHONPATH."""
    env = dict(os.environ)
    if vllm_path is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(vllm_path), env.get("PYTHONPATH", "")) if p)
    return env


def missing_module(last_line: str) -> str | None:
    """'vllm' or 'torch' when the recorder's last words say the interpreter lacks it."""
    m = re.fullmatch(r"ModuleNotFoundError: No module named '(vllm|torch)'", last_line.strip())
    return m.group(1) if m else None


def announced_version(first_line: str) -> str | None:
    """The vLLM version of the recorder's first line ("vllm VERSION"), None if it is not one."""
    m = re.fullmatch(r"vllm (\S+)", first_line.strip())
    return m.group(1) if m else None


def record_with_vllm(scenario: str | Path, out: str | Path, *, python: str | Path | None = None,
                     vllm_path: str | Path | None = None, timeout_s: float | None = None) -> str:
    """Run vLLM's scheduler on `scenario` (a scenario file the simulator has accepted) and
    write its step log to `out`; return the vLLM version that ran. ConfigError, with the
    interpreter's last words, when vLLM cannot be imported or the recorder fails."""
    interpreter = str(python or sys.executable)
    if vllm_path is not None and not Path(vllm_path).is_dir():
        raise ConfigError(f"--vllm-path {vllm_path}: no such directory ({SETUP_HINT})")
    env = vllm_environ(vllm_path)
    cmd = [interpreter, str(RECORDER), str(scenario), str(out)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s,
                              check=False)
    except FileNotFoundError:
        raise ConfigError(f"--vllm-python {interpreter}: no such interpreter "
                          f"({SETUP_HINT})") from None
    except subprocess.TimeoutExpired:
        raise ConfigError(f"vLLM's scheduler did not finish {scenario} within {timeout_s:g} s"
                          ) from None
    last = (proc.stderr.strip().splitlines() or [""])[-1]
    if proc.returncode != 0:
        missing = missing_module(last)
        if missing:
            raise ConfigError(f"{interpreter} cannot import {missing}: vLLM is not "
                              f"installed there; {SETUP_HINT}")
        raise ConfigError(f"vLLM's scheduler failed on {scenario} (exit {proc.returncode}): "
                          f"{last or 'no message'}")
    first = (proc.stdout.strip().splitlines() or [""])[0]
    version = announced_version(first)
    if version is None:
        raise ConfigError(f"{interpreter} ran the recorder but did not say which vLLM it ran "
                          f"(first line {first!r})")
    return version
