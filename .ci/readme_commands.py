"""Print the set-up commands the README opens with: the command lines (not comments) of its first
```bash block, one a line. CI runs exactly these, so the README's commands stay true."""

import sys
from pathlib import Path


def readme_commands(text: str) -> list[str]:
    lines = text.splitlines()
    try:
        start = lines.index("```bash") + 1
        end = lines.index("```", start)
    except ValueError:
        raise SystemExit("README.md: no ```bash block with the set-up commands") from None
    return [ln.strip() for ln in lines[start:end] if ln.strip() and not ln.lstrip().startswith("#")]


if __name__ == "__main__":
    commands = readme_commands(Path(sys.argv[1]).read_text(encoding="utf-8"))
    if len(commands) != 2:
        raise SystemExit(f"README.md: expected two set-up commands, found {len(commands)}")
    print("\n".join(commands))
