"""``ragheat stack ...``: the compose topology without Docker (``up``, ``status``, ``down``), and the stack's
default alert receiver. Heavy modules are imported inside the commands so ``ragheat --help`` stays fast."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer

from ragheat.clikit import console, fail as _fail, guard, load_settings, out

app = typer.Typer(help="Start or stop the whole stack locally (the compose topology without Docker).",
                  no_args_is_help=True)
DEFAULT_FOLDER = Path("data/stack")
FOLDER_HELP = "state file, logs, rendered configs and Prometheus data"


_guard = guard(interrupted="interrupted; whatever had started was stopped")


def _port_option(name: str, default: int):
    return typer.Option(default, f"--{name}-port", min=0, max=65535, help=f"{name} port on 127.0.0.1 (0 = a free one)")


@app.command()
@_guard
def up(
    index: Optional[Path] = typer.Option(None, "--index", help="index folder to serve (default server.index_dir)"),
    folder: Path = typer.Option(DEFAULT_FOLDER, "--folder", help=FOLDER_HELP),
    probes: str = typer.Option("auto", help="auto (when root) | on | off: the eBPF exporter"),
    vllm_model: str = typer.Option("auto", "--vllm-model",
                                   help="auto (SmolLM2-135M-Instruct when scripts/install_vllm.sh installed it and "
                                        "generation.generator is not set; else off) | off (extractive answers) | DIR "
                                        "(a model folder vLLM serves here) | dummy (vLLM with random weights: noise, "
                                        "for exercising vLLM only)"),
    llm_url: Optional[str] = typer.Option(None, "--llm-url", help="an OpenAI-compatible server's /v1 URL to answer "
                                                                   "with (default: generation.base_url when "
                                                                   "generation.generator is openai)"),
    llm_model: Optional[str] = typer.Option(None, "--llm-model", help="its served model name (default: its first)"),
    rules_profile: str = typer.Option("production", "--rules-profile",
                                      help="production | test (a drill: SLO windows, scrape and evaluation intervals "
                                           "and Alertmanager's timers divided by 60, so alerts fire in seconds)"),
    api_port: int = _port_option("api", 8000),
    prometheus_port: int = _port_option("prometheus", 9090),
    alertmanager_port: int = _port_option("alertmanager", 9093),
    receiver_port: int = _port_option("alert-receiver", 9095),
    probes_port: Optional[int] = typer.Option(None, "--probes-port", min=0, max=65535,
                                              help="probes port on 127.0.0.1 (default probes.port; 0 = a free one)"),
    vllm_port: int = _port_option("vllm", 8001),
    ready_timeout: float = typer.Option(180.0, min=1.0, help="seconds each component may take to answer"),
    replicas: int = typer.Option(1, "--replicas", min=1, max=16,
                                 help="API processes (ragheat serve); more than 1 puts Debian's nginx on the API port "
                                      "in front of them (least_conn) and Prometheus scrapes each"),
    watch_url: Optional[list[str]] = typer.Option(None, "--watch-url", metavar="URL",
                                                  help="watch a service started elsewhere: Prometheus scrapes this "
                                                       "URL (repeatable) with the SLO rules; no ragheat API or vLLM "
                                                       "is started. Unreachable at start: a warning, the target shows "
                                                       "down until it answers"),
    watch_job: str = typer.Option("service", "--watch-job", metavar="NAME",
                                  help="the Prometheus job name of the --watch-url targets"),
    watch_pid: Optional[list[int]] = typer.Option(None, "--watch-pid", metavar="PID",
                                                  help="run the eBPF probes on this process of the watched service "
                                                       "(repeatable; needs root, as `ragheat probes --pid`)"),
    remote_write: bool = typer.Option(False, "--remote-write",
                                      help="start VictoriaMetrics (Debian's victoria-metrics) on loopback, its data "
                                           "in the stack folder, and have Prometheus remote-write every series to it"),
    remote_write_url: Optional[str] = typer.Option(None, "--remote-write-url", metavar="URL",
                                                   help="remote-write every series to this receiver instead "
                                                        "(VictoriaMetrics, Mimir, Thanos Receive, Cortex, a "
                                                        "Prometheus); nothing more is started"),
    victoriametrics_port: int = _port_option("victoriametrics", 0),
) -> None:
    """Start the API (N replicas behind nginx with --replicas N), Prometheus (compose's config, targets on
    loopback), Alertmanager, the alert receiver, the eBPF probes when root and vLLM when a model is given, as
    background processes; `stack down` stops them. With --watch-url/--watch-pid, the same around a service
    ragheat did not start. With --remote-write (or --remote-write-url URL), Prometheus also ships every series to a
    long-term store."""
    from dashboards.slo import PROFILES
    from stack.local import StackOptions, up as start, wait_for_scrapes
    from stack.watch import WatchPlan

    if probes not in ("auto", "on", "off"):
        _fail(f"--probes must be auto, on or off, not {probes!r}")
    if rules_profile not in PROFILES:
        _fail(f"--rules-profile must be one of {', '.join(PROFILES)}, not {rules_profile!r}")
    if remote_write and remote_write_url:
        _fail("--remote-write starts VictoriaMetrics here and --remote-write-url ships to a receiver elsewhere: give "
              "one of them")
    from rag.errors import ConfigurationError
    from stack.remote_write import LOCAL, check_url

    try:  # here, before the URL and the sentinel for a receiver started here share one option
        remote = check_url(remote_write_url) if remote_write_url is not None else LOCAL if remote_write else None
    except ConfigurationError as exc:
        _fail(str(exc))
    settings = load_settings(server={"index_dir": index})
    generation = settings.generation
    watch = WatchPlan(tuple(watch_url or ()), watch_job, tuple(watch_pid or ()))
    if watch:  # no API here: only an explicit --vllm-model or --llm-url means anything, and stack.local refuses it
        vllm_model = "off" if vllm_model == "auto" else vllm_model
        if watch.pids and probes != "off":
            from probes.environment import missing_privileges

            missing = missing_privileges()
            if missing:
                _fail(f"--watch-pid runs the eBPF probes, which need root or CAP_BPF and CAP_PERFMON; this process "
                      f"lacks {' and '.join(missing)}")
    else:
        vllm_model = _auto_model(vllm_model, generation, llm_url, os.environ)
        if llm_url is None and generation.generator == "openai" and vllm_model == "off":
            llm_url, llm_model = generation.base_url, llm_model or generation.model  # a model configured by settings
        elif generation.generator == "vllm" and llm_url is None and vllm_model == "off":
            _fail("generation.generator is vllm (the in-process engine), which `stack up` does not run: give "
                  "--vllm-model DIR to serve the model folder with vLLM's server instead")
    ports = {"api": api_port, "prometheus": prometheus_port, "alertmanager": alertmanager_port,
             "alert-receiver": receiver_port, "vllm": vllm_port, "victoriametrics": victoriametrics_port,
             "probes": settings.probes.port if probes_port is None else probes_port}
    options = StackOptions(settings.server.index_dir, folder, ports, probes, vllm_model,
                           vllm_python=generation.vllm_python, llm_url=llm_url, llm_model=llm_model or "",
                           rules_profile=rules_profile, time_divisor=PROFILES[rules_profile].divisor,
                           ready_timeout_s=ready_timeout, replicas=replicas, watch=watch,
                           remote_write=remote)
    state = start(options, say=_say)
    targets = wait_for_scrapes(state.get("prometheus").url)
    _print_state(state, targets)
    out.print(f"stop it with: ragheat stack down --folder {folder}")


def _auto_model(vllm_model: str, generation, llm_url: str | None, environ) -> str:
    """``--vllm-model auto``: the installed real model (stack/smollm.py), unless the operator chose the answers
    already (``--llm-url``, or ``RAGHEAT_GENERATION__GENERATOR`` set); else ``off``."""
    if vllm_model != "auto":
        return vllm_model
    if llm_url is not None or environ.get("RAGHEAT_GENERATION__GENERATOR"):
        return "off"
    from stack.smollm import installed_model
    from stack.vllm import DEFAULT_VLLM_PYTHON

    folder = installed_model()
    if folder is None or (generation.vllm_python is None and not DEFAULT_VLLM_PYTHON.is_file()):
        return "off"
    return str(folder)


def _say(line: str) -> None:
    console.print(line, style="bold red" if line.startswith("WARNING") else None, highlight=False, markup=False)


@app.command()
@_guard
def status(folder: Path = typer.Option(DEFAULT_FOLDER, "--folder", help=FOLDER_HELP)) -> None:
    """Which stack processes run, and what Prometheus says of its targets and rules: every rendered rule group
    and alert must be loaded and Alertmanager attached (exit 1 otherwise)."""
    import httpx

    from stack import topology
    from stack.local import alertmanagers, prometheus_report
    from stack.processes import StackState

    state = StackState.load(folder)
    if state is None:
        _fail(f"no stack state in {folder}: nothing started there (ragheat stack up --folder {folder})", code=1)
    prometheus, alertmanager = state.get("prometheus"), state.get("alertmanager")
    targets, groups, problems = [], [], []
    if prometheus is not None and prometheus.alive():
        try:
            targets, groups = prometheus_report(prometheus.url)
            expected = topology.rule_expectations(sorted((folder / "rendered" / "prometheus").glob("*.yml")))
            problems = topology.rule_problems(expected, groups)
            if alertmanager is not None and alertmanager.url not in alertmanagers(prometheus.url):
                problems.append(f"prometheus does not send alerts to {alertmanager.url}")
        except httpx.HTTPError as exc:
            problems = [f"prometheus at {prometheus.url} did not answer ({exc})"]
    else:
        problems = ["prometheus is not running: no alert rule is evaluated"]
    _print_state(state, targets)
    for g in groups:
        bad = f"  [red]failing: {', '.join(g['unhealthy'])}[/]" if g["unhealthy"] else ""
        alerts = f" ({len(g['alerts'])} alerts: {', '.join(g['alerts'])})" if g["alerts"] else ""
        out.print(f"rules  {g['name']}: {g['rules']} rules{alerts}{bad}", highlight=False)
    for problem in problems:
        out.print(f"[red]rules problem: {problem}[/]", highlight=False)
    if problems or not all(p.alive() for p in state.processes) or any(t["health"] == "down" for t in targets):
        raise typer.Exit(1)


def _print_state(state, targets: list[dict]) -> None:
    from rich.table import Table

    table = Table("component", "pid", "running", "url", "log")
    for p in state.processes:
        table.add_row(p.name, str(p.pid), "[green]yes[/]" if p.alive() else "[red]no[/]", p.url, p.log)
    out.print(table)
    for t in targets:
        colour = {"up": "green", "down": "red"}.get(t["health"], "yellow")
        replica = f" {t['replica']}" if t.get("replica") else ""
        out.print(f"target {t['job']}{replica}: [{colour}]{t['health']}[/] {t['error']}", highlight=False)
    for note in state.notes:
        out.print(f"[dim]note: {note}[/]", highlight=False)


@app.command()
@_guard
def down(folder: Path = typer.Option(DEFAULT_FOLDER, "--folder", help=FOLDER_HELP)) -> None:
    """Stop every process `stack up` started (recorded in the folder's state file)."""
    from stack.processes import StackState

    try:
        state = StackState.load(folder)
    except ValueError as exc:
        _fail(str(exc))
    if state is None:
        out.print(f"no stack running from {folder}")
        return
    stopped = state.stop_all()
    out.print(f"stopped {', '.join(stopped)}" if stopped else "nothing was running; state cleared")


@app.command("web-auth")
@_guard
def web_auth(
    folder: Path = typer.Argument(DEFAULT_FOLDER / "auth", help="where to write web.yml and password"),
    renew: bool = typer.Option(False, "--renew", help="a new password even if the folder holds one (every client "
                                                      "must then read the new one)"),
    world_readable: bool = typer.Option(False, "--world-readable",
                                        help="the password file mode 644 instead of 600: for compose's volume, "
                                             "where other services' users read it"),
) -> None:
    """Basic auth for Prometheus and Alertmanager: a password (kept if the folder has one) and the web config with
    its bcrypt hash, for their --web.config.file (compose runs this before they start)."""
    from stack.webauth import USER, ensure_web_auth

    auth = ensure_web_auth(folder, renew=renew, world_readable=world_readable)
    state = "a new password" if auth.created else "the password already there"
    console.print(f"web config {auth.web_config} (pass it as --web.config.file) accepts user {USER} with {state}, "
                  f"in {auth.password_file} (mode {auth.password_file.stat().st_mode & 0o777:o})", highlight=False)


@app.command("alert-receiver")
def alert_receiver(
    host: str = typer.Option("127.0.0.1", help="bind address"),
    port: int = typer.Option(9095, min=0, max=65535, help="port"),
) -> None:
    """Log Alertmanager's page and ticket notifications as JSON lines (the stack's default receiver)."""
    import signal
    import sys

    from stack.alert_receiver import AlertReceiver

    try:
        server = AlertReceiver((host, port))
    except OSError as exc:
        _fail(f"cannot listen on {host}:{port} ({exc.strerror}); choose another --port")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    console.print(f"alert receiver at http://{host}:{server.server_address[1]} (/page, /ticket, /alerts)")
    try:
        server.serve_forever()
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        server.server_close()
