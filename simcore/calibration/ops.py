"""The op vocabulary of calibration: vidur's op names, the per-GPU shape key each op is looked up
by, and the shapes of one transformer layer's ops under tensor parallelism."""

from __future__ import annotations

COMPUTE_OPS = ("emb", "input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj",
               "post_attention_layernorm", "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
"""vidur's names of the per-layer non-attention ops, in execution order."""

COLLECTIVES = ("all_reduce", "send_recv")
"""The NCCL collectives vidur profiles."""

GEMM_FAMILY = "gemm"
"""The curve family all GEMM ops share: a GEMM's time depends on its shape, not on its role."""

OP_KEY_FIELDS: dict[str, tuple[str, ...]] = {
    "gemm": ("in_features", "out_features"),
    "emb": ("hidden", "vocab_per_gpu"),
    "input_layernorm": ("hidden",),
    "post_attention_layernorm": ("hidden",),
    "add": ("hidden",),
    "attn_rope": ("q_features", "kv_features"),
    "mlp_act": ("ffn_features", "gated"),
}
"""Shape key of each curve family, all per GPU after TP sharding: `hidden` = model width,
`vocab_per_gpu` = vocabulary rows per GPU, `q_features` / `kv_features` = query / key-value
heads per GPU x head_dim, `ffn_features` = MLP intermediate width per GPU, `gated` = 1 for a gated
(SiLU-and-multiply) activation, 0 for a plain one."""

GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
"""Ops timed by the GEMM curves: QKV projection, attention output projection, (gate+)up
projection, down projection."""

ELEMENTWISE_WIDTH: dict[str, tuple[str, ...]] = {
    "emb": ("hidden",),
    "input_layernorm": ("hidden",),
    "post_attention_layernorm": ("hidden",),
    "add": ("hidden",),
    "attn_rope": ("q_features", "kv_features"),
    "mlp_act": ("ffn_features",),
}
"""Key fields summed into the width an elementwise op touches per token (its generic fallback
times elements = tokens x width)."""


def family(op: str) -> str:
    """The curve family of an op name: "gemm" for the GEMM ops, else the op itself."""
    return GEMM_FAMILY if op in GEMM_OPS else op


def layer_op_shapes(*, hidden: int, num_heads: int, num_kv_heads: int, ffn: int, vocab: int,
                    tp: int = 1, gated: bool = True,
                    head_dim: int | None = None) -> dict[str, dict[str, int]]:
    """Shape keys, per GPU, of one transformer layer's non-attention ops under tensor
    parallelism `tp`, as the lookups take them: query heads, MLP width and vocabulary split over
    the TP ranks, key-value heads too (replicated, one per rank, when fewer than `tp`), the
    fused gate+up GEMM of a gated MLP with 2 x ffn / tp outputs."""
    head_dim = head_dim or hidden // num_heads
    q = num_heads // tp * head_dim
    kv = max(num_kv_heads // tp, 1) * head_dim
    f = ffn // tp
    return {
        "emb": {"hidden": hidden, "vocab_per_gpu": vocab // tp},
        "input_layernorm": {"hidden": hidden},
        "attn_pre_proj": {"in_features": hidden, "out_features": q + 2 * kv},
        "attn_rope": {"q_features": q, "kv_features": kv},
        "attn_post_proj": {"in_features": q, "out_features": hidden},
        "post_attention_layernorm": {"hidden": hidden},
        "mlp_up_proj": {"in_features": hidden, "out_features": (2 if gated else 1) * f},
        "mlp_act": {"ffn_features": f, "gated": int(gated)},
        "mlp_down_proj": {"in_features": f, "out_features": hidden},
        "add": {"hidden": hidden},
    }
