"""The Prometheus metrics contract: names, help, closed label sets. Recording lives in ``recorder.py``.

Every label value comes from a closed set declared here (or in ``rag.stages.STAGES`` and the
configured qps buckets); nothing user-controlled (query text, paths, ids) ever becomes a label.
"""

from __future__ import annotations

from typing import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from rag.stages import RETRIEVERS, STAGES
from telemetry.buckets import LATENCY_SECONDS, RETRIEVED_DOCUMENTS

ROUTES = ("/v1/query", "/v1/query/stream")
STAGE_OUTCOMES = ("ok", "error")
REQUEST_OUTCOMES = ("ok", "rejected", "error")  # 2xx/3xx, 4xx (bad input, not ready), 5xx
SIGNALS = ("spans", "metrics")
DROP_REASONS = ("queue_full", "export_failed")

EXPECTED_METRICS = [
    "ragheat_stage_duration_seconds",
    "ragheat_request_duration_seconds",
    "ragheat_requests_in_flight",
    "ragheat_qps",
    "ragheat_retrieved_documents",
    "ragheat_stage_errors_total",
    "ragheat_requests_total",
    "ragheat_telemetry_dropped_total",
    "ragheat_generation_ttft_seconds",
    "ragheat_generation_inter_token_seconds",
    "ragheat_unsupported_sentences_total",
    "ragheat_generation_degraded_total",
    "ragheat_stage_device_seconds",
]
"""Metric families a scrape of a running service must contain (as prometheus_client's parser names them;
counters are listed with ``_total``, which the parser strips from the family name)."""


# Metric families exported by other processes, named here so that their exporters and the dashboards
# (``dashboards/``) share one spelling. Each maps a role to the family name as Prometheus stores it.
KERNEL_METRICS = {
    "runqueue": "ragheat_kernel_runqueue_seconds",      # histogram {stage}: wakeup -> on CPU
    "offcpu": "ragheat_kernel_offcpu_seconds",          # histogram {stage, reason}: off CPU -> back on
    "syscall": "ragheat_kernel_syscall_seconds",        # histogram {stage, family}: enter -> exit
    "tcp_retransmits": "ragheat_kernel_tcp_retransmits_total",  # counter {state}
}
"""``probes/`` (eBPF) exports these; buckets are ``telemetry.buckets.KERNEL_LOG2_SECONDS``."""
KERNEL_STAGES = STAGES + ("http", "other")
"""Stage label values of the kernel metrics: a pipeline stage while a thread carries its ``rh:<stage>`` name
(``rag.threadnames``), ``http`` for the server's event-loop thread, ``other`` for any other thread."""
OFFCPU_REASONS = ("preempted", "blocked", "uninterruptible")
SYSCALL_FAMILIES = ("read", "write", "network", "poll", "futex", "memory", "file", "sleep", "other")
KERNEL_TCP_STATES = ("established", "syn_sent", "syn_recv", "fin_wait1", "fin_wait2", "time_wait", "close",
                     "close_wait", "last_ack", "listen", "closing", "new_syn_recv", "bound_inactive", "other")
"""``state`` label of the retransmit counter: the kernel's TCP states in their ABI order (TCP_ESTABLISHED = 1
... in include/net/tcp_states.h, as /proc/net/tcp numbers them), then ``other`` for anything newer."""

VLLM_METRICS = {
    "step_duration": "ragheat_vllm_step_duration_seconds",        # histogram {phase}
    "scheduled_tokens": "ragheat_vllm_scheduled_tokens",          # histogram {phase}: tokens per engine step
    "kv_blocks_allocated": "ragheat_vllm_kv_blocks_allocated",    # histogram: blocks allocated per step
    "kv_blocks_freed": "ragheat_vllm_kv_blocks_freed",            # histogram: blocks freed per step
    "kv_free_blocks": "ragheat_vllm_kv_free_blocks",              # gauge
    "kv_usage": "ragheat_vllm_kv_usage_ratio",                    # gauge 0..1
    "preemptions": "ragheat_vllm_preemptions_total",              # counter
    "ttft": "ragheat_generation_ttft_seconds",                    # histogram, client side
    "inter_token": "ragheat_generation_inter_token_seconds",      # histogram, client side
    "unsupported_sentences": "ragheat_unsupported_sentences_total",  # counter
    "degraded": "ragheat_generation_degraded_total",              # counter: answers that fell back to extractive
    "device_seconds": "ragheat_stage_device_seconds",             # histogram {stage, clock}: CUDA-event time
}
"""vLLM and generation families (the ``vllm`` generator, the ragheat vLLM plugin, CUDA event timers)."""
VLLM_PHASES = ("prefill", "decode", "mixed")
VLLM_NATIVE_METRICS = {
    "ttft": "vllm:time_to_first_token_seconds",
    "inter_token": "vllm:inter_token_latency_seconds",
    "kv_usage": "vllm:kv_cache_usage_perc",
    "running": "vllm:num_requests_running",
    "waiting": "vllm:num_requests_waiting",
    "preemptions": "vllm:num_preemptions_total",
}
"""vLLM's own metric names (v1 engine) that dashboards read next to ours."""


class PrometheusMetrics:
    """The service's metric objects, registered on ``registry`` (a fresh one per app or test)."""

    def __init__(self, registry: CollectorRegistry, qps_labels: Sequence[str]) -> None:
        self.qps_labels = tuple(qps_labels)
        self.stage_duration = Histogram(
            "ragheat_stage_duration_seconds",
            "Time one RAG pipeline stage took for one request, by stage, load level at request start and outcome.",
            ["stage", "qps_bucket", "outcome"], buckets=LATENCY_SECONDS, registry=registry)
        self.request_duration = Histogram(
            "ragheat_request_duration_seconds",
            "End-to-end time of one API request as the server saw it, by route, load level and outcome.",
            ["route", "qps_bucket", "outcome"], buckets=LATENCY_SECONDS, registry=registry)
        self.requests = Counter(
            "ragheat_requests", "API requests by route and HTTP status class.",
            ["route", "status_class"], registry=registry)
        self.in_flight = Gauge(
            "ragheat_requests_in_flight", "API requests being served right now.", ["route"], registry=registry)
        self.qps = Gauge(
            "ragheat_qps", "API request rate (requests per second) over the sliding qps window.", registry=registry)
        self.retrieved = Histogram(
            "ragheat_retrieved_documents", "Chunks a retriever returned for one request, before fusion.",
            ["retriever"], buckets=RETRIEVED_DOCUMENTS, registry=registry)
        self.stage_errors = Counter(
            "ragheat_stage_errors", "Requests that failed in a pipeline stage, by stage.", ["stage"],
            registry=registry)
        self.generation_ttft = Histogram(
            VLLM_METRICS["ttft"], "Time to the first generated token as the service saw it (streamed generators).",
            buckets=LATENCY_SECONDS, registry=registry)
        self.generation_inter_token = Histogram(
            VLLM_METRICS["inter_token"], "Time between consecutive streamed tokens as the service saw it.",
            buckets=LATENCY_SECONDS, registry=registry)
        self.unsupported_sentences = Counter(
            VLLM_METRICS["unsupported_sentences"].removesuffix("_total"),
            "Answer sentences the support check found unsupported by the passages they cite.", registry=registry)
        self.generation_degraded = Counter(
            VLLM_METRICS["degraded"].removesuffix("_total"),
            "Answers that fell back to the extractive generator because the LLM was down or slow.",
            registry=registry)
        self.stage_device = Histogram(
            VLLM_METRICS["device_seconds"],
            "Device time of the GPU-capable work inside one stage (embed, retrieve_dense): CUDA events "
            "(clock=cuda), or that work's own host time without a GPU (clock=monotonic).",
            ["stage", "clock"], buckets=LATENCY_SECONDS, registry=registry)
        self.telemetry_dropped = Counter(
            "ragheat_telemetry_dropped", "Spans or metric batches dropped instead of slowing requests, by reason.",
            ["signal", "reason"], registry=registry)
        self._children: dict = {}
        # Create every closed-set series up front: a rate() over a series that appears late reads as missing.
        for route in ROUTES:
            self.in_flight.labels(route)
            for status in ("2xx", "4xx", "5xx"):  # what the SLI ratios divide by: present from the first scrape
                self.requests.labels(route, status)
        for stage in STAGES:
            self.stage_errors.labels(stage)
        for retriever in RETRIEVERS:
            self.retrieved.labels(retriever)
        for signal in SIGNALS:
            for reason in DROP_REASONS:
                self.telemetry_dropped.labels(signal, reason)


    def child(self, metric, *label_values):
        """``metric.labels(*label_values)``, cached: ``labels()`` validates and locks on every call, which
        is a measurable share of per-request cost when a request makes eight observations."""
        key = (id(metric), label_values)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*label_values)
        return found


def status_class(status: int) -> str:
    return f"{status // 100}xx" if 100 <= status < 600 else "other"


def request_outcome(status: int) -> str:
    return "error" if status >= 500 else "rejected" if status >= 400 else "ok"
