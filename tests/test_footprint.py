"""The memory estimate of a run, against what the simulator was measured to hold a request, and
the refusal of a run that cannot fit."""

from __future__ import annotations

import copy
import tracemalloc

import pytest

from simcore.config import parse_config
from simcore.errors import ConfigError
from simcore.footprint import (BASE_BYTES, OUTPUT_TOKEN_BYTES, REQUEST_BYTES,
                               available_memory_bytes, check_fits, estimate_run_bytes,
                               output_tokens_per_request)

BASE = {"model": {"name": "meta-llama/Llama-3.1-8B"}, "hardware": {"gpu": "A100-80GB"},
        "workload": {"num_prompts": 1000, "request_rate": 50,
                     "dataset": {"kind": "random", "input_len": 128, "output_len": 16}}}


def config(**workload):
    data = copy.deepcopy(BASE)
    data["workload"].update(workload)
    return parse_config(data)


def test_the_estimate_grows_with_requests_and_output_tokens():
    small = estimate_run_bytes(config())
    assert small == BASE_BYTES + 1000 * (REQUEST_BYTES + 16 * OUTPUT_TOKEN_BYTES)
    assert estimate_run_bytes(config(num_prompts=2000)) - small == small - BASE_BYTES
    longer = config(dataset={"kind": "random", "input_len": 128, "output_len": 100,
                             "range_ratio": 0.5})
    assert output_tokens_per_request(longer) == (100.0, True)


def test_lengths_from_a_file_give_a_lower_bound_and_traces_no_estimate():
    sharegpt = config(dataset={"kind": "sharegpt", "path": "x.json"})
    assert output_tokens_per_request(sharegpt) == (1.0, False)
    with pytest.raises(ConfigError, match=r"at least 2,040 bytes a request"):
        check_fits(config(num_prompts=10**9, dataset={"kind": "sharegpt", "path": "x.json"}),
                   2**30)
    trace = copy.deepcopy(BASE)
    trace["workload"] = {"dataset": {"kind": "mooncake", "path": "t.jsonl"}}
    assert estimate_run_bytes(parse_config(trace)) is None


def test_check_fits_refuses_only_what_exceeds_the_memory():
    cfg = config(num_prompts=10_000_000)
    need = estimate_run_bytes(cfg)
    check_fits(cfg, need)
    check_fits(cfg, None)
    with pytest.raises(ConfigError) as e:
        check_fits(cfg, need - 1)
    assert str(e.value).startswith("workload.num_prompts: 10,000,000 requests need about ")


def test_output_past_any_context_is_blamed_on_the_lengths_not_the_request_count():
    cfg = config(num_prompts=100, dataset={"kind": "random", "input_len": 128,
                                           "output_len": 10**12})
    with pytest.raises(ConfigError, match=r"^workload.dataset: 1,000,000,000,000 output tokens "
                                          r"a request are past any model's context"):
        check_fits(cfg, 2**34)


def test_available_memory_is_read_on_this_machine():
    have = available_memory_bytes()
    assert have is None or 0 < have < 2**50


def _traced_peak(num_prompts: int) -> int:
    from simcore.simulate import simulate

    # A small KV cache: its tables (bounded by the blocks, not the requests) are full early.
    data = copy.deepcopy(BASE)
    data["workload"]["num_prompts"] = num_prompts
    data["engine"] = {"num_gpu_blocks_override": 1024}
    data["model"]["max_model_len"] = 4096
    cfg = parse_config(data)
    tracemalloc.start()
    try:
        simulate(cfg)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.slow
def test_the_estimate_covers_what_a_request_holds():
    # The Python heap a request adds at the run's peak (the slope between two request counts,
    # after a first run has loaded everything), which the per-request figures must cover; they
    # were measured on the resident memory of `dse simulate`, which adds the envelope's runs,
    # the written result and the allocator's slack.
    _traced_peak(300)
    slope = (_traced_peak(4000) - _traced_peak(2000)) / 2000
    assert slope < REQUEST_BYTES + 16 * OUTPUT_TOKEN_BYTES, slope
    assert slope > (REQUEST_BYTES + 16 * OUTPUT_TOKEN_BYTES) / 4, "the figures are far too high"
