"""The calibrated step model: profile curves where measured, the roofline elsewhere, said so; and
what a calibrated run reports (status, provenance, a narrower envelope)."""

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from simcore.calibration.ops import layer_op_shapes
from simcore.calibration.profile import shipped_profile
from simcore.compute.base import StepShape
from simcore.compute.calibrated import CalibratedModel, resolve_profile
from simcore.compute.expert_parallel import ExpertParallelRoofline
from simcore.compute.roofline import OP_CLASSES, RooflineModel
from simcore.config import parse_config
from simcore.errors import ConfigError
from simcore.hardware import get_gpu
from simcore.model.presets import load_preset
from simcore.reference_data import VIDUR_DIR
from simcore.simulate import simulate
from simcore.uncertainty import simulate_with_envelope

ROOT = Path(__file__).resolve().parent.parent
A100 = get_gpu("A100-80GB")
SHAPES = [StepShape.from_requests([(1, 700)] * 48), StepShape.from_requests([(1500, 0)]),
          StepShape.from_requests([(256, 2000), (1, 90)])]

BASE = {
    "name": "calibrated", "seed": 5,
    "model": {"name": "meta-llama/Llama-3.1-8B"}, "hardware": {"gpu": "A100-80GB"},
    "compute": {"kind": "calibrated", "profile": "a100-vidur"},
    "workload": {"num_prompts": 80, "request_rate": 12,
                 "dataset": {"kind": "random", "input_len": 600, "output_len": 60,
                             "range_ratio": 0.3}},
}


def cfg(**sections):
    d = copy.deepcopy(BASE)
    for k, v in sections.items():
        if v is None:
            d.pop(k, None)
        else:
            d[k] = v
    return parse_config(d)


def test_measured_ops_are_the_profile_curves_summed_over_layers():
    arch = load_preset("llama-3.1-70b")
    p = shipped_profile("a100-vidur")
    m = CalibratedModel(arch, A100, profile=p, tp=4)
    sh = layer_op_shapes(hidden=arch.hidden_size, num_heads=arch.num_attention_heads,
                         num_kv_heads=arch.num_kv_heads, ffn=arch.intermediate_size,
                         vocab=arch.vocab_size, tp=4)
    L = arch.num_layers
    for shape in SHAPES:
        t = shape.num_tokens
        by_op: dict[str, float] = {}
        m.op_bounds(shape, by_op=by_op)
        mlp = L * (p.op_time_s("mlp_up_proj", t, **sh["mlp_up_proj"])
                   + p.op_time_s("mlp_down_proj", t, **sh["mlp_down_proj"]))
        assert by_op["mlp"] == pytest.approx(mlp, rel=1e-12)
        ew = L * sum(p.op_time_s(op, t, **sh[op]) for op in (
            "input_layernorm", "post_attention_layernorm", "attn_rope", "add", "mlp_act"))
        ew += p.op_time_s("emb", t, **sh["emb"])
        assert by_op["elementwise"] == pytest.approx(ew, rel=1e-12)
        ar = (2 * L + 1) * p.collective_time_s("all_reduce", t * arch.hidden_size * 2, 4, 4)
        roof = RooflineModel(arch, A100, tp=4)
        gather = shape.num_seqs * roof._gather_s_per_row + roof._gather_latency_s
        assert m.comm_s(shape) == pytest.approx(ar + gather, rel=1e-12)
        # The attention kernel and LM head stay the roofline's.
        ref: dict[str, float] = {}
        roof.op_bounds(shape, by_op=ref)
        assert by_op["lm_head"] == ref["lm_head"]


def test_calibrated_and_uncalibrated_status_bounds_and_fallbacks():
    arch = load_preset("llama-3.1-8b")
    m = CalibratedModel(arch, A100, profile=shipped_profile("a100-vidur"))
    assert m.calibrated and m.profile_id == "a100-vidur"
    assert m.profile_version.startswith("v1+sha256:")
    b = m.op_error_bounds()
    assert set(b) == set(OP_CLASSES)
    assert b["gemm"] < 0.15 and b["elementwise"] < 0.15 and b["attention"] == 0.35
    assert 0.05 < m.relative_uncertainty < 0.35
    assert any("attention kernel" in f for f in m.fallbacks())
    assert not any("GEMM" in f for f in m.fallbacks())      # Llama-3-8B shapes were measured
    # On H100 the 8B MLP shapes were never measured: the generic GEMM model, said so.
    h = CalibratedModel(arch, get_gpu("H100-SXM"), profile=shipped_profile("h100-vidur"))
    assert any("mlp_up_proj" in f and "generic" in f for f in h.fallbacks())
    assert h.op_error_bounds()["gemm"] > b["gemm"]


def test_op_scale_scales_the_measured_ops_too():
    arch = load_preset("llama-3.1-70b")
    p = shipped_profile("a100-vidur")
    base = CalibratedModel(arch, A100, profile=p, tp=4)
    scaled = CalibratedModel(arch, A100, profile=p, tp=4, op_scale=dict.fromkeys(OP_CLASSES, 1.3))
    for shape in SHAPES:
        assert scaled.step_time(shape).total_s == pytest.approx(
            1.3 * base.step_time(shape).total_s, rel=1e-12)


def test_expert_parallel_group_over_a_calibrated_rank_model():
    arch = load_preset("qwen3-235b-a22b")
    gpu = get_gpu("H100-SXM")
    rank = CalibratedModel(arch, gpu, profile=shipped_profile("h100-vidur"), tp=1,
                           sequence_parallel_moe=False)
    ep = ExpertParallelRoofline(arch, gpu, tp=1, dp=8, rank_model=rank)
    assert ep.calibrated and ep.profile_id == "h100-vidur"
    assert any("experts: roofline" in f for f in ep.rank_model.fallbacks())
    st = ep.step_time_group([SHAPES[0]] * 8)
    assert st.total_s > 0 and st.all_to_all_s > 0


@pytest.mark.parametrize("sections,msg", [
    ({"hardware": {"gpu": "MI300X"}, "compute": {"kind": "calibrated"}},
     "no shipped calibration profile for MI300X"),
    ({"compute": {"kind": "calibrated", "profile": "h100-vidur"}},
     "measured on H100-SXM, not on the configured A100-80GB"),
    ({"compute": {"kind": "calibrated", "profile": "b200-nothing"}},
     "unknown calibration profile 'b200-nothing'"),
    ({"compute": {"kind": "calibrated", "profile": "missing/profile.json"}},
     "compute.profile: .*no such profile file"),
    ({"model": {"name": "meta-llama/Llama-3.1-8B", "dtype": "fp8"}}, "16-bit GEMMs"),
])
def test_bad_calibrated_settings_are_one_clear_error(sections, msg):
    with pytest.raises(ConfigError, match=msg):
        simulate(cfg(**sections))


def test_profile_without_calibrated_kind_is_refused():
    with pytest.raises(ConfigError, match="profile: only used with kind: calibrated"):
        cfg(compute={"kind": "roofline", "profile": "a100-vidur"})


def test_a_profile_file_path_resolves_against_the_config(tmp_path):
    shipped_profile("a100-vidur").save(tmp_path / "mine.json")
    p = resolve_profile("mine.json", A100, base_dir=tmp_path)
    assert p.profile_id == "a100-vidur"


def test_calibrated_run_reports_status_provenance_and_a_narrower_envelope():
    # The bounding runs of each (a calibrated run's default envelope is the calibrated one).
    cal = simulate_with_envelope(cfg(uncertainty={"method": "bounds"}))
    unc = simulate_with_envelope(cfg(compute={"kind": "roofline"}))
    pc, pu = cal["provenance"], unc["provenance"]
    assert pc["calibrated"] is True and pu["calibrated"] is False
    assert pc["compute_profile"] == "a100-vidur" and pc["profile_version"].startswith("v1+")
    assert pu["profile_version"] == "reference"
    assert any("attention kernel" in f for f in pc["reference_fallbacks"])
    assert pc["seeds"]["workload"] == 5
    assert 0.3 < pc["measured_share_of_step_time"] < 1 and pu["measured_share_of_step_time"] == 0
    assert "of a reference step measured" in pc["profile_label"]
    assert cal["envelope"]["calibrated"] is True and unc["envelope"]["calibrated"] is False
    for key in ("mean_tpot_ms", "p99_ttft_ms", "output_throughput"):
        ec, eu = cal["envelope"]["metrics"][key], unc["envelope"]["metrics"][key]
        width_c = (ec["high"] - ec["low"]) / ec["nominal"]
        width_u = (eu["high"] - eu["low"]) / eu["nominal"]
        assert 0 < width_c < width_u, key


@pytest.mark.slow
def test_one_node_cluster_reproduces_the_calibrated_engine_model():
    # Cluster steps keep the declared per-step CPU overhead: compare with the engine's.
    plain = simulate(cfg(host={"model": "constant"}))
    clustered = simulate(cfg(host={"model": "constant"},
                             cluster={"num_nodes": 1, "fabric": {"backend": "analytical"}}))
    for key in ("mean_ttft_ms", "mean_tpot_ms", "p99_tpot_ms", "num_steps", "duration"):
        assert clustered[key] == pytest.approx(plain[key], rel=1e-9), key
    assert clustered["provenance"]["calibrated"] is True


def _dse(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "dse.cli", *args], capture_output=True,
                          text=True, cwd=cwd)


@pytest.mark.slow
def test_cli_prints_calibrated_or_uncalibrated_with_the_envelope(tmp_path):
    import yaml

    d = copy.deepcopy(BASE)
    (tmp_path / "cal.yaml").write_text(yaml.safe_dump(d))
    d["compute"] = {"kind": "roofline"}
    (tmp_path / "ref.yaml").write_text(yaml.safe_dump(d))
    r = _dse("simulate", str(tmp_path / "cal.yaml"), "--quiet", "--out",
             str(tmp_path / "cal.json"))
    assert r.returncode == 0, r.stderr
    assert "Envelope" in r.stdout and "calibrated; a split-conformal interval" in r.stdout
    assert "UNCALIBRATED" not in r.stdout
    r = _dse("simulate", str(tmp_path / "ref.yaml"), "--quiet", "--envelope", "first_order")
    assert r.returncode == 0, r.stderr
    assert "UNCALIBRATED (reference profile); first order" in r.stdout
    out = json.loads((tmp_path / "cal.json").read_text())
    assert out["envelope"]["metrics"]["mean_tpot_ms"]["low"] < out["mean_tpot_ms"]


@pytest.mark.slow
def test_cli_calibrate_fits_and_reports_and_refuses_bad_input(tmp_path):
    shared = VIDUR_DIR / "profiling"
    f = shared / "compute" / "h100" / "meta-llama" / "Llama-2-7b-hf" / "mlp.csv"
    r = _dse("calibrate", str(f), str(shared / "network" / "h100_dgx"),
             "--out", str(tmp_path / "p.json"))
    assert r.returncode == 0, r.stderr
    assert "median" in r.stdout and "attn_pre_proj" in r.stdout and "all_reduce" in r.stdout
    assert json.loads((tmp_path / "p.json").read_text())["format"] == \
        "simcore-calibration-profile"
    bad = tmp_path / "bad" / "h100" / "org" / "m"
    bad.mkdir(parents=True)
    (bad / "mlp.csv").write_text("num_tokens,foo\n1,2\n")
    r = _dse("calibrate", str(bad / "mlp.csv"), "--out", str(tmp_path / "q.json"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "mlp.csv" in r.stderr and r.stderr.count("\n") == 1
    r = _dse("calibrate", str(f))
    assert r.returncode == 2 and "--out is required" in r.stderr


@pytest.mark.parametrize("args, message", [
    # A header without rows, in a compute and in a collective file (tracebacks before).
    (["{header_mlp}", "--out", "{tmp}/p.json"], "mlp.csv: no measurement rows (a header only)"),
    (["{header_ar}", "--out", "{tmp}/p.json"],
     "all_reduce.csv: no measurement rows (a header only)"),
    # A .json.gz is read as a kernel profile, which a fit of measurement files is not.
    (["{mlp}", "--out", "{tmp}/p.json.gz"], "is written as plain JSON"),
    (["{mlp}", "--out", "{tmp}/afile/p.json"], "cannot write the profile"),
    (["{mlp}", "--out", "{tmp}/p.json", "--id", ""], "--id: must not be empty"),
    (["--list", "--holdout", "0.5"], "--list lists the shipped profiles and takes nothing else"),
    (["--from-aiconfigurator", "h100_sxm", "--out", "{tmp}/k.json", "--gpu", "L40S"],
     "--gpu: 'h100_sxm' is measured on the H100-SXM"),
    (["--from-aiconfigurator", "h100_sxm", "--out", "{tmp}/k.json", "--holdout", "0.5"],
     "--holdout has no effect with --from-aiconfigurator"),
])
def test_cli_calibrate_bad_combinations_are_one_error(tmp_path, args, message):
    shared = VIDUR_DIR / "profiling"
    mlp = shared / "compute" / "h100" / "meta-llama" / "Llama-2-7b-hf" / "mlp.csv"
    header_mlp = tmp_path / "h" / "compute" / "h100" / "org" / "m" / "mlp.csv"
    header_mlp.parent.mkdir(parents=True)
    header_mlp.write_text(mlp.read_text().splitlines()[0] + "\n")
    header_ar = tmp_path / "n" / "network" / "h100_dgx" / "all_reduce.csv"
    header_ar.parent.mkdir(parents=True)
    header_ar.write_text((shared / "network" / "h100_dgx" / "all_reduce.csv").read_text()
                         .splitlines()[0] + "\n")
    (tmp_path / "afile").write_text("x")
    filled = [a.format(tmp=tmp_path, mlp=mlp, header_mlp=header_mlp, header_ar=header_ar)
              for a in args]
    r = _dse("calibrate", *filled)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert message in r.stderr and r.stderr.count("\n") == 1
