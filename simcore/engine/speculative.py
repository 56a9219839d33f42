"""Speculative decoding in the scheduler: the drafts' settings, which drafts the target accepts,
and the acceptance counts vLLM's spec-decode metrics report.

The simulator has no token contents, so whether a draft token would match the target's sample
is drawn from a declared acceptance model: per position i of a verification, the probability
`conditional[i]` that draft i is accepted given that drafts 0..i-1 were (vLLM's rejection
sampler accepts a prefix of the drafts and then emits one more token, the correction or, with
every draft accepted, the bonus token). The draw for a request's verification is a function of
the run's seed, the request's id and how many output tokens it had before the step, nothing
else: results are reproducible for a seed and a request's acceptance does not depend on which
other requests share its batches.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

EAGLE_FAMILY = ("eagle", "eagle3", "mtp")
"""Methods vLLM runs through its EAGLE proposer (`SpeculativeConfig.use_eagle()`): a prefix-cache
hit gives back its last block, and each request gets k lookahead KV slots."""
LOOKAHEAD_METHODS = EAGLE_FAMILY + ("draft_model",)
"""Methods whose drafter writes its drafts' KV in the step: vLLM's scheduler allocates k
lookahead slots per request for them (`use_eagle()` or `uses_draft_model()`), none for ngram."""

_MASK = (1 << 64) - 1
_SCALE = 1.0 / (1 << 64)


def _mix(x: int) -> int:
    """SplitMix64's finaliser: a 64-bit integer to a well-spread 64-bit integer."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


@dataclass(frozen=True, slots=True)
class SpecDecodeParams:
    """What the scheduler needs of `engine.speculative_config`.

    `num_spec_tokens`: drafts proposed per decoding request and step (k). `num_lookahead_tokens`:
    KV slots allocated past the scheduled tokens (vLLM: k for the EAGLE family, whose drafter
    writes its drafts' KV in the step, else 0). `conditional`: per position, the acceptance
    probability given the previous positions were accepted. `seed`: the run's seed.
    """

    method: str
    num_spec_tokens: int
    num_lookahead_tokens: int
    conditional: tuple[float, ...]
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_spec_tokens < 1:
            raise ValueError("num_spec_tokens must be >= 1")
        if len(self.conditional) != self.num_spec_tokens:
            raise ValueError("conditional needs one probability per draft position")
        if any(not 0.0 <= c <= 1.0 for c in self.conditional):
            raise ValueError("acceptance probabilities must lie in [0, 1]")

    def request_key(self, request_id: str) -> int:
        """The 64-bit key of a request's draws (stable across processes and Python versions)."""
        digest = hashlib.blake2b(f"{self.seed}/{request_id}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little")

    def num_accepted(self, key: int, num_output: int, num_drafts: int) -> int:
        """Drafts accepted of the `num_drafts` verified for the request of `key` when it had
        `num_output` output tokens: the first position whose uniform draw reaches its
        conditional probability ends the accepted prefix."""
        base = _mix(key ^ _mix(num_output))
        cond = self.conditional
        for i in range(num_drafts):
            if _mix(base + i) * _SCALE >= cond[i]:
                return i
        return num_drafts


class SpecDecodeStats:
    """Acceptance counts of one engine, as vLLM's `SpecDecodingStats`: verifications with at
    least one draft (`num_drafts`), draft tokens verified, accepted, and accepted per position."""

    __slots__ = ("num_drafts", "num_draft_tokens", "num_accepted_tokens",
                 "num_accepted_tokens_per_pos")

    def __init__(self, k: int) -> None:
        self.num_drafts = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.num_accepted_tokens_per_pos = [0] * k

    def observe(self, num_draft_tokens: int, num_accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        per_pos = self.num_accepted_tokens_per_pos
        for i in range(num_accepted):
            per_pos[i] += 1


def spec_decode_summary(stats: list[SpecDecodeStats]) -> dict:
    """The run's acceptance, summed over engines, with the names `vllm bench serve` prints
    from the server's spec-decode metrics: acceptance rate (accepted / draft tokens),
    acceptance length (1 + accepted / drafts: tokens emitted per verification), and the
    per-position acceptance rates (accepted at position i / drafts)."""
    drafts = sum(s.num_drafts for s in stats)
    draft_tokens = sum(s.num_draft_tokens for s in stats)
    accepted = sum(s.num_accepted_tokens for s in stats)
    k = len(stats[0].num_accepted_tokens_per_pos) if stats else 0
    per_pos = [sum(s.num_accepted_tokens_per_pos[i] for s in stats) for i in range(k)]
    return {
        "spec_decode_num_drafts": drafts,
        "spec_decode_num_draft_tokens": draft_tokens,
        "spec_decode_num_accepted_tokens": accepted,
        "spec_decode_acceptance_rate": accepted / draft_tokens if draft_tokens else 0.0,
        "spec_decode_acceptance_length": 1.0 + accepted / drafts if drafts else 1.0,
        "spec_decode_per_position_acceptance_rate": [n / drafts if drafts else 0.0
                                                     for n in per_pos],
    }
