"""A cluster of GPU nodes on a network fabric, and engines placed on it."""

HEADLINE_METRICS = ("network_share_of_request_latency", "network_share_of_step_time",
                    "congestion_share_of_step_time")
"""Cluster figures `simulate` also puts at the top level of a result, where a study can name
them as objectives."""
