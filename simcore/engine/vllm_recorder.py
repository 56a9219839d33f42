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


UNIQUE_BASE = 2**26
"""Token ids fit int32 (vLLM 0.34 stores them so): shared blocks' tokens lie below UNIQUE_BASE
(1,000 + key x block_size + position), every other token is drawn above it from a 64-bit mix
of (request index, position), so no two requests' own blocks can hash alike by chance."""
_SPAN = 2**31 - UNIQUE_BASE
_M64 = 2**64 - 1


def _unique(index, pos):
    """A token id of request `index` at position `pos` (outputs from 2**40), above UNIQUE_BASE:
    splitmix64 of the pair."""
    z = (index * 2**41 + pos + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return UNIQUE_BASE + (z ^ (z >> 31)) % _SPAN


def prompt_tokens(index, req, block_size):
    keys = req.get("block_keys") or []
    toks = []
    for b in range(req["prompt_len"] // block_size):
        if b < len(keys):
            base = 1_000 + keys[b] * block_size
            toks.extend(base + j for j in range(block_size))
        else:
            toks.extend(_unique(index, b * block_size + j) for j in range(block_size))
    toks.extend(_unique(index, p) for p in range(len(toks), req["prompt_len"]))
    return toks


def sampled_token(index, n):
    return _unique(index, 2**40 + n)


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
        if 1_000 + (max(r.get("block_keys") or [0]) + 1) * sc["config"].get("block_size", 16) \
                > UNIQUE_BASE:
            raise SystemExit(f"{path}: requests[{i}] has a block key too large for int32 ids")
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


class Driver:
    """vLLM's scheduler driven step by step: requests added and aborted between steps, each
    step scheduled and updated with one sampled token per request whose prompt is done."""

    def __init__(self, cfg):
        self.sched = make_scheduler(cfg)
        self.block_size = cfg.get("block_size", 16)
        init_none_hash(sha256)
        self.hasher = get_request_block_hasher(self.block_size, sha256)
        self.index_of = {}
        self.produced = {}
        self.admitted = set()
        self.evictions = 0
        self.aborted_in_step = set()     # aborted between a step's schedule and its update
        pool = self.sched.kv_cache_manager.block_pool
        evict = pool._maybe_evict_cached_block

        def counted(block):     # prefix-cache evictions, as the simulator counts them
            gone = evict(block)
            self.evictions += bool(gone)
            return gone
        pool._maybe_evict_cached_block = counted

    def add(self, index, r):
        self.index_of[r["id"]] = index
        params = SamplingParams(max_tokens=r["output_len"], ignore_eos=True,
                                skip_reading_prefix_cache=r.get("skip_reading_prefix_cache",
                                                                False))
        self.sched.add_request(Request(
            request_id=r["id"], prompt_token_ids=prompt_tokens(index, r, self.block_size),
            sampling_params=params, pooling_params=None, arrival_time=float(index),
            priority=r.get("priority", 0), block_hasher=self.hasher))

    def abort(self, ids):
        if not ids:
            return []
        done = [r.request_id for r in
                self.sched.finish_requests(ids, RequestStatus.FINISHED_ABORTED)]
        self.aborted_in_step.update(done)
        return done

    def free_blocks(self):
        return self.sched.kv_cache_manager.block_pool.get_num_free_blocks()

    def schedule(self):
        """vLLM schedules a step: its decisions (the golden format's fields but "finished" and
        "free_blocks"), or None when nothing is queued. `update()` ends the step."""
        s, index_of = self.sched, self.index_of
        if not s.has_requests():
            return None
        so = s.schedule()
        ids = list(so.num_scheduled_tokens)
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
            (resumed if n.req_id in self.admitted else new).append(n.req_id)
            computed[n.req_id] = n.num_computed_tokens
        self.admitted.update(new)
        admit = {rid: computed[rid] for rid in new + resumed}
        sampled = []
        for rid in ids:
            req = s.requests[rid]
            if req.num_computed_tokens >= req.num_tokens:
                n = self.produced.get(rid, 0)
                sampled.append([sampled_token(index_of[rid], n)])
                self.produced[rid] = n + 1
            else:
                sampled.append([])
        self._step = (so, ids, sampled, set(s.requests))
        self.aborted_in_step = set()
        return {"scheduled": so.num_scheduled_tokens, "new": new, "resumed": resumed,
                "preempted": sorted(so.preempted_req_ids, key=lambda r: index_of[r]),
                "computed_on_admit": admit}

    def update(self):
        """The step's sampled tokens back to vLLM: the requests that finished, in request order
        (one aborted meanwhile is passed over, as vLLM does)."""
        so, ids, sampled, before = self._step
        s = self.sched
        index = ({"req_id_to_index": {r: k for k, r in enumerate(ids)}}
                 if "req_id_to_index" in OUTPUT_FIELDS else {})     # vLLM < 0.34 takes it
        s.update_from_output(so, ModelRunnerOutput(req_ids=ids, sampled_token_ids=sampled,
                                                   **index))
        gone = before - set(s.requests) - self.aborted_in_step
        return sorted(gone, key=lambda r: self.index_of[r])

    def step(self, aborted=()):
        """One whole step's record (the golden format without "step"); None when nothing is
        queued."""
        rec = self.schedule()
        if rec is None:
            return None
        finished = self.update()
        rec["finished"] = sorted(set(finished) | set(aborted), key=lambda r: self.index_of[r])
        rec["free_blocks"] = self.free_blocks()
        return rec


def main(scenario_path, out_path):
    load_vllm()
    sc = load(scenario_path)
    d = Driver(sc["config"])
    pending = sorted(enumerate(sc["requests"]), key=lambda p: (p[1]["arrive_step"], p[0]))
    aborts = sorted((r["abort_step"], i, r["id"]) for i, r in enumerate(sc["requests"])
                    if r.get("abort_step") is not None)
    step = idle = 0
    with open(out_path, "w") as out:
        while pending or d.sched.has_requests():
            while pending and pending[0][1]["arrive_step"] <= step:
                d.add(*pending.pop(0))
            due = []
            while aborts and aborts[0][0] <= step:
                due.append(aborts.pop(0)[2])
            aborted = d.abort(due)
            rec = d.step(aborted)
            if rec is None:
                rec = {"scheduled": {}, "new": [], "resumed": [], "preempted": [],
                       "computed_on_admit": {}, "finished": [], "free_blocks": d.free_blocks()}
            idle = 0 if rec["scheduled"] or pending or aborts else idle + 1
            if idle > 1000:
                raise SystemExit(f"stuck at step {step}: requests wait but nothing can be scheduled")
            out.write(json.dumps({"step": step, **rec}) + "\n")
            step += 1


def serve():
    """Drive vLLM's scheduler for a simulation, one JSON line in and out per command on
    stdin/stdout: first {"config": {...}} (a scenario's config), answered "vllm VERSION"; then
    commands with "op": "abort" ({"add": [requests, each with its "index"], "abort": [ids]}:
    the adds and aborts alone, answered by the free blocks after them), "schedule" (adds, then
    vLLM schedules a step: its decisions and the free blocks the step holds, or {"idle": true}
    when nothing is queued) and "update" (the step's sampled tokens: the requests that
    finished and the free blocks after). Every answer carries the prefix-cache evictions so
    far."""
    first = json.loads(sys.stdin.readline())
    version = load_vllm()
    d = Driver(first["config"])
    print(f"vllm {version}", flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        for r in cmd.get("add", ()):
            d.add(r["index"], r)
        op = cmd["op"]
        if op == "abort":
            rec = {"finished": d.abort(cmd.get("abort", []))}
        elif op == "schedule":
            rec = d.schedule() or {"idle": True}
        else:
            rec = {"finished": d.update()}
        rec["free_blocks"] = d.free_blocks()
        rec["evictions"] = d.evictions
        sys.stdout.write(json.dumps(rec) + "\n")
        sys.stdout.flush()


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
    if sys.argv[1:] == ["--serve"]:
        serve()
    else:
        print(f"vllm {load_vllm()}", flush=True)
        main(sys.argv[1], sys.argv[2])
