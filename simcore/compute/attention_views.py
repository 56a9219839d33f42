"""The views of a step's shape that attention kernels see: a sliding-window layer's (each query
over at most the window's keys), and the prompts that a step's prefilling query-key pairs stand
for where measured attention grids are looked up."""

from __future__ import annotations

import math

from simcore.compute.base import StepShape


def prompt_len(pairs_per_seq: float) -> float:
    """The prompt length whose causal query-key pairs, L (L + 1) / 2, are `pairs_per_seq`."""
    return (math.sqrt(1.0 + 8.0 * pairs_per_seq) - 1.0) / 2.0


def prefill_prompts_factor(factor, num_seqs: int, pairs: float) -> float:
    """`factor(b, L)` at the prompts a step's prefilling sequences stand for where the measured
    context grids look them up (`simcore.compute.kernel_model`): `num_seqs` prompts of the
    length L whose causal query-key pairs are their `pairs` shared equally (a chunk over a
    cached prefix: the prompt with as many pairs)."""
    length = prompt_len(pairs / num_seqs)
    return factor(num_seqs, length if length > 1.0 else 1.0)


def windowed_attention(shape: StepShape, window: int) -> StepShape:
    """The step as a sliding-window layer's attention sees it: every query over at most `window`
    keys, its own included (the query at position q reads keys max(0, q - window + 1) to q).

    Same tokens and sequences; `attn_qk_pairs`, `kv_tokens_read` and `decode_kv_tokens` those of
    the window. A shape holds sums over its requests, not each request, so the window is applied
    to them as follows: the decodes read min(decode_kv_tokens, decodes x window) keys (exact when
    every decode's context is past the window, or none is); the prefilling sequences are taken as
    alike, each with the mean chunk of n new tokens over the mean context c: min(c + n,
    window - 1 + n) keys read, and pairs m c + m (m + 1) / 2 + (n - m) window for the
    m = min(n, max(window - c, 0)) queries whose window still reaches the first token (exact for
    one prefilling sequence). Never more than the whole context's pairs and reads.
    """
    d = shape.num_decode_seqs
    decode_kv = shape.decode_kv_tokens
    if decode_kv > d * window:
        decode_kv = d * window
    pairs = float(decode_kv)
    kv = decode_kv
    spec = shape.num_spec_tokens
    spec_pairs = shape.spec_qk_pairs
    if spec_pairs > spec * window:      # each draft query over at most the window
        spec_pairs = float(spec * window)
    p = shape.num_seqs - d
    if p > 0:
        n = (shape.num_tokens - d - spec) / p
        c = (shape.kv_tokens_read - shape.decode_kv_tokens) / p - n
        m = min(n, max(window - c, 0.0))
        prefill_pairs = p * (m * c + m * (m + 1) / 2 + (n - m) * window)
        prefill_kv = p * min(c + n, window - 1 + n)
        pairs += min(prefill_pairs, shape.attn_qk_pairs - shape.decode_kv_tokens)
        kv += min(round(prefill_kv), shape.kv_tokens_read - shape.decode_kv_tokens)
    return StepShape(shape.num_tokens, shape.num_seqs, d, pairs, kv, decode_kv, spec, spec_pairs)
