"""The Prometheus that a sweep's steps past the knee are explained from: the one given with ``--prometheus``, or one
started beside the sweep that scrapes the target every second, when the target exports ragheat's metrics
(``ragheat serve``, or a service using ``ragheat.observe``). When neither can be, ``StepMetrics.reason`` says why
in one sentence, for the report.

This module only provides the scrapes; ``explain.steps`` reads them and explains the steps.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator, Sequence
from urllib.parse import urlsplit

from rag.errors import RagheatError
from telemetry.metrics import SERVICE_METRICS

LOCAL_SCRAPE_S = 1.0
"""The local Prometheus' scrape interval: a step of a few seconds then holds several samples of each counter."""
MIN_STEP_S = 5.0
"""Steps shorter than this hold too few scrapes for a rate over them to mean anything."""
REQUEST_FAMILY = SERVICE_METRICS["request_duration"]


@dataclass(frozen=True)
class StepMetrics:
    """Where the steps' signals can be read, or why they cannot."""

    prometheus_url: str | None
    """The Prometheus to query; None when the steps cannot be explained."""
    source: str
    """That Prometheus in words, for the report."""
    instance: str
    """The target as Prometheus labels it (``host:port``), to find its scrape job among others."""
    reason: str | None = None
    """Why the steps past the knee are not explained (one sentence), or None."""


def instance_of(url: str) -> str:
    """``host:port`` of ``url``, as a Prometheus scrape config names the target."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.hostname}:{port}"


def unexplainable_sweep(*, mode: str, levels: Sequence[float], duration_s: float) -> str | None:
    """Why no step of this sweep could be explained whatever Prometheus there is, or None."""
    if mode != "open":
        return "a closed-loop sweep has no knee to explain steps past (--mode open has one)"
    if len(levels) < 2:
        return "a sweep of one step has no other step to compare it with (give several --rates)"
    if duration_s < MIN_STEP_S:
        return (f"steps of {duration_s:g} s hold too few scrapes to compare (--duration {MIN_STEP_S:g} or more "
                "explains them)")
    return None


def exports_ragheat_metrics(url: str, timeout_s: float = 5.0) -> str | None:
    """None when ``url``'s host serves ragheat's request histogram at /metrics; else why not, in a sentence."""
    import httpx

    metrics = f"{urlsplit(url).scheme}://{instance_of(url)}/metrics"
    try:
        response = httpx.get(metrics, timeout=timeout_s)
    except httpx.HTTPError as exc:
        return f"{metrics} could not be read ({type(exc).__name__}: {exc})"
    if response.status_code != 200:
        return f"{metrics} answered HTTP {response.status_code}"
    if REQUEST_FAMILY not in response.text:
        return (f"{metrics} exports no {REQUEST_FAMILY} (only a service ragheat observes can be explained: "
                "ragheat serve, or one using ragheat.observe)")
    return None


@contextlib.contextmanager
def step_metrics(url: str, *, prometheus_url: str | None, enabled: bool, mode: str, levels: Sequence[float],
                 duration_s: float) -> Iterator[StepMetrics]:
    """The Prometheus to explain the sweep's steps from, for as long as the block lasts: ``prometheus_url`` when
    given, else a local one scraping ``url``'s host every ``LOCAL_SCRAPE_S`` (started here, stopped at the end of
    the block), else none and the reason."""
    instance = instance_of(url)
    reason = "not asked for (--no-explain)" if not enabled else unexplainable_sweep(
        mode=mode, levels=levels, duration_s=duration_s)
    if reason is not None:
        yield StepMetrics(None, "", instance, reason)
        return
    if prometheus_url:
        yield StepMetrics(prometheus_url.rstrip("/"), f"the Prometheus at {prometheus_url}", instance)
        return
    if urlsplit(url).scheme != "http":
        yield StepMetrics(None, "", instance, f"a local Prometheus scrapes plain HTTP and {url} is not: give "
                                              "--prometheus URL of one that scrapes it")
        return
    not_ragheat = exports_ragheat_metrics(url)
    if not_ragheat is not None:
        yield StepMetrics(None, "", instance, not_ragheat)
        return
    import httpx

    from stack.prometheus import LocalPrometheus

    try:
        local = LocalPrometheus(instance, scrape_interval_s=LOCAL_SCRAPE_S)
        started = local.__enter__()
    except RagheatError as exc:  # the binary is missing
        yield StepMetrics(None, "", instance, f"{exc}; or give --prometheus URL")
        return
    except (OSError, RuntimeError, httpx.HTTPError) as exc:  # it exited, or never answered or scraped
        yield StepMetrics(None, "", instance, f"the local Prometheus did not start ({exc})")
        return
    try:
        yield StepMetrics(started, f"a local Prometheus scraping {instance}/metrics every {LOCAL_SCRAPE_S:g} s",
                          instance)
    finally:
        local.__exit__(None, None, None)
