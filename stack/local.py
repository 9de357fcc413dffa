"""``ragheat stack up``: the compose topology as local processes on loopback, from compose's own configs.

Started here: the API (``ragheat serve``), the alert receiver, Alertmanager and Prometheus (Debian's
binaries), the eBPF exporter when privileged, and vLLM on the CPU when its environment (.venv-vllm) is
installed. Not started (no binaries on a machine without Docker): the OTel Collector, Tempo, Grafana and
Neo4j; their scrape jobs are left out of the local Prometheus config and named in the state's notes.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal

import httpx
import yaml

from rag.errors import ConfigurationError
from stack import topology
from stack.children import free_port, wait_until_ok
from stack.processes import Managed, StackState

DEFAULT_PORTS = {"api": 8000, "prometheus": 9090, "alertmanager": 9093, "alert-receiver": 9095, "probes": 9465,
                 "vllm": 8001}
SERVED_MODEL = "ragheat-llm"  # compose's default VLLM_SERVED_NAME
ALERTMANAGER_BINARIES = ("prometheus-alertmanager", "alertmanager")  # Debian's name, upstream's name


class StackError(ConfigurationError):
    """The local stack could not start; the message names the component and its log."""


@dataclass
class StackOptions:
    """What ``ragheat stack up`` was asked for: the index, the state folder, ports, probes and vLLM."""

    index: Path
    folder: Path
    ports: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_PORTS))
    probes: Literal["auto", "on", "off"] = "auto"
    vllm_model: str = "auto"   # auto (tiny random-weight model when vLLM is installed) | off | a model folder
    vllm_python: Path | None = None
    ready_timeout_s: float = 180.0


def ragheat_executable() -> str:
    """The ``ragheat`` console script of this interpreter's environment."""
    return str(Path(sys.executable).parent / "ragheat")


def _log_tail(managed: Managed, chars: int = 1200) -> str:
    try:
        return Path(managed.log).read_text(errors="replace")[-chars:].strip()
    except OSError:
        return ""


def _resolve_ports(wanted: dict[str, int], components: list[str]) -> dict[str, int]:
    ports = {}
    for name in components:
        port = wanted.get(name, DEFAULT_PORTS[name])
        if port == 0:
            port = free_port()
        else:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    raise StackError(f"port {port} for {name} is in use; pass --{name}-port 0 for a free one "
                                     f"(or stop what holds it)") from None
        ports[name] = port
    return ports


def _vllm_plan(options: StackOptions, folder: Path) -> tuple[Path | None, str, str | None]:
    """(interpreter, model, note): whether and how vLLM runs; the note says why it does not."""
    if options.vllm_model == "off":
        return None, "", "vllm off (--vllm-model off)"
    from stack.vllm import vllm_python

    try:
        python = vllm_python(options.vllm_python)
    except ConfigurationError as exc:
        if options.vllm_model == "auto":
            return None, "", f"vllm not started: {exc}"
        raise StackError(str(exc)) from None
    if options.vllm_model != "auto":
        model = Path(options.vllm_model)
        if not (model / "config.json").is_file():
            raise StackError(f"--vllm-model {model} is not a model folder (no config.json in it)")
        return python, str(model), None
    from stack.tiny_llama import build_tiny_llama

    # No weights can be downloaded here: a tiny Llama with random weights (vLLM's dummy loader) exercises
    # the engine, its metrics and the API's fallback; its text is noise. docs/stack.md: real models.
    texts = [p.read_text(errors="replace") for p in sorted((topology.REPO / "docs").glob("*.md"))]
    texts.append((topology.REPO / "README.md").read_text(errors="replace"))
    return python, str(build_tiny_llama(folder / "tiny-llama", texts)), None


def _vllm_argv(python: Path, model: str, port: int, tiny: bool) -> list[str]:
    from stack.vllm import server_argv

    args = ["--max-model-len", "4096", "--enforce-eager"] + (["--load-format", "dummy"] if tiny else [])
    return server_argv(python, model, port, SERVED_MODEL, args)


def _vllm_env(folder: Path) -> dict[str, str]:
    from stack.vllm import server_env

    return server_env(folder / "vllm")


def _wait(managed: Managed, url: str, timeout_s: float, hint: str = "") -> None:
    try:
        wait_until_ok(url, timeout_s, managed.alive, managed.name)
    except (RuntimeError, TimeoutError) as exc:
        raise StackError(f"{exc}; log {managed.log}{hint}:\n{_log_tail(managed)}") from None


def up(options: StackOptions, say: Callable[[str], None] = print) -> StackState:
    """Start the stack (cleaning a stale one first); returns its state once every component answers.
    On any failure everything started so far is stopped again."""
    if not (options.index / "current").exists():
        raise StackError(f"{options.index} is not an index folder (no 'current' in it); build one with "
                         f"`ragheat ingest SOURCE --index {options.index}`")
    stale = StackState.load(options.folder)
    if stale is not None:
        stopped = stale.stop_all()
        say(f"cleared the previous stack state in {options.folder}"
            + (f" (stopped its {', '.join(stopped)})" if stopped else " (none of its processes was running)"))
    compose = topology.load_yaml(topology.COMPOSE_FILE)
    prometheus = shutil.which("prometheus")
    alertmanager = next((b for b in map(shutil.which, ALERTMANAGER_BINARIES) if b), None)
    if prometheus is None or alertmanager is None:
        raise StackError("the prometheus and alertmanager binaries are needed: install Debian's packages "
                         "'prometheus' and 'prometheus-alertmanager' (scripts/install.sh --test does)")
    state = StackState(options.folder)
    use_probes = options.probes == "on" or (options.probes == "auto" and os.geteuid() == 0)
    if not use_probes:
        state.notes.append("probes off: " + ("--probes off" if options.probes == "off" else "not root (eBPF needs it)"))
    vllm_python, vllm_model, vllm_note = _vllm_plan(options, options.folder)
    if vllm_note:
        state.notes.append(vllm_note)
    components = ["api", "prometheus", "alertmanager", "alert-receiver"] + (["probes"] if use_probes else []) \
        + (["vllm"] if vllm_python else [])
    ports = _resolve_ports(options.ports, components)
    addresses = topology.LocalAddresses({c: f"127.0.0.1:{p}" for c, p in ports.items()})
    state.notes.append("not run without Docker: otel-collector, tempo, grafana, neo4j (compose only)")
    try:
        _start(state, options, compose, addresses, prometheus, alertmanager, vllm_python, vllm_model, say)
    except BaseException:
        state.stop_all()
        raise
    return state


def _start(state: StackState, options: StackOptions, compose: dict, addresses: topology.LocalAddresses,
           prometheus: str, alertmanager: str, vllm_python: Path | None, vllm_model: str, say) -> None:
    folder, ragheat, timeout = options.folder, ragheat_executable(), options.ready_timeout_s
    rendered = folder / "rendered"
    shutil.rmtree(rendered, ignore_errors=True)
    render = topology.render_command(addresses, rendered, compose)
    result = subprocess.run([ragheat, *render[1:]], capture_output=True, text=True)
    if result.returncode != 0:
        raise StackError(f"`{' '.join(render)}` failed:\n{(result.stderr or result.stdout)[-1500:]}")
    say(f"rendered dashboards, rules and routes into {rendered}")

    port = {c: a.rsplit(":", 1)[1] for c, a in addresses.components.items()}
    started: list[tuple[Managed, str, float]] = []
    receiver = state.spawn("alert-receiver", [ragheat, "stack", "alert-receiver", "--host", "127.0.0.1",
                                              "--port", port["alert-receiver"]], url=addresses.url("alert-receiver"))
    started.append((receiver, receiver.url + "/healthz", 30))
    am = state.spawn("alertmanager", [alertmanager, f"--config.file={rendered}/alertmanager/alertmanager.yml",
                                      f"--storage.path={folder}/alertmanager",
                                      f"--web.listen-address={addresses.components['alertmanager']}",
                                      "--cluster.listen-address="], url=addresses.url("alertmanager"))
    started.append((am, am.url + "/-/ready", 30))
    env = dict(os.environ)
    if vllm_python:
        vllm = state.spawn("vllm", _vllm_argv(vllm_python, vllm_model, int(port["vllm"]),
                                              tiny=vllm_model.endswith("tiny-llama")),
                           env=_vllm_env(folder), url=addresses.url("vllm"))
        started.append((vllm, vllm.url + "/health", max(timeout, 300)))
        env.update({"RAGHEAT_GENERATION__GENERATOR": "openai", "RAGHEAT_GENERATION__BASE_URL": vllm.url + "/v1",
                    "RAGHEAT_GENERATION__MODEL": SERVED_MODEL})
    api = state.spawn("api", [ragheat, "serve", "--index", str(options.index), "--host", "127.0.0.1",
                              "--port", port["api"], "--log-level", "warning"], env=env, url=addresses.url("api"))
    _wait(api, api.url + "/readyz", timeout)
    say(f"api ready at {api.url}")
    if "probes" in addresses.components:
        # After the API is up: the probes attach to its pid and watch the ports it listens on.
        probes = state.spawn("probes", [ragheat, "probes", "--pid", str(api.pid), "--host", "127.0.0.1",
                                        "--port", port["probes"]], url=addresses.url("probes"))
        started.append((probes, probes.url + "/metrics", 120))
    for managed, url, limit in started:
        hint = "; start without it with --probes off" if managed.name == "probes" else ""
        _wait(managed, url, limit, hint)
        say(f"{managed.name} ready at {managed.url}")
    # Last, so its first scrape finds every target already answering.
    config, dropped = topology.local_prometheus_config(addresses, rendered)
    if dropped:
        state.notes.append(f"scrape jobs left out (component not running here): {', '.join(dropped)}")
    (folder / "prometheus").mkdir(parents=True, exist_ok=True)
    config_path = folder / "prometheus" / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    prom = state.spawn("prometheus", [prometheus, f"--config.file={config_path}",
                                      f"--storage.tsdb.path={folder}/prometheus/data",
                                      f"--web.listen-address={addresses.components['prometheus']}",
                                      *topology.prometheus_flags(compose)], url=addresses.url("prometheus"))
    _wait(prom, prom.url + "/-/ready", 60)
    state.save()
    say(f"prometheus ready at {prom.url}")


def prometheus_report(url: str) -> tuple[list[dict], list[dict]]:
    """(targets, rule groups) as Prometheus reports them: each target's job, health and last error; each
    group's name, rule count and unhealthy rules."""
    targets = httpx.get(url + "/api/v1/targets", params={"state": "active"}, timeout=10).json()["data"]
    rules = httpx.get(url + "/api/v1/rules", timeout=10).json()["data"]
    return ([{"job": t["labels"]["job"], "health": t["health"], "error": t.get("lastError", "")}
             for t in targets["activeTargets"]],
            [{"name": g["name"], "file": g["file"], "rules": len(g["rules"]),
              "unhealthy": [r["name"] for r in g["rules"] if r.get("health") == "err"]} for g in rules["groups"]])


def wait_for_scrapes(url: str, timeout_s: float = 30.0) -> list[dict]:
    """Targets once every one has been scraped at least once (health no longer 'unknown')."""
    deadline = time.monotonic() + timeout_s
    while True:
        targets, _ = prometheus_report(url)
        if (targets and all(t["health"] != "unknown" for t in targets)) or time.monotonic() > deadline:
            return targets
        time.sleep(0.5)
