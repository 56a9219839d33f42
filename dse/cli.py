"""The `dse` command line: each command parses, calls one library function, and prints.

Heavy libraries (Ray, Optuna, plotting) are imported inside the commands that need them, so
`dse simulate` starts fast.
"""

from __future__ import annotations

import gzip
import json
import signal
import sys
from dataclasses import replace
from pathlib import Path

from typing import TYPE_CHECKING

import click

from dse.cli_common import _check_writable, _fail, _fail_in, _write_json
from simcore.errors import ConfigError

if TYPE_CHECKING:
    from simcore.config import SimConfig


class _Commands(click.Group):
    """The command group; a command that runs out of memory fails with one line, not a
    traceback (a workload or deployment far too large for the machine: bounds on the settings
    refuse the absurd ones first, but not every size that fails to fit)."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except MemoryError:
            _fail("this machine ran out of memory for the run: its requests, prompts or "
                  "engines are too large for it (try fewer requests, shorter prompts or fewer "
                  "engines)")


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="llm-serving-dse")
def main() -> None:
    """Plan LLM-serving deployments: simulate a configuration, or search a space of them."""


def _bar_progress(bar):
    """A simulate() progress callback that moves a tqdm bar (requests done, virtual time)."""

    def progress(now_s: float, done: int, total: int) -> None:
        if bar.total != total:
            bar.total = total
        bar.n = done
        if done == total or done % 50 == 0:
            bar.set_postfix_str(f"t={now_s:.1f}s", refresh=False)
            bar.refresh()

    return progress


def _runs_progress(bar):
    """A progress callback for the envelope's perturbed runs, on the same bar."""

    def progress(done: int, total: int) -> None:
        bar.set_description_str(f"envelope run {done}/{total}", refresh=True)

    return progress


@main.command()
@click.argument("config", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Write the full result as JSON here.")
@click.option("--trace", "trace_out", type=click.Path(path_type=Path),
              default=None, help="Write the Perfetto trace of the config's cluster.trace window "
                                 "here (and leave it out of --out).")
@click.option("--seed", type=click.IntRange(min=0), default=None,
              help="Override the config's seed.")
@click.option("--envelope", type=click.Choice(["bounds", "samples", "first_order", "calibrated"]),
              default=None, help="Override uncertainty.method: how the metrics' envelope is "
                                 "computed (bounds: 2 extra runs; samples: uncertainty.samples "
                                 "extra runs; first_order: none).")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.option("--explain", "explain_runs", is_flag=True,
              help="Rank the limiting resources by intervention: relax each (x2), re-simulate, "
                   "and order them by the measured effect on p99 TTFT, p99 TPOT and output "
                   "throughput (one more run per resource).")
def simulate(config: Path, out: Path | None, trace_out: Path | None, seed: int | None,
             envelope: str | None, quiet: bool, explain_runs: bool) -> None:
    """Simulate CONFIG (YAML) and print vllm-bench-serve-style metrics with their envelope."""
    from simcore.config import load_config
    from simcore.footprint import available_memory_bytes, check_fits
    from simcore.uncertainty import simulate_with_envelope as run
    from dse.summary import render_summary

    try:
        cfg = load_config(config)
        if seed is not None:
            cfg = cfg.model_copy(update={"seed": seed})
        if envelope is not None:
            u = cfg.uncertainty.model_copy(update={"method": envelope})
            if envelope != "samples":
                u = u.model_copy(update={"vary_workload_seed": False})
            cfg = cfg.model_copy(update={"uncertainty": u})
        if trace_out is not None:
            _check_trace_window(config, cfg)
        _check_writable(trace_out, "trace")
        _check_writable(out, "result")
        if out is not None and trace_out is not None and out.resolve() == trace_out.resolve():
            _fail(f"--out and --trace are both {out}: the result would be written over the "
                  f"trace")
        check_fits(cfg, available_memory_bytes())
        bar = None
        if not quiet and sys.stderr.isatty():
            from tqdm import tqdm

            bar = tqdm(total=cfg.workload.resolved_num_prompts, unit="req", desc="simulating",
                       leave=False)
        try:
            # The request rows stay columns: --out streams them (`_write_json`).
            result = run(cfg, progress=_bar_progress(bar) if bar is not None else None,
                         run_progress=_runs_progress(bar) if bar is not None else None,
                         plain=False)
        finally:
            if bar is not None:
                bar.close()
    except ConfigError as e:
        _fail_in(config, e)
        return
    trace = result.pop("trace", None) if trace_out is not None else None
    click.echo(render_summary(result))
    if explain_runs:
        from dse.counterfactual import counterfactuals, default_objectives, render_effects

        objectives = default_objectives(result)
        try:
            effects = counterfactuals(cfg, objectives, base=result)
        except ConfigError as e:
            _fail_in(config, e)
            return
        click.echo(render_effects(effects, objectives, result))
        result["counterfactuals"] = [e.as_dict() for e in effects]
    if "cluster" in result:
        click.echo(_render_cluster(result["cluster"]))
    if trace is not None:
        _note_empty_trace(cfg, trace)
        _write_json(trace_out, trace, "trace")
    if out is not None:
        _write_json(out, result, "result")


def _note_empty_trace(cfg: SimConfig, trace: dict) -> None:
    """Say so where the config's trace window holds none of the run's steps (the file written
    then has no event)."""
    if not trace.get("traceEvents"):
        t = cfg.cluster.trace
        click.echo(f"note: the trace window (cluster.trace: {t.num_steps} steps from step "
                   f"{t.first_step}) holds none of the run's steps; the trace written has no "
                   f"event", err=True)


def _check_trace_window(config: Path, cfg: SimConfig) -> None:
    """Fail unless the config opens a trace window for --trace to write."""
    if cfg.cluster is None:
        _fail(f"{config}: --trace needs a cluster section with a trace window "
              f"(cluster.trace.num_steps), and this config has no cluster section")
    if cfg.cluster.trace.num_steps == 0:
        _fail(f"{config}: --trace needs a trace window; set cluster.trace.num_steps (and "
              f"cluster.trace.first_step) to the steps to trace")


_TOP_CAUSES = 3
"""Exposed-communication causes listed in the cluster block, most GPU time first."""


def _render_cluster(c: dict) -> str:
    """The cluster block printed after a summary: shares of time, causes, fabric counters."""
    from dse.summary import _row, _share, _title
    from simcore.cluster.runtime import COMM_CAUSES, SLOWED

    pct = _share
    f = c["fabric"]
    lines = [_title(f" Cluster ({c['backend']} fabric) "),
             _row("Nodes / GPUs used:", f"{c['num_nodes']} / {c['gpus_used']}"),
             _row("Network share of step time:", pct(c["network_share_of_step_time"])),
             _row("  across nodes (fabric):", pct(c["fabric_share_of_step_time"])),
             _row("  fabric wait above ideal (congestion):",
                  pct(c["congestion_share_of_step_time"]))]
    if "congestion_share_of_fabric_time" in c:
        lines.append(_row("    as a share of the fabric time:",
                          pct(c["congestion_share_of_fabric_time"])))
    if "network_share_of_request_latency" in c:
        lines.append(_row("Network share of request latency:",
                          pct(c["network_share_of_request_latency"])))
    causes = sorted(((k, v) for k, v in c["exposed_gpu_s"].items() if k.endswith(COMM_CAUSES)),
                    key=lambda kv: -kv[1])[:_TOP_CAUSES]
    if causes:
        lines.append(_title(" Exposed communication (GPU-s) ", "-"))
        lines += [_row(f"{name}:", f"{v:.3f}") for name, v in causes]
    lines += [_title(" Fabric ", "-"),
              _row("Messages / payload (MB):", f"{f['num_messages']} / "
                                               f"{f['payload_bytes'] / 1e6:.1f}"),
              _row("ECN marks / CNPs:", f"{f['ecn_marks']} / {f['cnps']}"),
              _row("DCQCN rate cuts:", f["dcqcn_rate_cuts"]),
              _row("PFC pause frames:", f["pfc_pause_frames"]),
              _row("Drops / retransmits:", f"{f['drops']} / {f['retransmits']}")]
    slow = f.get("step_slowdown")
    if slow and slow["p50"] is not None:
        lines += [_row(f"Step messages slowed >{SLOWED:g}x:",
                       f"{f['num_step_messages_slowed']} of {f['num_step_messages']}"),
                  _row("Step message slowdown p50 / p99:",
                       f"{slow['p50']:.2f} / {slow['p99']:.2f}")]
    kv = c.get("kv_transfers")
    if kv:
        ms = "{:.3f}".format
        lines += [_title(" KV-cache transfers ", "-"),
                  _row("Transfers / payload (MB):", f"{kv['num']} / {kv['bytes'] / 1e6:.1f}"),
                  _row("Time mean / p50 (ms):", f"{ms(kv['mean_s'] * 1e3)} / "
                                                f"{ms(kv['p50_s'] * 1e3)}"),
                  _row("Time p99 / max (ms):", f"{ms(kv['p99_s'] * 1e3)} / "
                                               f"{ms(kv['max_s'] * 1e3)}")]
    tier = c.get("kv_tier")
    if tier:
        lines += [_title(" External KV tier ", "-"),
                  _row("Lookups / fetched blocks:", f"{tier['lookups']} / "
                                                    f"{tier['fetched_blocks']}"),
                  _row("Fetched from the tier (GB):", f"{tier['fetched_bytes'] / 1e9:.1f}"),
                  _row("Stored / evicted blocks:", f"{tier['stored_blocks']} / "
                                                   f"{tier['evicted_blocks']}")]
    if f["slowdown_by_size"]:
        lines.append(_title(" FCT slowdown by message size ", "-"))
        lines.append(f"{'size':<20}{'messages':>12}{'p50':>14}{'p99':>14}")
        lines += [f"{b['size']:<20}{b['num']:>12}{b['slowdown_p50']:>14.2f}"
                  f"{b['slowdown_p99']:>14.2f}" for b in f["slowdown_by_size"]]
    lines.append("=" * len(lines[0]))
    return "\n".join(lines)


@main.command()
@click.argument("scenario", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the simulator's steps here: a header line, then one JSON object a "
                   "step (the golden format).")
@click.option("--golden", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Compare the steps with this recorded log and report the first difference.")
@click.option("--record-with-installed-vllm", "live", is_flag=True,
              help="Run the installed vLLM's own V1 scheduler on the scenario now (CPU only) "
                   "and compare its decisions with the simulator's, step by step.")
@click.option("--vllm-python", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="With --record-with-installed-vllm: the interpreter that can import vLLM "
                   "(default: this one), e.g. the venv scripts/vllm_conformance/setup.sh "
                   "builds.")
@click.option("--vllm-path", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="With --record-with-installed-vllm: put this folder first on vLLM's "
                   "PYTHONPATH (setup.sh's DIR/src).")
@click.option("--vllm-out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="With --record-with-installed-vllm: keep vLLM's step log here (a golden).")
def conformance(scenario: Path, out: Path | None, golden: Path | None, live: bool,
                vllm_python: Path | None, vllm_path: Path | None,
                vllm_out: Path | None) -> None:
    """Replay a scheduler SCENARIO (JSON) step by step through the vLLM-faithful scheduler,
    against a recorded log (--golden) or the installed vLLM itself
    (--record-with-installed-vllm)."""
    import tempfile

    from simcore.engine.conformance import (compare, load_scenario, read_steps, replay,
                                            step_log_header)

    try:
        if live and golden is not None:
            raise ConfigError("--golden and --record-with-installed-vllm: give one reference")
        if not live and (vllm_python or vllm_path or vllm_out):
            raise ConfigError("--vllm-python, --vllm-path and --vllm-out need "
                              "--record-with-installed-vllm")
        if out is None and not live:
            raise ConfigError("--out: give a file for the simulator's steps (or compare with "
                              "--record-with-installed-vllm)")
        for other, flag in ((golden, "--golden"), (vllm_out, "--vllm-out")):
            if out is not None and other is not None and out.resolve() == other.resolve():
                raise ConfigError(f"--out: {out} is also {flag}; it would be written over")
        sc = load_scenario(scenario)
        steps = list(replay(sc))
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            opener = gzip.open if out.name.endswith(".gz") else open
            with opener(out, "wt") as f:
                f.write(json.dumps(step_log_header()) + "\n")
                f.writelines(json.dumps(rec) + "\n" for rec in steps)
            click.echo(f"{len(steps)} steps written to {out}")
        what = str(golden)
        if live:
            from simcore.engine.vllm_link import record_with_vllm

            with tempfile.TemporaryDirectory() as d:
                target = vllm_out or Path(d) / "vllm.jsonl"
                target.parent.mkdir(parents=True, exist_ok=True)
                version = record_with_vllm(scenario, target, python=vllm_python,
                                           vllm_path=vllm_path)
                ref = read_steps(target)
            what = f"vLLM {version}'s scheduler"
            click.echo(f"vLLM {version} scheduled {scenario.name} in {len(ref)} steps"
                       + (f" (written to {vllm_out})" if vllm_out else ""))
        elif golden is not None:
            try:
                ref = read_steps(golden)
            except (OSError, ValueError) as e:
                raise ConfigError(f"{golden}: cannot be read as a step log ({e})") from None
        else:
            return
        try:
            diff = compare(steps, ref, reference="vLLM" if live else "the log")
        except ValueError as e:
            raise ConfigError(f"{golden}: cannot be read as a step log ({e})") from None
        if diff is None:
            click.echo(f"identical to {what}: all {len(ref)} steps match")
        else:
            click.echo(f"differs from {what}: {diff}")
            sys.exit(1)
    except ConfigError as e:
        _fail(str(e))
    except OSError as e:
        _fail(f"{e.filename or out}: cannot write ({e.strerror})")


@main.command()
@click.argument("steps", type=click.Path(path_type=Path))
@click.option("--config", "config", type=click.Path(path_type=Path),
              required=True, help="Simulation config (YAML) with a cluster section.")
@click.option("--instance", type=int, default=0, show_default=True,
              help="Engine of the placement that runs the steps.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the full result as JSON here.")
@click.option("--trace", "trace_out", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Write the Perfetto trace of the config's cluster.trace window "
                                 "here (and leave it out of --out).")
def replay(steps: Path, config: Path, instance: int, out: Path | None,
           trace_out: Path | None) -> None:
    """Replay a recorded scheduler-step log STEPS (JSON lines, as `dse conformance` writes) over
    the cluster's step DAG and fabric, and print step times and the network's share."""
    from simcore.cluster.replay import replay_steps
    from simcore.config import load_config

    try:
        cfg = load_config(config)
        if trace_out is not None:
            _check_trace_window(config, cfg)
        _check_writable(trace_out, "trace")
        _check_writable(out, "result")
        if out is not None and trace_out is not None and out.resolve() == trace_out.resolve():
            _fail(f"--out and --trace are both {out}: the result would be written over the "
                  f"trace")
        result = replay_steps(cfg, steps, instance=instance)
    except ConfigError as e:
        if str(e).startswith(str(steps)):
            _fail(str(e))
        else:
            _fail_in(config, e)
        return
    trace = result.pop("trace", None) if trace_out is not None else None
    click.echo(_render_replay(result))
    click.echo(_render_cluster(result["cluster"]))
    if trace is not None:
        _note_empty_trace(cfg, trace)
        _write_json(trace_out, trace, "trace")
    if out is not None:
        _write_json(out, result, "result")


def _render_replay(r: dict) -> str:
    """The headline of a step-log replay: steps, tokens and step times."""
    from dse.summary import _row, _title

    lines = [_title(" Step-log replay (simulated) "),
             _row("Steps in the log:", r["num_steps"]),
             _row("Steps run (non-empty):", r["num_executed_steps"]),
             _row("Engine instance:", r["instance"]),
             _row("Requests:", r["num_requests"])]
    if r["num_requests_assumed_uncached"]:
        lines.append(_row("Admissions without a logged prefix hit:",
                          r["num_requests_assumed_uncached"]))
    lines += [_row("Prefill / decode tokens:", f"{r['num_prefill_tokens']} / "
                                               f"{r['num_decode_tokens']}"),
              _row("Replayed duration (s):", r["total_s"]),
              _row("Token throughput (tok/s):", r["token_throughput"]),
              _title(" Step time ", "-"),
              _row("Mean step time (ms):", r["mean_step_s"] * 1e3),
              _row("Median step time (ms):", r["p50_step_s"] * 1e3),
              _row("P99 step time (ms):", r["p99_step_s"] * 1e3),
              _row("Max step time (ms):", r["max_step_s"] * 1e3)]
    p = r["provenance"]
    lines.append(f"{p['compute_profile']}, {p['fidelity']}, seed {p['seed']}")
    return "\n".join(lines)


@main.command()
@click.argument("study_file", metavar="STUDY", type=click.Path(path_type=Path))
@click.option("--no-resume", is_flag=True, help="Refuse to continue a study already in storage.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def search(study_file: Path, no_resume: bool, quiet: bool) -> None:
    """Search the space declared in STUDY (YAML) and write the report."""
    from dse.report_files import decided_report, write_report_files
    from dse.runner import run_search
    from dse.study import load_study

    signal.signal(signal.SIGTERM, _interrupt)    # stop as Ctrl-C does, not with a stack dump
    try:
        study = load_study(study_file)
        try:
            outcome = run_search(study, progress=not quiet, resume=not no_resume)
        except KeyboardInterrupt:
            _fail("interrupted: finished trials are stored and running ones marked "
                  "interrupted; run the same command to resume")
            return
        # Ray's shutdown may have put the default handler back.
        signal.signal(signal.SIGTERM, _interrupt)
        try:
            for note in outcome.notes:
                click.echo(f"note: {note}")
            if outcome.workers_line():
                click.echo(outcome.workers_line())
            report = decided_report(study)
            # The run's notes (a timeout's stop, a baseline not enqueued) go in the report too.
            report = replace(report, notes=report.notes + outcome.notes)
            click.echo(outcome.summary(report))
            paths = write_report_files(report, study.report_dir, study.report.formats)
        except KeyboardInterrupt:
            _fail(f"interrupted while writing the report: every trial is stored; "
                  f"`dse report {study_file}` writes it")
            return
    except ConfigError as e:
        _fail_in(study_file, e)
        return
    for kind, path in paths.items():
        click.echo(f"{kind:>5}: {path}")
    click.echo("")
    rec = report.recommendation
    for line in (rec.lines() if rec is not None
                 else [report.no_recommendation()]):
        click.echo(line)
    if report.serving is not None:
        click.echo("")
        click.echo(f"Aggregated against disaggregated: {report.serving.sentence()}")
    problem = outcome.problem()
    if problem:
        click.echo(f"error: {problem}", err=True)
        sys.exit(1)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@main.command()
@click.argument("study_file", metavar="STUDY", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder for the report files (default: the study's report.dir).")
def report(study_file: Path, out: Path | None) -> None:
    """Write the report (HTML, Markdown, CSV, JSON) of a STUDY from its storage."""
    from dse.report import write_report
    from dse.study import load_study

    try:
        paths = write_report(load_study(study_file), out_dir=out)
    except ConfigError as e:
        _fail(str(e))
        return
    for kind, path in paths.items():
        click.echo(f"{kind:>5}: {path}")


@main.command()
@click.argument("study_file", metavar="STUDY", type=click.Path(path_type=Path))
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=8080, show_default=True)
def dashboard(study_file: Path, host: str, port: int) -> None:
    """Open optuna-dashboard on the STUDY's storage (until Ctrl-C)."""
    from dse.dashboard import dashboard_url, serve_dashboard
    from dse.report import open_existing_storage
    from dse.study import load_study

    try:
        study = load_study(study_file)
        open_existing_storage(study.storage_url)
    except ConfigError as e:
        _fail(str(e))
        return
    click.echo(f"optuna-dashboard for {study.name}: {dashboard_url(host, port)} (Ctrl-C stops)")
    serve_dashboard(study.storage_url, host=host, port=port)


@main.command()
@click.argument("scenario", type=click.Path(path_type=Path))
@click.option("--backend", type=click.Choice(["packet", "flow", "analytical"]), default=None,
              help="Fabric fidelity (default: the scenario's own, else packet).")
@click.option("--seed", type=click.IntRange(min=0), default=None,
              help="Override the scenario's seed.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the measurements as JSON here.")
def fabric(scenario: Path, backend: str | None, seed: int | None, out: Path | None) -> None:
    """Run a network SCENARIO (YAML) on the fabric simulator and print its measurements."""
    from simcore.fabric.report import render_fabric_summary
    from simcore.fabric.run import run_scenario

    try:
        _check_writable(out, "measurements")
        result = run_scenario(scenario, backend, seed=seed)
    except ConfigError as e:
        _fail_in(scenario, e)
        return
    click.echo(render_fabric_summary(result))
    if out is not None:
        _write_json(out, result, "measurements", allow_nan=False)



@main.command()
@click.option("--suite", "suites", multiple=True,
              type=click.Choice(["ops", "collectives", "fabric", "scheduler", "end_to_end"]),
              help="Run only these suites (repeatable; default all).")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the rows as JSON here.")
@click.option("--vidur", "vidur_dir", type=click.Path(file_okay=False, path_type=Path),
              default=None, help="A vidur measurement folder (holds profiling/); default the "
                                 "copy shipped in the package.")
@click.option("--conformance", "conformance_dir", type=click.Path(file_okay=False, path_type=Path),
              default=None, help="A folder of scheduler scenarios/ and golden/ logs; default the "
                                 "vLLM 0.33 recordings shipped in the package.")
def validate(suites: tuple[str, ...], out: Path | None, vidur_dir: Path | None,
             conformance_dir: Path | None) -> None:
    """Run the validation suite: predictions against references, with errors and sources.

    Exits 1 if any row's error exceeds its tolerance."""
    from dse.validate import SUITES, render_table, run_suite

    try:
        _check_writable(out, "validation table")
        rows = run_suite(suites or SUITES, vidur_dir=vidur_dir, conformance_dir=conformance_dir)
    except ConfigError as e:
        _fail(str(e))
        return
    click.echo(render_table(rows))
    bad = [r for r in rows if not r.ok]
    click.echo(f"\n{len(rows) - len(bad)} of {len(rows)} checks within tolerance")
    if out is not None:
        _write_json(out, {"rows": [r.as_dict() for r in rows]}, "validation table",
                    allow_nan=False)
    if bad:
        sys.exit(1)


from dse.cli_capacity import capacity  # noqa: E402  (registers `dse capacity`)

main.add_command(capacity)

from dse.cli_launch import launch  # noqa: E402  (registers `dse launch`)

main.add_command(launch)

from dse.cli_calibrate import calibrate  # noqa: E402  (registers `dse calibrate`)

main.add_command(calibrate)

if __name__ == "__main__":
    main()
