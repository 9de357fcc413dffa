"""``ragheat probes``: the eBPF exporter."""

from __future__ import annotations


def probes() -> None:
    """eBPF kernel probes attributed to RAG stages (not built yet)."""
    raise SystemExit("ragheat probes: not built yet")
