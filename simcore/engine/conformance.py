"""Replay a scheduler-conformance scenario step by step and emit vLLM's golden record format.

A scenario (JSON) holds `config` (scheduler settings) and `requests` (id, arrive_step, prompt_len,
output_len, block_keys, and optionally priority, abort_step and skip_reading_prefix_cache); see
`simcore/data/conformance/README.md`. Each emitted step is a dict: step, scheduled {id: tokens},
new, resumed, preempted, computed_on_admit, finished (requests aborted just before the step
included), free_blocks. A step log is one such record a line, after an optional header line
`step_log_header()` that names the format and its version (vLLM's recorder writes none: a log
without it is version 1).

`load_scenario` checks a scenario with the simulate config's own rules: the engine settings are
validated by `simcore.config.EngineConfig` (so `max_num_seqs: -1` gets the sentence `dse simulate`
gives), unknown keys and request fields are refused by name, duplicate request ids are refused.
"""

from __future__ import annotations

import difflib
import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

from pydantic import (BaseModel, ConfigDict, Field, StrictBool, StrictInt, TypeAdapter,
                      ValidationError)

from simcore.config import EngineConfig, check_batch_limits
from simcore.engine.request import Request
from simcore.engine.scheduler import Scheduler, SchedulerConfig
from simcore.errors import ConfigError, format_validation_error
from simcore.loading import not_utf8
from simcore.model.config import ModelConfig

STEP_FORMAT_VERSION = 1
"""Version of the per-step record format (the golden files' fields)."""

STEP_LOG_FORMAT = "scheduler-step-log"
"""The `format` of a step log's header line."""

MAX_IDLE_STEPS = 1000
"""Steps in a row with waiting requests but nothing schedulable before the replay is declared stuck."""

ENGINE_FIELD = {"max_num_seqs": "max_num_seqs", "max_num_batched_tokens": "max_num_batched_tokens",
                "num_blocks": "num_gpu_blocks_override", "block_size": "block_size",
                "enable_chunked_prefill": "enable_chunked_prefill",
                "enable_prefix_caching": "enable_prefix_caching",
                "long_prefill_token_threshold": "long_prefill_token_threshold",
                "policy": "scheduling_policy", "preemption": "preemption_mode",
                "persistent_batch": "persistent_batch", "reserve_full_isl": "scheduler_reserve_full_isl",
                "watermark": "watermark", "max_num_scheduled_tokens": "max_num_scheduled_tokens"}
"""Scenario config keys (the recorder's, vLLM's scheduler names) and the `EngineConfig` field
whose rules check each. `preemption` and `persistent_batch` are the engine's own options: a
scenario may use them to explore, but vLLM's recorder refuses them."""

_SCENARIO_KEY = {v: k for k, v in ENGINE_FIELD.items()}
CONFIG_KEYS = frozenset(ENGINE_FIELD) | {"max_model_len"}
_REQUIRED = ("max_num_seqs", "max_num_batched_tokens", "num_blocks")
DEFAULT_MAX_MODEL_LEN = 131072
"""The recorder's max_model_len when a scenario gives none."""

_MAX_MODEL_LEN = TypeAdapter(Annotated[int, *ModelConfig.model_fields["max_model_len"].metadata])
_TOP_KEYS = frozenset({"name", "config", "requests"})


class ScenarioRequest(BaseModel):
    """One request of a scenario, as vLLM's recorder sends it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1, description="Request id, unique in the scenario.")
    arrive_step: StrictInt = Field(ge=0, description="It joins the waiting queue just before "
                                   "this step.")
    prompt_len: StrictInt = Field(ge=1, description="Prompt tokens.")
    output_len: StrictInt = Field(ge=1, description="Tokens it generates (ignore_eos).")
    block_keys: tuple[Annotated[StrictInt, Field(ge=0)], ...] = Field(
        (), description="Content key of each full block of its prompt, first block first.")
    priority: StrictInt = Field(0, description="Under the priority policy, smaller runs first.")
    abort_step: StrictInt | None = Field(None, ge=0, description="The client gives up: the "
                                         "request is aborted just before this step, unless "
                                         "finished by then.")
    skip_reading_prefix_cache: StrictBool = Field(False, description="vLLM's sampling "
                                                  "parameter: no prefix-cache hit is looked up "
                                                  "for it.")


def _unknown(key: str, known: frozenset[str] | set[str], what: str) -> str:
    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
    hint = f"did you mean {close[0]}?" if close else f"known: {', '.join(sorted(known))}"
    return f"{key}: is not {what} ({hint})"


def load_scenario(path: str | Path) -> dict:
    """Read and check a scenario file; errors name the file and the field.

    Returns the scenario with its config's settings validated (defaults left out) and each
    request as a dict of its validated fields."""
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
    for k in sc:
        if k not in _TOP_KEYS:
            raise ConfigError(f"{path}: {_unknown(k, _TOP_KEYS, 'a part of a scenario')}")
    try:
        cfg = check_config(sc["config"])
    except ConfigError as e:
        raise ConfigError(f"{path}: config.{e}") from None
    requests = []
    first_at: dict[str, int] = {}
    per_block = cfg.get("block_size", 16)
    for i, r in enumerate(sc["requests"]):
        where = f"{path}: requests[{i}]"
        if not isinstance(r, dict):
            raise ConfigError(f"{where}: expected a mapping of request fields (got {r!r:.40})")
        for k in r:
            if k not in ScenarioRequest.model_fields:
                raise ConfigError(f"{where}.{_unknown(k, set(ScenarioRequest.model_fields), 'a request field')}")
        try:
            req = ScenarioRequest.model_validate(r)
        except ValidationError as err:
            raise ConfigError(f"{where}.{format_validation_error(err, ScenarioRequest)}") from None
        if req.id in first_at:
            raise ConfigError(f"{where}.id: {req.id!r} is also the id of "
                              f"requests[{first_at[req.id]}]; ids must be unique")
        first_at[req.id] = i
        if len(req.block_keys) > req.prompt_len // per_block:
            full = req.prompt_len // per_block
            raise ConfigError(f"{where}.block_keys: {len(req.block_keys)} keys, but its "
                              f"{req.prompt_len}-token prompt holds {full} full "
                              f"{per_block}-token block{'' if full == 1 else 's'}")
        if req.abort_step is not None and req.abort_step < req.arrive_step:
            raise ConfigError(f"{where}.abort_step: {req.abort_step} is before its arrive_step "
                              f"({req.arrive_step})")
        if req.prompt_len + req.output_len > cfg["max_model_len"]:
            raise ConfigError(f"{where}.prompt_len: {req.prompt_len} prompt and "
                              f"{req.output_len} output tokens pass config.max_model_len "
                              f"({cfg['max_model_len']}), which vLLM's server refuses")
        requests.append(req.model_dump())
    return {**sc, "config": cfg, "requests": requests}


def check_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """A scenario's config checked by the engine section's own rules (`EngineConfig` and
    `check_batch_limits`, as `dse simulate` checks its config); returns the validated settings
    given. Errors (ConfigError) start with the key."""
    for k in cfg:
        if k not in CONFIG_KEYS:
            raise ConfigError(_unknown(k, CONFIG_KEYS, "a scenario setting"))
    for k in _REQUIRED:
        if cfg.get(k) is None:
            raise ConfigError(f"{k} is missing")
    given = dict(cfg)
    if given.get("long_prefill_token_threshold") is None:   # older scenarios write null for 0
        given.pop("long_prefill_token_threshold", None)
    try:
        # Strict: JSON has its own booleans and numbers, so a flag of "yes" or 1, or a count of
        # "8", is a mistake, not a spelling to coerce.
        engine = EngineConfig.model_validate({ENGINE_FIELD[k]: v for k, v in given.items()
                                              if k in ENGINE_FIELD}, strict=True)
    except ValidationError as err:
        msg = format_validation_error(err, EngineConfig)
        head, colon, rest = msg.partition(":")
        raise ConfigError(f"{_SCENARIO_KEY.get(head, head)}{colon}{rest}") from None
    out = {k: getattr(engine, ENGINE_FIELD[k]) for k in given if k in ENGINE_FIELD}
    max_len = given.get("max_model_len", DEFAULT_MAX_MODEL_LEN)
    try:
        out["max_model_len"] = _MAX_MODEL_LEN.validate_python(max_len)
    except ValidationError as err:
        raise ConfigError(f"max_model_len{format_validation_error(err)}") from None
    check_batch_limits(engine.max_num_seqs, engine.max_num_batched_tokens, max_len,
                       engine.enable_chunked_prefill, engine.long_prefill_token_threshold)
    return out


def scheduler_config(cfg: dict) -> SchedulerConfig:
    """The Scheduler's settings for a checked scenario config (scenario keys, vLLM's names)."""
    kw = {k: v for k, v in cfg.items() if k in CONFIG_KEYS}
    if kw.get("long_prefill_token_threshold") is None:
        kw["long_prefill_token_threshold"] = 0
    return SchedulerConfig(**kw)


def replay(scenario: dict, **overrides) -> Iterator[dict]:
    """Run a scenario (as `load_scenario` returns it) through the Scheduler, yielding one
    golden-format record per step. `overrides` replace config settings (scenario keys)."""
    cfg = dict(scenario["config"])
    cfg.update(overrides)
    try:
        sched = Scheduler(scheduler_config(cfg))
    except (TypeError, ValueError) as e:
        raise ConfigError(f"scenario config: {e}") from None
    reqs = scenario["requests"]
    order = sorted(range(len(reqs)), key=lambda i: (reqs[i]["arrive_step"], i))
    aborts = sorted((r["abort_step"], i) for i, r in enumerate(reqs)
                    if r.get("abort_step") is not None)
    index_of = {r["id"]: i for i, r in enumerate(reqs)}
    made: list[Request | None] = [None] * len(reqs)
    pending = next_abort = 0
    step = idle = 0
    n = len(order)
    # vLLM's engine loop runs one more (empty) step after requests finish, to report them.
    just_finished = False
    while pending < n or sched.has_requests or just_finished:
        while pending < n and reqs[order[pending]]["arrive_step"] <= step:
            i = order[pending]
            r = reqs[i]
            made[i] = Request(r["id"], i, r["prompt_len"], r["output_len"],
                              tuple(r.get("block_keys", ())), r.get("priority", 0), float(i),
                              skip_reading_prefix_cache=r.get("skip_reading_prefix_cache", False))
            sched.add_request(made[i])
            pending += 1
        due = []
        while next_abort < len(aborts) and aborts[next_abort][0] <= step:
            due.append(made[aborts[next_abort][1]])
            next_abort += 1
        # Aborted requests are reported by the step that follows (vLLM's finished_req_ids).
        aborted = sched.finish_requests(due) if due else []
        if not sched.has_requests and not just_finished and not aborted:
            yield {"step": step, "scheduled": {}, "new": [], "resumed": [], "preempted": [],
                   "computed_on_admit": {}, "finished": [], "free_blocks": sched.kv.num_free_blocks}
            step += 1
            continue
        out = sched.schedule()
        idle = 0 if out.scheduled or pending < n or next_abort < len(aborts) else idle + 1
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
               "finished": sorted((r.request_id for r in (*aborted, *finished)),
                                  key=index_of.__getitem__),
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
    records = []
    with opener(path, "rt") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError(f"line {lineno}: expected a JSON object (a step), got "
                                 f"{line.strip()[:40]}")
            records.append(record)
    if records and is_step_log_header(records[0]):
        if records[0] != step_log_header():
            raise ValueError(f"header {records[0]!r} is not {step_log_header()!r}")
        records = records[1:]
    return records


STEP_KEYS = ("scheduled", "new", "resumed", "preempted", "computed_on_admit", "finished",
             "free_blocks")
"""The decisions of a step that a comparison of step logs holds equal."""


def compare(ours: list[dict], golden: list[dict], reference: str = "vLLM") -> str | None:
    """None if the two step logs agree exactly, else a sentence naming the first difference
    (`reference` names the other log in it). A step of `golden` without any of `STEP_KEYS` is
    no step of a log: ValueError naming it."""
    for b in golden:
        if not any(k in b for k in STEP_KEYS):
            raise ValueError(f"step {b.get('step')!r} holds none of {', '.join(STEP_KEYS)}: "
                             f"not a step of a scheduler log")
    for a, b in zip(ours, golden):
        for k in STEP_KEYS:
            if a.get(k) != b.get(k):
                return (f"step {b.get('step')}: {k} differs: ours {a.get(k)!r}, {reference} "
                        f"{b.get(k)!r}")
    if len(ours) != len(golden):
        return f"step count differs: ours {len(ours)}, {reference} {len(golden)}"
    return None
