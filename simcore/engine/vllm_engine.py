"""`engine.implementation: vllm`: the installed vLLM's own V1 scheduler and KV-cache manager
make every scheduling decision of an engine, on the simulator's virtual clock.

vLLM runs in a child process (`vllm_recorder.py --serve`, in the interpreter that can import
it: `engine.vllm_python`, with `engine.vllm_path` first on its PYTHONPATH), one JSON line in
and out per command: at a step's start the requests that arrived since the last one, answered
by vLLM's decisions (tokens scheduled per request, admissions with their prefix-cache hits,
preemptions); at its end the sampled tokens, answered by the requests that finished; aborts
when the simulator makes them (mid-step too, which vLLM's `update_from_output` passes over);
each answer with vLLM's free blocks. `VllmScheduler` applies them to the simulator's requests, so
the rest of the simulation (step times from the compute model, the fabric, the API server,
metrics) runs unchanged. It is slower than the simulator's own scheduler (a process hop and
vLLM's Python per step) and exact for whichever vLLM is installed; the block pool's state is
vLLM's (KV usage from its free blocks, evictions counted in its pool).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path

from simcore.engine.request import PREEMPTED, RUNNING, Request
from simcore.engine.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from simcore.engine.vllm_link import (RECORDER, announced_version, missing_module,
                                      vllm_environ)
from simcore.errors import ConfigError

ENGINE_HINT = ("build a CPU-only vLLM environment with scripts/vllm_conformance/setup.sh DIR "
               "[VERSION] and set engine.vllm_python to DIR/venv/bin/python and "
               "engine.vllm_path to DIR/src")


@dataclass(frozen=True)
class VllmInstall:
    """Where vLLM runs: its interpreter (None: this one) and a folder put first on its
    PYTHONPATH (None: nothing added)."""

    python: str | None = None
    path: str | None = None


def _stop(proc: subprocess.Popen, log) -> None:
    if proc.poll() is None:
        try:
            proc.stdin.close()
            proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
    log.close()


class VllmProcess:
    """vLLM's scheduler in a child process, driven one step per call."""

    def __init__(self, config: SchedulerConfig, install: VllmInstall) -> None:
        interpreter = install.python or sys.executable
        env = vllm_environ(install.path)
        self._log = tempfile.TemporaryFile(mode="w+")      # vLLM's own messages
        try:
            self._proc = subprocess.Popen([interpreter, str(RECORDER), "--serve"],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=self._log, text=True, env=env)
        except FileNotFoundError:
            self._log.close()
            raise ConfigError(f"engine.vllm_python {interpreter}: no such interpreter "
                              f"({ENGINE_HINT})") from None
        self._finalizer = weakref.finalize(self, _stop, self._proc, self._log)
        c = config
        settings = {"max_num_seqs": c.max_num_seqs,
                    "max_num_batched_tokens": c.max_num_batched_tokens,
                    "num_blocks": c.num_blocks, "block_size": c.block_size,
                    "max_model_len": c.max_model_len,
                    "enable_chunked_prefill": c.enable_chunked_prefill,
                    "enable_prefix_caching": c.enable_prefix_caching,
                    "long_prefill_token_threshold": c.long_prefill_token_threshold,
                    "policy": c.policy, "watermark": c.watermark,
                    "max_num_scheduled_tokens": c.max_num_scheduled_tokens,
                    "reserve_full_isl": c.reserve_full_isl}
        first = self._call({"config": settings}, raw=True)
        version = announced_version(first)
        if version is None:
            raise self._failure(f"did not say which vLLM it runs (first line {first!r})")
        self.version = version

    def _failure(self, what: str) -> ConfigError:
        self._proc.kill()
        self._proc.wait()
        self._log.seek(0)
        lines = self._log.read().strip().splitlines()
        last = lines[-1] if lines else "no message"
        missing = missing_module(last)
        if missing:
            return ConfigError(f"engine.implementation vllm: {self._proc.args[0]} cannot import "
                               f"{missing}; {ENGINE_HINT}")
        return ConfigError(f"engine.implementation vllm: vLLM's scheduler {what}: {last}")

    def _call(self, message: dict, raw: bool = False):
        try:
            self._proc.stdin.write(json.dumps(message) + "\n")
            self._proc.stdin.flush()
            line = self._proc.stdout.readline()
        except (BrokenPipeError, OSError):
            line = ""
        if not line:
            raise self._failure("stopped")
        return line.strip() if raw else json.loads(line)

    def schedule(self, add: list[dict]) -> dict:
        """Add requests, then have vLLM schedule a step: its decisions."""
        return self._call({"op": "schedule", "add": add})

    def update(self) -> dict:
        """End the step: the requests vLLM finished and its free blocks after."""
        return self._call({"op": "update"})

    def abort(self, add: list[dict], abort: list[str]) -> dict:
        """Add and abort requests (at any time, mid-step too): the free blocks after."""
        return self._call({"op": "abort", "add": add, "abort": abort})

    def close(self) -> None:
        self._finalizer()


class _Pool:
    __slots__ = ("num_evictions",)

    def __init__(self) -> None:
        self.num_evictions = 0


class VllmPoolView:
    """The block pool as vLLM reports it after each step (what the simulator reads)."""

    __slots__ = ("num_blocks", "num_free_blocks", "pool")

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.num_free_blocks = num_blocks - 1
        self.pool = _Pool()

    @property
    def usage(self) -> float:
        """vLLM's kv_cache_usage: the fraction of usable blocks some request holds."""
        return 1.0 - self.num_free_blocks / (self.num_blocks - 1)

    def free(self, req: Request) -> None:
        """Blocks are vLLM's: it frees them itself."""


class VllmScheduler(Scheduler):
    """The simulator's scheduler interface with vLLM's decisions: `schedule()` has vLLM
    schedule the step and applies its decisions to the simulator's requests; `update()` samples
    as the simulator does and checks that the same requests finished in vLLM."""

    def __init__(self, config: SchedulerConfig, install: VllmInstall) -> None:
        if any(config.kv_cache_groups) or config.speculative is not None \
                or config.preemption != "vllm" or config.persistent_batch:
            raise ConfigError("engine.implementation vllm: sliding-window KV-cache groups, "
                              "speculative decoding and the simulator's own preemption and "
                              "batching options are not driven through vLLM")
        super().__init__(config)
        self.vllm = VllmProcess(config, install)
        self.kv = VllmPoolView(config.num_blocks)
        self._by_id: dict[str, Request] = {}
        self._keys: dict[int, int] = {}
        self._add: list[dict] = []

    def _key(self, key) -> int:
        """Block keys as small ints (vLLM's recorder turns each into 16 token ids)."""
        k = self._keys.get(key)
        if k is None:
            k = self._keys[key] = len(self._keys)
        return k

    def add_request(self, req: Request) -> None:
        super().add_request(req)
        self._by_id[req.request_id] = req
        self._add.append({"id": req.request_id, "index": len(self._by_id) - 1,
                          "prompt_len": req.prompt_len, "output_len": req.max_tokens,
                          "block_keys": [self._key(k) for k in (req.block_keys or ())],
                          "priority": req.priority,
                          "skip_reading_prefix_cache": req.skip_reading_prefix_cache})

    def finish_requests(self, reqs: list[Request]) -> list[Request]:
        """Aborts reach vLLM at once, as the simulator frees their blocks at once."""
        aborted = super().finish_requests(reqs)
        if aborted:
            self._pool(self.vllm.abort(self._add, [r.request_id for r in aborted]))
            self._add = []
        return aborted

    def _pool(self, rec: dict) -> None:
        self.kv.num_free_blocks = rec["free_blocks"]
        self.kv.pool.num_evictions = rec["evictions"]

    def schedule(self) -> SchedulerOutput:
        rec = self.vllm.schedule(self._add)
        self._add = []
        self._pool(rec)
        if rec.get("idle"):
            return SchedulerOutput([], [], [], [], {}, 0)
        by_id = self._by_id
        preempted = [by_id[rid] for rid in rec["preempted"]]
        if preempted:
            gone = set(map(id, preempted))
            self.running = [r for r in self.running if id(r) not in gone]
            for req in preempted:
                req.status = PREEMPTED
                req.num_computed_tokens = 0
                req.num_preemptions += 1
                self.num_preemptions += 1
                self.waiting.prepend(req)
        admit = rec["computed_on_admit"]
        new = [by_id[rid] for rid in rec["new"]]
        resumed = [by_id[rid] for rid in rec["resumed"]]
        if new or resumed:
            self.waiting.remove(set(map(id, new + resumed)))
            for req in new + resumed:
                req.status = RUNNING
                req.num_computed_tokens = admit[req.request_id]
                if req.num_cached_tokens < 0:
                    req.num_cached_tokens = admit[req.request_id]
                self.running.append(req)
        scheduled = []
        total = 0
        for rid, n in rec["scheduled"].items():
            req = by_id[rid]
            computed = req.num_computed_tokens
            scheduled.append((req, n, computed))
            req.num_computed_tokens = computed + n
            req.work_done_tokens += n
            total += n
        self.num_steps += 1
        return SchedulerOutput(scheduled, new, resumed, preempted, dict(admit), total)

    def update(self, out: SchedulerOutput) -> tuple[list[Request], list[Request]]:
        rec = self.vllm.update()
        self._pool(rec)
        emitted, finished = super().update(out)
        ours = {r.request_id for r in finished}
        if ours != set(rec["finished"]):
            raise RuntimeError(f"vLLM finished {sorted(rec['finished'])} in this step, the "
                               f"simulator's sampling {sorted(ours)}")
        return emitted, finished

    def close(self) -> None:
        self.vllm.close()
