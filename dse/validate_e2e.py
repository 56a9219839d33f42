"""The end-to-end validation set: published real-hardware vLLM benchmark runs, re-simulated.

`simcore/data/validation/*.yaml` holds the measurements (each row with its source, the command
line quoted, and the metrics as printed). `load_cases` turns every row the simulator can
represent into a `Case`: a `dse simulate` configuration of the same GPU, model, weight dtype,
parallelism, engine limits and load, and the measured value of each metric family:

- `throughput`: output token throughput (tok/s), else request throughput (req/s);
- `ttft`: mean TTFT (ms), else median;
- `tpot`: mean TPOT (ms), else mean ITL, else median TPOT;
- `e2e`: `benchmark_latency`'s mean latency of one batch (s), compared with the simulated
  duration of that batch, else mean E2E latency (ms).

How a load is rebuilt: `benchmark_latency` is one batch of `batch` requests of fixed lengths sent
at once; `benchmark_throughput` is all prompts at once with `vllm`'s offline (LLM class) batch
limits; `vllm bench serve` / `benchmark_serving.py` keep their request rate and concurrency.
Random loads take the measured mean lengths where the output printed its token totals, else the
lengths on the command line; where outputs stopped at the end of sequence (no --ignore-eos, a
measured mean under the cap), their lengths spread as a constant per-token hazard gives them,
with the measured mean (`dse.validate_loads`). ShareGPT loads draw their
requests as vLLM's sharegpt sampler does, from the shipped first-turn lengths
(`simcore/data/datasets/sharegpt_v3_first_turn_llama3.csv`: the first human turn and first reply
of each conversation, Llama-3 tokens; the same counted with the row's model's own tokenizer
where they ship: Mistral's 32k SentencePiece for Mixtral-8x7B, Qwen3's, gpt-oss's o200k,
DeepSeek-V3's): `random.seed(0)`, shuffle, the first n rows that pass
vLLM's `is_valid_sequence`. Where the output printed its token totals, those prompt and output
lengths are scaled to the measured means (the model's own tokenizer and chat template, and early
stops, are in the totals); where it did not, they are used as they are, and the case's notes say
which tokenizer's counts they are (and, for a model with neither tokenizer, that its own
differs). The shipped first turns are a subset of the file the benchmark shuffled, so its
requests are drawn again, not rebuilt: an offline ShareGPT batch, whose throughput one draw's
longest outputs decide, is simulated with `OFFLINE_DRAWS` draws (seeds 0, 1, ...) and predicted
by their median (`predict`); every other case by its seed-0 draw. Rows the simulator cannot
represent (models it has no architecture for, weight formats it does not model, GPUs without a
kernel profile, expert parallelism) are returned with the reason, never silently dropped.

The split is declared, not chosen: a row is in the `fit` part when the first 8 hex digits of the
sha256 of its id are even, else `held_out`. Free parameters may be fitted on `fit` rows only;
errors and envelope coverage are reported on `held_out` rows.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dse.validate_loads import (OFFLINE_DRAWS, eos_output_lengths, scaled_to_mean,
                                sharegpt_first_turns, sharegpt_tokenizer)
from simcore.hardware import get_gpu
from simcore.model.chat_template import preset_template_tokens
from simcore.loading import parse_yaml, read_text
from simcore.reference_data import DATA_DIR

VALIDATION_DIR = DATA_DIR / "validation"
FAMILIES = ("throughput", "ttft", "tpot", "e2e")

_GPUS = {"H100": "H100-SXM", "H100-SXM": "H100-SXM", "H200": "H200", "A100-80GB": "A100-80GB",
         "B200": "B200", "L40S": "L40S"}
"""GPU names in the rows -> catalog names, for GPUs with a shipped kernel profile ("H100" in
vLLM's CI is its 8xH100 SXM machine)."""

_BLOCK_FP8 = ("qwen/qwen3", "deepseek-ai/")
"""FP8 checkpoints of these families use 128x128 block scales (fp8_block)."""

_LLAMA3 = re.compile(r"llama-3", re.IGNORECASE)
"""Models that use the Llama-3 tokenizer the shipped ShareGPT lengths were counted with."""

_CHAT = re.compile(r"openai-chat|/v1/chat/completions")
"""A quoted benchmark command that sends chat requests (vllm bench serve --backend or
--endpoint-type openai-chat, --endpoint /v1/chat/completions)."""


@dataclass(frozen=True)
class Case:
    """One measured run and the configuration that re-simulates it."""

    id: str
    split: str                        # "fit" or "held_out"
    config: dict                      # a `dse simulate` configuration (mapping)
    measured: dict[str, float]        # family -> measured value
    keys: dict[str, str]              # family -> the result key compared
    source: str                       # URL
    notes: list[str] = field(default_factory=list)
    draws: tuple = ()   # (prompt lens, output lens) per draw, seed 0's first: ShareGPT, early stops
    median_itl_ms: float | None = None  # the run's median ITL where the source prints it
    peak_output_tps: float | None = None  # its peak output tokens/s where the source prints it
    p99_ms: dict[str, float] = field(default_factory=dict)  # family -> its printed p99 (ms)

    @property
    def lengths(self) -> tuple | None:
        """The seed-0 draw's (prompt lens, output lens) of a ShareGPT load or of random prompts
        whose outputs stop at the end of sequence, else None."""
        return self.draws[0] if self.draws else None

    def mean_output_tokens(self) -> float | None:
        """The mean output tokens a request of the load samples (the seed-0 draw's, where it has
        draws), or None where the load is neither random nor ShareGPT."""
        if self.draws:
            outputs = self.lengths[1]
            return sum(outputs) / len(outputs)
        ds = (self.config.get("workload") or {}).get("dataset") or {}
        return float(ds["output_len"]) if ds.get("kind") == "random" else None

    def num_draws(self) -> int:
        """How many workloads the case is simulated with (its prediction is their median)."""
        return max(1, len(self.draws))


def split_of(row_id: str) -> str:
    """The declared split of a row: 'fit' or 'held_out'."""
    return "fit" if int(hashlib.sha256(row_id.encode()).hexdigest()[:8], 16) % 2 == 0 \
        else "held_out"


def load_rows(folder: Path = VALIDATION_DIR) -> list[dict]:
    """Every row of every measurement file in `folder`."""
    rows = []
    for path in sorted(folder.glob("*.yaml")):
        data = parse_yaml(read_text(path), source=str(path))
        rows += data.get("rows") or []
    return rows


OFFLINE_TOOLS = ("benchmark_latency.py", "benchmark_throughput.py", "vllm bench latency",
                 "vllm bench throughput")
"""The benchmarks that drive vLLM's LLM class in-process (simulated with host.entrypoint
offline); `benchmark_serving.py` and `vllm bench serve` go through the API server."""


def _num(x):
    if x is None:
        return None
    if isinstance(x, str):
        return math.inf if x.strip().lower() == "inf" else float(x)
    return float(x)


def _settings(text: str) -> dict[str, str]:
    """`key=value` pairs of a row's engine.other text ("max_model_len=32768; ...")."""
    out = {}
    for part in text.replace(",", ";").split(";"):
        if "=" in part:
            k, v = part.split("=", 1)
            out[k.strip()] = v.strip()
    return out


def _measured(row: dict, tool: str) -> tuple[dict[str, float], dict[str, str]]:
    m = row.get("metrics") or {}
    measured, keys = {}, {}

    def take(family, *names):
        for n in names:
            v = m.get(n)
            if v is not None:
                measured[family], keys[family] = float(v), n
                return

    take("throughput", "output_throughput", "request_throughput")
    take("ttft", "mean_ttft_ms", "median_ttft_ms")
    take("tpot", "mean_tpot_ms", "mean_itl_ms", "median_tpot_ms")
    if "latency" in tool and m.get("latency_s") is not None:
        measured["e2e"], keys["e2e"] = float(m["latency_s"]), "duration"
    else:
        take("e2e", "mean_e2el_ms")
    return measured, keys


def _version(text) -> tuple[int, ...] | None:
    """(major, minor, ...) of a stated vLLM version such as '0.10.2' or '0.8.5.post1'."""
    parts = re.findall(r"\d+", str(text or ""))[:3]
    return tuple(int(p) for p in parts) if parts else None


def _measured_before(row: dict, version: tuple[int, ...], date: str) -> bool:
    """The row's vLLM predates release `version` (first released in month `date`): by its stated
    version, else its source's date; a row stating neither is one of vLLM's 2024-25 CI builds."""
    v = _version(row.get("vllm_version"))
    if v is not None:
        return v < version
    d = str((row.get("source") or {}).get("date") or "")
    return d < date if d else True


def version_defaults(row: dict, gpu: str, weight_dtype: str, tool: str) -> tuple[dict, list[str]]:
    """(settings by section, notes): what the run's vLLM release (or the platform that launched
    it) did differently from the simulator's defaults (current vLLM's), where the simulator
    models the difference:

    - MXFP4 experts on Hopper ran in Marlin's kernels and padded layout until vLLM installed
      `triton_kernels` itself (vLLM 0.10-0.11 left it to the user: vLLM issue 27672);
    - before 0.21 vLLM's default gpu_memory_utilization was 0.9 (now 0.92) and it captured the
      CUDA graphs after allocating the KV cache, from the memory gpu_memory_utilization leaves,
      instead of subtracting their estimate first (`engine.profile_cuda_graph_memory`; vLLM's
      start-up message "CUDA graph memory profiling is enabled (default since v0.21.0)");
    - before 0.28 the API server's default token budget on GPUs of 160 GiB or more (B200) was
      8,192, as on the other large GPUs; 0.28 made it 16,384 (`EngineArgs.get_batch_defaults`,
      vLLM pull request 51726);

    Rows whose quoted settings vLLM could not have started with are left out by `load_cases`
    with the simulator's reason: GPUStack's Qwen3-32B (bf16) and gpt-oss-120b on one H100. By
    vLLM's own start-up logs (`simcore/data/measurements/vllm_startup_memory.csv`) the first
    leaves 4.45 GiB of KV cache at these defaults, less than one 40,960-token request (and its
    32,000-token prompts rule out a shorter max_model_len), and the second none; their runs used
    settings the source does not quote.
    """
    settings: dict = {}
    notes = []
    if weight_dtype == "mxfp4" and _measured_before(row, (0, 12), "2025-11"):
        settings["model"] = {"mxfp4_moe_layout": "marlin"}
        notes.append("MXFP4 experts in Marlin's layout and kernels (no triton_kernels in that "
                     "vLLM)")
    if _measured_before(row, (0, 21), "2026-04"):
        settings["engine"] = {"gpu_memory_utilization": 0.9, "profile_cuda_graph_memory": False}
    if get_gpu(gpu).memory_bytes >= 160 * 2**30 and tool not in OFFLINE_TOOLS \
            and _measured_before(row, (0, 28), "2026-08"):
        settings.setdefault("engine", {})["max_num_batched_tokens"] = 8192
        notes.append("the API server's token budget 8192 by default (16384 on this GPU since "
                     "vLLM 0.28)")
    return settings, notes


def row_case(row: dict) -> Case | str:
    """The case of one row, or the reason the simulator cannot represent it."""
    from simcore.model.presets import is_preset, load_preset

    rid = row["id"]
    hw, model, par = row.get("hardware") or {}, row.get("model") or {}, row.get("parallelism") or {}
    bench, eng = row.get("benchmark") or {}, row.get("engine") or {}
    gpu = _GPUS.get(str(hw.get("gpu")))
    if gpu is None:
        return f"GPU {hw.get('gpu')!r} has no kernel profile"
    name = str(model.get("name"))
    if not is_preset(name):
        return f"no architecture for {name}"
    dtype = str(model.get("dtype") or "")
    if dtype in ("bf16", "fp16"):
        wdt = "bf16"
    elif dtype == "fp8":
        wdt = "fp8_block" if name.lower().startswith(_BLOCK_FP8) else "fp8"
    elif dtype == "mxfp4":          # gpt-oss: MXFP4 experts, everything else bf16
        wdt = "mxfp4"
    else:
        return f"weight dtype {dtype or 'unknown'!r} is not modelled"
    tp = par.get("tp")
    if tp is None:
        return "tensor-parallel size not stated"
    if "expert-parallel" in (row.get("notes") or "") or "-ep-" in rid:
        return "expert parallelism: the group model is not validated here"
    tool = str(bench.get("tool") or "")
    measured, keys = _measured(row, tool)
    if not measured:
        return "no metric the simulator reports"
    metrics = row.get("metrics") or {}
    extra = metrics.get("extra") or {}
    done = extra.get("successful_requests")
    n = int(bench.get("num_prompts") or bench.get("max_concurrency") or 0)
    mean_in = mean_out = None
    if extra.get("total_input_tokens") and extra.get("total_generated_tokens") and done:
        mean_in = extra["total_input_tokens"] / done
        mean_out = extra["total_generated_tokens"] / done
    kv = model.get("kv_cache_dtype") or "auto"
    cfg = {"name": rid, "seed": 0, "model": {"name": name, "dtype": wdt},
           "hardware": {"gpu": gpu},
           "parallelism": {"tensor_parallel_size": int(tp),
                           "pipeline_parallel_size": int(par.get("pp") or 1)},
           "compute": {"kind": "calibrated"}, "uncertainty": {"method": "first_order"},
           "metrics": {"percentiles": [50, 99]}}
    if kv not in (None, "auto"):
        cfg["model"]["kv_cache_dtype"] = "fp8" if str(kv).startswith("fp8") else str(kv)
    defaults, notes = version_defaults(row, gpu, wdt, tool)
    cfg["model"].update(defaults.get("model", {}))
    engine = dict(defaults.get("engine", {}))
    engine.update({k: eng[k] for k in ("max_num_seqs", "max_num_batched_tokens") if eng.get(k)})
    if eng.get("enable_prefix_caching") is not None:
        engine["enable_prefix_caching"] = bool(eng["enable_prefix_caching"])
    other = _settings(str(eng.get("other") or ""))
    if "max_model_len" in other:
        cfg["model"]["max_model_len"] = int(other["max_model_len"])
    if other.get("async_scheduling", "").lower() == "true":
        engine["async_scheduling"] = True
    if "gpu_memory_utilization" in other:
        engine["gpu_memory_utilization"] = float(other["gpu_memory_utilization"])
    dataset = str(bench.get("dataset") or "")
    draws: list = []
    workload: dict = {"num_prompts": n}
    if "latency" in tool:
        workload.update(request_rate="inf", dataset={
            "kind": "random", "input_len": int(bench["input_len"]),
            "output_len": int(bench["output_len"])})
    elif "sharegpt" in dataset:
        tokenizer = sharegpt_tokenizer(name)
        seeds = range(OFFLINE_DRAWS if tool in OFFLINE_TOOLS else 1)
        drawn = [sharegpt_first_turns(n, seed=s, tokenizer=tokenizer) for s in seeds]
        if mean_in is not None:
            draws = [(scaled_to_mean(p, mean_in), scaled_to_mean(o, mean_out)) for p, o in drawn]
            notes.append(f"ShareGPT first turns scaled to the measured means {mean_in:.0f} / "
                         f"{mean_out:.0f} tokens")
        else:
            draws = [(p.tolist(), o.tolist()) for p, o in drawn]
            prompts, outputs = drawn[0]
            from simcore.reference_data import SHAREGPT_TOKENIZER_NAMES
            label = SHAREGPT_TOKENIZER_NAMES[tokenizer]
            note = (f"ShareGPT first turns, {label} tokenizer (means {prompts.mean():.0f} / "
                    f"{outputs.mean():.0f} tokens; no token totals printed)")
            if tokenizer == "llama3" and not _LLAMA3.search(name):
                note += f"; {name}'s tokenizer differs"
            notes.append(note)
        if len(draws) > 1:
            notes.append(f"an offline batch: the median over {OFFLINE_DRAWS} ShareGPT draws")
    elif dataset == "random":
        li = mean_in if mean_in is not None else bench.get("input_len")
        lo = mean_out if mean_out is not None else bench.get("output_len")
        if li is None or lo is None:
            return "random load without lengths"
        workload["dataset"] = {"kind": "random", "input_len": int(round(li)),
                               "output_len": max(1, int(round(lo)))}
        cap = bench.get("output_len")
        if (mean_out is not None and cap and mean_out < int(cap) - 0.5 and n > 0
                and not bench.get("ignore_eos") and not bench.get("random_range_ratio")):
            # Outputs that end at the model's end of sequence: a spread of lengths with the
            # measured mean (`eos_output_lengths`), the prompts as random's (the draw replaces
            # the dataset above, which stays to say what the benchmark sent).
            draws = [([int(round(li))] * n, eos_output_lengths(n, mean_out, int(cap)))]
            notes.append(f"mean prompt as measured, {li:.0f} tokens; outputs ending at the "
                         f"end of sequence (no --ignore-eos): a constant per-token hazard, "
                         f"their mean as measured, {mean_out:.1f} of at most {int(cap)}")
        elif mean_out is not None:
            notes.append(f"mean lengths as measured: {li:.0f} / {lo:.1f} tokens")
    else:
        return f"dataset {dataset!r} is not rebuilt"
    if "throughput" in tool and "serve" not in tool:
        workload["request_rate"] = "inf"
        big = gpu != "A100-80GB"      # vLLM's LLM-class defaults (>= 70 GiB and not A100)
        engine.setdefault("max_num_seqs", 1024 if big else 256)
        engine.setdefault("max_num_batched_tokens", 16384 if big else 8192)
    elif "latency" not in tool:
        workload["request_rate"] = bench.get("request_rate") or "inf"
        if bench.get("max_concurrency"):
            workload["max_concurrency"] = int(bench["max_concurrency"])
    if tool in OFFLINE_TOOLS:        # vLLM's LLM class, no API server
        cfg["host"] = {"entrypoint": "offline"}
    elif _CHAT.search(str((row.get("source") or {}).get("quote") or "")):
        workload["endpoint"] = "chat_completions"
        if str(row.get("vllm_version")) == "0.11.0" and load_preset(name).chat_format == "jinja":
            cfg["host"] = {"chat_template_parse": "per_request"}
            notes.append("chat requests; vLLM 0.11.0 parses the chat template for each one")
        else:
            notes.append("chat requests")
        template = preset_template_tokens(name, name)
        if "sharegpt" in dataset and template is not None:
            # The drawn ShareGPT counts (replayed from a file) hold the BOS the template writes
            # where they are the model's own tokenizer's, as a sharegpt dataset's do.
            held = template.for_sharegpt_counts(sharegpt_tokenizer(name), name)
            if held.counted:
                cfg["model"]["chat_template_tokens"] = [held.lead - held.counted, held.tail]
                notes.append(f"its ShareGPT counts hold {held.counted} of the template's "
                             f"{held.lead} leading tokens (the BOS)")
    if engine:
        cfg["engine"] = engine
    cfg["workload"] = workload
    itl, peak = (_positive(_num(extra.get(k))) for k in ("median_itl_ms",
                                                         "peak_output_throughput"))
    p99 = {fam: v for fam, v in ((fam, _positive(_num(metrics.get(key, extra.get(key)))))
                                 for fam, key in P99_KEYS.items()) if v is not None}
    return Case(id=rid, split=split_of(rid), config=cfg, measured=measured, keys=keys,
                source=str((row.get("source") or {}).get("url")), notes=notes,
                draws=tuple(draws), median_itl_ms=itl, peak_output_tps=peak, p99_ms=p99)


P99_KEYS = {"ttft": "p99_ttft_ms", "tpot": "p99_tpot_ms", "itl": "p99_itl_ms"}
"""The 99th percentiles a source may print, by quantity, as `vllm bench serve` names them (and the
simulated result); a row keeps the p99 ITL with the other printed numbers (`metrics.extra`)."""


def _positive(x: float | None) -> float | None:
    """`x` where it is a finite positive number, else None."""
    return x if x is not None and math.isfinite(x) and x > 0 else None


def load_cases(folder: Path = VALIDATION_DIR) -> tuple[list[Case], list[tuple[str, str]]]:
    """(the cases, [(row id, why it is left out)]): a row whose configuration `dse simulate`
    refuses (e.g. its memory model leaves less KV cache than one max_model_len request needs,
    where vLLM started) is left out with that sentence."""
    from simcore.errors import ConfigError
    from simcore.setup import build_deployment

    cases, skipped = [], []
    for row in load_rows(folder):
        c = row_case(row)
        if isinstance(c, Case):
            try:
                with tempfile.TemporaryDirectory() as d:
                    build_deployment(case_config(c, Path(d)))
            except ConfigError as e:
                skipped.append((row["id"], f"refused by the simulator: {e}"))
                continue
            cases.append(c)
        else:
            skipped.append((row["id"], c))
    return cases, skipped


def case_config(case: Case, workdir: Path, compute: dict | None = None, *, draw: int = 0,
                **overrides):
    """The SimConfig of a case (a load with draws, its draw `draw`, written as a custom JSONL in
    `workdir`, sent in the drawn order); `compute` replaces the compute section, `overrides`
    top-level sections."""
    from simcore.config import parse_config

    cfg = json.loads(json.dumps(case.config))
    if case.draws:
        lengths = case.draws[draw]
        path = workdir / f"{case.id}.jsonl"
        with open(path, "w", encoding="utf-8") as f:
            for p, o in zip(*lengths):
                f.write(json.dumps({"prompt_len": p, "output_len": o}) + "\n")
        cfg["workload"]["dataset"] = {"kind": "custom", "path": str(path), "shuffle": False}
    if compute is not None:
        cfg["compute"] = compute
    if "host" in overrides:         # host settings add to the case's own (its entrypoint)
        overrides = {**overrides, "host": {**cfg.get("host", {}), **overrides["host"]}}
    cfg.update(overrides)
    return parse_config(cfg, source=case.id, base_dir=workdir)


def predicted(case: Case, result: dict) -> dict[str, float]:
    """The simulated value of each measured family, in the measured unit."""
    out = {}
    for fam, key in case.keys.items():
        if key == "duration":
            out[fam] = float(result["duration"])
        else:
            out[fam] = float(result[key])
    return out


def run_case(case: Case, compute: dict | None = None, *, envelope: bool = False,
             draw: int = 0, **overrides) -> tuple[dict, dict]:
    """(predictions by family, the full result) of one case with its draw `draw`; with
    `envelope`, the result of `simulate_with_envelope` (its config's uncertainty method)."""
    from simcore.simulate import simulate
    from simcore.uncertainty import simulate_with_envelope

    run = simulate_with_envelope if envelope else simulate
    with tempfile.TemporaryDirectory() as d:
        result = run(case_config(case, Path(d), compute, draw=draw, **overrides))
    return predicted(case, result), result


def simulate_draws(case: Case, compute: dict | None = None, **overrides
                   ) -> tuple[list[dict[str, float]], dict]:
    """`run_case`'s predictions of each of the case's draws (`OFFLINE_DRAWS` for an offline
    ShareGPT batch, else its one workload), and draw 0's full result."""
    first, result = run_case(case, compute, **overrides)
    runs = [first] + [run_case(case, compute, draw=i, **overrides)[0]
                      for i in range(1, case.num_draws())]
    return runs, result


def median_prediction(runs: list[dict[str, float]]) -> dict[str, float]:
    """Per family, the median over the draws' predictions."""
    return {f: float(np.median([r[f] for r in runs])) for f in runs[0]}


def predict(case: Case, compute: dict | None = None, **overrides) -> dict[str, float]:
    """The case's prediction by family: the median over its draws' (`simulate_draws`)."""
    return median_prediction(simulate_draws(case, compute, **overrides)[0])


def predicted_tails(case: Case, result: dict) -> dict[str, float]:
    """The simulated 99th percentile (ms) of each family whose p99 the case's source prints."""
    return {fam: float(result[P99_KEYS[fam]]) for fam in case.p99_ms
            if result.get(P99_KEYS[fam]) is not None}


def predict_with_tails(case: Case, compute: dict | None = None, **overrides
                       ) -> tuple[dict[str, float], dict[str, float]]:
    """`predict`'s prediction, and `predicted_tails` of its first draw (a source's p99 is of
    one run; the cases that print one have a single draw)."""
    runs, result = simulate_draws(case, compute, **overrides)
    return median_prediction(runs), predicted_tails(case, result)


# ---- evaluation ------------------------------------------------------------------------------

TARGETS = {"throughput": 0.10, "tpot": 0.10, "ttft": 0.15, "e2e": 0.15}
"""The median |relative error| each family should reach on the held-out cases."""
SIGNED_TARGET = 0.05
"""The median signed relative error (no systematic optimism or pessimism)."""
COVERAGE_TARGET = 0.80
"""The share of held-out measurements inside the stated envelope."""


@dataclass(frozen=True)
class Outcome:
    """One case simulated: per family the prediction, the measurement and the envelope."""

    case: Case
    predicted: dict[str, float]
    low: dict[str, float]
    high: dict[str, float]
    draw_range: dict[str, tuple[float, float]] = field(default_factory=dict)  # several draws
    step: tuple[float, float] | None = None   # simulated (median ITL ms, mean batch sequences)
    peak: tuple[float, float] | None = None   # simulated (peak output tok/s, peak KV usage)
    p99_ms: dict[str, float] = field(default_factory=dict)  # simulated p99 (ms) by family
    p99_envelope: dict[str, tuple[float, float]] = field(default_factory=dict)  # its (low, high)

    def error(self, family: str) -> float:
        """(predicted - measured) / measured."""
        m = self.case.measured[family]
        return (self.predicted[family] - m) / m

    def covered(self, family: str) -> bool:
        return self.low[family] <= self.case.measured[family] <= self.high[family]


def evaluate(case: Case, compute: dict | None = None) -> Outcome:
    """Simulate a case with the calibrated envelope and compare it with its measurements: the
    prediction is `predict`'s (the median over an offline batch's draws), and the envelope the
    calibrated one around it, as `dse simulate` states it
    (`simcore.uncertainty.calibrated_envelope`)."""
    from simcore.uncertainty import calibrated_envelope

    runs, result = simulate_draws(case, compute)
    pred = median_prediction(runs)
    spread = {f: (min(r[f] for r in runs), max(r[f] for r in runs)) for f in pred
              } if len(runs) > 1 else {}
    # The tails checked apart where the source prints them: the first draw's 99th percentiles,
    # with the envelope `dse simulate` states around them (in the same call as the families').
    p99 = predicted_tails(case, result)
    env = calibrated_envelope(result["provenance"],
                              {**{P99_KEYS[fam]: v for fam, v in p99.items()},
                               **{key: pred[fam] for fam, key in case.keys.items()}})
    p99_envelope = {fam: (env[P99_KEYS[fam]]["low"], env[P99_KEYS[fam]]["high"])
                    for fam in p99 if P99_KEYS[fam] in env}
    # The decode step checked apart where the source prints the median ITL: the first draw's.
    step = ((float(result["median_itl_ms"]), float(result["mean_batch_seqs"]))
            if case.median_itl_ms is not None and result.get("median_itl_ms") is not None
            else None)
    # The busiest second's output checked apart where the source prints it: the first draw's.
    peak = ((float(result["max_output_tokens_per_s"]), float(result["max_kv_cache_usage"]))
            if case.peak_output_tps is not None
            and result.get("max_output_tokens_per_s") is not None
            and result.get("max_kv_cache_usage") is not None else None)
    low, high = {}, {}
    for fam, key in case.keys.items():
        e = env.get(key, {"low": pred[fam], "high": pred[fam]})
        low[fam], high[fam] = e["low"], e["high"]
    return Outcome(case, pred, low, high, spread, step, peak, p99, p99_envelope)


BOOTSTRAP_DRAWS = 2000
"""Resamples of the held-out sources behind each statistic's interval (`source_intervals`)."""


def source_intervals(errors: list[float], covered: list[bool], sources: list[str],
                     draws: int = BOOTSTRAP_DRAWS, seed: int = 0) -> dict[str, tuple[float, float]]:
    """5th and 95th percentiles of the median |error|, the median signed error and the
    coverage over `draws` resamples of the sources with replacement, each drawn source bringing
    all of its cases (a cluster bootstrap: one page or CI build measures several cases, whose
    errors go together). How far the statistics of another set of as many sources could lie;
    deterministic for a seed."""
    by: dict[str, list[int]] = {}
    for i, src in enumerate(sources):
        by.setdefault(src, []).append(i)
    groups = list(by.values())
    err = np.asarray(errors, dtype=float)
    cov = np.asarray(covered, dtype=float)
    rng = np.random.default_rng(seed)
    stats = np.empty((draws, 3))
    for d in range(draws):
        picked = rng.integers(0, len(groups), len(groups))
        idx = np.concatenate([groups[g] for g in picked])
        e = err[idx]
        stats[d] = (np.median(np.abs(e)), np.median(e), cov[idx].mean())
    lo, hi = np.percentile(stats, [5, 95], axis=0)
    return {key: (float(lo[k]), float(hi[k]))
            for k, key in enumerate(("median_abs", "median_signed", "coverage"))}


def summarize(outcomes: list[Outcome]) -> dict[str, dict]:
    """Per family: n, median |error|, median signed error, envelope coverage, the number of
    sources the cases come from and each statistic's 90% interval over resamples of them
    (`source_intervals`)."""
    out = {}
    for fam in FAMILIES:
        rows = [o for o in outcomes if fam in o.case.measured]
        if not rows:
            continue
        errs = [o.error(fam) for o in rows]
        cov = [o.covered(fam) for o in rows]
        sources = [o.case.source for o in rows]
        out[fam] = {"n": len(errs), "median_abs": float(np.median(np.abs(errs))),
                    "median_signed": float(np.median(errs)),
                    "coverage": float(np.mean(cov)), "sources": len(set(sources)),
                    "intervals": source_intervals(errs, cov, sources)}
    return out

GUARDS = {
    "throughput": {"median_abs": 0.12, "median_signed": 0.09, "outside": 0.24},
    "ttft": {"median_abs": 0.16, "median_signed": 0.06, "outside": 0.24},
    "tpot": {"median_abs": 0.09, "median_signed": 0.02, "outside": 0.13},
    "e2e": {"median_abs": 0.05, "median_signed": 0.04, "outside": 0.25},
}
"""Regression bounds of the held-out statistics: the figures measured when the CPU-side
parameters, the calibrated model's compute-bound scale, the TP ranks' skew at each all-reduce
and the all-reduces' scale in steps not replayed as one CUDA graph were last fitted (71 fit
cases: 1.25, 10 us, 2.0, 0.8 ms per step in the model runner and nothing per sequence, 33 us
per streamed token in the API server beyond the measured output processor, 13.2 ms of request
latency and 1.2 ms of API-server work; residuals by 3-fold
cross-validation), with weight-only formats on GPUs without
fp8 tensor cores timed by Marlin's measurements on the same GPU (SGLang's, of vLLM's Marlin MoE
kernel, for the experts; the bf16 measurements of their shapes for the other linear layers) and
fused-MoE shapes the kernel profile did not measure by its nearest measured one
(`simcore.calibration.moe_transfer`; Marlin's family of both frameworks), with each prompt
tokenized on
its API server process's tokenizer thread, one after another, beside the event loop, at the
tokenizer's cost measured alone (`simcore/data/cpu_costs/tokenizer_thread.json`), and the
event loop sharing its CPU among the requests on its path (processor sharing, as vLLM 0.11's own
server was measured to let a burst through:
`simcore/data/cpu_costs/api_server_burst.json`), chat requests costing the API server the chat
path's measured extra work (vLLM 0.11.0's parse of the chat template on every request,
`host.chat_template_parse`), the KV cache sized as vLLM's start-up logs show
(`simcore.model.memory`: the sampler's profiling run, the memory outside PyTorch by TP, the
CUDA-reported total, the CUDA graphs captured after the KV cache before vLLM 0.21), MXFP4
experts in the padded layout of the row's vLLM and timed by that layout's kernels (Marlin's on
Hopper before vLLM 0.12, from the Marlin measurements of other models moved to gpt-oss's shapes:
`simcore.compute.kernel_model._other_backend`), the prefill of a model with attention sinks on
a GPU whose FlashAttention has none (gpt-oss on A100) at vLLM's Triton kernel's time,
FlashAttention 2's or the roofline's times the two kernels' ratio measured on L40S
(`simcore.calibration.triton_attention`), and async scheduling hiding vLLM's scheduler
but not the model runner's fitted time, and offline ShareGPT batches predicted by the median
over their draws (`OFFLINE_DRAWS`), Mixtral-8x7B's ShareGPT loads in its own tokenizer's
counts, the other models' ShareGPT loads in their own tokenizers' counts where they ship
(Qwen3, gpt-oss, DeepSeek-V3), chat requests prefilled with their chat template's measured
tokens (`simcore.model.chat_template`; for both, the fit's parameters kept, its objective and
residuals recomputed) (64 held-out cases, 59 with a throughput figure: throughput 11.1% /
-8.2%, TTFT 14.8% / +5.6%, TPOT 8.3% / +1.0%, E2E 3.8% / -2.7% median |error| / median signed
error; envelope coverage 78%, 78%, 88%, 100%, the envelope built from the fit part's cross-validated
residuals, those of the case's GPU where its fit cases give at least
`simcore.uncertainty.MIN_GPU_RESIDUALS`: A100 and H100 for throughput, TTFT and TPOT), with a
margin.

How the figures got here, change by change: `simcore/data/validation/README.md` (History of
the held-out figures). The issue's targets (`TARGETS`, `SIGNED_TARGET`, `COVERAGE_TARGET`) are
reported beside them."""
