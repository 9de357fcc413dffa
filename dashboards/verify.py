"""Run every panel's PromQL against a live Prometheus, as Grafana would with every variable at All.

A query whose source families do not exist in that Prometheus (vLLM on a machine without it, kernel probes
that are not running) is reported as ``absent``, by name, rather than failed or silently passed. On boards with a
``source`` variable, only the chosen source's queries run (``$source`` set to it), as Grafana would show them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Iterable, Literal

from dashboards.promapi import PrometheusApi, PrometheusQueryError
from dashboards.spec import SCRAPED, SOURCE, SOURCE_VALUES, Board, Query, expand

Status = Literal["ok", "empty", "error", "absent"]
SERIES_SUFFIXES = ("", "_bucket", "_count", "_sum", "_total")


@dataclass(frozen=True)
class QueryCheck:
    """The outcome of running one panel query: ok, empty, absent (source not running) or error."""

    board: str
    panel: str
    legend: str
    expr: str
    status: Status
    detail: str = ""

    @property
    def name(self) -> str:
        return f"{self.board} / {self.panel}" + (f" [{self.legend}]" if self.legend else "")


def family_present(family: str, names: set[str]) -> bool:
    """True when Prometheus has any series of ``family``."""
    return any(family + suffix in names for suffix in SERIES_SUFFIXES)


def selected(query: Query, source: str) -> bool:
    """Does ``query`` run when ``$source`` is ``source``?"""
    return query.histograms in (None, source)


def _points(series: dict) -> float:
    """A result's value, or a native histogram's observation count (NaN when it has none)."""
    if "histogram" in series:
        return float(series["histogram"][1].get("count", "NaN"))
    return float(series["value"][1])


def check_boards(api: PrometheusApi, boards: Iterable[Board], rate_window: str,
                 source: str = SCRAPED) -> list[QueryCheck]:
    """Run every query of ``boards`` that ``source`` selects against Prometheus; one ``QueryCheck`` each."""
    names = api.metric_names()
    values = {SOURCE: SOURCE_VALUES[source]}
    checks = []
    for board in boards:
        for panel in board.panels:
            for query in (q for q in panel.queries if selected(q, source)):
                expr = expand(query.expr, rate_window, values)
                base = QueryCheck(board.title, panel.title, query.legend, expr, "ok")
                missing = [s for s in query.sources if not family_present(s, names)]
                if query.sources and len(missing) == len(query.sources):
                    checks.append(replace(base, status="absent", detail="no series of " + ", ".join(missing)))
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

