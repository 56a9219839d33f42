"""vLLM's API server on the virtual clock, before the engine sees a request: each process's
tokenizer thread (prompts one after another, beside the event loop) and its event loop (its CPU
shared among the requests it is working on), as `ApiServerPath` describes a request's path
through them. `simcore.serve.frontend.Frontend` sends each request along it."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

from simcore.serve.horizon import ArrivalTimeout, DeferredTimeout, just_before


@dataclass(frozen=True, slots=True)
class ApiServerPath:
    """The API server's path before the engine sees a request, on one of `num_servers`
    processes: tokenizing its prompt, `tokenize_s(prompt_len)`, on the process's tokenizer
    thread, one prompt after another (`TokenizerThread`); then the event loop's work,
    `request_cpu_s(prompt_len)` (input processing, the request's state and hand-off), the loop's
    CPU shared equally among the requests it is working on (`SharedCpu`); then `latency_s`, paid
    by every request concurrently. A chat request's prompt reaches the engine rendered by the
    chat template: `template_tokens` more than the client counts, its leading full blocks of
    content `template_keys` (the same in every request) before the prompt's own."""

    request_cpu_s: Callable[[int], float] | None = None
    latency_s: float = 0.0
    num_servers: int = 1
    tokenize_s: Callable[[int], float] | None = None
    template_tokens: int = 0
    template_keys: tuple[int, ...] = ()

    @property
    def active(self) -> bool:
        return (self.request_cpu_s is not None or self.tokenize_s is not None
                or self.latency_s > 0)

    def least_s(self, prompt_len: int) -> float:
        """The least time a request of `prompt_len` prompt tokens spends on the path before its
        latency: its tokenizing (after any prompt queued before it), then its work on the event
        loop (whose CPU it gets at most all of)."""
        return ((self.tokenize_s(prompt_len) if self.tokenize_s is not None else 0.0)
                + (self.request_cpu_s(prompt_len) if self.request_cpu_s is not None else 0.0))


def reach_s(at_s: float, defer_s: float, then_s: float = 0.0) -> float:
    """The earliest a request can reach its engine when, from `at_s`, its way there holds
    `then_s` of work on the path (where given) and then the path's latency, `defer_s`: their
    sum, a hair earlier where work is counted (`just_before`: the path's own arithmetic may
    reach it within rounding)."""
    t = at_s + defer_s
    return just_before(t + then_s) if then_s > 0.0 else t


def deferred(env, delay: float, defer_s: float, bound: dict | None = None,
             then_s: float = 0.0):
    """A timeout of `delay` on the way of a request that reaches its engine `defer_s` (the
    path's latency) or more after it fires, and `then_s` more (work that follows on the path)
    where given: a `DeferredTimeout`, which a quiet run's horizon counts that much later, for
    the engines in `bound` where given; a plain one when nothing separates it from the
    engine."""
    if defer_s > 0.0:
        return DeferredTimeout(env, delay, reach_s(env.now + delay, defer_s, then_s), bound)
    return env.timeout(delay)


def arrival(env, delay: float, defer_s: float, engines: int, path_s: float = 0.0):
    """The client's timeout of `delay` to a request's arrival, which the API server's path
    separates from every engine by `defer_s` (its latency) and `path_s` (the least time its
    work on the path takes: `ApiServerPath.least_s`): among several `engines` an
    `ArrivalTimeout` (quiet runs pass it; the send cuts the run of the engine it routes the
    request to), for one a `DeferredTimeout` (its engine's runs end before the request can reach
    it, rather than being planned past it and cut); a plain one when nothing separates them."""
    if defer_s > 0.0:
        kind = ArrivalTimeout if engines > 1 else DeferredTimeout
        return kind(env, delay, reach_s(env.now + delay, defer_s, path_s))
    return env.timeout(delay)


class SharedCpu:
    """One API server process working on several requests at once, each getting an equal share
    of its CPU (processor sharing): the server's event loop runs every ready request handler a
    slice at a time, so a burst's requests advance together and finish together, rather than
    one after another. (Measured with vLLM 0.11's own server and front end in front of a
    stand-in engine core: 1,000 chat requests sent at once all reached the engine within one
    second of each other, 12-13 s after they were sent; `scripts/vllm_cpu_costs/
    burst_measure.py`.)

    Lifecycle: `add(work_s, done)` starts a job of `work_s` CPU seconds now; `done(end_s)` is
    called when it has had them. Kept as virtual time: with n jobs, every job's received CPU
    grows at 1/n a second, so a job finishes when the virtual time reaches its start's plus its
    work; the completion due next is scheduled, and a stale one (an arrival changed the share
    since) is ignored."""

    __slots__ = ("env", "jobs", "vtime", "at_s", "gen", "seq", "defer_s", "bound")

    def __init__(self, env, defer_s: float = 0.0, bound: dict | None = None) -> None:
        self.env = env
        self.defer_s = defer_s       # the path's latency after the loop's work (`Deferred`)
        self.bound = bound           # the engines its requests are bound for (`ServerProcess`)
        self.jobs: list = []         # heap of (virtual finish, sequence, done)
        self.vtime = 0.0             # CPU seconds each job in progress has had since `at_s`...
        self.at_s = 0.0              # ... as of this time
        self.gen = 0
        self.seq = 0

    def __len__(self) -> int:
        return len(self.jobs)

    def _advance(self) -> None:
        now = self.env.now
        if self.jobs and now > self.at_s:
            self.vtime += (now - self.at_s) / len(self.jobs)
        self.at_s = now

    def add(self, work_s: float, done) -> None:
        self._advance()
        heapq.heappush(self.jobs, (self.vtime + work_s, self.seq, done))
        self.seq += 1
        self._schedule()

    def _schedule(self) -> None:
        self.gen += 1
        if self.jobs:
            delay = max((self.jobs[0][0] - self.vtime) * len(self.jobs), 0.0)
            deferred(self.env, delay, self.defer_s, self.bound).callbacks.append(
                lambda _, gen=self.gen: self._finish(gen))

    def _finish(self, gen: int) -> None:
        if gen != self.gen:
            return                   # the share changed since this was scheduled
        self.at_s = self.env.now
        jobs = self.jobs
        self.vtime = jobs[0][0]      # exactly: the job due now has had all its work
        finished = []
        while jobs and jobs[0][0] <= self.vtime:
            finished.append(heapq.heappop(jobs)[2])
        self._schedule()
        for done in finished:
            done(self.env.now)


class TokenizerThread:
    """An API server process's tokenizer thread: prompts tokenized one after another, first come
    first served, beside the event loop rather than on it. vLLM's OpenAI server hands each
    prompt to a one-worker thread pool (`make_async(tokenizer, executor=...)`; 0.10 to 0.2x
    batch the queued prompts into one call, `AsyncMicrobatchTokenizer`), and the Hugging Face
    tokenizer's Rust encoder releases the GIL: a pure-Python loop ran at full speed beside a
    thread tokenizing 2,000-token prompts (Qwen3's tokenizer, tokenizers 0.22).

    Lifecycle: `add(work_s, done)` queues a prompt of `work_s` seconds; `done(end_s)` is
    called when it is tokenized."""

    __slots__ = ("env", "free_s", "queued", "defer_s", "bound")

    def __init__(self, env, defer_s: float = 0.0, bound: dict | None = None) -> None:
        self.env = env
        self.defer_s = defer_s       # the path's latency after the loop's work (`Deferred`)
        self.bound = bound           # the engines its requests are bound for (`ServerProcess`)
        self.free_s = 0.0            # when the thread has finished every prompt queued so far
        self.queued = 0              # prompts queued or in progress

    def __len__(self) -> int:
        return self.queued

    def add(self, work_s: float, done, then_s: float = 0.0) -> None:
        """`then_s`: the least time the prompt's request spends on the path after its
        tokenizing, before the path's latency (its work on the event loop)."""
        now = self.env.now
        end = max(self.free_s, now) + work_s
        self.free_s = end
        self.queued += 1

        def finish(_) -> None:
            self.queued -= 1
            done(end)
        deferred(self.env, end - now, self.defer_s, self.bound, then_s).callbacks.append(finish)


class ServerProcess:
    """One API server process: its tokenizer thread and its event loop's CPU, and `bound`, how
    many of the requests on it (from `enter` to `leave`) are bound for each engine (by index):
    its work reaches those engines only (`simcore.serve.quiet.DeferredTimeout`)."""

    __slots__ = ("tokenizer", "loop", "bound")

    def __init__(self, env, defer_s: float = 0.0) -> None:
        self.bound: dict[int, int] = {}
        self.tokenizer = TokenizerThread(env, defer_s, self.bound)
        self.loop = SharedCpu(env, defer_s, self.bound)

    def enter(self, engine: int) -> None:
        """A request bound for `engine` starts its way through the process."""
        bound = self.bound
        bound[engine] = bound.get(engine, 0) + 1

    def leave(self, engine: int) -> None:
        """A request bound for `engine` is done on the process (only the path's latency left)."""
        self.bound[engine] -= 1

    def __len__(self) -> int:
        """Requests the process is working on (tokenizing, or on the event loop)."""
        return len(self.tokenizer) + len(self.loop)
