"""The metrics table (``telemetry.metrics.METRICS``) is the one place a metric is named: it follows the naming
rules, and every exporter (the service, the vLLM plugin, the probes' collector) registers exactly its rows."""

from __future__ import annotations

import re

import pytest
from prometheus_client import CollectorRegistry

from telemetry.metrics import (EXPECTED_METRICS, GENERATION_METRICS, HOST_METRICS, KERNEL_METRICS, METRICS,
                               QUALITY_METRICS, SERVICE_METRICS, VLLM_METRICS, PrometheusMetrics, specs)

UNITS = ("_seconds", "_total", "_ratio", "_documents", "_tokens", "_blocks", "_allocated", "_freed", "_flight", "_qps",
         "_bytes", "_entries", "_score", "_level", "_citations")


def families(registry: CollectorRegistry) -> dict[str, tuple[str, str]]:
    """Family name as the table spells it -> (type, help), as registered."""
    found = {}
    for family in registry.collect():
        name = family.name + "_total" if family.type == "counter" else family.name
        found[name] = (family.type, family.documentation)
    return found


@pytest.mark.parametrize("spec", METRICS, ids=lambda m: m.name)
def test_every_row_follows_the_naming_rules(spec):
    assert re.fullmatch(r"ragheat_[a-z0-9_]+", spec.name), spec.name
    assert spec.name.endswith("_total") == (spec.kind == "counter"), spec.name
    assert spec.name.endswith(UNITS), f"{spec.name}: no unit or kind suffix"
    assert spec.help.strip().endswith(".") and len(spec.help) > 20, spec.help
    assert bool(spec.buckets) == (spec.kind == "histogram"), spec.name
    assert list(spec.buckets) == sorted(spec.buckets), spec.name
    assert len(set(spec.labels)) == len(spec.labels) and "le" not in spec.labels


def test_names_and_roles_are_unique():
    assert len({m.name for m in METRICS}) == len(METRICS)
    assert all(len(specs(group)) == sum(m.group == group for m in METRICS)
               for group in ("service", "generation", "quality", "vllm", "kernel", "host"))


def test_the_name_maps_and_expected_metrics_are_read_off_the_table():
    assert set(EXPECTED_METRICS) == {*SERVICE_METRICS.values(), *GENERATION_METRICS.values(), *QUALITY_METRICS.values(),
                                     *HOST_METRICS.values()}
    assert all(name.startswith("ragheat_quality_") or name.startswith("ragheat_answer_quality_")
               for name in QUALITY_METRICS.values())
    assert all(name.startswith("ragheat_vllm_") for name in VLLM_METRICS.values())
    assert all(name.startswith("ragheat_kernel_") for name in KERNEL_METRICS.values())
    assert not any(name.startswith("ragheat_vllm_") for name in GENERATION_METRICS.values()), \
        "generation metrics (the service's view of its model) are apart from vLLM's engine metrics"


def test_the_service_registers_exactly_its_rows():
    registry = CollectorRegistry()
    PrometheusMetrics(registry, qps_labels=("0-1",))
    expected = {m.name: (m.kind, m.help) for m in METRICS if m.group in ("service", "generation", "quality")}
    assert families(registry) == expected


def test_the_vllm_plugin_registers_exactly_its_rows():
    from telemetry.vllm_plugin import VllmStepMetrics

    registry = CollectorRegistry()
    VllmStepMetrics(registry)
    assert families(registry) == {m.name: (m.kind, m.help) for m in specs("vllm").values()}


def test_the_probes_collector_describes_exactly_its_rows():
    from probes.collector import KernelCollector
    from probes.stats import KernelSnapshot

    collector = KernelCollector(lambda: KernelSnapshot(), scheduler=True, syscalls=True, tcp_retransmits=True)
    registry = CollectorRegistry()
    registry.register(collector)
    assert families(registry) == {m.name: (m.kind, m.help) for m in specs("kernel").values()}
