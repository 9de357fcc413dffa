"""``ragheat stack up``: the compose topology as local processes on loopback, from compose's own configs.

Started here: the API (``ragheat serve``; with ``replicas`` > 1, that many ``ragheat serve`` processes on ports of
their own behind Debian's nginx on the API port, each scraped by Prometheus: stack/nginx.py), the alert receiver,
Alertmanager and Prometheus (Debian's binaries), the eBPF exporter when privileged, and vLLM on the CPU when a
model is asked for (a model folder, or ``dummy``: random weights, said loudly). Without a model the API answers with
the extractive generator, and says so. With ``remote_write`` Prometheus also ships every series to a long-term store:
VictoriaMetrics started here (its data in the stack folder) or a receiver's URL (stack/remote_write.py). With a
``WatchPlan`` (``--watch-url``, ``--watch-pid``: stack/watch.py) no
API, nginx or vLLM starts: Prometheus scrapes the watched service and the probes attach to its pid. Not started (no
binaries on a machine without Docker): the OTel Collector, Tempo, Grafana and Neo4j; their scrape jobs are left out
of the local Prometheus config and named in the state's notes.

Every path written into a generated config is absolute: Prometheus reads ``rule_files`` relative to its config
file's folder (and an empty glob is legal), so a relative one would load no rule, silently. After start, ``up``
checks that Prometheus reports every rendered rule group and alert and has the local Alertmanager attached.
"""

from __future__ import annotations

import dataclasses
import glob
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

from rag.childproc import free_port, wait_until_ok
from rag.errors import ConfigurationError
from stack import nginx, topology
from stack.processes import Managed, StackState
from stack.remote_write import FLUSH_DEADLINE, LOCAL, VictoriaMetrics, check_url, local_write_url, \
    victoriametrics_binary, with_remote_write
from stack.watch import WatchPlan, plan_problems, scrape_job, unreachable

DEFAULT_PORTS = {"api": 8000, "prometheus": 9090, "alertmanager": 9093, "alert-receiver": 9095, "probes": 9465,
                 "vllm": 8001, "victoriametrics": 0}
"""0 = a free port: Debian's victoria-metrics package runs its own service on 8428 on a systemd host."""
SERVED_MODEL = "ragheat-llm"  # compose's default VLLM_SERVED_NAME
ALERTMANAGER_BINARIES = ("prometheus-alertmanager", "alertmanager")  # Debian's name, upstream's name


class StackError(ConfigurationError):
    """The local stack could not start; the message names the component and its log."""


@dataclass
class StackOptions:
    """What ``ragheat stack up`` was asked for: the index, the state folder, ports, probes, who answers (a model
    folder for vLLM, ``dummy``, or a server's URL; none = extractive) and the rules' profile."""

    index: Path
    folder: Path
    ports: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_PORTS))
    probes: Literal["auto", "on", "off"] = "auto"
    vllm_model: str = "off"   # off | dummy (a tiny random-weight model: noise) | a model folder
    vllm_python: Path | None = None
    llm_url: str | None = None  # an OpenAI-compatible server already running (instead of a vLLM started here)
    llm_model: str = ""          # its served model name (empty = its first)
    rules_profile: str = "production"  # the rules' profile (dashboards.slo.PROFILES); test = windows / 60
    time_divisor: int = 1  # the profile's divisor: applied to scrape/evaluation intervals and Alertmanager's timers
    ready_timeout_s: float = 180.0
    replicas: int = 1  # API processes; > 1 puts nginx on the API port in front of them
    watch: WatchPlan = field(default_factory=WatchPlan)  # a service started elsewhere: no API or vLLM here
    remote_write: str | None = None  # None: off; "local": a VictoriaMetrics started here; else a receiver's URL


@dataclass
class AnswerPlan:
    """Who writes the API's answers: the environment it gets, the line said at start (a warning for random
    weights), and the vLLM server to start, if any."""

    env: dict[str, str]
    line: str
    warning: bool = False
    vllm_python: Path | None = None
    vllm_model: str = ""
    dummy: bool = False


@dataclass
class LocalConfigs:
    """The generated configs of one stack: where they are, the rule groups and alerts Prometheus must report,
    and the scrape jobs left out."""

    rendered: Path
    prometheus: Path
    alertmanager: Path
    expected_rules: dict[str, list[str]]
    dropped_jobs: list[str]


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


CPU_FIRST_TOKEN_S = 20.0  # generation.first_token_timeout_s for a real model vLLM serves here on the CPU
CPU_DEADLINE_MS = 30_000.0  # admission.deadline_ms (and max_timeout_ms) for it: generation.deadline_s's default
WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf")
DUMMY_WARNING = ("WARNING: --vllm-model dummy: vLLM serves a tiny Llama with RANDOM weights. Its text is noise: the "
                 "support check rejects it and every answer falls back to the extractive one (degraded_reason "
                 "unsupported), slower than without it. Use it to exercise vLLM and its dashboard, not to read answers.")


def answer_plan(options: StackOptions, folder: Path) -> AnswerPlan:
    """Extractive unless a real model is configured (``--vllm-model DIR`` or ``--llm-url URL``); ``dummy`` runs
    vLLM with random weights, with a warning. A random-weight model is never presented as the answering model."""
    gen = "RAGHEAT_GENERATION__"
    if options.llm_url and options.vllm_model != "off":
        raise StackError("--llm-url and --vllm-model name two different models: give one of them")
    if options.llm_url:
        if not options.llm_url.startswith(("http://", "https://")):
            raise StackError(f"--llm-url must be an http(s) URL ending in /v1, got {options.llm_url!r}")
        return AnswerPlan({gen + "GENERATOR": "openai", gen + "BASE_URL": options.llm_url, gen + "MODEL": options.llm_model},
                          f"answers: written by the OpenAI-compatible server at {options.llm_url} (extractive when "
                          f"it is down or slow, or writes nothing the passages support)")
    if options.vllm_model == "off":
        return AnswerPlan({gen + "GENERATOR": "extractive"},
                          "answers: extractive (the passages' own sentences): no model configured. For written answers "
                          "give --vllm-model DIR (a model folder vLLM serves here) or --llm-url URL")
    from stack.vllm import vllm_python

    try:
        python = vllm_python(options.vllm_python)
    except ConfigurationError as exc:
        raise StackError(f"--vllm-model {options.vllm_model}: {exc}") from None
    env = {gen + "GENERATOR": "openai", gen + "MODEL": SERVED_MODEL}  # BASE_URL once vLLM's port is known
    if options.vllm_model == "dummy":
        from stack.tiny_llama import build_tiny_llama

        # No weights can be downloaded here: vLLM's dummy loader fills a tiny Llama with random values, which
        # exercises the engine, its metrics and the API's fallbacks; its text is noise.
        texts = [p.read_text(errors="replace") for p in sorted((topology.REPO / "docs").glob("*.md"))]
        texts.append((topology.REPO / "README.md").read_text(errors="replace"))
        model = build_tiny_llama(folder / "tiny-llama", texts)
        return AnswerPlan(env, DUMMY_WARNING, warning=True, vllm_python=python, vllm_model=str(model), dummy=True)
    model = Path(options.vllm_model).resolve()
    if not (model / "config.json").is_file():
        raise StackError(f"--vllm-model {options.vllm_model} is not a model folder (no config.json in it); "
                         f"--vllm-model dummy runs vLLM with random weights")
    if not any(next(model.glob(pattern), None) for pattern in WEIGHT_FILES):
        raise StackError(f"--vllm-model {options.vllm_model} has no weight files ({', '.join(WEIGHT_FILES)}); "
                         f"--vllm-model dummy runs vLLM with random weights")
    # A real model on two shared CPU cores takes seconds to prefill a few passages: the API's default first-token
    # wait (sized for a GPU server) would degrade nearly every answer to "slow". The operator's own value wins.
    env.setdefault(gen + "FIRST_TOKEN_TIMEOUT_S", os.environ.get(gen + "FIRST_TOKEN_TIMEOUT_S", str(CPU_FIRST_TOKEN_S)))
    # Likewise a request's deadline: the SLO would have admission control skip the model for the budget on every
    # request after the first (docs/reliability.md). The operator's own values win.
    for setting, value in (("DEADLINE_MS", CPU_DEADLINE_MS), ("MAX_TIMEOUT_MS", CPU_DEADLINE_MS)):
        env.setdefault("RAGHEAT_ADMISSION__" + setting, os.environ.get("RAGHEAT_ADMISSION__" + setting, str(value)))
    return AnswerPlan(env, f"answers: written by vLLM serving {model} (extractive when it is down or slow, or "
                           f"writes nothing the passages support)", vllm_python=python, vllm_model=str(model))


def _vllm_argv(python: Path, model: str, port: int, tiny: bool) -> list[str]:
    from stack.vllm import server_argv

    args = ["--max-model-len", "4096", "--enforce-eager"] + (["--load-format", "dummy"] if tiny else [])
    return server_argv(python, model, port, SERVED_MODEL, args)


def _vllm_env(folder: Path) -> dict[str, str]:
    from stack.vllm import server_env

    return server_env(folder / "vllm")


def _check_watch(options: StackOptions) -> None:
    """``StackError`` for a watch that cannot start, or for flags that only mean something for the API started here."""
    problems = plan_problems(options.watch)
    if options.replicas > 1:
        problems.append("--replicas runs ragheat's own API, which --watch-url/--watch-pid does not start")
    if options.vllm_model != "off" or options.llm_url:
        problems.append("--vllm-model and --llm-url choose the answers of ragheat's own API, which "
                        "--watch-url/--watch-pid does not start")
    if options.watch.pids and options.probes == "off":
        problems.append("--watch-pid runs the eBPF probes on that process, and --probes off turns them off")
    if problems:
        raise StackError("; ".join(problems))


def _wait(managed: Managed, url: str, timeout_s: float, hint: str = "") -> None:
    try:
        wait_until_ok(url, timeout_s, managed.alive, managed.name)
    except (RuntimeError, TimeoutError) as exc:
        raise StackError(f"{exc}; log {managed.log}{hint}:\n{_log_tail(managed)}") from None


def up(options: StackOptions, say: Callable[[str], None] = print) -> StackState:
    """Start the stack (cleaning a stale one first); returns its state once every component answers and
    Prometheus reports the rendered rules. On any failure everything started so far is stopped again."""
    # Absolute from here on: these paths are written into generated configs and handed to children.
    options = dataclasses.replace(options, index=options.index.resolve(), folder=options.folder.resolve())
    watch = options.watch
    if watch:
        _check_watch(options)
    elif not (options.index / "current").exists():
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
    if watch:  # the probes watch the given pids only; without one there is nothing of ours to attach to
        use_probes = bool(watch.pids)
    else:
        use_probes = options.probes == "on" or (options.probes == "auto" and os.geteuid() == 0)
    if not use_probes:
        reason = ("no --watch-pid" if watch else "--probes off" if options.probes == "off"
                  else "not root (eBPF needs it)")
        state.notes.append("probes off: " + reason)
    if options.replicas < 1:
        raise StackError(f"--replicas must be 1 or more, not {options.replicas}")
    balancer = nginx.nginx_binary() if options.replicas > 1 else None  # named before anything starts
    receiver = _remote_write_receiver(options, state)  # likewise: a bad URL or a missing binary stops nothing
    plan = AnswerPlan({}, watch.describe()) if watch else answer_plan(options, options.folder)
    say(plan.line)
    state.notes.append(plan.line)
    for problem in unreachable(watch.urls):
        line = f"WARNING: --watch-url {problem}; starting anyway, Prometheus shows the target down until it answers"
        say(line)
        state.notes.append(line)
    if not watch and not plan.vllm_python:
        state.notes.append("vllm not started: " + (f"the answers come from {options.llm_url}" if options.llm_url
                                                   else "no model asked for (--vllm-model DIR or dummy)"))
    if options.rules_profile != "production":
        state.notes.append(f"rules profile {options.rules_profile}: SLO windows, scrape and evaluation intervals and "
                           f"Alertmanager's timers divided by {options.time_divisor} (a drill, not production)")
    components = ([] if watch else ["api"]) + ["prometheus", "alertmanager", "alert-receiver"] \
        + (["probes"] if use_probes else []) + (["vllm"] if plan.vllm_python else []) \
        + (["victoriametrics"] if receiver else [])
    ports = _resolve_ports(options.ports, components)
    # Replicas listen on free ports of their own; the stack's API port belongs to the balancer.
    replicas = tuple(f"127.0.0.1:{free_port()}" for _ in range(options.replicas)) if balancer else ()
    addresses = topology.LocalAddresses({c: f"127.0.0.1:{p}" for c, p in ports.items()}, replicas)
    if balancer:
        state.notes.append(f"{options.replicas} API replicas behind nginx at {addresses.url('api')} (least_conn); "
                           f"Prometheus scrapes each replica" + (", the probes watch them all" if use_probes else ""))
    state.notes.append("not run without Docker: otel-collector, tempo, grafana, neo4j (compose only)")
    try:
        configs = prepare_configs(options, compose, addresses)
        say(f"rendered dashboards, rules and routes into {configs.rendered}")
        if configs.dropped_jobs:
            state.notes.append(f"scrape jobs left out (component not running here): {', '.join(configs.dropped_jobs)}")
        _start(state, options, compose, addresses, configs, prometheus, alertmanager, plan, say, balancer,
               _victoriametrics(receiver, options.folder, addresses))
    except BaseException:
        state.stop_all()
        raise
    return state


def prepare_configs(options: StackOptions, compose: dict, addresses: topology.LocalAddresses) -> LocalConfigs:
    """Render the rules, routes and dashboards with compose's command and write the local Prometheus config, all
    under ``options.folder``; ``StackError`` when a generated path would not find its files."""
    folder, ragheat = options.folder.resolve(), ragheat_executable()  # absolute: written into the configs
    rendered = folder / "rendered"
    shutil.rmtree(rendered, ignore_errors=True)
    render = topology.render_command(addresses, rendered, compose, profile=options.rules_profile)
    result = subprocess.run([ragheat, *render[1:]], capture_output=True, text=True)
    if result.returncode != 0:
        raise StackError(f"`{' '.join(render)}` failed:\n{(result.stderr or result.stdout)[-1500:]}")
    alertmanager_path = rendered / "alertmanager" / "alertmanager.yml"
    alertmanager = topology.load_yaml(alertmanager_path)
    if options.time_divisor > 1:
        alertmanager_path.write_text(yaml.safe_dump(topology.scaled_routes(alertmanager, options.time_divisor),
                                                     sort_keys=False))
    provider = topology.load_yaml(rendered / "grafana" / "provisioning" / "dashboards" / "ragheat.yml")
    relative = topology.relative_paths(alertmanager, provider)
    if relative:
        raise StackError(f"generated configs in {rendered} name relative paths, which their programs would resolve "
                         f"against another folder: {', '.join(relative)}")
    config, dropped = topology.local_prometheus_config(addresses, rendered, time_divisor=options.time_divisor)
    if options.watch.urls:
        config["scrape_configs"].append(scrape_job(options.watch))
    if options.remote_write:
        config = with_remote_write(config, local_write_url(addresses.components["victoriametrics"])
                                   if options.remote_write == LOCAL else options.remote_write)
    config_path = folder / "prometheus" / "prometheus.yml"
    config_path.parent.mkdir(parents=True, exist_ok=True)
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    unmatched = topology.unmatched_rule_files(config, config_path)
    if unmatched:
        raise StackError(f"{config_path}: rule_files {', '.join(unmatched)} match no file; Prometheus would load "
                         f"no alert rule")
    rule_files = sorted(p for pattern in config["rule_files"] for p in map(Path, glob.glob(pattern)))
    return LocalConfigs(rendered, config_path, alertmanager_path, topology.rule_expectations(rule_files), dropped)


def _remote_write_receiver(options: StackOptions, state: StackState) -> str | None:
    """The VictoriaMetrics binary when the stack starts one (``remote_write`` is ``local``), else None; a receiver's
    URL is checked and named in the state's notes. ``StackError`` for a bad URL or a missing binary."""
    if options.remote_write is None:
        return None
    try:
        if options.remote_write != LOCAL:
            state.notes.append(f"remote write to {check_url(options.remote_write)} (a receiver not started here)")
            return None
        binary = victoriametrics_binary()
    except ConfigurationError as exc:
        raise StackError(str(exc)) from None
    state.notes.append("remote write to VictoriaMetrics started here: it keeps every float series (classic histogram "
                       "buckets included) and drops native histograms and exemplars")
    return binary


def _victoriametrics(binary: str | None, folder: Path, addresses: topology.LocalAddresses) -> VictoriaMetrics | None:
    if binary is None or "victoriametrics" not in addresses.components:
        return None
    return VictoriaMetrics(binary, folder / "victoriametrics" / "data", addresses.components["victoriametrics"])


def _start(state: StackState, options: StackOptions, compose: dict, addresses: topology.LocalAddresses,
           configs: LocalConfigs, prometheus: str, alertmanager: str, plan: AnswerPlan, say,
           balancer: str | None = None, long_term: VictoriaMetrics | None = None) -> None:
    folder, ragheat, timeout = options.folder, ragheat_executable(), options.ready_timeout_s
    port = {c: a.rsplit(":", 1)[1] for c, a in addresses.components.items()}
    started: list[tuple[Managed, str, float]] = []
    receiver = state.spawn("alert-receiver", [ragheat, "stack", "alert-receiver", "--host", "127.0.0.1",
                                              "--port", port["alert-receiver"]], url=addresses.url("alert-receiver"))
    started.append((receiver, receiver.url + "/healthz", 30))
    am = state.spawn("alertmanager", [alertmanager, f"--config.file={configs.alertmanager}",
                                      f"--storage.path={folder}/alertmanager",
                                      f"--web.listen-address={addresses.components['alertmanager']}",
                                      "--cluster.listen-address="], url=addresses.url("alertmanager"))
    started.append((am, am.url + "/-/ready", 30))
    env = {**os.environ, **plan.env}
    if plan.vllm_python:
        vllm = state.spawn("vllm", _vllm_argv(plan.vllm_python, plan.vllm_model, int(port["vllm"]), tiny=plan.dummy),
                           env=_vllm_env(folder), url=addresses.url("vllm"))
        started.append((vllm, vllm.url + "/health", max(timeout, 300)))
        env["RAGHEAT_GENERATION__BASE_URL"] = vllm.url + "/v1"
    apis = [] if options.watch else [
        state.spawn(name, [ragheat, "serve", "--index", str(options.index), "--host", "127.0.0.1",
                           "--port", address.rsplit(":", 1)[1], "--log-level", "warning"], env=env,
                    url=f"http://{address}")
        for name, address in addresses.api_targets().items()]
    for replica in apis:  # started together, so N replicas load their indexes side by side
        _wait(replica, replica.url + "/readyz", timeout)
        say(f"{replica.name} ready at {replica.url}")
    if balancer:
        config = nginx.write_local_config(folder / "nginx", addresses.components["api"], list(addresses.replicas))
        front = state.spawn("nginx", nginx.argv(config, balancer), url=addresses.url("api"))
        _wait(front, front.url + nginx.HEALTH_PATH, 30)
        _wait(front, front.url + "/readyz", 30)  # through the balancer to a replica
        say(f"nginx ready at {front.url}, balancing {len(apis)} replicas ({', '.join(a.url for a in apis)})")
    if "probes" in addresses.components:
        # After the API is up: the probes attach to its pid (every replica's, or the watched ones) and watch the
        # ports they listen on.
        targets = options.watch.pids or [replica.pid for replica in apis]
        pids = [argument for pid in targets for argument in ("--pid", str(pid))]
        probes = state.spawn("probes", [ragheat, "probes", *pids, "--host", "127.0.0.1",
                                        "--port", port["probes"]], url=addresses.url("probes"))
        started.append((probes, probes.url + "/metrics", 120))
    if long_term is not None:  # before Prometheus, so its first batches find the receiver answering
        store = state.spawn("victoriametrics", long_term.argv(), url=long_term.url)
        started.append((store, long_term.health_url, 60))
    for managed, url, limit in started:
        hint = "; start without it with --probes off" if managed.name == "probes" else ""
        _wait(managed, url, limit, hint)
        say(f"{managed.name} ready at {managed.url}")
    remote = [f"--storage.remote.flush-deadline={FLUSH_DEADLINE}"] if options.remote_write else []
    # Last, so its first scrape finds every target already answering.
    prom = state.spawn("prometheus", [prometheus, f"--config.file={configs.prometheus}",
                                      f"--storage.tsdb.path={folder}/prometheus/data",
                                      f"--web.listen-address={addresses.components['prometheus']}",
                                      *topology.prometheus_flags(compose), *remote], url=addresses.url("prometheus"))
    _wait(prom, prom.url + "/-/ready", 60)
    state.save()
    say(f"prometheus ready at {prom.url}")
    groups = check_rules(prom.url, configs.expected_rules, am.url)
    say(f"prometheus loaded {len(groups)} rule groups ({sum(len(a) for a in configs.expected_rules.values())} "
        f"alerts) and sends alerts to {am.url}")


def check_rules(prometheus_url: str, expected: dict[str, list[str]], alertmanager_url: str | None,
                timeout_s: float = 30.0) -> list[dict]:
    """Wait until Prometheus reports every expected rule group and alert (and sends alerts to
    ``alertmanager_url``); ``StackError`` saying what is missing when it does not within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        _, groups = prometheus_report(prometheus_url)
        problems = topology.rule_problems(expected, groups)
        if alertmanager_url and alertmanager_url not in alertmanagers(prometheus_url):
            problems.append(f"prometheus does not send alerts to {alertmanager_url}")
        if not problems:
            return groups
        if time.monotonic() > deadline:
            raise StackError(f"prometheus at {prometheus_url} is not alerting as rendered: {'; '.join(problems)} "
                             f"(GET {prometheus_url}/api/v1/rules)")
        time.sleep(0.5)


def alertmanagers(prometheus_url: str) -> list[str]:
    """The Alertmanager base URLs Prometheus sends alerts to."""
    data = httpx.get(prometheus_url + "/api/v1/alertmanagers", timeout=10).json()["data"]
    return [a["url"].split("/api/")[0] for a in data["activeAlertmanagers"]]


def prometheus_report(url: str) -> tuple[list[dict], list[dict]]:
    """(targets, rule groups) as Prometheus reports them: each target's job, replica (API targets), health and last
    error; each group's name, rule count and unhealthy rules."""
    targets = httpx.get(url + "/api/v1/targets", params={"state": "active"}, timeout=10).json()["data"]
    rules = httpx.get(url + "/api/v1/rules", timeout=10).json()["data"]
    return ([{"job": t["labels"]["job"], "replica": t["labels"].get(topology.REPLICA_LABEL, ""), "health": t["health"],
              "error": t.get("lastError", "")}
             for t in targets["activeTargets"]],
            [{"name": g["name"], "file": g["file"], "rules": len(g["rules"]),
              "alerts": sorted({r["name"] for r in g["rules"] if r.get("type") == "alerting"}),
              "unhealthy": [r["name"] for r in g["rules"] if r.get("health") == "err"]} for g in rules["groups"]])


def wait_for_scrapes(url: str, timeout_s: float = 30.0) -> list[dict]:
    """Targets once every one has been scraped at least once (health no longer 'unknown')."""
    deadline = time.monotonic() + timeout_s
    while True:
        targets, _ = prometheus_report(url)
        if (targets and all(t["health"] != "unknown" for t in targets)) or time.monotonic() > deadline:
            return targets
        time.sleep(0.5)
