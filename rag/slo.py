"""The service-level objective every part is judged against, spelled once.

The histograms' bucket edges (``telemetry.buckets``), the burn-rate rules and boards (``dashboards/``), the load
generator's knee (``ragheat bench --slo-ms``) and its report all read it from here. A module of its own, free of
imports, so that light processes (vLLM's, the probes exporter) and tools can use it.
"""

from __future__ import annotations

SLO_SECONDS = 0.42
"""The end-to-end latency objective: 99 % of requests within 420 ms. ``telemetry.buckets.LATENCY_SECONDS`` holds
it as an exact edge, so the SLI (share of requests <= 0.42 s) is read off ``le="0.42"`` without interpolation."""
SLO_MS = SLO_SECONDS * 1000
"""The same objective in milliseconds, as the load generator and its report take it."""
