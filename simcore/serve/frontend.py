"""The serving front end on the virtual clock: the benchmark client, the API server's path, the
router, and what becomes of each request's record.

`Frontend` sends every request at its arrival time (or when the client's max-concurrency limit
lets it), refuses one longer than `max_model_len`, routes it, passes it through the API server's
path (`simcore.serve.api_server`), adds it to its engine's scheduler, gives it up at the client's
timeout, and records its first scheduling, its tokens and its completion; as a
`StepObserver` of the engine loops it sees each step's admissions and outputs. Given a
`SessionStream` instead of requests, it runs closed-loop sessions: each session's first turn
at its start, each later turn when the previous turn's reply has completed plus the turn's
pause (`simcore.workload.sessions`). `KvHandoff`, another observer, moves KV caches over the
fabric (P/D disaggregation, an external KV tier) through `simcore.cluster.kvpaths.KvPaths`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import simpy

from simcore.engine.request import FINISHED_ABORTED, Request
from simcore.records import RecordStore, RequestRecord
from simcore.token_times import DeliveryLog
from simcore.router import Router
from simcore.serve.api_server import ApiServerPath, ServerProcess, arrival, reach_s
from simcore.serve.loop import Rank
from simcore.serve.observers import StepObserver
from simcore.serve.horizon import HandOff, InertTimeout
from simcore.workload.sessions import (COMPLETED, ENDED_FAILED, ENDED_MAX_CONTEXT, Session,
                                       SessionOutcomes, SessionStream)
from simcore.workload.spec import RequestSpec


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """The benchmark client's limits: concurrency, the per-request timeout, the longest
    request the API server accepts."""

    max_model_len: int
    max_concurrency: int | None = None
    request_timeout_s: float | None = None


class Frontend(StepObserver):
    """Client, API server, router and request records for the engines `ranks`.

    With sessions, `total` starts as the turns the sessions plan and drops by the turns a
    session will no longer send when it ends early; `session_of[i]` is record i's session and
    turn, `outcomes` how the sessions ended, `thinking` the sessions between a reply and their
    next turn.
    """

    __slots__ = ("env", "specs", "ranks", "client", "server", "router", "entry", "prefill_of",
                 "kv", "records", "progress", "total", "done", "all_done", "all_sent",
                 "backlog", "in_flight", "in_server", "servers", "sessions", "session_of",
                 "outcomes", "thinking", "context_limit", "delivery_logs", "defer_s",
                 "entry_index")

    def __init__(self, env: simpy.Environment,
                 specs: Sequence[RequestSpec] | SessionStream, ranks: list[Rank],
                 router: Router, entry: list[int], client: ClientSettings,
                 server: ApiServerPath, kv=None,
                 progress: Callable[[float, int, int], None] | None = None):
        self.env = env
        self.specs = specs
        self.ranks = ranks
        self.client = client
        self.server = server
        self.router = router
        self.entry = entry
        # The router's index of each engine it routes to (cache_aware counts its in-flight
        # requests by it); None where the router counts none.
        self.entry_index = ({r: i for i, r in enumerate(entry)} if router.counts_in_flight
                            else None)
        # With P/D disaggregation the router sees only the prefill instances.
        self.prefill_of = set(entry) if len(entry) < len(ranks) else set()
        self.kv = kv
        self.records = RecordStore()
        self.progress = progress
        self.total = len(specs)
        self.done = 0
        self.all_done = env.event()
        if self.total == 0:
            self.all_done.succeed()
        self.all_sent = False
        self.backlog: deque[tuple[int, RequestSpec]] = deque()   # held by max_concurrency
        self.in_flight = 0
        self.in_server = 0           # sent, still on the API server's path to an engine
        # A request sent goes through the API server's path, whose latency comes after all of
        # its work: no engine hears of it sooner, so the path's steps are `DeferredTimeout`s
        # that a quiet run's horizon counts that much later (for the engines its requests are
        # bound for), and the client's arrivals `ArrivalTimeout`s that it passes (the send cuts
        # the run of the engine the request goes to). Not with a client timeout, whose give-up
        # (a plain event made at the send) may come sooner.
        self.defer_s = (server.latency_s if server.active and client.request_timeout_s is None
                        else 0.0)
        self.servers = [ServerProcess(env, self.defer_s) for _ in range(server.num_servers)]
        self.sessions = specs if isinstance(specs, SessionStream) else None
        self.session_of: list[tuple[Session, int]] = []
        self.outcomes: SessionOutcomes | None = None
        self.thinking = 0
        self.context_limit = client.max_model_len
        self.delivery_logs: dict[int, DeliveryLog] = {}   # per engine, its token-delivery steps
        if self.sessions is not None:
            self.outcomes = SessionOutcomes(num_sessions=len(self.sessions.sessions),
                                            turns_planned=self.total)
            if self.sessions.max_context_tokens is not None:
                self.context_limit = self.sessions.max_context_tokens

    # -- the client ------------------------------------------------------------------------

    def process(self):
        """The benchmark client: one record per request, made as it arrives."""
        env = self.env
        if self.sessions is not None:
            for session in self.sessions.sessions:
                delay = session.start_s - env.now
                if delay > 0:
                    yield env.timeout(delay)
                self.turn(session, 0)
            self.all_sent = True
            return
        limit = self.client.max_concurrency
        defer = self.defer_s
        made_s = None       # when the event that woke the client was made, where known
        made_before_s = None    # when the event that made that one was made
        for idx, spec in enumerate(self.specs):
            self.records.append(RequestRecord(request_id=spec.request_id,
                                              prompt_len=spec.prompt_len,
                                              output_len=spec.output_len,
                                              arrival_s=spec.arrival_s))
            delay = spec.arrival_s - env.now
            if delay > 0:
                # Made now: where an engine's quiet run waits for the very instant of the
                # arrival, the arrival is ordered against the run's steps as single stepping
                # would order it (`QuietRun.yield_to`, and `QuietRun.cut` at the send). A request
                # due at the same instant is sent in the same wake, by the same event.
                made_before_s, made_s = made_s, env.now
                arrived = arrival(env, delay, defer, len(self.entry),
                                  self.server.least_s(spec.prompt_len
                                                      + self.server.template_tokens)
                                  if defer else 0.0)
                for rank in self.ranks:
                    if rank.quiet is not None:
                        rank.quiet.yield_to(env, made_s + delay, made_before_s)
                yield arrived
            if limit is not None and self.in_flight >= limit:
                self.backlog.append((idx, spec))
            else:
                self.send(idx, spec, made_s, made_before_s)
        self.all_sent = True

    def turn(self, session: Session, j: int) -> None:
        """Turn j of `session` arrives at the client: sent (or held by max_concurrency) unless
        its prompt plus reply exceed the client's context limit, which ends the session."""
        t = session.turns[j]
        if t.prompt_len + t.output_len > self.context_limit:
            self.end_session(session, j, ENDED_MAX_CONTEXT)
            return
        env = self.env
        spec = session.spec(j, session.start_s if j == 0 else env.now)
        idx = len(self.records)
        self.records.append(RequestRecord(request_id=spec.request_id, prompt_len=spec.prompt_len,
                                          output_len=spec.output_len, arrival_s=spec.arrival_s))
        self.session_of.append((session, j))
        self.outcomes.turns_sent += 1
        limit = self.client.max_concurrency
        if limit is not None and self.in_flight >= limit:
            self.backlog.append((idx, spec))
        else:
            self.send(idx, spec)

    def end_session(self, session: Session, unsent: int, how: str) -> None:
        """`session` ends with turns `unsent`.. never sent."""
        self.total -= len(session.turns) - unsent
        self.outcomes.end(session.session_id, how)
        if self.done == self.total and not self.all_done.triggered:
            self.all_done.succeed()

    def next_turn(self, idx: int) -> None:
        """Record idx, a turn, is done: its session's next turn arrives after its pause; a
        failed turn or the last one ends the session."""
        session, j = self.session_of[idx]
        if not self.records[idx].success:
            self.end_session(session, j + 1, ENDED_FAILED)
            return
        self.outcomes.turns_completed += 1
        if j + 1 == len(session.turns):
            self.outcomes.end(session.session_id, COMPLETED)
            return
        self.thinking += 1

        def arrive(_) -> None:
            self.thinking -= 1
            self.turn(session, j + 1)

        self.env.timeout(session.turns[j + 1].think_s).callbacks.append(arrive)

    def finish(self, idx: int) -> None:
        if self.entry_index is not None:
            replica = self.records[idx].replica
            if replica is not None:          # None: refused before it was routed
                self.router.release(self.entry_index[replica])
        self.records.done(idx, self.env.now)
        self.done += 1
        self.in_flight -= 1
        if self.sessions is not None:
            self.next_turn(idx)
        if self.progress is not None:
            self.progress(self.env.now, self.done, self.total)
        if self.backlog:
            self.send(*self.backlog.popleft())
        if self.done == self.total and not self.all_done.triggered:
            self.all_done.succeed()

    def send(self, idx: int, spec: RequestSpec, made_s: float | None = None,
             made_before_s: float | None = None) -> None:
        """Send request `idx` now: route it, cut its engine's quiet run, start its way through
        the API server. `made_s`: when the event that sends it was made (the client's arrival
        timeout), where known; `made_before_s`: when the event that made that one was made."""
        env = self.env
        rec = self.records[idx]
        rec.send_s = env.now
        self.in_flight += 1
        max_len = self.client.max_model_len
        server = self.server
        # The prompt the engine sees: rendered by the chat template, where one applies.
        prompt_len = spec.prompt_len + server.template_tokens
        block_keys = (server.template_keys + spec.block_keys if server.template_keys
                      else spec.block_keys)
        if prompt_len + spec.output_len > max_len:
            rec.success = False
            rec.error = (f"prompt ({prompt_len}"
                         + (f", {server.template_tokens} of them the chat template's"
                            if server.template_tokens else "")
                         + f") + output ({spec.output_len}) tokens exceed "
                         f"max_model_len ({max_len})")
            self.finish(idx)
            return
        router = self.router
        r = self.entry[router.route(block_keys, spec.prompt_len, len(server.template_keys))]
        rec.replica = r
        rank = self.ranks[r]
        if server.active:
            tokens = (server.tokenize_s(prompt_len) if server.tokenize_s is not None
                      else 0.0)
            work = (server.request_cpu_s(prompt_len) if server.request_cpu_s is not None
                    else 0.0)
        if rank.quiet is not None:
            # The engine is in a quiet run that the request's arrival did not end: its steps
            # that end before the request can reach the engine (the path's work, then its
            # latency) stand, and the one running now; cut before anything of the path is
            # queued. Where the path only hands the request on (no client timeout, and no
            # engine's output sends a request at once), the step that begins before the request
            # can reach the engine stands too, as the run's spanning step.
            if self.defer_s > 0.0:
                rank.quiet.cut(env, reach_s(env.now, self.defer_s, tokens + work),
                               not self.sends_on_output, made_s, made_before_s)
            else:
                rank.quiet.cut(env, env.now, False, made_s, made_before_s)
        # A prefill instance runs the prompt and samples one token (vLLM P/D: max_tokens 1).
        # A turn of a session also carries the keys of the blocks its reply fills.
        keys = (block_keys + spec.output_block_keys if spec.output_block_keys
                else block_keys)
        req = Request(spec.request_id, idx, prompt_len,
                      1 if r in self.prefill_of else spec.output_len, keys,
                      spec.priority, spec.arrival_s, rec)
        if router.last_hashes is not None:
            # The router already chained this prompt's keyed blocks in the shared hash space.
            req.block_hashes = router.last_hashes
        if server.active:
            # The API server's path on the server process with the fewest requests in progress:
            # its tokenizer thread, its event loop's work (shared with the others there), then
            # the path's latency.
            self.in_server += 1
            sent = env.now
            process = min(self.servers, key=len)
            process.enter(rank.index)

            def arrive(_, rank=rank, req=req) -> None:
                self.in_server -= 1
                if req.status == FINISHED_ABORTED:
                    # The client gave up while the request was on its way (`give_up`): vLLM's
                    # server drops a disconnected client's request before the engine hears of
                    # it. The path's work already done stays done.
                    return
                rank.sched.add_request(req)
                rank.notify()

            def worked(end_s: float, rec=rec) -> None:
                process.leave(rank.index)
                rec.server_wait_s = end_s - sent - tokens - work
                rec.server_s = end_s + server.latency_s - sent
                HandOff(env, server.latency_s, rank.index).callbacks.append(arrive)

            def tokenized(_end_s: float) -> None:
                if server.request_cpu_s is None:
                    worked(env.now)
                else:
                    process.loop.add(work, worked)

            if server.tokenize_s is None:
                tokenized(sent)
            else:
                process.tokenizer.add(tokens, tokenized, work)
        else:
            rank.sched.add_request(req)
            rank.notify()
        if self.client.request_timeout_s is not None:
            env.timeout(self.client.request_timeout_s).callbacks.append(
                lambda _: self.give_up(idx, rec, rank.sched, req))

    def give_up(self, idx: int, rec: RequestRecord, sched, req: Request) -> None:
        """The client's timeout: a request not finished by then is aborted in its engine (vLLM's
        API server aborts it when the client disconnects) and counts as failed."""
        if rec.success or not sched.finish_requests([req]):
            return
        rec.error = (f"client timed out after {self.client.request_timeout_s:g} s "
                     f"(workload.request_timeout_s)")
        rec.finished_s = self.env.now
        rec.num_preemptions += req.num_preemptions
        self.finish(idx)

    # -- engine events ---------------------------------------------------------------------

    def on_admitted(self, rank, requests, now: float) -> None:
        # Only a newly admitted request can be scheduled for the first time.
        for req in requests:
            rec = req.client
            if rec.first_scheduled_s is None:
                rec.first_scheduled_s = now

    def on_outputs(self, rank, emitted, finished, now: float) -> None:
        """A step's sampled tokens reach their clients; finished requests complete (a prompt
        finished on a prefill instance moves on to a decode instance instead)."""
        if rank.index in self.prefill_of:
            for req in finished:
                self.kv.handoff(req, rank)
            return
        if emitted:
            log = self._delivery_log(rank)
            i = len(log.times)
            log.times.append(now)
            for req in emitted:
                req.client.token_times_s.add_step(log, i)
        for req in finished:
            rec = req.client
            rec.success = True
            rec.num_preemptions += req.num_preemptions
            # The local prefix-cache hit; KV loaded from elsewhere (a tier fetch, a P/D
            # handoff) is counted apart, as vLLM's metrics keep the two apart.
            external = req.num_external_tokens
            rec.num_external_prompt_tokens = external
            if not req.remote_prefill_tokens:     # P/D: the prefill instance's hit stands
                rec.num_cached_prompt_tokens = max(req.num_cached_tokens - external, 0)
            self.finish(req.index)

    def _delivery_log(self, rank) -> DeliveryLog:
        log = self.delivery_logs.get(rank.index)
        if log is None:
            log = self.delivery_logs[rank.index] = DeliveryLog()
        return log

    def on_quiet_steps(self, rank, run) -> None:
        """Every request of a quiet run receives a token at the end of each of its steps."""
        if rank.index in self.prefill_of:
            super().on_quiet_steps(rank, run)
            return
        log = self._delivery_log(rank)
        a = len(log.times)
        log.times.extend(run.ends_s)
        b = len(log.times)
        for req in run.requests:
            req.client.token_times_s.add_range(log, a, b)

    @property
    def sends_on_output(self) -> bool:
        """Whether an engine's output may send a request at once (the client holds requests
        back for max concurrency; or, with sessions and several engines, a reply finished on one
        engine starts a pause after which the next turn may reach another), so that no queued
        event is inert for the engines."""
        return bool(self.backlog) or (self.sessions is not None and len(self.ranks) > 1)

    # -- the router's view and the run's health --------------------------------------------

    def reporter(self, interval_s: float):
        """Publish every routed engine's load (running and waiting requests) to the router each
        `interval_s`."""
        scheds = [self.ranks[i].sched for i in self.entry]
        publish_all = self.router.publish_all
        env = self.env
        while True:
            publish_all([len(s.running) + s.num_waiting for s in scheds])
            yield InertTimeout(env, interval_s)

    def check_lost(self) -> None:
        """Raise if every request was sent, none is on its way or waiting for its session's
        pause, every engine is idle, and some never completed."""
        if self.all_sent and not self.backlog and not self.in_server and not self.thinking \
                and not self.all_done.triggered \
                and not any(rank.sched.has_requests for rank in self.ranks):
            raise RuntimeError(f"{self.total - self.done} requests were lost: every engine is "
                               f"idle but they never completed")


class KvHandoff(StepObserver):
    """KV caches over the fabric (`KvPaths`): loads a step starts, prefill copies no longer
    needed, and the P/D handoff of a prompt finished on a prefill instance."""

    __slots__ = ("paths", "ranks")

    def __init__(self, paths, ranks: list[Rank]):
        self.paths = paths
        self.ranks = ranks

    def on_scheduled(self, rank, out) -> None:
        if out.kv_loads:
            sched = rank.sched

            def loaded(req: Request) -> None:
                sched.finish_remote_load(req)
                rank.notify()

            self.paths.start_loads(rank.index, out.kv_loads, loaded)
        if out.new:
            for req in out.new:     # admitted without a load: the prefill copy is not needed
                self.paths.release(req.request_id)

    def handoff(self, req: Request, prefill: Rank) -> None:
        """P/D: the prompt's KV stays on the prefill instance until a decode instance loads it."""
        rec = req.client
        rec.num_cached_prompt_tokens = max(req.num_cached_tokens, 0)
        rec.num_preemptions = req.num_preemptions
        d = self.ranks[self.paths.pick_decode()]

        def release() -> None:
            prefill.sched.finish_sending(req)
            prefill.notify()

        self.paths.prefill_done(req, prefill.index, release)
        dreq = Request(req.request_id, req.index, req.prompt_len, rec.output_len,
                       req.block_keys, req.priority, req.arrival, rec,
                       remote_prefill_tokens=req.prompt_len)
        dreq.block_hashes = req.block_hashes
        d.sched.add_request(dreq)
        d.notify()

