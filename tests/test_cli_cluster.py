"""`dse simulate` on a cluster (its summary block and --trace) and `dse replay`, as a user runs
them: output, written files, exit codes and one-line errors."""

import json

import pytest
import yaml
from click.testing import CliRunner

from dse.cli import main
from simcore.engine.conformance import read_steps
from simcore.reference_data import CONFORMANCE_DIR

BASIC = CONFORMANCE_DIR / "scenarios" / "basic.json.gz"
BASIC_GOLDEN = CONFORMANCE_DIR / "golden" / "basic.jsonl.gz"

SMALL = {
    "name": "small-cluster", "seed": 1,
    "model": {"name": "meta-llama/Llama-3.1-8B"}, "hardware": {"gpu": "H100-SXM"},
    "parallelism": {"tensor_parallel_size": 8, "pipeline_parallel_size": 2},
    "workload": {"num_prompts": 20, "request_rate": 50,
                 "dataset": {"kind": "random", "input_len": 128, "output_len": 16}},
}


def write_config(path, *, cluster=None, **over):
    cfg = {**SMALL, **over}
    if cluster is not None:
        cfg["cluster"] = cluster
    path.write_text(yaml.safe_dump(cfg))
    return path


def dse(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def assert_one_line_error(r, *words):
    assert r.exit_code == 2, (r.exit_code, r.output)
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    d = tmp_path_factory.mktemp("cluster")
    cfg = write_config(d / "c.yaml", cluster={"num_nodes": 2, "fabric": {"backend": "flow"},
                                              "trace": {"first_step": 3, "num_steps": 2}})
    r = dse("simulate", cfg, "--quiet", "--out", d / "r.json", "--trace", d / "t.json")
    return r, d


def test_simulate_writes_the_trace_apart_from_the_result(traced):
    r, d = traced
    assert r.exit_code == 0, r.output
    assert f"trace written to {d / 't.json'}" in r.stdout
    assert f"result written to {d / 'r.json'}" in r.stdout
    result = json.loads((d / "r.json").read_text())
    assert "trace" not in result and result["cluster"]["num_nodes"] == 2
    trace = json.loads((d / "t.json").read_text())
    assert trace["displayTimeUnit"] == "ms"
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert spans
    for e in spans:
        assert {"ts", "dur", "pid", "tid", "name"} <= e.keys() and e["dur"] >= 0
    assert {e["args"]["step"] for e in spans} == {3, 4}


def test_simulate_prints_the_cluster_block(traced):
    r, d = traced
    c = json.loads((d / "r.json").read_text())["cluster"]
    text = r.stdout
    summary_end = text.index("Serving Benchmark Result")
    block = text[text.index("Cluster (flow fabric)"):]
    assert text.index("Cluster (flow fabric)") > summary_end
    assert f"{c['network_share_of_step_time']:.1%}" in block
    assert f"{c['fabric_share_of_step_time']:.1%}" in block
    assert f"{c['network_share_of_request_latency']:.1%}" in block
    for label in ("Network share of step time:", "Exposed communication", "pp_send/fabric:",
                  "ECN marks / CNPs:", "DCQCN rate cuts:", "PFC pause frames:",
                  "Drops / retransmits:", "FCT slowdown by message size"):
        assert label in block, label
    for b in c["fabric"]["slowdown_by_size"]:
        assert any(ln.startswith(b["size"]) and ln.split()[1] == str(b["num"])
                   for ln in block.splitlines())


CONGESTED = {
    "num_nodes": 2, "network": {"nic_gbps": 100}, "fabric": {"backend": "packet"},
    "tenant_traffic": [{"src_gpu": 1, "dst_gpu": 2, "rate_gbps": 90,
                        "message_bytes": 4_000_000, "stop_s": 0.02}],
}
"""TP 2 x PP 2 on two nodes of two GPUs: each step's pipeline hop goes from NIC 0 of node 0 to
NIC 0 of node 1 through rail switch 0. For the first 20 ms a tenant sends into that same NIC
from the other rail, through a spine: the two meet at the switch's egress queue, which marks,
and DCQCN cuts. The hops are a small part of a step, so the congestion is a small share of the
step time, below what one decimal of a percentage shows."""


def test_the_printed_congestion_agrees_with_the_fabric_counters(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", cluster=CONGESTED,
                       hardware={"gpu": "H100-SXM", "gpus_per_node": 2},
                       parallelism={"tensor_parallel_size": 2, "pipeline_parallel_size": 2},
                       workload={"num_prompts": 20, "request_rate": 100,
                                 "dataset": {"kind": "random", "input_len": 512,
                                             "output_len": 64}},
                       # No API server path: the first steps fall inside the tenant's 20 ms.
                       host={"model": "constant"},
                       # The roofline's steps, against which the congestion's share was sized.
                       compute={"kind": "roofline"})
    r = dse("simulate", cfg, "--quiet", "--out", tmp_path / "r.json")
    assert r.exit_code == 0, r.output
    c = json.loads((tmp_path / "r.json").read_text())["cluster"]
    f = c["fabric"]
    assert f["ecn_marks"] > 0 and f["dcqcn_rate_cuts"] > 0
    assert max(b["slowdown_max"] for b in f["slowdown_by_size"]) > 1.5
    assert 0 < c["congestion_share_of_step_time"] < 0.0005
    block = r.stdout[r.stdout.index("Cluster (packet fabric)"):]
    rows = {ln[:44].strip(): ln[44:].strip() for ln in block.splitlines() if len(ln) > 44}
    # Every printed congestion figure is non-zero, as the counters are.
    congestion = [v for k, v in rows.items() if "congestion" in k or "above ideal" in k]
    assert congestion and all(v.rstrip("%") and float(v.rstrip("%")) > 0 for v in congestion)
    assert rows["fabric wait above ideal (congestion):"] == (
        f"{c['congestion_share_of_step_time'] * 100:.2g}%")
    share = c["congestion_share_of_step_time"] / c["fabric_share_of_step_time"]
    assert c["congestion_share_of_fabric_time"] == pytest.approx(share, rel=1e-9)
    assert rows["as a share of the fabric time:"] == f"{share:.1%}"
    slowed = rows["Step messages slowed >1.1x:"]
    assert slowed == f"{f['num_step_messages_slowed']} of {f['num_step_messages']}"
    assert f["num_step_messages_slowed"] > 0


def test_simulate_without_a_cluster_prints_no_cluster_block(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", parallelism={"tensor_parallel_size": 1})
    r = dse("simulate", cfg, "--quiet")
    assert r.exit_code == 0, r.output
    assert "Cluster (" not in r.stdout


@pytest.mark.parametrize("cluster, words", [
    ({"num_nodes": 2}, ["c.yaml", "--trace needs a trace window", "cluster.trace.num_steps"]),
    (None, ["c.yaml", "--trace needs a cluster section"]),
])
def test_simulate_trace_without_a_window_is_one_error_line(tmp_path, cluster, words):
    par = {} if cluster else {"parallelism": {"tensor_parallel_size": 1}}
    cfg = write_config(tmp_path / "c.yaml", cluster=cluster, **par)
    r = dse("simulate", cfg, "--quiet", "--trace", tmp_path / "t.json")
    assert_one_line_error(r, *words)
    assert r.stdout == "" and not (tmp_path / "t.json").exists()


def test_a_trace_window_past_the_runs_steps_is_said_to_hold_none(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", cluster={"num_nodes": 2,
                                                     "trace": {"first_step": 100000,
                                                               "num_steps": 5}})
    r = dse("simulate", cfg, "--quiet", "--trace", tmp_path / "t.json")
    assert r.exit_code == 0, r.output
    assert ("note: the trace window (cluster.trace: 5 steps from step 100000) holds none of "
            "the run's steps; the trace written has no event") in r.stderr
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"] == []


def test_the_result_and_the_trace_in_one_file_are_refused(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", cluster={"num_nodes": 2, "trace": {"num_steps": 1}})
    r = dse("simulate", cfg, "--quiet", "--out", tmp_path / "x.json", "--trace",
            tmp_path / "x.json")
    assert_one_line_error(r, "--out and --trace are both", "written over the trace")


# -- dse replay ----------------------------------------------------------------------------------


def test_replay_prints_and_writes_json(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", cluster={"num_nodes": 2,
                                                     "trace": {"num_steps": 1}})
    out, trace = tmp_path / "r.json", tmp_path / "t.json"
    r = dse("replay", BASIC_GOLDEN, "--config", cfg, "--out", out, "--trace", trace)
    assert r.exit_code == 0, r.output
    res = json.loads(out.read_text())
    assert "trace" not in res
    assert res["num_steps"] == len(read_steps(BASIC_GOLDEN)) == len(res["step_times_s"])
    assert res["cluster"]["fabric"]["payload_bytes"] > 0
    text = r.stdout
    assert "Step-log replay (simulated)" in text and "Cluster (analytical fabric)" in text
    assert f"{res['mean_step_s'] * 1e3:.2f}" in text and f"{res['p99_step_s'] * 1e3:.2f}" in text
    line = next(ln for ln in text.splitlines() if ln.startswith("Steps in the log:"))
    assert line.split()[-1] == str(res["num_steps"])
    assert f"result written to {out}" in text and f"trace written to {trace}" in text
    assert any(e["ph"] == "X" for e in json.loads(trace.read_text())["traceEvents"])


def test_replay_reads_what_dse_conformance_writes(tmp_path):
    log = tmp_path / "basic.jsonl"
    assert dse("conformance", BASIC, "--out", log).exit_code == 0
    assert json.loads(log.read_text().splitlines()[0]) == {"format": "scheduler-step-log",
                                                           "version": 1}
    cfg = write_config(tmp_path / "c.yaml", cluster={"num_nodes": 1},
                       parallelism={"tensor_parallel_size": 1})
    a = dse("replay", log, "--config", cfg, "--out", tmp_path / "a.json")
    b = dse("replay", BASIC_GOLDEN, "--config", cfg, "--out", tmp_path / "b.json")
    assert a.exit_code == b.exit_code == 0, a.output + b.output
    ra, rb = (json.loads((tmp_path / f).read_text()) for f in ("a.json", "b.json"))
    assert ra["step_times_s"] == rb["step_times_s"]


def test_replay_bad_input_is_one_error_line(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", cluster={"num_nodes": 2})
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"format": "scheduler-step-log", "version": 9}\n')
    assert_one_line_error(dse("replay", bad, "--config", cfg), "bad.jsonl", "line 1",
                          "version 9")
    bad.write_text('{"step": 0, "scheduled": {"a": 4}}\nnot json\n')
    assert_one_line_error(dse("replay", bad, "--config", cfg), "bad.jsonl", "line 2",
                          "not valid JSON")
    assert_one_line_error(dse("replay", tmp_path / "none.jsonl", "--config", cfg),
                          "none.jsonl", "no such step log")
    assert_one_line_error(dse("replay", BASIC_GOLDEN, "--config", cfg, "--instance", "5"),
                          "c.yaml", "instance 5", "1 engine")
    plain = write_config(tmp_path / "p.yaml", parallelism={"tensor_parallel_size": 1})
    assert_one_line_error(dse("replay", BASIC_GOLDEN, "--config", plain), "p.yaml",
                          "cluster section")
    assert_one_line_error(dse("replay", BASIC_GOLDEN, "--config", tmp_path / "no.yaml"),
                          "no.yaml")
    assert_one_line_error(dse("replay", BASIC_GOLDEN, "--config", cfg, "--trace",
                              tmp_path / "t.json"), "c.yaml", "cluster.trace.num_steps")
