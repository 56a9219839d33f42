"""The workload: which requests a `vllm bench serve` client sends, and when."""

from simcore.workload.config import WorkloadConfig
from simcore.workload.generate import (RequestStream, Workload, generate_requests,
                                       generate_workload, is_refused, request_stream)
from simcore.workload.spec import RequestSpec

__all__ = ["RequestSpec", "RequestStream", "Workload", "WorkloadConfig", "generate_requests",
           "generate_workload", "is_refused", "request_stream"]
