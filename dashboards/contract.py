"""Metric names the dashboards and rules read, taken from the telemetry contract (``telemetry.metrics``).

The service's own families are read off the metric objects that ``telemetry.metrics.PrometheusMetrics``
registers (on a throw-away registry), so a rename there reaches every panel and rule; the kernel and vLLM
families come from the contract's name maps. Nothing here spells a metric name.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from telemetry.metrics import KERNEL_METRICS, VLLM_METRICS, VLLM_NATIVE_METRICS, PrometheusMetrics


def _service_families() -> dict[str, str]:
    """Role (the ``PrometheusMetrics`` attribute) -> name as Prometheus stores it (counters get ``_total``)."""
    metrics = PrometheusMetrics(CollectorRegistry(), qps_labels=("0-1",))
    names = {}
    for role in ("stage_duration", "request_duration", "requests", "in_flight", "qps", "retrieved",
                 "stage_errors", "telemetry_dropped"):
        family = next(iter(getattr(metrics, role).describe()))
        names[role] = family.name + "_total" if family.type == "counter" else family.name
    return names


SERVICE = _service_families()
STAGE_DURATION = SERVICE["stage_duration"]
REQUEST_DURATION = SERVICE["request_duration"]
REQUESTS = SERVICE["requests"]
IN_FLIGHT = SERVICE["in_flight"]
QPS = SERVICE["qps"]
STAGE_ERRORS = SERVICE["stage_errors"]
TELEMETRY_DROPPED = SERVICE["telemetry_dropped"]

KERNEL = KERNEL_METRICS
VLLM = VLLM_METRICS
VLLM_NATIVE = VLLM_NATIVE_METRICS


def bucket(family: str) -> str:
    return family + "_bucket"


def count(family: str) -> str:
    return family + "_count"
