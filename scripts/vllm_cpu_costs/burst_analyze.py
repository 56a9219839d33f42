"""Figures from a `burst_measure.py` output: the client's beside the engine-paced ones (what a
client would see from a server that takes no time), admissions, chunks per request.

    python burst_analyze.py OUT.json [OUT2.json ...]

Engine log rows: (end monotonic, tokens sampled, prefill tokens, admitted this step, first tokens this step).
The first steps belong to vllm bench serve's single-request ready check (same output length);
the burst starts with the next step that admits requests.
First send S: not recorded by the script; bounded below by (a) the test request's last engine step end
(the client sends the burst only after receiving it) and (c) the last engine step end less the
client's duration; S is taken as the larger. (b) max_k(E_(k) - ttft_(k)) over sorted first-token
times is reported only: each request's send differs, so it bounds nothing.
"""
import json
import sys

import numpy as np


def stats(xs):
    xs = np.asarray(xs, dtype=float)
    return dict(mean=1e3 * xs.mean(), median=1e3 * np.median(xs), p99=1e3 * np.percentile(xs, 99), n=len(xs))


def main(path):
    d = json.load(open(path))
    o = d["options"]
    a, b, c = o["step_a"], o["step_b"], o["step_c"]
    L = o["output_len"]
    log = d["engine_steps"]
    # test request: step 0 admits it; burst starts at next step with admissions
    k0 = next(i for i in range(1, len(log)) if log[i][3] > 0)
    test, burst = log[:k0], log[k0:]
    cl = d["client"]
    ttfts = d["client_ttfts_s"]
    itls = d["client_itls_s"]
    ends = [s[0] for s in burst]
    firsts = []
    for i, s in enumerate(burst):
        firsts += [i] * s[4]
    E_first_sorted = sorted(ends[i] for i in firsts)
    lb_a = test[-1][0]
    lb_b = max(e - t for e, t in zip(E_first_sorted, sorted(ttfts)))
    lb_c = ends[-1] - cl["duration"]
    S = max(lb_a, lb_c)  # lb_b is NOT a valid bound (client st_i differ per request); reported only
    # reconstruct running count before each burst step to get declared step times
    running = 0
    declared = []
    for i, s in enumerate(burst):
        running += s[3]
        declared.append(a + b * running + c * s[2])
        if i - (L - 1) >= 0:
            running -= burst[i - (L - 1)][4]
    gaps = [e2 - e1 for e1, e2 in zip(ends, ends[1:])]
    over = [g - dcl for g, dcl in zip(gaps, declared[1:])]
    adm_steps = [i for i, s in enumerate(burst) if s[3] > 0]
    fa, la = adm_steps[0], adm_steps[-1]
    # engine-paced per request
    e_ttft = [ends[i] - S for i in firsts]
    e_tpot, e_itl, e_itl0 = [], [], []
    for i in firsts:
        seq = ends[i:i + L]
        e_tpot.append((seq[-1] - seq[0]) / (L - 1))
        g = [y - x for x, y in zip(seq, seq[1:])]
        e_itl += g
        e_itl0 += [0.0] + g
    n_itl = [len(x) for x in itls]
    itl_rest = [v for x in itls for v in x[1:]]
    itl_first = [x[0] for x in itls if x]
    c_tpot = [sum(x) / (len(x) - 1) if len(x) > 1 else None for x in itls]  # approx: role->tok1 ~0
    out = {
        "file": path,
        "client": {k: cl[k] for k in ("duration", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms",
                                      "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms",
                                      "mean_itl_ms", "median_itl_ms", "p99_itl_ms")},
        "client_ttft_min_max_s": [min(ttfts), max(ttfts)],
        "client_itl_entries_per_request": {str(k): n_itl.count(k) for k in sorted(set(n_itl))},
        "client_first_itl_entry_ms (role chunk->token 1)": stats(itl_first),
        "client_itl_excluding_first_entry_ms": stats(itl_rest),
        "client_itl_entries_lt_1ms_excl_first": sum(1 for v in itl_rest if v < 1e-3),
        "client_itl_entries_lt_0.2ms_excl_first": sum(1 for v in itl_rest if v < 2e-4),
        "engine_script_summary": d["engine"],
        "test_request_steps": len(test),
        "burst_steps": len(burst),
        "burst_max_seqs_sampled": max(s[1] for s in burst),
        "send_S_lower_bounds_s_after_test_end": {"a_test_end": 0.0, "b_sorted_ttft(invalid, info only)": lb_b - lb_a,
                                                 "c_duration": lb_c - lb_a},
        "first_admission": {"step": fa, "admitted": burst[fa][3], "step_end_after_S_s": ends[fa] - S,
                            "step_start_after_S_s(end-declared)": ends[fa] - declared[fa] - S},
        "last_admission": {"step": la, "admitted": burst[la][3], "step_end_after_S_s": ends[la] - S,
                           "prev_step_end_after_S_s": (ends[la - 1] - S) if la > 0 else None},
        "admission_steps": [(i, burst[i][3], round(ends[i] - S, 4)) for i in adm_steps][:40],
        "n_admission_steps": len(adm_steps),
        "engine_last_step_after_S_s": ends[-1] - S,
        "burst_step_gap_ms": stats(gaps) if gaps else None,
        "step_gap_minus_declared_ms": stats(over) if over else None,
        "engine_paced_ttft_ms": stats(e_ttft),
        "engine_paced_tpot_ms": stats(e_tpot),
        "engine_paced_itl_ms": stats(e_itl),
        "engine_paced_itl_with_leading_zero_ms (as client counts)": stats(e_itl0),
        "client_minus_engine_ttft_sorted_ms": stats([t - (e - S) for e, t in zip(E_first_sorted, sorted(ttfts))]),
        "peak_first_tokens_step": max(s[4] for s in burst),
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    for p in sys.argv[1:]:
        main(p)
