"""Replay a scheduler-conformance scenario step by step and emit vLLM's golden record format.

A scenario (JSON) holds `config` (scheduler settings) and `requests` (id, arrive_step, prompt_len,
output_len, block_keys); see `simcore/data/conformance/README.md`. Each emitted step is a dict:
step, scheduled {id: tokens}, new, resumed, preempted, computed_on_admit, finished, free_blocks.
A step log is one such record a line, after an optional header line `step_log_header()` that
names the format and its version (vLLM's recorder writes none: a log without it is version 1).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

from simcore.engine.request import Request
from simcore.engine.scheduler import Scheduler, SchedulerConfig
from simcore.errors import ConfigError
from simcore.loading import not_utf8

STEP_FORMAT_VERSION = 1
"""Version of the per-step record format (the golden files' fields)."""

STEP_LOG_FORMAT = "scheduler-step-log"
"""The `format` of a step log's header line."""

MAX_IDLE_STEPS = 1000
"""Steps in a row with waiting requests but nothing schedulable before the replay is declared stuck."""

_CONFIG_KEYS = {"max_num_seqs", "max_num_batched_tokens", "num_blocks", "block_size", "max_model_len",
                "enable_chunked_prefill", "enable_prefix_caching", "long_prefill_token_threshold",
                "policy", "preemption", "persistent_batch", "reserve_full_isl", "watermark_blocks"}
_REQUIRED = ("max_num_seqs", "max_num_batched_tokens", "num_blocks")


def load_scenario(path: str | Path) -> dict:
    """Read and check a scenario file; errors name the file and the field."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt") as f:
            sc = json.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such scenario file") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON (line {e.lineno}: {e.msg})") from None
    except UnicodeDecodeError:
        raise not_utf8(path, opener) from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot be read ({e})") from None
    if not isinstance(sc, dict) or not isinstance(sc.get("config"), dict) \
            or not isinstance(sc.get("requests"), list):
        raise ConfigError(f"{path}: a scenario needs a 'config' object and a 'requests' list")
    cfg = sc["config"]
    for k in _REQUIRED:
        if k not in cfg:
            raise ConfigError(f"{path}: config.{k} is missing")
    for k, v in cfg.items():
        if k in _CONFIG_KEYS and k not in ("policy", "preemption") and not isinstance(v, (int, bool)):
            raise ConfigError(f"{path}: config.{k} must be an integer or boolean, got {v!r}")
    for i, r in enumerate(sc["requests"]):
        for k in ("id", "arrive_step", "prompt_len", "output_len"):
            if k not in r:
                raise ConfigError(f"{path}: requests[{i}].{k} is missing")
        if not isinstance(r["prompt_len"], int) or r["prompt_len"] < 1:
            raise ConfigError(f"{path}: requests[{i}].prompt_len must be a positive integer")
        if not isinstance(r["output_len"], int) or r["output_len"] < 1:
            raise ConfigError(f"{path}: requests[{i}].output_len must be a positive integer")
    return sc


def scheduler_config(cfg: dict) -> SchedulerConfig:
    kw = {k: v for k, v in cfg.items() if k in _CONFIG_KEYS}
    kw.setdefault("long_prefill_token_threshold", 0)
    if kw.get("long_prefill_token_threshold") is None:
        kw["long_prefill_token_threshold"] = 0
    return SchedulerConfig(**kw)


def replay(scenario: dict, **overrides) -> Iterator[dict]:
    """Run the scenario through the Scheduler, yielding one golden-format record per step."""
    cfg = dict(scenario["config"])
    cfg.update(overrides)
    try:
        sched = Scheduler(scheduler_config(cfg))
    except (TypeError, ValueError) as e:
        raise ConfigError(f"scenario config: {e}") from None
    reqs = scenario["requests"]
    order = sorted(range(len(reqs)), key=lambda i: (reqs[i]["arrive_step"], i))
    index_of = {r["id"]: i for i, r in enumerate(reqs)}
    pending = 0
    step = idle = 0
    n = len(order)
    # vLLM's engine loop runs one more (empty) step after requests finish, to report them.
    just_finished = False
    while pending < n or sched.has_requests or just_finished:
        while pending < n and reqs[order[pending]]["arrive_step"] <= step:
            i = order[pending]
            r = reqs[i]
            sched.add_request(Request(r["id"], i, r["prompt_len"], r["output_len"],
                                      tuple(r.get("block_keys", ())), r.get("priority", 0), float(i)))
            pending += 1
        if not sched.has_requests and not just_finished:
            yield {"step": step, "scheduled": {}, "new": [], "resumed": [], "preempted": [],
                   "computed_on_admit": {}, "finished": [], "free_blocks": sched.kv.num_free_blocks}
            step += 1
            continue
        out = sched.schedule()
        idle = 0 if out.scheduled or pending < n else idle + 1
        if idle > MAX_IDLE_STEPS:
            raise ConfigError(f"stuck at step {step}: requests wait but nothing can be scheduled "
                              f"(num_blocks too small for a prompt?)")
        _, finished = sched.update(out)
        just_finished = bool(finished)
        yield {"step": step,
               "scheduled": {r.request_id: k for r, k, _ in out.scheduled},
               "new": [r.request_id for r in out.new],
               "resumed": [r.request_id for r in out.resumed],
               "preempted": sorted((r.request_id for r in out.preempted), key=index_of.__getitem__),
               "computed_on_admit": out.computed_on_admit,
               "finished": sorted((r.request_id for r in finished), key=index_of.__getitem__),
               "free_blocks": sched.kv.num_free_blocks}
        step += 1


def step_log_header() -> dict:
    """The first line of a step log this version writes."""
    return {"format": STEP_LOG_FORMAT, "version": STEP_FORMAT_VERSION}


def is_step_log_header(record: object) -> bool:
    """Whether a parsed line is a header (it names a format and is no step)."""
    return isinstance(record, dict) and "format" in record and "step" not in record


def read_steps(path: str | Path) -> list[dict]:
    """Read a step log (JSON lines, optionally gzipped), without its header line; a header of
    another format or version raises ValueError."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        records = [json.loads(line) for line in f if line.strip()]
    if records and is_step_log_header(records[0]):
        if records[0] != step_log_header():
            raise ValueError(f"header {records[0]!r} is not {step_log_header()!r}")
        records = records[1:]
    return records


def compare(ours: list[dict], golden: list[dict]) -> str | None:
    """None if the two step logs agree exactly, else a sentence naming the first difference."""
    for a, b in zip(ours, golden):
        for k in ("scheduled", "new", "resumed", "preempted", "computed_on_admit", "finished",
                  "free_blocks"):
            if a.get(k) != b.get(k):
                return f"step {b.get('step')}: {k} differs: ours {a.get(k)!r}, vLLM {b.get(k)!r}"
    if len(ours) != len(golden):
        return f"step count differs: ours {len(ours)}, vLLM {len(golden)}"
    return None
