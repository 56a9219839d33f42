"""The repository needs nothing beside it: no tracked file points outside the clone."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUTSIDE = re.compile(r"\.\./shared|/work/shared|/ \"shared\"|REFERENCE\.md")


def test_no_tracked_file_reads_or_cites_a_folder_beside_the_repository():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    hits = []
    for name in files:
        if not name.endswith((".py", ".yaml", ".yml", ".toml", ".md", ".sh", ".cfg")) \
                or name == "tests/test_self_contained.py":
            continue
        for n, line in enumerate((ROOT / name).read_text(encoding="utf-8").splitlines(), 1):
            if OUTSIDE.search(line):
                hits.append(f"{name}:{n}: {line.strip()}")
    assert not hits, "\n".join(hits)


def test_the_ci_runs_the_readmes_two_commands():
    import importlib.util

    spec = importlib.util.spec_from_file_location("readme_commands",
                                                  ROOT / ".ci" / "readme_commands.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    commands = mod.readme_commands((ROOT / "README.md").read_text(encoding="utf-8"))
    assert len(commands) == 2
    assert "pip install" in commands[0] and "dse search" in commands[0]
    assert "pytest" in commands[1]
