"""The result's request rows held as columns: each row reads back as the dict it stands for
(keys, order, values and None where a figure has none), and the columns go to JSON, pickle
and back to plain rows without a difference."""

from __future__ import annotations

import io
import json
import pickle

import pytest

from simcore.config import parse_config
from simcore.metrics import RequestRecord
from simcore.request_rows import RequestRows, json_default, json_default_streaming
from simcore.result import RunResult
from simcore.simulate import simulate, simulate_run
from simcore.token_times import DeliveryLog, TokenTimes


def _records() -> list[RequestRecord]:
    log = DeliveryLog()
    log.times.extend([1.0, 1.25, 1.5, 2.0])
    ranged = TokenTimes()
    ranged.add_range(log, 0, 4)
    return [
        # Four tokens from an engine's delivery log, a replica, a queue wait.
        RequestRecord("a", 10, 4, arrival_s=0.5, send_s=0.75, token_times_s=ranged,
                      success=True, first_scheduled_s=0.875, server_s=0.0625, replica=1,
                      num_preemptions=2, num_cached_prompt_tokens=16),
        # One token: no TPOT and no ITLs.
        RequestRecord("b", 3, 1, arrival_s=1.0, send_s=1.0, token_times_s=[1.5], success=True,
                      first_scheduled_s=1.25),
        # Tokens that all came at once: one chunk, so no gap.
        RequestRecord("c", 3, 3, arrival_s=1.0, send_s=1.0, token_times_s=[2.0, 2.0, 2.0],
                      success=True, first_scheduled_s=1.5),
        # Two chunks of which one holds two tokens: the gaps between chunks only.
        RequestRecord("d", 3, 3, arrival_s=1.0, send_s=1.0, token_times_s=[2.0, 2.0, 2.5],
                      success=True),
        # Failed before it was sent: no send, no figures, its error.
        RequestRecord("e", 3, 3, arrival_s=2.0, error="timeout"),
        # Failed after two tokens: still no latency figures.
        RequestRecord("f", 3, 3, arrival_s=2.0, send_s=2.0, token_times_s=[2.5, 3.0],
                      error="aborted", first_scheduled_s=2.25),
    ]


EXPECTED = [
    {"request_id": "a", "replica": 1, "prompt_len": 10, "output_len": 4, "success": True,
     "error": None, "arrival_s": 0.5, "send_s": 0.75, "ttft_ms": 250.0, "e2el_ms": 1250.0,
     "tpot_ms": 1000.0 / 3, "mean_itl_ms": 1000.0 / 3, "max_itl_ms": 500.0,
     "queue_ms": 62.5, "num_preemptions": 2, "num_cached_prompt_tokens": 16},
    {"request_id": "b", "replica": None, "prompt_len": 3, "output_len": 1, "success": True,
     "error": None, "arrival_s": 1.0, "send_s": 1.0, "ttft_ms": 500.0, "e2el_ms": 500.0,
     "tpot_ms": None, "queue_ms": 250.0, "num_preemptions": 0, "num_cached_prompt_tokens": 0},
    {"request_id": "c", "replica": None, "prompt_len": 3, "output_len": 3, "success": True,
     "error": None, "arrival_s": 1.0, "send_s": 1.0, "ttft_ms": 1000.0, "e2el_ms": 1000.0,
     "tpot_ms": 0.0, "mean_itl_ms": None, "max_itl_ms": None, "queue_ms": 500.0,
     "num_preemptions": 0, "num_cached_prompt_tokens": 0},
    {"request_id": "d", "replica": None, "prompt_len": 3, "output_len": 3, "success": True,
     "error": None, "arrival_s": 1.0, "send_s": 1.0, "ttft_ms": 1000.0, "e2el_ms": 1500.0,
     "tpot_ms": 250.0, "mean_itl_ms": 500.0, "max_itl_ms": 500.0, "queue_ms": None,
     "num_preemptions": 0, "num_cached_prompt_tokens": 0},
    {"request_id": "e", "replica": None, "prompt_len": 3, "output_len": 3, "success": False,
     "error": "timeout", "arrival_s": 2.0, "send_s": None, "queue_ms": None,
     "num_preemptions": 0, "num_cached_prompt_tokens": 0},
    {"request_id": "f", "replica": None, "prompt_len": 3, "output_len": 3, "success": False,
     "error": "aborted", "arrival_s": 2.0, "send_s": 2.0, "queue_ms": 250.0,
     "num_preemptions": 0, "num_cached_prompt_tokens": 0},
]


def test_rows_read_back_as_their_dicts():
    rows = RequestRows.from_records(_records())
    assert len(rows) == len(EXPECTED)
    for got, want in zip(rows, EXPECTED):
        assert list(got) == list(want)          # the keys, in their order
        for key, value in want.items():
            assert got[key] == (pytest.approx(value) if type(value) is float else value), key
    assert rows[-1] == rows[5] == EXPECTED[5]
    assert rows[1:3] == [rows[1], rows[2]]
    with pytest.raises(IndexError):
        rows[6]
    assert type(rows[0]["replica"]) is int and type(rows[0]["arrival_s"]) is float


def test_sessions_add_their_columns():
    recs = _records()[:2]
    rows = RequestRows.from_records(recs, [("s0", 0), ("s0", 1)])
    assert [(r["session_id"], r["turn"]) for r in rows] == [("s0", 0), ("s0", 1)]
    assert list(rows[1])[-2:] == ["session_id", "turn"]


def test_json_and_pickle_keep_the_rows():
    rows = RequestRows.from_records(_records())
    plain = rows.to_list()
    assert json.dumps({"requests": rows}, default=json_default) == json.dumps({"requests": plain})
    streamed, whole = io.StringIO(), io.StringIO()
    json.dump({"requests": rows, "n": 1}, streamed, indent=1, default=json_default_streaming)
    json.dump({"requests": plain, "n": 1}, whole, indent=1)
    assert streamed.getvalue() == whole.getvalue()
    empty = io.StringIO()
    json.dump({"requests": RequestRows.from_records([])}, empty, indent=1,
              default=json_default_streaming)
    assert json.loads(empty.getvalue()) == {"requests": []}
    back = pickle.loads(pickle.dumps(rows))
    assert back == rows and back.to_list() == plain
    with pytest.raises(TypeError, match="RequestRows"):
        json.dumps(rows)


def test_a_run_gives_the_same_rows_as_columns_or_dicts():
    cfg = parse_config({"name": "rows", "model": {"name": "meta-llama/Llama-3.1-8B"},
                        "hardware": {"gpu": "A100-80GB"},
                        "workload": {"num_prompts": 40, "request_rate": 20,
                                     "dataset": {"kind": "random", "input_len": 128,
                                                 "output_len": 16, "range_ratio": 0.5}}})
    plain = simulate(cfg)
    columns = simulate(cfg, plain=False)
    assert isinstance(plain["requests"], list) and isinstance(columns["requests"], RequestRows)
    assert columns["requests"] == plain["requests"]
    assert json.dumps(columns, default=json_default) == json.dumps(plain)
    typed = simulate_run(cfg)
    assert isinstance(typed.requests, RequestRows)
    assert RunResult.from_dict(columns).requests is columns["requests"]
    assert RunResult.from_dict(plain).to_dict() == plain
