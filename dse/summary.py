"""Plain-text rendering of a simulation result, in the layout `vllm bench serve` prints."""

from __future__ import annotations

import math

import textwrap

from dse.explain import engine_load_text, explain
from simcore.attribution import Attribution, as_run, attribute
from simcore.metric_catalog import tail_percentile
from simcore.result import RunResult

_LINE = 60
_TOP_FACTORS = 3
"""Limiting factors listed under the explanation, highest score first."""


def _row(label: str, value) -> str:
    if isinstance(value, float):
        value = f"{value:.2f}"
    return f"{label:<44}{value:>16}"


def _share(x: float) -> str:
    """A fraction as a percentage that a small non-zero value never rounds to 0.0%: one decimal
    from 0.1% up, two significant digits below (0.00031 -> "0.031%"); values under 1e-6 (the
    rounding noise of float sums) print as 0.0%."""
    if x >= 0.001 or x < 1e-6:
        return f"{max(x, 0.0):.1%}"
    return f"{x * 100:.2g}%"


def _title(text: str, fill: str = "=") -> str:
    return f"{text:{fill}^{_LINE}}"


def _wrap(text: str, first: str = "", rest: str = "") -> list[str]:
    return textwrap.wrap(text, _LINE, initial_indent=first, subsequent_indent=rest)


def render_explanation(r: dict | RunResult, attribution: Attribution | None = None) -> list[str]:
    """The "Explanation" and "Assumptions" sections: what limits the run, and what it rests on
    (`attribution`: `attribute(r)`, when the caller has it already)."""
    e = explain(r, attribution)
    lines = [_title(" Explanation ", "-")]
    for sentence in e["sentences"]:
        lines += _wrap(sentence)
    if e["bottleneck"] is not None:
        lines.append("Limiting factors (score 0-1):")
        for f in e["factors"][:_TOP_FACTORS]:
            lines.append(f"  {f['label']:<50}{f['score']:>8.2f}")
    lines.append(_title(" Assumptions ", "-"))
    for a in e["assumptions"]:
        lines += _wrap(a, "- ", "  ")
    return lines


_ENVELOPE_ROWS = (
    ("request_throughput", "Request throughput (req/s)"),
    ("output_throughput", "Output token throughput (tok/s)"),
    ("mean_ttft_ms", "Mean TTFT (ms)"), ("p99_ttft_ms", "P99 TTFT (ms)"),
    ("mean_tpot_ms", "Mean TPOT (ms)"), ("p99_tpot_ms", "P99 TPOT (ms)"),
    ("mean_e2el_ms", "Mean E2EL (ms)"), ("p99_e2el_ms", "P99 E2EL (ms)"),
    ("network_share_of_request_latency", "Network share of latency"),
)
"""The metrics the printed envelope lists (every headline metric has one in the JSON)."""


def _num(v: float) -> str:
    return f"{v:.4g}" if abs(v) < 1000 else f"{v:.0f}"


def _family_label(fam: str) -> str:
    """A metric family as the envelope names it: TTFT, throughput, p99 TPOT (a tail's own)."""
    base = fam.removesuffix("_p99")
    label = base.upper() if base in ("ttft", "tpot", "itl", "e2e") else base
    return f"p99 {label}" if base != fam else label


def _residuals_from(env: dict) -> str:
    """Whose errors a calibrated envelope took, per metric family: the run's GPU's fit cases
    where they were enough, else every GPU's."""
    by: dict[str, list[str]] = {}
    for fam, whose in (env.get("residuals_from") or {}).items():
        by.setdefault(whose, []).append(_family_label(fam))

    def whose_cases(whose: str) -> str:
        return "of every GPU's cases" if whose == "all GPUs" else f"of its cases on {whose}"

    if len(by) <= 1:
        return whose_cases(next(iter(by), "all GPUs"))
    order = sorted(by, key=lambda w: w == "all GPUs")         # the GPU's own first
    return " and ".join(f"{whose_cases(w)} ({', '.join(sorted(by[w]))})" for w in order)


def render_envelope(r: dict) -> list[str]:
    """The envelope block: how the range was obtained, then low / nominal / high per metric."""
    env = r["envelope"]
    how = {"bounds": f"op classes at both ends of their bounds, {env['runs']} runs",
           "samples": lambda: (f"p{env['percentiles'][0]:g}-p{env['percentiles'][1]:g} of "
                               f"{env['runs'] - 1} perturbed runs"
                               + (" with their own workload draws"
                                  if len(set(env["seeds"])) > 1 else "")),
           "first_order": "first order in the step-time bound, no extra run",
           "calibrated": lambda: ("a split-conformal interval from the end-to-end "
                                  "validation set's fit-part errors out of sample "
                                  f"(cross-validated) {_residuals_from(env)}, centred on their "
                                  "median, no extra run")}[env["method"]]
    how = how() if callable(how) else how
    lines = [_title(" Envelope ", "-")]
    status = "calibrated" if env["calibrated"] else "UNCALIBRATED (reference profile)"
    lines += _wrap(f"{status}; {how}.")
    b = env["op_error_bounds"] or {}
    if b:
        parts: dict[float, list[str]] = {}
        for k, v in b.items():
            parts.setdefault(round(v, 3), []).append(k)
        lines += _wrap("Error bounds: " + "; ".join(
            f"{', '.join(ks)} +/-{v:.0%}" for v, ks in sorted(parts.items())) + ".")
    lines.append(f"{'':<32}{'low':>9}{'nominal':>10}{'high':>9}")
    m = env["metrics"]
    for key, label in _envelope_rows(m):
        e = m[key]
        lines.append(f"{label:<32}{_num(e['low']):>9}{_num(e['nominal']):>10}"
                     f"{_num(e['high']):>9}")
    return lines


def _envelope_rows(m: dict) -> list[tuple[str, str]]:
    """`_ENVELOPE_ROWS` that the envelope holds, the P99 rows standing for the highest tail
    percentile the run reports where it reports no 99th (metrics.percentiles)."""
    out = []
    for key, label in _ENVELOPE_ROWS:
        if key not in m and key.startswith("p99_"):
            fam = key.split("_")[1]
            tail = tail_percentile(m, fam)
            if tail is not None:
                key, label = tail, f"P{tail[1:].split('_')[0]} {fam.upper()} (ms)"
        if key in m:
            out.append((key, label))
    return out


def _session_lines(s: dict) -> list[str]:
    """How the sessions of a multi-turn workload ended, and what their later turns gained."""

    def ms(part: dict) -> str:
        return "-" if part["mean_ms"] is None else f"{part['mean_ms']:.2f}"

    return [
        _title(" Sessions ", "-"),
        _row("Sessions completed / run:", f"{s['completed']} / {s['num_sessions']}"),
        _row("Ended at the context limit:", s["ended_max_context"]),
        _row("Ended by a failed turn:", s["ended_failed"]),
        _row("Turns sent (mean per session):", f"{s['turns_sent']} "
                                               f"({s['mean_turns_sent']:.2f})"),
        _row("Prefix-cache hit rate, first / later turns:",
             f"{s['prefix_cache_hit_rate_first_turns']:.2f} / "
             f"{s['prefix_cache_hit_rate_later_turns']:.2f}"),
        _row("Mean TTFT, first / later turns (ms):",
             f"{ms(s['ttft_first_turns'])} / {ms(s['ttft_later_turns'])}"),
    ]


def render_summary(r: dict) -> str:
    """The headline metrics, the engine's view, the explanation, assumptions and provenance."""
    p = r["provenance"]
    lines = [_title(" Serving Benchmark Result (simulated) ")]
    # As vllm bench serve (0.33) prints them: failures even when none, the configured rate
    # when finite, the peak concurrency to two decimals.
    lines.append(_row("Successful requests:", r["completed"]))
    lines.append(_row("Failed requests:", r["failed"]))
    if r["max_concurrency"] is not None:
        lines.append(_row("Maximum request concurrency:", r["max_concurrency"]))
    rate = r.get("request_rate")
    if isinstance(rate, (int, float)) and not isinstance(rate, bool) and math.isfinite(rate):
        lines.append(_row("Request rate configured (RPS):", float(rate)))
    lines += [
        _row("Benchmark duration (s):", r["duration"]),
        _row("Total input tokens:", r["total_input_tokens"]),
        _row("Total generated tokens:", r["total_output_tokens"]),
        _row("Request throughput (req/s):", r["request_throughput"]),
    ]
    if r["request_goodput"] is not None:
        lines.append(_row("Request goodput (req/s):", r["request_goodput"]))
    lines += [
        _row("Output token throughput (tok/s):", r["output_throughput"]),
        _row("Peak output token throughput (tok/s):", r["max_output_tokens_per_s"]),
        _row("Peak concurrent requests:", float(r["max_concurrent_requests"])),
        _row("Total token throughput (tok/s):", r["total_token_throughput"]),
    ]
    names = {"ttft": "Time to First Token", "tpot": "Time per Output Token (excl. 1st token)",
             "itl": "Inter-token Latency", "e2el": "End-to-end Latency"}
    for m, title in names.items():
        lines.append(_title(f" {title} ", "-"))
        lines.append(_row(f"Mean {m.upper()} (ms):", r[f"mean_{m}_ms"]))
        lines.append(_row(f"Median {m.upper()} (ms):", r[f"median_{m}_ms"]))
        for k, v in r.items():
            if k.startswith("p") and k.endswith(f"_{m}_ms") and k.count("_") == 2:
                lines.append(_row(f"P{k[1:].split('_')[0]} {m.upper()} (ms):", v))
    if "sessions" in r:
        lines += _session_lines(r["sessions"])
    if "spec_decode_acceptance_length" in r:
        # As vllm bench serve prints the server's spec-decode metrics.
        per_pos = ", ".join(f"{x * 100:.1f}" for x in r["spec_decode_per_position_acceptance_rate"])
        lines += [_title(" Speculative Decoding ", "-"),
                  _row("Acceptance rate (%):", r["spec_decode_acceptance_rate"] * 100),
                  _row("Acceptance length:", r["spec_decode_acceptance_length"]),
                  _row("Drafts:", r["spec_decode_num_drafts"]),
                  _row("Draft tokens:", r["spec_decode_num_draft_tokens"]),
                  _row("Accepted tokens:", r["spec_decode_num_accepted_tokens"]),
                  _row("Per-position acceptance (%):", per_pos)]
    lines.append(_title(" Engine ", "-"))
    kv = r["kv_cache"]
    lines += [
        _row("GPUs:", r["num_gpus"]),
        _row("KV-cache blocks per replica:", kv["num_gpu_blocks"]),
        _row("KV-cache capacity (tokens):", kv["num_kv_tokens"]),
        _row("GPU busy fraction (a step running):", r["gpu_busy_fraction"]),
    ]
    limits = r["limits"]
    lines += [
        _row("Mean batch / max_num_seqs:", f"{r['mean_batch_seqs']:.1f} / "
                                           f"{limits['max_num_seqs']}"),
        _row("Mean tokens per step / budget:", f"{r['mean_batch_tokens']:.0f} / "
                                               f"{limits['max_num_batched_tokens']}"),
        _row("Time at an engine limit (saturated):", r["saturated_fraction"]),
    ]
    lines += [
        _row("Mean / max KV-cache usage:", f"{r['mean_kv_cache_usage']:.2f} / "
                                           f"{r['max_kv_cache_usage']:.2f}"),
        _row("Preemptions:", r["total_preemptions"]),
    ]
    if "cluster" in r and "kv_tier" in r["cluster"]:
        lines.append(_row("Prefix-cache hit rate, local / KV tier:",
                          f"{r['prefix_cache_hit_rate']:.2f} / "
                          f"{r['external_kv_hit_rate']:.2f}"))
    else:
        lines.append(_row("Prefix-cache hit rate:", r["prefix_cache_hit_rate"]))
    lines += [
        _row("Mean queueing delay (ms):", r["mean_queue_ms"]),
        _row("Output throughput per GPU (tok/s):", r["output_throughput_per_gpu"]),
    ]
    run = as_run(r)     # read once, for the attribution and the explanation
    attribution = attribute(run)
    if r["completed"]:
        lines += _wrap(f"Engine load: {engine_load_text(attribution.signals)}.")
    if "envelope" in r:
        lines += render_envelope(r)
    lines += render_explanation(run, attribution)
    lines.append(_title(" Provenance ", "-"))
    unc = p["step_time_relative_uncertainty"]
    version = p["profile_version"]
    lines.append(f"{p['profile_label']}: {p['compute_profile']}"
                 f"{f' {version}' if version and version != 'reference' else ''} "
                 f"(step times +/-{unc:.0%})")
    kind = p.get("compute_kind", "")
    if "(auto: " in kind:
        lines += _wrap("compute.kind " + kind.replace("(auto: ", "(the default, auto: "))
    if p["calibrated"] and p["reference_fallbacks"]:
        lines += _wrap("Not from the profile: " + "; ".join(p["reference_fallbacks"]) + ".")
    if p["calibrated"] and p["assumed_parts"]:
        lines += _wrap("Derived or declared: " + "; ".join(p["assumed_parts"]) + ".")
    lines.append(f"seed {p['seed']}, {p['engine_semantics']}, simcore {p['simulator_version']}")
    lines.append("=" * _LINE)
    return "\n".join(lines)
