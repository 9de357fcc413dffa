"""The compose topology, read from the files compose uses, and rewritten for loopback.

``ragheat stack up`` runs the services of ``compose.yaml`` as local processes. Rather than keeping a
second copy of their configuration, it reads compose's own: the Prometheus config
(``deploy/prometheus/prometheus.yml``) with each scrape target pointed at the process that plays that
service, and the ``dashboards-render`` and ``prometheus`` commands from ``compose.yaml`` with container
paths and service URLs swapped for local ones.
"""

from __future__ import annotations

import glob
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from rag.errors import ConfigurationError

REPO = Path(__file__).resolve().parents[1]
COMPOSE_FILE = REPO / "compose.yaml"
PROMETHEUS_CONFIG = REPO / "deploy" / "prometheus" / "prometheus.yml"
RENDERED_MOUNT = "/etc/ragheat/rendered"
"""Where compose mounts the ``rendered`` volume that ``dashboards-render`` fills."""

JOB_COMPONENTS = {"ragheat-api": "api", "ragheat-probes": "probes", "vllm": "vllm", "milvus": "milvus",
                  "prometheus": "prometheus", "alertmanager": "alertmanager", "otel-collector": "otel-collector"}
"""Scrape job -> the component that serves it. A job missing here is a config change this module must learn."""

SERVICE_COMPONENTS = {"prometheus:9090": "prometheus", "alert-receiver:9095": "alert-receiver",
                      "alertmanager:9093": "alertmanager", "tempo:3200": "tempo"}
"""host:port as compose services reach each other -> component, for URLs in compose commands."""


def load_yaml(path: Path) -> dict:
    """A YAML file of the checkout; ``ConfigurationError`` naming it when missing or invalid."""
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigurationError(f"{path} is missing: `ragheat stack` runs from a ragheat checkout") from None
    except yaml.YAMLError as exc:
        raise ConfigurationError(f"{path} is not valid YAML: {exc}") from None


def compose_command(service: str, compose: dict | None = None) -> list[str]:
    """The ``command`` of a compose service, as a list (anchors resolved by the YAML loader)."""
    compose = compose or load_yaml(COMPOSE_FILE)
    try:
        command = compose["services"][service]["command"]
    except KeyError:
        raise ConfigurationError(f"{COMPOSE_FILE} has no command for the service {service!r}") from None
    return [str(part) for part in command]


API_JOB = "ragheat-api"
REPLICA_LABEL = "replica"
"""The label naming which API replica a scraped series came from (compose: its address; locally: api-1, api-2...).
The SLO rules sum over it (``sum by (stage)``, never by instance or replica), so N replicas make one SLO series."""


@dataclass(frozen=True)
class LocalAddresses:
    """host:port of each component running on loopback; a component absent here is not running. ``replicas``:
    the API replicas' own addresses when a balancer holds ``components["api"]`` (empty: the API is one process
    at ``components["api"]``)."""

    components: dict[str, str]
    replicas: tuple[str, ...] = ()

    def api_targets(self) -> dict[str, str]:
        """Replica name -> address, as the stack names the processes (``api`` alone, or ``api-1``...)."""
        if not self.replicas:
            return {"api": self.components["api"]}
        return {f"api-{i}": address for i, address in enumerate(self.replicas, 1)}

    def url(self, component: str) -> str:
        return f"http://{self.components[component]}"

    def localize(self, argument: str, rendered_dir: Path) -> str:
        """One compose command argument with the rendered mount and service URLs made local."""
        if argument.startswith(RENDERED_MOUNT):
            argument = str(rendered_dir) + argument[len(RENDERED_MOUNT):]
        for service, component in SERVICE_COMPONENTS.items():
            if f"//{service}" in argument and component in self.components:
                argument = argument.replace(f"//{service}", f"//{self.components[component]}")
        return argument


LOCAL_DROPPED_RENDER_OPTION = "--prometheus-password-file"
"""compose's render option (Grafana presents the web-auth password) that the loopback stack leaves out."""


def render_command(addresses: LocalAddresses, rendered_dir: Path, compose: dict | None = None,
                   profile: str | None = None) -> list[str]:
    """compose's ``dashboards-render`` command, writing into ``rendered_dir`` and pointing at local URLs, without
    Grafana's Prometheus password;
    ``profile`` replaces its ``--profile`` (``test``: every SLO window divided by 60, for drills and tests)."""
    command = [addresses.localize(a, rendered_dir) for a in compose_command("dashboards-render", compose)]
    if LOCAL_DROPPED_RENDER_OPTION in command:  # the local Prometheus asks for no password (loopback only)
        at = command.index(LOCAL_DROPPED_RENDER_OPTION)
        del command[at:at + 2]
    if profile is not None:
        if "--profile" in command:
            command[command.index("--profile") + 1] = profile
        else:
            command += ["--profile", profile]
    return command


def prometheus_flags(compose: dict | None = None) -> list[str]:
    """compose's Prometheus flags, less the ones naming container paths (config file, storage)."""
    own = ("--config.file", "--storage.tsdb.path", "--web.listen-address", "--web.config.file")
    return [f for f in compose_command("prometheus", compose) if not f.startswith(own)]


def local_prometheus_config(addresses: LocalAddresses, rendered_dir: Path, config: dict | None = None,
                            time_divisor: int = 1, password_file: Path | None = None) -> tuple[dict, list[str]]:
    """compose's Prometheus config with every target on loopback; returns it and the jobs left out
    because their component is not running here (each named, so nothing disappears silently).

    compose's Prometheus and Alertmanager ask for basic auth, so its config presents the password (``basic_auth``
    with a ``password_file`` in the rendered volume) to itself, to Alertmanager and when it delivers alerts. Locally
    everything listens on loopback without a web config, so those ``basic_auth`` blocks are dropped, unless
    ``password_file`` (a ``ragheat stack web-auth`` folder's) is given: then they point at it.

    ``rendered_dir`` must be absolute: Prometheus resolves a relative ``rule_files`` pattern against the config
    file's folder, and a pattern that matches nothing is legal, so a relative one loads no rule, silently.
    ``time_divisor`` > 1 (the test profile) divides the scrape and evaluation intervals too, down to 1 s, so the
    profile's seconds-long windows hold enough samples."""
    if not rendered_dir.is_absolute():
        raise ConfigurationError(f"the rendered folder {rendered_dir} must be an absolute path: Prometheus reads "
                                 f"relative rule_files from its config file's folder")
    config = config if config is not None else load_yaml(PROMETHEUS_CONFIG)
    local = dict(config)
    local["rule_files"] = [str(rendered_dir) + p[len(RENDERED_MOUNT):] if p.startswith(RENDERED_MOUNT) else p
                           for p in config.get("rule_files", [])]
    if time_divisor > 1:
        interval = {key: format_duration(max(1.0, parse_duration(value) / time_divisor))
                    for key, value in config.get("global", {}).items() if key in ("scrape_interval", "evaluation_interval")}
        local["global"] = {**config.get("global", {}), **interval}
    if "alertmanager" in addresses.components:
        compose_alertmanagers = config.get("alerting", {}).get("alertmanagers") or [{}]
        local["alerting"] = {"alertmanagers": [_local_auth(
            {**compose_alertmanagers[0], "static_configs": [{"targets": [addresses.components["alertmanager"]]}]},
            password_file)]}
    else:
        local.pop("alerting", None)
    jobs, dropped = [], []
    for job in config.get("scrape_configs", []):
        name = job["job_name"]
        if name not in JOB_COMPONENTS:
            raise ConfigurationError(f"{PROMETHEUS_CONFIG} scrapes the job {name!r}, which `ragheat stack` does "
                                     f"not know: add it to stack.topology.JOB_COMPONENTS")
        component = JOB_COMPONENTS[name]
        if component not in addresses.components:
            dropped.append(name)
            continue
        job = _local_auth(job, password_file)
        if name == API_JOB:
            jobs.append(_local_api_job(job, addresses))
            continue
        targets = [t for group in job.get("static_configs", []) for t in group.get("targets", [])]
        if len(targets) != 1:
            raise ConfigurationError(f"{PROMETHEUS_CONFIG}: job {name!r} must have exactly one target, has {targets}")
        jobs.append({**job, "static_configs": [{"targets": [addresses.components[component]]}]})
    local["scrape_configs"] = jobs
    return local, dropped


def _local_auth(section: dict, password_file: Path | None) -> dict:
    """A scrape job or Alertmanager entry with compose's ``basic_auth`` dropped, or reading ``password_file``."""
    if "basic_auth" not in section:
        return section
    local = {k: v for k, v in section.items() if k != "basic_auth"}
    if password_file is not None:
        local["basic_auth"] = {**section["basic_auth"], "password_file": str(password_file)}
    return local


def _local_api_job(job: dict, addresses: LocalAddresses) -> dict:
    """compose's API job (every replica found through Docker's DNS, labelled by address) as static targets: one per
    local replica, labelled ``replica="api-N"``. compose's relabelling may only set that label: anything else it
    did would be lost here, so it is refused by name."""
    relabels = job.get("relabel_configs", [])
    if any(r.get("target_label") != REPLICA_LABEL for r in relabels):
        raise ConfigurationError(f"{PROMETHEUS_CONFIG}: job {API_JOB!r} relabels more than the {REPLICA_LABEL!r} "
                                 f"label; stack.topology.local_prometheus_config must learn to keep it")
    local = {k: v for k, v in job.items() if k not in ("dns_sd_configs", "static_configs", "relabel_configs")}
    local["static_configs"] = [{"targets": [address], "labels": {REPLICA_LABEL: name}}
                               for name, address in addresses.api_targets().items()]
    return local


_DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def parse_duration(text: str) -> float:
    """Seconds in a Prometheus/Alertmanager duration (``1h30m``, ``500ms``); ``ConfigurationError`` otherwise."""
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ConfigurationError(f"{text!r} is not a Prometheus duration (e.g. 30s, 5m, 1h30m)")
    return sum(int(n) * _UNIT_SECONDS[u] for n, u in parts)


def format_duration(seconds: float) -> str:
    """A duration in whole milliseconds as Prometheus and Alertmanager read it: ``500ms``, ``5s``, ``12m``."""
    ms = max(1, round(seconds * 1000))
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    raise AssertionError("unreachable: every whole number of milliseconds divides by 1")


ROUTE_TIMERS = ("group_wait", "group_interval", "repeat_interval")


def scaled_routes(config: dict, time_divisor: int) -> dict:
    """An Alertmanager config whose route timers (group_wait, group_interval, repeat_interval, in every route)
    are divided by ``time_divisor``, as the test profile divides the SLO windows: a 30 s group wait becomes
    0.5 s, so a drill's page arrives in seconds."""
    def scale(route: dict) -> dict:
        route = {**route, **{k: format_duration(parse_duration(route[k]) / time_divisor)
                             for k in ROUTE_TIMERS if k in route}}
        if "routes" in route:
            route["routes"] = [scale(r) for r in route["routes"]]
        return route

    return {**config, "route": scale(config["route"])} if "route" in config else dict(config)


def unmatched_rule_files(config: dict, config_path: Path) -> list[str]:
    """The ``rule_files`` patterns of a Prometheus config that match no file, resolved as Prometheus resolves
    them: a relative pattern against the config file's folder (an empty glob is legal, so Prometheus is silent)."""
    return [pattern for pattern in config.get("rule_files", [])
            if not glob.glob(str(config_path.parent / pattern) if not Path(pattern).is_absolute() else pattern)]


def relative_paths(alertmanager_config: dict, grafana_provider: dict) -> list[str]:
    """File paths in generated configs that their program would resolve against a folder other than the one
    meant: Alertmanager's ``templates`` (read relative to its config file) and Grafana's dashboard folders."""
    paths = list(alertmanager_config.get("templates") or [])
    paths += [p.get("options", {}).get("path", "") for p in grafana_provider.get("providers", [])]
    return [p for p in paths if p and not Path(p).is_absolute()]


def rule_expectations(rule_files: list[Path]) -> dict[str, list[str]]:
    """Rule group -> its alert names (sorted, each once), as the rendered rule files define them."""
    groups: dict[str, list[str]] = {}
    for path in rule_files:
        for group in (load_yaml(path) or {}).get("groups", []):
            groups[group["name"]] = sorted({r["alert"] for r in group.get("rules", []) if "alert" in r})
    return groups


def rule_problems(expected: dict[str, list[str]], reported: list[dict]) -> list[str]:
    """What is wrong with the rule groups Prometheus reports (``name``, ``alerts``, ``unhealthy`` each) against
    the rendered ones: each missing group, missing alert and failing rule, in a sentence."""
    if not expected:
        return ["no rule group was rendered (the rendered prometheus/*.yml files are missing or empty)"]
    loaded = {g["name"]: g for g in reported}
    problems = [f"rule group {name} is not loaded" for name in expected if name not in loaded]
    for name, alerts in expected.items():
        if name in loaded:
            missing = sorted(set(alerts) - set(loaded[name]["alerts"]))
            if missing:
                problems.append(f"rule group {name} lacks the alerts {', '.join(missing)}")
            if loaded[name]["unhealthy"]:
                problems.append(f"rule group {name} has failing rules: {', '.join(loaded[name]['unhealthy'])}")
    return problems
