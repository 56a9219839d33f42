"""The workload streams into the simulation: requests are made as the client reaches them from
compact columns, so a run of millions of requests starts at once and holds no list of them; the
requests are exactly those the materialised workload had."""

from __future__ import annotations

import hashlib
import time
import tracemalloc
from pathlib import Path

import pytest

from simcore.config import parse_config
from simcore.workload import WorkloadConfig, generate_requests, request_stream

DATA = Path(__file__).parent / "data"

CASES = {
    "random": {"num_prompts": 300, "request_rate": 7, "burstiness": 0.5,
               "dataset": {"kind": "random", "input_len": 200, "output_len": 30,
                           "range_ratio": 0.5, "prefix_len": 40}},
    "prefix_repetition": {"num_prompts": 250, "request_rate": 20,
                          "dataset": {"kind": "prefix_repetition", "num_prefixes": 7,
                                      "prefix_len": 64, "suffix_len": 10, "output_len": 5}},
    "sharegpt_json": {"num_prompts": 40, "request_rate": 3,
                      "dataset": {"kind": "sharegpt", "path": "sharegpt.json"}},
    "sharegpt_csv": {"num_prompts": 500, "ramp_up_strategy": "linear", "ramp_up_start_rps": 1,
                     "ramp_up_end_rps": 9,
                     "dataset": {"kind": "sharegpt", "path": "sharegpt_lengths_excerpt.csv",
                                 "length_filter": None}},
    "custom": {"num_prompts": 60, "request_rate": 5,
               "dataset": {"kind": "custom", "path": "custom.jsonl"}},
    "mooncake": {"dataset": {"kind": "mooncake", "path": "mooncake_excerpt.jsonl",
                             "time_scale": 0.5}},
    "azure": {"num_prompts": 15, "dataset": {"kind": "azure", "path": "azure_conv_excerpt.csv"}},
}

MATERIALISED = {
    "random": ("9c44e06d81617d6c", 300),
    "prefix_repetition": ("cc29ad2c11148848", 245),
    "sharegpt_json": ("7ac6cc7184026f64", 40),
    "sharegpt_csv": ("325f16571e4dc96b", 500),
    "custom": ("d2ef99592d168d51", 60),
    "mooncake": ("c7ff07a69d42c1de", 200),
    "azure": ("2ba2e49a19998061", 15),
}
"""Digest and count of each case's requests (seed 11) as the workload generator made them when
it built every request up front, before it streamed them (the sharegpt and custom cases
re-recorded when their rows came to be chosen in vLLM's own order, `vllm_order`)."""


def digest(specs) -> str:
    rows = [(s.request_id, s.arrival_s.hex(), s.prompt_len, s.output_len, s.block_keys,
             s.priority) for s in specs]
    return hashlib.sha256(repr(rows).encode()).hexdigest()[:16]


@pytest.mark.parametrize("name", CASES)
def test_streamed_requests_are_those_the_materialised_workload_had(name):
    cfg = WorkloadConfig.model_validate(CASES[name])
    stream = request_stream(cfg, block_size=16, seed=11, base_dir=DATA)
    assert (digest(stream), len(stream)) == MATERIALISED[name]
    assert digest(stream) == MATERIALISED[name][0], "a second pass gives the same requests"
    listed = generate_requests(cfg, block_size=16, seed=11, base_dir=DATA, max_model_len=None)
    assert digest(listed) == MATERIALISED[name][0]


def test_a_long_workload_is_columns_not_objects():
    cfg = WorkloadConfig.model_validate({"num_prompts": 1_000_000, "request_rate": 100,
                                         "dataset": {"kind": "random", "input_len": 64,
                                                     "output_len": 8}})
    tracemalloc.start()
    try:
        stream = request_stream(cfg, block_size=16, seed=0, base_dir=DATA)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(stream) == 1_000_000
    # Three 8-byte numbers a request (prompt and output lengths, send time); a RequestSpec
    # object with its id string takes more than 150 bytes.
    assert held < 40 * 1_000_000, held
    first = next(iter(stream))
    assert first.request_id == "r0" and first.output_len == 8


class _Stop(Exception):
    pass


def test_the_simulation_starts_before_the_workload_is_made():
    # Two million requests: the first completes (and progress is reported) long before the
    # client reaches the last one, and nothing like a list of them is ever held.
    cfg = parse_config({"model": {"name": "meta-llama/Llama-3.1-8B"},
                        "hardware": {"gpu": "A100-80GB"},
                        "workload": {"num_prompts": 2_000_000, "request_rate": 1000,
                                     "dataset": {"kind": "random", "input_len": 64,
                                                 "output_len": 4}}})
    from simcore.simulate import simulate

    seen = {}

    def progress(now_s: float, done: int, total: int) -> None:
        seen.update(now_s=now_s, total=total, traced=tracemalloc.get_traced_memory())
        raise _Stop

    started = time.perf_counter()
    tracemalloc.start()
    try:
        with pytest.raises(_Stop):
            simulate(cfg, progress=progress)
    finally:
        tracemalloc.stop()
    assert seen["total"] == 2_000_000
    assert seen["now_s"] < 1.0
    _, peak = seen["traced"]
    assert peak < 150 * 2**20, f"{peak / 2**20:.0f} MiB traced before the first request finished"
    assert time.perf_counter() - started < 30
