"""Write the conformance scenarios (gzipped JSON) that simcore/engine/vllm_recorder.py replays
through vLLM.

Usage: python make_scenarios.py OUT_DIR [--mooncake TRACE.jsonl] [--only NAME,NAME]
Deterministic: the same call writes the same files (the first seven are the scenarios of the
original recording; the rest cover priorities, the watermark, full-sequence admission with
nothing running, aborts, max_num_scheduled_tokens and skip_reading_prefix_cache).
"""
import gzip
import json
import os
import random
import sys


def synthetic(name, seed, n, prompt, output, span, config, shared_prefixes=0, prefix_blocks=(0, 0)):
    rng = random.Random(seed)
    prefixes = [[rng.randrange(10**6) for _ in range(rng.randint(*prefix_blocks))]
                for _ in range(shared_prefixes)]
    reqs = []
    for i in range(n):
        plen = rng.randint(*prompt)
        keys = list(rng.choice(prefixes)) if prefixes and rng.random() < 0.7 else []
        bs = config.get("block_size", 16)
        keys = keys[: plen // bs]
        reqs.append({"id": f"r{i}", "arrive_step": rng.randint(0, span), "prompt_len": plen,
                     "output_len": rng.randint(*output), "block_keys": keys})
    return {"name": name, "config": config, "requests": reqs}


def mooncake(name, path, n, ms_per_step, config, hash_block=512):
    """Mooncake trace lines -> requests; each 512-token hash block becomes 32 16-token keys."""
    bs = config.get("block_size", 16)
    per = hash_block // bs
    reqs = []
    with open(path) as f:
        for i, line in enumerate(f):
            if i >= n:
                break
            r = json.loads(line)
            if r["input_length"] + r["output_length"] > config["max_model_len"]:
                continue  # vLLM refuses such a request before it reaches the scheduler
            keys = [h * per + k for h in r["hash_ids"] for k in range(per)][: r["input_length"] // bs]
            reqs.append({"id": f"m{i}", "arrive_step": int(r["timestamp"] // ms_per_step),
                         "prompt_len": r["input_length"], "output_len": max(1, r["output_length"]),
                         "block_keys": keys})
    return {"name": name, "config": config, "requests": reqs}


def with_priorities(sc, seed, levels):
    """Give every request a priority drawn from range(levels)."""
    rng = random.Random(seed)
    for r in sc["requests"]:
        r["priority"] = rng.randrange(levels)
    return sc


def with_aborts(sc, seed, fraction, max_wait):
    """Abort a `fraction` of the requests, each between its arrival and `max_wait` steps later
    (some at once, while they wait; others while running or preempted)."""
    rng = random.Random(seed)
    for r in sc["requests"]:
        if rng.random() < fraction:
            r["abort_step"] = r["arrive_step"] + rng.choice([0, rng.randint(1, max_wait)])
    return sc


ABORT_STEPS = {"r119": 81, "r116": 86, "r103": 102, "r87": 107, "r45": 114, "r49": 124,
               "r55": 136, "r74": 146, "r6": 151, "r86": 192, "r91": 197, "r81": 208, "r64": 222,
               "r40": 232, "r41": 330, "r63": 345, "r39": 355, "r57": 370}
"""Aborts of the `abort` scenario, chosen so that they hit, in turn, a preempted, a running and
a waiting request (found by replaying the scenario in the simulator, whose decisions match the
recording)."""


def with_abort_steps(sc, steps):
    for r in sc["requests"]:
        if r["id"] in steps:
            r["abort_step"] = steps[r["id"]]
    return sc


def with_skip_reading(sc, seed, fraction):
    rng = random.Random(seed)
    for r in sc["requests"]:
        if rng.random() < fraction:
            r["skip_reading_prefix_cache"] = True
    return sc


def priority_self_preemption(name, config):
    """Low-priority long decoders admitted first, then urgent requests behind them in the running
    list: when the latest low-priority decoder needs a block it is itself the lowest-priority
    running request, preempts itself, and vLLM goes on scheduling the urgent requests after it."""
    rng = random.Random(100)
    reqs = [{"id": f"low{i}", "arrive_step": 0, "prompt_len": rng.randint(30, 90),
             "output_len": 400, "block_keys": [], "priority": 10} for i in range(6)]
    rng = random.Random(0)
    for i in range(8):
        reqs.append({"id": f"urgent{i}", "arrive_step": 3 + 2 * i, "prompt_len": rng.randint(20, 60),
                     "output_len": rng.randint(100, 250), "block_keys": [], "priority": 0})
    return {"name": name, "config": config, "requests": reqs}


def large_prompt_alone(name, config, big, seed, n, abort_step=None):
    """A prompt of `big` tokens arrives with nothing running, then `n` smaller requests."""
    rng = random.Random(seed)
    first = {"id": "big0", "arrive_step": 0, "prompt_len": big, "output_len": 20, "block_keys": []}
    if abort_step is not None:
        first["abort_step"] = abort_step
    reqs = [first]
    for i in range(n):
        reqs.append({"id": f"r{i}", "arrive_step": rng.randint(1, 120),
                     "prompt_len": rng.randint(30, 500), "output_len": rng.randint(5, 120),
                     "block_keys": []})
    if abort_step is None:
        reqs.append({"id": "big1", "arrive_step": 60, "prompt_len": big - 100, "output_len": 10,
                     "block_keys": []})
    return {"name": name, "config": config, "requests": reqs}


def base(**kw):
    cfg = {"block_size": 16, "max_model_len": 131072, "enable_chunked_prefill": True,
           "enable_prefix_caching": True, "long_prefill_token_threshold": 0, "policy": "fcfs"}
    cfg.update(kw)
    return cfg


def main(out_dir, mooncake_path=None, only=()):
    os.makedirs(out_dir, exist_ok=True)
    scenarios = [
        synthetic("basic", 1, 40, (20, 600), (5, 80), 60,
                  base(max_num_seqs=8, max_num_batched_tokens=256, num_blocks=400)),
        synthetic("prefix", 2, 200, (100, 3000), (1, 200), 400,
                  base(max_num_seqs=32, max_num_batched_tokens=512, num_blocks=1200),
                  shared_prefixes=6, prefix_blocks=(4, 120)),
        synthetic("pressure", 3, 400, (50, 2500), (10, 400), 300,
                  base(max_num_seqs=64, max_num_batched_tokens=1024, num_blocks=300),
                  shared_prefixes=3, prefix_blocks=(2, 40)),
        synthetic("nochunk", 4, 150, (10, 1800), (1, 120), 200,
                  base(max_num_seqs=16, max_num_batched_tokens=2048, num_blocks=500,
                       enable_chunked_prefill=False, max_model_len=2048)),
        synthetic("threshold", 5, 150, (10, 2000), (1, 150), 150,
                  base(max_num_seqs=24, max_num_batched_tokens=768, num_blocks=700,
                       long_prefill_token_threshold=128), shared_prefixes=2, prefix_blocks=(8, 30)),
        synthetic("noprefixcache", 6, 150, (10, 2000), (1, 150), 150,
                  base(max_num_seqs=24, max_num_batched_tokens=512, num_blocks=400,
                       enable_prefix_caching=False), shared_prefixes=2, prefix_blocks=(8, 30)),
    ]
    if mooncake_path:
        scenarios.append(mooncake("mooncake_head", mooncake_path, 300, 25,
                                  base(max_num_seqs=64, max_num_batched_tokens=8192, num_blocks=20000)))
    scenarios += [
        priority_self_preemption("priority_self_preempt",
                                 base(max_num_seqs=32, max_num_batched_tokens=512, num_blocks=40,
                                      policy="priority", enable_prefix_caching=False)),
        with_priorities(synthetic("priority", 7, 200, (30, 1500), (5, 250), 200,
                                  base(max_num_seqs=32, max_num_batched_tokens=768, num_blocks=250,
                                       policy="priority"), shared_prefixes=3,
                                  prefix_blocks=(2, 30)), 17, 4),
        large_prompt_alone("watermark_idle", base(max_num_seqs=16, max_num_batched_tokens=4096,
                                                  num_blocks=200, watermark=0.1), 3000, 8, 30),
        large_prompt_alone("full_isl_idle", base(max_num_seqs=16, max_num_batched_tokens=512,
                                                 num_blocks=100), 2000, 9, 20, abort_step=30),
        with_abort_steps(synthetic("abort", 10, 120, (50, 600), (20, 200), 600,
                                   base(max_num_seqs=32, max_num_batched_tokens=512, num_blocks=300),
                                   shared_prefixes=3, prefix_blocks=(2, 30)), ABORT_STEPS),
        with_aborts(with_priorities(synthetic("abort_priority", 12, 150, (50, 1500), (10, 250), 150,
                                              base(max_num_seqs=32, max_num_batched_tokens=512,
                                                   num_blocks=200, policy="priority")), 22, 3),
                    23, 0.3, 120),
        synthetic("max_scheduled", 13, 150, (20, 1500), (1, 150), 150,
                  base(max_num_seqs=24, max_num_batched_tokens=768, num_blocks=500,
                       max_num_scheduled_tokens=200), shared_prefixes=2, prefix_blocks=(8, 30)),
        with_skip_reading(synthetic("skip_prefix", 14, 150, (100, 2000), (1, 150), 200,
                                    base(max_num_seqs=32, max_num_batched_tokens=512,
                                         num_blocks=1000), shared_prefixes=4,
                                    prefix_blocks=(4, 60)), 24, 0.3),
    ]
    for sc in scenarios:
        if only and sc["name"] not in only:
            continue
        path = os.path.join(out_dir, sc["name"] + ".json.gz")
        with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
            f.write(json.dumps(sc).encode())
        print(sc["name"], len(sc["requests"]))


if __name__ == "__main__":
    args = sys.argv[1:]
    moon = None
    if "--mooncake" in args:
        k = args.index("--mooncake")
        moon = args[k + 1]
        del args[k:k + 2]
    only = ()
    if "--only" in args:
        k = args.index("--only")
        only = tuple(args[k + 1].split(","))
        del args[k:k + 2]
    main(args[0], moon, only)
