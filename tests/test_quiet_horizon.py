"""What a quiet run may pass (`simcore.serve.horizon`): the kinds of event and the horizon they
leave an engine, a request's send cutting the run of the engine it goes to
(`simcore.serve.quiet.QuietRun.cut`), a run's last step spanning a hand-off, and whole runs
across the API server's path held to single steps."""

from __future__ import annotations

import pytest
import simpy

from simcore.serve.horizon import (ArrivalTimeout, DeferredTimeout, HandOff, InertTimeout,
                                   horizon, span_horizon)
from simcore.serve.quiet import QuietLeap
from tests.test_quiet_steps import (KvStep, _decoding_scheduler, counted, run,  # noqa: F401
                                    snapshot, specs)


def test_horizon_passes_inert_timeouts_only():
    env = simpy.Environment()
    for d in (0.5, 0.1, 0.3, 0.2, 0.05):
        InertTimeout(env, d)
    assert horizon(env, False) == float("inf")
    assert horizon(env, True) == 0.05
    env.timeout(0.4)
    InertTimeout(env, 0.01)
    env.timeout(0.25)
    assert horizon(env, False) == 0.25
    assert horizon(env, True) == 0.01


def test_horizon_counts_a_deferred_timeout_at_its_effect():
    """A step on a request's way to an engine (the client's send, the API server's tokenizer
    and event loop) changes no scheduler before the path's latency has passed."""
    env = simpy.Environment()
    DeferredTimeout(env, 0.1, 0.25)
    InertTimeout(env, 0.05)
    assert horizon(env, False) == 0.25
    assert horizon(env, True) == 0.05
    env.timeout(0.3)
    DeferredTimeout(env, 0.2, 0.22)
    assert horizon(env, False) == 0.22
    env.timeout(0.15)
    assert horizon(env, False) == 0.15


def test_horizon_passes_arrivals_and_other_engines_server_work():
    """A quiet run passes a client's arrival (the send cuts the run of the engine it routes the
    request to) and the API server's work on requests bound for other engines."""
    env = simpy.Environment()
    ArrivalTimeout(env, 0.1, 0.15)
    assert horizon(env, False) == horizon(env, False, 0) == float("inf")
    assert horizon(env, True) == 0.1
    bound = {1: 1}
    DeferredTimeout(env, 0.2, 0.3, bound)
    assert horizon(env, False, 0) == float("inf")
    assert horizon(env, False, 1) == horizon(env, False) == 0.3
    bound[1] = 0                             # its request left the server process
    bound[0] = 1                             # another, bound for engine 0, is on it
    assert horizon(env, False, 1) == float("inf") and horizon(env, False, 0) == 0.3
    DeferredTimeout(env, 0.25, 0.28)         # no `bound`: every engine's
    assert horizon(env, False, 1) == 0.28
    assert span_horizon(env) == float("inf")


def test_a_cut_keeps_the_steps_that_end_before_the_request_can_arrive():
    """`QuietRun.cut` keeps the steps that end before `reach_s` and the step running now, moves
    the loop's wait to the last one's end exactly, and drops the run's finishing; a cut past
    the run changes nothing."""
    woke = []

    def planned():
        s = _decoding_scheduler(6, 10_000, 3)
        env = simpy.Environment()
        got = QuietLeap(env, s, KvStep().step_time, lambda: False).plan(0.0)
        assert len(got.ends_s) > 10 and got.finished

        def loop():
            got.wait = InertTimeout(env, got.delay_s)
            yield got.wait
            woke.append(env.now)

        env.process(loop())
        return env, got, list(got.ends_s)

    def sender(env, got, at_s, reach_s, made_s=None):
        yield env.timeout(at_s)
        got.cut(env, reach_s, False, made_s)

    env, got, ends = planned()
    env.process(sender(env, got, (ends[2] + ends[3]) / 2, ends[-1] + 1.0))   # past the run
    at = (ends[4] + ends[5]) / 2
    env.process(sender(env, got, at, ends[6]))   # steps 1-6 end before ends[6]; 6 runs now
    env.run()
    assert woke == [ends[5]] and got.ends_s == ends[:6] and got.num_steps == 6
    assert len(got.times) == 6 and got.finished == [] and got.span_s is None
    # The step running now is kept though it ends past `reach_s`: it began before.
    woke.clear()
    env, got, ends = planned()
    at = (ends[1] + ends[2]) / 2
    env.process(sender(env, got, at, at + 1e-9))
    env.run()
    assert woke == [ends[2]] and got.num_steps == 3
    # A step ending at the very instant of the send is the last kept.
    woke.clear()
    env, got, ends = planned()
    env.process(sender(env, got, ends[3], ends[3] + 1e-9))
    env.run()
    assert woke == [ends[3]] and got.num_steps == 4
    # ... where the event that sends the request was made before that step began (single
    # stepping made the step's timeout after it, so the send came first) ...
    woke.clear()
    env, got, ends = planned()
    env.process(sender(env, got, ends[3], ends[3] + 1e-9, ends[2] / 2))
    env.run()
    assert woke == [ends[3]] and got.num_steps == 4
    # ... but where it was made while that step ran, single stepping ended the step first and
    # began the next, which is then the one running.
    woke.clear()
    env, got, ends = planned()
    env.process(sender(env, got, ends[3], ends[3] + 1e-9, (ends[2] + ends[3]) / 2))
    env.run()
    assert woke == [ends[4]] and got.num_steps == 5


def test_a_cut_on_the_api_server_s_path_keeps_the_step_begun_before_the_request_can_arrive():
    """With `span` (the request's way only hands it on), `QuietRun.cut` also keeps the step
    that begins before `reach_s`, as the run's spanning step: the loop waits for the steps
    before it, then for it from its start, as single stepping does. Where that is the run's
    last step its requests still finish with it, unless an event is queued at its very end."""
    step = KvStep().step_time
    woke = []

    def planned(whole=False):
        s = _decoding_scheduler(6, 10_000, 3)
        env = simpy.Environment()
        got = QuietLeap(env, s, step, lambda: False).plan(0.0)
        assert len(got.ends_s) > 10 and got.finished
        # A planned run waits for its last step from that step's start.
        assert got.span_s == got.times[-1].total_s
        assert got.start_s + got.delay_s == got.ends_s[-2]
        if whole:               # one wait for every step (where no exact split is found)
            got.span_s, got.delay_s = None, got.ends_s[-1] - got.start_s
            assert got.start_s + got.delay_s == got.ends_s[-1]

        def loop():             # as `EngineLoop._single` waits for a run
            got.wait = InertTimeout(env, got.delay_s)
            yield got.wait
            got.wait = None
            woke.append(env.now)
            if got.span_s is not None:
                yield InertTimeout(env, got.span_s)
                woke.append(env.now)

        env.process(loop())
        return env, got, list(got.ends_s), list(got.times)

    def sender(env, got, at_s, reach_s):
        yield env.timeout(at_s)
        got.cut(env, reach_s, True)

    env, got, ends, times = planned()
    at = (ends[4] + ends[5]) / 2
    env.process(sender(env, got, at, (ends[6] + ends[7]) / 2))
    env.run()
    # Steps 0-6 end before reach_s; step 7 begins before it: kept, waited for from its start.
    assert got.ends_s == ends[:8] and got.span_s == times[7].total_s
    assert woke == [ends[6], ends[7]] and got.finished == []
    # The running step already ends past reach_s: no step after it is kept.
    woke.clear()
    env, got, ends, times = planned()
    at = (ends[1] + ends[2]) / 2
    env.process(sender(env, got, at, at + 1e-9))
    env.run()
    assert woke == [ends[2]] and got.num_steps == 3 and got.span_s is None
    # The step begun before reach_s is the run's last: where the run already waits for it from
    # its start, or waits for the whole run at once (then it becomes the spanning step), the
    # run stands and its requests finish with it ...
    for whole in (False, True):
        woke.clear()
        env, got, ends, times = planned(whole)
        finished = list(got.finished)
        assert finished
        env.process(sender(env, got, ends[2], (ends[-2] + ends[-1]) / 2))
        env.run()
        assert got.ends_s == ends and got.finished == finished
        assert got.span_s == times[-1].total_s and woke == [ends[-2], ends[-1]]
    # ... unless, waited for as a whole, another event is due at its very end: then it is left
    # to single stepping.
    woke.clear()
    env, got, ends, times = planned(whole=True)
    env.timeout(ends[-1])
    env.process(sender(env, got, ends[2], (ends[-2] + ends[-1]) / 2))
    env.run()
    assert got.ends_s == ends[:-1] and got.finished == [] and got.span_s is None
    assert woke == [ends[-2]]
    # A cut past the run's end changes nothing.
    woke.clear()
    env, got, ends, times = planned()
    env.process(sender(env, got, ends[2], ends[-1] + 1.0))
    env.run()
    assert got.ends_s == ends and got.span_s == times[-1].total_s
    assert woke == [ends[-2], ends[-1]]


def test_an_event_made_during_a_run_at_its_wait_comes_first_where_single_stepping_puts_it():
    """An event made during a run that falls due at the very instant the run's wait does
    (`QuietRun.yield_to`): where the step ending then begins after the event is made, single
    stepping makes that step's timeout later, so the event comes first; where the step is
    already running, the step comes first."""
    from simcore.serve.quiet import _exact_delay

    for made, first in ((lambda e: e[-4] / 2, "event"), (lambda e: (e[-3] + e[-2]) / 2, "run")):
        s = _decoding_scheduler(6, 10_000, 3)
        env = simpy.Environment()
        got = QuietLeap(env, s, KvStep().step_time, lambda: False).plan(0.0)
        ends = list(got.ends_s)
        order = []

        def loop(got=got, env=env, order=order):
            got.wait = InertTimeout(env, got.delay_s)
            yield got.wait
            order.append("run")

        def client(at_s, got=got, env=env, order=order, due=ends[-2]):
            yield env.timeout(at_s)
            event = env.timeout(_exact_delay(env.now, due))
            got.yield_to(env, due)
            yield event
            order.append("event")

        env.process(loop())
        env.process(client(made(ends)))
        env.run()
        assert order[0] == first and len(order) == 2


@pytest.mark.parametrize("seed,n,rate,shared,grid,replicas,router,latency_s,report_s,sample_s,"
                         "servers", [
                             (872, 80, 15.0, True, 128, 3, "round_robin", 5 / 512, 0.05, 2 ** -6, 1),
                             (192, 80, 40.0, False, 512, 2, "round_robin", 5 / 512, 2 ** -4,
                              0.013, 2),
                             (498, 160, 40.0, True, 512, 4, "round_robin", 2 ** -7, 2 ** -5,
                              0.013, 2),
                             (442, 160, 6.0, True, 128, 3, "prefix_affinity", 5 / 512,
                              2 ** -4, 0.013, 1),
                             (442, 160, 6.0, True, 128, 3, "cache_aware", 5 / 512,
                              2 ** -4, 0.013, 1),
                             (498, 160, 40.0, True, 512, 4, "cache_aware", 2 ** -7, 2 ** -5,
                              0.013, 2),
                             # Ties two events deep: a send at a step's end whose arrival was
                             # made as that step began (406, 429), an arrival made as the step
                             # the run's wait ends with began (416).
                             (406, 160, 40.0, True, 512, 4, "round_robin", 2 ** -7, 2 ** -5,
                              0.013, 2),
                             (416, 160, 40.0, True, 512, 4, "least_outstanding", 2 ** -7,
                              2 ** -5, 0.013, 2),
                             (429, 160, 40.0, True, 512, 4, "cache_aware", 2 ** -7, 2 ** -5,
                              0.013, 2),
                         ])
@pytest.mark.parametrize("options", [None, {"balance_abs_threshold": 1,
                                            "balance_rel_threshold": 1.0}])
def test_runs_match_single_steps_at_exact_ties(seed, n, rate, shared, grid, replicas, router,
                                               latency_s, report_s, sample_s, servers, options):
    """Dyadic step times, arrivals on a dyadic grid and a path of latency alone: arrivals,
    hand-offs and step ends meet at the very same instants, where SimPy orders events by when
    each was made. Quiet runs make their waits as single stepping makes its steps' timeouts
    (the last step's at its start; a wait made again after an arrival made during the run for
    its instant; the step running at a send at a step's end), so nothing changes."""
    import dataclasses

    import simcore.serve.loop as loop
    from simcore.engine.scheduler import SchedulerConfig
    from simcore.serve import run_serving
    from tests.test_quiet_steps import DyadicStep

    reqs = [dataclasses.replace(r, arrival_s=round(r.arrival_s * grid) / grid)
            for r in specs(seed, n, rate=rate, shared=shared)]

    def go(leaps):
        old = loop.QUIET_LEAPS
        loop.QUIET_LEAPS = leaps
        try:
            return run_serving(list(reqs), sched_config=SchedulerConfig(
                max_num_seqs=32, max_num_batched_tokens=512, num_blocks=800, block_size=16,
                max_model_len=1024), num_replicas=replicas, step_model=DyadicStep(),
                router_policy=router, report_interval_s=report_s, balance_threshold=4,
                max_concurrency=None, max_model_len=1024, sample_interval_s=sample_s,
                request_latency_s=latency_s, api_servers=servers,
                router_options=options if router == "cache_aware" else None)
        finally:
            loop.QUIET_LEAPS = old

    if options is not None and router != "cache_aware":
        pytest.skip("router_options are cache_aware's")
    assert snapshot(go(True)) == snapshot(go(False))


def test_span_horizon_passes_what_only_hands_requests_on():
    """A request's send and its steps on the API server's path (deferred) and its hand-off to
    an engine pass; anything else stops a run's spanning step."""
    env = simpy.Environment()
    HandOff(env, 0.1, 1)
    DeferredTimeout(env, 0.05, 0.2)
    InertTimeout(env, 0.01)
    assert horizon(env, False) == 0.1
    # A hand-off to engine 1 changes no other engine's scheduler: their runs pass it.
    assert horizon(env, False, 1) == 0.1 and horizon(env, False, 0) == 0.2
    assert span_horizon(env) == float("inf")
    env.timeout(0.3)
    assert span_horizon(env) == 0.3
    env.timeout(0.02)
    assert span_horizon(env) == horizon(env, False) == 0.02


def test_a_run_may_end_with_a_step_spanning_a_hand_off():
    """A hand-off only adds its request to a waiting queue, which a step batched before it does
    not read: the run takes the step it falls in, waiting for it from the step's start."""
    s = _decoding_scheduler(6, 10_000, 3)
    env = simpy.Environment()
    HandOff(env, 0.05, 0)
    got = QuietLeap(env, s, KvStep().step_time, lambda: False).plan(0.0)
    assert got.ends_s[-2] < 0.05 < got.ends_s[-1]
    assert got.span_s == KvStep().step_time(got.shapes[-1]).total_s
    assert got.start_s + got.delay_s == got.ends_s[-2]
    assert got.ends_s[-2] + got.span_s == got.ends_s[-1]
    env.timeout(got.ends_s[-1])              # e.g. a client's timeout as the step ends
    cut = QuietLeap(env, s, KvStep().step_time, lambda: False).plan(0.0)
    assert cut.ends_s == got.ends_s[:-1]
    # Its last step, which ends before the hand-off, is still waited for from its start.
    assert cut.span_s == cut.times[-1].total_s
    assert cut.start_s + cut.delay_s == cut.ends_s[-2]
    held = QuietLeap(env, s, KvStep().step_time, lambda: True).plan(0.0)
    assert held.ends_s[-1] < got.ends_s[-1] and held.span_s == held.times[-1].total_s


def test_runs_spanning_hand_offs_match_single_steps(counted):
    """On the API server's path the runs pass arrivals; a request sent to an engine cuts its
    run to the steps that end before the request can reach it and the one running; nothing
    changes."""
    reqs = specs(5, 200, rate=5.0, shared=True)
    single = run(reqs, False, replicas=2, router="least_outstanding", server=True)
    assert counted["spans"] == counted["cuts"] == 0
    leapt = run(reqs, True, replicas=2, router="least_outstanding", server=True)
    assert counted["cuts"] > 20, counted
    assert snapshot(leapt) == snapshot(single)


def test_a_request_s_path_work_defers_its_effect():
    """A request reaches its engine no sooner than its tokenizing, its work on the event loop
    and the path's latency after it arrives: its arrival, and its tokenizing's end, count that
    much later (a hair earlier, against rounding)."""
    from simcore.serve.api_server import ApiServerPath, ServerProcess, arrival

    path = ApiServerPath(request_cpu_s=lambda p: 1e-3 + 1e-6 * p, latency_s=0.01,
                         tokenize_s=lambda p: 2e-6 * p)
    assert path.least_s(1000) == pytest.approx(2e-3 + 2e-3)
    env = simpy.Environment()
    first = arrival(env, 0.5, 0.01, 4, path.least_s(1000))
    assert type(first) is ArrivalTimeout
    assert 0.514 - 1e-8 < first.effect_s < 0.514
    assert type(arrival(env, 0.5, 0.01, 1)) is DeferredTimeout
    assert arrival(env, 0.5, 0.01, 1).effect_s == 0.51
    process = ServerProcess(env, 0.01)
    process.enter(2)
    process.tokenizer.add(0.002, lambda end: None, 0.003)
    (tokenized,) = [e[3] for e in env._queue if getattr(e[3], "bound", None) is process.bound]
    assert 0.015 - 1e-8 < tokenized.effect_s < 0.015
    assert horizon(env, False, 2) == tokenized.effect_s
    assert horizon(env, False, 1) == 0.51        # engine 1 has no request on the process


def test_runs_cross_the_api_server_path_s_steps(counted, monkeypatch):
    """With 30 ms of path latency the runs reach past a request's send and its server work to
    its arrival at the engine, so more steps are taken together than when every step of the
    path ends a run (as a plain timeout does); the results are the same."""
    import simcore.serve.api_server as api_server
    import simcore.serve.frontend as frontend

    reqs = specs(11, 200, rate=5.0, shared=False)
    deferred = run(reqs, True, replicas=1, server=True, latency_s=0.03)
    steps = counted["steps"]
    plain = lambda env, delay, defer_s, *_: env.timeout(delay)
    monkeypatch.setattr(api_server, "deferred", plain)
    monkeypatch.setattr(frontend, "arrival", plain)
    counted["steps"] = 0
    cut = run(reqs, True, replicas=1, server=True, latency_s=0.03)
    assert snapshot(cut) == snapshot(deferred)
    total = sum(x.num_steps for x in cut.schedulers)
    assert total - steps < 0.8 * (total - counted["steps"]), (total, steps, counted["steps"])
