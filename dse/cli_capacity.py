"""`dse capacity`: the highest request rate a configuration sustains within its SLOs."""

from __future__ import annotations

from pathlib import Path

import click

from dse.cli_common import _check_writable, _fail, _fail_in, _write_json
from simcore.errors import ConfigError


@click.command()
@click.argument("config", type=click.Path(path_type=Path))
@click.option("--slo", default=None, metavar="SLOS",
              help="Comma-separated upper bounds on latency statistics, e.g. "
                   "'p99_ttft_ms<=1000,p99_tpot_ms<=50' (the default).")
@click.option("--tolerance", type=click.FloatRange(0.005, 0.5), default=0.05, show_default=True,
              help="Stop when the failing rate is within this fraction of the meeting one.")
@click.option("--window", "window_s", type=click.FloatRange(10, None), default=120.0,
              show_default=True, help="Seconds of arrivals per run (steady state is judged on "
                                      "the second half).")
@click.option("--max-prompts", type=click.IntRange(100, None), default=20_000, show_default=True,
              help="Most requests per run (high rates get a shorter window).")
@click.option("--no-envelope", is_flag=True,
              help="Skip the capacity's envelope (two more searches, with every op class at "
                   "either end of its error bound).")
@click.option("--seed", type=click.IntRange(min=0), default=None,
              help="Override the config's seed.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the answer and every run as JSON here.")
@click.option("--quiet", is_flag=True, help="Do not list the runs as they finish.")
@click.option("--target-rate", type=float, default=None, metavar="RPS",
              help="Instead: the parallelism (TP x PP x DP of the config's model and GPU; "
                   "with a cluster section also prefill/decode instances of their own TP, on "
                   "at most the cluster's GPUs) that serves RPS requests/s within the SLOs on "
                   "the fewest GPUs.")
@click.option("--max-gpus", type=click.IntRange(1, 4096), default=64, show_default=True,
              help="With --target-rate: the most GPUs to consider.")
def capacity(config: Path, slo: str | None, tolerance: float, window_s: float, max_prompts: int,
             no_envelope: bool, seed: int | None, out: Path | None, quiet: bool,
             target_rate: float | None, max_gpus: int) -> None:
    """The highest request rate CONFIG's deployment sustains in steady state within the SLOs,
    for the config's workload shape, with the metric that binds first and the runs just below
    and above it; or, with --target-rate, the fewest GPUs that serve that rate."""
    from dse.capacity import find_capacity, parse_slos, render_capacity
    from simcore.config import load_config
    from simcore.footprint import available_memory_bytes, check_fits

    ctx = click.get_current_context()
    given = {name for name in ("no_envelope", "max_gpus")
             if ctx.get_parameter_source(name) != click.core.ParameterSource.DEFAULT}
    if target_rate is None and "max_gpus" in given:
        _fail("--max-gpus: only used with --target-rate")
    if target_rate is not None and "no_envelope" in given:
        _fail("--no-envelope: --target-rate measures the answer's capacity without an envelope")
    try:
        slos = parse_slos(slo)
        cfg = load_config(config)
        if seed is not None:
            cfg = cfg.model_copy(update={"seed": seed})
        _check_writable(out, "capacity")
        w = cfg.workload.model_copy(update={"num_prompts": max_prompts})
        check_fits(cfg.model_copy(update={"workload": w}), available_memory_bytes())

        def progress(run) -> None:
            if not quiet:
                verdict = "meets" if run.meets else "misses: " + "; ".join(run.violations)
                click.echo(f"  {run.rate:10,.4g} req/s  {run.num_prompts:6d} requests  "
                           f"{verdict}", err=True)

        if target_rate is not None:
            from dse.sizing import fewest_gpus, render_sizing

            def tried(o) -> None:
                if not quiet:
                    verdict = ("meets" if o.run.meets
                               else "misses: " + "; ".join(o.run.violations))
                    click.echo(f"  {o.label}: {verdict}", err=True)

            sizing = fewest_gpus(cfg, target_rate, slos, max_gpus=max_gpus, window_s=window_s,
                                 max_prompts=max_prompts, tolerance=tolerance, progress=tried,
                                 capacity_progress=progress)
            click.echo(render_sizing(sizing))
            if out is not None:
                _write_json(out, sizing.as_dict(), "sizing")
            return
        result = find_capacity(cfg, slos, tolerance=tolerance, window_s=window_s,
                               max_prompts=max_prompts, envelope=not no_envelope,
                               progress=progress)
    except ConfigError as e:
        _fail_in(config, e)
        return
    click.echo(render_capacity(result))
    if out is not None:
        _write_json(out, result.as_dict(), "capacity")
