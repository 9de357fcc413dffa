"""Static checks of the OpenTelemetry Collector config (deploy/otel-collector/config.yaml), which cannot run
on machines without Docker: its structure, and that it uses only components the contrib image ships.

``CONTRIB_COMPONENTS`` is the subset of the contrib distribution this stack may use, taken from its
release manifest: open-telemetry/opentelemetry-collector-releases, ``distributions/otelcol-contrib/
manifest.yaml`` at commit 008cde8 (dist version 0.135.0, the image compose.yaml pins:
otel/opentelemetry-collector-contrib:0.135.0). Each component below is long-standing in that manifest.
Adding a component to the config means checking that manifest and adding it here.
"""

from __future__ import annotations

CONTRIB_VERSION = "0.135.0"
CONTRIB_COMPONENTS: dict[str, frozenset[str]] = {
    "receivers": frozenset({"otlp", "prometheus", "hostmetrics"}),
    "processors": frozenset({"batch", "memory_limiter", "resource", "attributes", "filter", "transform",
                             "tail_sampling", "probabilistic_sampler"}),
    "exporters": frozenset({"otlp", "otlphttp", "debug", "prometheus", "prometheusremotewrite"}),
    "extensions": frozenset({"health_check", "pprof", "zpages"}),
}
SIGNALS = ("traces", "metrics", "logs")


def component_type(name: str) -> str:
    """``otlp/tempo`` -> ``otlp``: the part before the slash names the component, the rest the instance."""
    return name.split("/", 1)[0]


def collector_problems(config: dict) -> list[str]:
    """Every way ``config`` would fail to start or misbehave that can be seen without running it; [] if none."""
    problems = []
    for kind, known in CONTRIB_COMPONENTS.items():
        for name in (config.get(kind) or {}):
            if component_type(name) not in known:
                problems.append(f"{kind}.{name}: not a component this stack allows from otelcol-contrib "
                                f"{CONTRIB_VERSION} (stack/collector.py)")
    service = config.get("service") or {}
    for name in service.get("extensions", []):
        if name not in (config.get("extensions") or {}):
            problems.append(f"service.extensions names {name!r}, which is not defined under extensions")
    pipelines = service.get("pipelines") or {}
    if not pipelines:
        problems.append("service.pipelines is empty: the collector would refuse to start")
    used: dict[str, set[str]] = {"receivers": set(), "processors": set(), "exporters": set()}
    for pipeline, spec in pipelines.items():
        if component_type(pipeline) not in SIGNALS:
            problems.append(f"pipeline {pipeline!r} is not one of {', '.join(SIGNALS)} (optionally /name)")
        for kind in used:
            names = spec.get(kind) or []
            if kind != "processors" and not names:
                problems.append(f"pipeline {pipeline!r} has no {kind}")
            for name in names:
                used[kind].add(name)
                if name not in (config.get(kind) or {}):
                    problems.append(f"pipeline {pipeline!r} uses {kind[:-1]} {name!r}, which is not defined")
        processors = spec.get("processors") or []
        if processors and component_type(processors[0]) != "memory_limiter":
            problems.append(f"pipeline {pipeline!r}: memory_limiter must come first, so data is refused before "
                            "the collector runs out of memory")
        if "batch" not in map(component_type, processors):
            problems.append(f"pipeline {pipeline!r} has no batch processor")
    for kind, names in used.items():
        for name in set(config.get(kind) or {}) - names:
            problems.append(f"{kind}.{name} is defined but no pipeline uses it")
    return problems
