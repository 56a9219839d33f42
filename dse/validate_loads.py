"""How the end-to-end validation set's loads are rebuilt where a source printed only summaries:
ShareGPT requests drawn as `vllm bench serve`'s sharegpt sampler draws them, from the shipped
first-turn lengths in the served model's tokenizer's counts, and the output lengths of requests
that stop at the end of sequence, spread as a constant per-token hazard gives them
(`dse.validate_e2e` builds each case's load with them)."""

from __future__ import annotations

import functools
import re

import numpy as np

_MISTRAL_V1 = re.compile(r"mixtral-8x7b|mistral-7b-(instruct-)?v0\.[12]\b", re.IGNORECASE)
"""Models that use Mistral's 32k SentencePiece (v1), the shipped `mistral_v1` counts."""


@functools.cache
def _shipped_first_turns(tokenizer: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The shipped first-turn lengths (prompts, outputs) in `tokenizer`'s counts and which rows
    vLLM keeps."""
    from simcore.reference_data import SHAREGPT_FIRST_TURNS
    from simcore.workload.config import LengthFilter
    from simcore.workload.sampled import passes_length_filter, read_lengths_csv

    prompts, outputs = read_lengths_csv(SHAREGPT_FIRST_TURNS[tokenizer])
    return prompts, outputs, passes_length_filter(LengthFilter(), prompts, outputs)


def sharegpt_tokenizer(model: str) -> str:
    """Which shipped ShareGPT counts (`simcore.reference_data.SHAREGPT_FIRST_TURNS`) stand for
    `model`'s tokenizer: a preset's own where they ship (`simcore.model.presets.
    sharegpt_tokenizer`), Mistral's v1 SentencePiece for the models that use it, else
    Llama-3's."""
    from simcore.model.presets import sharegpt_tokenizer as preset_tokenizer

    return (preset_tokenizer(model)
            or ("mistral_v1" if _MISTRAL_V1.search(model) else "llama3"))


def sharegpt_first_turns(n: int, seed: int = 0, tokenizer: str = "llama3"
                         ) -> tuple[np.ndarray, np.ndarray]:
    """(prompt lengths, output lengths) of the n requests vLLM's sharegpt sampler sends, drawn
    from the shipped first-turn lengths (`tokenizer`'s counts) as the workload's sharegpt
    dataset draws them (`simcore.workload.sampled.vllm_order`: shuffled with
    `random.seed(seed)`, the first n that pass vLLM's `is_valid_sequence`, oversampled as vLLM
    does if fewer pass)."""
    from simcore.workload.sampled import vllm_order

    prompts, outputs, valid = _shipped_first_turns(tokenizer)
    chosen = vllm_order(valid, n, shuffle=True, seed=seed)
    return prompts[chosen], outputs[chosen]


OFFLINE_DRAWS = 8
"""ShareGPT draws an offline batch case is simulated with, its prediction their median.

The benchmark shuffled the whole ShareGPT file with `random.seed(0)`; the shipped first turns
are a subset of it (18.7% of its conversations), so the requests it sent cannot be rebuilt,
only drawn again from the same distribution: seed 0 as vLLM's sampler draws it, seeds 1 to
OFFLINE_DRAWS - 1 as it would with another seed. An offline batch (`benchmark_throughput`:
every prompt at once) lasts until its longest output is done, so one draw decides much of its
throughput: over 8 draws the simulated throughputs of the 12 offline ShareGPT cases span
1.22-1.31x (90th over 10th percentile; Llama-3-8B on one H100: 13.3-18.4 req/s), against at
most 1.08x for any metric of the 22 served ShareGPT cases (1,000-prompt bursts, request rates
and concurrency limits), which are simulated with the one seed-0 draw."""


def scaled_to_mean(lengths: np.ndarray, mean: float) -> list[int]:
    """`lengths` scaled to the mean `mean` (each at least 1 token)."""
    return np.maximum(1, np.rint(lengths * mean / lengths.mean())).astype(int).tolist()


def eos_hazard(mean: float, cap: int) -> float:
    """The per-token probability h of sampling the end of sequence under which outputs capped at
    `cap` tokens average `mean` (`mean` < `cap`): the truncated geometric mean
    (1 - (1 - h)^cap) / h, solved by bisection."""
    lo, hi = 1e-12, 1.0
    for _ in range(200):
        h = (lo + hi) / 2
        if (1 - (1 - h) ** cap) / h > mean:
            lo = h
        else:
            hi = h
    return (lo + hi) / 2


def eos_output_lengths(n: int, mean: float, cap: int, seed: int = 0) -> list[int]:
    """`n` output lengths of requests that stop at the end of sequence with a constant
    per-token probability (`eos_hazard`) or at `cap` tokens, averaging `mean`: the distribution's
    quantiles at (i + 0.5) / n (the sampled end-of-sequence token counted, as vLLM counts it),
    in an order shuffled by `seed`.

    vllm bench serve's random prompts without --ignore-eos end where the model samples its end
    of sequence; the source prints only their mean. With only the mean and the cap known, a
    constant hazard is the least-informed law (the geometric distribution, cut at the cap), and
    its spread matters: a short output's few decode steps ride along with the long prefills of
    the requests after it, so the mean TPOT, over requests, depends on how many outputs are
    short, where one length for all has none."""
    h = eos_hazard(mean, cap)
    u = (np.arange(n) + 0.5) / n
    lengths = np.clip(np.ceil(np.log1p(-u) / np.log1p(-h)), 1, cap).astype(int)
    np.random.default_rng(seed).shuffle(lengths)
    return lengths.tolist()
