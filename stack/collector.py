"""Static checks of the OpenTelemetry Collector config (deploy/otel-collector/config.yaml), which cannot run
on machines without Docker: its structure, that it uses only components the contrib image ships, the spanmetrics
connector's settings, and the shape of every OTTL statement and condition (stack/ottl.py).

``CONTRIB_COMPONENTS`` is the subset of the contrib distribution this stack may use, taken from its
release manifest: open-telemetry/opentelemetry-collector-releases, ``distributions/otelcol-contrib/
manifest.yaml`` at commit 008cde8 (dist version 0.135.0, the image compose.yaml pins:
otel/opentelemetry-collector-contrib:0.135.0). Each component below is long-standing in that manifest
(the connectors among them: ``connector/spanmetricsconnector``, ``connector/forwardconnector``).
Adding a component to the config means checking that manifest and adding it here.
"""

from __future__ import annotations

import re

from stack.ottl import TRACE_CONTEXTS, condition_problem, statement_problem

CONTRIB_VERSION = "0.135.0"
CONTRIB_COMPONENTS: dict[str, frozenset[str]] = {
    "receivers": frozenset({"otlp", "prometheus", "hostmetrics"}),
    "processors": frozenset({"batch", "memory_limiter", "resource", "attributes", "filter", "transform",
                             "tail_sampling", "probabilistic_sampler"}),
    "exporters": frozenset({"otlp", "otlphttp", "debug", "prometheus", "prometheusremotewrite"}),
    "connectors": frozenset({"spanmetrics", "forward"}),
    "extensions": frozenset({"health_check", "pprof", "zpages", "basicauth"}),
}
SIGNALS = ("traces", "metrics", "logs")
CONNECTOR_SIGNALS = {"spanmetrics": ("traces", "metrics")}
"""Connector type -> (the signal it takes as an exporter, the signal it emits as a receiver); absent: the same."""
SPANMETRICS_UNITS = ("ms", "s")

_DURATION_PART = re.compile(r"(\d+)(ns|us|µs|ms|s|m|h)")
_NANOSECONDS = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": 1_000_000_000, "m": 60_000_000_000,
                "h": 3_600_000_000_000}


def component_type(name: str) -> str:
    """``otlp/tempo`` -> ``otlp``: the part before the slash names the component, the rest the instance."""
    return name.split("/", 1)[0]


def go_duration_ns(text: str) -> int:
    """Nanoseconds in a Go duration written in whole units (``500us``, ``420ms``, ``1m30s``), as the collector's
    config decoder reads it; ``ValueError`` otherwise (fractions are refused, so no rounding can hide here)."""
    parts = _DURATION_PART.findall(str(text))
    if not parts or "".join(n + u for n, u in parts) != str(text):
        raise ValueError(f"{text!r} is not a Go duration in whole units (e.g. 500us, 420ms, 10s)")
    return sum(int(n) * _NANOSECONDS[u] for n, u in parts)


def spanmetrics_bounds(connector: dict) -> tuple[float, ...]:
    """The explicit histogram bounds a spanmetrics connector records, in its unit, computed as the connector does
    (``durationsToUnits``: the duration's nanoseconds divided by the unit's, in float64)."""
    histogram = connector.get("histogram") or {}
    divider = _NANOSECONDS[histogram.get("unit", "ms")]
    return tuple(go_duration_ns(b) / divider for b in (histogram.get("explicit") or {}).get("buckets", []))


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
    for kind in ("receivers", "exporters"):  # an authenticator only works as an extension the service starts
        for name, spec in (config.get(kind) or {}).items():
            authenticator = ((spec or {}).get("auth") or {}).get("authenticator")
            if authenticator and authenticator not in service.get("extensions", []):
                problems.append(f"{kind}.{name}.auth names the authenticator {authenticator!r}, which "
                                f"service.extensions does not start")
    pipelines = service.get("pipelines") or {}
    if not pipelines:
        problems.append("service.pipelines is empty: the collector would refuse to start")
    connectors = config.get("connectors") or {}
    used: dict[str, set[str]] = {"receivers": set(), "processors": set(), "exporters": set()}
    connector_ends: dict[str, dict[str, set[str]]] = {name: {"exporters": set(), "receivers": set()}
                                                      for name in connectors}
    for pipeline, spec in pipelines.items():
        signal = component_type(pipeline)
        if signal not in SIGNALS:
            problems.append(f"pipeline {pipeline!r} is not one of {', '.join(SIGNALS)} (optionally /name)")
        for kind, seen in used.items():
            names = spec.get(kind) or []
            if kind != "processors" and not names:
                problems.append(f"pipeline {pipeline!r} has no {kind}")
            for name in names:
                if kind != "processors" and name in connectors:
                    connector_ends[name][kind].add(signal)
                    continue
                seen.add(name)
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
    problems += _connector_problems(connectors, connector_ends)
    for name, settings in (config.get("processors") or {}).items():
        problems += [f"processors.{name}: {p}" for p in _ottl_problems(component_type(name), settings or {})]
    return problems


def _connector_problems(connectors: dict, ends: dict[str, dict[str, set[str]]]) -> list[str]:
    """A connector must be an exporter of a pipeline of the signal it takes and a receiver of one of the signal it
    emits, or the collector refuses to start; spanmetrics' histogram settings are checked as its config decoder
    would."""
    problems = []
    for name, settings in connectors.items():
        takes, emits = CONNECTOR_SIGNALS.get(component_type(name), (None, None))
        for kind, signal in (("exporters", takes), ("receivers", emits)):
            if not ends[name][kind]:
                problems.append(f"connectors.{name} is in no pipeline's {kind}: a connector joins two pipelines")
            elif signal is not None and ends[name][kind] != {signal}:
                problems.append(f"connectors.{name} must be in the {kind} of {signal} pipelines only, not "
                                f"{', '.join(sorted(ends[name][kind]))}")
        if component_type(name) == "spanmetrics":
            problems += [f"connectors.{name}: {p}" for p in _spanmetrics_problems(settings or {})]
    return problems


def _spanmetrics_problems(settings: dict) -> list[str]:
    histogram = settings.get("histogram") or {}
    problems = []
    if "explicit" in histogram and "exponential" in histogram:
        problems.append("histogram has both explicit and exponential buckets; the connector takes one")
    if histogram.get("unit", "ms") not in SPANMETRICS_UNITS:
        problems.append(f"histogram.unit {histogram.get('unit')!r} is not one of {', '.join(SPANMETRICS_UNITS)}")
        return problems
    try:
        bounds = spanmetrics_bounds(settings)
    except ValueError as exc:
        return problems + [f"histogram.explicit.buckets: {exc}"]
    if list(bounds) != sorted(set(bounds)):
        problems.append("histogram.explicit.buckets must be strictly increasing")
    names = [d.get("name") for d in settings.get("dimensions") or []]
    if any(not n for n in names) or len(names) != len(set(names)):
        problems.append(f"dimensions {names} must each have a name, once")
    return problems


def _ottl_problems(processor: str, settings: dict) -> list[str]:
    """The OTTL of a transform processor's ``trace_statements`` (flat strings need context-prefixed paths; a
    ``context:`` group's need not) and of a filter processor's span conditions."""
    problems = []
    if processor == "transform":
        for entry in settings.get("trace_statements") or []:
            if isinstance(entry, str):
                checks = [(entry, TRACE_CONTEXTS)]
            else:
                contexts = None if entry.get("context") else TRACE_CONTEXTS
                checks = [(s, contexts) for s in entry.get("statements") or []]
            for statement, contexts in checks:
                problem = statement_problem(statement, contexts)
                if problem:
                    problems.append(f"trace statement {statement!r}: {problem}")
    elif processor == "filter":
        for condition in ((settings.get("traces") or {}).get("span") or []):
            problem = condition_problem(condition)
            if problem:
                problems.append(f"span condition {condition!r}: {problem}")
    return problems
