"""What vLLM V1 spends off the GPU: the engine core's CPU time per step, the API server's per
token and per request, and whether async scheduling hides the engine's part behind the GPU.

Per engine step (`HostOverheads.engine_s`), on the engine core's critical path:
- vLLM's own scheduler: `Scheduler.schedule()` and `update_from_output()`, measured by running
  vLLM's code on a CPU (`simcore/data/cpu_costs/`, `scripts/vllm_cpu_costs/measure.py`): fits
  of a + b x sequences + c x tokens, separately for decoding and prefilling sequences; times the
  `host_speed` of the deployment's CPU relative to the measuring one (declared);
- the model runner's input preparation, sampling bookkeeping and launches (not measurable
  without a GPU runner): `model_runner_step_s` + `model_runner_per_seq_s` x sequences.
Sync scheduling (vLLM's default before 0.12) adds the engine's time to the GPU's; async
scheduling runs vLLM's scheduler for step n+1 while step n runs, so a step takes the longer of
the scheduler's time and the GPU's, the model runner's fitted time staying before the GPU's
work. Which part async scheduling hides was chosen on the fit part of the end-to-end set: its
one case with async scheduling then (gpt-oss-120b, TP 2, A100) is within 10-12% on throughput,
TTFT and TPOT this way, against 32-57% off with the whole engine time hidden (its throughput
over-predicted by 37%). Checked again on the 68 fit cases (many of them async), with the whole
engine time hidden the parameters refit to an objective of 0.1952, against 0.1941 as shipped
(0.1925 refitted): the choice stands.

Per step, in the API server process, concurrently with the engine (`frontend_s`): the output
processor (detokenizing and queueing each sampled token, measured as above) and the streaming
of each token to its client: vLLM's response generator for the request's endpoint (building and
serializing the chunk) and the HTTP layer's send, measured (`streaming_token_s`,
`simcore/data/cpu_costs/streaming.json`), plus a fitted extra (`api_server_per_token_s`). When
the server needs longer than the engine's step, clients receive tokens at the server's pace:
the step period is the longer one.

Per request, on the API server's path before the engine sees it (between the client's send and
the request's arrival in the scheduler), on one of the server's `api_server_count` processes:
- its prompt's tokenization (`tokenize_s`: the Hugging Face tokenizer's call as vLLM makes it,
  measured alone on the measuring CPU, a + c x prompt tokens, scaled by the host speed:
  `tokenizer_thread.json`, `TOKENIZE_RUN`), on the process's tokenizer thread, one prompt after
  another: vLLM hands prompts to a one-worker thread pool, and the tokenizer's Rust encoder
  releases the GIL, so the thread runs beside the event loop, not on it
  (`simcore.serve.api_server.TokenizerThread`;
  `scripts/vllm_cpu_costs/tokenizer_thread_measure.py`);
- the event loop's work (`request_cpu_s`: vLLM's input processing of the token ids, the output
  processor's request state and the request's msgpack hand-off to the engine core, measured as
  above, plus the work not measured here: the HTTP route, request validation and the response's
  set-up, `api_server_per_request_s`; for a chat request, also the chat path's measured extra
  work on the chat template, `chat_template_s`), which holds the process: its event loop
  advances every request it is working on a slice at a time, so the requests of a burst share
  its CPU and reach the engine together, after all of their work (processor sharing,
  `simcore.serve.api_server.SharedCpu`; measured on vLLM 0.11's own server:
  `simcore/data/cpu_costs/api_server_burst.json`);
- then a latency that does not hold it (`request_overhead_s`: HTTP handling, the event loop's
  hand-offs), paid by every request concurrently.

The five parameters that were not measurable here are fitted on the declared `fit` part of the
end-to-end validation set (`scripts/fit_host_overheads.py` -> `simcore/data/cpu_costs/
fitted.json`); their defaults are those fitted values, moved from the host speed the fit ran
at to the config's `host_speed` (`host_parameter`): all of the CPU side scales with it. The
calibrated compute model's compute-bound scale (`compute.compute_bound_scale`, sustained
against boost clocks), its TP ranks' skew at each all-reduce (`compute.collective_skew_s`) and
its all-reduces' scale in steps not replayed as one full CUDA graph
(`compute.graphless_collective_scale`) are fitted with them, on the same cases, and kept in the
same file (`fitted_compute`).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from simcore.errors import ConfigError, away_from_default
from simcore.reference_data import DATA_DIR

CPU_COSTS_DIR = DATA_DIR / "cpu_costs"
DEFAULT_CPU_COSTS = "vllm-0.33-cpu-amd-epyc-zen3-2vcpu"
FITTED = CPU_COSTS_DIR / "fitted.json"
FITTED_KEYS = ("model_runner_step_s", "model_runner_per_seq_s", "api_server_per_token_s",
               "request_overhead_s", "api_server_per_request_s")


class HostConfig(BaseModel):
    """The `host:` section: the CPU side of a vLLM server (engine core and API server)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: Literal["vllm", "constant"] = Field(
        "vllm", description="vllm: the engine core's and API server's CPU time from vLLM's "
        "measured costs and the fitted parameters below. constant: only the roofline's declared "
        "compute.roofline.step_overhead_s per step, no API server (the model before CPU costs "
        "were measured).")
    entrypoint: Literal["api_server", "offline"] = Field(
        "api_server", description="How requests reach the engine. api_server: vLLM's OpenAI "
        "server (vllm serve, vllm bench serve): the per-request path and the per-token "
        "streaming below apply. offline: vLLM's LLM class (LLM.generate, the throughput and "
        "latency benchmarks): no HTTP server, so neither applies; the output processor's "
        "measured costs remain (LLM.generate's up-front tokenization, ~0.5 ms a request as "
        "measured, is not counted).")
    cpu_costs: str = Field(DEFAULT_CPU_COSTS, description="Measured vLLM CPU costs, a file in "
                           "simcore/data/cpu_costs (without .json).")
    host_speed: float = Field(0.4, ge=1e-3, le=100, description="CPU time on the deployment's "
                              "host per second of the measuring CPU (a 2-vCPU cloud guest "
                              "about 2.5x slower at Python than a current server core: "
                              "declared; 0.001-100). It scales vLLM's measured costs and the "
                              "fitted parameters below left null (fitted at the default 0.4: "
                              "at 0.2 they take half).")
    model_runner_step_s: float | None = Field(None, ge=0, le=1.0, description="Model-runner CPU "
                                              "time per step (input preparation, launches), s "
                                              "(at most 1). Null: the fitted value x "
                                              "host_speed / 0.4.")
    model_runner_per_seq_s: float | None = Field(None, ge=0, le=1.0, description="Model-runner "
                                                 "CPU time per scheduled sequence, s (at most "
                                                 "1). Null: fitted (x host_speed / 0.4).")
    api_server_per_token_s: float | None = Field(None, ge=0, le=1.0, description="API server "
                                                 "time per streamed token beyond the measured "
                                                 "streaming work (response generator, HTTP "
                                                 "send), s (at most 1). Null: fitted (x "
                                                 "host_speed / 0.4).")
    request_overhead_s: float | None = Field(None, ge=0, le=60.0, description="Latency of one "
                                             "request's API-server path beyond its measured CPU "
                                             "work (HTTP handling, the event loop's hand-offs), "
                                             "s (at most 60); it delays each request without "
                                             "holding the server process. Null: fitted (x "
                                             "host_speed / 0.4).")
    api_server_per_request_s: float | None = Field(
        None, ge=0, le=60.0, description="API server CPU time per request beyond its measured "
        "work (the HTTP route, request validation, the response's set-up), s (at most 60); it "
        "holds the server process like the measured work, so a burst's requests share it and "
        "wait for one another. Null: fitted (x host_speed / 0.4).")
    chat_template_parse: Literal["cached", "per_request"] = Field(
        "cached", description="How the API server resolves a chat request's Hugging Face chat "
        "template (workload.endpoint chat_completions): cached, as vLLM does apart from 0.11.0 "
        "(measured: 0.4 ms a request more than a completions request); per_request, as vLLM "
        "0.11.0 does: it parses the template again for every request to find the variables it "
        "reads (resolve_chat_template_kwargs), on the server's event loop (measured: 16 ms a "
        "request on the measuring CPU for Qwen3's template). Both scaled by host_speed.")
    api_server_count: int = Field(1, ge=1, le=1024, description="API server processes (vLLM "
                                  "--api-server-count): requests arriving faster than they "
                                  "handle their paths queue before the engine.")

    @property
    def api_server(self) -> bool:
        """Whether requests pass through vLLM's API server (its per-token streaming and
        per-request path modelled)."""
        return self.model == "vllm" and self.entrypoint == "api_server"

    @field_validator("cpu_costs")
    @classmethod
    def _shipped_costs(cls, name: str) -> str:
        _cpu_costs_path(name)
        return name

    @model_validator(mode="after")
    def _check(self) -> "HostConfig":
        if self.model == "constant":
            unread = away_from_default(self, "cpu_costs", "host_speed", *FITTED_KEYS)
            if unread:
                raise ValueError(f"{unread[0]}: has no effect with model: constant, which "
                                 "takes only compute.roofline.step_overhead_s per step (use "
                                 "model: vllm)")
        if self.entrypoint == "offline":
            unread = [f for f in ("api_server_per_token_s", "request_overhead_s",
                                  "api_server_per_request_s") if getattr(self, f) is not None]
            if unread:
                raise ValueError(f"{unread[0]}: has no effect with entrypoint: offline, which "
                                 "has no API server")
        if self.model == "constant" and self.entrypoint == "offline":
            raise ValueError("entrypoint: offline has no effect with model: constant, which "
                             "models no API server (use model: vllm)")
        if self.chat_template_parse != "cached" and not self.api_server:
            raise ValueError("chat_template_parse has no effect without an API server (model: "
                             "constant or entrypoint: offline)")
        if self.api_server_count != 1 and not self.api_server:
            raise ValueError("api_server_count has no effect without an API server (model: "
                             "constant or entrypoint: offline)")
        return self


def _cpu_costs_path(name: str) -> Path:
    """The shipped file of measured CPU costs `name`; ValueError naming the shipped ones when
    there is none (a ConfigError, naming host.cpu_costs, where the field is checked)."""
    known = sorted(p.stem for p in CPU_COSTS_DIR.glob("vllm-*.json"))
    if name not in known:       # the folder's other files are not per-step cost measurements
        raise ValueError(f"no measured CPU costs {name!r} (shipped: {', '.join(known)})")
    return CPU_COSTS_DIR / f"{name}.json"


@lru_cache(maxsize=4)
def _cpu_costs(name: str) -> dict:
    try:
        path = _cpu_costs_path(name)
    except ValueError as err:
        raise ConfigError(f"host.cpu_costs: {err}") from None
    return json.loads(path.read_text(encoding="utf-8"))


def reference_times(name: str = DEFAULT_CPU_COSTS) -> dict:
    """The reference Python workloads' times on the CPU that measured the CPU costs `name`,
    taken at the start of its run: what measurements from other CPUs are scaled to it by
    (`_on_cpu_of`), and a host's speed is measured against (`dse calibrate --host`)."""
    return _cpu_costs(name)["python_reference"]["start"]


def measuring_cpu(name: str = DEFAULT_CPU_COSTS) -> dict:
    """What the CPU-cost measurement `name` recorded of its CPU (model, cores, ...)."""
    return dict(_cpu_costs(name).get("cpu") or {})


CHAT_COSTS = CPU_COSTS_DIR / "chat_template.json"
STREAMING_COSTS = CPU_COSTS_DIR / "streaming.json"
TOKENIZER_COSTS = CPU_COSTS_DIR / "tokenizer_thread.json"
TOKENIZE_RUN = "Llama 3"
"""The tokenizer of `tokenizer_thread.json` whose measured cost the tokenizer thread takes:
Llama 3's, the tokenizer of the shipped CPU-cost measurement, measured on the same machine on
an idle CPU (the text-prompt series of `vllm-0.33-cpu-amd-epyc-zen3-2vcpu.json`, measured while
other work loaded the machine, gives some 5x more per token)."""


@lru_cache(maxsize=None)
def _measured(path) -> dict:
    """A measurement file's contents (chat_template.json, streaming.json), read once."""
    return json.loads(path.read_text(encoding="utf-8"))


def _on_cpu_of(seconds: float, measured: dict, cpu_costs: str) -> float:
    """`seconds` measured on the CPU of file `measured`, taken to the CPU that measured
    `cpu_costs` by the ratio of their Python reference times (method calls: interpreted
    object code, as vLLM's serving code is)."""
    ref = reference_times(cpu_costs)["method_calls_1e3_s"]
    return seconds * ref / measured["python_reference"]["method_calls_1e3_s"]


def tokenize_fit() -> dict:
    """a (s) and c_per_token (s) of one prompt's tokenization on the measuring CPU, measured
    alone (`tokenizer_thread.json`, the `TOKENIZE_RUN` tokenizer's fit)."""
    for run in _measured(TOKENIZER_COSTS)["runs"]:
        if run["tokenizer"].startswith(TOKENIZE_RUN):
            return run["fit"]
    raise ConfigError(f"{TOKENIZER_COSTS.name}: no {TOKENIZE_RUN} tokenizer run")


def streaming_token_s(endpoint: str, cpu_costs: str) -> float:
    """The API server's CPU time to stream one token to a client (s) on the CPU that measured
    `cpu_costs`: vLLM's streaming response generator for `endpoint` (completions or
    chat_completions: building the chunk's pydantic objects, serializing them) and the HTTP
    layer's send of the chunk (FastAPI's StreamingResponse under uvicorn), as measured
    (`streaming.json`)."""
    data = _measured(STREAMING_COSTS)
    return _on_cpu_of(data["per_token_s"][endpoint], data, cpu_costs)


def chat_template_s(parse: str, cpu_costs: str) -> float:
    """The API server's CPU time of a chat request beyond a completions request's, on the CPU
    that measured `cpu_costs` (s): the measured extra of vLLM's chat path with a Hugging Face
    chat template (`chat_template.json`, `parse` cached or per_request)."""
    chat = _measured(CHAT_COSTS)
    return _on_cpu_of(chat["chat_extra_s"][parse], chat, cpu_costs)


@lru_cache(maxsize=1)
def _fitted() -> dict:
    """fitted.json's contents (empty when no fit has been written), read once."""
    if not FITTED.is_file():
        return {}
    return json.loads(FITTED.read_text(encoding="utf-8"))


def fitted_parameters() -> dict[str, float]:
    """The five fitted CPU-side parameters (zero where no fit has written one)."""
    params = _fitted().get("parameters", {})
    return {k: float(params.get(k, 0.0)) for k in FITTED_KEYS}


FITTED_COMPUTE = {"compute_bound_scale": 1.0, "collective_skew_s": 0.0,
                  "graphless_collective_scale": 1.0}
"""The calibrated compute model's fitted settings (`compute.<name>`), each with the value that
leaves the measured kernels as they are, taken where no fit has written one."""


def fitted_compute(name: str) -> float:
    """The fitted `compute.<name>` of `FITTED_COMPUTE`: fitted with the CPU-side parameters, on
    the same cases (`scripts/fit_host_overheads.py`)."""
    return float(_fitted().get("parameters", {}).get(name, FITTED_COMPUTE[name]))


def fitted_cases() -> list[str]:
    """The ids of the validation cases the shipped fit was fitted on (empty when no fit has been
    written)."""
    return list(_fitted().get("fit_cases", []))


def fitted_residuals() -> dict[str, dict]:
    """Per metric family, the out-of-sample residuals log(measured / predicted) of the fit cases
    (`values`: each fold of sources at parameters fitted on the other folds) and their
    quantiles; empty when none were written."""
    return _fitted().get("residuals", {})


def fitted_host_speed() -> float:
    """The `host_speed` the shipped parameters were fitted at: that of every fit case (the
    default where no fit has said)."""
    return float(_fitted().get("host_speed", HostConfig.model_fields["host_speed"].default))


def host_parameter(cfg: HostConfig, name: str) -> float:
    """One of `FITTED_KEYS` as the config sets it (the deployment's own figure), or, where it
    leaves it null, its fitted value moved from the fit's host speed to the config's: each is
    CPU time, or latency made of CPU work, on the fit cases' hosts, so a CPU twice as fast
    takes half of it, as it does of the measured costs."""
    v = getattr(cfg, name)
    if v is not None:
        return float(v)
    return fitted_parameters()[name] * (cfg.host_speed / fitted_host_speed())


def step_period(gpu_s, cpu_s, frontend_s, runner_s, is_async):
    """A step's period from its GPU busy time, the engine core's CPU time, the API server's
    time and the model runner's: sync scheduling adds the engine's CPU time to the GPU's; async
    scheduling overlaps vLLM's scheduler (measured) with the GPU but not the model runner's
    fitted time, which precedes the step's GPU work either way; the API server's pace bounds
    the step from below. Plain Python over numbers, so that the compiled quiet-run timing
    (`simcore.compute.decode_steps`) runs this same source."""
    if is_async:
        engine = max(gpu_s + runner_s, cpu_s - runner_s)
    else:
        engine = gpu_s + cpu_s
    return max(engine, frontend_s)


class HostOverheads:
    """The CPU costs of one engine and its API server; immutable.

    Per step, the engine core's time is a + b_decode x decoding sequences + b_prefill x
    prefilling sequences + c_prefill x their tokens (the measured scheduler's schedule, update
    and output encoding, scaled by the host speed, plus the model runner's terms); the API
    server's is out_a + (out_b + streaming + api_server_per_token_s) x sampled tokens, the
    streaming that of the requests' `endpoint` (completions or chat_completions)."""

    __slots__ = ("async_scheduling", "request_overhead_s", "host_speed", "entrypoint",
                 "api_server_count", "_a", "_b_decode", "_tok_a", "_tok_c",
                 "_b_prefill", "_c_prefill", "_out_a", "_out_b", "_mr_step", "_mr_seq",
                 "_api_tok", "_req_a", "_req_c", "_req_x", "chat_request_s", "endpoint",
                 "_stream_tok")

    def __init__(self, cfg: HostConfig, *, async_scheduling: bool = False, scale: float = 1.0,
                 endpoint: str = "completions"):
        fits = _cpu_costs(cfg.cpu_costs)["fits"]
        sd, sp = fits["schedule_decode"], fits["schedule_prefill"]
        ud, up = fits["update_decode"], fits["update_prefill"]
        enc, dec = fits["ipc_outputs_encode"], fits["ipc_outputs_decode"]
        out = fits["output_processor_decode"]
        s = cfg.host_speed * scale
        self.host_speed = cfg.host_speed
        self.async_scheduling = async_scheduling
        self._mr_step = scale * host_parameter(cfg, "model_runner_step_s")
        self._mr_seq = scale * host_parameter(cfg, "model_runner_per_seq_s")
        server = cfg.api_server
        self.entrypoint = cfg.entrypoint
        self.api_server_count = cfg.api_server_count
        self._api_tok = scale * host_parameter(cfg, "api_server_per_token_s") if server else 0.0
        self.request_overhead_s = (scale * host_parameter(cfg, "request_overhead_s") if server
                                   else 0.0)
        # The engine core also encodes each step's outputs for the API server.
        self._a = self._mr_step + s * (sd["a"] + ud["a"] + enc["a"])
        self._b_decode = self._mr_seq + s * (sd["b_per_seq"] + ud["b_per_seq"]
                                             + enc["b_per_seq"])
        self._b_prefill = self._mr_seq + s * (sp["b_per_seq"] + up["b_per_seq"])
        self._c_prefill = s * (sp["c_per_token"] + up["c_per_token"])
        self._out_a = s * (out["a"] + dec["a"])
        # Streaming each sampled token to its client (`endpoint`'s response generator and the
        # HTTP send), measured; api_server_per_token_s is what the fit adds beyond it.
        self.endpoint = endpoint
        self._stream_tok = s * streaming_token_s(endpoint, cfg.cpu_costs) if server else 0.0
        self._out_b = (s * (out["b_per_seq"] + dec["b_per_seq"]) + self._stream_tok
                       + self._api_tok)
        # The front end's work on a new request on the event loop: input processing of the
        # tokenized prompt, the output processor's request state, the msgpack hand-off (both
        # ends).
        path = (fits["add_request_input_processor"], fits["add_request_output_processor"],
                fits["add_request_ipc"])
        self._req_a = s * sum(f["a"] for f in path) if server else 0.0
        self._req_c = s * sum(f["c_per_token"] for f in path) if server else 0.0
        # Tokenizing the text prompt, on the server's tokenizer thread: the tokenizer's call
        # measured alone on an idle CPU.
        tok = tokenize_fit()
        self._tok_a = s * tok["a"] if server else 0.0
        self._tok_c = s * tok["c_per_token"] if server else 0.0
        # The server's own work on a request beyond what was measured (fitted).
        self._req_x = (scale * host_parameter(cfg, "api_server_per_request_s") if server
                       else 0.0)
        # A chat request's extra work on its chat template (`chat_template_parse`), where the
        # request is a chat request of a model with a Jinja template (`simcore.simulate`).
        self.chat_request_s = (s * chat_template_s(cfg.chat_template_parse, cfg.cpu_costs)
                               if server else 0.0)

    def request_cpu_s(self, prompt_len: int) -> float:
        """The API server event loop's CPU time on one request of `prompt_len` tokens before the
        engine sees it, s (0 without an API server): it holds a server process."""
        return self._req_a + self._req_x + self._req_c * prompt_len

    def tokenize_s(self, prompt_len: int) -> float:
        """The API server's tokenizer thread's time on one prompt of `prompt_len` tokens, s (0
        without an API server): beside the event loop, one prompt after another."""
        return self._tok_a + self._tok_c * prompt_len

    def engine_s(self, num_seqs: int, num_tokens: int, num_decode: int) -> float:
        """The engine core's CPU time of one step, s."""
        return (self._a + self._b_decode * num_decode
                + self._b_prefill * (num_seqs - num_decode)
                + self._c_prefill * (num_tokens - num_decode))

    def frontend_s(self, num_sampled: int) -> float:
        """The API server's time for one step's sampled tokens, s."""
        if num_sampled <= 0:
            return 0.0
        return self._out_a + self._out_b * num_sampled

    def runner_s(self, num_seqs: int) -> float:
        """The model runner's fitted share of a step's engine time, s: on the GPU's critical
        path under async scheduling too."""
        return self._mr_step + self._mr_seq * num_seqs

    def step_total_s(self, gpu_s: float, num_seqs: int, num_tokens: int,
                     num_decode: int) -> float:
        """The step's period given the GPU's busy time, s."""
        return self._period(gpu_s, self.engine_s(num_seqs, num_tokens, num_decode),
                            self.frontend_s(num_decode), self.runner_s(num_seqs))

    def _period(self, gpu_s: float, cpu_s: float, frontend_s: float, runner_s: float) -> float:
        """`step_period` under this host's scheduling mode."""
        return step_period(gpu_s, cpu_s, frontend_s, runner_s, self.async_scheduling)

    def group_engine_s(self, shapes) -> float:
        """The engine-core CPU time of a lock-step step whose ranks run `shapes` (real batches,
        no dummies), s: each rank's core plans its own batch; the group waits for the slowest."""
        return max((self.engine_s(s.num_seqs, s.num_tokens, s.num_decode_seqs) for s in shapes),
                   default=0.0)

    def group_frontend_s(self, shapes) -> float:
        """The API server's time for the slowest rank's sampled tokens of such a step, s."""
        return max((self.frontend_s(s.num_decode_seqs) for s in shapes), default=0.0)

    def group_total_s(self, gpu_s: float, shapes) -> float:
        """The period of a lock-step group's step (expert parallelism) given the GPU's busy
        time, s: every rank's engine core plans its own batch, so the group waits for the
        slowest (dummy batches cost no scheduling)."""
        real = [s for s in shapes if not s.is_dummy]
        return self._period(gpu_s, self.group_engine_s(real), self.group_frontend_s(real),
                            self.group_runner_s(real))

    def group_runner_s(self, shapes) -> float:
        """The slowest rank's model-runner time of a lock-step step, s (`runner_s`)."""
        return max((self.runner_s(s.num_seqs) for s in shapes), default=0.0)

    def assumption_lines(self) -> list[str]:
        return [f"CPU side: vLLM's scheduler and output processor as measured, x "
                f"{self.host_speed:g} for the host's CPU speed (declared), model runner "
                f"{self._mr_step * 1e6:.0f} us + {self._mr_seq * 1e6:.1f} us/sequence per step, "
                + (f"API server streaming {self._stream_tok * 1e6:.1f} us/token measured "
                   f"({self.endpoint.replace('_', ' ')} responses) + "
                   f"{self._api_tok * 1e6:.1f} us/token fitted, "
                   f"{self.request_overhead_s * 1e3:.1f} ms/request of latency (fitted on the "
                   f"end-to-end set) after its work on each request: the prompt tokenized on "
                   f"the tokenizer thread, one at a time ({self._tok_a * 1e3:.2f} ms + "
                   f"{self._tok_c * 1e6:.2f} us/prompt token measured), then the event loop's "
                   f"work ({self._req_a * 1e3:.2f} ms + {self._req_c * 1e6:.2f} us/prompt "
                   f"token measured, {self._req_x * 1e3:.1f} ms fitted), "
                   f"requests sharing the event loop of {self.api_server_count} server process"
                   f"{'es' if self.api_server_count > 1 else ''}; "
                   if self.entrypoint == "api_server" else
                   "offline (LLM class): no API server; ")
                + ("async scheduling: vLLM's scheduler overlaps the GPU, the model "
                   "runner's time does not"
                   if self.async_scheduling else
                   "sync scheduling: the engine's CPU time adds to the GPU's")]
