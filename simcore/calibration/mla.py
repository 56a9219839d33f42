"""Measured MLA attention modules in a kernel profile: the tables, and their fit from NVIDIA
AIConfigurator's vLLM measurements (`aiconfigurator-core`, Apache-2.0).

What one measurement covers. AIConfigurator's vLLM collector builds one `DeepseekV2MLAAttention`
layer from vLLM's own modelling code (DeepSeek-V3's config with the query heads overridden to
`num_heads`, tensor parallelism 1, so `num_heads` is the heads one GPU holds under TP) and times
its `forward(positions, hidden_states)` inside a CUDA graph. In vLLM that call is the whole
attention block of a decoder layer (`MultiHeadLatentAttentionWrapper.forward`):
- the fused q/kv down-projection (`fused_qkv_a_proj`: hidden -> q_lora_rank + kv_lora_rank +
  qk_rope_head_dim; replicated, not split by TP), the two latent RMSNorms (`q_a_layernorm`,
  `kv_a_layernorm`), the query up-projection (`q_b_proj`), the rotary embedding of q_pe and k_pe;
- `MLAAttention`: the latent KV-cache write, then for prefill requests the latent
  up-projection `kv_b_proj` of their tokens and a causal attention over them (vLLM's prefill
  backend), for decode requests the absorbed form (the W_UK and W_UV batched matmuls around the
  MLA decode backend's kernel over the compressed cache);
- the output projection (`o_proj`).
It does not cover the decoder layer's input RMSNorm and residual add, the TP all-reduce after
`o_proj` (one GPU), nor anything outside the attention block. The linear layers run in the
row's `gemm_type` (bf16, fp8 with 128x128 block scales, nvfp4); AIConfigurator's own estimator
likewise uses a module row in place of the down-, q_b-, kv_b- and output-projection GEMMs and the
attention kernel (`sdk/models/deepseek.py`, `MLAModule`).

Context rows are `batch_size` prompts of `isl` tokens with no cached prefix (`step` 0);
generation rows `batch_size` sequences of one new token each over `step` tokens of KV cache,
the new one included. `mla_bmm/.../mla_bmm_perf.parquet` times only the two batched matmuls of
the decode path (`mla_gen_pre`: q_nope x W_UK_T; `mla_gen_post`: attention output x W_UV;
bf16 `torch.bmm`), a part of every generation row: it is not read.

Which backend. The collector leaves vLLM's backend selection to vLLM and records, per row, the
backend that ran: the decode backend where vLLM classified the whole batch as decodes (short
queries: up to 512 tokens with FLASH_ATTN_MLA, 128 with FLASHMLA, 1 with FLASHINFER_MLA and
TRITON_MLA), else the prefill backend. vLLM 0.24 picks, by default, on Hopper FLASH_ATTN_MLA
(bf16 KV cache; it does not take an fp8 cache, FLASHMLA then), on Blackwell FLASHINFER_MLA, on
Ada (L40S) TRITON_MLA, and FLASH_ATTN (FlashAttention varlen) for prefill with 16-bit queries
everywhere. The rows with `mla_dtype` fp8 (TRTLLM_RAGGED prefill, Blackwell) are the opt-in fp8
prefill-query quantization, not the default, and are left out: every table here is vLLM's
default path, each cell measured with the backend vLLM chose for it (`kernel` lists them with
the lengths they ran).

The fit follows the attention tables' (`simcore.calibration.aiconfigurator`): per phase, KV-cache
dtype, weight dtype and heads per GPU one grid of median times over (batch, length), a seeded
15% of each axis's interior values held out (drawn once per phase) and the relative error of
predicting the measured cells there reported per family `mla/<phase>/<kv dtype>/<weight dtype>`;
missing cells past a line's last measurement extrapolated with its last log-log slope (context:
along the length, up to quadratic, then the batch; generation: along the batch, linear).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from simcore.calibration.grid import check_batch_seq

MLA_CONTEXT_CAPS = (1.0, 2.0)
"""Context module tables above their last batch (linear) and prompt length (quadratic)."""

MLA_GENERATION_CAPS = (1.0, 1.0)
"""Generation module tables above their last batch and KV length: linear."""

DEFAULT_QUERY_DTYPE = "bfloat16"
"""The prefill query dtype vLLM uses unless fp8 prefill-query quantization is switched on."""

MLA_SHAPE_FIELDS = ("hidden", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                    "qk_rope_head_dim", "v_head_dim")
"""The layer dimensions a module table holds for; a model of other dimensions has none."""


def module_shape(arch) -> tuple[int, ...]:
    """The MLA layer dimensions of an architecture, in `MLA_SHAPE_FIELDS` order."""
    return (arch.hidden_size, arch.q_lora_rank, arch.kv_lora_rank, arch.qk_nope_head_dim,
            arch.qk_rope_head_dim, arch.v_head_dim)


class MlaTable(BaseModel):
    """vLLM's MLA attention module (projections, latent norms, rotary, attention, output
    projection; see the module docstring) at one per-GPU head count: times over (batch, seq),
    microseconds, C-order; null where not measured."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    phase: Literal["context", "generation"] = Field(
        description="context: each sequence a prompt of `seq` tokens with no cached prefix; "
        "generation: one new token per sequence over `seq` tokens of KV cache (the new one "
        "included).")
    kv_cache_dtype: str = Field(description="KV-cache dtype: bf16 or fp8.")
    gemm_dtype: str = Field(description="Weight dtype of the module's linear layers: bf16, "
                            "fp8_block, nvfp4.")
    kernel: str = Field(description="The attention backends vLLM chose, with the lengths each "
                        "ran (short prompts run as decodes).")
    source_model: str = Field(description="The model whose layer was measured.")
    hidden: int = Field(ge=1, description="Model width.")
    q_lora_rank: int = Field(ge=0, description="Query latent width (0: no query latent).")
    kv_lora_rank: int = Field(ge=1, description="KV latent width.")
    qk_nope_head_dim: int = Field(ge=1, description="Non-rotary part of a query/key head.")
    qk_rope_head_dim: int = Field(ge=1, description="Rotary part of a query/key head.")
    v_head_dim: int = Field(ge=1, description="Value head width.")
    num_heads: int = Field(ge=1, description="Query heads per GPU.")
    batch: list[int] = Field(description="Sequences per call measured.")
    seq: list[int] = Field(description="Prompt length (context) or KV length (generation).")
    time_us: list[float | None] = Field(description="len(batch) x len(seq) times, C-order.")
    held_out: dict[str, list[int]] = Field(description="Axis values left out: {'batch': [...], "
                                           "'seq': [...]}.")

    @model_validator(mode="after")
    def _check(self) -> "MlaTable":
        check_batch_seq(self.batch, self.seq, self.time_us)
        return self

    @property
    def shape(self) -> tuple[int, ...]:
        """The layer dimensions, in `MLA_SHAPE_FIELDS` order."""
        return tuple(getattr(self, f) for f in MLA_SHAPE_FIELDS)

    @property
    def caps(self) -> tuple[float, float]:
        return MLA_CONTEXT_CAPS if self.phase == "context" else MLA_GENERATION_CAPS


def _source_shape(model: str) -> dict[str, int] | None:
    """The layer dimensions of the model a table measured, from its preset; None when it is not
    a preset MLA model (the table could not be matched to any architecture)."""
    from simcore.model.presets import is_preset, load_preset

    if not is_preset(model):
        return None
    arch = load_preset(model)
    if not arch.is_mla:
        return None
    return dict(zip(MLA_SHAPE_FIELDS, module_shape(arch)))


def _kernel_label(grp) -> str:
    """'FLASHMLA (1-128), FLASH_ATTN (256-32768)': the backends of a table's cells by length."""
    spans = grp.groupby("kernel_source")["seq"].agg(["min", "max"]).sort_values("min")
    if len(spans) == 1:
        return str(spans.index[0])
    return ", ".join(f"{k} ({int(r['min'])}-{int(r['max'])})" for k, r in spans.iterrows())


_TABLES = (("context", "mla_context_module_perf.parquet", MLA_CONTEXT_CAPS, [1, 0]),
           ("generation", "mla_generation_module_perf.parquet", MLA_GENERATION_CAPS, [0]))


def fit_mla(reader, rng: np.random.Generator, errors: dict) -> list[dict]:
    """The MLA module tables of one system (`MlaTable` dicts), their held-out errors added to
    `errors`; [] when the system has no vLLM MLA module measurements."""
    from simcore.calibration import aiconfigurator as aic

    out: list[dict] = []
    for phase, name, caps, fill in _TABLES:
        df = reader.table("mla", name)
        if df is None or df.empty:
            continue
        df = df[df["mla_dtype"] == DEFAULT_QUERY_DTYPE].copy()
        if "tp_size" in df.columns:
            df = df[df["tp_size"] == 1]
        df["seq"] = df["isl"] if phase == "context" else df["step"]
        key = ["model", "kv_cache_dtype", "gemm_type", "num_heads"]
        # One backend per cell (vLLM's own choice); were a cell measured with several, the one
        # with the most rows.
        df = aic._pick_kernel(df, key + ["batch_size", "seq"])
        held = [aic._holdout(df["batch_size"].unique(), rng), aic._holdout(df["seq"].unique(), rng)]
        families: dict[str, tuple[list[float], list[int]]] = {}
        for (model, raw_kv, raw_gemm, heads), grp in sorted(df.groupby(key),
                                                             key=lambda x: x[0]):
            shape = _source_shape(str(model))
            ax_vals, arr = aic._grid(grp, ["batch_size", "seq"])
            if shape is None or len(ax_vals[0]) < 2 or len(ax_vals[1]) < 2:
                continue
            axes, train, errs, n_train = aic._fit_grid(ax_vals, arr, held, caps, fill=fill)
            if not np.isfinite(train).any():
                continue
            kv = aic.DTYPES.get(raw_kv, raw_kv)
            gd = aic.DTYPES.get(raw_gemm, raw_gemm)
            e, n = families.setdefault(f"mla/{phase}/{kv}/{gd}", ([], [0]))
            e.extend(errs)
            n[0] += n_train
            out.append({"phase": phase, "kv_cache_dtype": kv, "gemm_dtype": gd,
                        "kernel": _kernel_label(grp), "source_model": str(model), **shape,
                        "num_heads": int(heads), "batch": axes[0], "seq": axes[1],
                        "time_us": aic._flat_us(train),
                        "held_out": {"batch": held[0], "seq": held[1]}})
        for family, (e, n) in families.items():
            errors[family] = aic._stats(e, n[0])
    return out
