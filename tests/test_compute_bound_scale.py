"""`compute.compute_bound_scale`: a calibrated model's compute-bound ops take that much longer
(sustained against boost clocks), its memory-bound ops none; the default is the fitted value,
inside its published bound; it is refused where the roofline times every op."""

import copy

import pytest

from simcore.compute.base import StepShape
from simcore.config import parse_config
from simcore.errors import ConfigError
from simcore.host import fitted_compute
from simcore.setup import build_deployment

BASE = {"model": {"name": "meta-llama/Llama-3.1-8B"}, "hardware": {"gpu": "H100-SXM"},
        "host": {"model": "constant"},
        "workload": {"num_prompts": 4, "dataset": {"kind": "random", "input_len": 64,
                                                   "output_len": 8}}}


def model(**compute):
    d = copy.deepcopy(BASE)
    d["compute"] = {"kind": "calibrated", **compute}
    return build_deployment(parse_config(d)).step_model


PREFILL = StepShape.from_requests([(8192, 0)])          # compute-bound throughout
DECODE = StepShape.from_requests([(1, 500)])             # weight reads: memory-bound


@pytest.mark.parametrize("scale", [1.1, 1.25])
def test_compute_bound_ops_scale_and_memory_bound_ones_do_not(scale):
    one = model(compute_bound_scale=1.0)
    scaled = model(compute_bound_scale=scale)
    cb, mb = one.op_bounds(PREFILL)
    cb_s, mb_s = scaled.op_bounds(PREFILL)
    assert cb > 10 * mb > 0
    assert cb_s == pytest.approx(scale * cb, rel=1e-12)
    assert mb_s == mb
    assert scaled.op_bounds(DECODE)[1] == one.op_bounds(DECODE)[1] > 0
    assert scaled.step_time(DECODE).total_s == pytest.approx(one.step_time(DECODE).total_s,
                                                             rel=0.01)
    # The per-op split the step DAGs use adds up to the scaled bounds.
    by_op: dict[str, float] = {}
    assert sum(scaled.op_bounds(PREFILL, by_op=by_op)) == pytest.approx(sum(by_op.values()),
                                                                       rel=1e-12)


def test_the_default_is_the_fitted_value_inside_its_bound_and_says_so():
    fitted = fitted_compute("compute_bound_scale")
    assert 1.0 <= fitted <= 1.25
    default = model()
    assert default._cscale == fitted
    lines = " ".join(default.assumption_lines())
    assert ("compute.compute_bound_scale" in lines) == (fitted != 1.0)


def test_it_is_refused_where_the_roofline_times_every_op():
    d = copy.deepcopy(BASE)
    d["compute"] = {"kind": "roofline", "compute_bound_scale": 1.1}
    with pytest.raises(ConfigError, match="compute.compute_bound_scale"):
        parse_config(d)
    d["compute"] = {"compute_bound_scale": 1.1}          # auto: L4 has no kernel profile
    d["hardware"] = {"gpu": "L4"}
    d["model"] = {"name": "meta-llama/Llama-3.1-8B", "max_model_len": 4096}
    with pytest.raises(ConfigError, match=r"^compute\.compute_bound_scale: no kernel profile"):
        build_deployment(parse_config(d))
