"""The workload configuration: what a `vllm bench serve` client sends, and when."""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from simcore.errors import Number, WholeNumber, away_from_default

DEFAULT_NUM_PROMPTS = 1000
"""vLLM's `--num-prompts` default, used by the datasets that are sampled rather than replayed."""


class _Frozen(BaseModel):
    """Base of the workload models: immutable, unknown keys rejected."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class TextLengthEstimate(_Frozen):
    """How many tokens a text is taken to have, since the simulator runs without a tokenizer.

    `words`: ceil(number of whitespace-separated words x tokens_per_word); 1.3 is typical of
    Llama-style BPE tokenizers on English prose. `chars`: ceil(number of characters /
    chars_per_token); 4 is typical on English, fewer on code and on non-Latin scripts. Either is an
    estimate: when exact counts matter, give `prompt_len` (custom) or use a lengths CSV (sharegpt).
    """

    method: Literal["words", "chars"] = Field("words", description="Count words or characters.")
    tokens_per_word: Number = Field(1.3, gt=0, allow_inf_nan=False, description="Tokens per "
                                    "whitespace-separated word (method 'words').")
    chars_per_token: Number = Field(4.0, gt=0, allow_inf_nan=False, description="Characters per "
                                    "token (method 'chars').")


class LengthFilter(_Frozen):
    """vLLM's `is_valid_sequence` filter on ShareGPT samples; the defaults are vLLM's."""

    min_len: WholeNumber = Field(
        4, ge=0, description="Drop samples whose prompt, or whose output (unless output_len "
        "overrides it), has fewer tokens than this.")
    max_prompt_len: WholeNumber | None = Field(
        1024, ge=1, description="Drop samples whose prompt has more tokens than this; null keeps "
        "them.")
    max_total_len: WholeNumber | None = Field(
        2048, ge=1, description="Drop samples whose prompt + output has more tokens than this; "
        "null keeps them.")


class RandomDataset(_Frozen):
    """vLLM's `random` dataset: random tokens, lengths uniform around a mean, one shared prefix.

    Each request's prompt is the `prefix_len`-token prefix (the same for every request) followed by
    L random tokens, L an integer uniform in [floor(input_len*(1-r)), ceil(input_len*(1+r))];
    its output length is uniform in [max(1, floor(output_len*(1-r))), ceil(output_len*(1+r))].
    The tokenizer's special tokens are taken to be none (vLLM subtracts them from input_len).
    """

    kind: Literal["random"] = Field("random", description="Dataset variant tag.")
    input_len: WholeNumber = Field(
        1024, ge=0, description="Mean random prompt length in tokens, prefix excluded (vLLM "
        "--random-input-len).")
    output_len: WholeNumber = Field(
        128, ge=1, description="Mean output length in tokens (vLLM --random-output-len).")
    range_ratio: Number = Field(
        0.0, ge=0.0, lt=1.0, description="Relative half-width r of the uniform length ranges, in "
        "[0, 1) (vLLM --random-range-ratio).")
    prefix_len: WholeNumber = Field(
        0, ge=0, description="Tokens of the prefix shared by every request (vLLM "
        "--random-prefix-len).")

    @model_validator(mode="after")
    def _nonempty_prompt(self) -> RandomDataset:
        if self.prefix_len + math.floor(self.input_len * (1 - self.range_ratio)) < 1:
            raise ValueError("input_len is too small: prefix_len + floor(input_len * "
                             "(1 - range_ratio)) must be at least 1 token")
        return self


class PrefixRepetitionDataset(_Frozen):
    """vLLM's `prefix_repetition` dataset: num_prefixes random prefixes, each sent with random suffixes.

    Like vLLM, each prefix gets num_prompts // num_prefixes requests (so the total is rounded down
    to a multiple of num_prefixes) and the requests are shuffled. Each prompt is prefix_len +
    suffix_len tokens; the suffixes are random, so only the prefixes are shared.
    """

    kind: Literal["prefix_repetition"] = Field(
        "prefix_repetition", description="Dataset variant tag.")
    prefix_len: WholeNumber = Field(
        256, ge=0, description="Tokens of each shared prefix (vLLM "
        "--prefix-repetition-prefix-len).")
    suffix_len: WholeNumber = Field(
        256, ge=0, description="Tokens of each request's unique suffix (vLLM "
        "--prefix-repetition-suffix-len).")
    num_prefixes: WholeNumber = Field(
        10, ge=1, description="Number of distinct prefixes (vLLM "
        "--prefix-repetition-num-prefixes).")
    output_len: WholeNumber = Field(
        128, ge=1, description="Output tokens of every request (vLLM "
        "--prefix-repetition-output-len).")
    shuffle: bool = Field(True, description="Shuffle the requests with the seed; false sends them "
                          "prefix by prefix (vLLM --disable-shuffle).")

    @model_validator(mode="after")
    def _nonempty_prompt(self) -> PrefixRepetitionDataset:
        if self.prefix_len + self.suffix_len < 1:
            raise ValueError("prefix_len + suffix_len must be at least 1 token")
        return self


class ShareGPTDataset(_Frozen):
    """vLLM's `sharegpt` dataset: the first turn of each conversation, shuffled, filtered, oversampled.

    `path` is either a ShareGPT JSON file (a list of {"conversations": [{"value": prompt},
    {"value": answer}, ...]}; lengths estimated by `text_estimate`) or a CSV of token lengths with
    columns num_prefill_tokens, num_decode_tokens (e.g. Vidur's sharegpt_8k_lengths.csv), told
    apart by the suffix (.json / .csv). Without a `path`, the lengths shipped with the simulator
    are used: the first turn and first reply of the 17,400 conversations with two or more turns of
    a copy of ShareGPT_V3_unfiltered_cleaned_split.json, counted with the Llama-3 tokenizer
    (simcore/data/datasets/README.md), i.e. what `vllm bench serve --dataset-name sharegpt` sends
    to a Llama-3 model, or the same conversations counted with the model's own tokenizer where
    they ship (`tokenizer`). Entries with fewer than two
    turns are skipped; the rest are shuffled (unless `shuffle` is false), filtered by
    `length_filter`, and the first num_prompts kept; if fewer pass, samples are drawn again with
    replacement (vLLM's oversampling).
    """

    kind: Literal["sharegpt"] = Field("sharegpt", description="Dataset variant tag.")
    path: str | None = Field(None, description="ShareGPT JSON (.json) or lengths CSV (.csv), "
                             "relative to the configuration's directory; null (the default): the "
                             "shipped first-turn lengths of ShareGPT V3 in Llama-3 tokens "
                             "(simcore/data/datasets/sharegpt_v3_first_turn_llama3.csv).")
    tokenizer: Literal["llama3", "mistral_v1", "qwen3", "o200k", "deepseek_v3"] | None = Field(
        None, description="Which tokenizer's counts of the shipped lengths to send: `llama3` "
        "(Llama-3's BPE), `mistral_v1` (Mistral's 32k SentencePiece: Mistral-7B v0.1, "
        "Mixtral-8x7B), `qwen3` (Qwen3), `o200k` (gpt-oss) or `deepseek_v3` (DeepSeek-V3/R1). "
        "Null (the default): the model's own where its counts ship (the presets of those "
        "families), else llama3. Only without a `path`, whose own lengths are used.")
    output_len: WholeNumber | None = Field(
        None, ge=1, description="Output tokens of every request, instead of each answer's length "
        "(vLLM --sharegpt-output-len).")
    shuffle: bool = Field(True, description="Shuffle the entries with the seed before taking them "
                          "(false: vLLM --disable-shuffle).")
    length_filter: LengthFilter | None = Field(default_factory=LengthFilter, description="vLLM's "
                                               "sample filter; null keeps every sample.")
    text_estimate: TextLengthEstimate = Field(
        default_factory=TextLengthEstimate, description="Token count estimate for JSON text.")

    @model_validator(mode="after")
    def _tokenizer_needs_shipped_lengths(self):
        if self.tokenizer is not None and self.path is not None:
            raise ValueError("tokenizer chooses among the shipped lengths and has no effect with "
                             "a `path` (whose file gives the lengths); set one of them")
        if away_from_default(self, "text_estimate") and (
                self.path is None or not self.path.lower().endswith(".json")):
            raise ValueError("text_estimate estimates the token counts of a ShareGPT JSON file's "
                             "text and has no effect on "
                             + ("the shipped lengths" if self.path is None else
                                "a lengths CSV (its counts are tokens)") + "; remove it")
        return self


class CustomDataset(_Frozen):
    """vLLM's `custom` dataset: a JSONL file, one request a line, shuffled and oversampled like ShareGPT.

    Each line is an object with `prompt_len` (tokens) or `prompt` (text, length estimated by
    `text_estimate`), `output_len` (unless overridden here), and optionally the prompt's content
    identity: `block_keys` (one key per `block_size`-token block, verbatim) or `hash_ids` (one id per
    `hash_block_tokens`-token block, expanded as for Mooncake), and `priority` (a whole number,
    default 0: under engine.scheduling_policy priority a lower value is served first, as in vLLM).
    """

    kind: Literal["custom"] = Field("custom", description="Dataset variant tag.")
    path: str = Field(description="JSONL file, relative to the configuration's directory.")
    output_len: WholeNumber | None = Field(
        None, ge=1, description="Output tokens of every request, instead of each line's "
        "output_len (vLLM --custom-output-len).")
    shuffle: bool = Field(True, description="Shuffle the lines with the seed before taking them "
                          "(false: vLLM --disable-shuffle).")
    hash_block_tokens: WholeNumber = Field(
        512, ge=1, description="Tokens per hash id in `hash_ids`.")
    text_estimate: TextLengthEstimate = Field(
        default_factory=TextLengthEstimate, description="Token count estimate for `prompt` text.")


class LengthRange(_Frozen):
    """A count drawn afresh at each use as vLLM's random dataset draws its lengths: an integer
    uniform in [floor(mean * (1 - range_ratio)), ceil(mean * (1 + range_ratio))]."""

    mean: WholeNumber = Field(ge=0, description="Mean of the count.")
    range_ratio: Number = Field(
        0.0, ge=0.0, lt=1.0, description="Relative half-width r of the uniform range, in [0, 1); "
        "0 = always the mean.")

    @property
    def low(self) -> int:
        return math.floor(self.mean * (1 - self.range_ratio))

    @property
    def high(self) -> int:
        return math.ceil(self.mean * (1 + self.range_ratio))


Count = Annotated[WholeNumber, Field(ge=0)] | LengthRange
"""A fixed count (an integer), or a LengthRange drawn at each use."""


def count_bounds(value: int | LengthRange) -> tuple[int, int]:
    """Smallest and largest value a Count can take."""
    if isinstance(value, LengthRange):
        return value.low, value.high
    return value, value


class ThinkTime(_Frozen):
    """The client's pause between a reply's completion and the session's next turn."""

    distribution: Literal["fixed", "exponential"] = Field("exponential", description="'fixed': "
                                                          "always mean_s; 'exponential': "
                                                          "exponentially distributed, mean mean_s.")
    mean_s: Number = Field(ge=0, allow_inf_nan=False, description="Mean pause in seconds.")


ThinkTimeSpec = Annotated[Number, Field(ge=0, allow_inf_nan=False)] | ThinkTime
"""A fixed pause in seconds (a number), or a ThinkTime."""


class _SessionsBase(_Frozen):
    """Closed-loop multi-turn sessions (`simcore.workload.sessions`).

    Session starts follow the workload's request_rate / burstiness / ramp-up (one start per
    session, as a request's send time otherwise). Turn 1's prompt is `shared_prefix_len` tokens
    common to every session followed by `first_prompt_len` tokens of the session's own; it
    gets `reply_len` tokens. Turn j+1 is sent `think_time_s` after turn j's reply has completed,
    and its prompt is the conversation so far (turn j's prompt, turn j's reply) followed by a
    new message of `user_message_len` tokens, so its blocks repeat those turn j computed and can
    hit them in the prefix cache. Every Count is drawn per session (turns) or per turn
    (lengths). A session ends after its last turn; or before a turn whose prompt plus reply
    would exceed `max_context_tokens` (the server's max_model_len when null); or when a turn
    fails (refused, timed out).
    """

    num_sessions: WholeNumber = Field(100, ge=1, description="Sessions the client runs.")
    turns: Count = Field(4, description="Turns (requests) per session.")
    shared_prefix_len: WholeNumber = Field(
        0, ge=0, description="Tokens at the start of every session's first prompt that all "
        "sessions share (a system prompt).")
    first_prompt_len: Count = Field(512, description="Tokens of the first prompt after the "
                                    "shared prefix.")
    user_message_len: Count = Field(128, description="Tokens of each later turn's new message, "
                                    "appended to the conversation.")
    reply_len: Count = Field(256, description="Output tokens of each turn (ignore_eos).")
    think_time_s: ThinkTimeSpec = Field(10.0, description="Pause after a reply before the next "
                                        "turn: seconds (fixed), or {distribution, mean_s}.")
    max_context_tokens: WholeNumber | None = Field(
        None, ge=1, description="A turn whose prompt plus reply would exceed this is not sent and "
        "ends its session; null: the server's max_model_len.")

    @model_validator(mode="after")
    def _check_counts(self) -> _SessionsBase:
        for name, least in (("turns", 1), ("user_message_len", 1), ("reply_len", 1),
                            ("first_prompt_len", 0)):
            low, _ = count_bounds(getattr(self, name))
            if low < least:
                raise ValueError(f"{name}: can be {low}, must be at least {least} (raise the "
                                 f"mean or lower range_ratio)")
        if self.shared_prefix_len + count_bounds(self.first_prompt_len)[0] < 1:
            raise ValueError("first_prompt_len: can be 0 with shared_prefix_len 0; the first "
                             "prompt needs at least 1 token")
        return self


class SessionsDataset(_SessionsBase):
    """Chat sessions: a person reads each reply, then types the next message."""

    kind: Literal["sessions"] = Field("sessions", description="Dataset variant tag.")


class AgentSessionsDataset(_SessionsBase):
    """Agentic sessions: the same mechanism with the shape of a tool-using agent. Each reply is
    a short tool call, each new message the tool's result, the pause the tool's run time; every
    session starts with a long shared prefix (the system prompt and tool definitions). The
    defaults are illustrative, not measured: set them from your agent's traces."""

    kind: Literal["agent_sessions"] = Field("agent_sessions", description="Dataset variant tag.")
    turns: Count = Field(LengthRange(mean=12, range_ratio=0.5), description="Turns (model "
                         "calls) per session.")
    shared_prefix_len: WholeNumber = Field(
        2048, ge=0, description="Tokens of system prompt and tool definitions every session "
        "starts with.")
    first_prompt_len: Count = Field(256, description="Tokens of the task after the shared "
                                    "prefix.")
    user_message_len: Count = Field(LengthRange(mean=300, range_ratio=0.9), description="Tokens "
                                    "of each tool result appended to the conversation.")
    reply_len: Count = Field(LengthRange(mean=80, range_ratio=0.5), description="Output tokens "
                             "of each turn (a tool call, or the final answer).")
    think_time_s: ThinkTimeSpec = Field(ThinkTime(distribution="exponential", mean_s=1.0),
                                        description="The tool's run time between a reply and "
                                        "the next turn.")


SESSION_DATASETS = (SessionsDataset, AgentSessionsDataset)


def shared_prefix_field(ds) -> tuple[str, int] | None:
    """(field name, tokens) of the prefix that begins every prompt of dataset `ds`
    (`prefix_len` of the random and prefix_repetition datasets, `shared_prefix_len` of the
    session ones), or None for a dataset without one."""
    if isinstance(ds, (RandomDataset, PrefixRepetitionDataset)):
        return "prefix_len", ds.prefix_len
    if isinstance(ds, SESSION_DATASETS):
        return "shared_prefix_len", ds.shared_prefix_len
    return None



class _TimedTrace(_Frozen):
    """Options shared by traces that carry their own send times."""

    path: str = Field(description="Trace file, relative to the configuration's directory.")
    use_timestamps: bool = Field(
        True, description="Send each request at its trace time (vLLM's --self-timed); false: use "
        "request_rate/burstiness/ramp-up instead.")
    time_scale: Number = Field(1.0, gt=0, le=1e6, allow_inf_nan=False, description="Multiplies "
                               "every trace time offset: 0.5 replays twice as fast, 2 half as "
                               "fast (at most 10^6).")
    start_s: Number = Field(0.0, ge=0, allow_inf_nan=False, description="Start of the replayed "
                            "window, seconds after the trace's time 0 (a Mooncake trace's own "
                            "time 0, from which its timestamps count; an Azure trace's first "
                            "request); it becomes time 0 of the run.")
    duration_s: Number | None = Field(
        None, gt=0, allow_inf_nan=False, description="Length of the replayed window in trace "
        "seconds; null: to the end of the trace.")


class MooncakeDataset(_TimedTrace):
    """A Mooncake (FAST'25) trace, vLLM's `timed_trace` format, one JSON object a line.

    Keys: `timestamp` (ms from the trace start), `input_length`, `output_length` (tokens), optional
    `hash_ids` (one id per `hash_block_tokens` prompt tokens; equal ids = shared prefix blocks).
    An output_length of 0 is sent as 1 token. With `sessions`, conversations are linked into
    closed-loop sessions (see the field).
    """

    kind: Literal["mooncake"] = Field("mooncake", description="Dataset variant tag.")
    hash_block_tokens: WholeNumber = Field(512, ge=1, description="Tokens per hash id.")
    sessions: bool = Field(False, description="Replay conversations as closed-loop sessions: a "
                           "request whose prompt extends an earlier one's prompt and output "
                           "becomes that request's next turn, sent after the earlier one "
                           "completes plus the gap between their timestamps "
                           "(simcore.workload.sessions.mooncake_sessions).")


class AzureDataset(_TimedTrace):
    """An Azure LLM inference trace (Splitwise, 2023): CSV with TIMESTAMP, ContextTokens, GeneratedTokens.

    TIMESTAMP is a date-time; times are taken relative to the earliest row. Prompts are unique
    (the trace carries no content identity). A GeneratedTokens of 0 is sent as 1 token.
    """

    kind: Literal["azure"] = Field("azure", description="Dataset variant tag.")


Dataset = Annotated[
    RandomDataset | PrefixRepetitionDataset | ShareGPTDataset | CustomDataset | MooncakeDataset
    | AzureDataset | SessionsDataset | AgentSessionsDataset,
    Field(discriminator="kind"),
]
TIMED_TRACES = (MooncakeDataset, AzureDataset)


class WorkloadConfig(_Frozen):
    """What the benchmark client sends: a dataset of requests and their send times (`vllm bench serve`).

    Send times follow vLLM: without a ramp-up, request_rate (inf: all at time 0) and burstiness
    (gamma shape; 1 = Poisson); with a ramp-up, the rate moves from ramp_up_start_rps to
    ramp_up_end_rps over the requests, and request_rate must stay inf. Timed traces use their
    own timestamps unless the dataset's use_timestamps is false. With a sessions dataset
    (sessions, agent_sessions) these times are the sessions' starts and the dataset's
    num_sessions replaces num_prompts.
    """

    num_prompts: WholeNumber | None = Field(
        None, ge=1, description="Requests to send. Null: 1000 (vLLM's default) for random, "
        "prefix_repetition, sharegpt and custom; every request of the window for mooncake and "
        "azure (set, it caps them to the first num_prompts).")
    request_rate: Number = Field(math.inf, gt=0, description="Mean requests per second; inf "
                                 "sends all at time 0 (vLLM --request-rate).")
    burstiness: Number = Field(1.0, gt=0, description="Gamma shape of the gaps between sends: 1 "
                               "= Poisson, < 1 burstier, > 1 more regular, inf = constant gaps "
                               "(vLLM --burstiness).")
    ramp_up_strategy: Literal["linear", "exponential"] | None = Field(
        None, description="Rate ramp-up (vLLM --ramp-up-strategy).")
    ramp_up_start_rps: Number | None = Field(None, description="Rate of the first request under "
                                             "a ramp-up, requests/s (vLLM --ramp-up-start-rps).")
    ramp_up_end_rps: Number | None = Field(None, description="Rate of the last request under a "
                                           "ramp-up, requests/s (vLLM --ramp-up-end-rps).")
    max_concurrency: WholeNumber | None = Field(
        None, ge=1, description="Most requests in flight; the client holds the rest back (vLLM "
        "--max-concurrency). Carried here, applied by the simulated client.")
    dataset: Dataset = Field(default_factory=RandomDataset, description="Where prompts and lengths "
                             "come from; `kind` selects the variant.")
    endpoint: Literal["completions", "chat_completions"] = Field(
        "completions", description="The OpenAI endpoint the client sends to: completions "
        "(/v1/completions, vllm bench serve's default backend), or chat_completions "
        "(/v1/chat/completions, --backend openai-chat), whose requests the API server first "
        "turns into a prompt with the model's chat template (host.chat_template_parse).")
    request_timeout_s: Number | None = Field(
        None, gt=0, allow_inf_nan=False, description="Seconds after its send at which the "
        "client gives up a request that has not finished: the engine aborts it (vLLM's finish_requests) and it counts as "
        "failed, left out of the latency and token metrics, as in vllm bench serve. Null: never "
        "(vllm bench serve's own client session times out after 6 hours, 21600).")

    @model_validator(mode="after")
    def _check(self) -> WorkloadConfig:
        self._check_ramp_up()
        ds = self.dataset
        if isinstance(ds, TIMED_TRACES) and ds.use_timestamps and (
                self.request_rate != math.inf or self.ramp_up_strategy is not None):
            raise ValueError("request_rate and ramp_up_strategy have no effect while the trace's "
                             "timestamps are used; set dataset.use_timestamps: false to use them")
        if isinstance(ds, TIMED_TRACES) and not ds.use_timestamps and ds.time_scale != 1.0:
            raise ValueError("dataset.time_scale: has no effect with dataset.use_timestamps "
                             "false (the send times come from request_rate)")
        if away_from_default(self, "burstiness") and self.ramp_up_strategy is None and (
                self.request_rate == math.inf
                or (isinstance(ds, TIMED_TRACES) and ds.use_timestamps)):
            raise ValueError("burstiness: has no effect when every request is sent at once "
                             "(request_rate inf) or at its trace's timestamps")
        if isinstance(ds, SESSION_DATASETS) and self.num_prompts is not None:
            raise ValueError("num_prompts: a sessions dataset runs dataset.num_sessions sessions "
                             "of several turns each; leave num_prompts unset")
        if isinstance(ds, MooncakeDataset) and ds.sessions and not ds.use_timestamps:
            raise ValueError("dataset.sessions: replayed sessions take their think times from the "
                             "trace's timestamps; set dataset.use_timestamps: true")
        if isinstance(ds, PrefixRepetitionDataset) and self.resolved_num_prompts < ds.num_prefixes:
            raise ValueError(f"num_prompts ({self.resolved_num_prompts}) must be at least "
                             f"dataset.num_prefixes ({ds.num_prefixes})")
        return self

    def _check_ramp_up(self) -> None:
        # vLLM's checks (benchmarks/serve.py main), plus a positive start rate: vLLM's client
        # asserts a positive rate for every request, and the first is sent at the start rate.
        start, end = self.ramp_up_start_rps, self.ramp_up_end_rps
        if self.ramp_up_strategy is None:
            if start is not None or end is not None:
                raise ValueError("ramp_up_start_rps/ramp_up_end_rps need a ramp_up_strategy")
            return
        if self.request_rate != math.inf:
            raise ValueError("with a ramp_up_strategy the rate comes from ramp_up_start_rps and "
                             "ramp_up_end_rps; leave request_rate unset (inf)")
        if start is None or end is None:
            raise ValueError("a ramp_up_strategy needs both ramp_up_start_rps and ramp_up_end_rps")
        if not (start > 0 and 0 < end < math.inf):
            raise ValueError("ramp_up_start_rps and ramp_up_end_rps must be positive and finite")
        if start > end:
            raise ValueError("ramp_up_start_rps must not exceed ramp_up_end_rps")

    @property
    def resolved_num_prompts(self) -> int | None:
        """num_prompts with vLLM's default filled in; None for a timed trace without a cap; for a
        sessions dataset, the most turns its sessions can send (num_sessions x most turns)."""
        ds = self.dataset
        if isinstance(ds, SESSION_DATASETS):
            return ds.num_sessions * count_bounds(ds.turns)[1]
        if self.num_prompts is not None or isinstance(self.dataset, TIMED_TRACES):
            return self.num_prompts
        return DEFAULT_NUM_PROMPTS
