"""The synthetic datasets of `vllm bench serve`: random prompts, and random prompts over repeated prefixes."""

from __future__ import annotations

import math

import numpy as np

from simcore.workload.config import PrefixRepetitionDataset, RandomDataset
from simcore.workload.keys import shared_prefix_keys
from simcore.workload.sample import SampleColumns


def random_samples(ds: RandomDataset, num_prompts: int, *, block_size: int,
                   rng: np.random.Generator) -> SampleColumns:
    """vLLM's `random` dataset: lengths integer-uniform around their means, one shared prefix.

    The random part of each prompt is unique to its request (vLLM builds it from a random offset
    and the request index), so only the prefix's full blocks carry keys, the same in every request.
    """
    r = ds.range_ratio
    input_lens = rng.integers(math.floor(ds.input_len * (1 - r)),
                              math.ceil(ds.input_len * (1 + r)) + 1, size=num_prompts)
    output_lens = rng.integers(max(math.floor(ds.output_len * (1 - r)), 1),
                               max(math.ceil(ds.output_len * (1 + r)), 1) + 1, size=num_prompts)
    prefix = shared_prefix_keys(0, ds.prefix_len // block_size)
    return SampleColumns("r", ds.prefix_len + input_lens, output_lens, (prefix,))


def prefix_repetition_samples(ds: PrefixRepetitionDataset, num_prompts: int, *, block_size: int,
                              rng: np.random.Generator) -> SampleColumns:
    """vLLM's `prefix_repetition` dataset: num_prompts // num_prefixes requests per prefix, shuffled."""
    per_prefix = num_prompts // ds.num_prefixes
    prefix_index = np.repeat(np.arange(ds.num_prefixes), per_prefix)
    if ds.shuffle:
        prefix_index = rng.permutation(prefix_index)
    prefixes = [shared_prefix_keys(p, ds.prefix_len // block_size) for p in range(ds.num_prefixes)]
    def same(value: int) -> np.ndarray:     # one number, read as a column
        return np.broadcast_to(np.int64(value), prefix_index.shape)

    return SampleColumns("r", same(ds.prefix_len + ds.suffix_len), same(ds.output_len),
                         prefixes, prefix_index)
