"""Closed-loop multi-turn sessions: send times after replies, prefix-cache hits on the
conversation so far, how sessions end, configuration errors, determinism, trace linking.

The hand-computed cases run on a constant step time S = 1/64 s and block size 16, so every
virtual timestamp is exact. One session: turn 0 has a 100-token prompt and a 28-token reply;
each later turn appends a 30-token message, so the prompts are 100, 158 and 216 tokens.
"""

import copy
import json
from pathlib import Path

import pytest

from simcore.compute.base import StepTime
from simcore.config import parse_config
from simcore.engine.scheduler import SchedulerConfig
from simcore.errors import ConfigError
from simcore.serve import run_serving
from simcore.simulate import simulate
from simcore.workload import WorkloadConfig, request_stream
from simcore.workload.config import MooncakeDataset
from simcore.workload.keys import SESSION, NAMESPACE_SHIFT
from simcore.workload.sessions import (COMPLETED, ENDED_FAILED, ENDED_MAX_CONTEXT, SessionStream,
                                       link_conversations, mooncake_sessions)
from simcore.workload.traces import MooncakeRow

ROOT = Path(__file__).resolve().parents[1]
S = 1 / 64
BS = 16
THINK = 0.5


class Flat:
    """Stub step model: every step takes S seconds."""

    profile_id = "stub/flat"
    calibrated = False
    relative_uncertainty = 0.0

    def step_time(self, shape) -> StepTime:
        return StepTime(total_s=S, compute_s=S, comm_s=0.0, bound="compute")


def sessions_cfg(**dataset) -> WorkloadConfig:
    ds = {"kind": "sessions", "num_sessions": 1, "turns": 3, "first_prompt_len": 100,
          "reply_len": 28, "user_message_len": 30, "think_time_s": THINK}
    ds.update(dataset)
    return WorkloadConfig.model_validate({"dataset": ds})


def stream(cfg: WorkloadConfig, seed: int = 0) -> SessionStream:
    return request_stream(cfg, block_size=BS, seed=seed, base_dir=ROOT)


def serve(sessions, *, prefix_caching=True, max_model_len=4096, num_replicas=1,
          policy="round_robin", max_concurrency=None, request_timeout_s=None):
    sched = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=2048, num_blocks=1000,
                            block_size=BS, max_model_len=max_model_len,
                            enable_prefix_caching=prefix_caching)
    return run_serving(sessions, sched_config=sched, num_replicas=num_replicas,
                       step_model=Flat(), router_policy=policy, report_interval_s=4 * S,
                       balance_threshold=16, max_concurrency=max_concurrency,
                       max_model_len=max_model_len, sample_interval_s=1.0,
                       request_timeout_s=request_timeout_s)


# -- the hand-computed session ------------------------------------------------------------------

def test_turns_grow_by_the_reply_and_the_new_message():
    (s,) = stream(sessions_cfg()).sessions
    assert [(t.prompt_len, t.output_len, t.think_s) for t in s.turns] == [
        (100, 28, 0.0), (158, 28, THINK), (216, 28, THINK)]
    # Turn 1 repeats turn 0's prompt and reply: its keys start with every key turn 0 carries,
    # those of the blocks its reply fills included.
    t0, t1 = s.spec(0, 0.0), s.spec(1, 1.0)
    assert len(t0.block_keys) == 100 // BS and len(t0.output_block_keys) == 128 // BS - 100 // BS
    assert t1.block_keys[:128 // BS] == t0.block_keys + t0.output_block_keys
    assert len(t1.block_keys) == 158 // BS
    assert all(k >> NAMESPACE_SHIFT == SESSION for k in t1.block_keys)
    assert (t1.session_id, t1.turn) == ("s0", 1)


def test_next_turn_is_sent_think_time_after_the_reply_and_hits_its_blocks():
    run = serve(stream(sessions_cfg()))
    r0, r1, r2 = run.records
    # Turn 0: prefill and first token in step 1, then one token a step: tokens at S..28S.
    assert r0.send_s == 0 and r0.token_times_s[0] == S and r0.token_times_s[-1] == 28 * S
    # Turn 1 arrives exactly THINK after turn 0's last token, and is sent at once.
    assert r1.arrival_s == r1.send_s == 28 * S + THINK
    assert r1.token_times_s[0] == r1.send_s + S and r1.token_times_s[-1] == r1.send_s + 28 * S
    assert r2.arrival_s == r2.send_s == r1.token_times_s[-1] + THINK
    # Turn 0 leaves its prompt + reply minus the last sampled token (whose KV is never
    # computed) behind: floor((100 + 28 - 1) / 16) = 7 full blocks, 112 tokens. Not
    # floor(128 / 16) = 8: the block holding the last token is never full of computed tokens.
    assert r0.num_cached_prompt_tokens == 0
    assert r1.num_cached_prompt_tokens == (100 + 28 - 1) // BS * BS == 112
    # Turn 1 computed 158 + 28 - 1 = 185 tokens: 11 full blocks; turn 2 (216 tokens) may hit up
    # to (216 - 1) // 16 = 13 blocks, so it hits all 11.
    assert r2.num_cached_prompt_tokens == (158 + 28 - 1) // BS * BS == 176
    assert run.sessions.completed == 1 and run.sessions.outcome == {"s0": COMPLETED}
    assert (run.sessions.turns_sent, run.sessions.turns_completed) == (3, 3)
    assert run.session_turns == [("s0", 0), ("s0", 1), ("s0", 2)]


def test_without_prefix_caching_no_turn_hits():
    run = serve(stream(sessions_cfg()), prefix_caching=False)
    assert [r.num_cached_prompt_tokens for r in run.records] == [0, 0, 0]
    # The same schedule otherwise: each turn still waits for the previous reply.
    assert run.records[1].send_s == 28 * S + THINK


def test_independent_requests_never_hit_a_reply():
    """The same prompts sent as independent requests (no output keys) hit only the earlier
    prompts' full blocks, as before sessions existed."""
    (s,) = stream(sessions_cfg()).sessions
    specs = [s.spec(0, 0.0), s.spec(1, 1.0)]
    specs = [type(sp)(sp.request_id, sp.arrival_s, sp.prompt_len, sp.output_len, sp.block_keys)
             for sp in specs]
    sched = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=2048, num_blocks=1000,
                            block_size=BS, max_model_len=4096)
    run = run_serving(specs, sched_config=sched, num_replicas=1, step_model=Flat(),
                      router_policy="round_robin", report_interval_s=1.0, balance_threshold=16,
                      max_concurrency=None, max_model_len=4096, sample_interval_s=1.0)
    assert run.records[1].num_cached_prompt_tokens == 100 // BS * BS
    assert run.sessions is None and run.session_turns is None


# -- how sessions end -----------------------------------------------------------------------------

def test_a_turn_past_max_model_len_ends_the_session_unsent():
    # Turn 2 needs 216 + 28 = 244 > 200 tokens: the client stops before it.
    run = serve(stream(sessions_cfg()), max_model_len=200)
    assert [r.request_id for r in run.records] == ["s0-0", "s0-1"]
    assert all(r.success for r in run.records)
    o = run.sessions
    assert (o.completed, o.ended_max_context, o.ended_failed) == (0, 1, 0)
    assert o.outcome == {"s0": ENDED_MAX_CONTEXT}
    assert (o.turns_planned, o.turns_sent) == (3, 2)


def test_max_context_tokens_is_the_clients_own_limit():
    # 158 + 28 = 186 > 150: only turn 0 is sent.
    run = serve(stream(sessions_cfg(max_context_tokens=150)))
    assert [r.request_id for r in run.records] == ["s0-0"]
    assert run.sessions.ended_max_context == 1


def test_a_first_turn_past_the_limit_sends_nothing():
    run = serve(stream(sessions_cfg(max_context_tokens=100)))
    assert run.records == [] and run.sessions.ended_max_context == 1


def test_a_timed_out_turn_ends_its_session():
    # Turn 0 needs 28 steps; the client gives up after 10.
    run = serve(stream(sessions_cfg(num_sessions=2)), request_timeout_s=10 * S)
    assert len(run.records) == 2
    assert not any(r.success for r in run.records)
    assert all("timed out" in r.error for r in run.records)
    o = run.sessions
    assert (o.completed, o.ended_failed, o.turns_sent, o.turns_completed) == (0, 2, 2, 0)
    assert set(o.outcome.values()) == {ENDED_FAILED}


def test_max_concurrency_holds_turns_and_a_thinking_session_holds_no_slot():
    run = serve(stream(sessions_cfg(num_sessions=2)), max_concurrency=1)
    assert len(run.records) == 6 and all(r.success for r in run.records)
    spans = sorted((r.send_s, r.token_times_s[-1]) for r in run.records)
    assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:]))
    by_id = {r.request_id: r for r in run.records}
    # s1's first turn waits for s0's; s0's second arrives while s1's runs and is not held.
    assert by_id["s1-0"].arrival_s == 0 and by_id["s1-0"].send_s == 28 * S
    assert by_id["s0-1"].send_s == by_id["s0-1"].arrival_s == 28 * S + THINK
    assert run.sessions.completed == 2


def test_prefix_affinity_keeps_each_session_on_one_replica():
    cfg = sessions_cfg(num_sessions=6, turns=4)
    run = serve(stream(cfg), num_replicas=2, policy="prefix_affinity")
    replicas: dict[str, set] = {}
    for r, (sid, _) in zip(run.records, run.session_turns):
        replicas.setdefault(sid, set()).add(r.replica)
    assert all(len(v) == 1 for v in replicas.values())
    assert len({next(iter(v)) for v in replicas.values()}) == 2
    assert all(r.num_cached_prompt_tokens > 0
               for r, (_, j) in zip(run.records, run.session_turns) if j)


# -- generation: distributions, shared prefix, determinism --------------------------------------

def test_distributions_and_the_shared_prefix():
    cfg = WorkloadConfig.model_validate({"request_rate": 2.0, "dataset": {
        "kind": "sessions", "num_sessions": 50, "turns": {"mean": 4, "range_ratio": 0.5},
        "shared_prefix_len": 64, "first_prompt_len": {"mean": 100, "range_ratio": 0.5},
        "reply_len": {"mean": 50, "range_ratio": 0.5},
        "user_message_len": {"mean": 20, "range_ratio": 0.5},
        "think_time_s": {"distribution": "exponential", "mean_s": 3.0}}})
    st = stream(cfg)
    assert len(st.sessions) == 50 and len(st) == sum(len(s.turns) for s in st.sessions)
    assert cfg.resolved_num_prompts == 50 * 6
    assert {len(s.turns) for s in st.sessions} <= set(range(2, 7))
    starts = [s.start_s for s in st.sessions]
    assert starts == sorted(starts) and starts[-1] == pytest.approx(50 / 2.0)
    firsts = {s.spec(0, 0.0).block_keys[:64 // BS] for s in st.sessions}
    assert len(firsts) == 1                       # the shared prefix's keys
    assert len({s.spec(0, 0.0).block_keys[64 // BS:] for s in st.sessions}) == 50
    thinks = [t.think_s for s in st.sessions for t in s.turns[1:]]
    assert min(thinks) >= 0 and len(set(thinks)) == len(thinks)
    # Iterating gives each session's first turn at its start.
    assert [sp.arrival_s for sp in st] == starts


def test_same_seed_same_sessions_other_seed_others():
    cfg = WorkloadConfig.model_validate({"request_rate": 1.0, "dataset": {
        "kind": "agent_sessions", "num_sessions": 20}})
    a, b, c = stream(cfg, 3), stream(cfg, 3), stream(cfg, 4)
    assert a.sessions == b.sessions
    assert a.sessions != c.sessions


def small_sim_config(**workload):
    w = {"request_rate": 2.0, "max_concurrency": 8,
         "dataset": {"kind": "sessions", "num_sessions": 12,
                     "turns": {"mean": 3, "range_ratio": 0.4},
                     "first_prompt_len": 200, "reply_len": {"mean": 40, "range_ratio": 0.5},
                     "user_message_len": 30, "think_time_s": {"mean_s": 1.0}}}
    w.update(workload)
    return {"name": "sessions-small", "seed": 1,
            "model": {"name": "meta-llama/Llama-3.1-8B", "dtype": "bf16"},
            "hardware": {"gpu": "H100-SXM"}, "workload": w}


def test_simulate_reports_sessions_and_is_deterministic():
    cfg = parse_config(small_sim_config(), base_dir=ROOT)
    r1, r2 = simulate(cfg), simulate(cfg)
    assert json.dumps(r1, sort_keys=True) == json.dumps(r2, sort_keys=True)
    s = r1["sessions"]
    assert s["num_sessions"] == 12 and s["completed"] == 12
    assert s["turns_sent"] == s["turns_completed"] == r1["completed"] == len(r1["requests"])
    assert s["prefix_cache_hit_rate_first_turns"] == 0.0
    assert s["prefix_cache_hit_rate_later_turns"] > 0.5
    assert s["ttft_first_turns"]["count"] == 12
    assert {row["turn"] for row in r1["requests"]} >= {0, 1}
    assert all(row["session_id"] == row["request_id"].split("-")[0] for row in r1["requests"])


# -- configuration errors -----------------------------------------------------------------------

@pytest.mark.parametrize("workload, message", [
    ({"num_prompts": 10}, r"workload\.num_prompts: a sessions dataset runs dataset\.num_sessions"),
    ({"dataset": {"reply_len": {"mean": 1, "range_ratio": 0.5}}},
     r"workload\.dataset\.reply_len: can be 0, must be at least 1"),
    ({"dataset": {"turns": 0}}, r"workload\.dataset\.turns: can be 0, must be at least 1"),
    ({"dataset": {"first_prompt_len": 0}}, r"workload\.dataset\.first_prompt_len: can be 0"),
    ({"dataset": {"think_time_s": -1}}, r"workload\.dataset\.think_time_s"),
    ({"dataset": {"think_time_s": {"distribution": "gamma", "mean_s": 1}}},
     r"workload\.dataset\.think_time_s\.distribution"),
    ({"dataset": {"num_session": 3}}, r"workload\.dataset\.num_session"),
    ({"dataset": {"max_context_tokens": 0}}, r"workload\.dataset\.max_context_tokens: must be "
                                             r"at least 1"),
])
def test_config_errors_name_the_field(workload, message):
    raw = small_sim_config()
    w = copy.deepcopy(raw["workload"])
    ds = {**w["dataset"], **workload.pop("dataset", {})}
    raw["workload"] = {**w, **workload, "dataset": ds}
    with pytest.raises(ConfigError, match=message):
        parse_config(raw, base_dir=ROOT)


def test_replayed_sessions_need_the_trace_times():
    raw = small_sim_config(dataset={"kind": "mooncake", "path": "examples/data/mooncake_head.jsonl",
                                    "sessions": True, "use_timestamps": False},
                           request_rate=1.0, max_concurrency=None)
    with pytest.raises(ConfigError, match=r"dataset\.sessions: .*use_timestamps: true"):
        parse_config(raw, base_dir=ROOT)


# -- Mooncake conversations ---------------------------------------------------------------------

def row(lineno, t_s, prompt_len, output_len, ids):
    return MooncakeRow(lineno, t_s, prompt_len, output_len, tuple(ids), ())


def test_linking_needs_the_whole_earlier_prompt_and_reply():
    rows = [row(1, 0.0, 1100, 50, [0, 1, 2]),      # 2 full hash blocks: 0, 1
            row(2, 1.0, 1100 + 50 + 20, 9, [0, 1, 3]),   # repeats them, holds prompt + reply
            row(3, 2.0, 600, 10, [0, 5]),          # 1 full block: 0, everyone's system prompt
            row(4, 3.0, 700, 10, [0, 6]),          # shares only block 0 with row 3: unlinked
            row(5, 4.0, 1100, 10, [0, 1, 7]),      # repeats row 1's blocks but row 2's too few
            row(6, 5.0, 1200, 5, [0, 1, 3])]       # shorter than row 2's prompt + reply
    assert link_conversations(rows, 512) == [[0, 1], [2], [3], [4], [5]]


def test_the_shipped_mooncake_excerpt_links_conversations():
    ds = MooncakeDataset(path="examples/data/mooncake_head.jsonl", sessions=True)
    sessions = mooncake_sessions(ds, None, path=ROOT / ds.path, block_size=BS)
    assert sum(len(s.turns) for s in sessions) == 1000
    by_first = {s.turns[0].request_id: s for s in sessions}
    # Line 138 (m137: 7833 tokens) is line 2 (m1: 7322 prompt + 490 reply) followed by 21
    # tokens, sent 48 s after it in the trace: the session's second turn, 48 s after m1's reply.
    s = by_first["m1"]
    assert [t.request_id for t in s.turns] == ["m1", "m137"]
    assert s.turns[1].think_s == pytest.approx(48.0)
    t0, t1 = s.spec(0, 0.0), s.spec(1, 1.0)
    n = (7322 + 490) // BS
    assert t1.block_keys[:n] == t0.block_keys + t0.output_block_keys
    multi = [s for s in sessions if len(s.turns) > 1]
    assert len(multi) > 100


def test_a_replayed_session_turn_hits_its_predecessors_reply(tmp_path):
    rows = [{"timestamp": 0, "input_length": 1100, "output_length": 50, "hash_ids": [0, 1, 2]},
            {"timestamp": 2000, "input_length": 1170, "output_length": 4,
             "hash_ids": [0, 1, 3]}]
    (tmp_path / "x.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = WorkloadConfig.model_validate({"dataset": {"kind": "mooncake", "path": "x.jsonl",
                                                     "sessions": True}})
    st = request_stream(cfg, block_size=BS, seed=0, base_dir=tmp_path)
    assert [len(s.turns) for s in st.sessions] == [2]
    run = serve(st)
    r0, r1 = run.records
    assert r1.send_s == r0.token_times_s[-1] + 2.0
    assert r1.num_cached_prompt_tokens == (1100 + 50 - 1) // BS * BS


@pytest.mark.parametrize("num_replicas", [1, 2])
def test_quiet_leaps_change_nothing_in_sessions(monkeypatch, num_replicas):
    """Steps taken together must see a turn that a reply on another engine sends after its
    pause: the records are those of stepping one at a time."""
    import simcore.serve.loop as loop

    cfg = WorkloadConfig.model_validate({"request_rate": 8.0, "dataset": {
        "kind": "sessions", "num_sessions": 16, "turns": {"mean": 4, "range_ratio": 0.5},
        "first_prompt_len": {"mean": 60, "range_ratio": 0.5},
        "reply_len": {"mean": 40, "range_ratio": 0.9},
        "user_message_len": {"mean": 10, "range_ratio": 0.5},
        "think_time_s": {"mean_s": 0.05}}})

    def records(leaps: bool):
        monkeypatch.setattr(loop, "QUIET_LEAPS", leaps)
        run = serve(stream(cfg), num_replicas=num_replicas, policy="least_outstanding")
        return [(r.request_id, r.replica, r.send_s, list(r.token_times_s),
                 r.num_cached_prompt_tokens) for r in run.records]

    assert records(True) == records(False)


def test_a_sessions_workload_has_no_fixed_request_list():
    from simcore.workload import generate_requests

    with pytest.raises(ConfigError, match="sessions workload sends its later turns"):
        generate_requests(sessions_cfg(), block_size=BS, seed=0, base_dir=ROOT,
                          max_model_len=None)


def test_a_run_too_large_for_memory_names_num_sessions():
    from simcore.footprint import check_fits

    raw = small_sim_config()
    raw["workload"]["dataset"]["num_sessions"] = 10_000
    cfg = parse_config(raw, base_dir=ROOT)
    # 10,000 sessions of at most ceil(3 x 1.4) = 5 turns.
    assert cfg.workload.resolved_num_prompts == 50_000
    with pytest.raises(ConfigError, match=r"workload\.dataset\.num_sessions: 50,000 requests "
                                          r".*lower num_sessions"):
        check_fits(cfg, 2**20)
