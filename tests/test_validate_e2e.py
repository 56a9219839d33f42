"""The end-to-end validation set: its rows, how each becomes a simulation, the declared split,
and the held-out statistics `dse validate --suite end_to_end` reports."""

import json

import numpy as np
import pytest

from dse.validate_e2e import (
    FAMILIES, GUARDS, OFFLINE_TOOLS, Outcome, case_config, load_cases, load_rows, predict,
    predict_with_tails, row_case, run_case, source_intervals, split_of, summarize, evaluate)
from dse.validate_loads import (
    OFFLINE_DRAWS, eos_hazard, eos_output_lengths, sharegpt_first_turns, sharegpt_tokenizer)
from simcore.host import FITTED
from simcore.uncertainty import is_tail_family, tail_family

FORBIDDEN = ("github.com/ROCm/vllm", "benchmark_vllm_060", "LambdaLabsML/vllm-benchmark",
             "vllm-project/vllm/issues/12315")


@pytest.fixture(scope="module")
def cases():
    return load_cases()


def test_every_row_cites_a_source_and_none_is_reserved():
    rows = load_rows()
    assert len(rows) >= 70
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids))
    for r in rows:
        src = r["source"]
        assert src["url"].startswith("https://") and src["quote"], r["id"]
        assert not any(f.lower() in src["url"].lower() for f in FORBIDDEN), r["id"]


def test_cases_and_skips_cover_every_row(cases):
    ok, skipped = cases
    assert len(ok) + len(skipped) == len(load_rows())
    assert len(ok) >= 40
    assert all(reason for _, reason in skipped)
    fams = {f for c in ok for f in c.measured}
    assert fams == set(FAMILIES)


def test_the_split_is_declared_by_the_id_hash_and_used_by_the_fit(cases):
    ok, _ = cases
    assert {c.split for c in ok} == {"fit", "held_out"}
    for c in ok:
        assert c.split == split_of(c.id)
    fitted = json.loads(FITTED.read_text())
    fit = {c.id for c in ok if c.split == "fit"}
    # the fit took fit cases only; rows added since wait for the next fit (reported by
    # dse validate's fit-part row)
    assert set(fitted["fit_cases"]) <= fit
    assert len(fitted["fit_cases"]) >= 28
    # the families', and the p99 TTFT's and TPOT's apart (the tails' envelopes)
    assert set(fitted["residuals"]) == set(FAMILIES) | {tail_family(f)
                                                        for f in ("ttft", "tpot", "itl")}


def test_the_envelopes_residuals_are_cross_validated_over_folds_of_whole_sources(cases):
    """Each fit case is in exactly one fold, the fold of its source; every fit measurement has
    one out-of-sample residual."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts/fit_host_overheads.py"
    spec = importlib.util.spec_from_file_location("fit_host_overheads", path)
    fit_script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fit_script)
    ok, _ = cases
    fitted = json.loads(FITTED.read_text())
    fit = {c.id: c for c in ok if c.split == "fit" and c.id in fitted["fit_cases"]}
    folds = fitted["cv_folds"]
    seen = [i for f in folds.values() for i in f["cases"]]
    assert sorted(seen) == sorted(fit) == sorted(fitted["fit_cases"])
    for f, fold in folds.items():
        assert {fit_script.cv_fold(fit[i]) for i in fold["cases"]} == {int(f)}
        assert set(fold["parameters"]) == set(fitted["parameters"])
    by_source: dict[str, set[int]] = {}
    for c in fit.values():
        by_source.setdefault(c.source, set()).add(fit_script.cv_fold(c))
    assert all(len(v) == 1 for v in by_source.values())
    for fam, q in fitted["residuals"].items():
        if is_tail_family(fam):
            n = sum(fam.removesuffix("_p99") in c.p99_ms for c in fit.values())
        else:
            n = sum(fam in c.measured for c in fit.values())
        assert q["n"] == n == len(q["values"]), fam


def test_a_latency_row_is_one_batch_of_fixed_lengths():
    row = next(r for r in load_rows() if r["id"] == "bk9555-latency-llama8B_tp1-h100")
    c = row_case(row)
    w = c.config["workload"]
    assert w["num_prompts"] == 8 and w["request_rate"] == "inf"
    assert w["dataset"] == {"kind": "random", "input_len": 32, "output_len": 128}
    assert c.keys == {"e2e": "duration"} and c.measured["e2e"] == pytest.approx(0.9975, rel=1e-3)
    assert c.config["hardware"]["gpu"] == "H100-SXM"


def test_a_serving_row_takes_the_measured_mean_lengths(tmp_path):
    row = next(r for r in load_rows()
               if r["id"] == "gpustack-qwen3-235b-a22b-bf16-tp8-h100sxm-rand4000x200")
    c = row_case(row)
    extra = row["metrics"]["extra"]
    ds = c.config["workload"]["dataset"]
    assert ds["input_len"] == round(extra["total_input_tokens"] / extra["successful_requests"])
    assert ds["output_len"] == round(extra["total_generated_tokens"] /
                                     extra["successful_requests"])
    # Its outputs stopped at the end of sequence (no --ignore-eos, 184.4 of at most 200): drawn
    # with the measured mean; the dataset stays to say what the benchmark sent.
    assert not row["benchmark"]["ignore_eos"] and ds["kind"] == "random"
    prompts, outputs = c.lengths
    assert set(prompts) == {ds["input_len"]} and len(outputs) == len(prompts)
    assert np.mean(outputs) == pytest.approx(extra["total_generated_tokens"] /
                                             extra["successful_requests"], abs=0.5)
    assert max(outputs) == 200 and min(outputs) >= 1
    assert any("end of sequence" in n for n in c.notes)
    assert case_config(c, tmp_path).workload.dataset.kind == "custom"
    share = next(r for r in load_rows()
                 if r["id"] == "gpustack-qwen3-8b-bf16-tp1-h100sxm-sharegpt100-conc4")
    s = row_case(share)
    prompts, outputs = s.lengths
    extra = share["metrics"]["extra"]
    done = extra["successful_requests"]
    assert len(prompts) == len(outputs) == 100
    assert sum(prompts) / len(prompts) == pytest.approx(extra["total_input_tokens"] / done,
                                                         rel=0.02)
    assert sum(outputs) / len(outputs) == pytest.approx(extra["total_generated_tokens"] / done,
                                                        rel=0.02)
    assert any("scaled to the measured means" in n for n in s.notes)
    # the shape is the first turns vLLM's sampler draws in Qwen3's counts, scaled by one factor
    # per column
    assert sharegpt_tokenizer(share["model"]["name"]) == "qwen3"
    drawn_p, drawn_o = sharegpt_first_turns(100, tokenizer="qwen3")
    assert np.corrcoef(prompts, drawn_p)[0, 1] > 0.999
    assert np.corrcoef(outputs, drawn_o)[0, 1] > 0.999
    cfg = case_config(s, tmp_path)
    assert cfg.workload.dataset.kind == "custom" and cfg.workload.max_concurrency == 4
    assert not cfg.workload.dataset.shuffle


def test_outputs_that_stop_at_the_end_of_sequence_spread_with_a_constant_hazard():
    for mean, cap in ((105.9, 200), (182.0, 200), (83.0, 100), (3.0, 4)):
        h = eos_hazard(mean, cap)
        assert (1 - (1 - h) ** cap) / h == pytest.approx(mean, rel=1e-9)
        lengths = np.array(eos_output_lengths(1000, mean, cap))
        assert lengths.min() >= 1 and lengths.max() == cap
        assert lengths.mean() == pytest.approx(mean, rel=0.01)
        # the share that reaches the cap is the law's, (1 - h)^(cap - 1)
        assert (lengths == cap).mean() == pytest.approx((1 - h) ** (cap - 1), abs=0.002)
    # the same draw for the same seed, in another order for another
    assert eos_output_lengths(50, 30.0, 64) == eos_output_lengths(50, 30.0, 64)
    other = eos_output_lengths(50, 30.0, 64, seed=1)
    assert other != eos_output_lengths(50, 30.0, 64)
    assert sorted(other) == sorted(eos_output_lengths(50, 30.0, 64))


def test_rows_run_with_ignore_eos_keep_one_output_length():
    kept = 0
    for r in load_rows():
        b = r.get("benchmark") or {}
        if b.get("dataset") == "random" and b.get("ignore_eos"):
            c = row_case(r)
            if not isinstance(c, str):
                assert not c.draws and c.config["workload"]["dataset"]["kind"] == "random"
                kept += 1
    assert kept >= 1


def test_sharegpt_first_turns_follow_vllms_sampler():
    """random.seed(0); random.shuffle; the first n valid rows: on the shipped rows, the totals
    scripts/sharegpt_first_turn/derive.py --shuffle-seed 0 printed for the first 1,000."""
    prompts, outputs = sharegpt_first_turns(1000)
    assert (int(prompts.sum()), int(outputs.sum())) == (231_196, 188_987)
    assert all(4 <= p <= 1024 and o >= 4 and p + o <= 2048 for p, o in zip(prompts, outputs))
    p200, o200 = sharegpt_first_turns(200)
    assert (p200 == prompts[:200]).all() and (o200 == outputs[:200]).all()


def test_sharegpt_rows_without_token_totals_use_the_first_turns_as_they_are(cases, tmp_path):
    ok, skipped = cases
    assert not [r for _, r in skipped if "token totals" in r]
    by_id = {c.id: c for c in ok}
    llama = by_id["bk9555-throughput-llama8B_tp1-h100"]
    mixtral = by_id["bk9555-throughput-mixtral8x7B_tp2-h100"]
    serving = by_id["bk9555-serving-llama70B_tp4-sharegpt-qps1-h100"]
    drawn = [a.tolist() for a in sharegpt_first_turns(200)]
    for c in (llama, serving):
        assert [list(x) for x in c.lengths] == drawn
        assert any(n.startswith("ShareGPT first turns, Llama-3 tokenizer") for n in c.notes)
    assert not any("tokenizer differs" in n for n in llama.notes + serving.notes + mixtral.notes)
    # Mixtral's draws are its own tokenizer's counts of the same conversations
    assert sharegpt_tokenizer("mistralai/Mixtral-8x7B-Instruct-v0.1") == "mistral_v1"
    assert [list(x) for x in mixtral.lengths] == [
        a.tolist() for a in sharegpt_first_turns(200, tokenizer="mistral_v1")]
    assert any(n.startswith("ShareGPT first turns, Mistral v1 tokenizer") for n in mixtral.notes)
    assert sum(mixtral.lengths[1]) > 1.05 * sum(llama.lengths[1])     # 32k vocabulary
    assert llama.keys == {"throughput": "request_throughput"}
    assert llama.config["workload"]["request_rate"] == "inf"
    assert serving.config["workload"]["request_rate"] == 1
    cfg = case_config(serving, tmp_path)
    assert cfg.workload.num_prompts == 200 and cfg.workload.dataset.kind == "custom"


def test_an_offline_sharegpt_batch_is_predicted_by_the_median_over_its_draws(cases, tmp_path):
    """Offline ShareGPT batches carry OFFLINE_DRAWS draws (seed 0's first, each as vLLM's
    sampler draws with its seed), every other case one workload; the prediction is the median
    of the draws' simulations, and each draw is the workload its config sends."""
    ok, _ = cases
    tools = {r["id"]: r["benchmark"]["tool"] for r in load_rows()}
    offline = [c for c in ok if c.lengths is not None and tools[c.id] in OFFLINE_TOOLS]
    assert len(offline) >= 10
    for c in ok:
        assert c.num_draws() == (OFFLINE_DRAWS if c in offline else 1), c.id
    c = next(c for c in offline if c.id == "bk9555-throughput-llama8B_tp1-h100")
    assert list(map(list, c.draws[0])) == list(map(list, c.lengths))
    for seed in (0, 3):
        assert [list(x) for x in c.draws[seed]] == [a.tolist() for a in
                                                   sharegpt_first_turns(200, seed)]
    assert len({tuple(d[1]) for d in c.draws}) == OFFLINE_DRAWS
    path = case_config(c, tmp_path, draw=3).workload.dataset.path
    lines = (tmp_path / path).read_text().splitlines()
    assert [json.loads(x)["output_len"] for x in lines] == list(c.draws[3][1])
    runs = [run_case(c, draw=i)[0]["throughput"] for i in range(OFFLINE_DRAWS)]
    assert len(set(runs)) > 1
    assert predict(c)["throughput"] == pytest.approx(float(np.median(runs)), rel=1e-12)
    served = next(x for x in ok if x.id == "bk9555-serving-llama70B_tp4-sharegpt-qps1-h100")
    assert served.num_draws() == 1 and predict(served) == run_case(served)[0]
    # With its tails: the families' prediction as predict's, the printed p99s' from the run
    pred, tails = predict_with_tails(served)
    result = run_case(served)[1]
    assert pred == predict(served) and set(tails) == set(served.p99_ms)
    assert tails == {f: float(result[f"p99_{f}_ms"]) for f in served.p99_ms}


def test_every_sharegpt_row_is_represented_unless_its_model_or_gpu_is_not(cases):
    ok, skipped = cases
    represented, reasons = {c.id for c in ok}, dict(skipped)
    for row in load_rows():
        dataset = str((row.get("benchmark") or {}).get("dataset") or "")
        if "sharegpt" in dataset and row["id"] not in represented:
            assert "token totals" not in reasons[row["id"]], row["id"]
            assert "lengths" not in reasons[row["id"]], row["id"]


def test_rows_the_simulator_cannot_represent_say_why(cases):
    _, skipped = cases
    reasons = dict(skipped)
    assert "no architecture for MiniMaxAI/MiniMax-M2.5" in reasons[
        "pr34924-minimax-m25-tp4-h100-before"]
    assert "kernel profile" in reasons["recipe-ministral3-8b-tp1-mi300x"]


@pytest.mark.slow
def test_held_out_statistics_stay_within_their_regression_bounds(cases):
    ok, _ = cases
    outcomes = [evaluate(c) for c in ok if c.split == "held_out"]
    stats = summarize(outcomes)
    for fam, st in stats.items():
        g = GUARDS[fam]
        assert st["median_abs"] <= g["median_abs"], (fam, st)
        assert abs(st["median_signed"]) <= g["median_signed"], (fam, st)
        assert 1 - st["coverage"] <= g["outside"], (fam, st)


def test_the_held_out_statistics_carry_an_interval_over_resamples_of_their_sources():
    """A page or CI build measures several cases whose errors go together: the interval
    resamples whole sources, so one source's cases move as one."""
    errs = [0.1, 0.1, 0.1, -0.3, 0.05, 0.2]
    cov = [True, True, True, False, True, True]
    srcs = ["a", "a", "a", "b", "c", "d"]
    iv = source_intervals(errs, cov, srcs)
    assert iv == source_intervals(errs, cov, srcs)          # deterministic for a seed
    lo, hi = iv["median_abs"]
    assert lo <= float(np.median(np.abs(errs))) <= hi and lo < hi
    lo, hi = iv["coverage"]
    assert 0.0 <= lo < np.mean(cov) <= hi == 1.0
    # One source: every resample is the set itself.
    one = source_intervals(errs, cov, ["a"] * len(errs))
    assert one["median_signed"] == (pytest.approx(0.1), pytest.approx(0.1))
    # Cases that share a source resample together: a resample's median is one source's or
    # both's, never a mix of single cases.
    same = source_intervals([0.1] * 3 + [0.3] * 3, [True] * 6, ["a"] * 3 + ["b"] * 3)
    assert all(min(abs(v - m) for m in (0.1, 0.2, 0.3)) < 1e-12 for v in same["median_abs"])


def test_offline_benchmarks_run_without_an_api_server_and_serving_ones_with_it(cases):
    ok, _ = cases
    tools = {r["id"]: r["benchmark"]["tool"] for r in load_rows()}
    for c in ok:
        offline = (c.config.get("host") or {}).get("entrypoint") == "offline"
        assert offline == (tools[c.id] in OFFLINE_TOOLS), c.id
        assert offline == (tools[c.id] in ("benchmark_latency.py", "benchmark_throughput.py",
                                           "vllm bench latency", "vllm bench throughput")), c.id
    assert any(tools[c.id] == "benchmark_serving.py" for c in ok)


def test_the_held_out_statistics_are_also_given_for_dense_and_moe_models_and_each_gpu_apart(
        cases):
    from dse.validate import class_rows
    from simcore.model.presets import load_preset

    ok, _ = cases
    held = [c for c in ok if c.split == "held_out"]
    # Synthetic predictions (no simulation): dense cases 10% over, MoE cases 20% under.
    outcomes = []
    for c in held:
        f = 0.8 if load_preset(c.config["model"]["name"]).is_moe else 1.1
        pred = {fam: m * f for fam, m in c.measured.items()}
        outcomes.append(Outcome(c, pred, dict(c.measured), dict(c.measured)))
    rows = {r.name: r for r in class_rows(outcomes, "src")}
    totals = summarize(outcomes)
    for fam, st in totals.items():
        parts = [rows.get(f"held-out {label} {fam}: median |error|") for label in ("dense", "MoE")]
        assert sum(r.reference for r in parts if r is not None) == st["n"]
    dense = rows["held-out dense throughput: median |error|"]
    moe = rows["held-out MoE throughput: median |error|"]
    assert dense.predicted == pytest.approx(0.1) and "+10.0%" in dense.note
    assert moe.predicted == pytest.approx(0.2) and "-20.0%" in moe.note
    assert all(r.tolerance == float("inf") for r in rows.values())
    # Each GPU apart too, the GPUs' cases adding up to the whole.
    gpus = {c.config["hardware"]["gpu"] for c in held}
    assert {"A100-80GB", "H100-SXM", "H200"} <= gpus
    for fam, st in totals.items():
        parts = [rows.get(f"held-out {gpu} {fam}: median |error|") for gpu in gpus]
        assert sum(r.reference for r in parts if r is not None) == st["n"]
    a100 = [o for o in outcomes if o.case.config["hardware"]["gpu"] == "A100-80GB"]
    row = rows["held-out A100-80GB throughput: median |error|"]
    assert row.reference == sum(1 for o in a100 if "throughput" in o.case.measured)
    # And each load apart, the loads' cases adding up to the whole.
    from dse.validate import LOADS, load_of

    assert {load_of(c) for c in held} == set(LOADS)
    for fam, st in totals.items():
        parts = [rows.get(f"held-out {load} {fam}: median |error|") for load in LOADS]
        assert sum(r.reference for r in parts if r is not None) == st["n"]
    sharegpt = [c for c in held if load_of(c) == "ShareGPT"]
    assert sharegpt and all(c.draws for c in sharegpt)
    long = [c for c in held if load_of(c) == LOADS[1]]
    assert long and all(c.config["workload"]["dataset"]["input_len"] >= 1000 for c in long)


def test_chat_benchmarks_send_chat_requests_and_vllm_0_11_0_parses_the_template_each_time(cases):
    ok, _ = cases
    rows = {r["id"]: r for r in load_rows()}
    chat = 0
    for c in ok:
        row = rows[c.id]
        quote = row["source"].get("quote") or ""
        is_chat = "openai-chat" in quote or "/v1/chat/completions" in quote
        assert (c.config["workload"].get("endpoint") == "chat_completions") == is_chat, c.id
        parse = (c.config.get("host") or {}).get("chat_template_parse")
        every = is_chat and row["vllm_version"] == "0.11.0" and "gpt-oss" not in c.id
        assert (parse == "per_request") == every, c.id
        chat += is_chat
    assert chat >= 20
    # gpt-oss goes through harmony, the others through their Hugging Face templates.
    assert any("gpt-oss" in c.id and c.config["workload"].get("endpoint") for c in ok)


def test_the_fit_part_row_counts_the_cases_the_shipped_fit_took(cases):
    from dse.validate import fit_part_row

    ok, _ = cases
    fit = [c for c in ok if c.split == "fit"]
    fitted = set(json.loads(FITTED.read_text())["fit_cases"])
    row = fit_part_row(ok)
    assert row.reference == len(fit) and row.ok
    assert row.predicted == pytest.approx(len(fitted) / len(fit))
    assert row.note.startswith(f"{len(fitted)} of {len(fit)} fit cases; "
                               f"{len(fit) - len(fitted)} added since")
    assert fit_part_row([c for c in ok if c.id in fitted or c.split != "fit"]).predicted == 1.0


def test_cases_carry_the_median_itl_their_sources_print(cases):
    ok, _ = cases
    printed = {r["id"]: ((r.get("metrics") or {}).get("extra") or {}).get("median_itl_ms")
               for r in load_rows()}
    with_itl = [c for c in ok if c.median_itl_ms is not None]
    assert len(with_itl) >= 30
    for c in ok:
        assert c.median_itl_ms == (None if printed[c.id] is None else float(printed[c.id]))


def _summary(row, n: int, median_abs: float, signed: str) -> None:
    """A check apart's summary row: over `n` cases, its median |error| and signed error."""
    assert row.reference == n and row.predicted == pytest.approx(median_abs)
    assert f"median signed {signed}" in row.note


def _apart(rows, cases, what: str, unit: str):
    """(the per-case rows, the statistics by name) of a check apart, after the checks every
    such check passes: one informational row per case with a simulated value, in order, each
    with its unit and the sources named."""
    per_case = [r for r in rows if r.error_kind == "relative"]
    assert [r.name for r in per_case] == [f"{c.id} {what}" for c in cases]
    assert all(r.unit == unit for r in per_case)
    assert all(r.tolerance == float("inf") for r in rows)
    assert all("https://" in r.source for r in rows)
    return per_case, {r.name: r for r in rows if r.error_kind == "statistic"}


def test_the_decode_step_is_checked_apart_by_simulated_batch(cases):
    from dse.validate import BATCHES, MIN_ITL_OUTPUT, decode_step_rows

    ok, _ = cases
    with_itl = [c for c in ok if c.split == "held_out" and c.median_itl_ms is not None]
    long = [c for c in with_itl if c.mean_output_tokens() >= MIN_ITL_OUTPUT][:6]
    short = [c for c in with_itl if c.mean_output_tokens() < MIN_ITL_OUTPUT]
    assert len(long) == 6 and short       # the 1,000 prompts of 4 output tokens
    # Synthetic steps (no simulation): two cases at each batch range (the first at its lower
    # edge), the simulated median ITL 10% over, then 30% under, the measured; a case without
    # a simulated step and one whose requests sample 4 tokens, both left out.
    outcomes = []
    for i, c in enumerate(long):
        batch = (4, 16, 100, 256, 400, 900)[i]
        f = 1.1 if i % 2 == 0 else 0.7
        outcomes.append(Outcome(c, {}, {}, {}, {}, (c.median_itl_ms * f, batch)))
    outcomes.append(Outcome(long[0], {}, {}, {}, {}, None))
    outcomes.append(Outcome(short[0], {}, {}, {}, {}, (short[0].median_itl_ms, 300)))
    per_case, stats = _apart(decode_step_rows(outcomes), long, "median ITL", "ms")
    assert per_case[0].reference == long[0].median_itl_ms
    assert per_case[0].error == pytest.approx(0.1)
    assert "mean batch 4.0 sequences" in per_case[0].note
    assert len(stats) == len(BATCHES)
    # Under 16: the 10% over alone (16 is the next range's); 16-255: 30% under, 10% over;
    # 256+: 30% under twice, 10% over once.
    under, mid, big = (stats[f"held-out median ITL, batch {label}: median |error|"]
                       for _, _, label in BATCHES)
    _summary(under, 1, 0.1, "+10.0%")
    _summary(mid, 2, 0.2, "-10.0%")
    _summary(big, 3, 0.3, "-30.0%")


def test_cases_carry_the_peak_output_throughput_their_sources_print(cases):
    ok, _ = cases
    printed = {r["id"]: ((r.get("metrics") or {}).get("extra") or {})
               .get("peak_output_throughput") for r in load_rows()}
    assert sum(c.peak_output_tps is not None for c in ok) >= 30
    for c in ok:
        assert c.peak_output_tps == (None if printed[c.id] is None else float(printed[c.id]))


def test_the_busiest_second_is_checked_apart_by_kv_cache_fill(cases):
    from dse.validate import KV_FULL, peak_rows

    ok, _ = cases
    with_peak = [c for c in ok if c.split == "held_out" and c.peak_output_tps is not None][:5]
    assert len(with_peak) == 5
    # Synthetic peaks (no simulation): the first two with the KV cache filled (the first at
    # `KV_FULL` exactly), 40% under and 10% over the measured; the other three not filled, 20%
    # over, 20% over and 50% under; a case without a simulated peak, left out.
    usage = (KV_FULL, 1.0, 0.5, 0.94, 0.0)
    f = (0.6, 1.1, 1.2, 1.2, 0.5)
    outcomes = [Outcome(c, {}, {}, {}, {}, None, (c.peak_output_tps * f[i], usage[i]))
                for i, c in enumerate(with_peak)]
    outcomes.append(Outcome(with_peak[0], {}, {}, {}, {}, None, None))
    per_case, stats = _apart(peak_rows(outcomes), with_peak, "peak output throughput", "tok/s")
    assert per_case[0].reference == with_peak[0].peak_output_tps
    assert per_case[0].error == pytest.approx(0.4)
    assert "peak KV-cache usage 95%" in per_case[0].note
    filled = stats["held-out peak output throughput, KV cache filled: median |error|"]
    not_filled = stats["held-out peak output throughput, KV cache not filled: median |error|"]
    _summary(filled, 2, 0.25, "-15.0%")
    _summary(not_filled, 3, 0.2, "+20.0%")


def test_sharegpt_chat_counts_in_the_models_own_tokenizer_hold_its_bos(cases):
    """DeepSeek's ShareGPT counts (its own tokenizer's) hold the BOS its template writes: one
    template token fewer is prefilled; GLM's (Llama-3's counts standing in) and random prompts
    are left as they are."""
    ok, _ = cases
    held = {c.id: c.config["model"].get("chat_template_tokens") for c in ok
            if c.config["workload"].get("endpoint") == "chat_completions"}
    ds = [i for i in held if "deepseek" in i and "sharegpt" in i]
    assert ds and all(held[i] == [1, 1] for i in ds)
    assert all(v is None for i, v in held.items() if i not in ds)


def test_cases_carry_the_p99s_their_sources_print(cases):
    ok, _ = cases
    printed = {r["id"]: r.get("metrics") or {} for r in load_rows()}
    assert sum("ttft" in c.p99_ms and "tpot" in c.p99_ms for c in ok) >= 40
    for c in ok:
        m = printed[c.id]
        for fam, key in (("ttft", "p99_ttft_ms"), ("tpot", "p99_tpot_ms"), ("itl", "p99_itl_ms")):
            v = m.get(key, (m.get("extra") or {}).get(key))     # a p99 ITL is kept in extra
            assert c.p99_ms.get(fam) == (None if v is None else float(v))
    assert sum("itl" in c.p99_ms for c in ok) >= 90
    # a printed p99 is of one run: the tails' residuals take the first draw's, the only one
    assert all(c.num_draws() == 1 for c in ok if c.p99_ms)


def test_the_tails_are_checked_apart_by_family(cases):
    from dse.validate import tail_rows

    ok, _ = cases
    both = [c for c in ok if c.split == "held_out" and {"ttft", "tpot"} <= set(c.p99_ms)][:3]
    assert len(both) == 3
    # Synthetic p99s (no simulation): TTFT 50% over, 10% under, 20% over the measured, with
    # envelopes for the first two, the measured outside the first and inside the second; TPOT
    # only for the first two, 30% under and 10% over, without envelopes; an outcome without
    # simulated p99s, left out.
    f_ttft, f_tpot = (1.5, 0.9, 1.2), (0.7, 1.1)
    env = ((1.2, 1.8), (0.5, 1.5))
    outcomes = [Outcome(c, {}, {}, {}, {}, None, None,
                        {"ttft": c.p99_ms["ttft"] * f_ttft[i],
                         **({"tpot": c.p99_ms["tpot"] * f_tpot[i]} if i < 2 else {})},
                        {"ttft": tuple(c.p99_ms["ttft"] * x for x in env[i])} if i < 2 else {})
                for i, c in enumerate(both)]
    outcomes.append(Outcome(both[0], {}, {}, {}, {}))
    rows = tail_rows(outcomes)
    per_case = [r for r in rows if r.error_kind == "relative"]
    assert [r.name for r in per_case] == [
        f"{both[0].id} p99 TTFT", f"{both[0].id} p99 TPOT", f"{both[1].id} p99 TTFT",
        f"{both[1].id} p99 TPOT", f"{both[2].id} p99 TTFT"]
    assert all(r.unit == "ms" for r in per_case)
    assert all(r.tolerance == float("inf") and "https://" in r.source for r in rows)
    assert per_case[0].reference == both[0].p99_ms["ttft"]
    assert per_case[0].error == pytest.approx(0.5)
    stats = {r.name: r for r in rows if r.error_kind == "statistic"}
    ttft, tpot = (stats[f"held-out p99 {f}: median |error|"] for f in ("TTFT", "TPOT"))
    _summary(ttft, 3, 0.2, "+20.0%")
    _summary(tpot, 2, 0.2, "-10.0%")
    assert "inside the envelope: 1 of 2, 50%" in ttft.note and "envelope" not in tpot.note
    assert "(OUTSIDE)" in per_case[0].note and "(inside)" in per_case[2].note


def test_a_median_itl_or_peak_that_is_not_a_positive_number_is_not_taken():
    row = next(r for r in load_rows() if ((r.get("metrics") or {}).get("extra") or {})
               .get("median_itl_ms"))
    for bad in (0, -3.0, "nan"):
        r = json.loads(json.dumps(row))
        r["metrics"]["extra"]["median_itl_ms"] = bad
        r["metrics"]["extra"]["peak_output_throughput"] = bad
        case = row_case(r)
        assert case.median_itl_ms is None and case.peak_output_tps is None
