"""Metric names the dashboards and rules read, taken from the telemetry contract's one table
(``telemetry.metrics.METRICS``), so a rename there reaches every panel and rule. Nothing here spells a metric name.
"""

from __future__ import annotations

from rag.stages import BAD_VERDICTS, QUALITY_LEVELS, QUALITY_VERDICTS
from telemetry.metrics import (GENERATION_METRICS, HOST_METRICS, KERNEL_METRICS, MILVUS_LABELS, MILVUS_NATIVE_METRICS,
                               QUALITY_METRICS, QUALITY_POINTS, QUALITY_SIGNAL_FAMILIES, SERVICE_METRICS, VLLM_METRICS,
                               VLLM_NATIVE_METRICS)
from telemetry.otlp_metrics import REQUEST_DURATION as OTLP_REQUEST_DURATION
from telemetry.otlp_metrics import STAGE_DURATION as OTLP_STAGE_DURATION
from telemetry.otlp_metrics import prometheus_name

SERVICE = SERVICE_METRICS
"""Role -> name as Prometheus stores it (counters end in ``_total``) of the service's own families."""
STAGE_DURATION = SERVICE["stage_duration"]
REQUEST_DURATION = SERVICE["request_duration"]
REQUESTS = SERVICE["requests"]
IN_FLIGHT = SERVICE["in_flight"]
QPS = SERVICE["qps"]
STAGE_ERRORS = SERVICE["stage_errors"]
TELEMETRY_DROPPED = SERVICE["telemetry_dropped"]
RETRIEVAL_ROUTES = SERVICE["retrieval_routes"]
STAGE_SKIPPED = SERVICE["stage_skipped"]
SHED = SERVICE["shed"]
CACHE_REQUESTS = SERVICE["cache_requests"]
CACHE_ENTRIES = SERVICE["cache_entries"]
CACHE_BYTES = SERVICE["cache_bytes"]
QUALITY_LEVEL = SERVICE["quality_level"]
QUALITY_LEVEL_CHANGES = SERVICE["quality_level_changes"]
PRIORITY_REQUESTS = SERVICE["priority_requests"]

# The load controller's label values, from the closed sets rag.stages declares.
LEVELS = QUALITY_LEVELS
"""The quality ladder's rungs, best first: ``QUALITY_LEVEL``'s value is a rung's place here."""
NOT_ANSWERED = "none"
"""The ``quality_level`` of a request the pipeline did not answer (refused, failed)."""

# The same two latencies pushed over OTLP as exponential histograms and remote-written by the OTel Collector: native
# histograms, one series each, named as the collector's prometheusremotewrite exporter names them.
NATIVE_STAGE_DURATION = prometheus_name(OTLP_STAGE_DURATION)
NATIVE_REQUEST_DURATION = prometheus_name(OTLP_REQUEST_DURATION)

GENERATION = GENERATION_METRICS
QUALITY = QUALITY_METRICS
ANSWER_QUALITY = QUALITY["answer_quality"]
QUALITY_SCORE = QUALITY["quality_score"]
RERANK_SCORE = QUALITY["quality_rerank_score"]
SIGNAL_FAMILY = {signal: QUALITY[family] for signal, family in QUALITY_SIGNAL_FAMILIES.items()}
"""Each quality signal's histogram family."""
CALIBRATION = QUALITY["quality_calibration"]
JUDGED = QUALITY["judged"]

# The quality SLO's label values, from the closed sets rag.quality declares.
VERDICTS = QUALITY_VERDICTS
BAD = BAD_VERDICTS
UNSCORED = "unscored"
"""The verdict of an answer with no similarity to judge by: on neither side of the quality SLI."""
BEST_SIMILARITY = "best_similarity"
"""The signal the ``no_good_passage`` verdict and its calibrated threshold read."""
RETRIEVER_AGREEMENT = "retriever_agreement"
"""The signal a dense index that no longer matches its chunks moves (the dense list stops resembling BM25's)."""
ANSWER_SUPPORT = "answer_support"
"""The share of a written answer's sentences the support check accepted; its ``threshold`` point is
``quality.min_support``."""
THRESHOLD, MEDIAN, P10, P05 = (QUALITY_POINTS["threshold"], QUALITY_POINTS["0.5"], QUALITY_POINTS["0.1"],
                               QUALITY_POINTS["0.05"])
"""``point`` values of the calibration gauge: the threshold and the training questions' median, 10th and 5th
percentiles."""
HOST = HOST_METRICS
KERNEL = KERNEL_METRICS
VLLM = VLLM_METRICS
VLLM_NATIVE = VLLM_NATIVE_METRICS
MILVUS = MILVUS_NATIVE_METRICS
MILVUS_LABEL = MILVUS_LABELS

LIBRARY = (STAGE_DURATION, REQUEST_DURATION, REQUESTS, IN_FLIGHT, QPS, STAGE_ERRORS, *HOST.values())
"""The families ragheat's instrumentation library emits from any Python RAG service, under the names and labels of
ragheat's own service: what the boards may ask of a library-only service."""
PIPELINE_ONLY = frozenset({*(SERVICE[role] for role in (
    "retrieved", "retrieval_routes", "stage_skipped", "stage_device", "rejected", "shed", "index_reloads",
    "cache_requests", "cache_entries", "cache_bytes", "quality_level", "quality_level_changes", "priority_requests")),
    *GENERATION.values(), *QUALITY.values()})
"""Families only ragheat's own service feeds (its retrievers, router, admission, load controller, reloads, answer
cache, its language model's client side, and its answers' quality). vLLM's and the probes' families are not here:
those exporters run beside any service, or not at all."""


def bucket(family: str) -> str:
    """The series of a histogram's buckets."""
    return family + "_bucket"


def count(family: str) -> str:
    """The series of a histogram's observation count."""
    return family + "_count"
