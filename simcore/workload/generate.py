"""Turning a workload configuration into the requests a `vllm bench serve` client sends, in send order.

Conventions shared by every dataset:
- Randomness: one `numpy.random.SeedSequence(seed)` spawns two streams, one for the dataset
  (lengths, shuffles, oversampling) and one for the send times, so changing the rate leaves the
  prompts unchanged.
- Lengths: every prompt has at least 1 token; an output length of 0 in a data file is sent as 1
  token (a request always samples one token).
- Refusals: vLLM's server rejects a request whose prompt_len + output_len exceeds max_model_len
  before it reaches the scheduler, and `vllm bench serve` counts it as failed. Such requests keep
  their send times but are set apart in `Workload.refused` (generate_requests drops them), so the
  simulator can report `failed` as vLLM would.
- Content identity: see `simcore.workload.keys` for the key namespaces.
- Sessions (the sessions and agent_sessions datasets, a Mooncake trace with sessions on):
  `request_stream` returns a `simcore.workload.sessions.SessionStream` instead, whose later
  turns the client sends as earlier replies complete; the send-time stream gives the sessions'
  starts.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from simcore.errors import ConfigError
from simcore.model.presets import sharegpt_tokenizer as preset_sharegpt_tokenizer
from simcore.reference_data import SHAREGPT_FIRST_TURNS
from simcore.workload import files
from simcore.workload.arrivals import send_times_s
from simcore.workload.config import (SESSION_DATASETS, AzureDataset, CustomDataset,
                                     MooncakeDataset, PrefixRepetitionDataset, RandomDataset,
                                     ShareGPTDataset, WorkloadConfig)
from simcore.workload.sample import Sample
from simcore.workload.sampled import custom_samples, sharegpt_samples
from simcore.workload.sessions import SessionStream, session_stream
from simcore.workload.spec import RequestSpec
from simcore.workload.synthetic import prefix_repetition_samples, random_samples
from simcore.workload.traces import azure_samples, mooncake_samples

if TYPE_CHECKING:
    from simcore.config import SimConfig


@dataclass(frozen=True, slots=True)
class Workload:
    """The generated requests, split into those the server accepts and those it refuses.

    Both tuples are sorted by arrival_s (ties in dataset order); together they are every request
    the client sends.
    """

    requests: tuple[RequestSpec, ...]
    refused: tuple[RequestSpec, ...] = ()

    @property
    def num_refused(self) -> int:
        """Requests vLLM would reject as longer than max_model_len (reported as failed)."""
        return len(self.refused)


def is_refused(request: RequestSpec, max_model_len: int | None) -> bool:
    """Whether vLLM's server rejects `request`: prompt plus requested output exceed max_model_len."""
    return max_model_len is not None and request.prompt_len + request.output_len > max_model_len


class RequestStream:
    """The requests of a workload in send order (by arrival_s, ties in dataset order), each
    RequestSpec made when the iteration reaches it: the workload is held as the dataset's
    columns and one send time a request, so a run of millions of requests starts at once and
    holds no list of them. Its length is known before any request is made; it can be iterated
    any number of times, with the same requests each time."""

    def __init__(self, samples: Sequence[Sample], times_s: np.ndarray):
        self._samples = samples
        self._times_s = times_s
        # Synthetic send times are cumulative gaps, already in order; trace times may not be.
        in_order = bool(np.all(times_s[1:] >= times_s[:-1]))
        self._order = None if in_order else np.argsort(times_s, kind="stable")

    def __len__(self) -> int:
        return len(self._samples)

    @property
    def has_priorities(self) -> bool:
        """Whether some request has a priority other than 0, vLLM's default (only a custom
        dataset's lines carry priorities)."""
        return bool(getattr(self._samples, "has_priorities", False))

    @property
    def last_arrival_s(self) -> float:
        """When the last request arrives (0 for none)."""
        return float(self._times_s.max()) if len(self._times_s) else 0.0

    def __iter__(self) -> Iterator[RequestSpec]:
        samples, times_s = self._samples, self._times_s
        for i in range(len(samples)) if self._order is None else self._order:
            s = samples[i]
            yield RequestSpec(request_id=s.request_id, arrival_s=float(times_s[i]),
                              prompt_len=s.prompt_len, output_len=s.output_len,
                              block_keys=s.block_keys, priority=s.priority)


def config_requests(cfg: SimConfig) -> RequestStream | SessionStream:
    """The request stream of a simulate config's workload, at its engine's block size and its
    seed, its files read from its base folder: what a run of it sends, made without running
    it."""
    return request_stream(cfg.workload, block_size=cfg.engine.block_size, seed=cfg.seed,
                          base_dir=Path(cfg.base_dir),
                          sharegpt_tokenizer=config_sharegpt_tokenizer(cfg))


def config_sharegpt_tokenizer(cfg) -> str:
    """The shipped ShareGPT counts a simulate config's sharegpt dataset without a `path` sends
    (`sharegpt_choice`)."""
    return sharegpt_choice(cfg)[0]


def sharegpt_choice(cfg) -> tuple[str, str]:
    """(tokenizer, why) of the shipped ShareGPT counts a simulate config's sharegpt dataset
    without a `path` sends: its `tokenizer`, else its model's own where they ship
    (`simcore.model.presets.sharegpt_tokenizer`), else Llama-3's."""
    ds = cfg.workload.dataset
    if getattr(ds, "tokenizer", None) is not None:
        return ds.tokenizer, "workload.dataset.tokenizer"
    own = preset_sharegpt_tokenizer(cfg.model.name) if cfg.model.name is not None else None
    if own is not None:
        return own, "the model's own"
    return "llama3", f"none shipped in {cfg.model.name or 'the model'}'s own tokenizer"


def request_stream(cfg: WorkloadConfig, *, block_size: int, seed: int,
                   base_dir: Path, sharegpt_tokenizer: str = "llama3"
                   ) -> RequestStream | SessionStream:
    """Every request of `cfg` the client sends, deterministic for `seed`; data paths are
    relative to `base_dir`. Data files are read and checked here, before any request is sent.
    A workload of sessions gives a SessionStream (see the module docstring). A sharegpt
    dataset without a `path` or a `tokenizer` sends the shipped counts of `sharegpt_tokenizer`.

    Raises ConfigError, naming the file and line or the field, for bad data or settings.
    """
    if block_size < 1:
        raise ConfigError(f"block_size must be at least 1, got {block_size}")
    if seed < 0:
        raise ConfigError(f"seed must be a non-negative integer, got {seed}")
    data_seq, arrival_seq = np.random.SeedSequence(seed).spawn(2)
    ds = cfg.dataset
    if isinstance(ds, SESSION_DATASETS):
        starts_s = send_times_s(ds.num_sessions, np.random.default_rng(arrival_seq),
                                request_rate=cfg.request_rate, burstiness=cfg.burstiness,
                                ramp_up_strategy=cfg.ramp_up_strategy,
                                ramp_up_start_rps=cfg.ramp_up_start_rps,
                                ramp_up_end_rps=cfg.ramp_up_end_rps)
        return session_stream(cfg, block_size=block_size, base_dir=Path(base_dir),
                              data_rng=np.random.default_rng(data_seq), starts_s=starts_s)
    if isinstance(ds, MooncakeDataset) and ds.sessions:
        return session_stream(cfg, block_size=block_size, base_dir=Path(base_dir),
                              data_rng=np.random.default_rng(data_seq), starts_s=None)
    samples = _samples(cfg, block_size=block_size, base_dir=Path(base_dir),
                       rng=np.random.default_rng(data_seq), seed=seed,
                       sharegpt_tokenizer=sharegpt_tokenizer)
    times_s = _send_times_s(cfg, samples, np.random.default_rng(arrival_seq))
    return RequestStream(samples, times_s)


def generate_workload(cfg: WorkloadConfig, *, block_size: int, seed: int, base_dir: Path,
                      max_model_len: int | None) -> Workload:
    """All requests of `cfg` as tuples (see `request_stream`), refused ones set apart. A workload
    of sessions has none fixed in advance (its later turns wait for replies): ConfigError."""
    stream = request_stream(cfg, block_size=block_size, seed=seed, base_dir=base_dir)
    if isinstance(stream, SessionStream):
        raise ConfigError("workload.dataset: a sessions workload sends its later turns as replies "
                          "complete; run it (simcore.serve.run_serving with request_stream's "
                          "SessionStream) instead of listing its requests")
    accepted, refused = [], []
    for spec in stream:
        (refused if is_refused(spec, max_model_len) else accepted).append(spec)
    return Workload(tuple(accepted), tuple(refused))


def generate_requests(cfg: WorkloadConfig, *, block_size: int, seed: int, base_dir: Path,
                      max_model_len: int | None) -> list[RequestSpec]:
    """The requests the server accepts, sorted by arrival_s (refused ones dropped; see Workload)."""
    return list(generate_workload(cfg, block_size=block_size, seed=seed, base_dir=base_dir,
                                  max_model_len=max_model_len).requests)


def _samples(cfg: WorkloadConfig, *, block_size: int, base_dir: Path,
             rng: np.random.Generator, seed: int,
             sharegpt_tokenizer: str = "llama3") -> Sequence[Sample]:
    """The dataset's requests; the sharegpt and custom datasets choose theirs as vLLM's do from
    the seed itself (`simcore.workload.sampled.vllm_order`), the others draw from `rng`."""
    num = cfg.resolved_num_prompts
    match cfg.dataset:
        case RandomDataset() as ds:
            return random_samples(ds, num, block_size=block_size, rng=rng)
        case PrefixRepetitionDataset() as ds:
            return prefix_repetition_samples(ds, num, block_size=block_size, rng=rng)
        case ShareGPTDataset() as ds:
            path = (SHAREGPT_FIRST_TURNS[ds.tokenizer or sharegpt_tokenizer] if ds.path is None
                    else files.resolve(ds.path, base_dir))
            return sharegpt_samples(ds, num, path=path, block_size=block_size, seed=seed)
        case CustomDataset() as ds:
            return custom_samples(ds, num, path=files.resolve(ds.path, base_dir),
                                  block_size=block_size, seed=seed)
        case MooncakeDataset() as ds:
            return mooncake_samples(ds, num, path=files.resolve(ds.path, base_dir),
                                    block_size=block_size)
        case AzureDataset() as ds:
            return azure_samples(ds, num, path=files.resolve(ds.path, base_dir))
    raise ConfigError(f"unknown workload.dataset kind {cfg.dataset!r}")


def _send_times_s(cfg: WorkloadConfig, samples: Sequence[Sample],
                  rng: np.random.Generator) -> np.ndarray:
    ds = cfg.dataset
    if isinstance(ds, (MooncakeDataset, AzureDataset)) and ds.use_timestamps:
        return np.array([s.timestamp_s for s in samples], dtype=float)
    return send_times_s(len(samples), rng, request_rate=cfg.request_rate, burstiness=cfg.burstiness,
                        ramp_up_strategy=cfg.ramp_up_strategy,
                        ramp_up_start_rps=cfg.ramp_up_start_rps, ramp_up_end_rps=cfg.ramp_up_end_rps)
