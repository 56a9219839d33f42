"""Every wrong value a user can put in a config, study or fabric scenario gets one sentence that
names the field as written in the file and says what was expected and what was given: no
pydantic internals (union member labels such as `int` or `literal['all']`, discriminator tags,
`[key]`, "Input should be ...")."""

from __future__ import annotations

import copy
import re
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from dse.space import load_space
from dse.study import StudyConfig, parse_study
from simcore.config import SimConfig, parse_config
from simcore.errors import ConfigError
from simcore.fabric.scenario import Scenario, load_scenario
from simcore.loading import load_yaml

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"

WRONG_VALUES = ("x", -1, 0, 2.5, [1, "a"], {"a": 1}, None, True, [[0, 3]])
"""Values of the wrong type or range for most fields."""

INTERNALS = re.compile(
    r"literal\[|union\[|function-(after|before|wrap|plain)|\[key\]|nullable\[|tagged-union"
    r"|lax-or-strict|json-or-python|is-instance|list\[|tuple\[|dict\[|set\["
    r"|\.(int|float|str|bool|none)(\.|:)"
    r"|Input should|Input tag|Field required|Extra inputs|valid dictionary|instance of"
    r"|type=|pydantic|Value error,|Assertion failed")


def _members(ann: Any) -> list[type[BaseModel]]:
    while typing.get_origin(ann) is typing.Annotated:
        ann = typing.get_args(ann)[0]
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return [ann]
    out: list[type[BaseModel]] = []
    for arg in typing.get_args(ann):
        out.extend(_members(arg))
    return out


def _section_model(ann: Any, value: dict) -> type[BaseModel] | None:
    """The model that validates the mapping `value` of a field annotated `ann` (for a union,
    the member whose fields `value` uses)."""
    for m in _members(ann):
        tag = m.model_fields.get("kind") or m.model_fields.get("type")
        if tag is not None and typing.get_origin(tag.annotation) is typing.Literal:
            key = "kind" if "kind" in m.model_fields else "type"
            if value.get(key) not in typing.get_args(tag.annotation):
                continue
        if set(value) <= set(m.model_fields):
            return m
    return None


def mutations(model: type[BaseModel], data: dict, path: tuple = ()
              ) -> Iterator[tuple[tuple, Any]]:
    """(path, value) for every field of the sections `data` gives, each wrong value, and an
    unknown key in each section."""
    yield path + ("no_such_setting",), 1
    for name, info in model.model_fields.items():
        if name == "base_dir":
            continue
        for wrong in WRONG_VALUES:
            yield path + (name,), wrong
        value = data.get(name)
        items = ([(path + (name,), value)] if isinstance(value, dict) else
                 [(path + (name, 0), value[0])] if isinstance(value, list) and value
                 and isinstance(value[0], dict) else [])
        ann = info.annotation
        if items and isinstance(value, list):
            ann = typing.get_args(_unwrapped(ann))[0]
        for sub_path, sub in items:
            sub_model = _section_model(ann, sub)
            if sub_model is not None:
                yield from mutations(sub_model, sub, sub_path)


def _unwrapped(ann: Any) -> Any:
    while typing.get_origin(ann) is typing.Annotated:
        ann = typing.get_args(ann)[0]
    args = [a for a in typing.get_args(ann) if a is not type(None)]
    if typing.get_origin(ann) in (typing.Union, type(int | None)) and len(args) == 1:
        return args[0]
    return ann


def with_value(data: dict, path: tuple, value: Any) -> dict:
    out = copy.deepcopy(data)
    node: Any = out
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return out


def check_messages(model: type[BaseModel], data: dict, validate: Callable[[dict], Any],
                   source: str) -> int:
    """Validate every mutation of `data`; assert each error is one clean sentence. Returns how
    many mutations were refused."""
    refused = 0
    for path, value in mutations(model, data):
        try:
            validate(with_value(data, path, value))
        except ConfigError as e:
            msg = str(e)
        else:
            continue
        refused += 1
        where = f"{'.'.join(map(str, path))} = {value!r}"
        assert "\n" not in msg, (where, msg)
        assert msg.startswith(f"{source}: "), (where, msg)
        assert not INTERNALS.search(msg), (where, msg)
        assert str(path[0]) in msg, (where, msg)
    return refused


CONFIGS = sorted(EXAMPLES.glob("*.yaml")) + sorted((EXAMPLES / "cluster").glob("*.yaml"))
SCENARIOS = sorted((EXAMPLES / "fabric").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_messages_are_sentences(path):
    data = load_yaml(path)
    refused = check_messages(SimConfig, data, lambda d: parse_config(d, source="config"),
                             "config")
    assert refused > 100


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_fabric_scenario_messages_are_sentences(path):
    data = load_yaml(path)
    refused = check_messages(Scenario, data, lambda d: load_scenario(d), "scenario")
    assert refused > 50


def test_study_messages_are_sentences():
    data = load_yaml(ROOT / "tests" / "data" / "studies" / "tiny.yaml")
    refused = check_messages(StudyConfig, data,
                             lambda d: parse_study(d, source="study", base_dir=ROOT), "study")
    assert refused > 50


@pytest.mark.parametrize("data, message", [
    # The two leaks users reported.
    ({"cluster.fabric.settings.traffic_classes.lossless":
      {"type": "categorical", "choices": [[0, 3], [3]]}},
     "study: space: parameters.cluster.fabric.settings.traffic_classes.lossless.choices: each "
     "choice must be a single number, text, true/false or null (Optuna's categorical parameters "
     "take no lists or mappings), got [0, 3]"),
    ({"engine.max_num_seqs": {"type": "int", "low": "x", "high": 8}},
     "study: space: parameters.engine.max_num_seqs.low: expected a whole number (got 'x')"),
    ({"engine.max_num_seqs": {"type": "integer", "low": 1, "high": 8}},
     "study: space: parameters.engine.max_num_seqs.type: expected one of int, float, "
     "categorical (got 'integer')"),
])
def test_space_messages(data, message):
    with pytest.raises(ConfigError) as e:
        load_space({"parameters": data}, "study: space")
    assert str(e.value) == message


def scenario_error(**changes) -> str:
    data = load_yaml(EXAMPLES / "fabric" / "incast_pfc.yaml")
    for dotted, value in changes.items():
        data = with_value(data, tuple(int(p) if p.isdigit() else p for p in dotted.split("__")),
                          value)
    with pytest.raises(ConfigError) as e:
        load_scenario(data)
    return str(e.value)


def test_the_senders_union_is_one_sentence():
    assert scenario_error(traffic__0__senders="some") == (
        "scenario: traffic[0].senders: expected 'all' or a list (got 'some')")
    assert scenario_error(traffic__0__senders=["h0", 5]) == (
        "scenario: traffic[0].senders[1]: expected text (got 5)")


def test_lossless_classes_name_the_field():
    assert scenario_error(settings__traffic_classes={"lossless": "yes"}) == (
        "scenario: settings.traffic_classes.lossless: expected a list (got 'yes')")
    assert scenario_error(settings__traffic_classes={"lossless": ["a"]}) == (
        "scenario: settings.traffic_classes.lossless[0]: expected a whole number (got 'a')")
    assert scenario_error(settings__lossless=[3]) == (
        "scenario: settings.lossless: is not a setting of settings; it belongs under "
        "settings.traffic_classes: (settings.traffic_classes.lossless)")


@pytest.mark.parametrize("changes, message", [
    ({"engine": {"scheduling_policy": "lifo"}},
     "config: engine.scheduling_policy: expected one of fcfs, priority (got 'lifo')"),
    ({"workload": {"dataset": {"kind": "randm"}}},
     "config: workload.dataset.kind: expected one of random, prefix_repetition, sharegpt, "
     "custom, mooncake, azure, sessions, agent_sessions (got 'randm')"),
    ({"workload": {"dataset": {"input_len": 8}}},
     "config: workload.dataset.kind: is required (one of random, prefix_repetition, sharegpt, "
     "custom, mooncake, azure, sessions, agent_sessions)"),
    ({"workload": {"dataset": {"kind": "random", "input_len": "long"}}},
     "config: workload.dataset.input_len: expected a whole number (got 'long')"),
    # YAML's true and false are not counts (pydantic alone reads them as 1 and 0).
    ({"workload": {"num_prompts": True}},
     "config: workload.num_prompts: expected a whole number (got true)"),
    ({"workload": {"max_concurrency": False}},
     "config: workload.max_concurrency: expected a whole number (got false)"),
    ({"workload": {"dataset": {"kind": "random", "input_len": True}}},
     "config: workload.dataset.input_len: expected a whole number (got true)"),
    ({"workload": {"dataset": {"kind": "sessions", "turns": True}}},
     "config: workload.dataset.turns: expected a whole number or a mapping of settings "
     "(got true)"),
    ({"workload": {"dataset": {"kind": "sessions", "turns": {"mean": True}}}},
     "config: workload.dataset.turns.mean: expected a whole number (got true)"),
    # A count written as a mapping is a LengthRange: its own fields are named (the whole-number
    # member's validator label must not hide the union).
    ({"workload": {"dataset": {"kind": "sessions", "turns": {"mean": -3}}}},
     "config: workload.dataset.turns.mean: must be at least 0 (got -3)"),
    ({"workload": {"dataset": {"kind": "sessions", "turns": {"mean": 3, "typo": 1}}}},
     "config: workload.dataset.turns.typo: is not a known setting (check its spelling and "
     "place in the file)"),
    ({"workload": {"dataset": {"kind": "sessions", "turns": {"range_ratio": 0.5}}}},
     "config: workload.dataset.turns.mean: is required"),
    ({"workload": {"dataset": {"kind": "sessions",
                               "reply_len": {"mean": 3, "range_ratio": 1.5}}}},
     "config: workload.dataset.reply_len.range_ratio: must be less than 1 (got 1.5)"),
    ({"workload": {"dataset": {"kind": "agent_sessions", "first_prompt_len": {"mean": -3}}}},
     "config: workload.dataset.first_prompt_len.mean: must be at least 0 (got -3)"),
    ({"workload": {"dataset": {"kind": "sessions", "turns": -1}}},
     "config: workload.dataset.turns: must be at least 0 (got -1)"),
    ({"workload": {"dataset": {"kind": "sessions", "turns": "x"}}},
     "config: workload.dataset.turns: expected a whole number or a mapping of settings "
     "(got 'x')"),
    # Nor are they counts, seeds or rates anywhere else in the config.
    ({"engine": {"max_num_seqs": True}},
     "config: engine.max_num_seqs: expected a whole number (got true)"),
    ({"engine": {"block_size": True}},
     "config: engine.block_size: expected a whole number (got true)"),
    ({"engine": {"speculative_config": {"method": "ngram", "num_speculative_tokens": True,
                                        "acceptance_rate": 0.5}}},
     "config: engine.speculative_config.num_speculative_tokens: expected a whole number "
     "(got true)"),
    ({"parallelism": {"tensor_parallel_size": True}},
     "config: parallelism.tensor_parallel_size: expected a whole number (got true)"),
    ({"parallelism": {"prefill_decode": {"num_decode_instances": True}}},
     "config: parallelism.prefill_decode.num_decode_instances: expected a whole number "
     "(got true)"),
    ({"seed": True}, "config: seed: expected a whole number (got true)"),
    ({"engine": {"gpu_memory_utilization": True}},
     "config: engine.gpu_memory_utilization: expected a number (got true)"),
    ({"workload": {"dataset": {"kind": "random", "range_ratio": True}}},
     "config: workload.dataset.range_ratio: expected a number (got true)"),
    ({"cluster": {"num_nodes": True}},
     "config: cluster.num_nodes: expected a whole number (got true)"),
    # In the cluster's network, DAG and tenants too (a delay of true was a 1 s link).
    ({"cluster": {"num_nodes": 2, "network": {"topology": {"kind": "leaf_spine",
                                                           "delay_s": True}}}},
     "config: cluster.network.topology.delay_s: expected a number (got true)"),
    ({"cluster": {"num_nodes": 2, "network": {"nic_gbps": True}}},
     "config: cluster.network.nic_gbps: expected a number (got true)"),
    ({"cluster": {"num_nodes": 2, "dag": {"pp_microbatches": True}}},
     "config: cluster.dag.pp_microbatches: expected a whole number (got true)"),
    ({"cluster": {"num_nodes": 2, "dag": {"collectives": {"inter_node_latency_s": True}}}},
     "config: cluster.dag.collectives.inter_node_latency_s: expected a number (got true)"),
    ({"cluster": {"num_nodes": 2, "tenant_traffic": [{"src_gpu": 0, "dst_gpu": True,
                                                      "rate_gbps": 10}]}},
     "config: cluster.tenant_traffic[0].dst_gpu: expected a whole number (got true)"),
    ({"cluster": {"num_nodes": 2, "trace": {"num_steps": True}}},
     "config: cluster.trace.num_steps: expected a whole number (got true)"),
    # Nothing crosses a link between GPUs at TP 1 without PP, EP or a cluster.
    ({"compute": {"kind": "roofline", "roofline": {"interconnect_bandwidth_fraction": 0.5}}},
     "config: compute.roofline.interconnect_bandwidth_fraction: has no effect: with TP 1, PP 1, "
     "no expert parallelism and no cluster nothing crosses a link between GPUs; remove it"),
    # A preset's -FP8 name is its FP8 checkpoint (it was simulated in bf16 by default).
    ({"model": {"name": "Qwen/Qwen3-8B-FP8"}},
     "config: model.dtype: Qwen/Qwen3-8B-FP8 is an FP8 checkpoint, which vLLM loads in fp8; set "
     "dtype fp8 or fp8_block (fp8_block: Qwen3's FP8 checkpoints scale 128x128 blocks), or "
     "name the 16-bit model Qwen/Qwen3-8B"),
    # Async scheduling hides vLLM's measured scheduler time, which host.model constant
    # replaces by a declared overhead: no effect there.
    ({"engine": {"async_scheduling": True}, "host": {"model": "constant"}},
     "config: engine.async_scheduling: has no effect with host.model constant, whose declared "
     "step overhead (compute.roofline.step_overhead_s) no scheduling hides; use host.model vllm, "
     "whose scheduler time async scheduling overlaps with the GPU's"),
    # Cluster settings the rest of the config leaves with no effect.
    ({"cluster": {"num_nodes": 2, "dag": {"pp_microbatches": 4}}},
     "config: cluster.dag.pp_microbatches: has no effect: with pipeline_parallel_size 1 there "
     "are no pipeline stages to split a batch over; remove it"),
    ({"cluster": {"num_nodes": 2, "dag": {"moe_routing": {"popularity": "zipf"}}}},
     "config: cluster.dag.moe_routing: has no effect: the routing of tokens to experts is drawn "
     "only for expert-parallel groups (parallelism.enable_expert_parallel); remove it"),
    ({"cluster": {"num_nodes": 2, "dag": {"collectives": {"all_to_all": "direct"}}}},
     "config: cluster.dag.collectives.all_to_all: has no effect: only expert-parallel groups "
     "(parallelism.enable_expert_parallel) run all-to-alls; remove it"),
    ({"cluster": {"num_nodes": 2, "dag": {"collectives": {"all_reduce": "ring",
                                                          "tree_threshold_bytes": 1024}}}},
     "config: cluster.dag.collectives.tree_threshold_bytes: has no effect: it sets where "
     "all_reduce auto switches from tree to hierarchical; all_reduce is ring; remove it"),
    ({"cluster": {"num_nodes": 2, "network": {"storage_nic_gbps": 100}}},
     "config: cluster.network.storage_nic_gbps: has no effect: there are no storage servers "
     "(network.num_storage_nodes 0); remove it"),
    ({"cluster": {"num_nodes": 1, "network": {"topology": {"kind": "leaf_spine",
                                                           "num_spines": 4}}}},
     "config: cluster.network.topology.num_spines: has no effect: a cluster of one node "
     "without storage servers sends nothing over its network (its GPUs talk over NVLink); "
     "remove it"),
    ({"compute": {"kind": "roofline", "roofline": {"gemm_flops_fraction": True}}},
     "config: compute.roofline.gemm_flops_fraction: expected a number (got true)"),
    ({"compute": {"kind": "roofline", "roofline": {"cuda_graph_max_num_tokens": False}}},
     "config: compute.roofline.cuda_graph_max_num_tokens: expected a whole number (got false)"),
    ({"workload": {"request_rate": True}},
     "config: workload.request_rate: expected a number (got true)"),
    ({"workload": {"dataset": {"kind": "sessions", "think_time_s": True}}},
     "config: workload.dataset.think_time_s: expected a number or a mapping of settings "
     "(got true)"),
    ({"workload": {"dataset": {"kind": "agent_sessions", "think_time_s": {"mean_s": False}}}},
     "config: workload.dataset.think_time_s.mean_s: expected a number (got false)"),
    # A number out of its range in a union with a section: the number's own bound, not the
    # union's member labels; infinities as YAML writes them.
    ({"workload": {"dataset": {"kind": "sessions", "think_time_s": float("inf")}}},
     "config: workload.dataset.think_time_s: expected a finite number (got .inf)"),
    ({"workload": {"dataset": {"kind": "sessions", "think_time_s": -1}}},
     "config: workload.dataset.think_time_s: must be at least 0 (got -1)"),
    ({"workload": {"dataset": {"kind": "sessions", "think_time_s": "long"}}},
     "config: workload.dataset.think_time_s: expected a number or a mapping of settings "
     "(got 'long')"),
    ({"workload": {"dataset": {"kind": "sessions",
                               "think_time_s": {"mean_s": float("inf")}}}},
     "config: workload.dataset.think_time_s.mean_s: expected a finite number (got .inf)"),
    ({"metrics": {"goodput": {"ttfx": 500}}},
     "config: metrics.goodput: each key must be one of ttft, tpot, e2el (got 'ttfx')"),
    ({"uncertainty": {"percentiles": [5]}},
     "config: uncertainty.percentiles: expected a list of 2 values"),
    ({"model": "llama"}, "config: model: expected a mapping of settings (got 'llama')"),
    ({"engine": {"gpu_memory_utilization": 1.5}},
     "config: engine.gpu_memory_utilization: must be at most 1 (got 1.5)"),
    ({"engine": {"block_size": 24}},
     "config: engine.block_size: expected one of 1, 8, 16, 32, 64, 128 (got 24)"),
    # vLLM's engine arguments given in the wrong place.
    ({"speculative_config": {"method": "ngram", "num_speculative_tokens": 3}},
     "config: speculative_config: is not a setting at the top level; it belongs under engine: "
     "(engine.speculative_config)"),
    ({"enable_lora": True},
     "config: enable_lora: LoRA is not modelled yet (in vLLM it is an engine argument, "
     "`engine.enable_lora`)"),
    ({"max_num_seqs": 64},
     "config: max_num_seqs: is not a setting at the top level; it belongs under engine: "
     "(engine.max_num_seqs)"),
    ({"engine": {"tensor_parallel_size": 2}},
     "config: engine.tensor_parallel_size: is not a setting of engine; it belongs under "
     "parallelism: (parallelism.tensor_parallel_size)"),
    ({"engine": {"max_model_len": 4096}},
     "config: engine.max_model_len: is not a setting of engine; it belongs under model: "
     "(model.max_model_len)"),
    ({"engine.max_num_seqs": 64},
     "config: engine.max_num_seqs: is not a known setting; a dotted path is only understood in "
     "a study's space and fidelity overrides, so nest it here (engine: {max_num_seqs: ...})"),
    ({"engine": {"max_num_seq": 64}},
     "config: engine.max_num_seq: is not a known setting (check its spelling and place in the "
     "file)"),
])
def test_config_sentences(changes, message):
    with pytest.raises(ConfigError) as e:
        parse_config(_quickstart_with(changes))
    assert str(e.value) == message


def _quickstart_with(changes: dict) -> dict:
    """The quickstart config with each top-level key of `changes` set (a section's mapping
    merged into the section)."""
    data = load_yaml(EXAMPLES / "quickstart.yaml")
    for key, value in changes.items():
        data[key] = value if not isinstance(value, dict) or not isinstance(data.get(key), dict) \
            else {**data[key], **value}
    return data


@pytest.mark.parametrize("changes, read", [
    ({"engine": {"max_num_seqs": "64"}}, lambda c: c.engine.max_num_seqs == 64),
    ({"seed": 7.0}, lambda c: c.seed == 7),
    ({"workload": {"request_rate": "inf"}}, lambda c: c.workload.request_rate == float("inf")),
    ({"workload": {"request_rate": 5}}, lambda c: c.workload.request_rate == 5.0),
    ({"workload": {"request_rate": "2.5"}}, lambda c: c.workload.request_rate == 2.5),
])
def test_numbers_refusing_true_and_false_read_numbers_as_before(changes, read):
    assert read(parse_config(_quickstart_with(changes)))


@pytest.mark.parametrize("changes, message", [
    # vLLM loads the weights before it takes num_gpu_blocks_override: 405B on one H100 ran.
    ({"model": {"name": "meta-llama/Llama-3.1-405B"}, "hardware": {"gpu": "H100-SXM"},
      "engine": {"num_gpu_blocks_override": 100000}},
     "parallelism.tensor_parallel_size: model weights of meta-llama/Llama-3.1-405B need"),
    # Expert parallelism over one GPU is no expert parallelism in vLLM.
    ({"model": {"name": "Qwen/Qwen3-30B-A3B"}, "hardware": {"gpu": "H100-SXM"},
      "parallelism": {"enable_expert_parallel": True}},
     "parallelism.enable_expert_parallel: has no effect on one GPU (TP 1, DP 1)"),
    # The kernel profile measures the all-reduces: the bandwidth reached nothing.
    ({"hardware": {"gpu": "H100-SXM", "interconnect_bandwidth_bytes_per_s": 1.0e9},
      "parallelism": {"tensor_parallel_size": 2}},
     "hardware.interconnect_bandwidth_bytes_per_s: the H100-SXM kernel profile times the TP "
     "all-reduces as measured"),
    # Only the shipped cost measurements are cost files (another JSON was a KeyError).
    ({"host": {"cpu_costs": "chat_template"}},
     "host.cpu_costs: no measured CPU costs 'chat_template' (shipped: "),
])
def test_start_up_checks_that_used_to_pass_name_the_field(changes, message):
    from simcore.setup import build_deployment

    with pytest.raises(ConfigError, match=re.escape(message)):
        build_deployment(parse_config(_quickstart_with(changes)))
