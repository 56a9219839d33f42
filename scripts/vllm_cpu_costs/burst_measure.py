"""vLLM's whole API server under a burst of chat requests, with an engine core whose steps take
a declared time: how much later than the engine's steps the client sees its tokens.

The server is vLLM's own (`vllm.entrypoints.openai.api_server.build_app` and `init_app_state`,
served by uvicorn in one process, as `vllm serve` runs it) in front of vLLM's own `AsyncLLM`
front end (its `Processor`, `OutputProcessor` with incremental detokenization, request output
collectors and output handler), whose engine core client is replaced by a fake: a thread that
plays the engine core process. Each step it admits the waiting requests (at most
`--max-num-seqs` running, chunked prefill within `--max-num-batched-tokens`, no KV limit),
sleeps for the step's declared time `a + b x sequences + c x prefill tokens`, and hands the step's
`EngineCoreOutputs` (one sampled token per running request whose prompt is done) to the event
loop, as the engine core's output socket does. The engine's steps therefore never wait for the
API server; the server's event loop processes them when it can.

The client is `vllm bench serve` of the same vLLM (another process), here `--backend
openai-chat` on random prompts with `--ignore-eos`. The engine thread logs every step's end
time and sequences; the comparison: the client's TTFT, TPOT and ITL against the same figures
made from the engine's own step ends (what a client would see from a server that takes no
time).

    PYTHONPATH=/tmp/vllm-env/src HF_HUB_OFFLINE=1 /tmp/vllm-env/venv/bin/python \\
        burst_measure.py --model /tmp/qwen3-8b --num-prompts 1000 --out burst.json
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


class FakeCore:
    """The engine core client AsyncLLM talks to: requests in, one EngineCoreOutputs a step out."""

    def __init__(self, loop, step, max_num_seqs: int, budget: int, token_ids: list[int]):
        from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, FinishReason

        self._out, self._outs, self._length = EngineCoreOutput, EngineCoreOutputs, FinishReason.LENGTH
        self.loop = loop
        self.step = step                      # (a, b, c)
        self.max_num_seqs, self.budget = max_num_seqs, budget
        self.token_ids = token_ids
        self.resources = SimpleNamespace(engine_dead=False)
        self.outputs: asyncio.Queue = asyncio.Queue()
        self.lock = threading.Lock()
        self.waiting: collections.deque = collections.deque()
        self.aborted: set[str] = set()
        # Per step: (end, tokens sampled, prefill tokens, requests admitted, first tokens).
        self.log: list[tuple[float, int, int, int, int]] = []
        self.stop = False
        threading.Thread(target=self._run, daemon=True).start()

    async def get_supported_tasks_async(self):
        return ("generate",)

    async def add_request_async(self, request) -> None:
        with self.lock:
            self.waiting.append([request.request_id, len(request.prompt_token_ids),
                                 request.sampling_params.max_tokens, 0, 0])
            # [id, prompt tokens, max tokens, prompt tokens done, tokens sampled]

    async def abort_requests_async(self, ids) -> None:
        if ids:
            with self.lock:
                self.aborted.update(ids)

    async def get_output_async(self):
        return await self.outputs.get()

    def _run(self) -> None:
        a, b, c = self.step
        running: list[list] = []
        while not self.stop:
            with self.lock:
                running = [r for r in running if r[0] not in self.aborted]
                budget = self.budget - sum(1 for r in running if r[3] >= r[1])
                admitted = 0
                while self.waiting and len(running) < self.max_num_seqs and budget > 0:
                    running.append(self.waiting.popleft())
                    budget -= 1            # at least a token of it this step
                    admitted += 1
            if not running:
                time.sleep(0.001)
                continue
            budget = self.budget - sum(1 for r in running if r[3] >= r[1])
            prefill = 0
            sampled = []
            for r in running:
                if r[3] < r[1]:                      # prefilling: a chunk within the budget
                    n = min(r[1] - r[3], max(budget, 0))
                    r[3] += n
                    budget -= n
                    prefill += n
                    if r[3] >= r[1]:
                        sampled.append(r)            # the prompt's last chunk samples a token
                else:
                    sampled.append(r)
            time.sleep(a + b * len(running) + c * prefill)
            outs = []
            first = sum(1 for r in sampled if r[4] == 0)
            for r in sampled:
                r[4] += 1
                done = r[4] >= r[2]
                outs.append(self._out(request_id=r[0],
                                      new_token_ids=[self.token_ids[r[4] % len(self.token_ids)]],
                                      finish_reason=self._length if done else None))
            running = [r for r in running if r[4] < r[2]]
            end = time.monotonic()
            self.log.append((end, len(sampled), prefill, admitted, first))
            batch = self._outs(outputs=outs, timestamp=end)
            self.loop.call_soon_threadsafe(self.outputs.put_nowait, batch)


def make_llm(vc, core):
    """vLLM's AsyncLLM front end with `core` as its engine core client (no engine process)."""
    from vllm.transformers_utils.tokenizer import init_tokenizer_from_configs
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.engine.output_processor import OutputProcessor
    from vllm.v1.engine.processor import Processor

    llm = AsyncLLM.__new__(AsyncLLM)
    llm.model_config, llm.vllm_config = vc.model_config, vc
    if vc.observability_config is None:
        from vllm.config import ObservabilityConfig

        vc.observability_config = ObservabilityConfig()
    llm.observability_config = vc.observability_config
    llm.log_requests, llm.log_stats = False, False
    llm.tokenizer = init_tokenizer_from_configs(model_config=vc.model_config)
    llm.processor = Processor(vllm_config=vc, tokenizer=llm.tokenizer)
    llm.output_processor = OutputProcessor(llm.tokenizer, log_stats=False)
    llm.engine_core = core
    llm.logger_manager = None
    llm.output_handler = None
    llm.profiler = None
    return llm


def serve(opts) -> None:
    import uvicorn
    from vllm.config import DeviceConfig, ModelConfig, VllmConfig
    from vllm.platforms import current_platform

    current_platform.device_type = "cpu"     # no accelerator: only the front end runs here
    from vllm.entrypoints.openai.api_server import build_app, init_app_state
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    from vllm.utils import FlexibleArgumentParser

    args = make_arg_parser(FlexibleArgumentParser()).parse_args(
        ["--model", opts.model, "--max-model-len", "40960", "--disable-log-stats",
         "--disable-uvicorn-access-log"])
    mc = ModelConfig(model=opts.model, tokenizer=opts.model, dtype="bfloat16",
                     max_model_len=40960)
    vc = VllmConfig(model_config=mc, device_config=DeviceConfig(device="cpu"))

    async def main():
        loop = asyncio.get_running_loop()
        from vllm.transformers_utils.tokenizer import init_tokenizer_from_configs
        tok = init_tokenizer_from_configs(model_config=mc)
        ids = tok.encode("The quick brown fox jumps over the lazy dog while the engine keeps "
                         "stepping and the server streams every token to its client.")
        core = FakeCore(loop, (opts.step_a, opts.step_b, opts.step_c), opts.max_num_seqs,
                        opts.max_num_batched_tokens, ids)
        llm = make_llm(vc, core)
        app = build_app(args)
        await init_app_state(llm, vc, app.state, args)

        @app.get("/engine_log")
        async def engine_log():
            return {"steps": core.log}

        config = uvicorn.Config(app, host="127.0.0.1", port=opts.port, log_level="warning",
                                timeout_keep_alive=60)
        await uvicorn.Server(config).serve()
    asyncio.run(main())


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--port", type=int, default=18765)
    ap.add_argument("--serve", action="store_true", help="(internal) run the server")
    ap.add_argument("--num-prompts", type=int, default=1000)
    ap.add_argument("--input-len", type=int, default=220)
    ap.add_argument("--output-len", type=int, default=200)
    ap.add_argument("--max-concurrency", type=int, default=None)
    ap.add_argument("--step-a", type=float, default=0.02, help="step time, s")
    ap.add_argument("--step-b", type=float, default=4e-5, help="per running sequence, s")
    ap.add_argument("--step-c", type=float, default=3e-5, help="per prefill token, s")
    ap.add_argument("--max-num-seqs", type=int, default=1024)
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    ap.add_argument("--out", default="burst.json")
    ap.add_argument("--client", action="store_true",
                    help="(internal) run vllm bench serve with the arguments after --")
    argv = sys.argv[1:]
    rest = []
    if "--" in argv:
        rest = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    opts = ap.parse_args(argv)
    if opts.client:
        from vllm.platforms import current_platform

        current_platform.device_type = "cpu"
        from vllm.benchmarks import serve as bench

        parser = argparse.ArgumentParser()
        bench.add_cli_args(parser)
        bench.main(parser.parse_args(rest))
        return
    if opts.serve:
        serve(opts)
        return
    env = dict(os.environ)
    server = subprocess.Popen([sys.executable, __file__, "--serve", *argv], env=env)
    try:
        import urllib.request
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{opts.port}/v1/models", timeout=1)
                break
            except Exception:
                time.sleep(0.5)
        result = f"/tmp/burst_client_{os.getpid()}.json"
        cmd = [sys.executable, __file__, "--client", "--model", opts.model, "--",
               "--backend", "openai-chat", "--endpoint", "/v1/chat/completions",
               "--base-url", f"http://127.0.0.1:{opts.port}", "--model", opts.model,
               "--dataset-name", "random", "--random-input-len", str(opts.input_len),
               "--random-output-len", str(opts.output_len), "--num-prompts",
               str(opts.num_prompts), "--ignore-eos", "--save-result", "--save-detailed",
               "--result-filename", result, "--seed", "0",
               "--ready-check-timeout-sec", "30"]
        if opts.max_concurrency:
            cmd += ["--max-concurrency", str(opts.max_concurrency)]
        t0 = time.monotonic()
        subprocess.run(cmd, check=True, env=env)
        log = json.loads(urllib.request.urlopen(
            f"http://127.0.0.1:{opts.port}/engine_log", timeout=30).read())["steps"]
        client = json.load(open(result))
    finally:
        server.terminate()
        server.wait()
    gaps = [b[0] - a[0] for a, b in zip(log, log[1:])]
    keys = ["duration", "output_throughput", "max_output_tokens_per_s", "mean_ttft_ms",
            "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms",
            "mean_itl_ms", "median_itl_ms", "p99_itl_ms"]
    out = {"options": vars(opts), "client": {k: client.get(k) for k in keys},
           "engine": {"steps": len(log), "span_s": log[-1][0] - log[0][0] if log else 0,
                      "mean_step_ms": 1e3 * statistics.fmean(gaps) if gaps else None,
                      "median_step_ms": 1e3 * pct(gaps, 0.5) if gaps else None,
                      "p99_step_ms": 1e3 * pct(gaps, 0.99) if gaps else None,
                      "max_seqs": max((s[1] for s in log), default=0)},
           "started_monotonic": t0, "engine_steps": log,
           "client_ttfts_s": client.get("ttfts"),
           "client_itls_s": client.get("itls")}
    json.dump(out, open(opts.out, "w"), indent=1)
    print(json.dumps({k: out[k] for k in ("client", "engine")}, indent=1))


if __name__ == "__main__":
    main()
