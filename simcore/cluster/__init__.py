"""A cluster of GPU nodes on a network fabric, and engines placed on it."""

HEADLINE_METRICS = ("network_share_of_request_latency", "network_share_of_step_time",
                    "congestion_share_of_step_time")
"""Cluster figures `simulate` also puts at the top level of a result, where a study can name
them as objectives."""

FABRIC_HEALTH_METRICS = {"fabric_pfc_pause_frames": "pfc_pause_frames",
                         "fabric_drops": "drops",
                         "fabric_dcqcn_rate_cuts": "dcqcn_rate_cuts",
                         "fabric_ecn_marks": "ecn_marks"}
"""The fabric's health counters `simulate` also puts at the top level of a cluster result
(top-level name -> key of result["cluster"]["fabric"]), with `fabric_p99_step_slowdown` (the
99th percentile of the engines' messages' completion time over their time alone on an idle
network, 1 when none was slowed), so that a study can bound them as SLOs or minimise them."""

STEP_SLOWDOWN_METRIC = "fabric_p99_step_slowdown"
"""The top-level name of the engines' p99 message slowdown (see FABRIC_HEALTH_METRICS)."""

TOP_LEVEL_METRICS = (*HEADLINE_METRICS, *FABRIC_HEALTH_METRICS, STEP_SLOWDOWN_METRIC)
"""Every cluster figure a result also carries at its top level, after the cluster section."""
