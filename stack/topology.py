"""The compose topology, read from the files compose uses, and rewritten for loopback.

``ragheat stack up`` runs the services of ``compose.yaml`` as local processes. Rather than keeping a
second copy of their configuration, it reads compose's own: the Prometheus config
(``deploy/prometheus/prometheus.yml``) with each scrape target pointed at the process that plays that
service, and the ``dashboards-render`` and ``prometheus`` commands from ``compose.yaml`` with container
paths and service URLs swapped for local ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from rag.errors import ConfigurationError

REPO = Path(__file__).resolve().parents[1]
COMPOSE_FILE = REPO / "compose.yaml"
PROMETHEUS_CONFIG = REPO / "deploy" / "prometheus" / "prometheus.yml"
RENDERED_MOUNT = "/etc/ragheat/rendered"
"""Where compose mounts the ``rendered`` volume that ``dashboards-render`` fills."""

JOB_COMPONENTS = {"ragheat-api": "api", "ragheat-probes": "probes", "vllm": "vllm", "prometheus": "prometheus",
                  "alertmanager": "alertmanager", "otel-collector": "otel-collector"}
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


@dataclass(frozen=True)
class LocalAddresses:
    """host:port of each component running on loopback; a component absent here is not running."""

    components: dict[str, str]

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


def render_command(addresses: LocalAddresses, rendered_dir: Path, compose: dict | None = None) -> list[str]:
    """compose's ``dashboards-render`` command, writing into ``rendered_dir`` and pointing at local URLs."""
    return [addresses.localize(a, rendered_dir) for a in compose_command("dashboards-render", compose)]


def prometheus_flags(compose: dict | None = None) -> list[str]:
    """compose's Prometheus flags, less the ones naming container paths (config file, storage)."""
    own = ("--config.file", "--storage.tsdb.path", "--web.listen-address")
    return [f for f in compose_command("prometheus", compose) if not f.startswith(own)]


def local_prometheus_config(addresses: LocalAddresses, rendered_dir: Path,
                            config: dict | None = None) -> tuple[dict, list[str]]:
    """compose's Prometheus config with every target on loopback; returns it and the jobs left out
    because their component is not running here (each named, so nothing disappears silently)."""
    config = config if config is not None else load_yaml(PROMETHEUS_CONFIG)
    local = dict(config)
    local["rule_files"] = [str(rendered_dir) + p[len(RENDERED_MOUNT):] if p.startswith(RENDERED_MOUNT) else p
                           for p in config.get("rule_files", [])]
    if "alertmanager" in addresses.components:
        local["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [addresses.components["alertmanager"]]}]}]}
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
        targets = [t for group in job.get("static_configs", []) for t in group.get("targets", [])]
        if len(targets) != 1:
            raise ConfigurationError(f"{PROMETHEUS_CONFIG}: job {name!r} must have exactly one target, has {targets}")
        jobs.append({**job, "static_configs": [{"targets": [addresses.components[component]]}]})
    local["scrape_configs"] = jobs
    return local, dropped
