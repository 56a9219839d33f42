"""Multi-turn sessions: requests whose send times and prompts depend on earlier replies.

A session is a sequence of turns, each one request. Turn 0 is sent at the session's start; turn
j+1 is sent `think_s` after turn j's reply has completed (a closed loop: the time depends on the
run), and its prompt is the conversation so far, turn j's prompt and reply, followed by a new
message. The simulated client (`simcore.serve.frontend.Frontend`) does the timing; this module
fixes everything that does not depend on the run: how many turns, their lengths, their pauses and
their content keys.

Content identity. A session's conversation is one token sequence; every turn's prompt and
prompt + reply are prefixes of it. Block b of the conversation has one key, `Session.key(b)`, so
a turn's request carries the keys of its prompt's full blocks (`RequestSpec.block_keys`) and of
the full blocks past them, which its generated tokens fill (`RequestSpec.output_block_keys`). The
engine hashes a request's blocks from these keys, generated ones included, so the next turn's
prompt finds the blocks the previous turn computed in the prefix cache, as vLLM does with the
token ids of a conversation that is sent again. The last generated token's KV is never computed
(the request ends when it is sampled), so turn j leaves floor((prompt + reply - 1) / block_size)
full blocks behind.

Outcomes. A session completes when its last turn succeeds. It ends early when a turn fails
(refused by the server, timed out by the client), or when the client does not send a turn whose
prompt plus reply would exceed its context limit (`max_context_tokens`, else the server's
max_model_len); `SessionOutcomes` counts each.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from simcore.errors import ConfigError
from simcore.workload.config import (AgentSessionsDataset, LengthRange, MooncakeDataset,
                                     SessionsDataset, ThinkTime, WorkloadConfig)
from simcore.workload.keys import (MAX_SESSION_BLOCKS, BlockKeys, session_key_base,
                                   shared_prefix_keys)
from simcore.workload.spec import RequestSpec
from simcore.workload.traces import MooncakeRow, mooncake_rows

COMPLETED = "completed"
ENDED_MAX_CONTEXT = "ended_max_context"
ENDED_FAILED = "ended_failed"


@dataclass(frozen=True, slots=True)
class Turn:
    """One turn: its request id, prompt and reply lengths, and the client's pause between the
    previous turn's reply and this turn's send (0 for turn 0, sent at the session's start)."""

    request_id: str
    prompt_len: int
    output_len: int
    think_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Session:
    """A session's turns and its conversation's content keys: block b's key is `prefix_keys[b]`
    for the first blocks (content shared beyond the session, or given by a trace), then
    `key_base + b` (content of this session alone)."""

    session_id: str
    start_s: float
    turns: tuple[Turn, ...]
    block_size: int
    key_base: int
    prefix_keys: tuple[int, ...] | BlockKeys = ()

    def keys(self, start: int, stop: int) -> tuple[int, ...] | BlockKeys:
        """Keys of conversation blocks [start, stop)."""
        pre = self.prefix_keys
        n = len(pre)
        if stop <= n:
            return pre[start:stop]
        head = pre[start:] if start < n else ()
        base = self.key_base
        return head + tuple(range(base + max(start, n), base + stop))

    def spec(self, j: int, arrival_s: float) -> RequestSpec:
        """Turn j's request, to be sent at `arrival_s`."""
        t = self.turns[j]
        bs = self.block_size
        n_prompt = t.prompt_len // bs
        return RequestSpec(request_id=t.request_id, arrival_s=arrival_s, prompt_len=t.prompt_len,
                           output_len=t.output_len, block_keys=self.keys(0, n_prompt),
                           session_id=self.session_id,
                           output_block_keys=self.keys(n_prompt,
                                                       (t.prompt_len + t.output_len) // bs),
                           turn=j)


class SessionStream:
    """The sessions of a workload, by start time (ties in dataset order).

    Its length is the number of turns the sessions plan to send (an upper bound on the requests
    sent: a session can end early). Iterating yields each session's first turn at its start,
    the only sends whose times are known before the run; the client (`Frontend`) sends the
    rest as replies complete.
    """

    def __init__(self, sessions: Sequence[Session], max_context_tokens: int | None = None):
        order = sorted(range(len(sessions)), key=lambda i: sessions[i].start_s)
        self.sessions: tuple[Session, ...] = tuple(sessions[i] for i in order)
        self.max_context_tokens = max_context_tokens
        self.num_turns = sum(len(s.turns) for s in self.sessions)

    def __len__(self) -> int:
        return self.num_turns

    @property
    def last_arrival_s(self) -> float:
        """The latest planned send of a session's last turn were the replies instant: its start
        plus its pauses (drawn in advance); 0 for none. Every session that sends all its turns
        sends its last one no earlier."""
        return max((s.start_s + sum(t.think_s for t in s.turns) for s in self.sessions),
                   default=0.0)

    def __iter__(self) -> Iterator[RequestSpec]:
        for s in self.sessions:
            yield s.spec(0, s.start_s)


@dataclass(slots=True)
class SessionOutcomes:
    """How the sessions of a run ended, and how many turns they sent."""

    num_sessions: int = 0
    completed: int = 0
    ended_max_context: int = 0
    ended_failed: int = 0
    turns_planned: int = 0
    turns_sent: int = 0
    turns_completed: int = 0
    outcome: dict[str, str] = field(default_factory=dict)
    """Session id -> COMPLETED, ENDED_MAX_CONTEXT or ENDED_FAILED, once it has ended."""

    def end(self, session_id: str, how: str) -> None:
        self.outcome[session_id] = how
        if how == COMPLETED:
            self.completed += 1
        elif how == ENDED_MAX_CONTEXT:
            self.ended_max_context += 1
        else:
            self.ended_failed += 1


def session_summary(outcomes: SessionOutcomes, records, turns: Sequence[int],
                    percentiles: Sequence[float] = (50, 99)) -> dict:
    """The result's `sessions` section: outcomes, turns, the prefix-cache hit rate of the turns
    after the first, and TTFT of first turns against later ones. `records[i]` is turn
    `turns[i]` of its session."""

    def ttft_ms(recs) -> dict:
        t = np.array([(r.token_times_s[0] - r.send_s) * 1e3 for r in recs
                      if r.success and len(r.token_times_s)], dtype=float)
        if not t.size:
            return {"count": 0, "mean_ms": None,
                    **{f"p{p:g}_ms": None for p in percentiles}}
        return {"count": int(t.size), "mean_ms": float(t.mean()),
                **{f"p{p:g}_ms": float(np.percentile(t, p)) for p in percentiles}}

    def hit_rate(recs) -> float:
        ok = [r for r in recs if r.success]
        prompt = sum(r.prompt_len for r in ok)
        return sum(r.num_cached_prompt_tokens for r in ok) / prompt if prompt else 0.0

    first = [r for r, j in zip(records, turns) if j == 0]
    later = [r for r, j in zip(records, turns) if j > 0]
    return {
        "num_sessions": outcomes.num_sessions,
        "completed": outcomes.completed,
        "ended_max_context": outcomes.ended_max_context,
        "ended_failed": outcomes.ended_failed,
        "turns_planned": outcomes.turns_planned,
        "turns_sent": outcomes.turns_sent,
        "turns_completed": outcomes.turns_completed,
        "mean_turns_sent": (outcomes.turns_sent / outcomes.num_sessions
                            if outcomes.num_sessions else 0.0),
        "prefix_cache_hit_rate_first_turns": hit_rate(first),
        "prefix_cache_hit_rate_later_turns": hit_rate(later),
        "ttft_first_turns": ttft_ms(first),
        "ttft_later_turns": ttft_ms(later),
    }


# -- synthetic sessions ------------------------------------------------------------------------

def _draw(value: int | LengthRange, size: int, rng: np.random.Generator) -> np.ndarray:
    """`size` draws of a Count (no randomness used for a fixed one)."""
    if isinstance(value, LengthRange) and value.low != value.high:
        return rng.integers(value.low, value.high + 1, size=size)
    fixed = value.low if isinstance(value, LengthRange) else value
    return np.full(size, fixed, dtype=np.int64)


def _draw_think(value: float | ThinkTime, size: int, rng: np.random.Generator) -> np.ndarray:
    if isinstance(value, ThinkTime):
        if value.distribution == "exponential" and value.mean_s > 0:
            return rng.exponential(value.mean_s, size=size)
        value = value.mean_s
    return np.full(size, float(value))


def synthetic_sessions(ds: SessionsDataset | AgentSessionsDataset, *, block_size: int,
                       rng: np.random.Generator, starts_s: np.ndarray) -> list[Session]:
    """`ds.num_sessions` sessions starting at `starts_s`, lengths and pauses drawn from `rng`
    (turn counts, then first prompts, then replies, new messages and pauses of every turn)."""
    n = ds.num_sessions
    turns = _draw(ds.turns, n, rng)
    total = int(turns.sum())
    first = ds.shared_prefix_len + _draw(ds.first_prompt_len, n, rng)
    replies = _draw(ds.reply_len, total, rng)
    messages = _draw(ds.user_message_len, total, rng)
    thinks = _draw_think(ds.think_time_s, total, rng)
    prefix = shared_prefix_keys(0, ds.shared_prefix_len // block_size)
    sessions = []
    k = 0
    for i in range(n):
        prompt = int(first[i])
        session_turns = []
        for j in range(int(turns[i])):
            if j:
                prompt += int(replies[k - 1]) + int(messages[k])
            session_turns.append(Turn(f"s{i}-{j}", prompt, int(replies[k]),
                                      float(thinks[k]) if j else 0.0))
            k += 1
        last = session_turns[-1]
        if (last.prompt_len + last.output_len) // block_size >= MAX_SESSION_BLOCKS:
            raise ConfigError(f"workload.dataset: session {i} grows past {MAX_SESSION_BLOCKS} "
                              f"blocks; lower turns or the lengths")
        sessions.append(Session(f"s{i}", float(starts_s[i]), tuple(session_turns), block_size,
                                session_key_base(i), prefix))
    return sessions


# -- sessions replayed from a Mooncake trace ---------------------------------------------------

def link_conversations(rows: Sequence[MooncakeRow], hash_block_tokens: int) -> list[list[int]]:
    """Chains of row indices, each a conversation in send order, every row in exactly one.

    Row i continues row j (j before i, j not yet continued) when i's prompt holds j's prompt and
    j's output: i's hash ids repeat every full hash block of j's prompt, and i's prompt has at
    least j's prompt + output tokens. The blocks they share must have been introduced by j's own
    conversation (the first row holding j's last full block is in j's chain), so that a common
    prefix of many conversations (a system prompt) links nothing. Of several such j, the one
    sharing the most blocks, then the latest. A row with no full hash block cannot be
    continued: nothing in the trace would show that a later prompt repeats it.
    """
    children: dict[tuple[int, int], int] = {}      # (trie node, hash id) -> child node
    waiting: dict[int, int] = {}                    # trie node -> row not yet continued
    node_of: dict[int, int] = {}                    # row -> its trie node while waiting
    first_row: dict[int, int] = {}                  # hash id -> first row holding it
    chain_of: list[int] = []
    chains: list[list[int]] = []
    for i, row in enumerate(rows):
        ids = row.hash_ids
        best = -1
        node = 0
        for depth, h in enumerate(ids, 1):
            node = children.get((node, h), -1)
            if node < 0:
                break
            j = waiting.get(node)
            if j is None:
                continue
            prev = rows[j]
            if (row.prompt_len >= prev.prompt_len + prev.output_len
                    and chain_of[first_row[ids[depth - 1]]] == chain_of[j]):
                best = j
        if best >= 0:
            c = chain_of[best]
            del waiting[node_of.pop(best)]
            chains[c].append(i)
        else:
            c = len(chains)
            chains.append([i])
        chain_of.append(c)
        for h in ids:
            first_row.setdefault(h, i)
        full = min(row.prompt_len // hash_block_tokens, len(ids))
        if full:
            node = 0
            for h in ids[:full]:
                nxt = children.get((node, h))
                if nxt is None:
                    nxt = children[(node, h)] = len(children) + 1
                node = nxt
            previous = waiting.get(node)
            if previous is not None:        # a later prompt of the same blocks takes the place
                del node_of[previous]
            waiting[node] = i
            node_of[i] = node
    return chains


def mooncake_sessions(ds: MooncakeDataset, num_prompts: int | None, *, path: Path,
                      block_size: int) -> list[Session]:
    """The trace's conversations (`link_conversations`) as sessions. A session starts at its
    first request's time; each later turn's pause is the gap between its timestamp and the
    previous turn's (time_scale applied), taken after the previous reply completes. Its
    conversation's keys are those of its last prompt (earlier prompts repeat it), then keys of
    its own."""
    rows = mooncake_rows(ds, num_prompts, path=path, block_size=block_size)
    sessions = []
    for index, chain in enumerate(link_conversations(rows, ds.hash_block_tokens)):
        turns = tuple(Turn(f"m{rows[i].lineno - 1}", rows[i].prompt_len, rows[i].output_len,
                           rows[i].t_s - rows[chain[k - 1]].t_s if k else 0.0)
                      for k, i in enumerate(chain))
        sessions.append(Session(f"c{index}", rows[chain[0]].t_s, turns, block_size,
                                session_key_base(index), rows[chain[-1]].block_keys))
    return sessions


def session_stream(cfg: WorkloadConfig, *, block_size: int, base_dir: Path,
                   data_rng: np.random.Generator, starts_s: np.ndarray | None) -> SessionStream:
    """The sessions of `cfg` (a sessions dataset, or a Mooncake trace with sessions on)."""
    from simcore.workload import files

    ds = cfg.dataset
    if isinstance(ds, MooncakeDataset):
        return SessionStream(mooncake_sessions(ds, cfg.num_prompts,
                                               path=files.resolve(ds.path, base_dir),
                                               block_size=block_size))
    return SessionStream(synthetic_sessions(ds, block_size=block_size, rng=data_rng,
                                            starts_s=starts_s),
                         ds.max_context_tokens)
