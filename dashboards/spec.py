"""What a dashboard is, independent of Grafana's JSON: boards of panels of PromQL queries.

``dashboards.grafana`` turns these into Grafana JSON; ``dashboards.verify`` runs every query against a live
Prometheus; ``dashboards.snapshot`` draws the heatmaps to PNG. Keeping one description means the three can
never disagree about what a panel asks Prometheus.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

RATE_INTERVAL = "$__rate_interval"
"""Grafana's rate window (at least four scrape intervals); replaced by a profile window outside Grafana."""

JOB = "job"
"""The template variable choosing scrape jobs: several services share one Prometheus, each under its own ``job``."""
ON_JOB = f'{JOB}=~"${JOB}"'
"""The matcher every panel query carries, so a board shows only the services ``$job`` selects."""

SOURCE = "source"
"""The template variable choosing where latency histograms are read from (boards that offer both)."""
SCRAPED, NATIVE = "scraped", "native"
SOURCE_VALUES = {SCRAPED: "0", NATIVE: "1"}
"""``$source``'s value per option: each sourced query ends in ``and on() (vector($source) == N)``, so Grafana runs
both and only the chosen one returns data. ``scraped``: the classic ``le`` buckets Prometheus scrapes from the
service's ``/metrics``; ``native``: the native histograms the OTel Collector remote-writes from the service's OTLP
exponential histograms."""


@dataclass(frozen=True)
class Query:
    """One PromQL expression of a panel, its legend, and the families it reads."""

    expr: str
    legend: str = ""
    sources: tuple[str, ...] = ()
    """Metric families the query reads: when none of them exists in a Prometheus, the query has no data by
    design there (no vLLM, no probes), and checks report it as absent by name."""
    histograms: Literal["scraped", "native"] | None = None
    """On a board with a ``source`` variable: which histograms this query reads (None: it reads no histogram,
    and runs whatever the choice)."""


@dataclass(frozen=True)
class Variable:
    """A template variable filled from ``label_values(metric, label)``; ``All`` matches everything."""

    name: str
    metric: str
    label: str


@dataclass(frozen=True)
class Choice:
    """A template variable with fixed options, each ``(text, value)``; the first is the default."""

    name: str
    label: str
    options: tuple[tuple[str, str], ...]
    description: str = ""


SOURCE_CHOICE = Choice(SOURCE, "Histograms", tuple(SOURCE_VALUES.items()),
                       "scraped: classic buckets from /metrics; native: the OTel Collector's native histograms")


@dataclass(frozen=True)
class Panel:
    """One panel: title, kind, queries and display options."""

    title: str
    kind: Literal["heatmap", "timeseries", "stat", "bargauge", "gauge"]
    queries: tuple[Query, ...]
    unit: str = "s"
    description: str = ""
    repeat: str | None = None
    """A template variable: Grafana draws one copy of the panel per selected value (a heatmap per stage)."""
    thresholds: tuple[float, ...] = ()
    """Values drawn as lines (the 420 ms objective, the burn-rate factors)."""
    exemplars: bool = False
    width: int = 12
    log_y: bool = False
    stacked: bool = False
    """Time series drawn on top of each other (shares of one whole, such as answers by verdict)."""
    mappings: tuple[tuple[int, str], ...] = ()
    """Values shown as words, ``(value, text)``: a gauge of a place in an ordered set (a rung of the quality ladder)
    shows the name; a gauge spans its mappings' values."""
    pipeline_only: bool = False
    """Only ragheat's own pipeline feeds it (families of ``contract.PIPELINE_ONLY``, or stages only ragheat runs):
    a service with nothing of ragheat but the instrumentation library leaves it empty, and checks do not ask it."""


@dataclass(frozen=True)
class Board:
    """One dashboard: its panels and template variables."""

    uid: str
    title: str
    description: str
    panels: tuple[Panel, ...]
    variables: tuple[Variable | Choice, ...] = field(default=())
    tags: tuple[str, ...] = ("ragheat",)

    @property
    def slug(self) -> str:
        return self.uid.removeprefix("ragheat-")


_VARIABLE = re.compile(r"\$(\w+)")


def expand(expr: str, rate_window: str, values: dict[str, str] | None = None) -> str:
    """``expr`` as Prometheus would receive it from Grafana: the rate window filled in, each template
    variable replaced by its value from ``values``, else ``$source`` by the scraped option's value and any other by
    ``.*`` (Grafana's All, in a ``=~`` matcher)."""
    values = {SOURCE: SOURCE_VALUES[SCRAPED], **(values or {})}
    expr = expr.replace(RATE_INTERVAL, rate_window)
    return _VARIABLE.sub(lambda m: values.get(m.group(1), ".*"), expr)


_REGEX_META = re.compile(r"([.^$*+?()\[\]{}|\\])")


def regex_literal(value: str) -> str:
    """``value`` matched literally by a ``=~"..."`` matcher: regex metacharacters escaped, as Grafana does for a
    selected variable value, then written as the body of PromQL's double-quoted string."""
    escaped = _REGEX_META.sub(r"\\\1", value)
    return escaped.replace("\\", "\\\\").replace('"', '\\"')


def gated(expr: str, source: str) -> str:
    """``expr`` returning data only while ``$source`` is ``source``."""
    return f"{expr} and on() (vector(${SOURCE}) == {SOURCE_VALUES[source]})"
