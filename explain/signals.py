"""What ``ragheat explain`` reads from Prometheus: every signal over the window and over the baseline before it, as
PromQL a dashboard or a recording rule could run unchanged (``offset`` picks the baseline). Python only collects
the numbers; ``explain.causes`` weighs them."""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field

from prometheus_client.utils import floatToGoString

from dashboards.promapi import PrometheusApi
from rag.errors import RagheatError
from telemetry.buckets import LATENCY_SECONDS
from telemetry.metrics import GENERATION_METRICS, HOST_METRICS, KERNEL_METRICS, SERVICE_METRICS, VLLM_METRICS

QUANTILE = 0.99
_DURATION = re.compile(r"^(\d+)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class ExplainError(RagheatError):
    """The window, the baseline or the job cannot be read as asked; says which and why."""


def duration_s(text: str, flag: str) -> int:
    """Seconds of a Prometheus-style duration (``90s``, ``10m``, ``1h``)."""
    match = _DURATION.match(text.strip())
    if not match or int(match[1]) == 0:
        raise ExplainError(f"{flag} must be a duration such as 90s, 10m or 1h, not {text!r}")
    return int(match[1]) * _UNIT_S[match[2]]


@dataclass(frozen=True)
class Span:
    """``seconds`` of history ending ``offset_s`` seconds before the evaluation time."""

    seconds: int
    offset_s: int = 0

    def range(self) -> str:
        offset = f" offset {self.offset_s}s" if self.offset_s else ""
        return f"[{self.seconds}s]{offset}"


@dataclass
class Side:
    """Every signal over one span: the window, or the baseline."""

    answered_per_s: float = 0.0
    p99_ms: float = math.nan
    stage_p99_ms: dict[str, float] = field(default_factory=dict)
    stage_ms_per_request: dict[str, float] = field(default_factory=dict)
    shed_per_s: float = 0.0
    below_full_per_s: float = 0.0
    """Answers served below the quality ladder's top rung: the load controller stepped down (rag/steering)."""
    degraded_per_s: dict[str, float] = field(default_factory=dict)
    skipped_per_s: dict[str, float] = field(default_factory=dict)
    process_cores: float = math.nan
    host_busy_cores: float = math.nan
    host_system_cores: float = math.nan
    """The host's CPU in the kernel (``system``): where reclaiming memory shows."""
    host_cores: float = math.nan
    pressure: dict[str, float] = field(default_factory=dict)  # resource -> share of time some task stalled
    kernel_ms_per_request: dict[tuple[str, str], float] = field(default_factory=dict)  # (stage, what) -> ms
    ttft_p99_ms: float = math.nan
    kv_usage: float = math.nan
    preemptions_per_s: float = 0.0

    @property
    def others_cores(self) -> float:
        """CPU the rest of the machine used: busy host CPU minus the service's own."""
        return self.host_busy_cores - self.process_cores


@dataclass
class Evidence:
    job: str | None
    window: Span
    baseline: Span
    at: float
    now: Side
    before: Side
    slowest_traces: list[tuple[float, str]] = field(default_factory=list)  # (seconds, trace id), slowest first
    tail_share: float = math.nan
    """Share of the window's answered requests slower than the baseline's P99 (rounded up to a bucket bound):
    about 1 - QUANTILE when nothing changed."""
    tail_requests: float = 0.0
    """How many requests that share is."""
    window_requests: float = 0.0
    """How many requests the window answered."""
    baseline_tail_share: float = math.nan
    """Share of the baseline's own answered requests above that same bound: the rate a window without a fault
    would show (near 1 - QUANTILE, above it when the baseline's P99 rests on few requests)."""


def _selector(job: str | None, *matchers: str) -> str:
    parts = ([f'job="{job}"'] if job else []) + list(matchers)
    return "{" + ",".join(parts) + "}"


class Reader:
    """Evaluates the signals of one job at one instant."""

    def __init__(self, api: PrometheusApi, job: str | None, at: float) -> None:
        self.api, self.job, self.at = api, job, at

    def _vector(self, promql: str) -> list[tuple[dict, float]]:
        rows = self.api.query(promql, at=self.at)
        return [(row["metric"], float(row["value"][1])) for row in rows]

    def scalar(self, promql: str) -> float:
        values = [v for _, v in self._vector(promql) if not math.isnan(v)]
        return values[0] if values else math.nan

    def by(self, label: str, promql: str) -> dict[str, float]:
        return {m.get(label, ""): v for m, v in self._vector(promql) if not math.isnan(v)}

    def side(self, span: Span) -> Side:
        r = span.range()
        every, ok = _selector(self.job), _selector(self.job, 'outcome="ok"')
        busy, some = _selector(self.job, 'mode!~"idle|iowait|steal"'), _selector(self.job, 'scope="some"')
        request, stage = SERVICE_METRICS["request_duration"], SERVICE_METRICS["stage_duration"]
        answered = f"sum(rate({request}_count{ok}{r}))"
        per_request = f"/ scalar({answered})"
        side = Side()
        side.answered_per_s = _or(self.scalar(answered), 0.0)
        side.p99_ms = 1e3 * self.scalar(f"histogram_quantile({QUANTILE}, sum by (le) (rate({request}_bucket{ok}{r})))")
        side.stage_p99_ms = {s: 1e3 * v for s, v in self.by("stage", (
            f"histogram_quantile({QUANTILE}, sum by (le, stage) (rate({stage}_bucket{ok}{r})))")).items()}
        side.stage_ms_per_request = {s: 1e3 * v for s, v in self.by("stage", (
            f"sum by (stage) (rate({stage}_sum{ok}{r})) {per_request}")).items()}
        side.shed_per_s = _or(self.scalar(f'sum(rate({SERVICE_METRICS["shed"]}{every}{r}))'), 0.0)
        below = _selector(self.job, 'outcome="ok"', 'quality_level!~"full|none"')
        side.below_full_per_s = _or(self.scalar(f"sum(rate({request}_count{below}{r}))"), 0.0)
        side.degraded_per_s = self.by("reason", f'sum by (reason) (rate({GENERATION_METRICS["degraded"]}{every}{r}))')
        side.skipped_per_s = self.by("stage", f'sum by (stage) (rate({SERVICE_METRICS["stage_skipped"]}{every}{r}))')
        # One service may run several processes (workers, replicas) on one host: the host is counted once.
        side.process_cores = self.scalar(f'sum(rate({HOST_METRICS["process_cpu"]}{every}{r}))')
        host = HOST_METRICS["host_cpu"]
        side.host_busy_cores = self.scalar(f"max(sum by (instance) (rate({host}{busy}{r})))")
        system = _selector(self.job, 'mode="system"')
        side.host_system_cores = self.scalar(f"max(sum by (instance) (rate({host}{system}{r})))")
        side.host_cores = self.scalar(f"max(sum by (instance) (rate({host}{every}{r})))")
        side.pressure = self.by("resource", f'max by (resource) (rate({HOST_METRICS["pressure"]}{some}{r}))')
        kernel = {"runqueue": (KERNEL_METRICS["runqueue"], "sum by (stage)"),
                  "offcpu": (KERNEL_METRICS["offcpu"], "sum by (stage, reason)"),
                  "syscall": (KERNEL_METRICS["syscall"], "sum by (stage, family)")}
        for what, (family, by) in kernel.items():
            for metric, value in self._vector(f"{by} (rate({family}_sum{every}{r})) {per_request}"):
                detail = metric.get("reason") or metric.get("family") or what
                side.kernel_ms_per_request[(metric.get("stage", "other"), f"{what}:{detail}")] = 1e3 * value
        side.ttft_p99_ms = 1e3 * self.scalar(f"histogram_quantile({QUANTILE}, sum by (le) "
                                             f'(rate({GENERATION_METRICS["ttft"]}_bucket{every}{r})))')
        # vLLM is its own scrape job: read wherever it is.
        side.kv_usage = self.scalar(f'max(max_over_time({VLLM_METRICS["kv_usage"]}{r}))')
        side.preemptions_per_s = _or(self.scalar(f'sum(rate({VLLM_METRICS["preemptions"]}{r}))'), 0.0)
        return side

    def tail(self, span: Span, seconds: float) -> tuple[float, float, float]:
        """(share, count, total) of the answered requests in ``span`` slower than the first bucket bound at or above
        ``seconds``."""
        bound = next((b for b in LATENCY_SECONDS if b >= seconds - 1e-9), None)
        if bound is None or math.isnan(seconds):
            return math.nan, 0.0, 0.0
        request, r = SERVICE_METRICS["request_duration"], span.range()
        ok = _selector(self.job, 'outcome="ok"')
        within = _selector(self.job, 'outcome="ok"', f'le="{floatToGoString(bound)}"')
        total = _or(self.scalar(f"sum(increase({request}_count{ok}{r}))"), 0.0)
        inside = _or(self.scalar(f"sum(increase({request}_bucket{within}{r}))"), 0.0)
        return _share(total - inside, total), max(0.0, total - inside), total

    def slowest_traces(self, span: Span, limit: int = 5) -> list[tuple[float, str]]:
        """The exemplar trace ids of the slowest answered requests in ``span`` (none without tracing)."""
        end = self.at - span.offset_s
        try:
            rows = self.api.exemplars(f'{SERVICE_METRICS["request_duration"]}_bucket{_selector(self.job)}',
                                      end - span.seconds, end)
        except RagheatError:  # exemplar storage off: the explanation goes on without them
            return []
        found = {}
        for series in rows:
            for exemplar in series.get("exemplars", []):
                trace = exemplar.get("labels", {}).get("trace_id")
                if trace:
                    found[trace] = max(found.get(trace, 0.0), float(exemplar["value"]))
        return sorted(((v, t) for t, v in found.items()), reverse=True)[:limit]


def _share(part: float, whole: float) -> float:
    return part / whole if whole > 0 else math.nan


def _or(value: float, default: float) -> float:
    return default if math.isnan(value) else value


def pick_job(api: PrometheusApi, job: str | None) -> str | None:
    """``job`` as given, or the one job whose requests Prometheus holds; several without ``--job`` is an error."""
    jobs = api.label_values("job", match=SERVICE_METRICS["request_duration"] + "_count")
    if job is not None:
        if job not in jobs:
            raise ExplainError(f"--job {job}: Prometheus holds no {SERVICE_METRICS['request_duration']} series of "
                               f"that job (jobs with requests: {', '.join(jobs) or 'none'})")
        return job
    if len(jobs) > 1:
        raise ExplainError(f"Prometheus holds the requests of several jobs ({', '.join(jobs)}): name one with --job")
    if not jobs:
        raise ExplainError(f"Prometheus holds no {SERVICE_METRICS['request_duration']} series: is it scraping an "
                           "observed service?")
    return jobs[0]


def gather(api: PrometheusApi, job: str | None, window: Span, baseline: Span, at: float | None = None) -> Evidence:
    """Every signal of ``job`` over ``window`` and over ``baseline``, evaluated at ``at`` (default: now)."""
    at = time.time() if at is None else at
    reader = Reader(api, pick_job(api, job), at)
    before = reader.side(baseline)
    tail_share, tail_requests, window_requests = reader.tail(window, before.p99_ms / 1e3)
    baseline_tail_share = reader.tail(baseline, before.p99_ms / 1e3)[0]
    return Evidence(reader.job, window, baseline, at, reader.side(window), before, reader.slowest_traces(window),
                    tail_share, tail_requests, window_requests, baseline_tail_share)
