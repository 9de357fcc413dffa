"""``ragheat dashboards ...``: render, check and snapshot the Grafana dashboards and Prometheus rules.

Heavy modules (grafanalib, matplotlib, httpx) are imported inside the commands so ``ragheat --help`` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ragheat.clikit import fail as _fail, guard, out

app = typer.Typer(help="Grafana dashboards and Prometheus rules as code.", no_args_is_help=True)
_guard = guard(interrupted="interrupted")


def _profile(name: str):
    from dashboards.slo import PROFILES

    if name not in PROFILES:
        _fail(f"--profile must be one of {', '.join(PROFILES)}, not {name!r}")
    return PROFILES[name]


def _boards(profile, only: Optional[str]):
    from dashboards.boards import all_boards

    boards = all_boards(profile)
    if not only:
        return boards
    wanted = [w.strip() for w in only.split(",") if w.strip()]
    unknown = sorted(set(wanted) - {b.slug for b in boards})
    if unknown:
        _fail(f"--boards: no board called {', '.join(unknown)} (boards: {', '.join(b.slug for b in boards)})")
    return tuple(b for b in boards if b.slug in wanted)


PROFILE_HELP = "production | test (every window divided by 60, for live tests)"


@app.command()
@_guard
def render(
    out_dir: Path = typer.Argument(..., help="folder to write into ('dashboards' refreshes the committed copies)"),
    profile: str = typer.Option("production", help=PROFILE_HELP),
    prometheus_url: str = typer.Option("http://prometheus:9090", help="Prometheus URL as Grafana reaches it"),
    traces_url: str = typer.Option("http://tempo:3200", help="Tempo URL as Grafana reaches it (exemplar links)"),
    dashboards_path: str = typer.Option("/var/lib/grafana/dashboards/ragheat",
                                        help="where Grafana finds the dashboard JSON files"),
    page_webhook: str = typer.Option("http://alert-receiver:9095/page", help="Alertmanager receiver for pages"),
    ticket_webhook: str = typer.Option("http://alert-receiver:9095/ticket", help="Alertmanager receiver for tickets"),
    prometheus_password_file: str = typer.Option(
        "", "--prometheus-password-file", help="Grafana presents basic auth to Prometheus with this password file "
                                               "(a path as Grafana sees it; `ragheat stack web-auth` writes it)"),
    prometheus_user: str = typer.Option("ragheat", "--prometheus-user",
                                        help="the user it presents with --prometheus-password-file"),
    alertmanager_templates: str = typer.Option("/etc/alertmanager", "--alertmanager-templates",
                                               help="the rendered alertmanager/ folder as Alertmanager sees it "
                                                    "(absolute: where it finds the notification template)"),
) -> None:
    """Write Grafana dashboards (JSON, sorted keys) and provisioning, Prometheus rules and Alertmanager config."""
    from dashboards.render import Targets, write

    if out_dir.exists() and not out_dir.is_dir():
        _fail(f"{out_dir} exists and is not a folder")
    targets = Targets(prometheus_url, traces_url, dashboards_path, page_webhook, ticket_webhook, prometheus_user,
                      prometheus_password_file, alertmanager_templates)
    written = write(out_dir, _profile(profile), targets)
    for path in written:
        out.print(f"wrote {path}")


@app.command()
@_guard
def check(
    prometheus: str = typer.Option(..., "--prometheus", help="Prometheus URL, e.g. http://127.0.0.1:9090"),
    profile: str = typer.Option("production", help=PROFILE_HELP),
    rate_window: Optional[str] = typer.Option(None, help="what $__rate_interval becomes (default: the profile's 5m)"),
    boards: Optional[str] = typer.Option(None, help="comma list of boards (latency, slo, quality, vllm, kernel)"),
    source: str = typer.Option("scraped", help="the latency histograms the panels read, as the boards' $source "
                                              "variable: scraped (classic buckets from /metrics) or native (the "
                                              "OTel Collector's native histograms)"),
    job: Optional[str] = typer.Option(None, help="check one scrape job (the boards' $job set to it; default: all)"),
    service: str = typer.Option("ragheat", help="what the job runs: ragheat (ragheat's own service: every panel) or "
                                                "library (only ragheat's instrumentation library: panels only the "
                                                "pipeline feeds are skipped, the library's must have data)"),
) -> None:
    """Run every panel's PromQL against a Prometheus; fail if one errors or returns nothing (absent sources are listed)."""
    from rich.table import Table

    from dashboards.promapi import PrometheusApi
    from dashboards.slo import QUANTILE_WINDOW_S
    from dashboards.spec import SOURCE_VALUES
    from dashboards.verify import SERVICE_KINDS, check_boards

    if source not in SOURCE_VALUES:
        _fail(f"--source must be one of {', '.join(SOURCE_VALUES)}, not {source!r}")
    if service not in SERVICE_KINDS:
        _fail(f"--service must be one of {', '.join(SERVICE_KINDS)}, not {service!r}")
    chosen = _profile(profile)
    checks = check_boards(PrometheusApi(prometheus), _boards(chosen, boards),
                          rate_window or chosen.window(QUANTILE_WINDOW_S), source=source, job=job, service=service)
    table = Table("status", "panel", "detail")
    colour = {"ok": "green", "absent": "yellow", "skipped": "blue", "empty": "red", "error": "red"}
    for c in checks:
        table.add_row(f"[{colour[c.status]}]{c.status}[/]", c.name, c.detail)
    out.print(table)
    failed = [c for c in checks if c.status in ("empty", "error")]
    if failed:
        _fail(f"{len(failed)} of {len(checks)} queries returned nothing or failed", code=1)
    if job is not None and all(c.status in ("absent", "skipped") for c in checks):
        # A misspelt job would otherwise pass with every panel absent.
        _fail(f"job {job!r} has no series of any family these boards read at {prometheus}", code=1)


@app.command()
@_guard
def snapshot(
    prometheus: str = typer.Option(..., "--prometheus", help="Prometheus URL, e.g. http://127.0.0.1:9090"),
    out_dir: Path = typer.Option(Path("docs/images/dashboards"), "--out", help="one PNG per board goes here"),
    minutes: float = typer.Option(15.0, min=0.1, help="time range ending now"),
    profile: str = typer.Option("production", help=PROFILE_HELP),
    rate_window: Optional[str] = typer.Option(None, help="rate window of the heatmaps (default: the profile's 5m)"),
    step: Optional[float] = typer.Option(None, min=0.1, help="seconds per column (default: range / 240)"),
    boards: Optional[str] = typer.Option(None, help="comma list of boards (latency, slo, quality, vllm, kernel)"),
) -> None:
    """Draw each board's heatmaps from Prometheus data to PNG (heatmaps without data are listed by name)."""
    from dashboards.promapi import PrometheusApi
    from dashboards.slo import QUANTILE_WINDOW_S
    from dashboards.snapshot import snapshot as take

    chosen = _profile(profile)
    result = take(PrometheusApi(prometheus), _boards(chosen, boards), out_dir, minutes,
                  rate_window or chosen.window(QUANTILE_WINDOW_S), step)
    for path in result.written:
        out.print(f"wrote {path}")
    for line in result.skipped:
        out.print(f"[yellow]skipped[/] {line}")
    if not result.written:
        _fail(f"no heatmap had data in the last {minutes:g} minutes at {prometheus}", code=1)
