"""Measure vLLM V1's per-step CPU costs (scheduler, front-end output processing, adding a request).

Runs vLLM 0.33's own Python code on this machine's CPU, without a model and without a GPU: the
V1 `Scheduler` is driven with fake `ModelRunnerOutput`s (one sampled token per request whose
prompt is done), the way simcore/engine/vllm_recorder.py drives it, and the `EngineCoreOutputs`
it returns are fed to the front end's `OutputProcessor`. Every timed call is wrapped in
`time.perf_counter_ns()`; nothing else (building fake model outputs, draining the per-request
output queues, adding and aborting requests between measurements) is timed.

Series (per configuration: median, p10, p90 of per-call seconds over `reps` calls):
  schedule_decode / update_decode       N running requests, all decoding (N = num_seqs = num_tokens)
  output_processor_decode               OutputProcessor.process_outputs on those N outputs, with
                                        incremental detokenization (only with --tokenizer)
  output_processor_decode_nodetok       the same with detokenize=False (no tokenizer)
  ipc_outputs_encode / ipc_outputs_decode  msgpack of the step's EngineCoreOutputs (engine core
                                        side / front-end side of the ZMQ hop)
  schedule_prefill / update_prefill     k requests each getting T/k prompt tokens of a chunked
                                        prefill in a step that continues their prefill
  schedule_prefill_new / update_prefill_new  the same, in the step that admits them (prefix-cache
                                        lookup and first allocation included)
  add_request                           everything per new request, summed per request:
                                        the parts below (num_seqs 1, num_tokens = prompt length)
  add_request_input_processor           InputProcessor.process_inputs (token-id prompt) +
                                        assign_request_id
  add_request_output_processor          OutputProcessor.add_request (detokenizer state)
  add_request_ipc                       msgpack encode (front end) + decode (engine core)
  add_request_core_request              Request.from_engine_core_request (prompt block hashes)
  add_request_scheduler                 Scheduler.add_request
  input_processor_text                  InputProcessor.process_inputs on a text prompt
                                        (tokenization; only with --tokenizer)

Usage (from this folder, with the environment ../vllm_conformance/setup.sh builds):
  PYTHONPATH=/tmp/vllm-env/src /tmp/vllm-env/venv/bin/python measure.py --out OUT.json \
      [--tokenizer DIR_WITH_tokenizer.json] [--quick]
"""
import argparse
import datetime
import gc
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import vllm  # noqa: E402
from pyref import python_reference  # noqa: E402
from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig  # noqa: E402
from vllm.inputs.engine import tokens_input  # noqa: E402
from vllm.sampling_params import RequestOutputKind, SamplingParams  # noqa: E402
from vllm.utils.hashing import get_hash_fn_by_name  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.engine import EngineCoreOutputs, EngineCoreRequest  # noqa: E402
from vllm.v1.engine.input_processor import InputProcessor  # noqa: E402
from vllm.v1.engine.output_processor import OutputProcessor, RequestOutputCollector  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.metrics.stats import IterationStats  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402
from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TINY = os.path.join(HERE, "..", "..", "simcore", "data", "conformance", "tinymodel", "config.json")
BLOCK = 16
NUM_BLOCKS = 200_000          # 3.2M tokens of KV: nothing is ever preempted
MAX_LEN = 131072
ns = time.perf_counter_ns


# ---------------------------------------------------------------- setup

def model_dir(tokenizer_dir):
    """A model folder: the conformance tiny Llama config (no weights) and, if given, a tokenizer."""
    d = tempfile.mkdtemp(prefix="vllm-cpu-costs-")
    with open(TINY) as f:
        cfg = json.load(f)
    if tokenizer_dir:
        for name in os.listdir(tokenizer_dir):
            if name.startswith("tokenizer") or name in ("special_tokens_map.json", "vocab.json",
                                                       "merges.txt"):
                shutil.copy(os.path.join(tokenizer_dir, name), d)
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(d)
        cfg["vocab_size"] = len(tok)
        cfg["bos_token_id"] = tok.bos_token_id if tok.bos_token_id is not None else 1
        cfg["eos_token_id"] = tok.eos_token_id if tok.eos_token_id is not None else 2
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    return d, cfg["vocab_size"]


def make_vllm_config(mdir, has_tok, max_num_seqs, max_num_batched_tokens, threshold=0):
    sched_cfg = SchedulerConfig(
        max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=MAX_LEN, enable_chunked_prefill=True,
        long_prefill_token_threshold=threshold, async_scheduling=False,
        is_encoder_decoder=False, policy="fcfs")
    model_cfg = ModelConfig(model=mdir, skip_tokenizer_init=not has_tok, dtype="float16",
                            max_model_len=MAX_LEN, seed=0)
    cache_cfg = CacheConfig(block_size=BLOCK, enable_prefix_caching=True)
    return VllmConfig(scheduler_config=sched_cfg, model_config=model_cfg, cache_config=cache_cfg)


def make_scheduler(vcfg):
    kv_cfg = KVCacheConfig(num_blocks=NUM_BLOCKS, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size=BLOCK, num_kv_heads=1,
                                                      head_size=1, dtype=torch.float32))])
    vcfg.cache_config.num_gpu_blocks = NUM_BLOCKS
    # log_stats=True: `vllm serve`'s default (stats are on unless --disable-log-stats).
    return Scheduler(vllm_config=vcfg, kv_cache_config=kv_cfg, block_size=BLOCK,
                     structured_output_manager=StructuredOutputManager(vcfg), log_stats=True)


class TokenSource:
    """Valid token ids: a real text's tokens when a tokenizer is given, else random ids."""

    def __init__(self, tok, vocab, seed=0):
        self.rng = random.Random(seed)
        if tok is not None:
            self.stream = tok.encode(corpus_text(), add_special_tokens=False)
        else:
            self.stream = [self.rng.randrange(1000, vocab - 1000) for _ in range(200_000)]
        self.n = len(self.stream)

    def prompt(self, length):
        # a random start in the text, and a random first block so that no two prompts share
        # a prefix-cache block (every prompt is a cache miss, as with distinct user prompts)
        start = self.rng.randrange(self.n)
        toks = [self.rng.randrange(1000, 30000) for _ in range(min(BLOCK, length))]
        while len(toks) < length:
            take = min(length - len(toks), self.n - start)
            toks.extend(self.stream[start:start + take])
            start = 0
        return toks

    def at(self, pos):
        return self.stream[pos % self.n]


def corpus_text():
    """English text shipped with the OS or Python (licenses, docs), ~0.3 MB."""
    parts = []
    for root in ("/usr/share/common-licenses", "/usr/share/doc"):
        if os.path.isdir(root):
            for dp, _, fs in os.walk(root):
                for f in sorted(fs):
                    p = os.path.join(dp, f)
                    if os.path.isfile(p) and not f.endswith((".gz", ".html")) and \
                            os.path.getsize(p) < 200_000:
                        try:
                            with open(p, encoding="utf-8") as fh:
                                parts.append(fh.read())
                        except (UnicodeDecodeError, OSError):
                            pass
                if sum(map(len, parts)) > 300_000:
                    break
    if sum(map(len, parts)) < 50_000:
        import this  # noqa: F401  (fallback: stdlib docstrings)
        import pydoc
        for m in ("os", "json", "re", "argparse", "collections", "subprocess"):
            parts.append(pydoc.render_doc(__import__(m), renderer=pydoc.plaintext))
    return "\n".join(parts)[:300_000]


def stats(samples_ns):
    a = np.asarray(samples_ns, dtype=np.float64) / 1e9
    return {"median_s": float(np.median(a)), "p10_s": float(np.percentile(a, 10)),
            "p90_s": float(np.percentile(a, 90)), "mean_s": float(a.mean()), "reps": int(a.size)}


# ---------------------------------------------------------------- decode steady state

def engine_request(rid, prompt, max_tokens, kind, detok):
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, output_kind=kind,
                            detokenize=detok)
    r = EngineCoreRequest(request_id=rid, prompt_token_ids=prompt, mm_features=None,
                          sampling_params=params, pooling_params=None, arrival_time=time.time(),
                          lora_request=None, cache_salt=None, data_parallel_rank=None)
    r.external_req_id = rid
    return r


def run_decode(N, reps, env, out):
    vcfg = make_vllm_config(env["mdir"], env["tok"] is not None, max_num_seqs=1024,
                            max_num_batched_tokens=8192)
    s = make_scheduler(vcfg)
    hasher = env["hasher"]
    src = env["src"]
    ops = {"nodetok": OutputProcessor(None, log_stats=True)}
    if env["tok"] is not None:
        ops["detok"] = OutputProcessor(env["tok"], log_stats=True)
    queues = {k: {} for k in ops}
    pos = {}
    for i in range(N):
        rid = f"d{N}-{i}"
        prompt = src.prompt(512)
        ecr = engine_request(rid, prompt, MAX_LEN - 600, RequestOutputKind.DELTA, True)
        for k, op in ops.items():
            q = RequestOutputCollector(RequestOutputKind.DELTA, rid)
            queues[k][rid] = q
            op.add_request(ecr, None, queue=q)
        s.add_request(Request.from_engine_core_request(ecr, hasher))
        pos[rid] = src.rng.randrange(src.n)
    enc, dec = MsgpackEncoder(), MsgpackDecoder(EngineCoreOutputs)
    t = {k: [] for k in ("sched", "upd", "enc", "dec", "op_nodetok", "op_detok")}
    step = 0
    warm = None
    while True:
        t0 = ns()
        so = s.schedule()
        t1 = ns()
        ids = list(so.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            req = s.requests[rid]
            if req.num_computed_tokens >= req.num_tokens:  # (schedule() already advanced it)
                sampled.append([src.at(pos[rid])])
                pos[rid] += 1
            else:
                sampled.append([])
        mro = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: k for k, r in enumerate(ids)},
                                sampled_token_ids=sampled)
        t2 = ns()
        eco = s.update_from_output(so, mro)
        t3 = ns()
        outs = eco.get(0)
        decoding = (len(ids) == N and all(so.num_scheduled_tokens[r] == 1 for r in ids)
                    and not so.scheduled_new_reqs)
        timed = warm is not None and decoding
        if warm is None and decoding:
            warm = step  # first pure decode step: start timing from the next one
            gc.collect()
        if outs is not None:
            t4 = ns()
            frames = enc.encode(outs)
            t5 = ns()
            outs2 = dec.decode(frames)
            t6 = ns()
            for k, op in ops.items():
                its = IterationStats()
                a = ns()
                op.process_outputs(outs2.outputs, outs2.timestamp, its)
                b = ns()
                if timed:
                    t["op_" + k].append(b - a)
                for q in queues[k].values():
                    q.get_nowait()
            if timed:
                t["enc"].append(t5 - t4)
                t["dec"].append(t6 - t5)
        if timed:
            assert not so.preempted_req_ids
            t["sched"].append(t1 - t0)
            t["upd"].append(t3 - t2)
            if len(t["sched"]) >= reps:
                break
        step += 1
        if step > 100_000:
            raise SystemExit("decode warm-up never reached steady state")
    key = {"num_seqs": N, "num_tokens": N}
    for name, k in (("schedule_decode", "sched"), ("update_decode", "upd"),
                    ("ipc_outputs_encode", "enc"), ("ipc_outputs_decode", "dec"),
                    ("output_processor_decode_nodetok", "op_nodetok"),
                    ("output_processor_decode", "op_detok")):
        if t[k]:
            out.setdefault(name, []).append({**key, **stats(t[k])})


# ---------------------------------------------------------------- prefill

def run_prefill(k, T, reps, env, out, chunks_per_req=4):
    chunk = T // k
    vcfg = make_vllm_config(env["mdir"], env["tok"] is not None, max_num_seqs=min(1024, T),
                            max_num_batched_tokens=T, threshold=chunk if k > 1 else 0)
    s = make_scheduler(vcfg)
    src, hasher = env["src"], env["hasher"]
    C = max(2, min(chunks_per_req, (MAX_LEN - 16) // chunk))
    t = {"sched_new": [], "upd_new": [], "sched": [], "upd": []}
    gen = 0
    gc.collect()
    while len(t["sched"]) < reps:
        rids = []
        for i in range(k):
            rid = f"p{k}-{T}-{gen}-{i}"
            ecr = engine_request(rid, src.prompt(chunk * C), 16, RequestOutputKind.DELTA, False)
            s.add_request(Request.from_engine_core_request(ecr, hasher))
            rids.append(rid)
        for c in range(C):
            t0 = ns()
            so = s.schedule()
            t1 = ns()
            ids = list(so.num_scheduled_tokens)
            assert sorted(ids) == sorted(rids) and sum(so.num_scheduled_tokens.values()) == T, \
                (ids, so.num_scheduled_tokens)
            sampled = [[src.at(c)] if c == C - 1 else [] for _ in ids]
            mro = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: j for j, r in enumerate(ids)},
                                    sampled_token_ids=sampled)
            t2 = ns()
            s.update_from_output(so, mro)
            t3 = ns()
            if c == 0:
                t["sched_new"].append(t1 - t0)
                t["upd_new"].append(t3 - t2)
            elif c < C - 1:  # the last chunk also samples a token: left out of both
                t["sched"].append(t1 - t0)
                t["upd"].append(t3 - t2)
        s.finish_requests(rids, RequestStatus.FINISHED_ABORTED)
        gen += 1
    key = {"num_seqs": k, "num_tokens": T}
    for name, kk in (("schedule_prefill", "sched"), ("update_prefill", "upd"),
                     ("schedule_prefill_new", "sched_new"), ("update_prefill_new", "upd_new")):
        out.setdefault(name, []).append({**key, **stats(t[kk])})


# ---------------------------------------------------------------- adding a request

def run_add_request(P, reps, env, out):
    has_tok = env["tok"] is not None
    vcfg = make_vllm_config(env["mdir"], has_tok, max_num_seqs=1024, max_num_batched_tokens=8192)
    s = make_scheduler(vcfg)
    ip = InputProcessor(vcfg)
    op = OutputProcessor(env["tok"], log_stats=True)
    enc, dec = MsgpackEncoder(), MsgpackDecoder(EngineCoreRequest)
    src, hasher = env["src"], env["hasher"]
    tasks = ("generate",)
    parts = {k: [] for k in ("ip", "op", "ipc", "core", "sched", "text")}
    totals = []
    texts = []
    text_reps = reps if P <= 2048 else 30  # tokenizing 32k tokens takes a quarter second here
    if has_tok:
        for _ in range(min(reps, 50)):
            texts.append(env["tok"].decode(src.prompt(P)))
    gc.collect()
    for i in range(reps + 5):
        prompt = src.prompt(P)
        params = SamplingParams(max_tokens=256, output_kind=RequestOutputKind.DELTA)
        rid = f"a{P}-{i}"
        t0 = ns()
        ecr = ip.process_inputs(rid, tokens_input(prompt), params, supported_tasks=tasks,
                                arrival_time=time.time())
        InputProcessor.assign_request_id(ecr)
        t1 = ns()
        q = RequestOutputCollector(RequestOutputKind.DELTA, ecr.request_id)
        op.add_request(ecr, None, queue=q)
        t2 = ns()
        frames = enc.encode(ecr)
        ecr2 = dec.decode(frames)
        t3 = ns()
        req = Request.from_engine_core_request(ecr2, hasher)
        t4 = ns()
        s.add_request(req)
        t5 = ns()
        if texts and i < text_reps + 5:
            a = ns()
            ip.process_inputs(rid + "t", texts[i % len(texts)], params, supported_tasks=tasks,
                              arrival_time=time.time())
            b = ns()
        # untimed clean-up: nothing piles up across repetitions
        s.finish_requests([ecr.request_id], RequestStatus.FINISHED_ABORTED)
        op.abort_requests([ecr.request_id], internal=True)
        if i < 5:
            continue  # warm-up
        parts["ip"].append(t1 - t0)
        parts["op"].append(t2 - t1)
        parts["ipc"].append(t3 - t2)
        parts["core"].append(t4 - t3)
        parts["sched"].append(t5 - t4)
        totals.append(t5 - t0)
        if texts and i < text_reps + 5:
            parts["text"].append(b - a)
    key = {"num_seqs": 1, "num_tokens": P}
    out.setdefault("add_request", []).append({**key, **stats(totals)})
    for name, k in (("add_request_input_processor", "ip"), ("add_request_output_processor", "op"),
                    ("add_request_ipc", "ipc"), ("add_request_core_request", "core"),
                    ("add_request_scheduler", "sched"), ("input_processor_text", "text")):
        if parts[k]:
            out.setdefault(name, []).append({**key, **stats(parts[k])})


# ---------------------------------------------------------------- fit and machine facts

def fit(points):
    """Least squares t = a + b*num_seqs + c*num_tokens on the medians, weighted by 1/median
    (so relative errors count evenly across the orders of magnitude measured). Columns that
    are constant or collinear with another are dropped (their coefficient reported as 0)."""
    y = np.array([p["median_s"] for p in points])
    cols = {"a": np.ones(len(points)),
            "b_per_seq": np.array([p["num_seqs"] for p in points], float),
            "c_per_token": np.array([p["num_tokens"] for p in points], float)}
    use = ["a"]
    for name in ("b_per_seq", "c_per_token"):
        trial = np.column_stack([cols[u] for u in use + [name]])
        if np.ptp(cols[name]) > 0 and np.linalg.matrix_rank(trial) == len(use) + 1:
            use.append(name)
    X = np.column_stack([cols[u] for u in use])
    w = 1.0 / y
    coef, *_ = np.linalg.lstsq(X * w[:, None], y * w, rcond=None)
    res = {"a": 0.0, "b_per_seq": 0.0, "c_per_token": 0.0}
    res.update({u: float(c) for u, c in zip(use, coef)})
    pred = X @ coef
    rel = np.abs(pred - y) / y
    res["max_rel_residual"] = float(rel.max())
    res["points"] = len(points)
    res["weighting"] = "1/median"
    if "b_per_seq" not in use or "c_per_token" not in use:
        res["note"] = "num_seqs and num_tokens are equal or constant in this series: " \
                      "one slope carries both (the other is 0)"
    return res


def cpu_facts():
    model = None
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in lscpu.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        lscpu = ""
    facts = {"model": model, "cores": os.cpu_count(), "machine": platform.machine(),
             "platform_processor": platform.processor()}
    for line in lscpu.splitlines():
        for key in ("CPU family", "Model:", "Hypervisor vendor", "L3 cache", "Thread(s) per core"):
            if line.startswith(key):
                facts["lscpu_" + key.rstrip(":").replace(" ", "_").replace("(s)", "s").lower()] = \
                    line.split(":", 1)[1].strip()
    return facts


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokenizer", help="folder with a Hugging Face tokenizer.json (+config)")
    ap.add_argument("--quick", action="store_true", help="few repetitions, for a smoke test")
    ap.add_argument("--measured-at", default=datetime.date.today().isoformat())
    args = ap.parse_args()

    t_start = time.time()
    mdir, vocab = model_dir(args.tokenizer)
    tok = None
    if args.tokenizer:
        from vllm.tokenizers import get_tokenizer
        tok = get_tokenizer(mdir)
    hash_fn = get_hash_fn_by_name(CacheConfig().prefix_caching_hash_algo)
    init_none_hash(hash_fn)
    env = {"mdir": mdir, "tok": tok, "src": TokenSource(tok, vocab),
           "hasher": get_request_block_hasher(BLOCK, hash_fn)}
    q = args.quick
    series = {}
    ref_start = python_reference()

    def log(msg):
        print(f"[{time.time() - t_start:7.1f}s] {msg}", flush=True)

    for N in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024):
        reps = 20 if q else (1000 if N <= 64 else 600 if N <= 256 else 300)
        run_decode(N, reps, env, series)
        log(f"decode N={N}: sched {series['schedule_decode'][-1]['median_s'] * 1e6:.0f} us, "
            f"update {series['update_decode'][-1]['median_s'] * 1e6:.0f} us")
    for k in (1, 4, 16):
        for T in (256, 512, 1024, 2048, 4096, 8192):
            reps = 12 if q else 300
            run_prefill(k, T, reps, env, series)
            log(f"prefill k={k} T={T}: sched {series['schedule_prefill'][-1]['median_s'] * 1e6:.0f}"
                f" us, new {series['schedule_prefill_new'][-1]['median_s'] * 1e6:.0f} us")
    for P in (128, 512, 2048, 8192, 32768):
        reps = 10 if q else (400 if P <= 2048 else 150)
        run_add_request(P, reps, env, series)
        log(f"add_request P={P}: {series['add_request'][-1]['median_s'] * 1e6:.0f} us")

    import transformers
    doc = {
        "format": "simcore-cpu-costs", "version": 1,
        "vllm_version": vllm.__version__, "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "python": platform.python_version(),
        "cpu": cpu_facts(),
        "measured_at": args.measured_at,
        "fits_model": "t = a + b_per_seq*num_seqs + c_per_token*num_tokens (seconds)",
        "method": (
            "vLLM's own V1 Python code run on the CPU with no model: Scheduler (sync, fcfs, "
            "chunked prefill, prefix caching on with the default sha256 block hash, "
            f"block_size {BLOCK}, {NUM_BLOCKS} KV blocks, max_num_seqs 1024, log_stats on) fed "
            "fake ModelRunnerOutputs with one sampled token per request whose prompt is done; its "
            "EngineCoreOutputs msgpack-encoded and decoded as over ZMQ and fed to the front end's "
            "OutputProcessor (log_stats on, an IterationStats per step, DELTA streaming output "
            "kind, one RequestOutputCollector queue per request drained untimed after each step, "
            "as AsyncLLM does). Each call timed alone with time.perf_counter_ns; single process, "
            "gc on. Decode: N requests with 512-token prompts, timing starts at the first step "
            "in which all N decode (max_num_batched_tokens 8192). Prefill: k requests with "
            "prompts of 4 chunks of T/k tokens (max_num_batched_tokens T, "
            "long_prefill_token_threshold T/k when k > 1); *_prefill_new is the admitting step, "
            "*_prefill the continuing chunk steps (the last chunk, which samples, is left out). "
            "add_request: per request, InputProcessor.process_inputs on a token-id prompt + "
            "assign_request_id, OutputProcessor.add_request, msgpack encode+decode of the "
            "EngineCoreRequest, Request.from_engine_core_request (prompt block hashing) and "
            "Scheduler.add_request, summed; each request aborted untimed afterwards. "
            "Every prompt is a prefix-cache miss. Statistics are over per-call times; fits are "
            "weighted least squares on the medians."),
        "tokenizer": (f"{os.path.basename(os.path.normpath(args.tokenizer))} (tokenizer.json, "
                      f"{vocab} tokens; fast DecodeStream detokenizer)") if tok else None,
        "wall_time_s": round(time.time() - t_start, 1),
        "python_reference": {"start": ref_start, "end": python_reference()},
        "series": series,
        "fits": {name: fit(points) for name, points in series.items()},
        "fits_combined": {
            "schedule (schedule_decode + schedule_prefill)":
                fit(series["schedule_decode"] + series["schedule_prefill"]),
            "update (update_decode + update_prefill)":
                fit(series["update_decode"] + series["update_prefill"]),
        },
    }
    if tok is None:
        doc["not_measured"] = ["output_processor_decode (no tokenizer: see "
                               "output_processor_decode_nodetok)", "input_processor_text"]
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    shutil.rmtree(mdir, ignore_errors=True)
    log(f"wrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
