"""A small, honest Pareto part: indistinguishable configurations grouped, confirmations that
leave their screening envelope flagged with their cause, overlaps as one figure."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dse.report import build_report
from dse.report_groups import discrepancies, indistinguishable, overlap_figure, pareto_groups
from tests.test_report import CONSTRAINTS, OBJECTIVES, make_study


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('groups') / 'study.db'}"
    make_study(url)
    return build_report(url, "unit", OBJECTIVES, CONSTRAINTS)


def test_groups_partition_the_pareto_set_into_indistinguishable_ones(report):
    groups = pareto_groups(report)
    members = [c.number for g in groups for c in g]
    assert sorted(members) == sorted(c.number for c in report.pareto)
    for g in groups:
        assert all(indistinguishable(report, g[0], c) for c in g[1:])
    heads = [g[0] for g in groups]
    for i, a in enumerate(heads):
        # A later head was not put in an earlier group: it is told apart from its head.
        assert all(not indistinguishable(report, b, a) for b in heads[:i])


def test_identical_envelopes_merge_and_far_apart_ones_do_not(report):
    c = report.pareto[0]
    twin = replace(c, number=c.number + 1000)
    m = c.latest
    far_run = replace(m, metrics={k: v * 100 for k, v in m.metrics.items()},
                      values=tuple(v * 100 for v in m.values))
    far = replace(c, number=c.number + 2000, screen=far_run, confirm=None)
    assert indistinguishable(report, c, twin)
    assert not indistinguishable(report, c, far)


def _confirmed(report):
    return next(c for c in report.configurations if c.confirmed)


def test_a_confirmation_beyond_the_screening_envelope_is_flagged_with_its_cause(report):
    c = _confirmed(report)
    assert c.number not in discrepancies(report)
    metric = OBJECTIVES[0].metric
    m = dict(c.confirm.metrics)
    m[metric] = c.screen.value_of(metric) * 3
    s = dict(c.screen.metrics, queue_growth_rps=5.0, offered_request_rate=20.0)
    moved = replace(c, confirm=replace(c.confirm, metrics=m), screen=replace(c.screen, metrics=s))
    configs = tuple(moved if x is c else x for x in report.configurations)
    flags = discrepancies(replace(report, configurations=configs))[c.number]
    assert flags[0].startswith(f"{metric} at the confirmation is 3x its screening value")
    assert "screened at or over capacity (its queue grew 5 req/s of 20 offered)" in flags[0]
    # Without a growing queue the cause is the runs' different length.
    calm = replace(moved, screen=replace(c.screen, metrics=dict(c.screen.metrics,
                                                                queue_growth_rps=0.0)))
    configs = tuple(calm if x is c else x for x in report.configurations)
    flags = discrepancies(replace(report, configurations=configs))[c.number]
    assert "the two runs differ in length and requests" in flags[0]


def test_overlaps_are_one_heatmap(report):
    fig = overlap_figure(report)
    n = len(report.pareto)
    if n < 2:
        assert fig is None
        return
    z = fig.data[0].z
    assert len(z) == n and all(len(row) == n for row in z)
    assert all(z[i][i] is None for i in range(n))
    assert all(0 <= z[i][j] <= len(OBJECTIVES) for i in range(n) for j in range(n) if i != j)


def _scaled(c, f: float, number: int, profile: str | None = None):
    m = c.latest
    run = replace(m, metrics={k: v * f for k, v in m.metrics.items()},
                  values=tuple(v * f for v in m.values), envelopes={},
                  profile=profile if profile is not None else m.profile)
    return replace(c, number=number, screen=run, confirm=None)


def test_same_profile_is_compared_paired_within_the_seed_spread(report):
    c = _scaled(report.pareto[0], 1.0, 5000)
    noisy = replace(report, noise={o.metric: 0.2 for o in OBJECTIVES})
    assert indistinguishable(noisy, c, _scaled(c, 1.1, 5001))      # within 20% on both
    assert not indistinguishable(noisy, c, _scaled(c, 1.5, 5002))  # 50% apart
    # Without a measured spread, any difference on a shared profile tells them apart.
    assert not indistinguishable(report, c, _scaled(c, 1.1, 5003))
    # On another profile the errors are independent: the +/-35% envelopes overlap at 1.1x.
    assert indistinguishable(report, c, _scaled(c, 1.1, 5004, profile="other/profile"))
