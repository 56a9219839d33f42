"""OpenAI's gpt-oss-120b and gpt-oss-20b: the presets against OpenAI's published figures, vLLM's
hybrid KV-cache manager (full-attention and sliding-window groups over one block pool) against
block counts derived by hand from vLLM's rules, the sliding-window step-time view, and runs."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simcore.compute.base import StepShape
from simcore.compute.derived_kernels import MARLIN_FRAMEWORK_ERROR
from simcore.compute.attention_views import windowed_attention
from simcore.config import parse_config
from simcore.engine.hybrid_kv import (GROUP_KEY_BITS, GroupHits, HybridKVCacheManager,
                                      sliding_window_blocks)
from simcore.engine.kv_cache import KVCacheManager
from simcore.engine.request import BlockHashSpace, Request
from simcore.engine.scheduler import Scheduler, SchedulerConfig
from simcore.errors import ConfigError
from simcore.hardware import get_gpu
from simcore.model.memory import kv_cache_groups, kv_cache_num_blocks
from simcore.model.presets import load_preset
from simcore.setup import build_deployment
from simcore.simulate import simulate
from simcore.units import GIB

# OpenAI, "gpt-oss-120b & gpt-oss-20b Model Card" (arXiv:2508.10925, August 2025), Table 1:
# total parameters, active parameters per token and checkpoint size of each model.
PUBLISHED = {
    "openai/gpt-oss-120b": dict(total=116.83e9, active=5.13e9, checkpoint_gib=60.8),
    "openai/gpt-oss-20b": dict(total=20.91e9, active=3.61e9, checkpoint_gib=12.8),
}

W, BS = 128, 16
"""gpt-oss's sliding window and vLLM's default block size."""


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_presets_have_the_published_parameter_counts_and_checkpoint_size(name):
    arch = load_preset(name)
    fig = PUBLISHED[name]
    assert arch.num_params == pytest.approx(fig["total"], rel=5e-4)
    # The model card's active count leaves out the embedding table (a lookup, no arithmetic);
    # the unembedding (LM head) is in it.
    assert arch.num_active_params - arch.embedding_params == pytest.approx(fig["active"],
                                                                           rel=2e-3)
    # MXFP4 experts (4.25 bits per weight: 4-bit values and an e8m0 scale per 32), every other
    # tensor bf16, as the checkpoint stores them.
    assert arch.weight_bytes("mxfp4") / GIB == pytest.approx(fig["checkpoint_gib"], abs=0.05)
    assert arch.weight_bytes("bf16") > 3 * arch.weight_bytes("mxfp4")


def test_the_published_config_reads_as_gpt_oss():
    arch = load_preset("gpt-oss-120b")
    assert (arch.num_layers, arch.hidden_size, arch.num_attention_heads, arch.num_kv_heads,
            arch.head_dim) == (36, 2880, 64, 8, 64)
    assert (arch.num_experts, arch.num_experts_per_tok, arch.moe_intermediate_size) == \
        (128, 4, 2880)
    assert arch.num_moe_layers() == 36 and arch.vocab_size == 201088
    assert arch.qkv_bias and arch.o_bias and arch.router_bias and arch.expert_bias
    assert arch.attention_sinks and arch.sink_params_per_layer() == 64
    # layer_types alternate, sliding window first.
    assert arch.sliding_window == W
    assert arch.sliding_window_layers == tuple(range(0, 36, 2))
    assert load_preset("gpt-oss-20b").sliding_window_layers == tuple(range(0, 24, 2))


def test_experts_alone_are_mxfp4():
    arch = load_preset("gpt-oss-20b")
    experts = sum(g.count * g.in_features * g.out_features
                  for g in arch.mlp_gemms(0) if g.group == "expert") * arch.num_layers
    rest = arch.num_params - experts
    assert arch.weight_bytes("mxfp4") == pytest.approx(experts * 4.25 / 8 + rest * 2, rel=1e-12)


# vLLM's own logs of the weights it loaded ("Model loading took X GiB") for gpt-oss-120b on one
# H100: vLLM 0.10.1 on the Marlin backend (vllm-project/vllm issue 23278, "Model loading took
# 65.9651 GiB"), vLLM 0.14.1 on the Triton backend (vllm-project/vllm issue 33155, "Model loading
# took 64.38 GiB memory").
LOGGED_H100_GIB = {"marlin": 65.9651, "triton": 64.38}


@pytest.mark.parametrize("layout", sorted(LOGGED_H100_GIB))
def test_mxfp4_experts_take_the_memory_vllm_logged_in_its_kernel_layout(layout):
    from simcore.model.arch import MXFP4_MOE_LAYOUTS

    arch = load_preset("gpt-oss-120b")
    padded = arch.stage_weight_bytes("mxfp4", expert_align=MXFP4_MOE_LAYOUTS[layout]) / GIB
    assert padded == pytest.approx(LOGGED_H100_GIB[layout], rel=0.005)
    # The checkpoint's own shapes are 3.6-5 GiB short of either: the padding is not a rounding.
    assert arch.weight_bytes("mxfp4") / GIB < LOGGED_H100_GIB[layout] - 3.5


def test_marlin_pads_the_hidden_size_to_256_and_the_intermediate_per_rank_to_128():
    from simcore.model.arch import MXFP4_MOE_LAYOUTS

    arch = load_preset("gpt-oss-120b")
    h, i, e = 2880, 2880, 128
    for tp in (1, 2, 4):
        ip = -(-(i // tp) // 128) * 128        # 2880 -> 2944; 1440 -> 1536; 720 -> 768
        experts = e * (3072 * 2 * ip + ip * 3072) * 4.25 / 8 + e * (2 * ip + 3072) * 2
        plain = e * (h * 2 * (i // tp) + (i // tp) * h) * 4.25 / 8 + e * (2 * (i // tp) + h) * 2
        got = (arch.stage_weight_bytes("mxfp4", tp, expert_align=MXFP4_MOE_LAYOUTS["marlin"])
               - arch.stage_weight_bytes("mxfp4", tp))
        assert got == pytest.approx(arch.num_layers * (experts - plain), rel=1e-12)


def test_the_layout_follows_the_gpu_and_is_refused_for_other_dtypes():
    def weights(gpu, **model):
        cfg = parse_config({"model": {"name": "openai/gpt-oss-120b", "dtype": "mxfp4",
                                      "max_model_len": 8192, **model},
                            "hardware": {"gpu": gpu}, "compute": {"kind": "roofline"},
                            "engine": {"max_num_seqs": 128},
                            "workload": {"num_prompts": 1}})
        return build_deployment(cfg).memory.weight_bytes / GIB

    assert weights("H100-SXM") == pytest.approx(weights("H100-SXM", mxfp4_moe_layout="triton"))
    assert weights("A100-80GB") == pytest.approx(weights("H100-SXM",
                                                         mxfp4_moe_layout="marlin"))
    assert weights("B200") > weights("A100-80GB") > weights("H100-SXM") > \
        weights("H100-SXM", mxfp4_moe_layout="unpadded")
    with pytest.raises(ConfigError, match="mxfp4_moe_layout"):
        parse_config({"model": {"name": "llama-3.1-8b", "mxfp4_moe_layout": "marlin"},
                      "hardware": {"gpu": "H100-SXM"}, "workload": {"num_prompts": 1}})


def test_layers_form_vllms_kv_cache_groups():
    # 18 full + 18 sliding layers: group size 18, one group of each kind; a block holds
    # 16 tokens of 18 layers.
    assert kv_cache_groups(load_preset("gpt-oss-120b")) == \
        kv_cache_groups(load_preset("gpt-oss-120b"), 1)
    g = kv_cache_groups(load_preset("gpt-oss-120b"))
    assert (g.windows, g.layers_per_block) == ((0, W), (18,))
    assert kv_cache_groups(load_preset("gpt-oss-120b"), 2).layers_per_block == (9, 9)
    g = kv_cache_groups(load_preset("llama-3.1-8b"))
    assert (g.windows, g.layers_per_block) == ((0,), (32,))


def test_kv_capacity_is_about_twice_that_of_full_attention_layers():
    arch = load_preset("gpt-oss-120b")
    full = dataclasses.replace(arch, sliding_window=0, sliding_window_layers=())
    h100 = get_gpu("H100-SXM").memory_bytes
    kw = dict(weight_dtype="mxfp4", max_model_len=32768)
    hybrid, plain = kv_cache_num_blocks(arch, h100, **kw), kv_cache_num_blocks(full, h100, **kw)
    assert hybrid.bytes_per_block * 2 == plain.bytes_per_block
    assert hybrid.num_tokens / plain.num_tokens == pytest.approx(2.0, rel=1e-3)
    # In requests: 4,000-token requests, each prefilled in one step then given its first decode,
    # admitted until the pool is full. Full attention alone (1,999 usable blocks): 250 blocks
    # each, 251 after the decode; a 7th fits (6 x 251 + 250 <= 1999), an 8th not. Hybrid (3,999
    # usable blocks): the prefill takes 250 + 250, the decode one more in each group and frees
    # (4000 - 127) // 16 = 242 sliding ones, 251 + 9 = 260 held; a 14th fits (13 x 260 + 500 <=
    # 3999), a 15th not: twice as many requests.
    blocks = 2000
    counts = []
    for kv in (HybridKVCacheManager(2 * blocks, BS, False, 32768, (0, W), 8192),
               KVCacheManager(blocks, BS, False, 32768)):
        n = 0
        while True:
            r = Request(f"r{n}", n, 4000, 10)
            if not kv.allocate_slots(r, 4000):
                break
            r.num_computed_tokens = 4000
            r.num_output_tokens = 1
            assert kv.allocate_slots(r, 1)      # the first decode frees the window's past
            n += 1
        counts.append(n)
    assert counts == [14, 7]


def _hybrid(num_blocks=2000, caching=True) -> HybridKVCacheManager:
    return HybridKVCacheManager(num_blocks, BS, caching, 32768, (0, W), 8192, BlockHashSpace())


def _real(blocks: list[int]) -> int:
    return sum(1 for b in blocks if b)


def test_a_1000_token_request_holds_the_blocks_vllm_gives_it():
    kv = _hybrid()
    r = Request("a", 0, 1000, 300)
    assert kv.allocate_slots(r, 1000)
    full, sliding = kv.req_blocks["a"]
    # Full attention: ceil(1000 / 16) = 63 blocks.
    assert _real(full) == 63
    # Sliding window, prefill step: vLLM frees out-of-window blocks by the computed tokens
    # before the step (`remove_skipped_blocks(request, num_computed_tokens)` at the top of
    # `allocate_slots`), none yet, so the one-chunk prefill takes ceil(1000 / 16) = 63 too.
    assert _real(sliding) == 63
    r.num_computed_tokens, r.num_output_tokens = 1000, 1
    assert kv.allocate_slots(r, 1)
    full, sliding = kv.req_blocks["a"]
    # Next step, 1000 tokens computed: the next query (position 1000) attends to positions
    # 873..1000, so the first 1000 - 128 + 1 = 873 tokens are skipped, 873 // 16 = 54 whole
    # blocks freed and nulled; the 1001 tokens still need ceil(1001 / 16) = 63 entries, so the
    # group keeps 63 - 54 = 9 blocks (positions 864..1007: the window plus the part of block 54
    # before it). Full attention keeps its 63.
    assert (_real(full), _real(sliding), len(sliding)) == (63, 9, 63)
    assert sliding[:54] == [0] * 54
    assert kv.num_free_blocks == 1999 - 63 - 9


def test_the_sliding_group_frees_blocks_as_the_request_decodes():
    kv = _hybrid()
    r = Request("a", 0, 1000, 500)
    assert kv.allocate_slots(r, 1000)
    r.num_computed_tokens = 1000
    most = 0
    for _ in range(400):
        r.num_output_tokens += 1
        assert kv.allocate_slots(r, 1)
        r.num_computed_tokens += 1
        full, sliding = kv.req_blocks["a"]
        held = _real(full) + _real(sliding)
        assert kv.num_free_blocks + held == 1999                  # blocks conserved
        assert _real(full) == -(-r.num_computed_tokens // BS)
        # Past the window: ceil(127 / 16) = 8 blocks of window before the newest token, one
        # more where the window starts inside a block.
        assert 8 <= _real(sliding) <= 9
        most = max(most, _real(sliding))
    assert most == 9
    # 1,400 tokens: 88 full-attention blocks against 9 sliding-window ones.
    assert _real(kv.req_blocks["a"][0]) == 88
    kv.free(r)
    assert kv.num_free_blocks == 1999


def _cache(kv: HybridKVCacheManager, group: int, blocks: dict[int, int], hashes: list[int]):
    """Blocks `blocks` (free) hold group `group`'s blocks `i` of `hashes`, as if a finished
    request had left them cached: handed out once and freed, then given their hashes."""
    pool = kv.pool
    if pool.fresh < max(blocks.values()) + 1:
        pool.release(pool.allocate(pool.num_free))
    for i, b in blocks.items():
        pool.cache(b, hashes[i] << GROUP_KEY_BITS | group)


@pytest.mark.parametrize("sliding_cached, hit, real", [
    # Searched from the right within the full-attention hit: a run of ceil(127 / 16) = 8 cached
    # blocks (10..17) ends the hit at block 17, the blocks before it null.
    (list(range(4)) + list(range(10, 18)), 18, list(range(10, 18))),
    # No run of 8: the cached blocks from the start (0..3) are the hit, the window reaches them.
    (list(range(4)) + list(range(12, 18)), 4, list(range(4))),
    # The last blocks cached: the hit is the full-attention one (19 blocks; block 19 would hold
    # the last token, never a hit).
    (list(range(11, 19)), 19, list(range(11, 19))),
])
def test_prefix_hits_follow_the_sliding_window_rule(sliding_cached, hit, real):
    kv = _hybrid()
    r = Request("q", 0, 20 * BS, 1, block_keys=tuple(range(1, 21)))
    hashes = r.ensure_block_hashes(kv.space, BS)
    _cache(kv, 0, {i: 100 + i for i in range(20)}, hashes)
    _cache(kv, 1, {i: 200 + i for i in sliding_cached}, hashes)
    got = kv.get_computed_blocks(r)
    assert isinstance(got, GroupHits) and len(got) == hit
    full, sliding = got.groups
    assert full == [100 + i for i in range(hit)]
    assert [i for i, b in enumerate(sliding) if b] == real
    assert len(sliding) == hit
    # Admitted on that hit: the hit blocks leave the free queue, both groups complete the
    # prompt with ceil(320 / 16) - hit new blocks each.
    free = kv.num_free_blocks
    assert kv.allocate_slots(r, 20 * BS - hit * BS, got, True, 0)
    assert kv.num_free_blocks == free - hit - len(real) - 2 * (20 - hit)


def test_a_repeated_prompt_hits_both_groups():
    kv = _hybrid()
    keys = tuple(range(1, 64))
    a = Request("a", 0, 1000, 2, block_keys=keys)
    assert kv.allocate_slots(a, 1000)
    a.num_computed_tokens, a.num_output_tokens = 1000, 1
    assert kv.allocate_slots(a, 1)
    kv.free(a)
    b = Request("b", 1, 1000, 2, block_keys=keys)
    got = kv.get_computed_blocks(b)
    # 999 tokens may hit: 62 blocks; the sliding group's last 8 of them are still cached (its
    # blocks 0..53 left the window, were freed and are cached too, but lie before the window).
    assert len(got) == 62
    assert _real(got.groups[1]) == 8


def test_whole_sequence_admission_caps_the_sliding_group():
    # vLLM's scheduler_reserve_full_isl: a request is admitted only if its whole sequence fits,
    # the sliding-window group counted at most sliding_window_blocks (its window and one chunk).
    cap = sliding_window_blocks(W, BS, 32768, 256)
    assert cap == -(-(127 + 256) // BS) + 1 == 25
    kv = HybridKVCacheManager(1 + 250 + cap, BS, True, 32768, (0, W), 256)
    r = Request("a", 0, 4000, 1)
    assert kv.allocate_slots(r, 256, None, True, 0)
    kv.free(r)
    kv = HybridKVCacheManager(250 + cap, BS, True, 32768, (0, W), 256)
    assert not kv.allocate_slots(r, 256, None, True, 0)


def test_a_model_without_sliding_layers_keeps_the_single_group_manager():
    base = dict(max_num_seqs=8, max_num_batched_tokens=64, num_blocks=40)
    assert type(Scheduler(SchedulerConfig(**base)).kv) is KVCacheManager
    s = Scheduler(SchedulerConfig(**base, kv_cache_groups=(0, W)))
    assert type(s.kv) is HybridKVCacheManager


# The smallest pool vLLM starts with at max_model_len 1000: block 0, one request's 63 blocks of
# full attention and its sliding-window group's admission need (`sliding_window_blocks`, 21).
# A smaller pool can let a request grow past what re-admission needs (vLLM reserves the whole
# sequence when it resumes a preempted request), so it would wait for ever, in vLLM as here.
MIN_POOL = 1 + -(-1000 // BS) + sliding_window_blocks(64, BS, 1000, 256)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 600), st.integers(1, 200), st.integers(0, 3)),
                min_size=1, max_size=12),
       st.integers(MIN_POOL, 400), st.booleans())
def test_blocks_are_conserved_under_any_load(reqs, num_blocks, caching):
    s = Scheduler(SchedulerConfig(max_num_seqs=6, max_num_batched_tokens=256,
                                  num_blocks=num_blocks, max_model_len=1000,
                                  enable_prefix_caching=caching, kv_cache_groups=(0, 64)),
                  BlockHashSpace())
    for i, (prompt, out, prefix) in enumerate(reqs):
        keys = tuple(range(1, 1 + prefix * 4)) + tuple(range(1000 * (i + 1), 1000 * (i + 1) + 40))
        s.add_request(Request(f"r{i}", i, min(prompt, 1000 - out), out, block_keys=keys))
    kv = s.kv
    for _ in range(5000):
        if not s.has_requests:
            break
        s.update(s.schedule())
        held = sum(kv.num_blocks_held(r) for r in s.running)
        # Every running request holds a block of each group for every computed token, its
        # sliding-window group only since the window; shared hit blocks count once in the pool.
        assert kv.num_free_blocks + held >= num_blocks - 1
        for r in s.running:
            full, sliding = kv.req_blocks[r.request_id]
            assert len(full) == len(sliding) >= -(-r.num_computed_tokens // BS)
            assert _real(sliding) <= -(-(64 - 1) // BS) + 1 + -(-256 // BS) + 1
    assert not s.has_requests
    assert kv.num_free_blocks == num_blocks - 1


def test_a_block_count_override_must_hold_one_request_in_every_group():
    """gpt-oss-20b at max_model_len 1024, 16-token blocks and 256-token chunks: a request needs
    64 blocks of full attention and, for its 128-token window, the 127 tokens before its newest
    chunk plus the chunk (383 tokens: 24 blocks) and one block for a window not aligned to a
    block, 25: 89 blocks and the null block."""
    def deploy(num_blocks):
        return build_deployment(parse_config({
            "model": {"name": "openai/gpt-oss-20b", "dtype": "mxfp4", "max_model_len": 1024},
            "hardware": {"gpu": "H100-SXM"},
            "engine": {"num_gpu_blocks_override": num_blocks, "max_num_batched_tokens": 256,
                       "max_num_seqs": 8},
            "workload": {"num_prompts": 1, "dataset": {"kind": "random", "input_len": 10,
                                                       "output_len": 1}}}, source="t"))
    assert deploy(90).num_blocks == 90
    with pytest.raises(ConfigError, match=r"^engine\.num_gpu_blocks_override: 89 blocks .*"
                                          r"\(89 blocks and the null block\)"):
        deploy(89)


def test_the_window_view_of_a_step():
    # One fresh 1000-token prompt: queries 1..128 see 1..128 keys, the other 872 see 128.
    w = windowed_attention(StepShape.from_requests([(1000, 0)]), W)
    assert w.attn_qk_pairs == 128 * 129 / 2 + 872 * 128
    assert w.kv_tokens_read == 1000
    # A chunk of 500 over 3000 computed tokens reads the 127 before it and its own 500.
    w = windowed_attention(StepShape.from_requests([(500, 3000)]), W)
    assert (w.attn_qk_pairs, w.kv_tokens_read) == (500 * 128, 627)
    # Decodes past the window read 128 keys each, within it their context.
    w = windowed_attention(StepShape.from_requests([(1, 900)] * 4), W)
    assert (w.decode_kv_tokens, w.kv_tokens_read, w.attn_qk_pairs) == (512, 512, 512)
    w = windowed_attention(StepShape.from_requests([(1, 50)] * 4), W)
    assert w.decode_kv_tokens == 4 * 51


def test_sliding_layers_make_long_contexts_cheaper():
    arch = load_preset("gpt-oss-20b")
    cfg = {"model": {"name": "openai/gpt-oss-20b", "dtype": "mxfp4"},
           "hardware": {"gpu": "H100-SXM"}, "compute": {"kind": "calibrated"},
           "workload": {"num_prompts": 1, "dataset": {"kind": "random", "input_len": 10,
                                                     "output_len": 1}}}
    model = build_deployment(parse_config(cfg, source="t")).step_model
    full = dataclasses.replace(arch, sliding_window=0, sliding_window_layers=())
    from simcore.compute.kernel_model import KernelModel
    full_model = KernelModel(full, model.gpu, profile=model.profile, weight_dtype="mxfp4",
                             compute_bound_scale=model._cscale)
    for shape in (StepShape.from_requests([(1, 20000)] * 32),
                  StepShape.from_requests([(4096, 8000)])):
        a, b = {}, {}
        model.op_bounds(shape, by_op=a)
        full_model.op_bounds(shape, by_op=b)
        assert a["attention"] < 0.75 * b["attention"]
        assert a["moe"] == b["moe"]
    # Within the window the two agree: the measured window-128 kernel and the full-attention
    # one, at the same lengths, within their measurement noise.
    a, b = {}, {}
    model.op_bounds(StepShape.from_requests([(1, 60)] * 8), by_op=a)
    full_model.op_bounds(StepShape.from_requests([(1, 60)] * 8), by_op=b)
    assert a["attention"] == pytest.approx(b["attention"], rel=0.03)
    # The sliding layers are timed by the profile's window-128 tables, not derived.
    assert not any("sliding-window layers" in p for p in model.assumed_parts())
    assert model.profile.attention_grid("generation", "bf16", 64, 8, 64, 128) is not None


def test_h100_times_the_experts_from_the_mxfp4_moe_table_and_a100_from_marlins():
    def model(gpu):
        cfg = {"model": {"name": "openai/gpt-oss-120b", "dtype": "mxfp4",
                         "max_model_len": 32768},
               "hardware": {"gpu": gpu}, "compute": {"kind": "calibrated"},
               "engine": {"max_num_seqs": 256},
               "workload": {"num_prompts": 1, "dataset": {"kind": "random", "input_len": 10,
                                                         "output_len": 1}}}
        return build_deployment(parse_config(cfg, source="t")).step_model

    h100 = model("H100-SXM")
    assert h100._sources["moe"] == {"measured"}
    assert not any("routed experts" in f for f in h100.fallbacks())
    # A100 runs MXFP4 experts in vLLM's Marlin kernel, measured there only in SGLang and at
    # other models' shapes: the nearest, moved to this one and to 4.25-bit weight reads, with
    # the move's measured error and the frameworks' disagreement as its bound.
    a100 = model("A100-80GB")
    assert a100._sources["moe"] == {"derived"}
    assert not any("routed experts" in f for f in a100.fallbacks())
    [how] = [p for p in a100.assumed_parts() if p.startswith("routed experts")]
    assert "nearest shape of the marlin kernels" in how and "mxfp4 weight reads" in how
    assert "measured in SGLang" in how
    assert a100.op_error_bounds()["moe"] >= MARLIN_FRAMEWORK_ERROR


def test_sink_attention_names_vllms_triton_backend_where_flashattention_2_is_all_measured():
    """vLLM runs gpt-oss's sink attention with FlashAttention 3 on Hopper and with its Triton
    backend on Ampere, where the profile measured only FlashAttention 2: the A100 model says so
    and bounds the part as declared, the H100 model does not."""
    def model(gpu, name="openai/gpt-oss-20b", dtype="mxfp4"):
        cfg = {"model": {"name": name, "dtype": dtype, "max_model_len": 32768},
               "hardware": {"gpu": gpu}, "compute": {"kind": "calibrated"},
               "workload": {"num_prompts": 1, "dataset": {"kind": "random", "input_len": 10,
                                                         "output_len": 1}}}
        return build_deployment(parse_config(cfg, source="t")).step_model

    a100 = model("A100-80GB")
    [attn] = [f for f in a100.fallbacks() if f.startswith("attention kernel")]
    assert "TRITON_ATTN" in attn
    assert a100.op_error_bounds()["attention"] >= 0.35
    for gpu in ("H100-SXM", "B200"):
        m = model(gpu)
        assert not any("TRITON_ATTN" in p for p in m.fallbacks() + m.assumed_parts()), gpu
    # A model without sinks on the same A100 profile runs FlashAttention 2, as measured.
    llama = model("A100-80GB", "meta-llama/Llama-3.1-8B", "bf16")
    assert not any("TRITON_ATTN" in p for p in llama.fallbacks() + llama.assumed_parts())


def test_gpt_oss_20b_serves_on_one_h100():
    cfg = parse_config({
        "name": "gpt-oss-20b-h100", "seed": 0,
        "model": {"name": "openai/gpt-oss-20b", "dtype": "mxfp4"},
        "hardware": {"gpu": "H100-SXM"}, "compute": {"kind": "calibrated"},
        "workload": {"num_prompts": 200, "request_rate": 8,
                     "dataset": {"kind": "random", "input_len": 1000, "output_len": 200}}},
        source="t")
    r = simulate(cfg)
    assert (r["completed"], r["failed"], r["total_preemptions"]) == (200, 0, 0)
    assert r["provenance"]["reference_fallbacks"] == []
    # 8 requests/s of 200 tokens each: the engine keeps up (1,600 tokens/s out over ~25 s) with
    # a small batch; a 1000-token prefill in tens of ms, decode steps of a few ms.
    assert 1300 < r["output_throughput"] < 1700
    assert 10 < r["mean_ttft_ms"] < 200
    assert 3 < r["mean_tpot_ms"] < 20
    # Blocks of 16 tokens x 12 layers: ~150k of them on an 80 GB GPU.
    kv = r["kv_cache"]
    assert kv["memory_breakdown_bytes"]["bytes_per_block"] == 16 * 12 * 2 * 8 * 64 * 2
    assert 0 < r["max_kv_cache_usage"] < 0.05
    # Tokens as vLLM reports them for two groups: the usable blocks shared out over the groups,
    # each token then costing all 24 layers' KV.
    assert kv["num_kv_tokens"] == (kv["num_gpu_blocks"] - 1) // 2 * 16
    assert kv["kv_bytes_per_token_per_gpu"] == 24 * 2 * 8 * 64 * 2


def test_the_gpt_oss_validation_rows_are_accepted():
    from dse.validate_e2e import load_cases

    cases, refused = load_cases()
    # gpt-oss-120b on one H100 does not start at vLLM 0.10-0.11's defaults: the 1,024-sequence
    # sampler run and Marlin's 66 GiB of weights leave no KV cache (vLLM issue 23278 logs
    # -2.14 GiB), so GPUStack's four runs used settings their source does not quote.
    out = {rid: why for rid, why in refused if "gpt-oss" in rid}
    one_h100 = {c.id for c in cases if c.id.startswith("gpustack-gpt-oss-120b-tp1-")
                and "h100" in c.id}
    assert not one_h100
    assert {f"gpustack-gpt-oss-120b-tp1-{x}" for x in (
        "h100sxm-sharegpt", "async-h100sxm-sharegpt", "h100sxm-sharegpt100-conc4",
        "h100sxm-rand4000x200")} <= set(out)
    assert all(rid.startswith("gpustack-gpt-oss-120b-tp1-") and "h100" in rid for rid in out)
    assert all("no memory left for the KV cache" in why for why in out.values())
    ids = [c.id for c in cases if "gpt-oss" in c.id]
    assert len(ids) >= 8
    assert all(c.config["model"]["dtype"] == "mxfp4" for c in cases if "gpt-oss" in c.id)
    # vLLM 0.10-0.11, without triton_kernels: Marlin's layout on every GPU of these rows.
    assert all(c.config["model"]["mxfp4_moe_layout"] == "marlin"
               for c in cases if "gpt-oss" in c.id)


def test_a_layout_for_another_backend_than_the_measured_kernel_is_reported():
    """gpt-oss on H100 in Marlin's layout (vLLM 0.10-0.11 without triton_kernels): the profile
    measured gpt-oss's experts with OpenAI's Triton kernel only, so the Marlin kernels it
    measured on other models time them, moved to gpt-oss's shape, and the result says so. In a
    layout whose backend the profile never measured (FlashInfer on H100), the Triton
    measurement times them and the result says that the layout sets only their padding. In the
    Triton layout nothing is said."""
    def model(layout):
        cfg = {"model": {"name": "openai/gpt-oss-20b", "dtype": "mxfp4",
                         "mxfp4_moe_layout": layout},
               "hardware": {"gpu": "H100-SXM"}, "compute": {"kind": "calibrated"},
               "workload": {"num_prompts": 1, "dataset": {"kind": "random", "input_len": 10,
                                                         "output_len": 1}}}
        return build_deployment(parse_config(cfg, source="t")).step_model

    def parts(m):
        return [p for p in m.assumed_parts() if "mxfp4_moe_layout" in p]

    marlin = model("marlin")
    assert marlin._sources["moe"] == {"derived"}
    [line] = parts(marlin)
    assert "laid out for marlin" in line and "nearest shape of the marlin kernels" in line
    flashinfer = model("flashinfer")
    assert flashinfer._sources["moe"] == {"measured"}
    [line] = parts(flashinfer)
    assert "triton" in line and "'flashinfer'" in line and "padding" in line
    for layout in ("triton", "auto"):
        m = model(layout)
        assert m._sources["moe"] == {"measured"} and parts(m) == []
