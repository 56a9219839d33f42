"""Fewest GPUs for a target rate: which parallelism of the config's model serves `rate` requests
a second within the SLOs, on as few GPUs as possible (`dse capacity --target-rate`).

The candidates keep everything of the config but its parallelism: tensor parallelism over the
powers of two that divide the attention heads and fit a node, the config's pipeline depth, and
as many data-parallel replicas as the GPU budget allows. They are tried in order of GPU count;
each is run once at the target rate (the same run `dse capacity` makes at a rate: its SLOs, no
failed request, a queue that does not keep growing). At the first GPU count where any meets,
every candidate of that count is run, the one with the widest margin to its tightest SLO is the
answer, and its own capacity is measured, so the answer says how much headroom it has beyond
the target. Candidates that cannot be deployed (the model does not fit, TP does not divide the
heads) are skipped with their reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from dse.capacity import (Capacity, RateRun, _check_workload, _Search, _with_slo_metrics,
                          find_capacity)
from dse.study import Constraint
from simcore.config import SimConfig
from simcore.errors import ConfigError


@dataclass(frozen=True)
class Option:
    """One parallelism tried: its layout, and its run at the target rate (or why none)."""

    tp: int
    pp: int
    dp: int
    run: RateRun | None
    reason: str | None = None

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def label(self) -> str:
        return f"TP {self.tp} x PP {self.pp} x DP {self.dp} ({self.num_gpus} GPUs)"

    def margin(self, slos: tuple[Constraint, ...]) -> float:
        """The tightest SLO's slack, as a fraction of its bound."""
        return min(c.relative_slack(self.run.values[c.metric]) for c in slos)


@dataclass(frozen=True)
class Sizing:
    """The answer: the layout on the fewest GPUs that meets the target, with what was tried."""

    target_rate: float
    slos: tuple[Constraint, ...]
    best: Option | None
    capacity: Capacity | None
    tried: tuple[Option, ...]

    def as_dict(self) -> dict:
        def opt(o: Option) -> dict:
            return {"tp": o.tp, "pp": o.pp, "dp": o.dp, "num_gpus": o.num_gpus,
                    "meets": bool(o.run and o.run.meets), "reason": o.reason,
                    "run": o.run.as_dict() if o.run else None}
        return {"target_rate": self.target_rate, "slos": [str(c) for c in self.slos],
                "best": opt(self.best) if self.best else None,
                "capacity": self.capacity.as_dict() if self.capacity else None,
                "tried": [opt(o) for o in self.tried]}


def _layouts(cfg: SimConfig, max_gpus: int) -> list[tuple[int, int, int]]:
    from pathlib import Path

    gpn = cfg.hardware.resolve().gpus_per_node
    heads = cfg.model.resolve(Path(cfg.base_dir)).num_attention_heads
    pp = cfg.parallelism.pipeline_parallel_size
    tps = [t for t in (1, 2, 4, 8, 16) if t <= gpn and heads % t == 0]
    out = [(tp, pp, dp) for tp in tps for dp in range(1, max_gpus + 1)
           if tp * pp * dp <= max_gpus]
    return sorted(out, key=lambda x: (x[0] * x[1] * x[2], x[0]))


def _layout_config(cfg: SimConfig, tp: int, pp: int, dp: int) -> SimConfig:
    return cfg.with_section("parallelism", tensor_parallel_size=tp, pipeline_parallel_size=pp,
                            data_parallel_size=dp)


def fewest_gpus(cfg: SimConfig, rate: float, slos: tuple[Constraint, ...], *,
                max_gpus: int = 64, window_s: float = 120.0, min_prompts: int = 200,
                max_prompts: int = 20_000, progress=None) -> Sizing:
    """The layout on the fewest GPUs whose run at `rate` meets `slos` (see the module
    docstring); raises ConfigError for a workload whose rate cannot vary or a bad target."""
    from simcore.setup import build_deployment

    if not rate > 0:
        raise ConfigError("--target-rate: must be a positive number of requests per second")
    if cfg.parallelism.prefill_decode is not None or cfg.cluster is not None:
        raise ConfigError("--target-rate: sizes a single-node-per-replica deployment; remove "
                          "parallelism.prefill_decode and the cluster section")
    _check_workload(cfg)
    base = _with_slo_metrics(cfg, slos)
    tried: list[Option] = []
    best_count = None
    for tp, pp, dp in _layouts(base, max_gpus):
        n = tp * pp * dp
        if best_count is not None and n > best_count:
            break
        lay = _layout_config(base, tp, pp, dp)
        try:
            build_deployment(lay)
        except ConfigError as err:
            tried.append(Option(tp, pp, dp, None, str(err)))
            continue
        search = _Search(lay, slos, window_s=window_s, min_prompts=min_prompts,
                         max_prompts=max_prompts, op_scale=None, progress=None)
        o = Option(tp, pp, dp, search.at(rate))
        tried.append(o)
        if progress is not None:
            progress(o)
        if o.run.meets and best_count is None:
            best_count = n
    meeting = [o for o in tried if o.run is not None and o.run.meets]
    if not meeting:
        return Sizing(rate, slos, None, None, tuple(tried))
    best = max(meeting, key=lambda o: (o.margin(slos), -o.tp))
    cap = find_capacity(_layout_config(cfg, best.tp, best.pp, best.dp), slos,
                        window_s=window_s, min_prompts=min_prompts, max_prompts=max_prompts,
                        envelope=False)
    return Sizing(rate, slos, best, cap, tuple(tried))


def render_sizing(s: Sizing) -> str:
    slos = ", ".join(str(c) for c in s.slos)
    lines = []
    if s.best is None:
        lines.append(f"No layout of up to the GPUs allowed serves {s.target_rate:g} req/s "
                     f"within {slos}.")
    else:
        b = s.best
        lines.append(f"Fewest GPUs for {s.target_rate:g} req/s within {slos}: {b.label}")
        lines.append(f"  its tightest SLO has {b.margin(s.slos):.0%} to spare at the target; "
                     f"its capacity is {s.capacity.rate:,.4g} req/s "
                     f"({s.capacity.rate / s.target_rate:.2f}x the target), "
                     f"bound first by {s.capacity.binding}")
    lines.append("")
    for o in s.tried:
        if o.run is None:
            lines.append(f"  {o.label}: cannot be deployed ({o.reason})")
        else:
            verdict = "meets" if o.run.meets else "misses: " + "; ".join(o.run.violations)
            lines.append(f"  {o.label}: {verdict}")
    return "\n".join(lines)
