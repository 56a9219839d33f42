"""`dse launch`: the `vllm serve` commands (and Ray, proxy and NIC settings) that start a
configuration on real hardware."""

from __future__ import annotations

from pathlib import Path

import click

from dse.cli_common import _check_writable, _fail, _fail_in, _write_json
from simcore.errors import ConfigError


@click.command()
@click.argument("config", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the plan here: markdown when the name ends in .md, JSON when it "
                   "ends in .json.")
def launch(config: Path, out: Path | None) -> None:
    """Print how to start CONFIG with vLLM: the exact `vllm serve` command of every node (with
    the batch limits and dtypes the simulation resolved), the Ray or data-parallel per-node
    commands of a multi-node deployment, the prefill/decode commands and proxy of a
    disaggregated one, the network settings of its cluster section, and warnings for settings
    stock vLLM does not have."""
    from dse.launch import launch_plan
    from simcore.config import load_config

    suffix = out.suffix.lower() if out is not None else ""
    if out is not None and suffix not in (".md", ".json"):
        _fail(f"{out}: --out must end in .md (markdown) or .json (JSON)")
    try:
        plan = launch_plan(load_config(config))
    except ConfigError as e:
        _fail_in(config, e)
        return
    _check_writable(out, "launch plan")
    text = plan.render()
    click.echo(text)
    if out is None:
        return
    if suffix == ".json":
        _write_json(out, plan.as_dict(), "launch plan")
        return
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n", encoding="utf-8")
    except OSError as e:
        _fail(f"{out}: cannot write the launch plan ({e.strerror})")
    click.echo(f"launch plan written to {out}")
