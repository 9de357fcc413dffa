"""The quality ladder as one service runs it: the rungs of ``rag.stages.LEVEL_TABLE`` that change something for its
settings (a rung that cuts only what the service does not run is the rung above it again), and the measured cost
and quality of each rung (``ragheat measure-ladder`` writes them; ``rag/steering/ladder.json`` is the measurement
of the default service on the repository's two corpora).

The controller orders its steps by the measured cost: a rung that costs no less than the one above it is not a
step down in load and is left out of the service's ladder (``Ladder.frontier``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from rag.errors import ConfigurationError
from rag.stages import LEVEL_BY_NAME, LEVEL_TABLE, QUALITY_LEVELS, QualityLevel

DEFAULT_LADDER = Path(__file__).with_name("ladder.json")
MIN_SAVING = 0.05
"""A rung is a step down only when it costs at least this share less CPU per answer than the rung above it."""


@dataclass(frozen=True)
class Plan:
    """What a request at one rung runs, for one service's settings."""

    hyde: bool
    language_model: bool
    graph: bool
    rerank_candidates: int  # 0 = no rerank
    dense: bool
    search_effort: float  # 1 = as configured


def plan(level: QualityLevel, settings) -> Plan:
    """What ``level`` runs for a service with ``settings`` (``rag.settings.RagheatSettings``)."""
    retrievers = set(settings.retrieval.retrievers)
    routed = "routed" in retrievers
    rerank = settings.rerank.candidates if settings.rerank.enabled else 0
    if level.rerank_candidates is not None:
        rerank = min(rerank, level.rerank_candidates)
    dense = level.dense and (routed or "dense" in retrievers)
    # Less effort cuts the candidates fused (several lists) and an approximate index's search (not an exact one's).
    cuts_search = dense and (routed or len(retrievers) > 1 or settings.index.kind != "flat")
    return Plan(hyde=level.hyde and settings.hyde.enabled,
                language_model=level.language_model and settings.generation.generator != "extractive",
                graph=level.graph and settings.graph.enabled and (routed or "graph" in retrievers),
                rerank_candidates=rerank, dense=dense,
                search_effort=level.search_effort if cuts_search else 1.0)


def distinct_levels(settings) -> tuple[str, ...]:
    """The rungs that change what this service runs, best first: each differs from the one above it."""
    kept: list[str] = []
    previous = None
    for level in LEVEL_TABLE:
        this = plan(level, settings)
        if this != previous:
            kept.append(level.name)
        previous = this
    return tuple(kept)


@dataclass(frozen=True)
class Ladder:
    """Measured rungs: CPU milliseconds per answer (``cpu_ms``, the median over the corpora measured) and quality
    per corpus (``quality``: corpus -> nDCG@10), with what was measured and how (``source``). The file also holds
    each corpus's measurement whole (``rag.steering.measure.RungMeasurement``)."""

    cpu_ms: Mapping[str, float]
    quality: Mapping[str, Mapping[str, float]]
    source: Mapping[str, object]

    @classmethod
    def load(cls, path: Path | None = None) -> "Ladder":
        path = Path(path or DEFAULT_LADDER)
        try:
            data = json.loads(path.read_text())
            levels = data["levels"]
            cpu = {name: float(row["cpu_ms"]) for name, row in levels.items()}
            quality = {name: {k: float(v) for k, v in row.get("ndcg@10", {}).items()} for name, row in levels.items()}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigurationError(f"steering.ladder: {path} is not a ladder file (ragheat measure-ladder): "
                                     f"{exc}") from None
        if unknown := set(cpu) - set(QUALITY_LEVELS):
            raise ConfigurationError(f"steering.ladder: {path} names levels that do not exist: {sorted(unknown)}")
        return cls(cpu, quality, data.get("source", {}))

    def frontier(self, levels: tuple[str, ...]) -> tuple[str, ...]:
        """``levels`` (best first) without the rungs that do not cost at least ``MIN_SAVING`` less than the last
        one kept; a rung never measured is kept (its cost is learned live)."""
        kept: list[str] = []
        for name in levels:
            cost = self.cpu_ms.get(name)
            last = next((self.cpu_ms[k] for k in reversed(kept) if k in self.cpu_ms), None)
            if kept and cost is not None and last is not None and cost > last * (1 - MIN_SAVING):
                continue
            kept.append(name)
        return tuple(kept)


def check_level(name: str, what: str) -> QualityLevel:
    if name not in LEVEL_BY_NAME:
        raise ConfigurationError(f"{what}: {name!r} is not one of {', '.join(QUALITY_LEVELS)}")
    return LEVEL_BY_NAME[name]
