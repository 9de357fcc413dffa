"""Run every panel's PromQL against a live Prometheus, as Grafana would with every variable at All (or ``$job`` at
the one job checked).

A query whose source families have no series in that Prometheus (for the job checked) is reported as ``absent``,
by name, rather than failed or silently passed: vLLM on a machine without it, kernel probes that are not running.
On boards with a ``source`` variable, only the chosen source's queries run (``$source`` set to it), as Grafana would
show them.

What a job runs decides which panels it must feed (``SERVICE_KINDS``): ``ragheat``, its own service, every panel;
``library``, a service whose only ragheat part is the instrumentation library, none of the ``pipeline_only`` panels
(reported ``skipped``), while the panels reading the library's families must return data, never ``absent``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from typing import Iterable, Literal

from dashboards import contract
from dashboards.promapi import PrometheusApi, PrometheusQueryError
from dashboards.spec import JOB, SCRAPED, SOURCE, SOURCE_VALUES, Board, Panel, Query, expand, regex_literal

Status = Literal["ok", "empty", "error", "absent", "skipped"]
RAGHEAT, LIBRARY = "ragheat", "library"
SERVICE_KINDS = (RAGHEAT, LIBRARY)
SERIES_SUFFIXES = ("", "_bucket", "_count", "_sum", "_total")
SHARED_NAMES = frozenset({contract.NATIVE_STAGE_DURATION, contract.NATIVE_REQUEST_DURATION})
"""Families whose name the collector's native histograms share: their bare series is the native histogram."""


@dataclass(frozen=True)
class QueryCheck:
    """The outcome of running one panel query: ok, empty, absent (source not running), error, or skipped (the
    service checked does not feed the panel)."""

    board: str
    panel: str
    legend: str
    expr: str
    status: Status
    detail: str = ""

    @property
    def name(self) -> str:
        return f"{self.board} / {self.panel}" + (f" [{self.legend}]" if self.legend else "")


def family_present(family: str, names: set[str], classic: bool = False) -> bool:
    """True when Prometheus has any series of ``family``; with ``classic``, a native histogram of the same name does
    not count (a query reading the scraped counts whatever ``$source`` says finds nothing in it)."""
    suffixes = SERIES_SUFFIXES[1:] if classic and family in SHARED_NAMES else SERIES_SUFFIXES
    return any(family + suffix in names for suffix in suffixes)


def selected(query: Query, source: str) -> bool:
    """Does ``query`` run when ``$source`` is ``source``?"""
    return query.histograms in (None, source)


def applies(panel: Panel, service: str) -> bool:
    """Does a service of kind ``service`` feed ``panel``?"""
    return service == RAGHEAT or not panel.pipeline_only


def required(query: Query, service: str) -> bool:
    """Must ``query`` return data even when its families are missing? A library-only service exports the library's
    families by definition, so their absence is a failure, not a component that is not running."""
    return service == LIBRARY and bool(query.sources) and set(query.sources) <= set(contract.LIBRARY)


def _points(series: dict) -> float:
    """A result's value, or a native histogram's observation count (NaN when it has none)."""
    if "histogram" in series:
        return float(series["histogram"][1].get("count", "NaN"))
    return float(series["value"][1])


def check_boards(api: PrometheusApi, boards: Iterable[Board], rate_window: str, source: str = SCRAPED,
                 job: str | None = None, service: str = RAGHEAT) -> list[QueryCheck]:
    """Run every query of ``boards`` that ``source`` selects against Prometheus, for every job or only ``job``, asking
    data only of the panels a service of kind ``service`` feeds; one ``QueryCheck`` each."""
    if service not in SERVICE_KINDS:
        raise ValueError(f"service must be one of {', '.join(SERVICE_KINDS)}, not {service!r}")
    names = api.metric_names(match=f"{{{JOB}={json.dumps(job)}}}" if job is not None else None)
    values = {SOURCE: SOURCE_VALUES[source], **({JOB: regex_literal(job)} if job is not None else {})}
    checks = []
    for board in boards:
        for panel in board.panels:
            for query in (q for q in panel.queries if selected(q, source)):
                expr = expand(query.expr, rate_window, values)
                base = QueryCheck(board.title, panel.title, query.legend, expr, "ok")
                if not applies(panel, service):
                    checks.append(replace(base, status="skipped", detail="only ragheat's own pipeline feeds it"))
                    continue
                # A query no source gates reads a histogram family's scraped series (never the native one); a
                # gated one's missing series are the wrong source chosen: empty, not absent.
                missing = [s for s in query.sources if not family_present(s, names, classic=query.histograms is None)]
                if query.sources and len(missing) == len(query.sources):
                    detail = "no series of " + ", ".join(missing) + (f" in job {job}" if job is not None else "")
                    checks.append(replace(base, status="empty", detail=f"{detail}, which the library exports")
                                  if required(query, service) else replace(base, status="absent", detail=detail))
                    continue
                try:
                    result = api.query(expr)
                except PrometheusQueryError as exc:
                    checks.append(replace(base, status="error", detail=str(exc)))
                    continue
                finite = [r for r in result if math.isfinite(_points(r))]
                checks.append(replace(base, detail=f"{len(finite)} series") if finite else
                              replace(base, status="empty", detail=f"{len(result)} series, none with a finite value"))
    return checks

