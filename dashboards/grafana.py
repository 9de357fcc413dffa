"""Boards (``dashboards.spec``) to Grafana JSON with grafanalib, plus Grafana's provisioning files."""

from __future__ import annotations

import json

import attr
from grafanalib import core as g
from grafanalib._gen import DashboardEncoder

from dashboards.spec import NATIVE, Board, Choice, Panel

PROMETHEUS_UID = "ragheat-prometheus"
TRACES_UID = "ragheat-traces"
DATASOURCE = {"type": "prometheus", "uid": PROMETHEUS_UID}
PANEL_HEIGHT = 8


@attr.s
class PromTarget(g.Target):
    """grafanalib's Target plus the ``exemplar`` switch of Grafana's Prometheus query editor."""

    exemplar = attr.ib(default=False)

    def to_json_data(self):
        return {**super().to_json_data(), "exemplar": self.exemplar}


@attr.s
class RankedBars(g.Panel):
    """A bar gauge of each series' latest value, in the order the query returns them (Grafana >= 8 options: no
    maximum, so the longest bar is the largest value)."""

    unit = attr.ib(default="none")

    def to_json_data(self):
        return self.panel_json({
            "type": "bargauge",
            "options": {"displayMode": "basic", "orientation": "horizontal", "showUnfilled": True,
                        "reduceOptions": {"calcs": ["lastNotNull"], "values": False}},
            "fieldConfig": {"defaults": {"unit": self.unit, "min": 0}, "overrides": []},
        })


@attr.s
class MappedGauge(g.Panel):
    """A gauge of each series' latest value, spanning ``mappings``' values and showing each value as its text
    (Grafana >= 8 options and value mappings: a place in an ordered set reads as its name)."""

    unit = attr.ib(default="none")
    mappings = attr.ib(default=())

    def to_json_data(self):
        values = [value for value, _ in self.mappings]
        words = {str(value): {"text": text, "index": i} for i, (value, text) in enumerate(self.mappings)}
        return self.panel_json({
            "type": "gauge",
            "options": {"orientation": "auto", "showThresholdMarkers": True, "showThresholdLabels": False,
                        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}},
            "fieldConfig": {"defaults": {"unit": self.unit, "decimals": 0, "min": min(values, default=0),
                                         "max": max(values, default=1),
                                         "mappings": [{"type": "value", "options": words}] if words else []},
                            "overrides": []},
        })


def _targets(panel: Panel) -> list[PromTarget]:
    # Classic buckets need format "heatmap" (one series per le, de-accumulated by Grafana); a native histogram
    # result is drawn by the heatmap panel from its own buckets, as a plain time series query returns it.
    def fmt(query) -> str:
        return "heatmap" if panel.kind == "heatmap" and query.histograms != NATIVE else "time_series"

    # A ranking is of the latest values: an instant query keeps the order sort_desc gives it.
    return [PromTarget(expr=q.expr, legendFormat=q.legend, refId=chr(ord("A") + i), format=fmt(q),
                       exemplar=panel.exemplars, datasource=DATASOURCE, intervalFactor=1,
                       instant=panel.kind == "bargauge")
            for i, q in enumerate(panel.queries)]


def _threshold_steps(values: tuple[float, ...]) -> list[dict]:
    return [{"color": "green", "value": None}] + [{"color": "red", "value": v} for v in values]


def _panel(panel: Panel, grid: g.GridPos) -> g.Panel:
    common = dict(title=panel.title, description=panel.description, dataSource=DATASOURCE,
                  targets=_targets(panel), gridPos=grid,
                  repeat=g.Repeat("h", panel.repeat, maxPerRow=3) if panel.repeat else g.Repeat())
    if panel.kind == "heatmap":
        # Grafana >= 9 heatmap options: buckets come pre-computed from Prometheus (calculate off), each le a row.
        options = {"calculate": False, "cellGap": 1, "yAxis": {"unit": panel.unit, "axisPlacement": "left"},
                   "rowsFrame": {"layout": "auto"}, "filterValues": {"le": 1e-9},
                   "color": {"mode": "scheme", "scheme": "Spectral", "scale": "exponential", "exponent": 0.5,
                             "reverse": True, "steps": 64},
                   "exemplars": {"color": "rgba(255,0,255,0.7)"}, "tooltip": {"show": True, "yHistogram": True},
                   "legend": {"show": True}}
        return g.Heatmap(dataFormat="tsbuckets", yBucketBound="upper", hideZeroBuckets=True, options=options,
                         yAxis=g.YAxis(format=panel.unit, logBase=2 if panel.log_y else 1), **common)
    if panel.kind == "bargauge":
        return RankedBars(unit=panel.unit, thresholds=_threshold_steps(panel.thresholds), **common)
    if panel.kind == "gauge":
        return MappedGauge(unit=panel.unit, mappings=panel.mappings, thresholds=_threshold_steps(panel.thresholds),
                           **common)
    if panel.kind == "stat":
        return g.Stat(format=panel.unit, reduceCalc="lastNotNull", graphMode="none",
                      thresholds=_threshold_steps(panel.thresholds), **common)
    stacked = {"stacking": {"mode": "normal", "group": "A"}, "fillOpacity": 60} if panel.stacked else {}
    return g.TimeSeries(unit=panel.unit, thresholds=_threshold_steps(panel.thresholds),
                        thresholdsStyleMode="line" if panel.thresholds else "off",
                        scaleDistributionType="log" if panel.log_y else "linear",
                        legendDisplayMode="table", legendCalcs=["lastNotNull", "max"], tooltipMode="multi",
                        **stacked, **common)


def _layout(board: Board) -> list[g.Panel]:
    """Left to right, top to bottom on Grafana's 24-column grid."""
    panels, x, y = [], 0, 0
    for panel in board.panels:
        if x + panel.width > 24:
            x, y = 0, y + PANEL_HEIGHT
        panels.append(_panel(panel, g.GridPos(h=PANEL_HEIGHT, w=panel.width, x=x, y=y)))
        x += panel.width
    return panels


def _choice(choice: Choice) -> g.Template:
    """A custom variable: ``text : value`` options, the first selected."""
    options = [{"selected": i == 0, "text": text, "value": value} for i, (text, value) in enumerate(choice.options)]
    return g.Template(name=choice.name, label=choice.label, type="custom", options=options,
                      query=",".join(f"{text} : {value}" for text, value in choice.options),
                      includeAll=False, multi=False, default=choice.options[0][1])


def dashboard(board: Board) -> g.Dashboard:
    """The grafanalib ``Dashboard`` of a board."""
    templates = [_choice(v) if isinstance(v, Choice) else
                 g.Template(name=v.name, label=v.name, query=f"label_values({v.metric}, {v.label})",
                            dataSource=DATASOURCE, includeAll=True, multi=True, allValue=".*", default="$__all",
                            refresh=g.REFRESH_ON_TIME_RANGE_CHANGE)
                 for v in board.variables]
    return g.Dashboard(title=board.title, uid=board.uid, description=board.description, tags=list(board.tags),
                       panels=_layout(board), templating=g.Templating(list=templates), timezone="browser",
                       time=g.Time("now-1h", "now"), refresh="30s").auto_panel_ids()


def dashboard_json(board: Board) -> str:
    """The board as Grafana JSON, keys sorted so renders are byte-for-byte reproducible."""
    return json.dumps(dashboard(board).to_json_data(), cls=DashboardEncoder, sort_keys=True, indent=2) + "\n"


def datasources(prometheus_url: str, traces_url: str, prometheus_user: str = "",
                prometheus_password_file: str = "") -> dict:
    """Prometheus (exemplars' ``trace_id`` opens the trace in the traces datasource) and Tempo for traces. With
    ``prometheus_password_file`` Grafana presents basic auth to Prometheus: ``prometheus_user`` and the file's
    content, which Grafana reads when it provisions (``$__file{}``), so the password is never written here."""
    prometheus = {"name": "Prometheus", "uid": PROMETHEUS_UID, "type": "prometheus", "access": "proxy",
                  "url": prometheus_url, "isDefault": True,
                  "jsonData": {"httpMethod": "POST", "timeInterval": "5s",
                               "exemplarTraceIdDestinations": [{"name": "trace_id", "datasourceUid": TRACES_UID}]}}
    if prometheus_password_file:
        prometheus.update(basicAuth=True, basicAuthUser=prometheus_user,
                          secureJsonData={"basicAuthPassword": f"$__file{{{prometheus_password_file}}}"})
    return {"apiVersion": 1, "datasources": [
        prometheus,
        {"name": "Traces", "uid": TRACES_UID, "type": "tempo", "access": "proxy", "url": traces_url},
    ]}


def dashboard_provider(path: str) -> dict:
    """Grafana loads every JSON file in ``path`` (where the rendered dashboards are mounted) into one folder."""
    return {"apiVersion": 1, "providers": [
        {"name": "ragheat", "folder": "ragheat", "type": "file", "disableDeletion": True, "allowUiUpdates": False,
         "updateIntervalSeconds": 30, "options": {"path": path}},
    ]}
