"""``ragheat probes``: the eBPF exporter, serving ``/metrics`` on its own port (or printing text histograms)."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Optional

import typer

from ragheat.clikit import console, fail as _fail, load_settings


def probes(
    pid: Optional[list[int]] = typer.Option(None, "--pid", help="the service's process id (repeat it for the "
                                                                "workers of one service: counted together)"),
    service_url: Optional[str] = typer.Option(None, "--service-url",
                                              help="probe every local process listening at this URL (one service, or "
                                                   "the workers of `ragheat serve --workers N`), followed as they "
                                                   "are restarted"),
    host: str = typer.Option("127.0.0.1", "--host", help="bind address of the probes' /metrics"),
    port: Optional[int] = typer.Option(None, "--port", help="port of the probes' /metrics (default probes.port)"),
    scheduler: Optional[bool] = typer.Option(None, "--scheduler/--no-scheduler",
                                             help="run-queue latency and off-CPU time per stage"),
    syscalls: Optional[bool] = typer.Option(None, "--syscalls/--no-syscalls",
                                            help="system-call latency per stage and family (off by default)"),
    tcp_retransmits: Optional[bool] = typer.Option(None, "--tcp-retransmits/--no-tcp-retransmits",
                                                   help="count TCP retransmits on the service's ports"),
    print_after: Optional[float] = typer.Option(None, "--print", min=0.1, metavar="SECONDS",
                                                help="measure for SECONDS, print text histograms and exit"),
) -> None:
    """eBPF kernel probes: run-queue, off-CPU and system-call latency of a service, by RAG stage."""
    from probes.environment import ProbesUnavailable, check_privileges

    if bool(pid) == (service_url is not None):
        _fail("give exactly one of --pid PID (repeatable) or --service-url URL")
    settings = load_settings(probes={"scheduler": scheduler, "syscalls": syscalls,
                                     "tcp_retransmits": tcp_retransmits, "port": port})
    try:
        check_privileges()  # first: the one thing a user most often lacks, before any slower check
        from probes.discover import listening_ports, pids_for_url
        from probes.loader import KernelProbes

        service_port = None
        if service_url is not None:
            pids, service_port = pids_for_url(service_url)
        else:
            pids = sorted(set(pid))
            for p in pids:
                if not Path(f"/proc/{p}").is_dir():
                    _fail(f"no process with pid {p} is running")
        ports = {port for p in pids for port in listening_ports(p)}
        ports = sorted(ports | {service_port} if service_port else ports)
        attached = KernelProbes.attach(pids, settings.probes, tcp_ports=ports)
    except ProbesUnavailable as exc:
        _fail(str(exc))
    with attached:
        _run(attached, service_url, ports, host, settings.probes.port, print_after)


def _follow(attached, service_url: str | None) -> str | None:
    """Keep the probes on the live targets: with ``service_url``, whatever listens there now (a restarted worker's
    successor in); else the given pids that still run. A sentence when nothing is left to probe."""
    from probes.discover import pids_for_url
    from probes.environment import ProbesUnavailable

    if service_url is None:
        alive = [p for p in attached.targets if Path(f"/proc/{p}").is_dir()]
        return None if alive else f"pid {', '.join(map(str, attached.targets))} exited; stopping"
    try:
        pids, _ = pids_for_url(service_url)
        if tuple(pids) != attached.targets:
            attached.retarget(pids)
            console.print(f"now probing pid {', '.join(map(str, pids))} (listening at {service_url})")
    except ProbesUnavailable as exc:  # between a worker's death and its successor's bind, or the service stopped
        if not any(Path(f"/proc/{p}").is_dir() for p in attached.targets):
            return f"{exc}; stopping"
    return None


def _run(attached, service_url: str | None, ports: list[int], host: str, port: int,
         print_after: float | None) -> None:
    from prometheus_client import CollectorRegistry, start_http_server

    from probes.collector import KernelCollector
    from probes.textreport import format_snapshot

    options = attached.options
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    signal.signal(signal.SIGINT, lambda *_: stopping.append(True))
    enabled = ", ".join(name for name, on in (("scheduler", options.scheduler), ("syscalls", options.syscalls),
                                              ("tcp_retransmits", options.tcp_retransmits)) if on)
    tcp_scope = f"ports {', '.join(map(str, ports))}" if ports else "every port on this host"
    targets = ", ".join(map(str, attached.targets))
    if print_after is not None:
        console.print(f"probing pid {targets} ({enabled}; TCP: {tcp_scope}) for {print_after:g} s ...")
        deadline = time.monotonic() + print_after
        while not stopping and time.monotonic() < deadline and any(Path(f"/proc/{p}").is_dir()
                                                                      for p in attached.targets):
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
        print(format_snapshot(attached.snapshot()))
        return
    registry = CollectorRegistry()
    registry.register(KernelCollector(attached.snapshot, scheduler=options.scheduler, syscalls=options.syscalls,
                                      tcp_retransmits=options.tcp_retransmits))
    try:
        server, _ = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        _fail(f"cannot serve /metrics on {host}:{port} ({exc.strerror}); choose another --port")
    bound = server.server_address[1]
    # One line on stdout that scripts (and the tests) read to find the port.
    print(f"serving kernel probes for pid {targets} ({enabled}; TCP: {tcp_scope}) at http://{host}:{bound}/metrics",
          flush=True)
    try:
        checked = 0.0
        while not stopping:
            if time.monotonic() - checked >= 1.0:
                checked = time.monotonic()
                if (why := _follow(attached, service_url)) is not None:
                    console.print(why)
                    break
            time.sleep(0.2)
    finally:
        server.shutdown()
