"""What a search checks before any trial runs, so that bad input is one sentence and never a
half-run study: fidelity overrides that would hide a searched value, searched parameters no stage
reads, a base configuration `dse simulate` would refuse (with the confirmation overrides too),
and outputs that cannot be written."""

from __future__ import annotations

from dse.backends import check_storage_writable
from dse.evaluate import EvalSpec, deploy_check, static_metric_names, trial_mapping
from dse.fidelity import check_parameters_have_effect
from dse.outputs import write_problem
from dse.study import StudyConfig
from simcore.config import parse_config
from simcore.errors import ConfigError


def check_before_search(study: StudyConfig) -> None:
    """Every check that needs no simulation and no Ray, in the order a user would fix them."""
    check_overrides(study)
    check_space_applies(study)
    check_parameters_have_effect(study)
    check_base(study)
    check_confirm(study)
    check_outputs(study)


def check_overrides(study: StudyConfig) -> None:
    """Refuse a fidelity override of a path the space searches (it would hide the value)."""
    params = list(study.space.parameters)
    stages = [("screen", study.fidelity.screen), ("confirm", study.fidelity.confirm or {})]
    for stage, overrides in stages:
        for path in overrides:
            for p in params:
                if path == p or path.startswith(p + ".") or p.startswith(path + "."):
                    raise ConfigError(f"fidelity.{stage}: {path} is also a search parameter "
                                      f"({p}); a fidelity override would hide its value")


def check_space_applies(study: StudyConfig) -> None:
    """Refuse a space none of whose parameters exists for the base (each `when` names a model
    kind the base is not: every trial would be the base again), and disaggregated serving on a
    base without the cluster it needs (every such trial would be undeployable)."""
    if not study.space.active(study.base):
        raise ConfigError("space: no parameter applies to the base's model (each one's `when` "
                          "names another kind of model); every trial would run the base")
    if "disaggregated" in (study.space.serving or ()) and "cluster" not in study.base:
        raise ConfigError("space.serving: disaggregated serving moves KV caches over a network; "
                          "add a cluster section to the base")
    check_searched_values(study)


def check_searched_values(study: StudyConfig) -> None:
    """Refuse a searched value that the base makes a refusal of every trial that draws it: a
    scheduling policy the base's workload refuses (`simcore.simulate.check_policy`), expert
    parallelism beside the base's compute.moe_routing (which it leaves with no effect). A base
    that does not validate or whose workload cannot be read is left to `check_base`."""
    from simcore.simulate import check_policy
    from simcore.workload.generate import config_requests

    active = study.space.active(study.base)
    policy = active.get("engine.scheduling_policy")
    check_routing_beside_expert_parallel(study, active)
    if policy is None:
        return
    try:
        specs = config_requests(parse_config(study.base, source="base"))
    except ConfigError:
        return
    for choice in getattr(policy, "choices", ()):
        try:
            check_policy(choice, specs)
        except ConfigError as err:
            raise ConfigError(f"space.engine.scheduling_policy: the choice {choice} is refused "
                              f"for the base's workload ({err})") from None


EP_PATH = "parallelism.enable_expert_parallel"
ROUTING_PATH = "compute.moe_routing"
ROUTING_INERT = "compute.moe_routing: has no effect"
"""The start of the config's refusal of a routing that every role's expert parallelism leaves
with no effect (`simcore.config.SimConfig`'s check)."""


def check_routing_beside_expert_parallel(study: StudyConfig, active: dict) -> None:
    """Refuse a compute.moe_routing (the base's or a searched choice) that the expert
    parallelism of some trials (the base's or a searched choice) leaves with no effect: each
    pair of their values is read as a trial reads it (so a choice written "true" counts as
    true), and the config's own check decides, since a role kept without expert parallelism
    still reads the routing."""
    ep = active.get(EP_PATH)
    routing = active.get(ROUTING_PATH)
    base_routing = (study.base.get("compute") or {}).get("moe_routing")
    if routing is None and (ep is None or base_routing is None):
        return
    ep_values = list(getattr(ep, "choices", ())) if ep is not None else [None]
    routings = list(getattr(routing, "choices", ())) if routing is not None else [base_routing]
    for route in routings:
        if route is None:
            continue
        for value in ep_values:
            values = {ROUTING_PATH: route}
            if value is not None:
                values[EP_PATH] = value
            try:
                parse_config(trial_mapping(study.base, values, {}), source="base")
            except ConfigError as err:
                if ROUTING_INERT not in str(err):
                    continue        # another refusal: check_base or the trial names it
                why = ("an expert-parallel group's roofline times the routed experts, routing "
                       "uniformly")
                if routing is None:
                    raise ConfigError(f"base: compute.moe_routing: has no effect on the trials "
                                      f"with expert parallelism that space.{EP_PATH} searches "
                                      f"({why}); remove it from the base") from None
                where = (f"the trials with expert parallelism that space.{EP_PATH} searches"
                         if ep is not None else "the base's expert parallelism")
                raise ConfigError(f"space.{ROUTING_PATH}: the choice {route} has no effect on "
                                  f"{where} ({why}); search the routing without expert "
                                  f"parallelism") from None


def check_base(study: StudyConfig) -> None:
    """Refuse a base configuration that `dse simulate` would refuse at start-up (it does not
    validate, or vLLM's checks fail: TP does not divide the heads, the model does not fit),
    with `dse simulate`'s sentence under `base:`, and one whose workload a capacity objective
    cannot vary the rate of (`dse capacity` refuses it alike). Cheap: nothing is simulated."""
    cfg = parse_config(study.base, source="base")
    try:
        deploy_check(cfg)
        if EvalSpec.of(study).wants_capacity:
            # A capacity objective varies the request rate: the workload must let it.
            from dse.capacity import _check_workload
            _check_workload(cfg)
    except ConfigError as err:
        raise ConfigError(f"base: {err}") from None


def check_confirm(study: StudyConfig) -> None:
    """Refuse confirmation overrides with which the base would not run (a misspelt setting, a
    bad value), under `fidelity.confirm:`, before screening spends its trials: found only at
    the confirmation stage, the study could not be resumed with them mended (its fidelity is
    part of its identity)."""
    if not study.fidelity.confirm:
        return
    try:
        _names_of_runnable(study.base, study.fidelity.confirm)
    except ConfigError as err:
        raise ConfigError(f"fidelity.confirm: the base with these overrides cannot run "
                          f"({err})") from None


def base_metric_names(study: StudyConfig) -> set[str]:
    """The metric names a screening trial of the base reports (`static_metric_names`, screen
    overrides applied), once the base passes the checks `dse simulate` makes before its run:
    the configuration validates, vLLM's start-up checks pass, and the workload's data can be
    read. Nothing is simulated.

    A base that fails them is refused under `base:`, as `dse simulate` words it; one that fails
    only with the screen overrides, under `fidelity.screen:`.
    """
    try:
        return _names_of_runnable(study.base, study.fidelity.screen)
    except ConfigError as err:
        if study.fidelity.screen:
            try:
                _names_of_runnable(study.base, {})
            except ConfigError:
                pass
            else:
                raise ConfigError(f"fidelity.screen: the base with these overrides cannot run "
                                  f"({err})") from None
        raise ConfigError(f"base: {err}") from None


def _names_of_runnable(base: dict, overrides: dict) -> set[str]:
    """`static_metric_names` of the base with the overrides, after `dse simulate`'s checks
    before a run; their ConfigError, without a source prefix, when one fails."""
    from simcore.simulate import check_runnable
    from simcore.workload.generate import config_requests

    source = "base"
    try:
        cfg = parse_config(trial_mapping(base, {}, overrides), source=source)
    except ConfigError as err:
        raise ConfigError(str(err).removeprefix(f"{source}: ")) from None
    deploy_check(cfg)
    check_runnable(cfg, config_requests(cfg))
    return static_metric_names(cfg)


def check_outputs(study: StudyConfig) -> None:
    """Refuse a report folder or storage file that cannot be written, before anything runs: the
    folder first, which holds the storage unless the study names one."""
    problem = write_problem(study.report_dir, folder=True)
    if problem:
        raise ConfigError(f"report.dir: cannot write the report to {study.report_dir}: {problem}")
    check_storage_writable(study.storage_url)
