"""The narrow interface between the engine and whatever models compute time: a step's shape in, seconds out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from simcore.errors import ConfigError


OP_CLASSES = ("gemm", "attention", "moe", "elementwise", "lm_head", "communication", "overhead")
"""The classes a step-time model's durations can be scaled by, one factor each (`op_scale`):
linear layers (projections, dense MLP, shared experts, router), the attention kernel, routed
experts, elementwise passes, LM head and sampler, the collectives and hops the model prices
itself, and the CPU-side per-step and launch times. Perturbed runs of an uncertainty envelope
use them; each class has its own error bound (`StepTimeModel.op_error_bounds`)."""


def check_op_scale(op_scale) -> dict[str, float]:
    """`op_scale` as a dict with every class of `OP_CLASSES` (missing ones 1.0); unknown classes
    and non-positive factors are refused."""
    out = dict.fromkeys(OP_CLASSES, 1.0)
    for k, v in (op_scale or {}).items():
        if k not in out:
            raise ConfigError(f"op_scale: unknown op class {k!r} (one of {', '.join(OP_CLASSES)})")
        if not v > 0:
            raise ConfigError(f"op_scale: the factor of {k} must be positive, got {v}")
        out[k] = float(v)
    return out


@dataclass(frozen=True, slots=True)
class StepShape:
    """Aggregate shape of one engine step (a mixed prefill + decode batch), enough for a roofline.

    For each scheduled request i with `new_i` tokens this step on top of `ctx_i` already-computed
    tokens (its KV cache before the step):
      num_tokens      = sum(new_i)
      num_seqs        = number of scheduled requests
      num_decode_seqs = number of requests with new_i == 1 and ctx_i > 0
      attn_qk_pairs   = sum(new_i * ctx_i + new_i * (new_i + 1) / 2)   (causal query-key pairs)
      kv_tokens_read  = sum(ctx_i + new_i)                              (KV entries attention reads)
      num_prefill_tokens = num_tokens - num_decode_seqs - num_spec_tokens
      decode_kv_tokens = sum(ctx_i + 1) over the decode requests (their share of kv_tokens_read)

    With speculative decoding (`from_scheduled_spec`) a verification, a decode carrying its
    drafts (new_i = 1 + d_i query tokens after ctx_i > 0), counts as a decode, not as a prefill
    chunk: attention kernels run it as a decode with several queries. It adds 1 to
    num_decode_seqs, ctx_i + new_i to decode_kv_tokens (the KV it reads), d_i to
    `num_spec_tokens`, and counts one query's pairs, ctx_i + new_i, in attn_qk_pairs (a decode's
    share, as above); its other queries' causal pairs, new_i * ctx_i + new_i (new_i + 1) / 2 -
    (ctx_i + new_i), are `spec_qk_pairs`. Without speculation both are 0.
    """

    num_tokens: int
    num_seqs: int
    num_decode_seqs: int
    attn_qk_pairs: float
    kv_tokens_read: int
    decode_kv_tokens: int = 0
    num_spec_tokens: int = 0
    spec_qk_pairs: float = 0.0

    @property
    def num_prefill_tokens(self) -> int:
        return self.num_tokens - self.num_decode_seqs - self.num_spec_tokens

    @property
    def num_decode_tokens(self) -> int:
        """Query tokens of the decodes, drafts under verification included."""
        return self.num_decode_seqs + self.num_spec_tokens

    def runs_full_graph(self, max_tokens: int) -> bool:
        """Whether the step runs as one full CUDA graph: decodes only (drafts under
        verification included) and no more than `max_tokens` tokens."""
        return self.num_decode_seqs + self.num_spec_tokens == self.num_tokens <= max_tokens

    @staticmethod
    def from_requests(items: list[tuple[int, int]]) -> "StepShape":
        """Build from (new_tokens, context_tokens) pairs, one per scheduled request."""
        return StepShape.from_scheduled([(None, new, ctx) for new, ctx in items])

    @staticmethod
    def from_scheduled(scheduled: list[tuple[object, int, int]]) -> "StepShape":
        """Build from (request, new_tokens, context_tokens) triples, a scheduler's plan as it is."""
        num_tokens = num_decode = kv = decode_kv = 0
        pairs = 0.0
        for _, new, ctx in scheduled:
            num_tokens += new
            kv += ctx + new
            if new == 1:        # the general sum below, ctx + 1, exact in a float
                if ctx > 0:
                    num_decode += 1
                    decode_kv += ctx + 1
                pairs += ctx + 1
            else:
                pairs += new * ctx + new * (new + 1) / 2
        return StepShape(num_tokens, len(scheduled), num_decode, pairs, kv, decode_kv)

    @staticmethod
    def from_scheduled_spec(scheduled: list[tuple[object, int, int]]) -> "StepShape":
        """As `from_scheduled`, for a scheduler with speculative decoding: a request scheduled
        past its tokens (ctx + new > prompt + output tokens: its drafts are in the step) is a
        verification, counted as a decode (see the class)."""
        num_tokens = num_decode = kv = decode_kv = spec = 0
        pairs = spec_pairs = 0.0
        for req, new, ctx in scheduled:
            num_tokens += new
            kv += ctx + new
            if new == 1:
                if ctx > 0:
                    num_decode += 1
                    decode_kv += ctx + 1
                pairs += ctx + 1
            elif ctx > 0 and ctx + new > req.prompt_len + req.num_output_tokens:
                num_decode += 1
                decode_kv += ctx + new
                spec += new - 1
                pairs += ctx + new
                spec_pairs += new * ctx + new * (new + 1) / 2 - (ctx + new)
            else:
                pairs += new * ctx + new * (new + 1) / 2
        return StepShape(num_tokens, len(scheduled), num_decode, pairs, kv, decode_kv, spec,
                         spec_pairs)

    @staticmethod
    def dummy() -> "StepShape":
        """The dummy batch an idle data-parallel rank runs to keep an expert-parallel group's
        collectives aligned: one token through every layer, no sequence (so no attention, LM
        head or sampling), as vLLM's `execute_dummy_batch` does."""
        return StepShape(1, 0, 0, 0.0, 0)

    @property
    def is_dummy(self) -> bool:
        """A dummy batch (tokens but no sequence)."""
        return self.num_seqs == 0 and self.num_tokens > 0


@dataclass(slots=True)
class StepTime:
    """A step's modelled duration, split by what it was spent on (seconds). Treated as immutable
    but not frozen: one is made for every engine step (millions in a long run), and a frozen
    dataclass's constructor costs about four times a plain one's (1.9 against 0.4 us)."""

    total_s: float
    compute_s: float      # GEMMs, attention, norms, everything on the GPU's compute units
    comm_s: float         # TP all-reduce / PP send-recv / EP all-to-all on the critical path
    bound: str            # "compute" | "memory" | "communication": what dominates the step
    overhead_s: float = 0.0  # CPU-side time on the critical path: total_s - compute_s - comm_s
    all_to_all_s: float = 0.0  # the EP dispatch and combine part of comm_s


class StepTimeModel(Protocol):
    """What the engine needs from a compute model. Implementations: roofline (reference), calibrated."""

    profile_id: str           # e.g. "roofline/H100-SXM/bf16"
    calibrated: bool          # False for reference (uncalibrated) profiles
    relative_uncertainty: float  # symmetric bound on step time, e.g. 0.3 for +/-30%
    profile_version: str      # "reference", or a calibration profile's version and digest
    op_scale: dict[str, float]  # every class of OP_CLASSES -> its factor (1.0 unscaled)

    def step_time(self, shape: StepShape) -> StepTime: ...

    def op_error_bounds(self) -> dict[str, float]: ...   # OP_CLASSES -> relative bound

    def fallbacks(self) -> list[str]: ...                # parts timed by reference assumptions

    def assumed_parts(self) -> list[str]: ...            # derived, declared or fitted parts

    def measured_share(self) -> float: ...               # share of a step from measurements

    def assumption_lines(self) -> list[str]: ...         # where the step times come from


class GroupStepTimeModel(StepTimeModel, Protocol):
    """A compute model for data-parallel ranks that step in lock-step (an expert-parallel group).

    Every step, each rank's scheduler plans its batch (a rank with nothing to run contributes
    `StepShape.dummy()`); all ranks then take the same time, `step_time_group(shapes)`.
    """

    num_ranks: int            # data-parallel ranks in the group; len(shapes) must equal it

    def step_time_group(self, shapes: list[StepShape]) -> StepTime: ...
