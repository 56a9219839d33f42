"""Record vLLM's own V1 scheduler, step by step, on a scenario file.

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

Needs the vLLM environment that setup.sh builds (CPU only, no GPU).
Usage: python record.py SCENARIO.json[.gz] OUT.jsonl
"""
import gzip
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import torch  # noqa: E402
from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

CONFIG_KEYS = {"max_num_seqs", "max_num_batched_tokens", "num_blocks", "block_size",
               "max_model_len", "enable_chunked_prefill", "enable_prefix_caching",
               "long_prefill_token_threshold", "policy", "watermark", "max_num_scheduled_tokens",
               "reserve_full_isl"}
REQUEST_KEYS = {"id", "arrive_step", "prompt_len", "output_len", "block_keys", "priority",
                "abort_step", "skip_reading_prefix_cache"}


def prompt_tokens(index, req, block_size):
    keys = req.get("block_keys", [])
    toks = []
    for b in range(req["prompt_len"] // block_size):
        if b < len(keys):
            base = 1_000 + keys[b] * block_size
            toks.extend(base + j for j in range(block_size))
        else:
            toks.extend(10**12 + index * 10**6 + b * block_size + j for j in range(block_size))
    tail = req["prompt_len"] - len(toks)
    toks.extend(2 * 10**12 + index * 10**6 + j for j in range(tail))
    return toks


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
    model_cfg = ModelConfig(model=os.path.join(HERE, "tinymodel"), skip_tokenizer_init=True,
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
            new = [n.req_id for n in so.scheduled_new_reqs]
            cached = so.scheduled_cached_reqs
            resumed = [rid for rid, flag in zip(cached.req_ids, cached.resumed_from_preemption) if flag] \
                if hasattr(cached, "resumed_from_preemption") else \
                [rid for rid in cached.req_ids if rid in getattr(cached, "resumed_req_ids", set())]
            admit = {n.req_id: n.num_computed_tokens for n in so.scheduled_new_reqs}
            for rid in resumed:
                k = cached.req_ids.index(rid)
                admit[rid] = cached.num_computed_tokens[k]
            sampled = []
            for rid in ids:
                req = s.requests[rid]
                done_prefill = req.num_computed_tokens >= req.num_tokens
                if done_prefill:
                    n = produced.get(rid, 0)
                    sampled.append([3 * 10**12 + index_of[rid] * 10**6 + n])
                    produced[rid] = n + 1
                else:
                    sampled.append([])
            before = set(s.requests)
            s.update_from_output(so, ModelRunnerOutput(
                req_ids=ids, req_id_to_index={r: k for k, r in enumerate(ids)}, sampled_token_ids=sampled))
            finished = sorted((before - set(s.requests)) | set(aborted), key=lambda r: index_of[r])
            out.write(json.dumps({
                "step": step, "scheduled": so.num_scheduled_tokens, "new": new, "resumed": resumed,
                "preempted": sorted(so.preempted_req_ids, key=lambda r: index_of[r]),
                "computed_on_admit": admit, "finished": finished,
                "free_blocks": s.kv_cache_manager.block_pool.get_num_free_blocks()}) + "\n")
            step += 1


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
