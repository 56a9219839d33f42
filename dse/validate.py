"""`dse validate`: predictions against references, each row with its source and tolerance.

Suites:
- `ops`: calibrated per-op times on measurement rows held out from the fit (one row per GPU
  and op: the median relative error over the held-out rows).
- `collectives`: all-reduce and send/recv times against the NCCL tables (held-out rows), and the
  roofline's ring formula against the same tables (the reference profile's declared bound).
- `fabric`: the three fabric backends against closed forms (store-and-forward trains, max-min
  fair shares, M/D/1 queueing, line-rate lossless incast).
- `scheduler`: the scheduler replayed against vLLM's recorded decisions, step by step.
- `end_to_end`: whole simulations against published `vllm bench serve` measurements.

Every row names what the reference is and where it comes from; `Row.ok` is the error within
the row's tolerance. The tests run the suite and assert every row passes.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from simcore.errors import ConfigError

SUITES = ("ops", "collectives", "fabric", "scheduler", "end_to_end")


@dataclass(frozen=True)
class Row:
    """One prediction against one reference."""

    suite: str
    name: str
    predicted: float
    reference: float
    unit: str
    tolerance: float          # on `error`
    source: str               # what the reference is and where it comes from
    error_kind: str = "relative"
    """relative: |p - r| / r; absolute: |p - r|; statistic: the row's `predicted` is itself an
    error statistic (e.g. a median relative error over `reference` rows)."""
    note: str = ""

    @property
    def error(self) -> float:
        if self.error_kind == "statistic":
            return self.predicted
        d = abs(self.predicted - self.reference)
        if self.error_kind == "absolute":
            return d
        return d / abs(self.reference) if self.reference else (0.0 if d == 0 else math.inf)

    @property
    def ok(self) -> bool:
        return self.error <= self.tolerance

    def as_dict(self) -> dict:
        """The row for JSON: an unbounded tolerance (a row listed, not checked) is null, as
        standard JSON has no infinity."""
        d = {**asdict(self), "error": self.error, "ok": self.ok}
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                for k, v in d.items()}


# ---- fabric ---------------------------------------------------------------------------------

def fabric_rows() -> list[Row]:
    """The fabric backends against closed forms nobody here had to compute by simulation."""
    from simcore.fabric import topology as T
    from simcore.fabric.analytical import AnalyticalFabric
    from simcore.fabric.flow import FlowFabric
    from simcore.fabric.packet import PacketFabric, roce_v2

    rows: list[Row] = []
    lossless = roce_v2(ecn={"enabled": False}, dcqcn={"enabled": False})
    # A train of 37 full frames over a 40/10/25 Gb/s chain: first frame store-and-forward on
    # every hop, the rest pipelined at the bottleneck.
    rates, delays = [40, 10, 25], [1e-6, 2e-6, 0.5e-6]
    names = ["a", "s1", "s2", "b"]
    chain = T.explicit([(n, "host" if n in ("a", "b") else "switch") for n in names],
                       [dict(a=names[i], b=names[i + 1], rate_bps=r * 1e9, delay_s=d)
                        for i, (r, d) in enumerate(zip(rates, delays))],
                       mtu_bytes=1500, header_bytes=52)
    frame = 1500 * 8
    train = (sum(frame / (r * 1e9) + d for r, d in zip(rates, delays))
             + 36 * frame / (min(rates) * 1e9))
    a, b = chain.node_index("a"), chain.node_index("b")
    for name, fab in (("analytical", AnalyticalFabric(chain)), ("flow", FlowFabric(chain)),
                      ("packet", PacketFabric(chain, lossless))):
        fab.send(a, b, 37 * (1500 - 52))
        fab.run()
        (msg,) = fab.stats().messages
        rows.append(Row("fabric", f"{name}: 37-frame train, 3-hop chain", msg.fct_s * 1e6,
                        train * 1e6, "us", 1e-9, "store-and-forward closed form: first frame "
                        "serialised on every hop, the rest at the bottleneck rate"))
    # Two flows through one 10 Gb/s bottleneck: half the rate each (max-min), or one after the
    # other at the full rate (serialised): the second ends at the same time either way.
    db = T.dumbbell(2, 2, rate_bps=10e9, delay_s=1e-6, mtu_bytes=1500, header_bytes=52)
    size = 1000 * 1448
    expected = 1000 * 1500 * 8 / 5e9 + 3e-6 + 2 * 1500 * 8 / 10e9
    for name, fab, what, source in (
            ("flow", FlowFabric(db), "two flows share a bottleneck",
             "max-min fair share: each flow at half the bottleneck rate"),
            ("analytical", AnalyticalFabric(db), "two messages share a bottleneck",
             "serialised: the second message after the first, each at the bottleneck rate")):
        fab.send(db.node_index("L0"), db.node_index("R0"), size)
        fab.send(db.node_index("L1"), db.node_index("R1"), size)
        fab.run()
        worst = max(m.fct_s for m in fab.stats().messages)
        rows.append(Row("fabric", f"{name}: {what}", worst * 1e3, expected * 1e3, "ms", 1e-9,
                        source))
    # M/D/1: Poisson 1500-byte frames into a 10 Gb/s port at load 0.5.
    one = T.explicit([("a", "host"), ("b", "host")],
                     [dict(a="a", b="b", rate_bps=10e9, delay_s=1e-6)],
                     mtu_bytes=1500, header_bytes=52)
    service = 1500 * 8 / 10e9
    rho, n = 0.5, 400_000
    pf = PacketFabric(one, roce_v2(ecn={"enabled": False}, dcqcn={"enabled": False},
                                   pfc={"enabled": False}, sample_interval_s=1.0),
                      seed=20240917)
    pf.add_source(0, 1, 1448, rate_bps=rho * 10e9, stop_s=n * service / rho, poisson=True)
    pf.run()
    port = pf.stats().links[one.link(one.node_index("a"), one.node_index("b")).index]
    wait = port.queue_byte_s / port.bytes_sent - service
    rows.append(Row("fabric", "packet: M/D/1 mean wait, load 0.5", wait * 1e6,
                    rho / (2 / service * (1 - rho)) * 1e6, "us", 0.05,
                    "M/D/1 queue: Wq = rho / (2 mu (1 - rho)) (Pollaczek-Khinchine); "
                    f"{n:,} Poisson frames"))
    # Lossless incast: 8 senders x 4 MB into one 100 Gb/s port finish at line rate.
    star = T.star(9, rate_bps=100e9, delay_s=1e-6, mtu_bytes=4096, header_bytes=48)
    pf = PacketFabric(star, lossless)
    dst, *senders = star.hosts
    for h in senders:
        pf.send(h, dst, 4_000_000)
    pf.run()
    msgs = pf.stats().messages
    end = max(m.end_s for m in msgs)
    frames = math.ceil(4_000_000 / (4096 - 48))
    line = 8 * (4_000_000 + frames * 48) * 8 / 100e9
    rows.append(Row("fabric", "packet: 8-to-1 incast with PFC", end * 1e3, line * 1e3, "ms",
                    0.02, "lossless incast drains at the receiver's line rate: N x size / C"))
    return rows


# ---- scheduler ------------------------------------------------------------------------------

def scheduler_rows(conformance_dir: Path) -> list[Row]:
    """Each recorded vLLM scenario replayed; the error is the fraction of steps that differ."""
    from simcore.engine.conformance import compare, load_scenario, read_steps, replay

    rows: list[Row] = []
    found = 0
    scenarios = sorted([*(conformance_dir / "scenarios").glob("*.json"),
                        *(conformance_dir / "scenarios").glob("*.json.gz")])
    for sc_path in scenarios:
        name = sc_path.name.removesuffix(".gz").removesuffix(".json")
        golden = conformance_dir / "golden" / f"{name}.jsonl.gz"
        if not golden.is_file():
            continue
        found += 1
        ours = list(replay(load_scenario(sc_path)))
        ref = read_steps(golden)
        same = 0
        for a, b in zip(ours, ref):
            if compare([a], [b]) is None:
                same += 1
        rows.append(Row("scheduler", f"identical steps: {golden.name}", float(same),
                        float(len(ref)), "steps", 0.0,
                        "vLLM's own scheduler decisions recorded step by step "
                        "(simcore/data/conformance: scenario and golden log)",
                        note=compare(ours, ref) or ""))
    if not found:
        raise ConfigError(f"{conformance_dir}: no scenario of scenarios/ has its golden log "
                          f"(golden/<name>.jsonl.gz): nothing to check")
    return rows


# ---- end to end -----------------------------------------------------------------------------

_MUSGRAVE = ("vllm bench serve, vLLM 0.23.0, Llama-3.1-8B-Instruct bf16 on one A100 40GB, random "
             "1024 in / 128 out, ignore-eos; J. Musgrave, 'vLLM throughput-latency sweep on "
             "NVIDIA A100', https://johnmusgrave.com/p/vllm-throughput-latency-sweep-on")


def _sweep_config(concurrency: int):
    from simcore.config import SimConfig

    return SimConfig.model_validate({
        "name": f"llama-3.1-8b-a100-40gb-c{concurrency}", "seed": 0,
        "model": {"name": "meta-llama/Llama-3.1-8B", "dtype": "bf16"},
        "hardware": {"gpu": "A100-40GB"},
        "workload": {"num_prompts": 20 * concurrency, "max_concurrency": concurrency,
                     "dataset": {"kind": "random", "input_len": 1024, "output_len": 128}},
    })


def end_to_end_rows() -> list[Row]:
    """Published end-to-end measurements: the A100 sweep's two figures (the reference profile's
    declared bound is their tolerance), then every held-out case of the end-to-end validation set
    (`dse.validate_e2e`) with its envelope, and per metric family the statistics over them."""
    from simcore.simulate import simulate

    c1 = simulate(_sweep_config(1))
    c8 = simulate(_sweep_config(8))
    tol = float(c1["provenance"]["step_time_relative_uncertainty"])
    rows = [
        Row("end_to_end", "A100-40GB Llama-3.1-8B, concurrency 1: decode tok/s",
            1000.0 / c1["mean_tpot_ms"], 75.0, "tok/s", tol,
            f"{_MUSGRAVE}: 'decode at one request per time runs at about 75 tokens/sec'"),
        Row("end_to_end", "same, output throughput concurrency 8 / concurrency 1",
            c8["output_throughput"] / c1["output_throughput"], 6.6, "x", tol,
            f"{_MUSGRAVE}: 'a 6.6x gain' in throughput from concurrency 1 to 8"),
    ]
    return rows + held_out_rows()


def held_out_rows() -> list[Row]:
    """One row per held-out case and family (informational: its envelope in the note), then the
    statistics per family with their regression bounds (`dse.validate_e2e.GUARDS`); each note
    says the issue's target and whether it is met."""
    from dse.validate_e2e import (
        COVERAGE_TARGET, GUARDS, SIGNED_TARGET, TARGETS, evaluate, load_cases, summarize)

    cases, _ = load_cases()
    outcomes = [evaluate(c) for c in cases if c.split == "held_out"]
    rows = []
    units = {"throughput": "tok/s", "ttft": "ms", "tpot": "ms", "e2e": "s"}
    for o in outcomes:
        for fam, m in o.case.measured.items():
            unit = "req/s" if o.case.keys[fam] == "request_throughput" else units[fam]
            if o.case.keys[fam] == "mean_e2el_ms":
                unit = "ms"
            inside = "inside" if o.covered(fam) else "OUTSIDE"
            draws = ""
            if fam in o.draw_range:
                lo, hi = o.draw_range[fam]
                draws = f"; its draws {lo:.4g} to {hi:.4g}"
            rows.append(Row("end_to_end", f"{o.case.id} {fam}", o.predicted[fam], m, unit,
                            math.inf, o.case.source,
                            note=f"envelope [{o.low[fam]:.4g}, {o.high[fam]:.4g}] ({inside}); "
                                 + "; ".join(o.case.notes) + draws))
    urls = sorted({o.case.source for o in outcomes})
    src = ("end-to-end validation set, held-out cases (simcore/data/validation, each row's "
           "source quoted there): " + ", ".join(urls))
    for fam, st in summarize(outcomes).items():
        g = GUARDS[fam]
        iv = st["intervals"]
        over = f"90% interval over resamples of its {st['sources']} sources"
        rows.append(Row("end_to_end", f"held-out {fam}: median |error|", st["median_abs"],
                        st["n"], "cases", g["median_abs"], src, "statistic",
                        note=f"target <= {TARGETS[fam]:.0%}: "
                             f"{'met' if st['median_abs'] <= TARGETS[fam] else 'not met'}; "
                             f"{over}: {_span(iv['median_abs'], '.1%')}"))
        rows.append(Row("end_to_end", f"held-out {fam}: |median signed error|",
                        abs(st["median_signed"]), st["n"], "cases", g["median_signed"], src,
                        "statistic", note=f"median signed {st['median_signed']:+.1%}; target "
                        f"within +/-{SIGNED_TARGET:.0%}: "
                        f"{'met' if abs(st['median_signed']) <= SIGNED_TARGET else 'not met'}; "
                        f"{over}: {_span(iv['median_signed'], '+.1%')}"))
        rows.append(Row("end_to_end", f"held-out {fam}: outside the envelope",
                        1.0 - st["coverage"], st["n"], "cases", g["outside"], src, "statistic",
                        note=f"coverage {st['coverage']:.0%}; target >= {COVERAGE_TARGET:.0%}: "
                             f"{'met' if st['coverage'] >= COVERAGE_TARGET else 'not met'}; "
                             f"{over}: coverage {_span(iv['coverage'], '.0%')}"))
    return (rows + class_rows(outcomes, src) + decode_step_rows(outcomes) + peak_rows(outcomes)
            + tail_rows(outcomes) + [fit_part_row(cases)])


def _span(interval: tuple[float, float], fmt: str) -> str:
    """An interval's ends in `fmt`, "lo to hi"."""
    lo, hi = interval
    return f"{lo:{fmt}} to {hi:{fmt}}"


def fit_part_row(cases) -> Row:
    """The share of the fit part's cases the shipped parameters were fitted on (informational):
    rows added to the set since the last fit that the id hash puts in the fit part are neither
    fitted on nor reported until the next fit (`scripts/fit_host_overheads.py`) takes them."""
    from simcore.host import fitted_cases

    fitted = set(fitted_cases())
    fit = [c.id for c in cases if c.split == "fit"]
    used = sum(1 for i in fit if i in fitted)
    return Row("end_to_end", "fit part: share of its cases in the shipped fit",
               used / len(fit) if fit else 1.0, len(fit), "cases", math.inf,
               "simcore/data/cpu_costs/fitted.json", "statistic",
               note=f"{used} of {len(fit)} fit cases; {len(fit) - used} added since the last "
                    "fit, neither fitted on nor reported until the next one")


LOADS = ("ShareGPT", "random 1k+", "random <1k")
"""The loads `load_of` tells apart."""


def load_of(case) -> str:
    """The load an end-to-end case's benchmark sent (one of `LOADS`): ShareGPT conversations
    (its lengths drawn, `Case.draws`), random prompts of 1,000 tokens or more, or fewer."""
    ds = case.config["workload"].get("dataset")
    if ds is None or ds.get("kind") != "random":
        return LOADS[0]
    return LOADS[1] if ds.get("input_len", 0) >= 1000 else LOADS[2]


def class_rows(outcomes, src: str) -> list[Row]:
    """The held-out statistics again for dense and for mixture-of-experts models apart, for
    each GPU apart and for each load apart (informational, no bound): where the model is
    weaker, a planner should read its envelope wider."""
    from dse.validate_e2e import summarize
    from simcore.model.presets import load_preset

    groups = [(label, [o for o in outcomes
                       if load_preset(o.case.config["model"]["name"]).is_moe == moe])
              for label, moe in (("dense", False), ("MoE", True))]
    gpus = sorted({o.case.config["hardware"]["gpu"] for o in outcomes})
    groups += [(gpu, [o for o in outcomes if o.case.config["hardware"]["gpu"] == gpu])
               for gpu in gpus]
    groups += [(load, [o for o in outcomes if load_of(o.case) == load]) for load in LOADS]
    rows = []
    for label, part in groups:
        for fam, st in summarize(part).items():
            rows.append(Row("end_to_end", f"held-out {label} {fam}: median |error|",
                            st["median_abs"], st["n"], "cases", math.inf, src, "statistic",
                            note=f"median signed {st['median_signed']:+.1%}, coverage "
                                 f"{st['coverage']:.0%} (informational)"))
    return rows


BATCHES = ((0, 16, "under 16"), (16, 256, "16-255"), (256, math.inf, "256+"))
"""The ranges of the simulated mean batch (sequences a step) the decode-step check is summed
over apart, with their labels."""
MIN_ITL_OUTPUT = 16
"""Fewest output tokens a request of a case's load samples on average for its median ITL to
check the decode step: with fewer, most of a request's few gaps sit beside its own or its
burst's prefill."""


def decode_step_rows(outcomes) -> list[Row]:
    """The decode step checked apart (informational, no bound): for each held-out case whose
    source prints the run's median ITL and whose requests sample at least `MIN_ITL_OUTPUT`
    tokens, the simulated median ITL against it, and over the cases of each simulated mean
    batch (`BATCHES`) the median |error| and signed error. The median gap between streamed
    tokens is the period of the run's typical step, most often one that decodes the steady
    batch, so it checks the step model (or, where the API server is slower than the engine,
    the server's pace) without the queueing that TTFT and mean TPOT hold; a prompt chunk in a
    step lengthens the gaps around it, which the median mostly leaves out. The simulation is
    the case's first draw, the batch its mean over the run."""
    rows, by, urls = [], {label: [] for _, _, label in BATCHES}, set()
    for o in outcomes:
        out = o.case.mean_output_tokens()
        if o.step is None or o.case.median_itl_ms is None or out is None \
                or out < MIN_ITL_OUTPUT:
            continue
        urls.add(o.case.source)
        itl, batch = o.step
        m = o.case.median_itl_ms
        rows.append(Row("end_to_end", f"{o.case.id} median ITL", itl, m, "ms", math.inf,
                        o.case.source, note=f"the decode step apart: simulated mean batch "
                        f"{batch:.1f} sequences (informational)"))
        label = next(lab for lo, hi, lab in BATCHES if lo <= batch < hi)
        by[label].append((itl - m) / m)
    src = ("the median ITL of held-out cases of the end-to-end validation set "
           "(simcore/data/validation): " + ", ".join(sorted(urls)))
    rows += [_apart_summary(f"held-out median ITL, batch {label}: median |error|", by[label],
                            src, "the decode step apart")
             for _, _, label in BATCHES if by[label]]
    return rows


def _apart_summary(name: str, errs: list[float], src: str, what: str) -> Row:
    """The summary row of a check apart over its cases' relative errors `errs`: their median
    |error| against the number of cases, the median signed error in the note (informational,
    no bound); `what`, what the check is."""
    return Row("end_to_end", name, statistics.median(abs(e) for e in errs), len(errs), "cases",
               math.inf, src, "statistic",
               note=f"median signed {statistics.median(errs):+.1%} (informational: {what})")


KV_FULL = 0.95
"""The simulated peak KV-cache usage from which a case's decode batch counts as held by the
KV cache (`peak_rows`)."""


def peak_rows(outcomes) -> list[Row]:
    """The busiest second checked apart (informational, no bound): for each held-out case whose
    source prints `vllm bench serve`'s peak output throughput (the most tokens streamed in one
    second of the run), the simulated peak against it, and over the cases whose simulated KV
    cache fills (peak usage from `KV_FULL`) and those whose does not, the median |error| and
    signed error. Where the KV cache fills, the peak is about the most sequences the cache holds
    at once times the steps a second, so it checks the cache's capacity and the admission beside
    the step (which the median ITL checks alone); where it does not, a burst's prefill and the
    server's pace. The simulation is the case's first draw."""
    rows, by, urls = [], {True: [], False: []}, set()
    for o in outcomes:
        if o.peak is None or o.case.peak_output_tps is None:
            continue
        urls.add(o.case.source)
        peak, usage = o.peak
        m = o.case.peak_output_tps
        full = usage >= KV_FULL
        rows.append(Row("end_to_end", f"{o.case.id} peak output throughput", peak, m, "tok/s",
                        math.inf, o.case.source, note=f"the busiest second apart: simulated "
                        f"peak KV-cache usage {usage:.0%} (informational)"))
        by[full].append((peak - m) / m)
    src = ("the peak output throughput of held-out cases of the end-to-end validation set "
           "(simcore/data/validation): " + ", ".join(sorted(urls)))
    rows += [_apart_summary(f"held-out peak output throughput, {label}: median |error|",
                            by[full], src, "the busiest second apart; filled: simulated peak "
                            f"usage from {KV_FULL:.0%}")
             for full, label in ((True, "KV cache filled"), (False, "KV cache not filled"))
             if by[full]]
    return rows


TAILS = (("ttft", "p99 TTFT"), ("tpot", "p99 TPOT"), ("itl", "p99 ITL"))
"""The 99th percentiles the tail check compares, by family, and their labels."""


def tail_rows(outcomes) -> list[Row]:
    """The tails checked apart (informational, no bound): for each held-out case whose source
    prints the run's p99 TTFT, TPOT or ITL, the simulated one against it, and per family the
    median |error| and signed error. A latency SLO is a percentile (`dse capacity` finds the rate
    at which p99 TTFT and TPOT meet theirs), and a tail takes what the means average away: a
    burst's last requests, the requests whose few tokens decode beside long prefills. With each
    case's envelope (`dse simulate`'s around the simulated p99: calibrated on the fit part's own
    p99 residuals, `simcore.uncertainty.tail_family`), the share of measured tails inside it.
    The simulation is the case's first draw."""
    rows, by, urls = [], {fam: [] for fam, _ in TAILS}, set()
    inside = {fam: [] for fam, _ in TAILS}
    for o in outcomes:
        for fam, label in TAILS:
            m, p = o.case.p99_ms.get(fam), o.p99_ms.get(fam)
            if m is None or p is None:
                continue
            urls.add(o.case.source)
            env = o.p99_envelope.get(fam)
            where = ""
            if env is not None:
                inside[fam].append(env[0] <= m <= env[1])
                where = (f"; envelope [{env[0]:.4g}, {env[1]:.4g}] "
                         f"({'inside' if inside[fam][-1] else 'OUTSIDE'})")
            rows.append(Row("end_to_end", f"{o.case.id} {label}", p, m, "ms", math.inf,
                            o.case.source, note=f"the tail apart{where} (informational)"))
            by[fam].append((p - m) / m)
    src = ("the p99 TTFT, TPOT and ITL of held-out cases of the end-to-end validation set "
           "(simcore/data/validation): " + ", ".join(sorted(urls)))
    rows += [_apart_summary(f"held-out {label}: median |error|", by[fam], src,
                            "the tail apart" + (
                                f"; inside the envelope: {sum(inside[fam])} of "
                                f"{len(inside[fam])}, {sum(inside[fam]) / len(inside[fam]):.0%}"
                                if inside[fam] else ""))
             for fam, label in TAILS if by[fam]]
    return rows


# ---- the suite ------------------------------------------------------------------------------

def run_suite(suites: tuple[str, ...] = SUITES, *, vidur_dir: Path | None = None,
              conformance_dir: Path | None = None) -> list[Row]:
    """The rows of the chosen suites, in suite order. The measurement tables and recorded
    scheduler logs default to the copies shipped in the package (`simcore.reference_data`)."""
    from dse.validate_calibration import collective_rows, op_rows
    from simcore.reference_data import CONFORMANCE_DIR, VIDUR_DIR

    suites = tuple(dict.fromkeys(suites))
    for given, name, users in ((vidur_dir, "--vidur", {"ops", "collectives"}),
                               (conformance_dir, "--conformance", {"scheduler"})):
        if given is not None and not users & set(suites):
            raise ConfigError(f"{name}: no suite chosen reads it (it feeds "
                              f"{' and '.join(sorted(users))})")
    vidur = vidur_dir or VIDUR_DIR
    conformance = conformance_dir or CONFORMANCE_DIR
    if {"ops", "collectives"} & set(suites) and not (vidur / "profiling").is_dir():
        raise ConfigError(f"{vidur}: not a vidur data folder (no profiling/ inside)")
    if "scheduler" in suites and not (conformance / "scenarios").is_dir():
        raise ConfigError(f"{conformance}: not a conformance folder (no scenarios/ inside)")
    rows: list[Row] = []
    for s in suites:
        if s == "ops":
            rows += op_rows(vidur)
        elif s == "collectives":
            rows += collective_rows(vidur)
        elif s == "fabric":
            rows += fabric_rows()
        elif s == "scheduler":
            rows += scheduler_rows(conformance)
        elif s == "end_to_end":
            rows += end_to_end_rows()
        else:
            raise ValueError(f"unknown suite {s!r} (one of {', '.join(SUITES)})")
    return rows


def _pct(x: float, kind: str) -> str:
    if math.isinf(x):
        return "-"
    if kind == "absolute":
        return f"{x:.3g}"
    return f"{x:.0e}" if 0 < x < 1e-4 else f"{x:.2%}"


def render_table(rows: list[Row]) -> str:
    """The rows as a fixed-width table, one line each (a statistic's note, which says the
    target it should reach and whether it does, or its signed error, and a held-out case's
    envelope and whether it holds the measured value, on the line under it), then the sources
    numbered. `ok` is the row's tolerance: for a statistic, its regression
    bound, not the target."""
    # The check column as wide as the longest name (at least 52): a name is never cut, since
    # the end of a case's name says what its row measures and its middle which case it is.
    width = max([52] + [len(r.name) + 1 for r in rows])
    head = f"{'suite':<12}{'check':<{width}}{'predicted':>12}{'reference':>12}  {'unit':<6}" \
           f"{'error':>9}{'tol':>9}  ok"
    lines = [head, "-" * len(head)]
    sources: list[str] = []
    for r in rows:
        if r.source not in sources:
            sources.append(r.source)
        err, tol = _pct(r.error, r.error_kind), _pct(r.tolerance, r.error_kind)
        if r.error_kind == "statistic":    # predicted: the statistic; reference: row count
            pred, ref = f"{r.predicted:.2%}", f"n={r.reference:.0f}"
        else:
            pred, ref = f"{r.predicted:.5g}", f"{r.reference:.5g}"
        lines.append(f"{r.suite:<12}{r.name:<{width}}{pred:>12}{ref:>12}  "
                     f"{r.unit:<6}{err:>9}{tol:>9}  {'yes' if r.ok else 'NO'} "
                     f"[{sources.index(r.source) + 1}]")
        if r.error_kind == "statistic" and r.note:
            lines.append(f"{'':<14}{r.note}")
        elif r.note.startswith("envelope ["):     # a held-out case: its envelope under it
            lines.append(f"{'':<14}{r.note.split('; ')[0]}")
    lines.append("")
    lines += [f"[{i}] {s}" for i, s in enumerate(sources, 1)]
    return "\n".join(lines)
