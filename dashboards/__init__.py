"""Grafana dashboards as code and Prometheus SLO rules. Nothing here yet: they land with their own issue."""
