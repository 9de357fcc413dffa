"""``ragheat explain``: why the P99 of an observed service grew, from the Prometheus that scrapes it."""

from __future__ import annotations

import json
from typing import Optional

import typer

from ragheat.clikit import fail, guard, out


@guard()
def explain(
    prometheus: str = typer.Option(..., "--prometheus", help="Prometheus URL, e.g. http://127.0.0.1:9090"),
    window: str = typer.Option("10m", help="the minutes to explain, ending now (or at --at)"),
    baseline: str = typer.Option("1h", help="the minutes before the window to compare with"),
    baseline_gap: Optional[str] = typer.Option(None, help="time between the baseline's end and the window's start, "
                                                         "e.g. 23h: the same hour yesterday (default: none)"),
    job: Optional[str] = typer.Option(None, help="the scrape job of the service (default: the one job with "
                                                  "requests)"),
    knee: Optional[float] = typer.Option(None, min=0.0, help="the service's knee in req/s (from `ragheat bench`), "
                                                             "quoted beside the offered load"),
    at: Optional[float] = typer.Option(None, help="unix time the window ends (default: now)"),
    as_json: bool = typer.Option(False, "--json", help="print the explanation as JSON"),
) -> None:
    """Compare the window with the baseline before it (just before, or --baseline-gap earlier) and rank the causes of
    the extra tail latency."""
    from dashboards.promapi import PrometheusApi
    from explain.causes import explain as rank
    from explain.report import as_json as to_json, render
    from explain.signals import Span, duration_s, gather

    window_s, baseline_s = duration_s(window, "--window"), duration_s(baseline, "--baseline")
    gap_s = duration_s(baseline_gap, "--baseline-gap") if baseline_gap is not None else 0
    if window_s < 10:
        fail("--window must be at least 10s: a rate needs several scrapes")
    explanation = rank(gather(PrometheusApi(prometheus), job, Span(window_s), Span(baseline_s, window_s + gap_s),
                              at=at), knee_qps=knee)
    if as_json:
        out.print_json(json.dumps(to_json(explanation)))
    else:
        render(explanation, out)
