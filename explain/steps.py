"""The steps of a load sweep (``ragheat bench``) past its knee, each explained: the step's measured seconds against
a whole earlier step's, the last step at or below the knee (the lowest step when none met the SLO), read from a
Prometheus that scraped the service during the sweep. Where the steps lie comes from results.json alone (each
step's ``measured_unix``); the explanation is ``explain`` on those two windows, with the knee quoted beside the
offered load.

Each step past the knee gets either ``explanation`` (``explain.report.as_json``, plus the baseline step and the
windows) or ``not_explained`` (why, in a sentence); ``results["explained"]`` says where the signals came from,
which step was the baseline, and, when no step could be explained, why.
"""

from __future__ import annotations

import math
import time

from dashboards.promapi import PrometheusApi
from explain.causes import explain
from explain.report import as_json
from explain.signals import ExplainError, Span, gather
from rag.errors import RagheatError
from telemetry.metrics import SERVICE_METRICS

MIN_WINDOW_S = 3
"""A window shorter than this holds too few scrapes for a rate over it."""
SCRAPE_WAIT_S = 30.0
"""How long to wait, after the sweep, for a scrape that covers the end of the last step."""
_REQUESTS = SERVICE_METRICS["request_duration"] + "_count"


def not_explained(results: dict, reason: str) -> None:
    """Record that no step is explained, and why."""
    results["explained"] = {"source": None, "job": None, "baseline_qps": None, "reason": reason}


def knee_of(results: dict) -> float | None:
    """The sweep's knee: where answers stopped being full ones when a load controller stepped the quality ladder
    down below the latency knee (its steps past that point are overload it absorbed), else the latency knee."""
    knees = [k for k in (results.get("knee_qps"), results.get("full_quality_knee_qps")) if k is not None]
    return min(knees) if knees else None


def baseline_step(results: dict) -> dict | None:
    """The last step at or below the knee; the lowest step when none met the SLO; None in a closed-loop sweep."""
    steps = sorted((s for s in results["steps"] if s.get("offered_qps") is not None and s["requests"]),
                   key=lambda s: s["offered_qps"])
    if not steps:
        return None
    knee = knee_of(results)
    if knee is None:
        return steps[0]
    below = [s for s in steps if s["offered_qps"] <= knee and not s["interrupted"]]
    return below[-1] if below else steps[0]


def steps_past_the_knee(results: dict, baseline: dict) -> list[dict]:
    """The steps above the knee (above the baseline step when there is no knee), in sweep order."""
    knee = knee_of(results)
    bar = knee if knee is not None else baseline["offered_qps"]
    return [s for s in results["steps"] if s is not baseline and s.get("offered_qps") is not None
            and s["offered_qps"] > bar]


def spans(step: dict, baseline: dict) -> tuple[float, Span, Span]:
    """(evaluation time, window, baseline) for ``step`` against ``baseline``: the window is the step's measured
    seconds, ending where they end; the baseline ends a whole number of seconds earlier, at or before the end of
    the baseline step, and starts no earlier than that step's measured start, so both lie inside their steps."""
    start, end = step["measured_unix"]
    base_start, base_end = baseline["measured_unix"]
    offset = math.ceil(end - base_end - 1e-6)
    before = math.floor(end - offset - base_start + 1e-6)
    return end, Span(math.floor(end - start + 1e-6)), Span(before, offset)


def explain_sweep(results: dict, api: PrometheusApi, *, instance: str, source: str,
                  wait_s: float = SCRAPE_WAIT_S) -> None:
    """Explain each step of ``results`` past the knee from ``api``, which scraped the service (``instance``:
    ``host:port`` as Prometheus labels it) during the sweep; writes into ``results``."""
    baseline = baseline_step(results)
    past = steps_past_the_knee(results, baseline) if baseline is not None else []
    reason = _nothing_to_explain(results, baseline, past)
    if reason is None:
        try:
            job = _job_of(api, instance)
            _wait_for_scrape(api, job, max(s["measured_unix"][1] for s in past if s.get("measured_unix")), wait_s)
        except RagheatError as exc:
            reason = f"{source}: {exc}"
    if reason is not None:
        not_explained(results, reason)
        return
    results["explained"] = {"source": source, "job": job, "baseline_qps": baseline["offered_qps"], "reason": None}
    for step in past:
        why = _unexplainable(step)
        if why is not None:
            step["not_explained"] = why
            continue
        at, window, before = spans(step, baseline)
        try:
            explanation = explain(gather(api, job, window, before, at=at), knee_qps=knee_of(results))
        except RagheatError as exc:
            step["not_explained"] = f"reading {source} failed: {exc}"
            continue
        step["explanation"] = {**as_json(explanation), "baseline_qps": baseline["offered_qps"],
                               "at_unix": at, "baseline_offset_s": before.offset_s}


def _nothing_to_explain(results: dict, baseline: dict | None, past: list[dict]) -> str | None:
    """Why no step of the sweep can be explained, or None."""
    if baseline is None:
        return "no step answered a request at an offered rate"
    if not past:
        return ("every step met the SLO: none is past the knee" if knee_of(results) is not None
                else "no step above the lowest was measured: nothing to compare it with")
    if not baseline.get("measured_unix") or not any(s.get("measured_unix") for s in past):
        return "the steps have no measured times (results written by an older ragheat)"
    return None


def _unexplainable(step: dict) -> str | None:
    if not step.get("measured_unix"):
        return "no measured times (results written by an older ragheat)"
    start, end = step["measured_unix"]
    if end - start < MIN_WINDOW_S:
        return f"measured for {end - start:.1f} s only: too few scrapes to compare"
    return None


def _job_of(api: PrometheusApi, instance: str) -> str:
    """The scrape job of the target at ``instance``; the one job with requests when none is labelled so."""
    mine = api.label_values("job", match=f'{_REQUESTS}{{instance="{instance}"}}')
    if len(mine) == 1:
        return mine[0]
    every = api.label_values("job", match=_REQUESTS)
    if len(every) == 1:
        return every[0]
    raise ExplainError(f"{len(mine) or 'no'} scrape jobs of {instance} hold {_REQUESTS} series, and "
                       f"{len(every) or 'no'} jobs in all ({', '.join(every) or 'none'}): is it scraping the "
                       "service under that address?")


def _wait_for_scrape(api: PrometheusApi, job: str, after: float, wait_s: float) -> None:
    """Until Prometheus holds a sample of ``job`` from ``after`` on (the end of the last window), or ``wait_s``
    has passed: a window ending before its last scrape would leave its last seconds out."""
    deadline = time.time() + wait_s
    while time.time() < deadline:
        rows = api.query(f'max(timestamp({_REQUESTS}{{job="{job}"}}))')
        if rows and float(rows[0]["value"][1]) >= after:
            return
        time.sleep(0.25)
