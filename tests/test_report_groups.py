"""A small, honest Pareto part: indistinguishable configurations grouped, confirmations that
leave their screening envelope flagged with their cause, overlaps as one figure, and every pair
of the front compared over shared draws of the step-time errors."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import pytest

from dse.report_groups import (discrepancies, indistinguishable, overlap_figure, pareto_groups,
                               ranked_pareto)
from dse.report_pairs import (PAIR_DRAWS, SEPARATES, PairMatrix, compare_front, pair_matrix,
                              pairs_figure, pairs_note)
from tests.test_recommend import _study
from tests.test_report import OBJECTIVES, report, storage_url  # noqa: F401 (fixtures)


@pytest.fixture(scope="module")
def study(storage_url, tmp_path_factory):
    return _study(storage_url, tmp_path_factory.mktemp("groups-report"))


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


# --- pairwise comparisons over shared draws ---------------------------------------------------

def test_every_configuration_runs_once_per_draw_under_the_same_draws(report, study, monkeypatch):
    import simcore.simulate as sim

    real, scales = sim.simulate, defaultdict(list)

    def counting(cfg, *, op_scale=None, **kw):
        key = (cfg.engine.max_num_seqs, cfg.parallelism.tensor_parallel_size)
        scales[key].append(op_scale)
        return real(cfg, op_scale=op_scale, **kw)

    monkeypatch.setattr(sim, "simulate", counting)
    configs = report.feasible
    m = pair_matrix(study, report, configs)
    assert m.numbers == tuple(c.number for c in configs) and m.draws == PAIR_DRAWS
    # Once per draw each (not once per pair), and every configuration on the profile saw the
    # very same draws (common random numbers).
    assert len(scales) == len(configs)
    assert all(len(v) == PAIR_DRAWS for v in scales.values())
    first = next(iter(scales.values()))
    assert all(v == first for v in scales.values()) and len({str(s) for s in first}) == PAIR_DRAWS
    assert m.fidelity == "screening"      # not every configuration was confirmed
    for metric in m.metrics:
        for a in m.numbers:
            assert m.p(a, a, metric) == 0.5
            for b in m.numbers:
                assert m.p(a, b, metric) + m.p(b, a, metric) == pytest.approx(1.0)
    data = m.as_dict()
    assert data["configs"] == list(m.numbers) and data["draws"] == PAIR_DRAWS
    assert data["seeds"] == {configs[0].latest.profile: 1} and data["threshold"] == SEPARATES
    assert len(data["p"][OBJECTIVES[0].metric]) == len(configs)


def _front(report, values: dict[int, list[tuple[float, float]]]):
    """The report with a Pareto set of one configuration per key (each a copy of the first
    Pareto configuration, nominal values in key order) and a matrix of the given draws."""
    c = report.pareto[0]
    configs = []
    for k, number in enumerate(values):
        run = replace(c.latest, values=(100.0 + k, 500.0 - k), envelopes={},
                      metrics={**c.latest.metrics, "p99_ttft_ms": 100.0 + k,
                               "output_throughput_per_gpu": 500.0 - k})
        configs.append(replace(c, number=number, screen=run, confirm=None, rank=1))
    names = tuple(o.metric for o in OBJECTIVES)
    pairs = PairMatrix(
        numbers=tuple(values), metrics=names, directions=tuple(o.direction for o in OBJECTIVES),
        draws=len(next(iter(values.values()))), seeds={"p": 1},
        profiles={n: "p" for n in values},
        runs={n: tuple(dict(zip(names, v)) for v in draws) for n, draws in values.items()})
    return replace(report, configurations=tuple(configs), pairs=pairs, noise={})


def test_one_better_under_every_draw_has_chance_one_and_comes_first(report):
    r = _front(report, {
        7001: [(100.0 + k, 500.0) for k in range(PAIR_DRAWS)],
        7002: [(120.0 + k, 450.0) for k in range(PAIR_DRAWS)],
        # Last on its nominal values, but better on both objectives under every draw.
        7003: [(50.0 + k, 900.0) for k in range(PAIR_DRAWS)]})
    assert [c.number for c in r.pareto] == [7001, 7002, 7003]
    for other in (7001, 7002):
        assert r.pairs.beats(7003, other) == {o.metric: 1.0 for o in OBJECTIVES}
        assert r.pairs.beats(other, 7003) == {o.metric: 0.0 for o in OBJECTIVES}
    assert [c.number for c in ranked_pareto(r)] == [7003, 7001, 7002]
    assert [g[0].number for g in pareto_groups(r)] == [7003, 7001, 7002]
    fig = pairs_figure(r.pairs, [c.number for c in ranked_pareto(r)])
    assert len(fig.data) == len(OBJECTIVES) and list(fig.data[0].z[0][1:]) == [1.0, 1.0]
    assert len(fig.layout.updatemenus[0].buttons) == len(OBJECTIVES)


def test_identical_configurations_merge_under_shared_draws(report, study):
    c = report.pareto[0]
    twin = replace(c, number=c.number + 1000)
    m = pair_matrix(study, report, [c, twin])
    assert m.beats(c.number, twin.number) == {o.metric: 0.5 for o in OBJECTIVES}
    r = replace(report, configurations=report.configurations + (twin,), pairs=m)
    (group,) = [g for g in pareto_groups(r) if c in g]
    assert [x.number for x in group] == [c.number, twin.number]


def test_an_objective_separates_only_past_both_the_draws_and_the_seed_spread(report):
    draws = {7001: [(100.0, 500.0)] * 4, 7002: [(101.0, 499.0)] * 4,
             7003: [(100.0 + k % 2 * 10, 500.0) for k in range(4)]}
    r = _front(report, draws)
    a, b, mixed = r.pareto
    # Always better, but within a 5% seed spread on both objectives: one card.
    assert r.pairs.p(7001, 7002, "p99_ttft_ms") == 1.0
    assert r.pairs.gap(7001, 7002, "p99_ttft_ms") == pytest.approx(1 / 101)
    assert indistinguishable(replace(r, noise={o.metric: 0.05 for o in OBJECTIVES}), a, b)
    assert not indistinguishable(r, a, b)
    # The draws do not order 7001 and 7003 on TTFT (two wins and two ties: 75%, not above it)
    # and tie on throughput: one card even without any seed spread.
    assert 1 - SEPARATES <= r.pairs.p(7001, 7003, "p99_ttft_ms") <= SEPARATES
    assert indistinguishable(r, a, mixed)


def test_the_front_past_the_limit_is_left_out_and_said(report, study, monkeypatch):
    import dse.report_pairs as rp

    monkeypatch.setattr(rp, "PAIR_LIMIT", 1)
    m = compare_front(study, report)
    assert m.numbers == (report.pareto[0].number,)
    assert m.left_out == tuple(c.number for c in report.pareto[1:])
    assert pairs_figure(m, m.numbers) is None
    note = pairs_note(m, {}, OBJECTIVES[0].metric)
    n = len(report.pareto) - 1
    assert f"{n} Pareto configuration{'s' if n > 1 else ''} past the first 1" in note
    assert "only grouped by the seed-to-seed spread" in note


def test_with_two_confirmed_the_matrix_compares_the_confirmed_front(study, report, monkeypatch):
    """Two or more confirmed Pareto configurations: the matrix holds those (at the fidelity
    the recommendation is judged at) and names the unconfirmed ones as left out."""
    from dataclasses import replace

    import dse.report_pairs as rp

    donor = next(c for c in report.configurations if c.confirmed)
    pareto = [replace(c, confirm=donor.confirm) if i < 2 else replace(c, confirm=None)
              for i, c in enumerate(report.pareto)]
    if len(pareto) < 3:
        pareto.append(replace(report.pareto[0], number=9999, confirm=None))
    seen = {}

    def fake(study, report, configs, draws=PAIR_DRAWS, *, left_out=()):
        seen.update(configs=[c.number for c in configs], left_out=list(left_out))

    monkeypatch.setattr(rp, "pair_matrix", fake)
    monkeypatch.setattr(type(report), "pareto", property(lambda self: pareto))
    rp.compare_front(study, report)
    assert seen["configs"] == [c.number for c in pareto[:2]]
    assert seen["left_out"] == [c.number for c in pareto[2:]]
