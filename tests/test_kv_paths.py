"""KV caches moving over the cluster's fabric, end to end: the prefill-to-decode handoff of P/D
disaggregation and fetches from an external KV tier on storage servers.

P/D: every request is prefilled once and handed off once; the handoff moves exactly the prompt's
KV bytes (per-GPU shards over TP ranks and pipeline stages add up to the model's KV per token);
the first token comes after the prefill and the transfer; prefill instances run only prompts and
decode instances recompute exactly one prompt token per request. Tier: on a prefix-heavy
workload with a small GPU cache the tier cuts TTFT; fetches move exactly the loaded tokens' KV to
every GPU of the engine; `max_kvc_ready_requests` bounds the requests holding blocks for fetches;
a run is reproducible from its seed. Bad combinations are refused naming the field.
"""

import copy
import json
from collections import defaultdict

import pytest

import simcore.simulate
from simcore.cluster.kvpaths import KvPaths
from simcore.config import parse_config
from simcore.dag.builder import stage_layers
from simcore.engine.connector import DisaggDecodeConnector
from simcore.engine.kv_tier import TierConnector
from simcore.engine.request import WAITING_FOR_REMOTE_KVS
from simcore.engine.scheduler import Scheduler
from simcore.errors import ConfigError
from simcore.setup import build_deployment
from simcore.simulate import simulate

LLAMA_8B_KV_BYTES_PER_TOKEN = 32 * 2 * 8 * 128 * 2
"""Llama-3.1-8B, bf16 KV: 32 layers x (K and V) x 8 KV heads x head dim 128 x 2 bytes."""

PD = {
    "name": "pd",
    "seed": 3,
    "model": {"name": "meta-llama/Llama-3.1-8B"},
    "hardware": {"gpu": "H100-SXM", "gpus_per_node": 2},
    "parallelism": {"tensor_parallel_size": 2,
                    "prefill_decode": {"num_prefill_instances": 1, "num_decode_instances": 2}},
    "workload": {"num_prompts": 24, "request_rate": 40,
                 "dataset": {"kind": "random", "input_len": 400, "output_len": 12,
                             "range_ratio": 0.5}},
    "cluster": {"num_nodes": 3, "fabric": {"backend": "flow"}},
}
"""One prefill and two decode instances of TP 2, each on a node of its own."""

TIER = {
    "name": "tier",
    "seed": 5,
    "model": {"name": "meta-llama/Llama-3.1-8B", "max_model_len": 4096},
    "hardware": {"gpu": "H100-SXM", "gpus_per_node": 2},
    # The roofline's prefill, against which the workload's prefix reuse was sized.
    "compute": {"kind": "roofline"},
    "parallelism": {"tensor_parallel_size": 2, "data_parallel_size": 2},
    "engine": {"num_gpu_blocks_override": 600},
    "workload": {"num_prompts": 120, "request_rate": 10,
                 "dataset": {"kind": "prefix_repetition", "prefix_len": 2048, "suffix_len": 128,
                             "num_prefixes": 40, "output_len": 64}},
    "cluster": {"num_nodes": 2, "network": {"num_storage_nodes": 1},
                "kv_tier": {"capacity_tokens": 1_000_000}},
}
"""Two TP-2 replicas whose 600-block caches hold about four 2,176-token prompts each, under 40
prefixes: a prefix is usually evicted locally before it comes back, but kept in the tier."""


def config(base, **sections):
    """`base` with top-level sections replaced (dicts merged one level deep)."""
    d = copy.deepcopy(base)
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(d.get(key), dict):
            d[key] = {**d[key], **copy.deepcopy(value)}
        else:
            d[key] = copy.deepcopy(value)
    return parse_config(d)


def kv_bytes_per_token_on_all_gpus(cfg) -> int:
    """KV bytes of one token summed over every GPU of an engine: each pipeline stage's layers,
    on each of its TP ranks (their KV-head shards)."""
    dep = build_deployment(cfg)
    tp = cfg.parallelism.tensor_parallel_size
    stages = stage_layers(dep.arch.num_layers, cfg.parallelism.pipeline_parallel_size)
    return sum(int(dep.arch.kv_bytes_per_token(dep.kv_cache_dtype, tp, len(layers))) * tp
               for layers in stages)


class Observed:
    """What a run did beyond its result: the serving run; per request id, when its prompt
    finished on a prefill instance and each of its asynchronous KV loads as (engine, start,
    end) on the clock; per scheduler, the most requests it ever had waiting for remote KV and,
    per request id, the prompt tokens it scheduled (computed or recomputed)."""

    def __init__(self) -> None:
        self.run = None
        self.prefill_done_at: dict[str, float] = {}
        self.loads: dict[str, list[tuple[int, float, float | None]]] = defaultdict(list)
        self.max_waiting_for_remote: dict[Scheduler, int] = defaultdict(int)
        self.prompt_tokens: dict[Scheduler, dict[str, int]] = defaultdict(
            lambda: defaultdict(int))


def observe(cfg):
    """Simulate `cfg` with the serving run, the KV paths and the scheduler patched to record
    into an `Observed`; return (result, observed)."""
    seen = Observed()
    serve = simcore.simulate.run_serving
    prefill_done = KvPaths.prefill_done
    start_loads = KvPaths.start_loads
    schedule = Scheduler.schedule

    def run_serving(*args, **kwargs):
        seen.run = serve(*args, **kwargs)
        return seen.run

    def on_prefill_done(self, req, prefill_index, release):
        seen.prefill_done_at[req.request_id] = self.runtime.env.now
        prefill_done(self, req, prefill_index, release)

    def on_start_loads(self, index, loads, on_loaded):
        env = self.runtime.env
        for req, _ in loads:
            if req.status == WAITING_FOR_REMOTE_KVS:
                seen.loads[req.request_id].append((index, env.now, None))

        def loaded(req):
            i, start, _ = seen.loads[req.request_id][-1]
            seen.loads[req.request_id][-1] = (i, start, env.now)
            on_loaded(req)

        start_loads(self, index, loads, loaded)

    def on_schedule(self):
        out = schedule(self)
        # Loads start only in schedule(): right after it is when most requests wait for them.
        seen.max_waiting_for_remote[self] = max(seen.max_waiting_for_remote[self],
                                                self.num_waiting_for_remote)
        counts = seen.prompt_tokens[self]
        for req, n, before in out.scheduled:
            if before < req.prompt_len:
                counts[req.request_id] += min(before + n, req.prompt_len) - before
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(simcore.simulate, "run_serving", run_serving)
        mp.setattr(KvPaths, "prefill_done", on_prefill_done)
        mp.setattr(KvPaths, "start_loads", on_start_loads)
        mp.setattr(Scheduler, "schedule", on_schedule)
        result = simulate(cfg)
    return result, seen


# -- prefill/decode disaggregation -------------------------------------------------------------

PD_LAYOUTS = {"tp2": {"tensor_parallel_size": 2},
              "pp2": {"tensor_parallel_size": 1, "pipeline_parallel_size": 2}}


@pytest.fixture(scope="module", params=list(PD_LAYOUTS))
def pd_run(request):
    cfg = config(PD, parallelism=PD_LAYOUTS[request.param])
    result, seen = observe(cfg)
    return cfg, result, seen


def test_pd_every_request_completes_after_exactly_one_handoff(pd_run):
    cfg, r, seen = pd_run
    n = cfg.workload.num_prompts
    assert r["completed"] == n and r["failed"] == 0
    assert r["cluster"]["kv_transfers"]["num"] == n
    assert sorted(seen.prefill_done_at) == sorted(row["request_id"] for row in r["requests"])
    assert all(len(v) == 1 for v in seen.loads.values()) and len(seen.loads) == n
    # The decode instance (1 or 2) is chosen in turn: 12 requests each.
    assert sorted(sum(1 for v in seen.loads.values() if v[0][0] == d) for d in (1, 2)) == [12, 12]
    # The prefill instance's token is not streamed: the client sees output_len tokens.
    assert all(len(rec.token_times_s) == rec.output_len for rec in seen.run.records)


def test_pd_handoff_moves_exactly_the_prompts_kv_bytes(pd_run):
    cfg, r, seen = pd_run
    per_token = kv_bytes_per_token_on_all_gpus(cfg)
    # TP shards (8 KV heads over 2 ranks) and PP stages (16 + 16 layers) add up to the model.
    assert per_token == LLAMA_8B_KV_BYTES_PER_TOKEN
    prompts = sum(row["prompt_len"] for row in r["requests"])
    kt = r["cluster"]["kv_transfers"]
    assert kt["bytes"] == prompts * per_token
    assert r["cluster"]["fabric"]["payload_bytes"] >= kt["bytes"]
    # The decode connectors loaded every prompt whole (the last token is recomputed).
    loaded = {}
    for sched in seen.run.schedulers[1:]:
        assert isinstance(sched.connector, DisaggDecodeConnector)
        loaded.update(sched.connector.loaded_tokens)
    assert loaded == {row["request_id"]: row["prompt_len"] for row in r["requests"]}
    assert 0 < kt["p50_s"] <= kt["p99_s"] <= kt["max_s"]
    assert kt["mean_s"] <= kt["max_s"]


def test_pd_first_token_comes_after_the_prefill_and_the_transfer(pd_run):
    cfg, r, seen = pd_run
    nic_bytes_per_s = 400e9 / 8
    per_gpu = LLAMA_8B_KV_BYTES_PER_TOKEN / 2      # each of the 2 GPUs receives half
    for rec in seen.run.records:
        rid = rec.request_id
        done = seen.prefill_done_at[rid]
        [(_, start, end)] = seen.loads[rid]
        assert rec.send_s < done <= start < end < rec.token_times_s[0]
        transfer = end - start
        # A shard cannot cross a NIC faster than its line rate.
        assert transfer >= rec.prompt_len * per_gpu / nic_bytes_per_s
        ttft = rec.token_times_s[0] - rec.send_s
        assert ttft > (done - rec.send_s) + transfer


def test_pd_prefill_instances_run_prompts_and_decode_instances_recompute_one_token(pd_run):
    cfg, r, seen = pd_run
    rows = r["requests"]
    prompt_of = {row["request_id"]: row["prompt_len"] for row in rows}
    output_of = {row["request_id"]: row["output_len"] for row in rows}
    prefill_sched, *decode_scheds = seen.run.schedulers
    # The prefill instance computes every prompt once and nothing else ...
    assert dict(seen.prompt_tokens[prefill_sched]) == prompt_of
    prefill, *decode = r["replicas"]
    assert prefill["num_prefill_tokens"] == sum(prompt_of.values())
    assert prefill["num_decode_tokens"] == 0
    assert all(k.startswith("prefill/") for k in prefill["step_s_by_phase_bound"])
    for d, sched, stats in zip((1, 2), decode_scheds, decode):
        mine = sorted(rid for rid, v in seen.loads.items() if v[0][0] == d)
        # ... and a decode instance recomputes one prompt token of each of its requests, the
        # last, which samples the first output; output_len - 1 decodes follow. The engine counts
        # that one-token step after the loaded context as a decode.
        assert dict(seen.prompt_tokens[sched]) == {rid: 1 for rid in mine}
        assert stats["num_prefill_tokens"] == 0
        assert stats["num_decode_tokens"] == sum(output_of[rid] for rid in mine)
        assert seen.run.replicas[d].num_tokens == stats["num_decode_tokens"]
        assert all(k.startswith("decode/") for k in stats["step_s_by_phase_bound"])
        assert stats["num_preemptions"] == 0


# -- external KV tier --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tier_runs():
    cfg = config(TIER)
    with_tier, seen = observe(cfg)
    without = simulate(config(TIER, cluster={"kv_tier": None}))
    return cfg, with_tier, seen, without


def test_the_tier_cuts_ttft_on_a_prefix_heavy_workload_with_a_small_gpu_cache(tier_runs):
    cfg, r, seen, without = tier_runs
    assert r["completed"] == without["completed"] == cfg.workload.num_prompts
    assert "kv_tier" not in without["cluster"] and "kv_transfers" not in without["cluster"]
    # Fetches that share a storage server's link queue on it (the analytical fabric serialises
    # them), so the cut is smaller than the loads alone would give.
    assert r["mean_ttft_ms"] < 0.9 * without["mean_ttft_ms"]
    # Tier hits count apart from the local prefix cache's.
    assert r["external_kv_hit_rate"] > 0.2 and without["external_kv_hit_rate"] == 0.0
    assert r["num_external_prompt_tokens"] == sum(
        s.connector.num_loaded_tokens for s in seen.run.schedulers)
    t = r["cluster"]["kv_tier"]
    assert t["lookups"] > 0 and t["hit_blocks"] > 0 and t["stored_blocks"] > 0
    assert t["capacity_blocks"] == 1_000_000 // 16


def test_tier_fetches_move_exactly_the_loaded_tokens_kv_to_every_gpu(tier_runs):
    cfg, r, seen, _ = tier_runs
    connectors = [s.connector for s in seen.run.schedulers]
    assert all(isinstance(c, TierConnector) for c in connectors)
    loaded_tokens = sum(c.num_loaded_tokens for c in connectors)
    per_token = kv_bytes_per_token_on_all_gpus(cfg)
    assert per_token == LLAMA_8B_KV_BYTES_PER_TOKEN
    kt = r["cluster"]["kv_transfers"]
    assert loaded_tokens > 0
    assert kt["bytes"] == loaded_tokens * per_token
    assert kt["num"] == sum(len(v) for v in seen.loads.values())
    assert kt["num"] == sum(len(c.loaded_tokens) for c in connectors)
    # Fetches are whole blocks of the tier.
    assert all(n % 16 == 0 for c in connectors for n in c.loaded_tokens.values())
    # Every fetch ended before its request got its first token.
    first = {rec.request_id: rec.token_times_s[0] for rec in seen.run.records}
    for rid, loads in seen.loads.items():
        for _, start, end in loads:
            assert start < end < first[rid]


def bounded_burst(limit):
    """80 requests at once on two replicas of 1,200 blocks, at most `limit` of them per replica
    holding blocks for fetches."""
    return config(TIER, workload={"num_prompts": 80, "request_rate": "inf"},
                  engine={"num_gpu_blocks_override": 1200},
                  cluster={"kv_tier": {"capacity_tokens": 1_000_000,
                                       "max_kvc_ready_requests": limit}})


def test_max_kvc_ready_requests_bounds_the_requests_holding_blocks_for_fetches():
    # Unbounded, a replica has more than three requests holding blocks for fetches at once.
    _, free = observe(bounded_burst(100))
    assert max(free.max_waiting_for_remote.values()) > 3
    for limit in (1, 2, 3):
        r, seen = observe(bounded_burst(limit))
        assert r["completed"] == 80
        peaks = list(seen.max_waiting_for_remote.values())
        assert len(peaks) == 2 and max(peaks) == limit


def test_client_timeouts_are_refused_with_a_kv_tier():
    with pytest.raises(ConfigError, match=r"^workload\.request_timeout_s: client timeouts are "
                                          r"not modelled with prefill/decode"):
        simulate(config(TIER, workload={"request_timeout_s": 5}))


def test_same_seed_same_result_with_a_tier():
    cfg = config(TIER, workload={"num_prompts": 40, "request_rate": 10,
                                 "dataset": {**TIER["workload"]["dataset"], "num_prefixes": 10}})
    first = simulate(cfg)
    second = simulate(cfg)
    assert json.dumps(first, sort_keys=True) == json.dumps(second, sort_keys=True)
    assert first["cluster"]["kv_transfers"]["num"] > 0
    other = simulate(cfg.model_copy(update={"seed": cfg.seed + 1}))
    assert other["cluster"]["kv_transfers"] != first["cluster"]["kv_transfers"]


def test_same_seed_same_result_with_disaggregation():
    cfg = config(PD, workload={"num_prompts": 10})
    first = simulate(cfg)
    assert json.dumps(first, sort_keys=True) == json.dumps(simulate(cfg), sort_keys=True)


# -- refused combinations ----------------------------------------------------------------------

def without(d, *keys):
    """A copy of mapping `d` without `keys`."""
    return {k: v for k, v in d.items() if k not in keys}


REFUSED = {
    "pd_without_cluster": (without(PD, "cluster"), r"parallelism\W+prefill_decode"),
    "pd_with_dp": ({**PD, "parallelism": {**PD["parallelism"], "tensor_parallel_size": 1,
                                          "data_parallel_size": 2}},
                   r"prefill_decode\W.*data_parallel_size must be 1"),
    "tier_without_storage": ({**TIER, "cluster": without(TIER["cluster"], "network")},
                             r"cluster\W+kv_tier\W.*num_storage_nodes"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_bad_combinations_are_refused_naming_the_field(case):
    data, field = REFUSED[case]
    with pytest.raises(ConfigError, match=field):
        simulate(parse_config(copy.deepcopy(data)))


def test_pd_on_one_node_moves_the_kv_over_nvlink_not_the_fabric():
    cfg = config(PD, hardware={"gpus_per_node": 4},
                 parallelism={"prefill_decode": {"num_prefill_instances": 1,
                                                 "num_decode_instances": 1}},
                 cluster={"num_nodes": 1})
    r, seen = observe(cfg)
    kt = r["cluster"]["kv_transfers"]
    assert kt["num"] == cfg.workload.num_prompts
    assert kt["bytes"] == sum(row["prompt_len"] for row in r["requests"]) * \
        LLAMA_8B_KV_BYTES_PER_TOKEN
    assert r["cluster"]["fabric"]["payload_bytes"] == 0
    dep = build_deployment(cfg)
    nvlink_bytes_per_s = (dep.gpu.interconnect_bandwidth_bytes_per_s
                          * cfg.compute.roofline.interconnect_bandwidth_fraction)
    for rec in seen.run.records:
        [(_, start, end)] = seen.loads[rec.request_id]
        assert end - start == pytest.approx(
            rec.prompt_len * LLAMA_8B_KV_BYTES_PER_TOKEN / 2 / nvlink_bytes_per_s, rel=1e-9)


def test_tier_reports_fetched_blocks_apart_from_repeated_lookups(tier_runs):
    tier = tier_runs[1]["cluster"]["kv_tier"]
    assert 0 < tier["fetched_blocks"] <= tier["hit_blocks"]


def test_the_summary_shows_the_tiers_hit_rate_and_bytes_beside_the_local_one(tier_runs):
    from dse.cli import _render_cluster
    from dse.summary import render_summary

    _, r, _, without = tier_runs
    tier = r["cluster"]["kv_tier"]
    # The fetched tokens' KV, its shards over the engine's TP GPUs summed.
    assert tier["fetched_bytes"] == r["cluster"]["kv_transfers"]["bytes"]
    assert tier["fetched_bytes"] == tier["fetched_blocks"] * 16 * LLAMA_8B_KV_BYTES_PER_TOKEN
    out = render_summary(r)
    assert "Prefix-cache hit rate, local / KV tier:" in out
    assert f"{r['prefix_cache_hit_rate']:.2f} / {r['external_kv_hit_rate']:.2f}" in out
    assert r["external_kv_hit_rate"] > 0.2
    block = _render_cluster(r["cluster"])
    assert "Fetched from the tier (GB):" in block
    assert f"{tier['fetched_bytes'] / 1e9:.1f}" in block
    # Without a tier the summary keeps the one local rate.
    assert "KV tier" not in render_summary(without)


def test_prefill_instances_hold_blocks_until_the_decode_side_has_read_them(pd_run):
    _, _, seen = pd_run
    for sched in seen.run.schedulers:
        assert sched.sending == {}                  # every prompt's KV was read, then freed
        assert not sched.kv.req_blocks              # and no request holds a block at the end
