"""The one configuration tree of a simulation (model, hardware, parallelism, engine, router, workload),
validated at the edge with vLLM's own rules; bad input becomes one sentence naming the field."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from pydantic import (BaseModel, ConfigDict, Field, ValidationError, field_validator,
                      model_validator)

from simcore.cluster.config import ClusterConfig
from simcore.compute.assumptions import RooflineAssumptions
from simcore.errors import (NOT_MODELLED, ConfigError, Number, WholeNumber, away_from_default,
                            format_validation_error)
from simcore.host import HostConfig
from simcore.hardware import HardwareConfig, get_gpu
from simcore.loading import load_yaml
from simcore.model.config import ModelConfig
from simcore.model.memory import DEFAULT_GPU_MEMORY_UTILIZATION
from simcore.workload.config import WorkloadConfig

_FROZEN = ConfigDict(extra="forbid", frozen=True)

VLLM_BLOCK_SIZES = (1, 8, 16, 32, 64, 128)
"""Block sizes vLLM accepts for its CUDA attention backends."""


class PrefillDecodeConfig(BaseModel):
    """Prefill/decode disaggregation: how many instances of each kind."""

    model_config = _FROZEN

    num_prefill_instances: WholeNumber = Field(1, ge=1, description="Instances that run "
                                               "prompts.")
    num_decode_instances: WholeNumber = Field(1, ge=1, description="Instances that generate "
                                              "tokens.")
    prefill_tensor_parallel_size: WholeNumber | None = Field(
        None, ge=1, description="TP of each prefill instance (default: "
        "parallelism.tensor_parallel_size); its step times, KV-cache size and batch limits are "
        "those of a deployment at this TP.")
    decode_tensor_parallel_size: WholeNumber | None = Field(
        None, ge=1, description="TP of each decode instance (default: "
        "parallelism.tensor_parallel_size), likewise.")
    prefill_gpu: str | None = Field(
        None, description="GPU of the prefill instances, from the catalog (default: "
        "hardware.gpu, with its overrides); its step times, memory and KV-cache size are those "
        "of a deployment on that GPU. Instances of different GPUs never share a node: each "
        "role's instances fill nodes of their own.")
    decode_gpu: str | None = Field(
        None, description="GPU of the decode instances (default: hardware.gpu), likewise.")
    prefill_expert_parallel: bool | None = Field(
        None, description="Whether the prefill instances form one expert-parallel group (EP = "
        "their number x their TP; default: parallelism.enable_expert_parallel). MoE models "
        "only.")
    decode_expert_parallel: bool | None = Field(None, description="Likewise for the decode "
                                                "instances.")

    @field_validator("prefill_gpu", "decode_gpu")
    @classmethod
    def _known_gpu(cls, gpu: str | None) -> str | None:
        return None if gpu is None else get_gpu(gpu).name     # the catalog's spelling


MAX_ENGINES = 8192
"""The most engine instances one run simulates: each holds a scheduler and a KV-cache block pool
(about 2 MB each, measured with 512 Llama-3.1-8B replicas), twice the 4,096 GPUs of 512
eight-GPU nodes at TP 1."""


def engines_over_bound(num: int, counted: str = "") -> str | None:
    """Why `num` engine instances (`counted` saying how they are counted) are more than one run
    holds, or None when they are not."""
    if num <= MAX_ENGINES:
        return None
    return (f"{num:,} engine instances{counted}; one run holds at most {MAX_ENGINES:,}, each "
            "engine's scheduler and KV-cache pool taking about 2 MB")


class ParallelismConfig(BaseModel):
    """How the model is split over GPUs (vLLM's parallel config)."""

    model_config = _FROZEN

    tensor_parallel_size: WholeNumber = Field(1, ge=1, description="GPUs that shard every "
                                              "layer (TP); must divide the attention heads.")
    pipeline_parallel_size: WholeNumber = Field(1, ge=1, description="Pipeline stages (PP); each "
                                                "holds a contiguous slice of the layers.")
    data_parallel_size: WholeNumber = Field(1, ge=1, description="Data-parallel ranks (DP), each "
                                            "with TP x PP GPUs, its own scheduler and KV cache, "
                                            "behind the router. Without expert parallelism "
                                            "they are independent engine replicas; with it "
                                            "they step in lock-step.")
    enable_expert_parallel: bool = Field(False, description="vLLM's expert parallelism for MoE "
                                         "models: routed experts spread whole over EP = DP x TP "
                                         "GPUs (per pipeline stage), attention data-parallel, "
                                         "the DP ranks stepping in lock-step (idle ranks run "
                                         "dummy batches) with an all-to-all dispatch and "
                                         "combine per MoE layer. MoE models only. With "
                                         "prefill_decode, each role's instances are one EP group "
                                         "(EP = its instances x its TP).")

    num_replicas: WholeNumber = Field(1, ge=1, description="Independent copies of the whole "
                                      "deployment (DP x TP x PP GPUs each, with expert "
                                      "parallelism each its own lock-step EP group) behind one "
                                      "router, as separate vLLM deployments behind a load "
                                      "balancer.")
    prefill_decode: PrefillDecodeConfig | None = Field(
        None, description="Prefill/decode disaggregation (needs a cluster): prefill instances "
        "run each prompt and produce its first token, its KV cache crosses the fabric, and a "
        "decode instance generates the rest. Every instance has TP x PP GPUs (TP its role's "
        "own where prefill_tensor_parallel_size or decode_tensor_parallel_size is set); "
        "data_parallel_size must be 1.")

    @model_validator(mode="after")
    def _check(self) -> "ParallelismConfig":
        too_many = engines_over_bound(self.num_instances, " (data_parallel_size x "
                                      "num_replicas, or prefill plus decode instances)")
        if too_many:
            raise ValueError(too_many)
        if self.prefill_decode is not None:
            if self.data_parallel_size != 1:
                raise ValueError("prefill_decode: data_parallel_size must be 1 with "
                                 "disaggregation (set num_prefill_instances and "
                                 "num_decode_instances instead)")
            if self.num_replicas != 1:
                raise ValueError("prefill_decode: num_replicas must be 1 with disaggregation "
                                 "(set the numbers of prefill and decode instances instead)")
        return self

    @property
    def num_instances(self) -> int:
        """Engine instances: DP ranks, or prefill plus decode instances."""
        pd = self.prefill_decode
        if pd is not None:
            return pd.num_prefill_instances + pd.num_decode_instances
        return self.data_parallel_size * self.num_replicas

    def role_tensor_parallel_size(self, role: str) -> int:
        """TP of the instances of a role ("prefill", "decode"; anything else: the shared TP)."""
        tp = self.role_setting(role, "tensor_parallel_size")
        return self.tensor_parallel_size if tp is None else tp

    def role_setting(self, role: str, name: str) -> Any:
        """prefill_decode's `<role>_<name>` setting of a role ("prefill", "decode"); None where
        it is not set, there is no prefill_decode, or `role` is neither."""
        pd = self.prefill_decode
        if pd is None or role not in ("prefill", "decode"):
            return None
        return getattr(pd, f"{role}_{name}")

    @property
    def per_role_tp(self) -> bool:
        """Whether prefill and decode instances are declared with a TP of their own."""
        return any(self.role_setting(r, "tensor_parallel_size") is not None
                   for r in ("prefill", "decode"))

    def role_gpu(self, role: str) -> str | None:
        """The GPU declared for the instances of a role ("prefill", "decode"), or None: the
        deployment's (hardware.gpu)."""
        return self.role_setting(role, "gpu")

    def role_expert_parallel(self, role: str) -> bool:
        """Whether the instances of a role ("prefill", "decode") form an expert-parallel group:
        the role's own setting, else enable_expert_parallel."""
        own = self.role_setting(role, "expert_parallel")
        return self.enable_expert_parallel if own is None else own

    @property
    def per_role(self) -> bool:
        """Whether prefill and decode instances are declared with a TP or a GPU of their own, or
        form expert-parallel groups: each role is then a deployment of its own
        (`simcore.cluster.roles`)."""
        return self.prefill_decode is not None and any(
            self.role_setting(r, "tensor_parallel_size") is not None or self.role_gpu(r)
            or self.role_expert_parallel(r) for r in ("prefill", "decode"))

    @property
    def num_gpus_used(self) -> int:
        """GPUs of every engine instance: DP x replicas x TP x PP, or with disaggregation each
        role's instances times their TP x PP."""
        pp = self.pipeline_parallel_size
        pd = self.prefill_decode
        if pd is None:
            return self.num_instances * self.tensor_parallel_size * pp
        return pp * (pd.num_prefill_instances * self.role_tensor_parallel_size("prefill")
                     + pd.num_decode_instances * self.role_tensor_parallel_size("decode"))

    @property
    def expert_parallel_size(self) -> int:
        """EP = DP x TP with expert parallelism on, else 1."""
        if not self.enable_expert_parallel:
            return 1
        return self.data_parallel_size * self.tensor_parallel_size


SPECULATIVE_METHODS = ("draft_model", "eagle", "eagle3", "mtp", "ngram")
"""The `speculative_config.method`s modelled, with vLLM's names."""


class SpeculativeConfig(BaseModel):
    """vLLM's speculative decoding settings (`--speculative-config`), with vLLM's names, plus the
    acceptance model that stands in for the token contents the simulator does not have."""

    model_config = _FROZEN

    method: Literal["draft_model", "eagle", "eagle3", "mtp", "ngram"] = Field(
        description="The drafter: draft_model (a smaller model of the same vocabulary, `model`), "
        "eagle / eagle3 (a one-layer draft head on the target's hidden states), mtp (the "
        "target's own multi-token-prediction layers, e.g. DeepSeek-V3) or ngram (prompt lookup "
        "on the CPU).")
    num_speculative_tokens: WholeNumber = Field(ge=1, description="Draft tokens proposed per "
                                                "decoding request and step (k).")
    model: str | None = Field(None, description="draft_model: the draft model, a preset name as "
                              "model.name takes it (it times the draft). eagle / eagle3: the "
                              "draft head's checkpoint name, informative only (the head is timed "
                              "as one decoder layer of the target's width). Not used by mtp "
                              "and ngram.")
    prompt_lookup_min: WholeNumber | None = Field(None, ge=1, description="ngram: shortest "
                                                  "n-gram matched (only matters to "
                                                  "acceptance, which is declared).")
    prompt_lookup_max: WholeNumber | None = Field(None, ge=1, description="ngram: longest "
                                                  "n-gram matched (only matters to "
                                                  "acceptance).")
    acceptance_rate: float | None = Field(None, ge=0, le=1, description="Acceptance model: the "
                                          "probability that a draft token is accepted given "
                                          "that the one before it was (the same at every "
                                          "position).")
    acceptance_per_position: tuple[float, ...] | None = Field(
        None, description="Acceptance model: for each of the k positions, the fraction of "
        "drafts whose token at that position is accepted, as vLLM's spec-decode metrics report "
        "it (vllm:spec_decode_num_accepted_tokens_per_pos / num_drafts); non-increasing.")

    @model_validator(mode="after")
    def _check(self) -> "SpeculativeConfig":
        k = self.num_speculative_tokens
        per_pos = self.acceptance_per_position
        if (self.acceptance_rate is None) == (per_pos is None):
            raise ValueError("acceptance_rate: give exactly one acceptance model, "
                             "acceptance_rate or acceptance_per_position")
        if per_pos is not None:
            if len(per_pos) != k:
                raise ValueError(f"acceptance_per_position: {len(per_pos)} values for "
                                 f"num_speculative_tokens {k}; give one per position")
            if any(not 0 <= p <= 1 for p in per_pos):
                raise ValueError("acceptance_per_position: every value must be in [0, 1]")
            if any(b > a for a, b in zip(per_pos, per_pos[1:])):
                raise ValueError("acceptance_per_position: must be non-increasing (a position "
                                 "is accepted only if every one before it is)")
        if self.method == "draft_model" and not self.model:
            raise ValueError("model: method draft_model needs the draft model (a preset name)")
        if self.method in ("mtp", "ngram") and self.model is not None:
            raise ValueError(f"model: not used by method {self.method} (remove it)")
        lookup = self.prompt_lookup_min is not None or self.prompt_lookup_max is not None
        if lookup and self.method != "ngram":
            raise ValueError("prompt_lookup_min: only used with method ngram")
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(f"prompt_lookup_min: {lo} exceeds prompt_lookup_max ({hi})")
        return self

    def conditional_acceptance(self) -> tuple[float, ...]:
        """Per position i (0-based), the probability that draft token i is accepted given that
        tokens 0..i-1 were: the constant rate, or the ratios of consecutive per-position
        fractions."""
        k = self.num_speculative_tokens
        if self.acceptance_rate is not None:
            return (float(self.acceptance_rate),) * k
        out = []
        prev = 1.0
        for p in self.acceptance_per_position:
            out.append(p / prev if prev > 0 else 0.0)
            prev = p
        return tuple(out)

    def expected_tokens_per_step(self) -> float:
        """Tokens one verification with all k drafts emits on average: 1 + the expected accepted
        (1 + a + ... + a^k for a constant rate a)."""
        total = 1.0
        prob = 1.0
        for c in self.conditional_acceptance():
            prob *= c
            total += prob
        return total


class EngineConfig(BaseModel):
    """vLLM engine settings, with vLLM's names, defaults and meanings."""

    model_config = _FROZEN

    max_num_seqs: WholeNumber | None = Field(
        None, ge=1, description="Most requests in one batch. Default as `vllm serve`: 1024 on "
        "GPUs with >= 70 GiB other than A100, else 256.")
    max_num_batched_tokens: WholeNumber | None = Field(
        None, ge=1, description="Token budget of one step. Default as `vllm serve` (0.28 and "
        "later): 16384 on GPUs with >= 160 GiB, 8192 on those with >= 70 GiB other than A100, "
        "else 2048 (with chunked prefill); max_model_len without chunked prefill.")
    block_size: WholeNumber = Field(16, description="Tokens per KV-cache block.")
    gpu_memory_utilization: Number = Field(
        DEFAULT_GPU_MEMORY_UTILIZATION, gt=0, le=1, description="Fraction of GPU memory vLLM may "
        "use for weights, activations and KV cache.")
    profile_cuda_graph_memory: bool = Field(True, description="Subtract the CUDA graphs' "
                                            "estimated memory before sizing the KV cache, as "
                                            "vLLM does by default since 0.21 "
                                            "(VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS); false "
                                            "for earlier releases, which captured the graphs "
                                            "after allocating the KV cache.")
    num_gpu_blocks_override: WholeNumber | None = Field(
        None, ge=2, le=1 << 27, description="Use this many KV blocks instead of the "
        "memory-derived number (at most 2^27: each takes about 14 bytes of the simulator's "
        "memory).")
    enable_chunked_prefill: bool = Field(True, description="Split long prompts across steps.")
    enable_prefix_caching: bool = Field(True, description="Reuse cached full KV blocks across "
                                        "requests with a common prefix.")
    long_prefill_token_threshold: WholeNumber = Field(
        0, ge=0, description="Cap on prompt tokens one request may schedule per step (0 = no "
        "cap).")
    scheduling_policy: Literal["fcfs", "priority"] = Field("fcfs", description="Waiting-queue "
                                                           "order and preemption victim choice.")
    preemption_mode: Literal["vllm", "least_work_done"] = Field(
        "vllm", description="Victim on KV exhaustion: vLLM's (last admitted, or lowest priority) "
        "or least work done (sparing requests within 5% of their decode length and those "
        "preempted 3 times).")
    persistent_batch: bool = Field(False, description="Admit new requests only after a running "
                                   "one completes (a batch rebuilt on completion), instead of "
                                   "vLLM's every-step admission.")
    scheduler_reserve_full_isl: bool = Field(True, description="Admit a request only if its whole "
                                             "prompt fits in free KV blocks (vLLM default).")
    max_num_scheduled_tokens: WholeNumber | None = Field(
        None, ge=1, description="Most tokens the scheduler may issue in one step (vLLM "
        "--max-num-scheduled-tokens); a step stays within both this and max_num_batched_tokens. "
        "Null: max_num_batched_tokens.")
    watermark: float = Field(0.0, ge=0, lt=1, description="Fraction of the KV blocks kept free "
                             "when admitting a waiting or preempted request while others run "
                             "(vLLM --watermark); admission with nothing running ignores it.")
    async_scheduling: bool = Field(False, description="vLLM's one-step-ahead scheduling "
                                   "(--async-scheduling): vLLM's scheduler time of a step "
                                   "overlaps the GPU's (host.model vllm) instead of adding to "
                                   "it; the model runner's time still precedes the GPU work. "
                                   "The scheduler's decisions are those of sync mode.")
    speculative_config: SpeculativeConfig | None = Field(
        None, description="Speculative decoding (vLLM --speculative-config): a drafter proposes "
        "num_speculative_tokens tokens per decoding request each step, the target model "
        "verifies them in its next step, and the accepted ones (drawn from the declared "
        "acceptance model) are emitted together. Composes with a cluster section (the "
        "drafter's forwards in each step's DAG) and prefill/decode disaggregation (both roles "
        "run the drafter, whose KV moves with the target's) and expert parallelism (every "
        "rank of a group drafts; an MoE model's MTP layer not on a cluster section); refused "
        "with pipeline parallelism. Null: off.")
    implementation: Literal["simcore", "vllm"] = Field(
        "simcore", description="Who makes the scheduling decisions: the simulator's own "
        "vLLM-faithful scheduler, or the installed vLLM's V1 scheduler and KV-cache manager "
        "(vllm), driven step by step on the virtual clock in a child process: slower, exact "
        "for whichever vLLM runs it. Not with sliding-window models, speculative decoding, "
        "KV connectors or this simulator's own preemption_mode and persistent_batch.")
    vllm_python: Path | None = Field(
        None, description="implementation vllm: the Python interpreter that can import vLLM "
        "(default: the simulator's own), e.g. the venv scripts/vllm_conformance/setup.sh "
        "builds; relative to the config's folder.")
    vllm_path: Path | None = Field(
        None, description="implementation vllm: a folder put first on vLLM's PYTHONPATH "
        "(setup.sh's DIR/src); relative to the config's folder.")
    enable_lora: bool = Field(False, description="LoRA adapters. Not modelled: must be false.",
                              json_schema_extra={NOT_MODELLED: "LoRA"})
    kv_transfer_config: dict | None = Field(None, description="KV connectors (P/D, offload). Not "
                                            "modelled by this engine yet: must be absent.",
                                            json_schema_extra={NOT_MODELLED: "KV connectors"})
    cpu_offload_gb: float = Field(0, ge=0, description="Weight offload to CPU. Not modelled: "
                                  "must be 0.",
                                  json_schema_extra={NOT_MODELLED: "CPU weight offload"})

    @model_validator(mode="after")
    def _check(self) -> "EngineConfig":
        if self.implementation != "vllm":
            for name in ("vllm_python", "vllm_path"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name}: applies to implementation vllm only")
        else:
            own = [n for n, bad in (("speculative_config", self.speculative_config is not None),
                                    ("preemption_mode", self.preemption_mode != "vllm"),
                                    ("persistent_batch", self.persistent_batch)) if bad]
            if own:
                raise ValueError(f"implementation vllm: {own[0]} is not driven through vLLM's "
                                 "scheduler; remove it or use implementation simcore")
        if self.async_scheduling and self.speculative_config is not None \
                and self.speculative_config.method == "ngram":
            # vLLM 0.33's VllmConfig: the V1 model runner supports async scheduling with
            # EAGLE/MTP, ngram_gpu and draft-model drafters only, and refuses it otherwise.
            raise ValueError("async_scheduling: vLLM refuses async scheduling with ngram "
                             "speculative decoding (the CPU prompt lookup needs each step's "
                             "sampled tokens before the next step is scheduled); set "
                             "async_scheduling false or use another drafter")
        if self.block_size not in VLLM_BLOCK_SIZES:
            raise ValueError(f"block_size: expected one of "
                             f"{', '.join(map(str, VLLM_BLOCK_SIZES))} (got {self.block_size})")
        for name, info in type(self).model_fields.items():
            what = (info.json_schema_extra or {}).get(NOT_MODELLED)
            if what and getattr(self, name):
                raise ValueError(f"{name}: {what} is not modelled by the simulator; remove it "
                                 f"(results would silently ignore it)")
        return self


CACHE_AWARE_SETTINGS = ("cache_threshold", "balance_abs_threshold", "balance_rel_threshold")
"""The router settings only policy cache_aware reads."""


class RouterConfig(BaseModel):
    """How requests are spread over the data-parallel replicas."""

    model_config = _FROZEN

    policy: Literal["round_robin", "least_outstanding", "prefix_affinity", "cache_aware"] = Field(
        "round_robin", description="round_robin: in turn; least_outstanding: fewest running + "
        "waiting requests in the last load report; prefix_affinity: the replica that was sent the "
        "longest matching prompt prefix, unless its reported load exceeds the least loaded "
        "replica's by more than balance_threshold; cache_aware: vLLM's router's policy of that "
        "name (vllm-router --policy cache_aware): on its own count of requests in flight, the "
        "least loaded replica when the loads are imbalanced (balance_abs_threshold and "
        "balance_rel_threshold), else the replica that was sent the longest prefix of the "
        "request's prompt where it is more than cache_threshold of the prompt, else the least "
        "loaded.")
    periodic_infra_update_time_s: float = Field(0.05, ge=0.001, description="Seconds between the "
                                                "load reports engines publish to the router "
                                                "(at least 1 ms: no engine step is shorter); "
                                                "the router only sees these, so its view is "
                                                "stale.")
    balance_threshold: int = Field(16, ge=0, description="prefix_affinity: outstanding-request gap "
                                   "beyond which balance wins over cache affinity.")
    cache_threshold: float = Field(0.3, ge=0.0, le=1.0, description="cache_aware: the share of "
                                   "the prompt its longest match must exceed for the request to "
                                   "follow it (vllm-router --cache-threshold; its default).")
    balance_abs_threshold: int = Field(64, ge=0, description="cache_aware: the loads are "
                                       "imbalanced when the busiest replica has more than this "
                                       "many requests in flight over the idlest (vllm-router "
                                       "--balance-abs-threshold; its default) ...")
    balance_rel_threshold: float = Field(1.5, ge=1.0, description="cache_aware: ... and more "
                                         "than this many times as many (vllm-router "
                                         "--balance-rel-threshold; its default).")

    @model_validator(mode="after")
    def _check_policy_reads(self) -> "RouterConfig":
        if away_from_default(self, "balance_threshold") and self.policy != "prefix_affinity":
            raise ValueError(f"balance_threshold: only read by policy prefix_affinity, not "
                             f"{self.policy}")
        for name in CACHE_AWARE_SETTINGS:
            if away_from_default(self, name) and self.policy != "cache_aware":
                raise ValueError(f"{name}: only read by policy cache_aware, not {self.policy}")
        if away_from_default(self, "periodic_infra_update_time_s") and (
                self.policy in ("round_robin", "cache_aware")):
            raise ValueError(f"periodic_infra_update_time_s: {self.policy} reads no load "
                             "reports" + (" (it counts its own requests in flight)"
                                          if self.policy == "cache_aware" else ""))
        return self


class MetricsConfig(BaseModel):
    """What the summary reports, as `vllm bench serve --metric-percentiles/--goodput` set it."""

    model_config = _FROZEN

    percentiles: tuple[float, ...] = Field((50, 90, 99), description="Percentiles reported for "
                                           "ttft, tpot, itl and e2el (e.g. 99 -> p99_ttft_ms).")
    goodput: dict[Literal["ttft", "tpot", "e2el"], float] | None = Field(
        None, description="SLOs in milliseconds; a request counts toward request_goodput if it "
        "meets all of them (e.g. {ttft: 500, tpot: 50}).")
    timeseries_interval_s: float = Field(1.0, ge=0.001, description="Sampling interval of KV "
                                         "usage, running and waiting requests over time, "
                                         "seconds (at least 1 ms: no engine step is shorter).")
    headroom: bool = Field(True, description="With an envelope (dse simulate, search trials "
                           "with one): one more run of the same requests sent at once measures "
                           "the throughput capacity, and the result's `headroom` says how far "
                           "the offered rate is from it and what binds first as load rises.")

    @model_validator(mode="after")
    def _check(self) -> "MetricsConfig":
        for p in self.percentiles:
            if not 0 < p < 100 and p != 100:
                raise ValueError(f"percentiles: {p} is not in (0, 100]")
        for name, ms in (self.goodput or {}).items():
            if not 0 < ms < math.inf:
                raise ValueError(f"goodput.{name}: must be a positive, finite number of "
                                 f"milliseconds (got {ms})")
        return self


class ComputeConfig(BaseModel):
    """The compute model that turns a step's shape into seconds."""

    model_config = _FROZEN

    kind: Literal["auto", "roofline", "calibrated"] = Field(
        "auto", description="auto: calibrated where a kernel profile of the configured GPU is "
        "shipped (vLLM's kernels as measured, every op class; `dse calibrate --list`) or "
        "`profile` names one, else the roofline; the result names which. roofline: the "
        "uncalibrated reference profile (peak FLOP/s and bandwidths with declared "
        "efficiencies). calibrated: per-op times from a calibration profile fitted to "
        "measurements (`profile`), the roofline for ops it does not cover.")
    profile: str | None = Field(
        None, description="Calibration profile for kind calibrated: a shipped profile's name "
        "(e.g. h100-vidur; `dse calibrate --list`) or a path to a profile file. Default: the "
        "shipped profile of the configured GPU.")
    roofline: RooflineAssumptions = Field(default_factory=RooflineAssumptions,
                                          description="Efficiency factors, latencies and "
                                          "overheads of the roofline reference profile.")
    moe_routing: Literal["balanced", "power_law_1.01", "power_law_1.2"] | None = Field(
        None, description="How a mixture-of-experts model's router spreads tokens over the "
        "experts, for a kernel profile's measured fused-MoE tables: balanced (every expert the "
        "same share) or power_law_1.01 / power_law_1.2 (expert loads following a power law of "
        "that exponent: fewer distinct experts in a small batch, a longer hottest-expert queue "
        "in a large one). Default: simcore.compute.kernel_model.DEFAULT_MOE_ROUTING where the "
        "profile measured it, chosen on the fit part of the end-to-end validation set. Only "
        "with kind: calibrated and a MoE model, and not with expert parallelism on every "
        "instance (its group's roofline times the experts, routing uniformly); where no shape "
        "was measured the roofline times them with uniform routing and the result says so.")
    compute_bound_scale: float | None = Field(
        None, ge=1.0, le=2.0, description="Multiplier on the time of a calibrated model's "
        "compute-bound ops (measured kernels and roofline fallbacks alike): kernel databases "
        "time each kernel in short runs at boost clocks, while a serving GPU's tensor cores "
        "sustain lower clocks at its power limit. Default: the value fitted on the fit part of "
        "the end-to-end validation set (simcore/data/cpu_costs/fitted.json), bounded by "
        "published sustained-to-boost clock ratios. Only with a calibrated profile.")
    collective_skew_s: float | None = Field(
        None, ge=0.0, le=1e-3, description="Standard deviation of the TP ranks' arrival times "
        "at each all-reduce, s: every rank waits there for the last one, which arrives this "
        "much x E[max of tp standard normals] after the mean (0.56 at TP 2, 1.03 at TP 4, 1.42 "
        "at TP 8), on every all-reduce of a step; a collective measured alone, its ranks "
        "started together, does not hold it. Default: the value fitted on the fit part of the "
        "end-to-end validation set (simcore/data/cpu_costs/fitted.json). Only with a "
        "calibrated profile, and not on a cluster, whose fabric times the collectives.")
    graphless_collective_scale: float | None = Field(
        None, ge=1.0, le=4.0, description="Multiplier on the TP all-reduces' time in steps not "
        "replayed as one full CUDA graph (prefills, mixed batches, batches past "
        "cuda_graph_max_num_tokens: vLLM runs them as piecewise CUDA graphs with the attention "
        "in between, launched op by op), against the collectives measured alone; decode steps "
        "replayed as one graph keep the measured time. Default: the value fitted on the fit "
        "part of the end-to-end validation set (simcore/data/cpu_costs/fitted.json). Only with "
        "a calibrated profile, and not on a cluster, whose fabric times the collectives.")

    @model_validator(mode="after")
    def _check(self) -> "ComputeConfig":
        if self.profile is not None and self.kind == "roofline":
            raise ValueError("profile: only used with kind: calibrated (or auto)")
        if self.moe_routing is not None and self.kind == "roofline":
            raise ValueError("moe_routing: only used with a calibrated profile (the roofline "
                             "routes tokens uniformly)")
        if self.compute_bound_scale is not None and self.kind == "roofline":
            raise ValueError("compute_bound_scale: only used with a calibrated profile (the "
                             "roofline's efficiencies are compute.roofline's)")
        for name in ("collective_skew_s", "graphless_collective_scale"):
            if getattr(self, name) is not None and self.kind == "roofline":
                raise ValueError(f"{name}: only used with a calibrated profile (the roofline's "
                                 "collectives are compute.roofline's)")
        return self

    def resolved(self, name: str) -> float:
        """A fitted setting (`simcore.host.FITTED_COMPUTE`: compute_bound_scale,
        collective_skew_s, graphless_collective_scale) as set, or the fitted value when it is
        null."""
        value = getattr(self, name)
        if value is not None:
            return float(value)
        from simcore.host import fitted_compute
        return fitted_compute(name)

    def resolved_kind(self, gpu: str) -> str:
        """The compute model a run on `gpu` uses: `kind`, or for auto `calibrated` where
        `profile` names a profile or a kernel profile of the GPU is shipped, else
        `roofline`."""
        if self.kind != "auto":
            return self.kind
        if self.profile is not None:
            return "calibrated"
        from simcore.calibration.kernels import shipped_kernel_profile_ids
        return ("calibrated" if f"{gpu.lower()}-aiconfigurator" in shipped_kernel_profile_ids()
                else "roofline")


class UncertaintyConfig(BaseModel):
    """How `dse simulate` bounds its headline metrics: every result carries an envelope."""

    model_config = _FROZEN

    method: Literal["bounds", "samples", "first_order", "calibrated"] | None = Field(
        None, description="bounds: two extra runs with every op class at the low and at "
        "the high end of its error bound (the envelope spans the three runs). samples: "
        "`samples` extra runs with each op class's duration scaled by a seeded random factor "
        "within its error model; the envelope is the `percentiles` of the runs. first_order: "
        "no extra run, each metric scaled by the step-time bound (cheap, ignores queueing). "
        "calibrated: no extra run, each metric family's split-conformal interval from "
        "measured / predicted on the end-to-end validation set's fit part (calibrated "
        "compute only; else first_order). Default: calibrated with compute kind calibrated "
        "(width and centre from measured errors), bounds with the roofline.")
    samples: int = Field(10, ge=2, le=1000, description="Perturbed runs of method samples.")
    percentiles: tuple[float, float] = Field(
        (5.0, 95.0), description="Low and high percentile of the samples' envelope.")
    vary_workload_seed: bool = Field(
        False, description="Method samples: each perturbed run also draws its own workload "
        "(seed + 1, seed + 2, ...), so the envelope includes the workload's sampling spread.")

    @model_validator(mode="after")
    def _check(self) -> "UncertaintyConfig":
        lo, hi = self.percentiles
        if not 0 <= lo < hi <= 100:
            raise ValueError(f"percentiles: need 0 <= low < high <= 100, got {lo}, {hi}")
        if self.vary_workload_seed and self.method != "samples":
            raise ValueError("vary_workload_seed: only used with method: samples")
        return self


class SimConfig(BaseModel):
    """A whole `dse simulate` input: what is served, on what, with which settings, under what load."""

    model_config = _FROZEN

    name: str = Field("simulation", description="A label carried into the results.")
    seed: WholeNumber = Field(0, description="Seed of every random choice (workload, routing "
                              "ties); same seed, same result.")
    model: ModelConfig = Field(description="The served model: a preset name or a Hugging Face "
                               "config.json, with weight and KV-cache dtypes.")
    hardware: HardwareConfig = Field(description="The GPU (from the catalog) and its node.")
    parallelism: ParallelismConfig = Field(default_factory=ParallelismConfig,
                                           description="TP, PP and DP degrees, and expert "
                                           "parallelism.")
    engine: EngineConfig = Field(default_factory=EngineConfig, description="vLLM engine "
                                 "settings.")
    router: RouterConfig = Field(default_factory=RouterConfig, description="Routing over DP "
                                 "replicas.")
    workload: WorkloadConfig = Field(description="What the benchmark client sends.")
    metrics: MetricsConfig = Field(default_factory=MetricsConfig, description="Summary options.")
    compute: ComputeConfig = Field(default_factory=ComputeConfig, description="Step-time model.")
    host: HostConfig = Field(default_factory=HostConfig, description="The CPU side of the "
                             "server: vLLM's engine core per step, the API server per token "
                             "and per request.")
    uncertainty: UncertaintyConfig = Field(default_factory=UncertaintyConfig,
                                           description="How the envelope of the metrics is "
                                           "computed.")
    cluster: ClusterConfig | None = Field(None, description="Nodes on a simulated fabric: "
                                          "with it, every step runs as a DAG of compute and "
                                          "communication over the network. Without it, "
                                          "communication is timed by the roofline's formulas.")
    base_dir: str = Field(".", description="Directory that relative paths in this config are "
                          "resolved against (set by the loader to the file's directory).")

    @model_validator(mode="after")
    def _check_endpoint(self) -> "SimConfig":
        chat = self.workload.endpoint == "chat_completions"
        if chat and not self.host.api_server:
            raise ValueError("workload.endpoint: chat_completions has no effect without an API "
                             "server (host.model constant or host.entrypoint offline); use "
                             "completions")
        if self.model.chat_template_tokens is not None and not chat:
            raise ValueError("model.chat_template_tokens has no effect on completions requests "
                             "(no chat template is applied); set workload.endpoint: "
                             "chat_completions or remove it")
        if self.host.chat_template_parse != "cached" and not chat:
            raise ValueError("host.chat_template_parse: per_request has no effect on "
                             "completions requests; set workload.endpoint: chat_completions")
        par = self.parallelism
        if (par.tensor_parallel_size == 1 and par.pipeline_parallel_size == 1
                and not par.enable_expert_parallel and par.prefill_decode is None
                and self.cluster is None):
            links = away_from_default(self.compute.roofline, "interconnect_bandwidth_fraction",
                                      "collective_hop_latency_s",
                                      "inter_node_bandwidth_bytes_per_s", "inter_node_latency_s")
            if links:
                raise ValueError(f"compute.roofline.{links[0]}: has no effect: with TP 1, PP 1, "
                                 "no expert parallelism and no cluster nothing crosses a link "
                                 "between GPUs; remove it")
        if self.host.model == "constant" and self.engine.async_scheduling:
            raise ValueError("engine.async_scheduling: has no effect with host.model constant, "
                             "whose declared step overhead (compute.roofline.step_overhead_s) "
                             "no scheduling hides; use host.model vllm, whose scheduler time "
                             "async scheduling overlaps with the GPU's")
        if self.host.model == "vllm" and away_from_default(self.compute.roofline,
                                                           "step_overhead_s"):
            raise ValueError("compute.roofline.step_overhead_s: only used with host.model "
                             "constant; host.model vllm times the CPU side from vLLM's measured "
                             "costs (host section)")
        par = self.parallelism
        if self.compute.moe_routing is not None and all(
                par.role_expert_parallel(r) for r in ("prefill", "decode")):
            raise ValueError("compute.moe_routing: has no effect with expert parallelism "
                             "(parallelism.enable_expert_parallel), whose routed experts are "
                             "timed by the expert-parallel group's roofline with uniform "
                             "routing (on a cluster, cluster.dag.moe_routing sets their "
                             "popularity); remove it")
        if self.cluster is not None:
            inert = self.cluster.settings_without_effect(par)
            if inert:
                path, why = inert[0]
                raise ValueError(f"{path}: has no effect: {why}; remove it")
        return self

    def gpus_by_type(self) -> dict[str, int]:
        """GPUs of every engine instance by catalog name: hardware.gpu's, or with prefill and
        decode instances on GPUs of their own, each role's (prefill's first)."""
        par = self.parallelism
        pd = par.prefill_decode
        base = get_gpu(self.hardware.gpu).name
        if pd is None:
            return {base: par.num_gpus_used}
        out: dict[str, int] = {}
        for role, n in (("prefill", pd.num_prefill_instances),
                        ("decode", pd.num_decode_instances)):
            gpu = par.role_gpu(role) or base
            out[gpu] = (out.get(gpu, 0)
                        + n * par.role_tensor_parallel_size(role) * par.pipeline_parallel_size)
        return out

    def with_section(self, section: str, **changes: Any) -> "SimConfig":
        """A copy with fields of one section changed (e.g. `with_section("workload",
        request_rate=5)`), the rest as it is; like `model_copy`, it does not re-validate."""
        part = getattr(self, section)
        return self.model_copy(update={section: part.model_copy(update=changes)})


def parse_config(data: Any, *, source: str = "config", base_dir: str | Path | None = None) -> SimConfig:
    """Validate a mapping into a SimConfig, raising ConfigError with one sentence on failure."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of settings")
    if base_dir is not None and "base_dir" not in data:
        data = {**data, "base_dir": str(base_dir)}
    try:
        return SimConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(f"{source}: {format_validation_error(err, SimConfig)}") from None


def load_config(path: str | Path) -> SimConfig:
    """Load a `dse simulate` YAML file; relative paths inside resolve against its directory."""
    path = Path(path)
    return parse_config(load_yaml(path), source=str(path), base_dir=path.resolve().parent)


def check_batch_limits(max_num_seqs: int, max_num_batched_tokens: int, max_model_len: int,
                       chunked: bool, long_prefill_token_threshold: int) -> None:
    """vLLM's checks of the batch limits against each other (`SchedulerConfig.
    verify_max_model_len`); raises ConfigError whose message starts with the engine field."""
    if not chunked and max_num_batched_tokens < max_model_len:
        raise ConfigError(
            f"max_num_batched_tokens: {max_num_batched_tokens} is smaller than "
            f"max_model_len ({max_model_len}); without chunked prefill vLLM needs "
            f"max_num_batched_tokens >= max_model_len (raise it or lower model.max_model_len)")
    if max_num_batched_tokens < max_num_seqs:
        raise ConfigError(f"max_num_batched_tokens: {max_num_batched_tokens} must be at "
                          f"least max_num_seqs ({max_num_seqs})")
    if long_prefill_token_threshold > max_model_len:
        raise ConfigError(f"long_prefill_token_threshold: {long_prefill_token_threshold}"
                          f" exceeds max_model_len ({max_model_len})")


def default_batch_limits(gpu_memory_bytes: float, gpu_name: str, chunked: bool,
                         max_model_len: int) -> tuple[int, int]:
    """vLLM `vllm serve` defaults for (max_num_seqs, max_num_batched_tokens) on a GPU
    (`EngineArgs.get_batch_defaults` of vLLM 0.28 and later, which gave GPUs of 160 GiB or more
    a token budget of 16,384; 8,192 before), then, without chunked prefill, max_model_len at
    least."""
    if gpu_memory_bytes >= 160 * 2**30:
        seqs, tokens = 1024, 16384
    elif gpu_memory_bytes >= 70 * 2**30 and "a100" not in gpu_name.lower():
        seqs, tokens = 1024, 8192
    else:
        seqs, tokens = 256, 2048
    if not chunked:
        tokens = max(tokens, max_model_len)
    return seqs, tokens

