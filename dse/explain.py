"""Plain-word explanation of a simulated configuration: what limits it, by how much, on what basis.

Light by design (no Ray, Optuna or plotting imports): search trials and `dse simulate` call it
on every result.
"""

from __future__ import annotations

from collections.abc import Mapping

from simcore.attribution import Attribution, Factor, as_run, attribute
from simcore.result import RunResult


def pct(x: float | None) -> str:
    """A fraction as a whole percentage, as sentences print it: 0.315 -> "32%", 0.001 -> "<1%"."""
    x = x or 0.0
    return "<1%" if 0 < x < 0.005 else f"{x * 100:.0f}%"


def _weights_are_8bit(run: RunResult) -> bool:
    """Whether the run's weights were 8-bit or narrower (`provenance.weight_dtype`; a result
    written without it: its roofline profile's id, which ends in the weight dtype)."""
    dtype = run.provenance.get("weight_dtype")
    if dtype is None:
        dtype = str(run.provenance["compute_profile"]).rsplit("/", 1)[-1]
        return "fp8" in dtype or "int8" in dtype
    return dtype not in ("bf16", "fp16")


def _queue_clause(s: Mapping) -> str:
    return f"{pct(s['queue_fraction_of_ttft'])} of TTFT is queueing"


def engine_load_text(s: Mapping) -> str:
    """How hard the engine works, in words (the `engine_load` signal with its numbers):
    "saturated" only when requests waited at an engine limit for most of the busy time,
    otherwise how full the running steps were."""
    state = s["engine_load"]
    cap = s["max_num_seqs"]
    batch = (f"mean {s['mean_batch_seqs']:.0f}, peak {s['max_num_running']} of max_num_seqs "
             f"{cap} sequences; KV cache at most {pct(s['max_kv_cache_usage'])}"
             if cap is not None else f"mean batch {s['mean_batch_seqs']:.0f} sequences")
    sat = s["saturated_fraction_of_busy"]
    if state == "saturated":
        return (f"saturated: requests waited at an engine limit in {pct(sat)} of its busy "
                f"time ({batch})")
    waited = (f"; requests waited at an engine limit in {pct(sat)} of its busy time"
              if sat >= 0.05 else "")
    if state == "idle":
        return f"idle {pct(s['idle_fraction'])} of the time ({batch}){waited}"
    how = "at low batch" if state == "low_batch" else "below its limits"
    return (f"running continuously (a step {pct(s['gpu_busy_fraction'])} of the time) {how} "
            f"({batch}), not saturated{waited}")


def _saturated(s: Mapping) -> bool:
    return s["engine_load"] == "saturated"


def _underloaded(s: Mapping, f: Factor, a: Attribution) -> list[str]:
    first = (f"The offered load is the limit: the GPUs are idle {pct(s['idle_fraction'])} of the "
             f"time (busy {pct(s['gpu_busy_fraction'])}) and the batch peaked at "
             f"{s['max_num_running']} of max_num_seqs {s['max_num_seqs']}.")
    if s["queue_fraction_of_ttft"] >= 0.3:
        second = (f"The configuration has headroom for more traffic, though bursts still make "
                  f"{_queue_clause(s)}.")
    else:
        second = (f"The configuration has headroom: it could take more traffic or serve this "
                  f"load with fewer GPUs; {_queue_clause(s)}.")
    return [first, second]


def _decode(s: Mapping, f: Factor, a: Attribution) -> list[str]:
    dec = pct(s["decode_fraction_of_busy"])
    peak, cap = s["max_num_running"], s["max_num_seqs"]
    load = engine_load_text(s)
    if s["decode_memory_bound"]:
        first = (f"Decode is bound by HBM bandwidth: {dec} of the busy time is in decode-only "
                 f"steps and {pct(s['memory_bound_step_fraction'])} of steps are "
                 f"memory-bound, with the engine {load}; {_queue_clause(s)}.")
        remedy = "more GPUs (TP)" if s["weights_8bit"] else "more GPUs or fp8 weights"
        if not _saturated(s):
            second = (f"HBM bandwidth sets each step's time, hence TPOT; the engine is not "
                      f"saturated and could take more traffic, and {remedy} would shorten its "
                      f"steps.")
        elif cap is not None and peak < cap:
            second = (f"Raising max_num_seqs would not help (the batch peaked at {peak} of "
                      f"{cap}); {remedy} would.")
        else:
            second = (f"The batch reached max_num_seqs ({cap}); {remedy} would shorten each "
                      f"step, and a larger max_num_seqs would raise throughput at some cost to "
                      f"TPOT.")
    else:
        first = (f"Decode is compute-bound: {dec} of the busy time is in decode-only steps and "
                 f"{pct(s['compute_bound_step_fraction'])} of steps are compute-bound, with "
                 f"the engine {load}; {_queue_clause(s)}.")
        if not _saturated(s):
            second = ("Compute sets each step's time, hence TPOT; the engine is not saturated "
                      "and could take more traffic, and more GPUs (TP) would shorten its steps.")
        else:
            second = ("More GPUs (TP or replicas) would help; a smaller max_num_seqs would cut "
                      "TPOT at some cost to throughput.")
    return [first, second]


def _prefill(s: Mapping, f: Factor, a: Attribution) -> list[str]:
    pre = pct(s["prefill_fraction_of_busy"])
    load = engine_load_text(s)
    if s["prefill_memory_bound"]:
        first = (f"Prefill is bound by HBM bandwidth: {pre} of the busy time is in steps that "
                 f"carry prefill, yet only {pct(s['compute_bound_step_fraction'])} of steps are "
                 f"compute-bound, with the engine {load}; {_queue_clause(s)}.")
        remedy = (f"larger prefill chunks (max_num_batched_tokens, now "
                  f"{s['max_num_batched_tokens']}) would put the GPU's compute to use")
    else:
        first = (f"Prefill compute limits it: {pre} of the busy time is in steps that carry "
                 f"prefill and {pct(s['compute_bound_step_fraction'])} of steps are "
                 f"compute-bound, with the engine {load}; {_queue_clause(s)}.")
        remedy = (f"more GPUs (TP or replicas) or more prefix-cache hits (now "
                  f"{pct(s['prefix_cache_hit_rate'])}) would help")
        share = s["prefill_compute_bound_share"]
        if share is not None and share >= 0.5:
            remedy += (f"; a larger token budget would not, as {pct(share)} of prefill time is "
                       f"already compute-bound")
    if _saturated(s):
        second = remedy[0].upper() + remedy[1:] + "."
    else:
        second = f"The engine could take more traffic; for shorter TTFT, {remedy}."
    return [first, second]


def _kv(s: Mapping, f: Factor, a: Attribution) -> list[str]:
    n = s["total_preemptions"]
    pre = (f"{n} preemptions hit {pct(s['preempted_request_fraction'])} of requests" if n
           else "no request was preempted")
    first = (f"KV-cache capacity limits it: requests waited for KV blocks in "
             f"{pct(s['steps_waiting_for_kv_fraction'])} of steps, {pre}, and the cache peaked "
             f"at {pct(s['max_kv_cache_usage'])} of its {s['num_gpu_blocks']} blocks; "
             f"{_queue_clause(s)}.")
    second = ("More KV blocks would help: an fp8 KV cache, more TP, a larger "
              "gpu_memory_utilization, or a shorter max_model_len.")
    return [first, second]


def _max_num_seqs(s: Mapping, f: Factor, a: Attribution) -> list[str]:
    first = (f"The scheduler limit max_num_seqs ({s['max_num_seqs']}) caps the batch: it was "
             f"full with requests waiting in {pct(s['steps_waiting_at_max_num_seqs_fraction'])} "
             f"of steps, and {_queue_clause(s)}.")
    usage = s["max_kv_cache_usage"] or 0.0
    if usage < 0.9:
        second = (f"The KV cache peaked at only {pct(usage)}, so raising max_num_seqs would let "
                  f"more requests run at once.")
    else:
        second = (f"The KV cache already peaked at {pct(usage)}, so raising max_num_seqs needs "
                  f"more KV blocks as well.")
    return [first, second]


def _token_budget(s: Mapping, f: Factor, a: Attribution) -> list[str]:
    full = s["steps_waiting_at_token_budget_fraction"]
    mem = s["steps_waiting_at_token_budget_memory_bound_fraction"]
    share = mem / full if full > 0 else 0.0
    first = (f"The token budget (max_num_batched_tokens {s['max_num_batched_tokens']}) caps each "
             f"step: it was used up with requests waiting in {pct(full)} of steps, "
             f"{pct(share)} of them not compute-bound; {_queue_clause(s)}.")
    second = "Raising max_num_batched_tokens would admit prompts faster at little cost per step."
    return [first, second]


def _communication(s: Mapping, f: Factor, a: Attribution) -> list[str]:
    g = s["gpus_per_replica"]
    across = f" across {g} GPUs per replica" if g else ""
    first = (f"Communication limits it: TP all-reduce takes "
             f"{pct(s['communication_fraction_of_busy'])} of busy time{across}, and "
             f"{pct(s['communication_bound_step_fraction'])} of steps are communication-bound, "
             f"with the engine {engine_load_text(s)}.")
    second = "Less TP with more replicas, or a faster interconnect, would cut it."
    return [first, second]


def _fabric(s: Mapping, f: Factor, a: Attribution) -> list[str]:
    share = s["network_share_of_request_latency"]
    lat = f", {pct(share)} of request latency" if share is not None else ""
    first = (f"Communication across nodes limits it: {pct(s['fabric_fraction_of_comm'])} of the "
             f"exposed communication ({pct(s['communication_fraction_of_busy'])} of busy time"
             f"{lat}) waits on the fabric.")
    second = ("Keeping the chattiest collectives inside a node (TP within nodes, PP or EP "
              "across them), faster NICs, or overlapping communication with compute would cut "
              "it.")
    return [first, second]


def _congestion(s: Mapping, f: Factor, a: Attribution) -> list[str]:
    first = (f"Network congestion limits it: {pct(s['congestion_fraction_of_fabric'])} of the "
             f"fabric time is queueing beyond what the transfers need alone on the network "
             f"(DCQCN rate cuts {s['dcqcn_rate_cuts']}, PFC pauses {s['pfc_pause_frames']}, "
             f"drops {s['fabric_drops']}).")
    second = ("Less oversubscription, separating competing traffic, or tuned ECN/DCQCN "
              "settings would cut it.")
    return [first, second]


def _arrived(s: Mapping) -> str:
    """How the run's requests arrived: all at once, or over how long."""
    n, span = s["num_requests"], s["arrival_span_s"]
    return (f"all {n} requests arrived at once" if not span
            else f"{n} requests arrived over {span:.1f} s")


def _queueing(s: Mapping, f: Factor, a: Attribution) -> list[str]:
    q = pct(s["queue_fraction_of_ttft"])
    wait = f"mean {s['mean_queue_ms']:.0f} of {s['mean_ttft_ms']:.0f} ms"
    if s["overload_fraction"] >= 0.2 and s["serve_span_s"] is not None:
        first = (f"Queueing limits it: arrivals outpace service ({_arrived(s)} but took "
                 f"{s['serve_span_s']:.1f} s to serve) and {q} of TTFT is spent waiting ({wait}).")
    else:
        first = (f"Queueing limits it: {q} of TTFT is spent waiting to be scheduled ({wait}) "
                 f"with the engine {engine_load_text(s)}.")
    rest = [x for x in a.factors if x.key != "queueing"]
    nxt = rest[0] if rest else None
    if nxt is None or nxt.key == "underloaded":
        second = (f"The GPU is idle {pct(s['idle_fraction'])} of the time, so the wait comes "
                  f"from bursts; more replicas would absorb them.")
    else:
        second = (f"Service capacity is set by {nxt.label}, which scores {nxt.score:.2f}; "
                  f"more replicas or a faster configuration would cut the wait.")
    return [first, second]


def _api_server(s: Mapping, f: Factor, a: Attribution) -> list[str]:
    first = (f"The API server limits TTFT: {pct(s['api_server_wait_fraction_of_ttft'])} of it "
             f"(mean {s['mean_api_server_wait_ms']:.0f} of {s['mean_ttft_ms']:.0f} ms) is "
             f"waiting on the API server before the engine sees the request "
             f"({_arrived(s)}; a process tokenizes prompts one at a time and shares its "
             f"event loop among the requests it works on, "
             f"{s['mean_api_server_ms'] - s['mean_api_server_wait_ms']:.0f} ms of work each).")
    second = ("More API server processes (vllm serve --api-server-count, "
              "host.api_server_count) would cut it; a faster engine would not.")
    return [first, second]


_SENTENCES = {
    "underloaded": _underloaded, "decode_compute": _decode, "prefill_compute": _prefill,
    "kv_cache_capacity": _kv, "scheduler_max_num_seqs": _max_num_seqs,
    "scheduler_token_budget": _token_budget, "communication": _communication,
    "fabric_communication": _fabric, "network_congestion": _congestion, "queueing": _queueing,
    "api_server": _api_server,
}

def assumptions(result: RunResult | Mapping) -> list[str]:
    """What the result and its explanation rest on, in plain words, the profile's caveat first.

    For an uncalibrated profile the first item says so with its error bound; provenance items
    that only restate it are folded into that one.
    """
    prov = as_run(result).provenance
    items = list(prov["assumptions"])
    out: list[str] = []
    if not prov["calibrated"]:
        unc = prov["step_time_relative_uncertainty"]
        bound = f"+/-{unc:.0%}" if unc is not None else "error unknown"
        profile = prov["compute_profile"]
        of = f" {profile}" if profile else ""
        out.append(f"uncalibrated reference profile ({bound}): step times from{of} and every "
                   f"figure built on them are estimates, not measurements")
        items = [a for a in items if "uncalibrated reference profile" not in a]
    return out + items


def explain(result: RunResult | Mapping, attribution: Attribution | None = None) -> dict:
    """Why `result` (a RunResult or `simulate()` dict) performs as it does, in one or two
    sentences.

    Returns `bottleneck` (the top factor's key, None when no request completed), `label` (its
    plain-word name), `sentences` (one or two, with the numbers behind them), `factors` (every
    factor ranked, as dicts with key, label, score and numbers) and `assumptions`.
    `attribution` is `attribute(result)` when the caller has it already.
    """
    run = as_run(result)
    a = attribution if attribution is not None else attribute(run)
    factors = [f.as_dict() for f in a.factors]
    if not run.metric("completed"):
        reasons = run.metric("num_failed_by_error")
        why = f" (first reason: {next(iter(reasons))})" if reasons else ""
        return {"bottleneck": None, "label": None,
                "sentences": [f"No request completed: all {run.metric('failed')} failed{why}; "
                              f"there is nothing to attribute."],
                "factors": factors, "assumptions": assumptions(run)}
    top = a.top
    s = dict(a.signals)
    s["num_requests"] = run.metric("num_requests")
    s["weights_8bit"] = _weights_are_8bit(run)
    h = run.headroom
    load = [headroom_sentence(h)] if h else []
    return {"bottleneck": top.key, "label": top.label,
            "load_state": h["state"] if h else None,
            "sentences": load + _SENTENCES[top.key](s, top, a),
            "factors": factors, "assumptions": assumptions(run)}


def headroom_sentence(h: Mapping) -> str:
    """Where the offered load stands against the measured throughput capacity
    (`simcore.saturation.headroom`), and what binds first as load rises."""
    cap = f"{h['throughput_capacity_rps']:,.3g} req/s"
    if h.get("capacity_run_replicas_scaled_to"):
        cap += (f" (one replica measured on the analytical fabric, times "
                f"{h['capacity_run_replicas_scaled_to']})")
    elif h.get("capacity_run_fabric"):
        cap += f" (measured on the {h['capacity_run_fabric']} fabric)"
    rate = f"{h['offered_rps']:,.3g} req/s"
    full = ("the engines full" if not h.get("capacity_run_client_cap") else
            f"the client's {h['capacity_run_client_cap']} requests in flight")
    if h["state"] == "over_capacity":
        growth = h["queue_growth_rps"]
        grows = (f"the queue grows {growth:,.3g} req/s (served {h['served_rps']:,.3g}), so "
                 f"latency percentiles grow with the run's length" if growth and growth > 0
                 else "requests queue faster than they are served")
        return (f"Over capacity: {rate} offered against a capacity of {cap} with {full}; "
                f"{grows}. The capacity is set by {h['binds_first_label']}.")
    if h["state"] == "near_capacity":
        return (f"Near capacity: {rate} offered is {pct(h['load_fraction'])} of the {cap} it "
                f"serves with {full}, where queueing delay climbs steeply; "
                f"{h['binds_first_label']} binds first.")
    filling = (f" Its queue still grew {h['queue_growth_rps']:,.3g} req/s over the second half "
               f"of the arrivals: at {pct(h['load_fraction'])} of the capacity that is the run "
               f"filling from empty, not overload; a longer run (more prompts) shows the steady "
               f"state." if h.get("still_filling") else "")
    return (f"Headroom: {rate} offered is {pct(h['load_fraction'])} of the {cap} it serves "
            f"with {full}; as load rises, {h['binds_first_label']} binds first."
            + filling)
