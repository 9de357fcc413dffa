"""``ragheat dashboards ...``: render and snapshot the Grafana dashboards."""

from __future__ import annotations

import typer

app = typer.Typer(help="Grafana dashboards and Prometheus rules as code.", no_args_is_help=True)
