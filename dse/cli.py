"""The `dse` command line: each command parses, calls one library function, and prints.

Heavy libraries (Ray, Optuna, plotting) are imported inside the commands that need them, so
`dse simulate` starts fast.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from simcore.errors import ConfigError


def _fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(2)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="llm-serving-dse")
def main() -> None:
    """Plan LLM-serving deployments: simulate a configuration, or search a space of them."""


@main.command()
@click.argument("config", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the full result as JSON here.")
@click.option("--seed", type=int, default=None, help="Override the config's seed.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def simulate(config: Path, out: Path | None, seed: int | None, quiet: bool) -> None:
    """Simulate CONFIG (YAML) and print vllm-bench-serve-style metrics."""
    from simcore.config import load_config
    from simcore.simulate import simulate as run
    from dse.summary import render_summary

    try:
        cfg = load_config(config)
        if seed is not None:
            cfg = cfg.model_copy(update={"seed": seed})
        bar = None
        progress = None
        if not quiet and sys.stderr.isatty():
            from tqdm import tqdm

            bar = tqdm(total=None, unit="req", desc="simulating", leave=False)

            def progress(now_s: float, done: int, total: int) -> None:
                if bar.total is None:
                    bar.total = total
                bar.n = done
                if done == total or done % 50 == 0:
                    bar.set_postfix_str(f"t={now_s:.1f}s", refresh=False)
                    bar.refresh()
        try:
            result = run(cfg, progress=progress)
        finally:
            if bar is not None:
                bar.close()
    except ConfigError as e:
        msg = str(e)
        _fail(msg if msg.startswith(str(config)) else f"{config}: {msg}")
        return
    click.echo(render_summary(result))
    if out is not None:
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(result, indent=1))
        except OSError as e:
            _fail(f"{out}: cannot write the result ({e.strerror})")
        click.echo(f"result written to {out}")


@main.command()
@click.argument("scenario", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Write the steps here, one JSON object a line (the golden format).")
@click.option("--golden", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Compare the steps with this recorded log and report the first difference.")
def conformance(scenario: Path, out: Path, golden: Path | None) -> None:
    """Replay a scheduler SCENARIO (JSON) step by step through the vLLM-faithful scheduler."""
    from simcore.engine.conformance import compare, load_scenario, read_steps, replay

    try:
        sc = load_scenario(scenario)
        steps = []
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "w") as f:
            for rec in replay(sc):
                f.write(json.dumps(rec) + "\n")
                steps.append(rec)
        click.echo(f"{len(steps)} steps written to {out}")
        if golden is not None:
            try:
                ref = read_steps(golden)
            except (OSError, ValueError) as e:
                raise ConfigError(f"{golden}: cannot be read as a step log ({e})") from None
            diff = compare(steps, ref)
            if diff is None:
                click.echo(f"identical to {golden}: all {len(ref)} steps match")
            else:
                click.echo(f"differs from {golden}: {diff}")
                sys.exit(1)
    except ConfigError as e:
        _fail(str(e))
    except OSError as e:
        _fail(f"{out}: cannot write ({e.strerror})")


if __name__ == "__main__":
    main()
