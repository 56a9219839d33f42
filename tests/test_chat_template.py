"""A chat request's prompt reaches the engine rendered by the model's chat template: the
template's tokens are prefilled (its shared leading blocks prefix-cached), while the client's
token counts stay the message text's, as vllm bench serve counts them."""

import json

import pytest

from simcore.config import parse_config
from simcore.errors import ConfigError
from simcore.model.chat_template import PRESET_FORMATS, TEMPLATES_FILE, preset_template_tokens
from simcore.model.presets import preset_names
from simcore.simulate import simulate


def _cfg(model: str, *, endpoint: str = "chat_completions", n: int = 6, rate=0.5,
         input_len: int = 200, output_len: int = 8, tp: int = 1, **model_extra):
    return parse_config({
        "name": "t", "seed": 1, "model": {"name": model, **model_extra},
        "parallelism": {"tensor_parallel_size": tp},
        "hardware": {"gpu": "H100-SXM"}, "uncertainty": {"method": "first_order"},
        "workload": {"num_prompts": n, "request_rate": rate, "endpoint": endpoint,
                     "dataset": {"kind": "random", "input_len": input_len,
                                 "output_len": output_len}}})


def test_the_shipped_formats_cover_their_presets():
    data = json.loads(TEMPLATES_FILE.read_text(encoding="utf-8"))
    assert set(PRESET_FORMATS) <= set(preset_names())
    assert set(PRESET_FORMATS.values()) == set(data["formats"])
    for name, f in data["formats"].items():
        assert f["lead"] >= 0 and f["tail"] >= 0, name
        assert f["tail_range"][0] <= f["tail"] <= f["tail_range"][1], name
        if f.get("derived"):        # from the template's text: which copy, at which commit
            assert f["source"].startswith("derived, not measured") and "jinja at" in f["source"]
        else:
            assert f["texts"] >= 100 and "sha256" in f["source"], name
    # Qwen3's ChatML around a user message: <|im_start|>user\n ... <|im_end|>\n<|im_start|>
    # assistant\n; harmony's system and developer messages fill whole blocks.
    assert (data["formats"]["qwen3"]["lead"], data["formats"]["qwen3"]["tail"]) == (3, 5)
    assert data["formats"]["harmony"]["lead"] > 16


def test_a_harmony_chat_prefills_the_template_and_caches_its_shared_blocks():
    """gpt-oss: 66 tokens before each prompt, 3 after: four full blocks shared by every request,
    cached after the first; the client's counts and throughputs leave the template out."""
    t = preset_template_tokens("openai/gpt-oss-20b")
    n, plen = 6, 200
    chat = simulate(_cfg("openai/gpt-oss-20b", n=n, input_len=plen))
    plain = simulate(_cfg("openai/gpt-oss-20b", endpoint="completions", n=n, input_len=plen))
    assert chat["total_input_tokens"] == plain["total_input_tokens"]
    assert chat["num_prompt_tokens_scheduled"] == chat["total_input_tokens"] + n * t.total
    assert plain["num_prompt_tokens_scheduled"] == plain["total_input_tokens"]
    shared = t.lead // 16 * 16
    assert chat["num_cached_prompt_tokens"] == (n - 1) * shared      # one request at a time
    assert plain["num_cached_prompt_tokens"] == 0
    assert chat["prefix_cache_hit_rate"] == pytest.approx(
        (n - 1) * shared / chat["num_prompt_tokens_scheduled"])
    assert chat["mean_ttft_ms"] > plain["mean_ttft_ms"]
    lines = chat["provenance"]["assumptions"]
    assert any(f"adds {t.lead} tokens before each prompt (the same in every request, "
               f"{shared} of them in whole blocks" in line for line in lines)


def test_a_qwen3_chat_adds_its_tokens_to_every_prefill_without_cache_hits():
    n = 4
    r = simulate(_cfg("Qwen/Qwen3-8B", n=n))
    assert r["num_prompt_tokens_scheduled"] == r["total_input_tokens"] + 8 * n
    assert r["num_cached_prompt_tokens"] == 0           # 3 leading tokens fill no block
    assert any("less than a block: none cached" in line
               for line in r["provenance"]["assumptions"])


def test_llama_31_chat_prefills_its_system_block_and_caches_its_whole_block():
    """Llama-3.1 Instruct writes BOS and its default system block (knowledge cutoff and date)
    before the user's header: 30 tokens, one whole block cached after the first request; 5 after
    the text. Llama 3's checkpoints, aliases of the same preset, write no system block and are
    left without template counts."""
    t = preset_template_tokens("meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-8B-Instruct")
    assert (t.lead, t.tail) == (30, 5) and t.source.startswith("measured")
    n = 4
    r = simulate(_cfg("meta-llama/Llama-3.1-8B-Instruct", n=n))
    assert r["num_prompt_tokens_scheduled"] == r["total_input_tokens"] + 35 * n
    assert r["num_cached_prompt_tokens"] == (n - 1) * 16
    assert preset_template_tokens("meta-llama/Llama-3.1-70B",
                                  "meta-llama/Llama-3.3-70B-Instruct") == preset_template_tokens(
        "meta-llama/Llama-3.1-70B")
    assert preset_template_tokens("meta-llama/Llama-3.1-8B",
                                  "meta-llama/Meta-Llama-3-8B-Instruct") is None


def test_a_sharegpt_count_already_holds_the_bos_the_template_writes():
    """vllm bench serve counts a ShareGPT prompt with the tokenizer's BOS (the shipped Llama-3
    counts hold it) and a random prompt without; the template writes the BOS again, so a
    ShareGPT chat request reaches the engine 34 tokens longer than counted, a random one 35."""
    n = 4
    share = parse_config({
        "name": "t", "seed": 1, "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
        "hardware": {"gpu": "H100-SXM"}, "uncertainty": {"method": "first_order"},
        "workload": {"num_prompts": n, "request_rate": 0.5, "endpoint": "chat_completions",
                     "dataset": {"kind": "sharegpt", "output_len": 8}}})
    r = simulate(share)
    assert r["num_prompt_tokens_scheduled"] == r["total_input_tokens"] + 34 * n
    assert any("already holds 1 of them (the BOS of a ShareGPT count)" in line
               for line in r["provenance"]["assumptions"])
    rnd = simulate(_cfg("meta-llama/Llama-3.1-8B-Instruct", n=n))
    assert rnd["num_prompt_tokens_scheduled"] == rnd["total_input_tokens"] + 35 * n
    # Another tokenizer's counts (Qwen3's, no BOS), or declared template tokens: nothing held
    other = parse_config({**share.model_dump(mode="json", exclude_unset=True),
                          "workload": {**share.workload.model_dump(mode="json",
                                                                   exclude_unset=True),
                                       "dataset": {"kind": "sharegpt", "output_len": 8,
                                                   "tokenizer": "qwen3"}}})
    o = simulate(other)
    assert o["num_prompt_tokens_scheduled"] == o["total_input_tokens"] + 35 * n


def test_declared_template_tokens_and_models_without_a_measured_template():
    n = 5
    r = simulate(_cfg("meta-llama/Meta-Llama-3-8B-Instruct", n=n))
    assert r["num_prompt_tokens_scheduled"] == r["total_input_tokens"]
    assert any("no measured chat template for meta-llama/Meta-Llama-3-8B-Instruct" in line
               for line in r["provenance"]["assumptions"])
    d = simulate(_cfg("meta-llama/Llama-3.1-8B", n=n, chat_template_tokens=[40, 5]))
    assert d["num_prompt_tokens_scheduled"] == d["total_input_tokens"] + 45 * n
    assert d["num_cached_prompt_tokens"] == (n - 1) * 32
    assert any("(model.chat_template_tokens)" in line for line in d["provenance"]["assumptions"])


def test_the_server_refuses_a_rendered_prompt_longer_than_max_model_len():
    """vLLM checks the rendered prompt: 4090 + 8 tokens fit 4096 as the client counts them, not
    with the template's 69."""
    r = simulate(_cfg("openai/gpt-oss-20b", n=1, input_len=4080, output_len=8,
                      max_model_len=4096))
    assert r["num_failed"] == 1
    assert "69 of them the chat template's" in next(iter(r["num_failed_by_error"]))


def test_template_tokens_without_effect_are_refused():
    with pytest.raises((ConfigError, ValueError), match="model.chat_template_tokens has no "
                                                         "effect on completions"):
        _cfg("Qwen/Qwen3-8B", endpoint="completions", chat_template_tokens=[3, 5])
    with pytest.raises((ConfigError, ValueError), match="chat_template_tokens"):
        _cfg("Qwen/Qwen3-8B", chat_template_tokens=[3, -1])


def test_sessions_keep_their_own_shared_blocks_behind_the_template():
    """Multi-turn sessions: the template's four shared blocks come first, and each turn still
    finds its conversation's earlier blocks after them (its keys chained behind the template's):
    the chat run hits exactly the completions run's cached tokens plus the template's blocks in
    every turn but the first request's."""
    def run(endpoint):
        return simulate(parse_config({
            "name": "s", "seed": 2, "model": {"name": "openai/gpt-oss-20b"},
            "hardware": {"gpu": "H100-SXM"}, "uncertainty": {"method": "first_order"},
            "workload": {"endpoint": endpoint, "request_rate": 2, "dataset": {
                "kind": "sessions", "num_sessions": 12, "turns": 3, "shared_prefix_len": 100,
                "first_prompt_len": 300, "user_message_len": 60, "reply_len": 40,
                "think_time_s": 2.0}}}))
    plain, chat = run("completions"), run("chat_completions")
    n = chat["num_requests"]
    assert chat["total_input_tokens"] == plain["total_input_tokens"]
    assert chat["num_prompt_tokens_scheduled"] == plain["num_prompt_tokens_scheduled"] + 69 * n
    assert chat["num_cached_prompt_tokens"] == plain["num_cached_prompt_tokens"] + 64 * (n - 1)


def test_glm_chat_requests_prefill_the_derived_template_tokens():
    """GLM-4.5/4.6 (no tokenizer shipped): '[gMASK]<sop><|user|>\\n' before the text and
    '<|assistant|>' after it, 4 and 1 tokens, derived from the template and said so."""
    for model in ("zai-org/GLM-4.6", "zai-org/GLM-4.5-Air-FP8"):
        t = preset_template_tokens(model)
        assert (t.lead, t.tail) == (4, 1) and t.source.startswith("derived")
    n = 4
    chat = simulate(_cfg("zai-org/GLM-4.5-Air", n=n, input_len=128, output_len=4, tp=4))
    assert chat["num_prompt_tokens_scheduled"] == chat["total_input_tokens"] + n * 5
    assert any("adds 4 tokens before each prompt" in line and "derived from its template" in line
               for line in chat["provenance"]["assumptions"])
