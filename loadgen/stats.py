"""Percentiles, per-step results and the knee of a rate sweep."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Sequence

import numpy as np

from rag.stages import TOP_LEVEL

PERCENTILES = {"p50": 50.0, "p90": 90.0, "p99": 99.0, "p99.9": 99.9}


def percentiles_ms(seconds: Sequence[float]) -> dict[str, float | None]:
    """P50/P90/P99/P99.9 in milliseconds (linear interpolation between order statistics); None when empty."""
    if len(seconds) == 0:
        return {name: None for name in PERCENTILES}
    values = np.asarray(seconds, dtype=np.float64) * 1000.0
    return {name: float(np.percentile(values, q)) for name, q in PERCENTILES.items()}


def scraped_buckets(exposition: str, family: str, by: str) -> dict[str, dict[float, float]]:
    """``by``'s value -> upper bound -> cumulative count of ``family``'s buckets in a Prometheus text exposition (a
    scrape of ``/metrics``), summed over the family's other labels."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, dict[float, float]] = {}
    for found in text_string_to_metric_families(exposition):
        if found.name != family:
            continue
        for sample in found.samples:
            if sample.name == family + "_bucket":
                edges = out.setdefault(sample.labels[by], {})
                le = float(sample.labels["le"])
                edges[le] = edges.get(le, 0.0) + sample.value
    return out


@dataclass
class StepResult:
    """One step of a sweep, as written to results.json."""

    mode: str
    offered_qps: float | None  # None for closed-loop steps
    concurrency: int | None
    duration_s: float
    requests: int
    errors: int
    achieved_qps: float
    latency_ms: dict
    send_error_ms: dict = field(default_factory=dict)  # actual minus intended send time (open loop)
    stages_ms: dict = field(default_factory=dict)  # stage -> percentiles, from the server's stage timings
    interrupted: bool = False
    stages_source: str = "responses"  # or "prometheus"
    # Per successful request, for the report's heatmaps: seconds since the step's measured start,
    # end-to-end ms, and each stage's ms (None where a response carried no such stage).
    samples: dict = field(default_factory=dict)
    # Admission control: queries refused with 503 and a shed reason (neither errors nor latency samples), by reason;
    # the latency of those refused at once (queue_full, deadline) from their actual send, loopback included, and as
    # the service timed it (its Server-Timing header); the latency of those that expired in the queue; goodput =
    # answers within the SLO per second.
    shed: int = 0
    shed_reasons: dict = field(default_factory=dict)
    refusal_ms: dict = field(default_factory=dict)
    refusal_server_ms: dict = field(default_factory=dict)
    expired_ms: dict = field(default_factory=dict)
    goodput_qps: float = 0.0
    # The semantic answer cache: answered queries by the response's "cache" field (hit, miss, off).
    cache: dict = field(default_factory=dict)
    # Steering: answered queries by the response's "quality_level" (the quality ladder's rung that served them).
    levels: dict = field(default_factory=dict)
    # CPU ms per answer of the service's processes and of the generator in the measured window, and the rate ceiling
    # that sets on the shared cores (loadgen.cpu; empty unless the service's pid was given).
    cpu_ms_per_answer: dict = field(default_factory=dict)
    # [start, end] of the measured part in unix seconds: where the step lies on the timeline of a Prometheus that
    # scraped the service, so that its window can be compared with another step's (explain.steps).
    measured_unix: list = field(default_factory=list)

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    @property
    def shed_rate(self) -> float:
        return self.shed / self.requests if self.requests else 0.0

    def to_json(self) -> dict:
        return {**asdict(self), "error_rate": self.error_rate, "shed_rate": self.shed_rate,
                "cache_hit_rate": cache_hit_rate(self.cache)}


def cache_hit_rate(counts: dict) -> float | None:
    """hit / (hit + miss) of a step's answered queries; None when the cache was not consulted."""
    looked = counts.get("hit", 0) + counts.get("miss", 0)
    return counts.get("hit", 0) / looked if looked else None


FULL_QUALITY_SHARE = 0.99
"""A step serves full quality when at least this share of its answers came from the quality ladder's top rung."""


def full_quality_share(step: StepResult) -> float | None:
    """The share of a step's answers served at the quality ladder's top rung; None when the responses say no rung."""
    answered = sum(step.levels.values())
    return step.levels.get(TOP_LEVEL, 0) / answered if answered else None


def find_knee(steps: Sequence[StepResult], slo_ms: float, max_error_rate: float = 0.001,
              full_quality: bool = False) -> float | None:
    """The highest offered rate that meets the SLO (P99 <= slo_ms, errors and shed each <= max_error_rate) with every
    lower offered rate meeting it too: a passing step above a failing one is noise, not capacity. ``full_quality``:
    also with ``FULL_QUALITY_SHARE`` of its answers at the quality ladder's top rung (a load controller that steps
    down keeps the latency within the SLO past the rate the full answers can be served at)."""
    knee = None
    for step in sorted((s for s in steps if s.offered_qps is not None and not s.interrupted),
                       key=lambda s: s.offered_qps):
        p99 = step.latency_ms.get("p99")
        share = full_quality_share(step)
        # A step that sheds more than the error allowance is not served capacity either.
        if (step.requests == 0 or p99 is None or p99 > slo_ms or step.error_rate > max_error_rate
                or step.shed_rate > max_error_rate
                or (full_quality and share is not None and share < FULL_QUALITY_SHARE)):
            break
        knee = step.offered_qps
    return knee
