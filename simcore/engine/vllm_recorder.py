"""Record vLLM's own V1 scheduler, step by step, on a scenario file (a standalone script).

A scenario is JSON: {"config": {...}, "requests": [...]}.

config: max_num_seqs, max_num_batched_tokens, num_blocks (the GPU block pool, null block
  included), and optionally block_size (16), max_model_len (131072), enable_chunked_prefill
  (true), enable_prefix_caching (true), long_prefill_token_threshold (0), policy ("fcfs" or
  "priority"), watermark (0.0: the fraction of num_blocks kept free when admitting while
  something runs), max_num_scheduled_tokens (null: max_num_batched_tokens) and reserve_full_isl
  (true: vLLM's scheduler_reserve_full_isl). Any other key is refused: it would not reach vLLM.

requests: each has id, arrive_step, prompt_len, output_len, and block_keys: the content key of
  each full block_size-token block of its prompt, first block first (requests that share a
  leading run of keys share that prefix; a prompt's blocks past len(block_keys), and its partial
  last block, are unique to the request). Optionally priority (0; smaller runs first under the
  priority policy), abort_step (the client gives up: the request is aborted with
  `Scheduler.finish_requests(id, FINISHED_ABORTED)` just before the step numbered abort_step,
  unless it has finished by then) and skip_reading_prefix_cache (false; vLLM's
  SamplingParams.skip_reading_prefix_cache: no prefix-cache hit is looked up for it).
Requests join the waiting queue just before the step numbered arrive_step (before that step's
aborts). Every request generates exactly output_len tokens (ignore_eos), each token unique to
its request.

Output: JSON lines, one per step:
  step, scheduled {id: num_tokens}, new [ids admitted this step, in order],
  resumed [ids re-admitted after preemption], preempted [ids],
  computed_on_admit {id: num_computed_tokens when admitted (prefix-cache hit)},
  finished [ids that finished in this step, and ids aborted just before it, in scenario order],
  free_blocks (after the step).

It imports nothing from this project: any Python that can import vLLM runs it as a file (the
environment scripts/vllm_conformance/setup.sh builds, CPU only, no GPU, or a full vLLM
install). `dse conformance SCENARIO --record-with-installed-vllm` runs it so and compares vLLM's
steps with the simulator's; the first line it prints is "vllm VERSION".
Usage: python vllm_recorder.py SCENARIO.json[.gz] OUT.jsonl
"""
import gzip
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

HERE = os.path.dirname(os.path.abspath(__file__))
TINY_MODEL = os.path.join(HERE, "..", "data", "conformance", "tinymodel")
"""A two-layer Llama config without weights: the scheduler never runs the model."""

CONFIG_KEYS = {"max_num_seqs", "max_num_batched_tokens", "num_blocks", "block_size",
               "max_model_len", "enable_chunked_prefill", "enable_prefix_caching",
               "long_prefill_token_threshold", "policy", "watermark", "max_num_scheduled_tokens",
               "reserve_full_isl"}
REQUEST_KEYS = {"id", "arrive_step", "prompt_len", "output_len", "block_keys", "priority",
                "abort_step", "skip_reading_prefix_cache"}


UNIQUE_BASE, SAMPLED_BASE, REQUEST_SPAN = 2**26, 2**30, 2**18
"""Token ids fit int32 (vLLM 0.34 stores them so): shared blocks' tokens below 2**26, then
each request's own prompt tokens in a span of 2**18 from UNIQUE_BASE (its partial last block
at 2**17 in it), its sampled tokens in a span of 2**18 from SAMPLED_BASE."""


def prompt_tokens(index, req, block_size):
    keys = req.get("block_keys", [])
    own = UNIQUE_BASE + index * REQUEST_SPAN
    toks = []
    for b in range(req["prompt_len"] // block_size):
        if b < len(keys):
            base = 1_000 + keys[b] * block_size
            toks.extend(base + j for j in range(block_size))
        else:
            toks.extend(own + b * block_size + j for j in range(block_size))
    tail = req["prompt_len"] - len(toks)
    toks.extend(own + REQUEST_SPAN // 2 + j for j in range(tail))
    return toks


def sampled_token(index, n):
    return SAMPLED_BASE + index * REQUEST_SPAN + n


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        sc = json.load(f)
    unknown = sorted(set(sc["config"]) - CONFIG_KEYS)
    if unknown:
        raise SystemExit(f"{path}: config keys {unknown} are not vLLM scheduler settings")
    for i, r in enumerate(sc["requests"]):
        extra = sorted(set(r) - REQUEST_KEYS)
        if extra:
            raise SystemExit(f"{path}: requests[{i}] has unknown fields {extra}")
        if r.get("abort_step") is not None and r["abort_step"] < r["arrive_step"]:
            raise SystemExit(f"{path}: requests[{i}].abort_step is before its arrive_step")
        if r["prompt_len"] >= REQUEST_SPAN // 2 or r["output_len"] >= REQUEST_SPAN:
            raise SystemExit(f"{path}: requests[{i}] is longer than this recorder's token ids "
                             f"allow ({REQUEST_SPAN // 2} prompt, {REQUEST_SPAN} output tokens)")
        if 1_000 + (max(r.get("block_keys") or [0]) + 1) * sc["config"].get("block_size", 16) \
                > UNIQUE_BASE:
            raise SystemExit(f"{path}: requests[{i}] has a block key too large for int32 ids")
    if len(sc["requests"]) > (2**31 - SAMPLED_BASE) // REQUEST_SPAN:
        raise SystemExit(f"{path}: more requests than this recorder's token ids allow")
    return sc


def make_scheduler(cfg):
    bs = cfg.get("block_size", 16)
    max_len = cfg.get("max_model_len", 131072)
    sched_cfg = SchedulerConfig(
        max_num_seqs=cfg["max_num_seqs"],
        max_num_batched_tokens=cfg["max_num_batched_tokens"],
        max_num_scheduled_tokens=cfg.get("max_num_scheduled_tokens"),
        max_model_len=max_len,
        enable_chunked_prefill=cfg.get("enable_chunked_prefill", True),
        long_prefill_token_threshold=cfg.get("long_prefill_token_threshold") or 0,
        async_scheduling=False,
        is_encoder_decoder=False,
        policy=cfg.get("policy", "fcfs"),
        watermark=cfg.get("watermark", 0.0),
        scheduler_reserve_full_isl=cfg.get("reserve_full_isl", True),
    )
    model_cfg = ModelConfig(model=TINY_MODEL, skip_tokenizer_init=True,
                            dtype="float16", max_model_len=max_len, seed=0)
    cache_cfg = CacheConfig(block_size=bs, enable_prefix_caching=cfg.get("enable_prefix_caching", True))
    vcfg = VllmConfig(scheduler_config=sched_cfg, model_config=model_cfg, cache_config=cache_cfg)
    nb = cfg["num_blocks"]
    kv_cfg = KVCacheConfig(num_blocks=nb, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=1,
                                                      dtype=torch.float32))])
    cache_cfg.num_gpu_blocks = nb
    return Scheduler(vllm_config=vcfg, kv_cache_config=kv_cfg, block_size=bs,
                     structured_output_manager=StructuredOutputManager(vcfg), log_stats=False)


def main(scenario_path, out_path):
    load_vllm()
    sc = load(scenario_path)
    cfg = sc["config"]
    bs = cfg.get("block_size", 16)
    s = make_scheduler(cfg)
    init_none_hash(sha256)
    hasher = get_request_block_hasher(bs, sha256)

    reqs = sorted(enumerate(sc["requests"]), key=lambda p: (p[1]["arrive_step"], p[0]))
    index_of = {r["id"]: i for i, r in enumerate(sc["requests"])}
    aborts = sorted((r["abort_step"], i, r["id"]) for i, r in enumerate(sc["requests"])
                    if r.get("abort_step") is not None)
    produced = {}
    admitted = set()
    pending = list(reqs)
    step = idle = 0
    with open(out_path, "w") as out:
        while pending or s.has_requests():
            while pending and pending[0][1]["arrive_step"] <= step:
                i, r = pending.pop(0)
                params = SamplingParams(max_tokens=r["output_len"], ignore_eos=True,
                                        skip_reading_prefix_cache=r.get("skip_reading_prefix_cache",
                                                                        False))
                s.add_request(Request(
                    request_id=r["id"], prompt_token_ids=prompt_tokens(i, r, bs),
                    sampling_params=params, pooling_params=None, arrival_time=float(i),
                    priority=r.get("priority", 0), block_hasher=hasher))
            due = []
            while aborts and aborts[0][0] <= step:
                due.append(aborts.pop(0)[2])
            aborted = [r.request_id for r in s.finish_requests(due, RequestStatus.FINISHED_ABORTED)] \
                if due else []
            if not s.has_requests():
                out.write(json.dumps({"step": step, "scheduled": {}, "new": [], "resumed": [],
                                      "preempted": [], "computed_on_admit": {}, "finished": [],
                                      "free_blocks": s.kv_cache_manager.block_pool.get_num_free_blocks()}) + "\n")
                step += 1
                continue
            so = s.schedule()
            ids = list(so.num_scheduled_tokens)
            idle = 0 if ids or pending or aborts else idle + 1
            if idle > 1000:
                raise SystemExit(f"stuck at step {step}: requests wait but nothing can be scheduled")
            # vLLM < 0.34 sends a request resumed after preemption as a cached request flagged
            # resumed; 0.34 sends it whole again among the new ones: admitted before = resumed.
            cached = so.scheduled_cached_reqs
            resumed = [rid for rid, flag in zip(cached.req_ids, cached.resumed_from_preemption) if flag] \
                if hasattr(cached, "resumed_from_preemption") else \
                [rid for rid in cached.req_ids if rid in getattr(cached, "resumed_req_ids", set())]
            computed = {rid: cached.num_computed_tokens[cached.req_ids.index(rid)]
                        for rid in resumed}
            new = []
            for n in so.scheduled_new_reqs:
                (resumed if n.req_id in admitted else new).append(n.req_id)
                computed[n.req_id] = n.num_computed_tokens
            admitted.update(new)
            admit = {rid: computed[rid] for rid in new + resumed}
            sampled = []
            for rid in ids:
                req = s.requests[rid]
                done_prefill = req.num_computed_tokens >= req.num_tokens
                if done_prefill:
                    n = produced.get(rid, 0)
                    sampled.append([sampled_token(index_of[rid], n)])
                    produced[rid] = n + 1
                else:
                    sampled.append([])
            before = set(s.requests)
            index = ({"req_id_to_index": {r: k for k, r in enumerate(ids)}}
                     if "req_id_to_index" in OUTPUT_FIELDS else {})     # vLLM < 0.34 takes it
            s.update_from_output(so, ModelRunnerOutput(req_ids=ids, sampled_token_ids=sampled,
                                                       **index))
            finished = sorted((before - set(s.requests)) | set(aborted), key=lambda r: index_of[r])
            out.write(json.dumps({
                "step": step, "scheduled": so.num_scheduled_tokens, "new": new, "resumed": resumed,
                "preempted": sorted(so.preempted_req_ids, key=lambda r: index_of[r]),
                "computed_on_admit": admit, "finished": finished,
                "free_blocks": s.kv_cache_manager.block_pool.get_num_free_blocks()}) + "\n")
            step += 1


def load_vllm() -> str:
    """Import vLLM's scheduler and what drives it (module globals); return vLLM's version."""
    global torch, CacheConfig, ModelConfig, SchedulerConfig, VllmConfig, SamplingParams, sha256
    global get_request_block_hasher, init_none_hash, Scheduler, FullAttentionSpec
    global KVCacheConfig, KVCacheGroupSpec, ModelRunnerOutput, Request, RequestStatus
    global StructuredOutputManager, OUTPUT_FIELDS
    import dataclasses

    import torch
    import vllm
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request, RequestStatus
    from vllm.v1.structured_output import StructuredOutputManager

    try:
        import vllm.triton_utils as triton_utils
    except ImportError:
        triton_utils = None
    if triton_utils is not None and not getattr(triton_utils, "HAS_TRITON", True):
        # vLLM 0.34's CPU platform refuses x86 without triton-cpu when the config is built;
        # the scheduler never runs a kernel, so the check is answered for it.
        triton_utils.HAS_TRITON = True
    OUTPUT_FIELDS = {f.name for f in dataclasses.fields(ModelRunnerOutput)}
    return vllm.__version__


if __name__ == "__main__":
    print(f"vllm {load_vllm()}", flush=True)
    main(sys.argv[1], sys.argv[2])
