"""`dse calibrate`: fit a calibration profile from measurements, or a kernel profile from
AIConfigurator's database, and list the shipped ones with their held-out errors; or measure
this CPU's host speed (`--host`)."""

from __future__ import annotations

from pathlib import Path

import click

from dse.cli_common import _check_writable, _fail
from simcore.errors import ConfigError


@click.command()
@click.argument("measurements", nargs=-1, type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the fitted profile (JSON) here; required when fitting.")
@click.option("--gpu", default=None, help="GPU to fit when the files cover several (measurement "
                                          "name such as h100, or catalog name).")
@click.option("--node", default=None, help="Node kind of the collective tables (default: the "
                                           "GPU's DGX tables).")
@click.option("--holdout", type=click.FloatRange(0, 1, max_open=True), default=0.2,
              show_default=True, help="Fraction of each curve's token counts / message sizes "
                                      "held out of the fit to measure its error.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="Seed of the hold-out draw.")
@click.option("--id", "profile_id", default=None, help="Profile id (default: from the GPU).")
@click.option("--list", "list_profiles", is_flag=True,
              help="List the shipped profiles and their held-out errors instead of fitting.")
@click.option("--from-aiconfigurator", "aiconfigurator", default=None, metavar="SYSTEM",
              help="Fit a kernel profile from the installed aiconfigurator-core's vLLM kernel "
                   "measurements of SYSTEM (h100_sxm, h200_sxm, b200_sxm, a100_sxm, l40s, ...), "
                   "and its SGLang measurements of vLLM's Marlin MoE kernel at the shapes "
                   "vLLM's lack.")
@click.option("--host", "host", is_flag=True,
              help="Measure this CPU's host speed (host.host_speed): the reference Python "
                   "workloads timed here against the CPU that measured vLLM's CPU costs. Run it "
                   "on a machine with the serving host's CPU.")
def calibrate(measurements: tuple[Path, ...], out: Path | None, gpu: str | None,
              node: str | None, holdout: float, seed: int, profile_id: str | None,
              list_profiles: bool, aiconfigurator: str | None, host: bool) -> None:
    """Fit a calibration profile from MEASUREMENTS (files or directories in vidur's layout), or
    a kernel profile from AIConfigurator's database (--from-aiconfigurator), write it, and print
    the error distribution on what was held out of the fit; or measure this CPU's host speed
    (--host)."""
    ctx = click.get_current_context()
    given = {name for name in ("out", "gpu", "node", "holdout", "seed", "profile_id",
                               "aiconfigurator")
             if ctx.get_parameter_source(name) != click.core.ParameterSource.DEFAULT}
    try:
        if host:
            if measurements or given or list_profiles:
                what = _options(given | ({"list"} if list_profiles else set()))
                _fail(f"calibrate: --host measures this CPU and takes nothing else (got {what})")
            from dse.host_speed import measure

            click.echo(measure().render())
            return
        if list_profiles:
            if measurements or given:
                what = _options(given)
                _fail(f"calibrate: --list lists the shipped profiles and takes nothing else "
                      f"(got {what})")
            _list_profiles()
            return
        if aiconfigurator is not None:
            if measurements:
                _fail("calibrate: give measurement files or --from-aiconfigurator, not both")
            for name, why in (("node", "its collectives come from the system's own tables"),
                              ("holdout", "its hold-out is fixed (simcore.calibration."
                                          "aiconfigurator.HOLDOUT_FRACTION)")):
                if name in given:
                    _fail(f"calibrate: --{name} has no effect with --from-aiconfigurator: {why}")
            if out is None:
                _fail("calibrate: --out is required (where to write the profile; .json.gz "
                      "writes it gzipped)")
            from dse.calibrate import render_kernel_errors, run_calibrate_aiconfigurator

            if profile_id is not None and not profile_id.strip():
                _fail("--id: must not be empty")
            _check_writable(out, "kernel profile")
            kp = run_calibrate_aiconfigurator(aiconfigurator, str(out), seed=seed, gpu=gpu,
                                              profile_id=profile_id)
            click.echo(render_kernel_errors(kp))
            click.echo(f"\nkernel profile {kp.profile_id} ({kp.gpu}) written to {out}")
            return
        if not measurements:
            _fail("calibrate: give measurement files or directories (or --list)")
        if out is None:
            _fail("calibrate: --out is required (where to write the profile)")
        if out.name.endswith(".gz"):
            _fail(f"--out: {out}: a profile fitted from measurement files is written as plain "
                  f"JSON (a .json.gz profile is read as a kernel profile, which this is not); "
                  f"give a .json name")
        if profile_id is not None and not profile_id.strip():
            _fail("--id: must not be empty")
        from dse.calibrate import run_calibrate

        _check_writable(out, "profile")
        report = run_calibrate([str(m) for m in measurements], str(out), gpu=gpu,
                               holdout=holdout, seed=seed, node=node, profile_id=profile_id)
    except ConfigError as e:
        _fail(str(e))
        return
    click.echo(report.table())
    click.echo(f"\nprofile {report.profile.profile_id} ({report.profile.gpu}) written to "
               f"{report.out}")


def _options(names: set[str]) -> str:
    """The options `names` given beside one that takes no other, as the refusal names them (the
    measurement files where no option was)."""
    return ", ".join(f"--{n.replace('_', '-')}" for n in sorted(names)) or "measurement files"


def _list_profiles() -> None:
    """Every shipped profile with its held-out errors; for a GPU both sources measured, how far
    they disagree."""
    from dse.calibrate import (
        error_table, render_disagreement, render_error_table, render_kernel_errors)
    from simcore.calibration.kernels import shipped_kernel_profile, shipped_kernel_profile_ids
    from simcore.calibration.profile import shipped_profile, shipped_profile_ids

    vidur = {shipped_profile(pid).gpu: shipped_profile(pid) for pid in shipped_profile_ids()}
    for pid in shipped_kernel_profile_ids():
        kp = shipped_kernel_profile(pid)
        click.echo(render_kernel_errors(kp))
        if kp.gpu in vidur:
            click.echo(render_disagreement(kp, vidur[kp.gpu]))
        click.echo("")
    for pid in shipped_profile_ids():
        p = shipped_profile(pid)
        click.echo(render_error_table(error_table(p), title=f"{pid} ({p.gpu}): relative errors"))
        click.echo("")
