"""The Prometheus metrics contract: one table of every family ragheat exports (name, type, help, labels, buckets)
and the closed label sets. Recording lives in ``recorder.py``.

``METRICS`` is the single place a metric is named: ``PrometheusMetrics`` (the service), the vLLM plugin and the
kernel probes' collector create their families from it, ``EXPECTED_METRICS`` (what a scrape must show) and the
dashboards' contract (``dashboards.contract``) are read off it. Every label value comes from a closed set declared
once, here or where rag defines it (``rag.stages``, ``rag.api.access``, ``rag.api.admission``), or from the configured
qps buckets; nothing user-controlled (query text, paths, ids) ever becomes a label.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from rag.api.access import REJECTION_REASONS
from rag.api.admission import SHED_REASONS
from rag.stages import (CACHE_OUTCOMES, CONDITIONAL_STAGES, DEGRADED_REASONS, JUDGE_OUTCOMES, LEVEL_DIRECTIONS,
                        OPTIONAL_STAGES, PER_SENTENCE_SIGNALS, PRIORITIES, PRIORITY_OUTCOMES, QUALITY_VERDICTS,
                        RELOAD_OUTCOMES, RERANK_SIGNALS, RETRIEVAL_ROUTES, RETRIEVERS, SKIPPABLE_STAGES, STAGES,
                        UNIT_SIGNALS)
from telemetry.buckets import (KERNEL_LOG2_SECONDS, LATENCY_SECONDS, PER_SENTENCE, RERANK_SCORES, RETRIEVED_DOCUMENTS,
                               UNIT_SCORES, VLLM_STEP_BLOCKS, VLLM_STEP_TOKENS)

ROUTES = ("/v1/query", "/v1/query/stream")
STAGE_OUTCOMES = ("ok", "error")
REQUEST_OUTCOMES = ("ok", "rejected", "error")  # 2xx/3xx, 4xx (bad input, not ready), 5xx
SIGNALS = ("spans", "metrics")
DROP_REASONS = ("queue_full", "export_failed")
FOREIGN_STAGES = ("retrieve", "tool", "other")
"""Stage label values only a service ragheat did not write uses (``telemetry.observe``): a retriever of unknown kind,
a tool call, and ``other`` for any stage name outside the closed set."""
STAGE_LABELS = STAGES + FOREIGN_STAGES
"""Every value the ``stage`` label of the stage histograms may take."""
KERNEL_STAGES = STAGE_LABELS + ("http", "event_loop")
"""Stage label values of the kernel metrics: a stage while a thread carries its ``rh:<stage>`` name
(``rag.threadnames``), ``http`` for ragheat's server thread, ``event_loop`` for the asyncio loop of an observed
service (where stages interleave on one thread, so its time is no one stage's), ``other`` for any other thread."""
OFFCPU_REASONS = ("preempted", "blocked", "uninterruptible")
SYSCALL_FAMILIES = ("read", "write", "network", "poll", "futex", "memory", "file", "sleep", "other")
KERNEL_TCP_STATES = ("established", "syn_sent", "syn_recv", "fin_wait1", "fin_wait2", "time_wait", "close",
                     "close_wait", "last_ack", "listen", "closing", "new_syn_recv", "bound_inactive", "other")
"""``state`` label of the retransmit counter: the kernel's TCP states in their ABI order (TCP_ESTABLISHED = 1
... in include/net/tcp_states.h, as /proc/net/tcp numbers them), then ``other`` for anything newer."""
VLLM_PHASES = ("prefill", "decode", "mixed")
HOST_CPU_MODES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
"""``mode`` label of the host CPU counter: the first columns of /proc/stat's ``cpu`` line, in its order."""
PRESSURE_RESOURCES = ("cpu", "memory", "io")
PRESSURE_SCOPES = ("some", "full")

QUALITY_POINTS = {"threshold": "threshold", "0.02": "p02", "0.05": "p05", "0.1": "p10", "0.25": "p25", "0.5": "p50"}
"""The calibration's points (``point`` label of ``ragheat_quality_calibration_score``), by the calibration file's
key."""

Group = Literal["service", "generation", "quality", "vllm", "kernel", "host"]
"""Who exports a family: the service (``PrometheusMetrics``), the service about its language model
(``PrometheusMetrics``, streamed generators only), the service about its answers' quality (``PrometheusMetrics``,
``quality.enabled``), ragheat's plugin inside vLLM's engine, the eBPF probes, the
service about the machine it runs on (``telemetry.host``, computed at each scrape)."""


@dataclass(frozen=True)
class MetricSpec:
    """One family of the contract. ``role`` is how code and dashboards refer to it; ``name`` is the family as
    Prometheus stores it (a counter's ends in ``_total``)."""

    group: Group
    role: str
    name: str
    kind: Literal["counter", "gauge", "histogram"]
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()

    @property
    def base_name(self) -> str:
        """The name ``prometheus_client`` is given and its parser reports: a counter's without ``_total``."""
        return self.name.removesuffix("_total") if self.kind == "counter" else self.name


METRICS: tuple[MetricSpec, ...] = (
    # -- the service: GET /metrics of `ragheat serve` ---------------------------------------------------------
    MetricSpec("service", "stage_duration", "ragheat_stage_duration_seconds", "histogram",
               "Time one RAG pipeline stage took for one request, by stage, load level at request start and outcome.",
               ("stage", "qps_bucket", "outcome"), LATENCY_SECONDS),
    MetricSpec("service", "request_duration", "ragheat_request_duration_seconds", "histogram",
               "End-to-end time of one API request as the server saw it, by route, load level, outcome and the "
               "quality ladder's rung that answered it (none: not answered by the pipeline).",
               ("route", "qps_bucket", "outcome", "quality_level"), LATENCY_SECONDS),
    MetricSpec("service", "requests", "ragheat_requests_total", "counter",
               "API requests by route and HTTP status class.", ("route", "status_class")),
    MetricSpec("service", "in_flight", "ragheat_requests_in_flight", "gauge",
               "API requests being served right now.", ("route",)),
    MetricSpec("service", "qps", "ragheat_qps", "gauge",
               "API request rate (requests per second) over the sliding qps window."),
    MetricSpec("service", "retrieved", "ragheat_retrieved_documents", "histogram",
               "Chunks a retriever returned for one request, before fusion.", ("retriever",), RETRIEVED_DOCUMENTS),
    MetricSpec("service", "retrieval_routes", "ragheat_retrieval_routes_total", "counter",
               "Answered queries by the retrievers that ran (hybrid, hybrid+graph, ...) or the router's choice.",
               ("retrieval_route",)),
    MetricSpec("service", "stage_skipped", "ragheat_stage_skipped_total", "counter",
               "Queries answered without a stage because its backend was unavailable (the graph store down or "
               "restarting, a Milvus server without a fallback) or their deadline could not hold it (rag.deadline); "
               "each such answer is degraded.",
               ("stage",)),
    MetricSpec("service", "stage_errors", "ragheat_stage_errors_total", "counter",
               "Requests that failed in a pipeline stage, by stage.", ("stage",)),
    MetricSpec("service", "unmapped_stages", "ragheat_unmapped_stage_names_total", "counter",
               "Stage names an observed service used that are neither ragheat's nor a known alias: recorded as "
               "stage=\"other\" (telemetry.observe), counted here instead of becoming series of their own."),
    MetricSpec("service", "stage_device", "ragheat_stage_device_seconds", "histogram",
               "Device time of the GPU-capable work inside one stage (embed, retrieve_dense): CUDA events "
               "(clock=cuda), or that work's own host time without a GPU (clock=monotonic).",
               ("stage", "clock"), LATENCY_SECONDS),
    MetricSpec("service", "telemetry_dropped", "ragheat_telemetry_dropped_total", "counter",
               "Spans or metric batches dropped instead of slowing requests, by reason.", ("signal", "reason")),
    MetricSpec("service", "rejected", "ragheat_requests_rejected_total", "counter",
               "Requests turned away before a route ran, by reason: no or a wrong API key, an admin call without keys, "
               "over the key's rate limit, a body or request head too large, a head or body too slow to arrive.",
               ("reason",)),
    MetricSpec("service", "shed", "ragheat_requests_shed_total", "counter",
               "Queries refused by admission control (503 with Retry-After), by reason: the queue was full, the "
               "query would have finished after its deadline (predicted at arrival), or its deadline passed while "
               "it waited for a slot (expired).", ("reason",)),
    MetricSpec("service", "quality_level", "ragheat_quality_level", "gauge",
               "The quality ladder's rung the load controller serves new queries at (steering.enabled), as its "
               "place in the ladder: 0 = full, then no_hyde, extractive, no_graph, shallow_rerank, no_rerank, "
               "light_search, 7 = bm25_only."),
    MetricSpec("service", "quality_level_changes", "ragheat_quality_level_changes_total", "counter",
               "Steps of the load controller down (cheaper answers) or up the quality ladder.", ("direction",)),
    MetricSpec("service", "priority_requests", "ragheat_requests_priority_total", "counter",
               "Queries by X-Request-Priority (high, normal, low) and whether they were answered or refused by "
               "admission control (shed).", ("priority", "outcome")),
    MetricSpec("service", "index_reloads", "ragheat_index_reloads_total", "counter",
               "Attempts to serve a newer index generation without a restart, by outcome: swapped, unchanged (the "
               "served one was the newest), failed (it could not be loaded; the old one kept serving).", ("outcome",)),
    MetricSpec("service", "cache_requests", "ragheat_cache_requests_total", "counter",
               "Answered queries by what the semantic answer cache did: hit (a stored answer was served), miss "
               "(answered afresh, stored unless degraded), off (cache.enabled is off). Hit ratio = hit / (hit + miss).",
               ("result",)),
    MetricSpec("service", "cache_entries", "ragheat_cache_entries", "gauge",
               "Answers held by the semantic answer cache of the index generation served (0 when it is off)."),
    MetricSpec("service", "cache_bytes", "ragheat_cache_bytes", "gauge",
               "Estimated bytes held by the semantic answer cache of the generation served: vectors, answer texts "
               "and per-object overhead (the cited passages are the index's own, not counted)."),
    # -- generation: the same service, about its language model as it saw it (client side) ------------------
    MetricSpec("generation", "ttft", "ragheat_generation_ttft_seconds", "histogram",
               "Time to the first generated token as the service saw it (streamed generators).", (), LATENCY_SECONDS),
    MetricSpec("generation", "inter_token", "ragheat_generation_inter_token_seconds", "histogram",
               "Time between consecutive streamed tokens as the service saw it.", (), LATENCY_SECONDS),
    MetricSpec("generation", "unsupported_sentences", "ragheat_unsupported_sentences_total", "counter",
               "Answer sentences the support check found unsupported by the passages they cite."),
    MetricSpec("generation", "degraded", "ragheat_generation_degraded_total", "counter",
               "Answers that fell back to the extractive generator, by reason: the LLM was down (unavailable) or "
               "slow, or none of its sentences was supported by the passages (unsupported).", ("reason",)),
    # -- answer quality: the same service, label-free signals of each answer (rag.quality) --------------------
    MetricSpec("quality", "quality_score", "ragheat_quality_score", "histogram",
               "A label-free quality signal of one answer, by signal: the best passage's similarity to the query, the "
               "share of the dense top 10 BM25's top 10 also holds, where the first fused passage's score lies between "
               "first in one list (0) and first in all (1), the share of a written answer's sentences the support "
               "check accepted.", ("signal",), UNIT_SCORES),
    MetricSpec("quality", "quality_rerank_score", "ragheat_quality_rerank_score", "histogram",
               "The reranker's score of an answer's first passage (rerank_top) and its lead over the second "
               "(rerank_margin), on the head's scale.", ("signal",), RERANK_SCORES),
    MetricSpec("quality", "quality_sentence_citations", "ragheat_quality_sentence_citations", "histogram",
               "A written answer's counts per sentence, by signal: the citation markers its sentences carry "
               "(citations_per_sentence).", ("signal",), PER_SENTENCE),
    MetricSpec("quality", "answer_quality", "ragheat_answer_quality_total", "counter",
               "Answers by quality verdict: good; no_good_passage (the best passage's similarity under the calibrated "
               "threshold); fell_back (a language model's answer replaced by the extractive one); unsupported (too few "
               "written sentences supported); unscored (no dense search ran to judge by).", ("verdict",)),
    MetricSpec("quality", "judged", "ragheat_quality_judged_total", "counter",
               "Answers whose first passage the sampled judge (quality.judge_rate) asked the language model about, "
               "off the request path, by outcome: relevant, not_relevant, unparsed (the reply said neither), failed "
               "(the model unavailable), dropped (the judge's queue was full).", ("outcome",)),
    MetricSpec("quality", "quality_calibration", "ragheat_quality_calibration_score", "gauge",
               "The calibration the verdicts use (rag.quality.calibration): the best similarity's threshold "
               "(point=threshold) and the training questions' quantiles of each signal (point=p02, p05, p10, p25, "
               "p50), the reference a drifting signal is compared with.", ("signal", "point")),
    # -- the machine: the same service, read at each scrape (telemetry.host) -----------------------------------
    MetricSpec("host", "host_cpu", "ragheat_host_cpu_seconds_total", "counter",
               "CPU time the whole machine spent in each mode, summed over its CPUs (/proc/stat): the busy modes minus "
               "ragheat_process_cpu_seconds_total is everything else on the host.", ("mode",)),
    MetricSpec("host", "pressure", "ragheat_host_pressure_stalled_seconds_total", "counter",
               "Time some (or all) runnable tasks of the machine stalled waiting for a resource, from the kernel's "
               "pressure stall information (/proc/pressure).", ("resource", "scope")),
    MetricSpec("host", "process_cpu", "ragheat_process_cpu_seconds_total", "counter",
               "CPU time (user + system) the service used: its process (with serve --workers N, the supervisor "
               "and every worker) and the processes it started (the graph store, vLLM's engine core), every "
               "thread, the exited ones included."),
    # -- vLLM's engine: ragheat's plugin (telemetry.vllm_plugin), served by vLLM's own /metrics ---------------
    MetricSpec("vllm", "step_duration", "ragheat_vllm_step_duration_seconds", "histogram",
               "Time of one vLLM engine step (schedule, forward, update) by phase.", ("phase",), LATENCY_SECONDS),
    MetricSpec("vllm", "scheduled_tokens", "ragheat_vllm_scheduled_tokens", "histogram",
               "Tokens one vLLM engine step scheduled, by phase (prefill or decode).", ("phase",), VLLM_STEP_TOKENS),
    MetricSpec("vllm", "kv_blocks_allocated", "ragheat_vllm_kv_blocks_allocated", "histogram",
               "KV-cache blocks allocated from the free pool in one engine step.", (), VLLM_STEP_BLOCKS),
    MetricSpec("vllm", "kv_blocks_freed", "ragheat_vllm_kv_blocks_freed", "histogram",
               "KV-cache blocks returned to the free pool in one engine step.", (), VLLM_STEP_BLOCKS),
    MetricSpec("vllm", "kv_free_blocks", "ragheat_vllm_kv_free_blocks", "gauge",
               "Free KV-cache blocks after the latest engine step."),
    MetricSpec("vllm", "kv_usage", "ragheat_vllm_kv_usage_ratio", "gauge",
               "Share of KV-cache blocks in use after the latest engine step (0..1)."),
    MetricSpec("vllm", "preemptions", "ragheat_vllm_preemptions_total", "counter",
               "Requests vLLM's scheduler preempted (KV cache full), counted per engine step."),
    # -- the kernel: the eBPF probes (probes.collector), in-process or on the exporter's own port -------------
    MetricSpec("kernel", "runqueue", "ragheat_kernel_runqueue_seconds", "histogram",
               "Time a thread of the service waited for a CPU (woken or preempted until it ran), by RAG stage.",
               ("stage",), KERNEL_LOG2_SECONDS),
    MetricSpec("kernel", "offcpu", "ragheat_kernel_offcpu_seconds", "histogram",
               "Time a thread of the service spent off the CPU, from leaving it until running again, by RAG stage "
               "and why it left (preempted, blocked, uninterruptible).", ("stage", "reason"), KERNEL_LOG2_SECONDS),
    MetricSpec("kernel", "syscall", "ragheat_kernel_syscall_seconds", "histogram",
               "Time a system call of the service took from entry to exit, by RAG stage and system-call family.",
               ("stage", "family"), KERNEL_LOG2_SECONDS),
    MetricSpec("kernel", "tcp_retransmits", "ragheat_kernel_tcp_retransmits_total", "counter",
               "TCP segments retransmitted on the service's connections, by TCP state.", ("state",)),
)


QUALITY_SIGNAL_FAMILIES: dict[str, str] = {**dict.fromkeys(UNIT_SIGNALS, "quality_score"),
                                           **dict.fromkeys(RERANK_SIGNALS, "quality_rerank_score"),
                                           **dict.fromkeys(PER_SENTENCE_SIGNALS, "quality_sentence_citations")}
"""Each quality signal's histogram (the attribute of its ``MetricSpec``): one family per scale, so that each has
buckets that fit it."""


def specs(group: Group) -> dict[str, MetricSpec]:
    """Role -> spec for one group of ``METRICS``, in table order."""
    return {m.role: m for m in METRICS if m.group == group}


def _names(group: Group) -> dict[str, str]:
    return {role: m.name for role, m in specs(group).items()}


SERVICE_METRICS = _names("service")
GENERATION_METRICS = _names("generation")
QUALITY_METRICS = _names("quality")
VLLM_METRICS = _names("vllm")
KERNEL_METRICS = _names("kernel")
HOST_METRICS = _names("host")
"""Role -> family name as Prometheus stores it, per group (read by dashboards, probes, tests)."""

EXPECTED_METRICS = [m.name for m in METRICS if m.group in ("service", "generation", "quality", "host")]
"""Metric families a scrape of a running service must contain (as prometheus_client's parser names them;
counters are listed with ``_total``, which the parser strips from the family name)."""

VLLM_NATIVE_METRICS = {
    "ttft": "vllm:time_to_first_token_seconds",
    "inter_token": "vllm:inter_token_latency_seconds",
    "kv_usage": "vllm:kv_cache_usage_perc",
    "running": "vllm:num_requests_running",
    "waiting": "vllm:num_requests_waiting",
    "preemptions": "vllm:num_preemptions_total",
}
"""vLLM's own metric names (v1 engine) that dashboards read next to ours; not ours, so not in ``METRICS``."""

MILVUS_NATIVE_METRICS = {
    "search_latency": "milvus_proxy_sq_latency",
    "querynode_latency": "milvus_querynode_sq_req_latency",
    "requests": "milvus_proxy_req_count",
    "entities": "milvus_querynode_entity_num",
    "resident_memory": "process_resident_memory_bytes",
}
"""Milvus' own metric names (its proxy and query node; histograms in milliseconds; counters without ``_total``, as
its Go client writes them) and the Go process collector's resident memory, read by the Milvus board next to the
searches ragheat sends it; not ours, so not in ``METRICS``."""
MILVUS_LABELS = {"query_type": "query_type", "function": "function_name", "status": "status",
                 "collection": "collection_id", "scope": "scope"}
"""The label names of Milvus' metrics the Milvus board groups and selects by."""


def create_metric(spec: MetricSpec, registry: CollectorRegistry, **options):
    """The ``prometheus_client`` object for ``spec`` on ``registry`` (``options``: e.g. a gauge's multiprocess mode)."""
    if spec.kind == "histogram":
        return Histogram(spec.base_name, spec.help, spec.labels, buckets=spec.buckets, registry=registry, **options)
    kind = Counter if spec.kind == "counter" else Gauge
    return kind(spec.base_name, spec.help, spec.labels, registry=registry, **options)


class PrometheusMetrics:
    """The service's metric objects (the ``service`` and ``generation`` groups of ``METRICS``), registered on
    ``registry`` (a fresh one per app or test)."""

    def __init__(self, registry: CollectorRegistry, qps_labels: Sequence[str], routes: Sequence[str] = ROUTES) -> None:
        self.qps_labels = tuple(qps_labels)
        self.routes = tuple(routes)
        service, generation = specs("service"), specs("generation")
        self.stage_duration = create_metric(service["stage_duration"], registry)
        self.request_duration = create_metric(service["request_duration"], registry)
        self.requests = create_metric(service["requests"], registry)
        # With ``serve --workers N``: one series per live worker (a dead worker's is dropped when it is restarted).
        self.in_flight = create_metric(service["in_flight"], registry, multiprocess_mode="liveall")
        self.qps = create_metric(service["qps"], registry)
        self.retrieved = create_metric(service["retrieved"], registry)
        self.stage_errors = create_metric(service["stage_errors"], registry)
        self.unmapped_stages = create_metric(service["unmapped_stages"], registry)
        self.retrieval_routes = create_metric(service["retrieval_routes"], registry)
        self.stage_skipped = create_metric(service["stage_skipped"], registry)
        self.stage_device = create_metric(service["stage_device"], registry)
        self.telemetry_dropped = create_metric(service["telemetry_dropped"], registry)
        self.rejected = create_metric(service["rejected"], registry)
        self.shed = create_metric(service["shed"], registry)
        self.index_reloads = create_metric(service["index_reloads"], registry)
        self.quality_level = create_metric(service["quality_level"], registry, multiprocess_mode="liveall")
        self.quality_level_changes = create_metric(service["quality_level_changes"], registry)
        self.priority_requests = create_metric(service["priority_requests"], registry)
        self.cache_requests = create_metric(service["cache_requests"], registry)
        self.cache_entries = create_metric(service["cache_entries"], registry)
        self.cache_bytes = create_metric(service["cache_bytes"], registry)
        self.generation_ttft = create_metric(generation["ttft"], registry)
        self.generation_inter_token = create_metric(generation["inter_token"], registry)
        self.unsupported_sentences = create_metric(generation["unsupported_sentences"], registry)
        self.generation_degraded = create_metric(generation["degraded"], registry)
        quality = specs("quality")
        self.quality_score = create_metric(quality["quality_score"], registry)
        self.quality_rerank_score = create_metric(quality["quality_rerank_score"], registry)
        self.quality_sentence_citations = create_metric(quality["quality_sentence_citations"], registry)
        self.answer_quality = create_metric(quality["answer_quality"], registry)
        self.judged = create_metric(quality["judged"], registry)
        self.quality_calibration = create_metric(quality["quality_calibration"], registry, multiprocess_mode="max")
        self._children: dict = {}
        self.exemplar_share = None  # a worker of `serve --workers N`: see share_exemplars
        # Create every closed-set series up front: a rate() over a series that appears late reads as missing.
        for route in self.routes:
            self.in_flight.labels(route)
            for status in ("2xx", "4xx", "5xx"):  # what the SLI ratios divide by: present from the first scrape
                self.requests.labels(route, status)
        for stage in STAGES:
            self.stage_errors.labels(stage)
        for stage in CONDITIONAL_STAGES:  # their heatmaps show zero, not "no data", where the feature is off
            for qps in self.qps_labels:
                self.stage_duration.labels(stage, qps, "ok")
        for retriever in RETRIEVERS:
            self.retrieved.labels(retriever)
        for retrieval_route in RETRIEVAL_ROUTES:
            self.retrieval_routes.labels(retrieval_route)
        for stage in dict.fromkeys(SKIPPABLE_STAGES + OPTIONAL_STAGES):  # backend down, or the deadline too near
            self.stage_skipped.labels(stage)
        for reason in DEGRADED_REASONS:
            self.generation_degraded.labels(reason)
        for signal in SIGNALS:
            for reason in DROP_REASONS:
                self.telemetry_dropped.labels(signal, reason)
        for reason in REJECTION_REASONS:
            self.rejected.labels(reason)
        for reason in SHED_REASONS:
            self.shed.labels(reason)
        for outcome in RELOAD_OUTCOMES:
            self.index_reloads.labels(outcome)
        for direction in LEVEL_DIRECTIONS:
            self.quality_level_changes.labels(direction)
        for priority in PRIORITIES:
            for outcome in PRIORITY_OUTCOMES:
                self.priority_requests.labels(priority, outcome)
        for result in CACHE_OUTCOMES:
            self.cache_requests.labels(result)
        for verdict in QUALITY_VERDICTS:  # the quality SLI divides by them: present from the first scrape
            self.answer_quality.labels(verdict)
        for outcome in JUDGE_OUTCOMES:
            self.judged.labels(outcome)
        for signal, family in QUALITY_SIGNAL_FAMILIES.items():
            getattr(self, family).labels(signal)

    def share_exemplars(self, share) -> None:
        """A worker of ``serve --workers N``: prometheus_client keeps no exemplars in multiprocess mode, so traced
        histogram observations made through ``child`` also go to ``share`` (``telemetry.exemplars.ExemplarShare``)."""
        self.exemplar_share = share
        self._children.clear()

    def child(self, metric, *label_values):
        """``metric.labels(*label_values)`` (``metric`` itself when it has no labels), cached: ``labels()``
        validates and locks on every call, which is a measurable share of per-request cost when a request makes
        eight observations."""
        key = (id(metric), label_values)
        found = self._children.get(key)
        if found is None:
            found = metric.labels(*label_values) if label_values else metric
            if self.exemplar_share is not None and isinstance(metric, Histogram):
                # prometheus_client's names for the family, its label names and bucket bounds (+Inf last)
                found = _SharedExemplars(found, self.exemplar_share, metric._name,
                                         dict(zip(metric._labelnames, label_values)), metric._upper_bounds)
            self._children[key] = found
        return found


class _SharedExemplars:
    """A histogram child whose traced observations also reach the workers' exemplar share."""

    __slots__ = ("child", "share", "family", "labels", "bounds")

    def __init__(self, child, share, family: str, labels: dict, bounds) -> None:
        self.child, self.share, self.family, self.labels, self.bounds = child, share, family, labels, bounds

    def observe(self, amount: float, exemplar: dict | None = None) -> None:
        self.child.observe(amount)
        if exemplar:
            self.share.record(self.family, self.labels, self.bounds, amount, exemplar["trace_id"])


def status_class(status: int) -> str:
    """``2xx``, ``4xx``, ... (the ``status_class`` label); ``other`` outside 100..599."""
    return f"{status // 100}xx" if 100 <= status < 600 else "other"


def request_outcome(status: int) -> str:
    """``ok``, ``rejected`` (4xx) or ``error`` (5xx): the ``outcome`` label of a request."""
    return "error" if status >= 500 else "rejected" if status >= 400 else "ok"
