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

A layout that cannot reach the target is not run either: its TP x PP with one replica is run
first (it has the fewest GPUs of its TP), and a replica serves no more requests a second than
that run served with the target's load on it alone (at a rate it cannot keep up with, all but
the last of its requests queued). Replicas share a router's load, so DP of them serve at most DP
times that; a layout whose bound is under a quarter of the target (`BOUND_MARGIN`: a burst's
ramp and drain, and a router's imbalance, never cost a factor of four) is listed as skipped with
the bound, not simulated. No bound is taken from a run with failed requests, nor where clients
time out (`workload.request_timeout_s`: an overloaded replica then completes far less than it
can), nor with expert parallelism (DP ranks share the experts, so more of them hold fewer
weights each and more KV cache: DP ranks serve more than DP times one), and disaggregated
layouts are always run. A target no aggregated layout can approach is
then answered after one aggregated run per TP instead of one per layout.

With a `cluster` section the candidates are run on that cluster (at most its GPUs), and
disaggregated layouts join them: prefill and decode instances, each role with its own TP over
the same powers of two, as many of each as the GPU budget allows. Both kinds are ordered by GPU
count together, so the answer is the mode and layout on the fewest GPUs, the widest margin
deciding between layouts of one count.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from dse.capacity import (Capacity, RateRun, _check_workload, _Search, _with_slo_metrics,
                          find_capacity)
from dse.study import Constraint
from simcore.config import SimConfig
from simcore.errors import ConfigError


BOUND_MARGIN = 4.0
"""A layout of DP replicas is skipped when the target exceeds this many times DP x the request
throughput its TP x PP served alone at the target (the module docstring)."""


@dataclass(frozen=True)
class Option:
    """One parallelism tried: its layout, and its run at the target rate (or why none)."""

    tp: int
    pp: int
    dp: int
    run: RateRun | None
    reason: str | None = None
    num_prefill: int = 0
    """Disaggregated layouts: prefill instances of TP `prefill_tp` and decode instances of TP
    `tp`, each of PP `pp` (`dp` is 1); 0 for an aggregated layout."""
    num_decode: int = 0
    prefill_tp: int = 0
    skipped: bool = False
    """Not run: its replicas together cannot serve the target (`reason` gives the bound)."""
    served_alone: float | None = None
    """A skipped layout: the request throughput one replica of its TP x PP served at the
    target, which bounds it."""
    stopped: bool = False
    """Deployable, but its run at the target stopped (`reason` says why), e.g. a KV cache that
    cannot hold what it must keep."""

    @property
    def disaggregated(self) -> bool:
        return self.num_prefill > 0

    @property
    def num_gpus(self) -> int:
        if self.disaggregated:
            return self.pp * (self.num_prefill * self.prefill_tp + self.num_decode * self.tp)
        return self.tp * self.pp * self.dp

    @property
    def label(self) -> str:
        if self.disaggregated:
            return (f"{self.num_prefill} prefill x TP {self.prefill_tp} + {self.num_decode} "
                    f"decode x TP {self.tp}" + (f", PP {self.pp}" if self.pp > 1 else "")
                    + f" ({self.num_gpus} GPUs)")
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
    with_disaggregated: bool = False
    """Whether disaggregated layouts were candidates (the config has a cluster section)."""

    def why(self) -> str | None:
        """Why the answer is the one it is: its mode, GPU count and margin against the rest."""
        b = self.best
        if b is None:
            return None
        same = [o for o in self.tried if o.run is not None and o.run.meets
                and o.num_gpus == b.num_gpus]
        fewer = [o for o in self.tried if o.run is not None and o.num_gpus < b.num_gpus]
        mode = "disaggregated" if b.disaggregated else "aggregated"
        text = (f"chose {mode}: no layout of fewer GPUs meets the SLOs at the target "
                f"({len(fewer)} run)")
        if len(same) > 1:
            others = {("disaggregated" if o.disaggregated else "aggregated") for o in same}
            text += (f", and of the {len(same)} layouts of {b.num_gpus} GPUs that meet "
                     f"({' and '.join(sorted(others))}) it has the widest margin to its "
                     "tightest SLO")
        if self.with_disaggregated:
            kinds = {o.disaggregated for o in self.tried if o.run is not None}
            if kinds == {b.disaggregated}:
                text += ("; no layout of the other mode could be deployed at this GPU count or "
                         "below")
        return text

    def as_dict(self) -> dict:
        def opt(o: Option) -> dict:
            out = {"serving": "disaggregated" if o.disaggregated else "aggregated",
                   "tp": o.tp, "pp": o.pp, "dp": o.dp, "num_gpus": o.num_gpus,
                   "meets": bool(o.run and o.run.meets), "reason": o.reason,
                   "skipped": o.skipped, "served_alone": o.served_alone,
                   "stopped": o.stopped,
                   "run": o.run.as_dict() if o.run else None}
            if o.disaggregated:
                out.update(num_prefill_instances=o.num_prefill,
                           num_decode_instances=o.num_decode, prefill_tp=o.prefill_tp,
                           decode_tp=o.tp)
            return out
        return {"target_rate": self.target_rate, "slos": [str(c) for c in self.slos],
                "best": opt(self.best) if self.best else None,
                "why": self.why(), "with_disaggregated": self.with_disaggregated,
                "capacity": self.capacity.as_dict() if self.capacity else None,
                "tried": [opt(o) for o in self.tried]}


def _tp_sizes(cfg: SimConfig) -> list[int]:
    """The tensor-parallel sizes tried: powers of two that divide the attention heads and fit a
    node."""
    from pathlib import Path

    gpn = cfg.hardware.gpus_per_node or cfg.hardware.resolve().gpus_per_node
    heads = cfg.model.resolve(Path(cfg.base_dir)).num_attention_heads
    return [t for t in (1, 2, 4, 8, 16) if t <= gpn and heads % t == 0]


def _layouts(tps: list[int], pp: int, n: int) -> list[tuple[int, int, int]]:
    """(TP, PP, DP) of exactly `n` GPUs, by TP."""
    return [(tp, pp, n // (tp * pp)) for tp in tps if n % (tp * pp) == 0]


def _pd_layouts(tps: list[int], pp: int, n: int) -> list[tuple[int, int, int, int, int]]:
    """(prefill TP, decode TP, PP, prefill instances, decode instances) of exactly `n` GPUs, by
    decode TP, then prefill TP, then prefill instances."""
    if n % pp:
        return []
    per_stage = n // pp
    out = []
    for tp_d in tps:
        for tp_p in tps:
            for n_p in range(1, per_stage // tp_p + 1):
                rest = per_stage - n_p * tp_p
                if rest >= tp_d and rest % tp_d == 0:
                    out.append((tp_p, tp_d, pp, n_p, rest // tp_d))
    return out


def _layout_config(cfg: SimConfig, tp: int, pp: int, dp: int) -> SimConfig:
    """An aggregated layout: DP ranks of TP x PP, as one replica (the config's `num_replicas`
    would multiply its GPUs), without the config's disaggregation."""
    if cfg.parallelism.prefill_decode is not None:
        cfg = cfg.with_section("parallelism", prefill_decode=None)
    return cfg.with_section("parallelism", tensor_parallel_size=tp, pipeline_parallel_size=pp,
                            data_parallel_size=dp, num_replicas=1)


def _option_config(cfg: SimConfig, o: Option) -> SimConfig:
    """The config of one candidate layout; a disaggregated one keeps the rest of the config's
    `prefill_decode` (the roles' GPUs and expert parallelism)."""
    if not o.disaggregated:
        return _layout_config(cfg, o.tp, o.pp, o.dp)
    from simcore.config import PrefillDecodeConfig

    counts = {"num_prefill_instances": o.num_prefill, "num_decode_instances": o.num_decode,
              "prefill_tensor_parallel_size": o.prefill_tp, "decode_tensor_parallel_size": o.tp}
    given = cfg.parallelism.prefill_decode
    pd = (PrefillDecodeConfig(**counts) if given is None
          else PrefillDecodeConfig.model_validate({**given.model_dump(), **counts}))
    return cfg.with_section("parallelism", tensor_parallel_size=o.tp, pipeline_parallel_size=o.pp,
                            data_parallel_size=1, num_replicas=1, prefill_decode=pd)


def _candidates(cfg: SimConfig, max_gpus: int) -> Iterator[Option]:
    """Every layout to try, by GPU count (aggregated first within a count): the config's TP x
    PP x DP, and with a cluster section its disaggregated layouts too, on at most its GPUs;
    made one GPU count at a time, as the search reaches it (a cluster of thousands of GPUs has
    millions of disaggregated layouts)."""
    tps = _tp_sizes(cfg)
    pp = cfg.parallelism.pipeline_parallel_size
    for n in range(1, max_gpus + 1):
        for tp, _, dp in _layouts(tps, pp, n):
            yield Option(tp, pp, dp, None)
        if cfg.cluster is not None:
            for tp_p, tp_d, _, n_p, n_d in _pd_layouts(tps, pp, n):
                yield Option(tp_d, pp, 1, None, num_prefill=n_p, num_decode=n_d,
                             prefill_tp=tp_p)


def _deploy_problem(lay: SimConfig) -> str | None:
    """Why a candidate's config cannot be deployed on its cluster, or None."""
    from dse.evaluate import deploy_check
    from simcore.cluster.placement import place

    try:
        deploy_check(lay)
        c, par = lay.cluster, lay.parallelism
        if c is not None and par.prefill_decode is None:
            gpn = lay.hardware.gpus_per_node or lay.hardware.resolve().gpus_per_node
            place(num_nodes=c.num_nodes, gpus_per_node=gpn, tp=par.tensor_parallel_size,
                  pp=par.pipeline_parallel_size, dp=par.data_parallel_size,
                  expert_parallel=par.enable_expert_parallel, num_replicas=par.num_replicas)
    except ConfigError as err:
        return str(err)
    return None


def fewest_gpus(cfg: SimConfig, rate: float, slos: tuple[Constraint, ...], *,
                max_gpus: int = 64, window_s: float = 120.0, min_prompts: int = 200,
                max_prompts: int = 20_000, tolerance: float = 0.05, progress=None,
                capacity_progress=None) -> Sizing:
    """The layout on the fewest GPUs whose run at `rate` meets `slos` (see the module
    docstring), its capacity found within `tolerance`; raises ConfigError for a workload whose
    rate cannot vary or a bad target. `progress(option)` follows the layouts' runs,
    `capacity_progress(run)` the answer's capacity search."""
    from dataclasses import replace

    from simcore.setup import build_deployment

    if not (rate > 0 and math.isfinite(rate)):
        raise ConfigError("--target-rate: must be a positive, finite number of requests per "
                          "second")
    if cfg.cluster is None and cfg.parallelism.prefill_decode is not None:
        raise ConfigError("parallelism.prefill_decode: disaggregation moves KV caches over a "
                          "network; add a cluster section")
    _check_workload(cfg)
    base = _with_slo_metrics(cfg, slos)
    if cfg.cluster is not None:
        gpn = cfg.hardware.gpus_per_node or cfg.hardware.resolve().gpus_per_node
        max_gpus = min(max_gpus, cfg.cluster.num_nodes * gpn)
    tried: list[Option] = []
    best_count = None
    # (TP, PP) -> the request throughput its one replica served at the target.
    served_alone: dict[tuple[int, int], float] = {}
    for cand in _candidates(base, max_gpus):
        n = cand.num_gpus
        if best_count is not None and n > best_count:
            break
        alone = None if cand.disaggregated else served_alone.get((cand.tp, cand.pp))
        if alone is not None and rate > BOUND_MARGIN * cand.dp * alone:
            tried.append(replace(cand, skipped=True, served_alone=alone, reason=(
                f"{cand.dp} replicas serve at most about {cand.dp} x {alone:,.4g} req/s (what "
                f"one replica of TP {cand.tp} x PP {cand.pp} served at the target), under "
                f"1/{BOUND_MARGIN:g} of the target")))
            continue
        lay = _option_config(base, cand)
        if cfg.cluster is None:
            try:
                build_deployment(lay)
                problem = None
            except ConfigError as err:
                problem = str(err)
        else:
            problem = _deploy_problem(lay)
        if problem is not None:
            tried.append(replace(cand, reason=problem))
            continue
        search = _Search(lay, slos, window_s=window_s, min_prompts=min_prompts,
                         max_prompts=max_prompts, op_scale=None, progress=None)
        try:
            o = replace(cand, run=search.at(rate))
        except (ConfigError, RuntimeError) as err:
            # e.g. an engine whose KV cache cannot hold what it must keep: no steady state.
            tried.append(replace(cand, stopped=True, reason=str(err)))
            continue
        tried.append(o)
        if (not cand.disaggregated and cand.dp == 1 and not o.run.failed
                and cfg.workload.request_timeout_s is None
                and not cfg.parallelism.enable_expert_parallel):
            # A client that gives up makes an overloaded replica serve less than it can: no
            # bound from a run with timeouts or failures. Nor with expert parallelism: DP ranks
            # share the experts, so each holds fewer weights and more KV cache, and DP of them
            # serve more than DP times one.
            served_alone[(cand.tp, cand.pp)] = o.run.request_throughput
        if progress is not None:
            progress(o)
        if o.run.meets and best_count is None:
            best_count = n
    meeting = [o for o in tried if o.run is not None and o.run.meets]
    with_pd = cfg.cluster is not None
    if not meeting:
        return Sizing(rate, slos, None, None, tuple(tried), with_disaggregated=with_pd)
    best = max(meeting, key=lambda o: (o.margin(slos), -o.tp, -o.prefill_tp))
    cap = find_capacity(_option_config(cfg, best), slos,
                        window_s=window_s, min_prompts=min_prompts, max_prompts=max_prompts,
                        envelope=False, start=rate, tolerance=tolerance,
                        progress=capacity_progress)
    return Sizing(rate, slos, best, cap, tuple(tried), with_disaggregated=with_pd)


def render_sizing(s: Sizing) -> str:
    slos = ", ".join(str(c) for c in s.slos)
    lines = []
    if s.best is None:
        lines.append(f"No layout of up to the GPUs allowed serves {s.target_rate:g} req/s "
                     f"within {slos}.")
    else:
        b = s.best
        lines.append(f"Fewest GPUs for {s.target_rate:g} req/s within {slos}: {b.label}")
        if s.with_disaggregated:
            lines.append(f"  {s.why()}")
        lines.append(f"  its tightest SLO has {b.margin(s.slos):.0%} to spare at the target; "
                     f"its capacity is {s.capacity.rate:,.4g} req/s "
                     f"({s.capacity.rate / s.target_rate:.2f}x the target), "
                     f"bound first by {s.capacity.binding}")
    lines.append("")
    skipped: dict[tuple[int, int], list[Option]] = {}
    for o in s.tried:
        if o.skipped:
            skipped.setdefault((o.tp, o.pp), []).append(o)
    for o in s.tried:
        if o.skipped:
            group = skipped.pop((o.tp, o.pp), None)
            if group is None:       # listed with the first of its TP x PP
                continue
            lo, hi = group[0], group[-1]
            dps = f"{lo.dp}" if lo is hi else f"{lo.dp}-{hi.dp}"
            gpus = f"{lo.num_gpus}" if lo is hi else f"{lo.num_gpus}-{hi.num_gpus}"
            lines.append(f"  TP {o.tp} x PP {o.pp} x DP {dps} ({gpus} GPUs): not run: DP "
                         f"replicas serve at most about DP x {o.served_alone:,.4g} req/s (what one "
                         f"replica served at the target), under 1/{BOUND_MARGIN:g} of the target")
        elif o.stopped:
            lines.append(f"  {o.label}: the run stopped ({o.reason})")
        elif o.run is None:
            lines.append(f"  {o.label}: cannot be deployed ({o.reason})")
        else:
            verdict = "meets" if o.run.meets else "misses: " + "; ".join(o.run.violations)
            lines.append(f"  {o.label}: {verdict}")
    return "\n".join(lines)
