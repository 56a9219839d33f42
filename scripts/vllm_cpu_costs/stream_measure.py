"""Per-token and per-request CPU cost of vLLM's OpenAI streaming response generators.

Drives vLLM's own OpenAIServingChat / OpenAIServingCompletion (no engine, no GPU) with a fake
engine client whose generate() yields N RequestOutput deltas (RequestOutputKind.DELTA: one new
token id + its text per output, prompt_token_ids on every output, the last one finished with
finish_reason "length"), for stream=True requests shaped like `vllm bench serve`'s
(stream_options.include_usage=True). The RequestOutputs are built before timing starts, so the
OutputProcessor's work (detokenization, RequestOutput construction) is excluded; the
RequestOutput/CompletionOutput construction cost is reported apart ("request_output_build").

Timed per request (time.perf_counter_ns wall, time.process_time_ns CPU of the process):
  create   create_chat_completion / create_completion until it returns the stream generator
           (request preprocessing: chat template, tokenization, sampling params) - reported apart
  stream   iterating the returned generator to exhaustion; every SSE string is .encode("utf-8")d
           as Starlette's StreamingResponse does (the ASGI send / socket write is NOT included)

Modes:
  direct    one stream at a time; the fake generate() yields its pre-built outputs without
            suspending (pure generator cost)
  stepped   B streams interleaved on one event loop; a producer task plays the output handler:
            each step it put()s the next delta of every live stream into that stream's vLLM
            RequestOutputCollector, then lets the loop run until every collector is drained (so
            each delta carries exactly one token); the fake generate() is AsyncLLM.generate's
            loop (`out = q.get_nowait() or await q.get()`). Includes event-loop task switching.
  baseline  the same harness consuming the fake generate() directly (no vLLM serving code), to
            show the harness's own share

Fit: per-stream stream CPU t(N) = a + b*N by least squares over the per-N means (and medians).

Usage (from this folder, with a vLLM environment as ../vllm_conformance/setup.sh builds one; a
model folder with the tokenizer and config of the model whose chat template and tokens to use,
e.g. Qwen3-8B's, and sharegpt_prompts.py's prompts):
  HF_HUB_OFFLINE=1 PYTHONPATH=/tmp/vllm-env/src /tmp/vllm-env/venv/bin/python \
      stream_measure.py --model /tmp/qwen3-8b --prompts prompts.json --out stream.json
  ... stream_measure.py --transport --out transport.json     # the HTTP layer alone
The Python reference workload (pyref.py) is timed at the start and at the end of each run.
"""
import argparse
import asyncio
import cProfile
import gc
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import time
import traceback

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import vllm  # noqa: E402
from pyref import python_reference  # noqa: E402

V = vllm.__version__
OLD = V.startswith("0.11")

from vllm.outputs import CompletionOutput, RequestOutput  # noqa: E402
from vllm.sampling_params import RequestOutputKind  # noqa: E402
from vllm.v1.engine.output_processor import RequestOutputCollector  # noqa: E402


def loadavg():
    return [round(x, 2) for x in os.getloadavg()]


def st(xs, scale=1e3):
    """stats of ns samples, in us (scale=1e3)."""
    xs = sorted(xs)
    n = len(xs)
    return {"n": n, "mean_us": round(statistics.fmean(xs) / scale, 3),
            "median_us": round(xs[n // 2] / scale, 3),
            "p10_us": round(xs[int(0.1 * n)] / scale, 3),
            "p90_us": round(xs[min(n - 1, int(0.9 * n))] / scale, 3),
            "stdev_us": round(statistics.pstdev(xs) / scale, 3)}


def fit(ns, ts):
    """least squares t = a + b*n."""
    mn, mt = statistics.fmean(ns), statistics.fmean(ts)
    b = sum((n - mn) * (t - mt) for n, t in zip(ns, ts)) / sum((n - mn) ** 2 for n in ns)
    return {"a_us": round(mt - b * mn, 2), "b_us_per_token": round(b, 3)}


# ---------------------------------------------------------------- fake engine
class Plan:
    """What the fake engine hands out next: outputs for the next generate() call."""

    def __init__(self):
        self.pending = []          # list of (mode, outputs) consumed FIFO by generate()
        self.collectors = []       # stepped mode: (collector, outputs) of live streams


def make_outputs(request_id, prompt_ids, tok_ids, texts, n, v033):
    outs = []
    for k in range(n):
        last = k == n - 1
        co = CompletionOutput(index=0, text=texts[k % len(texts)], token_ids=[tok_ids[k % len(tok_ids)]],
                              cumulative_logprob=None, logprobs=None,
                              finish_reason="length" if last else None,
                              stop_reason=None)
        kw = dict(request_id=request_id, prompt=None, prompt_token_ids=prompt_ids,
                  prompt_logprobs=None, outputs=[co], finished=last, kv_transfer_params=None,
                  num_cached_tokens=0)
        if v033:
            kw.update(num_cache_creation_tokens=None, metrics=None, lora_request=None,
                      prompt_token_id_logprobs=None, ec_transfer_params=None)
        outs.append(RequestOutput(**kw))
    return outs


def prompt_parts(p):
    """(prompt text, prompt token ids) of an engine input, as AsyncLLM.add_request takes them."""
    if isinstance(p, dict):
        if "prompt_token_ids" in p or "prompt" in p:
            return p.get("prompt"), p.get("prompt_token_ids")
        for k in ("decoder_prompt", "encoder_prompt"):
            if isinstance(p.get(k), dict):
                return prompt_parts(p[k])
    return getattr(p, "prompt", None), getattr(p, "prompt_token_ids", None)


def fake_generate(plan):
    def generate(prompt, sampling_params, request_id, **kw):
        assert sampling_params.output_kind == RequestOutputKind.DELTA, sampling_params.output_kind
        mode, outs = plan.pending.pop(0)
        # as the OutputProcessor would: prompt text + prompt token ids of the engine input
        ptxt, pids = prompt_parts(prompt)
        plan.last_prompt = (type(prompt).__name__, sorted(prompt) if isinstance(prompt, dict)
                            else None, ptxt is not None, len(pids) if pids else None)
        for o in outs:
            o.prompt = ptxt
            if pids is not None:
                o.prompt_token_ids = pids
        if mode == "direct":
            async def gen():
                for o in outs:
                    yield o
            return gen()
        q = RequestOutputCollector(RequestOutputKind.DELTA) if OLD else \
            RequestOutputCollector(RequestOutputKind.DELTA, request_id)
        plan.collectors.append((q, outs))

        async def gen():       # AsyncLLM.generate's consumer loop
            finished = False
            while not finished:
                out = q.get_nowait() or await q.get()
                finished = out.finished
                yield out
        return gen()
    return generate


# ---------------------------------------------------------------- set-up per version
class EngineStub:
    """What the serving classes ask of an engine client besides generate(): a live engine, the
    tokenizer, no tracing."""

    errored = False
    dead_error = RuntimeError("dead")

    def __init__(self, tok):
        self._tok = tok

    async def get_tokenizer(self, lora_request=None):
        return self._tok

    async def is_tracing_enabled(self):
        return False


def setup_011(model, served, plan):
    from vllm.config import ModelConfig
    from vllm.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
    from vllm.entrypoints.openai.serving_chat import OpenAIServingChat
    from vllm.entrypoints.openai.serving_completion import OpenAIServingCompletion
    from vllm.entrypoints.openai.serving_models import BaseModelPath, OpenAIServingModels
    from vllm.transformers_utils.tokenizer import init_tokenizer_from_configs

    mc = ModelConfig(model=model, tokenizer=model, dtype="bfloat16", max_model_len=40960)
    tok = init_tokenizer_from_configs(model_config=mc)

    class FakeEngine(EngineStub):
        model_config = mc

    eng = FakeEngine(tok)
    eng.generate = fake_generate(plan)
    models = OpenAIServingModels(eng, mc, [BaseModelPath(name=served, model_path=model)])
    chat = OpenAIServingChat(eng, mc, models, "assistant", request_logger=None,
                             chat_template=None, chat_template_content_format="auto")
    cmpl = OpenAIServingCompletion(eng, mc, models, request_logger=None)
    return dict(tok=tok, chat=chat, cmpl=cmpl, ChatReq=ChatCompletionRequest,
                CmplReq=CompletionRequest,
                create_chat=chat.create_chat_completion, create_cmpl=cmpl.create_completion)


def setup_033(model, served, plan):
    from chat_preprocess_measure import online_renderer_033
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion
    from vllm.entrypoints.openai.models.protocol import BaseModelPath
    from vllm.entrypoints.openai.models.serving import OpenAIServingModels

    mc, vcfg, renderer, tok, onl = online_renderer_033(model)

    class FakeEngine(EngineStub):
        model_config = mc
        vllm_config = vcfg
        is_running = True
        is_stopped = False
        input_processor = None

        def check_admission(self, n=1, request_id=None):
            return None

    eng = FakeEngine(tok)
    eng.renderer = renderer
    eng.generate = fake_generate(plan)
    models = OpenAIServingModels(eng, [BaseModelPath(name=served, model_path=model)])
    chat = OpenAIServingChat(eng, models, "assistant", online_renderer=onl,
                             request_logger=None, chat_template=None,
                             chat_template_content_format="auto")
    cmpl = OpenAIServingCompletion(eng, models, online_renderer=onl, request_logger=None)
    return dict(tok=tok, chat=chat, cmpl=cmpl, ChatReq=ChatCompletionRequest,
                CmplReq=CompletionRequest,
                create_chat=chat.create_chat_completion, create_cmpl=cmpl.create_completion)


# ---------------------------------------------------------------- payloads (vllm bench serve)
def payloads(served, text, n):
    if OLD:   # vllm 0.11 benchmarks/lib/endpoint_request_func.py
        chat = {"model": served, "messages": [{"role": "user", "content": text}],
                "temperature": 0.0, "max_completion_tokens": n, "stream": True,
                "stream_options": {"include_usage": True}, "ignore_eos": True}
        cmpl = {"model": served, "prompt": text, "temperature": 0.0, "repetition_penalty": 1.0,
                "max_tokens": n, "logprobs": None, "stream": True,
                "stream_options": {"include_usage": True}, "ignore_eos": True}
    else:     # vllm 0.33 benchmarks/lib/endpoint_request_func.py
        chat = {"model": served, "messages": [{"role": "user", "content": text}],
                "max_completion_tokens": n, "stream": True,
                "stream_options": {"include_usage": True}, "ignore_eos": True}
        cmpl = {"model": served, "prompt": text, "repetition_penalty": 1.0,
                "max_tokens": n, "logprobs": None, "stream": True,
                "stream_options": {"include_usage": True}, "ignore_eos": True}
    return chat, cmpl


# ---------------------------------------------------------------- runners
class Runner:
    def __init__(self, S, plan, served, text, tok_ids, texts, prompt_ids):
        self.S, self.plan, self.served, self.text = S, plan, served, text
        self.tok_ids, self.texts, self.prompt_ids = tok_ids, texts, prompt_ids
        self.last_chunks = None

    async def create(self, ep, n, mode, outs):
        chat_p, cmpl_p = payloads(self.served, self.text, n)
        self.plan.pending.append((mode, outs))
        if ep == "chat":
            g = await self.S["create_chat"](self.S["ChatReq"].model_validate(chat_p), None)
        elif ep == "cmpl":
            g = await self.S["create_cmpl"](self.S["CmplReq"].model_validate(cmpl_p), None)
        else:   # baseline: the fake engine's generator itself, rendered trivially
            g0 = fake_generate(self.plan)({"prompt_token_ids": self.prompt_ids}, _SP, "base")

            async def g1():
                async for o in g0:
                    yield f"data: {o.outputs[0].text}\n\n"
                yield "data: [DONE]\n\n"
            g = g1()
        assert not hasattr(g, "error"), g
        return g

    def outs(self, n):
        return make_outputs("r", self.prompt_ids, self.tok_ids, self.texts, n, not OLD)

    async def consume(self, g, keep=False):
        nbytes = 0
        chunks = [] if keep else None
        async for s in g:
            b = s.encode("utf-8")
            nbytes += len(b)
            if keep:
                chunks.append(s)
        if keep:
            self.last_chunks = chunks
        return nbytes

    async def direct_one(self, ep, n):
        outs = self.outs(n)
        c0, t0 = time.process_time_ns(), time.perf_counter_ns()
        g = await self.create(ep, n, "direct", outs)
        c1, t1 = time.process_time_ns(), time.perf_counter_ns()
        await self.consume(g)
        c2, t2 = time.process_time_ns(), time.perf_counter_ns()
        return c1 - c0, t1 - t0, c2 - c1, t2 - t1

    async def stepped_batch(self, ep, n, B):
        """B streams interleaved; returns (create cpu, create wall, stream cpu, stream wall) totals."""
        outs = [self.outs(n) for _ in range(B)]
        self.plan.collectors = []
        c0, t0 = time.process_time_ns(), time.perf_counter_ns()
        gens = [await self.create(ep, n, "stepped", outs[b]) for b in range(B)]
        c1, t1 = time.process_time_ns(), time.perf_counter_ns()
        cols = list(self.plan.collectors)
        assert len(cols) == B
        tasks = [asyncio.ensure_future(self.consume(g)) for g in gens]
        await asyncio.sleep(0)
        for k in range(n):            # producer = output handler, one engine step per k
            for q, o in cols:
                q.put(o[k])
            spins = 0
            while any(q.output is not None for q, _ in cols):
                await asyncio.sleep(0)
                spins += 1
                assert spins < 1000
        await asyncio.gather(*tasks)
        c2, t2 = time.process_time_ns(), time.perf_counter_ns()
        return c1 - c0, t1 - t0, c2 - c1, t2 - t1


class _SP:
    output_kind = RequestOutputKind.DELTA


def run_direct(loop, R, ep, ns, reps, warm):
    res = {}
    for n in ns:
        for _ in range(warm):
            loop.run_until_complete(R.direct_one(ep, n))
        cc, cw, sc, sw = [], [], [], []
        for _ in range(reps):
            a, b, c, d = loop.run_until_complete(R.direct_one(ep, n))
            cc.append(a); cw.append(b); sc.append(c); sw.append(d)
        res[n] = {"create_cpu": st(cc), "create_wall": st(cw), "stream_cpu": st(sc),
                  "stream_wall": st(sw), "stream_cpu_per_token_mean_us":
                  round(statistics.fmean(sc) / n / 1e3, 3), "loadavg": loadavg()}
        print(f"  direct {ep} N={n}: stream cpu mean {res[n]['stream_cpu']['mean_us']} us "
              f"median {res[n]['stream_cpu']['median_us']} us", flush=True)
    return res


def run_stepped(loop, R, ep, ns, B, reps, warm):
    res = {}
    for n in ns:
        for _ in range(warm):
            loop.run_until_complete(R.stepped_batch(ep, n, B))
        cc, cw, sc, sw = [], [], [], []
        for _ in range(reps):
            a, b, c, d = loop.run_until_complete(R.stepped_batch(ep, n, B))
            cc.append(a / B); cw.append(b / B); sc.append(c / B); sw.append(d / B)
        res[n] = {"B": B, "per_stream_create_cpu": st(cc), "per_stream_stream_cpu": st(sc),
                  "per_stream_stream_wall": st(sw), "batches": reps,
                  "stream_cpu_per_token_mean_us": round(statistics.fmean(sc) / n / 1e3, 3),
                  "loadavg": loadavg()}
        print(f"  stepped B={B} {ep} N={n}: per-stream stream cpu mean "
              f"{res[n]['per_stream_stream_cpu']['mean_us']} us", flush=True)
    return res


def add_fits(res, key):
    ns = sorted(res)
    out = {}
    for stat in ("mean_us", "median_us"):
        out[stat] = fit(ns, [res[n][key][stat] for n in ns])
    return out


def profile(loop, R, ep, n, reps, top=35):
    outs_list = [R.outs(n) for _ in range(reps)]
    gens = []
    for o in outs_list:
        gens.append(loop.run_until_complete(R.create(ep, n, "direct", o)))
    pr = cProfile.Profile()
    pr.enable()
    for g in gens:
        loop.run_until_complete(R.consume(g))
    pr.disable()
    s1, s2 = io.StringIO(), io.StringIO()
    pstats.Stats(pr, stream=s1).sort_stats("tottime").print_stats(top)
    pstats.Stats(pr, stream=s2).sort_stats("cumulative").print_stats(top)
    return {"requests": reps, "tokens_per_request": n,
            "tottime": s1.getvalue(), "cumulative": s2.getvalue()}


def components(reps=20000):
    """Per-token pieces, timed alone (process CPU, us per call): building the chunk objects as the
    generators do, model_dump_json as the generators call it, the SSE f-string + encode."""
    if OLD:
        from vllm.entrypoints.openai.protocol import (
            ChatCompletionResponseStreamChoice, ChatCompletionStreamResponse,
            CompletionResponseStreamChoice, CompletionStreamResponse, DeltaMessage)
    else:
        from vllm.entrypoints.generate.base.protocol import DeltaMessage
        from vllm.entrypoints.openai.chat_completion.protocol import (
            ChatCompletionResponseStreamChoice, ChatCompletionStreamResponse)
        from vllm.entrypoints.openai.completion.protocol import (
            CompletionResponseStreamChoice, CompletionStreamResponse)
    rid, model, created = "chatcmpl-0123456789abcdef", "Qwen/Qwen3-8B", 1700000000

    def chat_build():
        c = ChatCompletionResponseStreamChoice(index=0, delta=DeltaMessage(content=" hello"),
                                               logprobs=None, finish_reason=None, token_ids=None)
        return ChatCompletionStreamResponse(id=rid, object="chat.completion.chunk",
                                            created=created, choices=[c], model=model,
                                            **({} if OLD else {"kv_transfer_params": None}))

    def cmpl_build():
        kw = {} if OLD else {"kv_transfer_params": None}
        return CompletionStreamResponse(id=rid, created=created, model=model, choices=[
            CompletionResponseStreamChoice(index=0, text=" hello", logprobs=None,
                                           finish_reason=None, stop_reason=None,
                                           prompt_token_ids=None, token_ids=None)], **kw)
    ch, cm = chat_build(), cmpl_build()
    chat_dump = (lambda: ch.model_dump_json(exclude_unset=True)) if OLD else \
        (lambda: ch.model_dump_json(exclude_unset=True, exclude_none=False))
    cmpl_dump = (lambda: cm.model_dump_json(exclude_unset=False)) if OLD else \
        (lambda: cm.model_dump_json(exclude_unset=True))
    js = chat_dump()
    fns = {"chat: DeltaMessage()": lambda: DeltaMessage(content=" hello"),
           "chat: build chunk (DeltaMessage+Choice+StreamResponse)": chat_build,
           "chat: model_dump_json": chat_dump,
           "cmpl: build chunk (Choice+StreamResponse)": cmpl_build,
           "cmpl: model_dump_json": cmpl_dump,
           "sse f-string + encode": lambda: f"data: {js}\n\n".encode("utf-8")}
    out = {}
    for k, f in fns.items():
        for _ in range(2000):
            f()
        best = []
        for _ in range(5):
            t0 = time.process_time_ns()
            for _ in range(reps // 5):
                f()
            best.append((time.process_time_ns() - t0) / (reps // 5) / 1e3)
        out[k] = {"median_of_5_us": round(sorted(best)[2], 3), "min_us": round(min(best), 3)}
    out["chat_chunk_json_len"] = len(js)
    out["cmpl_chunk_json_len"] = len(cmpl_dump())
    return out


# ---------------------------------------------------------------- HTTP transport (apart)
CHUNK = ('data: {"id":"chatcmpl-3576855c010446b4bf31fa02496d3354","object":"chat.completion.chunk",'
         '"created":1796396857,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":{"content":'
         '" hello"},"logprobs":null,"finish_reason":null,"token_ids":null}]}\n\n')


def transport_server(port):
    """FastAPI + StreamingResponse + uvicorn (loop/http 'auto': uvloop + httptools where
    installed), serving N pre-formatted SSE strings from an async generator: the per-chunk cost
    of the HTTP layer alone, without vLLM code or vLLM's middleware."""
    import fastapi
    import uvicorn
    from fastapi.responses import StreamingResponse
    app = fastapi.FastAPI()

    @app.get("/s/{n}")
    async def s(n: int):
        async def gen():
            for _ in range(n):
                yield CHUNK
                await asyncio.sleep(0)      # one engine step per token, as in serving
            yield "data: [DONE]\n\n"
        return StreamingResponse(content=gen(), media_type="text/event-stream")

    @app.get("/cpu")
    async def cpu():
        return {"ns": time.process_time_ns()}
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def proc_cpu_ns(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) * 1e9 / os.sysconf("SC_CLK_TCK")


def transport_measure(ns, B, reps, port=18733):
    import aiohttp
    srv = subprocess.Popen([sys.executable, __file__, "--transport-server", str(port), "--out", "-"])
    try:
        async def run():
            async with aiohttp.ClientSession() as sess:
                for _ in range(100):
                    try:
                        async with sess.get(f"http://127.0.0.1:{port}/s/1") as r:
                            await r.read()
                        break
                    except aiohttp.ClientError:
                        await asyncio.sleep(0.1)

                async def one(n):
                    got = 0
                    async with sess.get(f"http://127.0.0.1:{port}/s/{n}") as r:
                        async for _ in r.content:
                            got += 1
                    return got
                async def cpu():
                    async with sess.get(f"http://127.0.0.1:{port}/cpu") as r:
                        return (await r.json())["ns"]
                probe = []
                for _ in range(50):
                    probe.append(await cpu())
                # server CPU of one /cpu call (charged once per sample below; subtracted)
                cpu_call = statistics.median(b - a for a, b in zip(probe, probe[1:]))
                res = {"cpu_probe_call_us": round(cpu_call / 1e3, 2)}
                for n in ns:
                    for _ in range(3):
                        await asyncio.gather(*[one(n) for _ in range(B)])
                    xs = []
                    for _ in range(reps):
                        c0 = await cpu()
                        await asyncio.gather(*[one(n) for _ in range(B)])
                        xs.append((await cpu() - c0 - cpu_call) / B)
                    res[n] = {"server_cpu_per_stream": st(xs), "loadavg": loadavg()}
                    print(f"  transport B={B} N={n}: server cpu per stream mean "
                          f"{res[n]['server_cpu_per_stream']['mean_us']} us", flush=True)
                return res
        res = asyncio.run(run())
    finally:
        srv.terminate()
        srv.wait()
    out = {str(n): v for n, v in res.items()}
    nn = sorted(n for n in res if isinstance(n, int))
    out["fit_mean"] = fit(nn, [res[n]["server_cpu_per_stream"]["mean_us"] for n in nn])
    out["fit_median"] = fit(nn, [res[n]["server_cpu_per_stream"]["median_us"] for n in nn])
    return out


def main():
    if "--transport-server" in sys.argv:
        transport_server(int(sys.argv[sys.argv.index("--transport-server") + 1]))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="model folder (tokenizer, config)")
    ap.add_argument("--served-name", default=None)
    ap.add_argument("--prompts", required=True,
                    help="JSON list of {text: ...} prompts (sharegpt_prompts.py)")
    ap.add_argument("--ns", default="16,64,256")
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--batch-reps", type=int, default=20)
    ap.add_argument("--profile-reps", type=int, default=40)
    ap.add_argument("--no-gc", action="store_true", help="gc.disable() during measurement")
    ap.add_argument("--only-components", action="store_true")
    ap.add_argument("--transport", action="store_true",
                    help="only the HTTP-layer measurement (FastAPI/uvicorn, no vLLM code)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    served = args.served_name or args.model
    ns = [int(x) for x in args.ns.split(",")]

    doc = {"vllm": V, "model": args.model, "python": sys.version.split()[0],
           "argv": sys.argv, "loadavg_start": loadavg(), "gc_disabled": args.no_gc,
           "python_reference_start": python_reference()}
    import pydantic, transformers  # noqa: E401
    doc["libs"] = {"pydantic": pydantic.VERSION, "transformers": transformers.__version__}
    try:
        import pydantic_core
        doc["libs"]["pydantic_core"] = pydantic_core.__version__
    except Exception:
        pass
    doc["cpu"] = subprocess.run("lscpu | grep -E 'Model name|^CPU\\(s\\)'", shell=True,
                                capture_output=True, text=True).stdout.strip()

    if args.transport:
        import uvicorn, starlette, fastapi  # noqa: E401
        doc["libs"].update(uvicorn=uvicorn.__version__, starlette=starlette.__version__,
                           fastapi=fastapi.__version__)
        doc["transport"] = {f"B{B}": transport_measure([16, 64, 256], B, 100 if B == 1 else 15)
                            for B in (1, 32)}
        doc["loadavg_end"] = loadavg()
        doc["python_reference_end"] = python_reference()
        json.dump(doc, open(args.out, "w"), indent=1)
        print(json.dumps({k: {kk: vv for kk, vv in v.items() if "fit" in kk}
                          for k, v in doc["transport"].items()}))
        return
    plan = Plan()
    S = setup_011(args.model, served, plan) if OLD else setup_033(args.model, served, plan)
    tok = S["tok"]
    texts_all = [p["text"] for p in json.load(open(args.prompts))]
    prompt_text = texts_all[0]
    # realistic output tokens: the token ids of a long text, each decoded on its own
    body = " ".join(texts_all[1:40])
    tok_ids = tok(body, add_special_tokens=False).input_ids[:2048]
    texts = [tok.decode([t]) for t in tok_ids]
    prompt_ids = tok(prompt_text, add_special_tokens=False).input_ids
    doc["output_token_text_mean_chars"] = round(statistics.fmean(len(t) for t in texts[:256]), 2)
    R = Runner(S, plan, served, prompt_text, tok_ids, texts, prompt_ids)

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)

    # sample of the SSE stream, for checking shape
    for ep in ("chat", "cmpl"):
        g = loop.run_until_complete(R.create(ep, 3, "direct", R.outs(3)))
        loop.run_until_complete(R.consume(g, keep=True))
        doc[f"sample_stream_{ep}_N3"] = R.last_chunks
        doc[f"engine_input_{ep}"] = plan.last_prompt
        print(ep, "sample:", "".join(R.last_chunks)[:1500], flush=True)

    # RequestOutput + CompletionOutput construction, per delta (OutputProcessor side, apart)
    t0 = time.process_time_ns()
    for _ in range(200):
        R.outs(64)
    doc["request_output_build_cpu_us_per_delta"] = round((time.process_time_ns() - t0) / 200 / 64 / 1e3, 3)

    doc["components_cpu"] = components()
    print("components:", json.dumps(doc["components_cpu"], indent=1), flush=True)
    if args.only_components:
        json.dump(doc, open(args.out, "w"), indent=1)
        return
    if args.no_gc:
        gc.disable()
    res = {}
    for ep in ("chat", "cmpl", "baseline"):
        r = {}
        print(ep, flush=True)
        try:
            r["direct"] = run_direct(loop, R, ep, ns, args.reps, args.warmup)
            r["direct_fit_stream_cpu"] = add_fits(r["direct"], "stream_cpu")
            r["direct_fit_stream_wall"] = add_fits(r["direct"], "stream_wall")
            for B in sorted({1, args.batch}):
                reps = args.reps if B == 1 else args.batch_reps
                rr = run_stepped(loop, R, ep, ns, B, reps, max(2, args.warmup // B))
                r[f"stepped_B{B}"] = rr
                r[f"stepped_B{B}_fit_stream_cpu"] = add_fits(rr, "per_stream_stream_cpu")
            print("  fits:", {k: v for k, v in r.items() if "fit" in k}, flush=True)
        except Exception as e:
            r["error"] = f"{type(e).__name__}: {e}"
            r["trace"] = traceback.format_exc()[-3000:]
            print(r["trace"], flush=True)
        res[ep] = {str(k): ({str(n): x for n, x in v.items()} if isinstance(v, dict) and
                            all(isinstance(n, int) for n in v) else v) for k, v in r.items()}
        json.dump(doc | {"results": res}, open(args.out, "w"), indent=1)
    if args.no_gc:
        gc.enable()
    doc["results"] = res
    for ep in ("chat", "cmpl"):
        try:
            doc[f"profile_{ep}"] = profile(loop, R, ep, 256, args.profile_reps)
        except Exception as e:
            doc[f"profile_{ep}"] = {"error": f"{type(e).__name__}: {e}"}
    doc["loadavg_end"] = loadavg()
    doc["python_reference_end"] = python_reference()
    json.dump(doc, open(args.out, "w"), indent=1)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
