"""Per-request CPU cost of vLLM's OpenAI front end: /v1/chat/completions vs /v1/completions.

Runs vLLM's own Python code (no engine, no GPU) for a Qwen3-8B model folder (config.json +
tokenizer.json + tokenizer_config.json with its Hugging Face Jinja chat template) and times, per
request, with time.perf_counter_ns (wall) and time.process_time_ns (CPU of all threads):

  chat_preprocess   0.11: ChatCompletionRequest validation + OpenAIServingChat._check_model +
                          get_tokenizer + _preprocess_chat (as create_chat_completion calls it)
                          + request.to_sampling_params
                    0.33: ChatCompletionRequest validation + OnlineRenderer.render_chat +
                          to_sampling_params
  cmpl_preprocess   0.11: CompletionRequest validation + _check_model + get_tokenizer +
                          CompletionRenderer.render_prompt_and_embeds + to_sampling_params
                    0.33: CompletionRequest validation + OnlineRenderer.render_completion +
                          to_sampling_params
  chat_full / cmpl_full   the whole create_chat_completion / create_completion handler
                          (stream=False) with a fake engine client whose generate() yields one
                          finished output of one token (only where the fake engine fits)
  component series  the functions _preprocess_chat calls, timed one by one (sync)

Hugging Face hub calls are counted at the network layer (requests / httpx) and by name
(file_exists, list_repo_files, hf_hub_download, model_info, ...) during setup, warm-up and the
measured requests.

Usage:
  PYTHONPATH=/tmp/vllm-env-0.11/src /tmp/vllm-env-0.11/venv/bin/python chat_preprocess_measure.py \
      --model /tmp/qwen3-8b --prompts /tmp/prompts_230.json --n 400 --out /tmp/res-0.11.json
  Repo-id naming with a reachable (fake, logging) hub:
    python3 chat_preprocess_fakehub.py 18011 Qwen/Qwen3-8B /tmp/qwen3-8b /tmp/hub.log &
    env -u HF_HUB_OFFLINE HF_HOME=/tmp/hfhome-fake HF_ENDPOINT=http://127.0.0.1:18011 \
      PYTHONPATH=... python chat_preprocess_measure.py --model Qwen/Qwen3-8B --out ...
    (compare /tmp/hub.log timestamps with the output's phase_times)
"""
import argparse
import asyncio
import cProfile
import collections
import functools
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

# ---------------------------------------------------------------- hub-call instrumentation
HUB_CALLS = collections.Counter()      # (phase, name) -> count
HUB_STACKS = {}                        # (phase, name) -> a short vllm-side stack
PHASE = ["import"]
PHASE_TIMES = []                       # (unix time, phase) at each phase change


def set_phase(p):
    PHASE[0] = p
    PHASE_TIMES.append((time.time(), p))


def _short_stack():
    out = []
    for fr in traceback.extract_stack()[:-2]:
        if "/vllm/" in fr.filename or "/transformers/" in fr.filename:
            out.append(f"{fr.filename.split('/src/')[-1].split('site-packages/')[-1]}:{fr.lineno}:{fr.name}")
    return out[-8:]


def _record(name):
    key = (PHASE[0], name)
    HUB_CALLS[key] += 1
    HUB_STACKS.setdefault(key, _short_stack())


def _patch_network():
    import requests
    orig = requests.Session.request

    @functools.wraps(orig)
    def req(self, method, url, *a, **k):
        _record(f"requests {method} {str(url).split('?')[0]}")
        return orig(self, method, url, *a, **k)
    requests.Session.request = req
    try:
        import httpx
        for cls in (httpx.Client, httpx.AsyncClient):
            o = cls.send

            def mk(o):
                @functools.wraps(o)
                def send(self, request, *a, **k):
                    _record(f"httpx {request.method} {str(request.url).split('?')[0]}")
                    return o(self, request, *a, **k)
                return send
            cls.send = mk(o)
    except ImportError:
        pass


HUB_NAMES = ("file_exists", "list_repo_files", "hf_hub_download", "model_info", "repo_exists",
             "get_hf_file_metadata", "snapshot_download", "try_to_load_from_cache",
             "list_repo_tree", "get_safetensors_metadata", "get_paths_info")


def _patch_named():
    """Wrap the hub functions wherever a loaded module holds a reference to them."""
    import huggingface_hub
    n = 0
    for mname, mod in list(sys.modules.items()):
        if mod is None or not (mname.startswith(("huggingface_hub", "transformers", "vllm"))):
            continue
        for name in HUB_NAMES:
            f = getattr(mod, "__dict__", {}).get(name)
            if f is None or not callable(f) or getattr(f, "_counted", False):
                continue
            if not getattr(f, "__module__", "").startswith("huggingface_hub"):
                continue

            def mk(f, name):
                @functools.wraps(f)
                def w(*a, **k):
                    _record(f"hf.{name}")
                    return f(*a, **k)
                w._counted = True
                return w
            try:
                setattr(mod, name, mk(f, name))
                n += 1
            except Exception:
                pass
    for name in HUB_NAMES:
        m = getattr(huggingface_hub.HfApi, name, None)
        if m is not None and not getattr(m, "_counted", False):
            def mk(m, name):
                @functools.wraps(m)
                def w(*a, **k):
                    _record(f"HfApi.{name}")
                    return m(*a, **k)
                w._counted = True
                return w
            setattr(huggingface_hub.HfApi, name, mk(m, name))
            n += 1
    return n


_patch_network()

import vllm  # noqa: E402
V = vllm.__version__
OLD = V.startswith("0.11")
set_phase("setup")


def stats(xs):
    xs = sorted(xs)
    n = len(xs)
    return {"n": n, "mean_ms": round(statistics.fmean(xs) / 1e6, 4),
            "median_ms": round(xs[n // 2] / 1e6, 4),
            "p90_ms": round(xs[min(n - 1, int(0.90 * n))] / 1e6, 4),
            "p99_ms": round(xs[min(n - 1, int(0.99 * n))] / 1e6, 4),
            "max_ms": round(xs[-1] / 1e6, 4)}


def loadavg():
    return list(os.getloadavg())


class FakeOutputs:
    """Builds the one finished RequestOutput a fake engine returns."""

    @staticmethod
    def make(request_id, prompt_ids):
        from vllm.outputs import CompletionOutput, RequestOutput
        co = CompletionOutput(index=0, text=" Hello", token_ids=[21927], cumulative_logprob=None,
                              logprobs=None, finish_reason="length")
        try:
            return RequestOutput(request_id=request_id, prompt=None, prompt_token_ids=prompt_ids,
                                 prompt_logprobs=None, outputs=[co], finished=True)
        except TypeError:
            import inspect
            sig = inspect.signature(RequestOutput.__init__)
            kw = dict(request_id=request_id, prompt=None, prompt_token_ids=prompt_ids,
                      prompt_logprobs=None, outputs=[co], finished=True)
            return RequestOutput(**{k: v for k, v in kw.items() if k in sig.parameters})


class FakeEngineBase:
    """What both versions' serving classes ask of an engine client here: the tokenizer, no
    tracing, and one finished output of one token for each request."""

    errored = False
    dead_error = RuntimeError("dead")
    tokenizer = None

    async def get_tokenizer(self, lora_request=None):
        return self.tokenizer

    async def is_tracing_enabled(self):
        return False

    def generate(self, prompt, sampling_params, request_id, **kw):
        async def gen():
            yield FakeOutputs.make(request_id, prompt_ids_of(prompt))
        return gen()


def handlers(chat, cmpl, ChatCompletionRequest, CompletionRequest):
    """The whole chat and completions handlers (stream false) as coroutines of a request dict."""
    async def chat_full(d):
        r = await chat.create_chat_completion(ChatCompletionRequest.model_validate(d), None)
        assert not hasattr(r, "error"), r
        return r

    async def cmpl_full(d):
        r = await cmpl.create_completion(CompletionRequest.model_validate(d), None)
        assert not hasattr(r, "error"), r
        return r
    return chat_full, cmpl_full


def prompt_ids_of(engine_prompt):
    if isinstance(engine_prompt, dict):
        if "prompt_token_ids" in engine_prompt:
            return engine_prompt["prompt_token_ids"]
        for k in ("prompt", "decoder_prompt"):
            if isinstance(engine_prompt.get(k), dict):
                return prompt_ids_of(engine_prompt[k])
    return getattr(engine_prompt, "prompt_token_ids", None) or [0]


# ---------------------------------------------------------------- 0.11 set-up
def setup_011(model, served):
    from vllm.config import ModelConfig
    from vllm.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
    from vllm.entrypoints.openai.serving_chat import OpenAIServingChat
    from vllm.entrypoints.openai.serving_completion import OpenAIServingCompletion
    from vllm.entrypoints.openai.serving_models import BaseModelPath, OpenAIServingModels
    from vllm.transformers_utils.tokenizer import init_tokenizer_from_configs

    mc = ModelConfig(model=model, tokenizer=model, dtype="bfloat16", max_model_len=40960)
    tok = init_tokenizer_from_configs(model_config=mc)

    class FakeEngine(FakeEngineBase):
        model_config = mc
        tokenizer = tok

    eng = FakeEngine()
    models = OpenAIServingModels(eng, mc, [BaseModelPath(name=served, model_path=model)])
    chat = OpenAIServingChat(eng, mc, models, "assistant", request_logger=None,
                             chat_template=None, chat_template_content_format="auto")
    cmpl = OpenAIServingCompletion(eng, mc, models, request_logger=None)

    async def chat_pre(d):
        req = ChatCompletionRequest.model_validate(d)
        assert await chat._check_model(req) is None
        tokenizer = await eng.get_tokenizer()
        conv, rps, eps = await chat._preprocess_chat(
            req, tokenizer, req.messages,
            chat_template=req.chat_template or chat.chat_template,
            chat_template_content_format=chat.chat_template_content_format,
            add_generation_prompt=req.add_generation_prompt,
            continue_final_message=req.continue_final_message,
            tool_dicts=None, documents=req.documents,
            chat_template_kwargs=req.chat_template_kwargs, tool_parser=chat.tool_parser,
            add_special_tokens=req.add_special_tokens)
        from vllm.entrypoints.utils import get_max_tokens
        mt = get_max_tokens(max_model_len=mc.max_model_len, request=req,
                            input_length=len(eps[0]["prompt_token_ids"]),
                            default_sampling_params=chat.default_sampling_params)
        req.to_sampling_params(mt, mc.logits_processor_pattern, chat.default_sampling_params)
        return eps[0]["prompt_token_ids"]

    async def cmpl_pre(d):
        req = CompletionRequest.model_validate(d)
        assert await cmpl._check_model(req) is None
        tokenizer = await eng.get_tokenizer()
        renderer = cmpl._get_renderer(tokenizer)
        eps = await renderer.render_prompt_and_embeds(
            prompt_or_prompts=req.prompt, prompt_embeds=req.prompt_embeds,
            config=cmpl._build_render_config(req))
        from vllm.entrypoints.utils import get_max_tokens
        mt = get_max_tokens(max_model_len=mc.max_model_len, request=req,
                            input_length=len(eps[0]["prompt_token_ids"]),
                            default_sampling_params=cmpl.default_sampling_params)
        req.to_sampling_params(mt, mc.logits_processor_pattern, cmpl.default_sampling_params)
        return eps[0]["prompt_token_ids"]

    chat_full, cmpl_full = handlers(chat, cmpl, ChatCompletionRequest, CompletionRequest)

    # component functions, as _preprocess_chat calls them (sync)
    from vllm.entrypoints import chat_utils as cu

    def components():
        def content_format(msgs):
            return cu.resolve_chat_template_content_format(None, None, "auto", tok, model_config=mc)

        def parse(msgs):
            return cu.parse_chat_messages_futures(msgs, mc, tok, content_format="string")

        def resolve_tmpl(msgs):
            return cu.resolve_hf_chat_template(tok, chat_template=None, tools=None, model_config=mc)

        tmpl = cu.resolve_hf_chat_template(tok, chat_template=None, tools=None, model_config=mc)
        kw = dict(chat_template=None, add_generation_prompt=True, continue_final_message=False,
                  tools=None, documents=None)

        def resolve_kwargs(msgs):
            return cu.resolve_chat_template_kwargs(tok, tmpl, dict(add_generation_prompt=True,
                                                                   continue_final_message=False,
                                                                   documents=None))

        def hf_apply(msgs):   # transformers' own apply_chat_template, template given
            conv = [{"role": "user", "content": m["content"]} for m in msgs]
            return tok.apply_chat_template(conversation=conv, tools=None, chat_template=tmpl,
                                           tokenize=False, add_generation_prompt=True,
                                           continue_final_message=False, documents=None)

        def apply_all(msgs):   # vllm's apply_hf_chat_template (resolve + kwargs + HF apply)
            conv = [{"role": "user", "content": m["content"]} for m in msgs]
            return cu.apply_hf_chat_template(tokenizer=tok, conversation=conv, model_config=mc, **kw)

        def encode(msgs):
            s = hf_apply(msgs)
            return tok(s, add_special_tokens=False).input_ids
        return {"resolve_chat_template_content_format": content_format,
                "parse_chat_messages_futures": parse,
                "resolve_hf_chat_template": resolve_tmpl,
                "resolve_chat_template_kwargs": resolve_kwargs,
                "tokenizer.apply_chat_template(hf, tokenize=False)": hf_apply,
                "apply_hf_chat_template(vllm)": apply_all,
                "_hf_apply+tokenizer(text) [encode incl. render]": encode}

    return dict(mc=mc, tok=tok, chat_pre=chat_pre, cmpl_pre=cmpl_pre, chat_full=chat_full,
                cmpl_full=cmpl_full, components=components)


# ---------------------------------------------------------------- 0.33 set-up
def online_renderer_033(model):
    """vLLM 0.33's model config, engine config, renderer, tokenizer and online renderer (the
    API server's request rendering) for the model folder `model`, warmed up."""
    from vllm.config import ModelConfig, VllmConfig
    from vllm.renderers import renderer_from_config
    from vllm.renderers.online_renderer import OnlineRenderer

    mc = ModelConfig(model=model, tokenizer=model, dtype="bfloat16", max_model_len=40960)
    vcfg = VllmConfig(model_config=mc)
    renderer = renderer_from_config(vcfg)
    onl = OnlineRenderer(model_config=mc, renderer=renderer, request_logger=None,
                         chat_template=None, chat_template_content_format="auto")
    onl.warmup()
    return mc, vcfg, renderer, renderer.tokenizer, onl


def setup_033(model, served):
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    mc, vcfg, renderer, tok, onl = online_renderer_033(model)
    dsp = mc.get_diff_sampling_param()
    from vllm.entrypoints.serve.utils.api_utils import get_max_tokens

    def sp(req, eng_input, is_chat):
        mt = get_max_tokens(mc.max_model_len,
                            (req.max_completion_tokens if is_chat and req.max_completion_tokens
                             is not None else req.max_tokens),
                            len(prompt_ids_of(eng_input)), dsp, None,
                            truncate_prompt_tokens=req.truncate_prompt_tokens)
        return req.to_sampling_params(mt, dsp)

    async def chat_pre(d):
        req = ChatCompletionRequest.model_validate(d)
        res = await onl.render_chat(req)
        assert not hasattr(res, "error"), res
        conv, eis = res
        sp(req, eis[0], True)
        return prompt_ids_of(eis[0])

    async def cmpl_pre(d):
        req = CompletionRequest.model_validate(d)
        res = await onl.render_completion(req)
        assert not hasattr(res, "error"), res
        sp(req, res[0], False)
        return prompt_ids_of(res[0])

    full = {}
    try:
        from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
        from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion
        from vllm.entrypoints.openai.models.protocol import BaseModelPath
        from vllm.entrypoints.openai.models.serving import OpenAIServingModels

        class FakeEngine(FakeEngineBase):
            model_config = mc
            vllm_config = vcfg
            tokenizer = tok
            is_running = True
            is_stopped = False
            input_processor = None   # only used for LoRA loading

            def check_admission(self, n=1, request_id=None):
                return None

            def __init__(self):
                self.renderer = renderer

        eng = FakeEngine()
        models = OpenAIServingModels(eng, [BaseModelPath(name=served, model_path=model)])
        chat = OpenAIServingChat(eng, models, "assistant", online_renderer=onl,
                                 request_logger=None, chat_template=None,
                                 chat_template_content_format="auto")
        cmpl = OpenAIServingCompletion(eng, models, online_renderer=onl, request_logger=None)

        chat_full, cmpl_full = handlers(chat, cmpl, ChatCompletionRequest, CompletionRequest)
        full = dict(chat_full=chat_full, cmpl_full=cmpl_full)
    except Exception as e:  # recorded, not fatal
        full = dict(full_error=f"{type(e).__name__}: {e}")

    from vllm.renderers import hf as rhf
    from vllm.renderers.params import ChatParams

    def components():
        tmpl = rhf.resolve_chat_template(tok, chat_template=None, tools=None, model_config=mc)

        def content_format(msgs):
            return rhf.resolve_chat_template_content_format(
                chat_template=None, tools=None, given_format="auto", tokenizer=tok,
                model_config=mc)

        def resolve_tmpl(msgs):
            return rhf.resolve_chat_template(tok, chat_template=None, tools=None, model_config=mc)

        def resolve_kwargs(msgs):
            return rhf.resolve_chat_template_kwargs(tok, tmpl, dict(add_generation_prompt=True,
                                                                    continue_final_message=False))

        def hf_apply(msgs):
            conv = [{"role": "user", "content": m["content"]} for m in msgs]
            return tok.apply_chat_template(conversation=conv, tools=None, chat_template=tmpl,
                                           tokenize=False, add_generation_prompt=True,
                                           continue_final_message=False)

        def render_messages(msgs):
            return renderer.render_messages(msgs, ChatParams(chat_template=None,
                                                             chat_template_content_format="auto"))

        def encode(msgs):
            s = hf_apply(msgs)
            return tok(s, add_special_tokens=False).input_ids
        return {"resolve_chat_template_content_format": content_format,
                "resolve_chat_template": resolve_tmpl,
                "resolve_chat_template_kwargs": resolve_kwargs,
                "tokenizer.apply_chat_template(hf, tokenize=False)": hf_apply,
                "HfRenderer.render_messages (sync)": render_messages,
                "_hf_apply+tokenizer(text) [encode incl. render]": encode}

    return dict(mc=mc, tok=tok, chat_pre=chat_pre, cmpl_pre=cmpl_pre, components=components,
                **full)


# ---------------------------------------------------------------- timing
async def time_async(fn, payloads, warm, n):
    for i in range(warm):
        await fn(payloads[i % len(payloads)])
    wall, cpu = [], []
    for i in range(n):
        d = payloads[(warm + i) % len(payloads)]
        c0 = time.process_time_ns()
        t0 = time.perf_counter_ns()
        await fn(d)
        t1 = time.perf_counter_ns()
        c1 = time.process_time_ns()
        wall.append(t1 - t0)
        cpu.append(c1 - c0)
    return {"wall": stats(wall), "process_cpu": stats(cpu)}


def time_sync(fn, msgs_list, warm, n):
    for i in range(warm):
        fn(msgs_list[i % len(msgs_list)])
    wall = []
    for i in range(n):
        m = msgs_list[(warm + i) % len(msgs_list)]
        t0 = time.perf_counter_ns()
        fn(m)
        wall.append(time.perf_counter_ns() - t0)
    return stats(wall)


def profile_async(loop, fn, payloads, n, top=30):
    pr = cProfile.Profile()
    pr.enable()
    for i in range(n):
        loop.run_until_complete(fn(payloads[i % len(payloads)]))
    pr.disable()
    s = io.StringIO()
    ps = pstats.Stats(pr, stream=s).sort_stats("cumulative")
    ps.print_stats(top)
    s2 = io.StringIO()
    pstats.Stats(pr, stream=s2).sort_stats("tottime").print_stats(top)
    return s.getvalue(), s2.getvalue()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="/tmp/qwen3-8b")
    ap.add_argument("--served-name", default=None)
    ap.add_argument("--prompts", default="/tmp/prompts_230.json")
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--profile-n", type=int, default=150)
    ap.add_argument("--no-full", action="store_true")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    served = args.served_name or args.model
    texts = [p["text"] for p in json.load(open(args.prompts))]

    doc = {"vllm": V, "model": args.model, "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE"),
           "HF_HOME": os.environ.get("HF_HOME"), "python": sys.version.split()[0],
           "loadavg_start": loadavg()}
    import transformers, tokenizers, jinja2, huggingface_hub, torch  # noqa: E401
    doc["libs"] = {"transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
                   "jinja2": jinja2.__version__, "huggingface_hub": huggingface_hub.__version__,
                   "torch": torch.__version__}
    doc["cpu"] = subprocess.run("lscpu | grep -E 'Model name|^CPU\\(s\\)'", shell=True,
                                capture_output=True, text=True).stdout.strip()

    t0 = time.perf_counter()
    S = setup_011(args.model, served) if OLD else setup_033(args.model, served)
    doc["setup_s"] = round(time.perf_counter() - t0, 2)
    doc["named_hub_wrappers"] = _patch_named()
    tok = S["tok"]

    chat_payloads = [{"model": served, "messages": [{"role": "user", "content": t}],
                      "max_tokens": args.max_tokens, "stream": False} for t in texts]
    cmpl_payloads = [{"model": served, "prompt": t, "max_tokens": args.max_tokens,
                      "stream": False} for t in texts]
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)

    # token counts of the rendered prompts
    set_phase("warmup")
    ids = loop.run_until_complete(S["chat_pre"](chat_payloads[0]))
    doc["example_chat_prompt_tokens"] = len(ids)
    doc["example_chat_prompt_head"] = tok.decode(ids[:8])
    doc["example_chat_prompt_tail"] = tok.decode(ids[-8:])
    doc["example_cmpl_prompt_tokens"] = len(loop.run_until_complete(S["cmpl_pre"](cmpl_payloads[0])))
    doc["mean_text_tokens"] = statistics.fmean(len(tok(t, add_special_tokens=False).input_ids)
                                               for t in texts)

    res = {}
    order = [("chat_preprocess", "chat_pre", chat_payloads), ("cmpl_preprocess", "cmpl_pre", cmpl_payloads)]
    if not args.no_full:
        order += [("chat_full", "chat_full", chat_payloads), ("cmpl_full", "cmpl_full", cmpl_payloads)]
    for name, key, pl in order:
        if key not in S:
            res[name] = {"not_measured": S.get("full_error", "not available")}
            continue
        set_phase("warmup")
        try:
            for i in range(args.warmup):
                loop.run_until_complete(S[key](pl[i % len(pl)]))
            set_phase(f"measure:{name}")
            calls_before = sum(HUB_CALLS.values())
            r = loop.run_until_complete(time_async(S[key], pl, 0, args.n))
            r["hub_calls_during"] = sum(HUB_CALLS.values()) - calls_before
            r["loadavg_after"] = loadavg()
            res[name] = r
        except Exception as e:
            res[name] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-3000:]}
        print(name, json.dumps(res[name])[:400], flush=True)

    comps = {}
    msgs_list = [[{"role": "user", "content": t}] for t in texts]
    set_phase("measure:components")
    for cname, fn in S["components"]().items():
        try:
            comps[cname] = time_sync(fn, msgs_list, 10, min(args.n, 300))
        except Exception as e:
            comps[cname] = {"error": f"{type(e).__name__}: {e}"}
        print(cname, comps[cname], flush=True)
    comps["tokenizer(plain text) [completions encode]"] = time_sync(
        lambda m: tok(m[0]["content"], add_special_tokens=True).input_ids, msgs_list, 10, min(args.n, 300))
    doc["results"] = res
    doc["components_wall"] = comps

    set_phase("profile")
    for name, key, pl in [("chat_preprocess", "chat_pre", chat_payloads),
                          ("cmpl_preprocess", "cmpl_pre", cmpl_payloads)]:
        cum, tot = profile_async(loop, S[key], pl, args.profile_n)
        doc[f"profile_{name}_cumulative"] = cum
        doc[f"profile_{name}_tottime"] = tot

    doc["hub_calls"] = [{"phase": p, "call": c, "count": k, "stack": HUB_STACKS.get((p, c))}
                        for (p, c), k in sorted(HUB_CALLS.items())]
    set_phase("end")
    doc["phase_times"] = PHASE_TIMES
    doc["loadavg_end"] = loadavg()
    json.dump(doc, open(args.out, "w"), indent=1)
    print("hub calls:", json.dumps([(h["phase"], h["call"], h["count"]) for h in doc["hub_calls"]]))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
