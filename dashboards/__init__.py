"""Grafana dashboards, Prometheus SLO rules and Alertmanager routes as code (``ragheat dashboards``, docs/dashboards.md).

``boards`` describes the panels, ``slo`` the objectives and burn-rate alerts, ``grafana`` and ``render`` write the
files, ``verify`` and ``snapshot`` run the panels' PromQL against a live Prometheus.
"""
