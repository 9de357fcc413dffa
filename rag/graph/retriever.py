"""Stage ``retrieve_graph``: from the linked entities, expand ``hops`` co-occurrence hops (top-N neighbours per hop
by edge weight, ``decay`` per hop), score the chunks of the documents that describe the reached entities, and return
ranked hits like the other retrievers (they join weighted RRF as the ``graph`` list).

Two ``GraphRetriever``s compute the same ranking:

* ``CypherGraphRetriever`` (``graph.execution=cypher``, the default): one parameterised Cypher round trip per query
  in the store (``rag.graph.cypher.TWO_HOPS``).
* ``AdjacencyGraphRetriever`` (``graph.execution=adjacency``): the pruned edges are pulled from the store once at
  warm-up and walked in process; the store stays the system of record. It is also the in-memory reference the tests
  hold the Cypher against (``from_graph``).

A query that links no entity makes no round trip.
"""

from __future__ import annotations

import time

from rag.graph.build import KnowledgeGraph
from rag.graph.cypher import ADJACENCY, DESCRIBED_CHUNKS, EXPANSION, ID_BASE
from rag.protocols import GraphStore
from rag.types import Hit, LinkedEntities, RetrievalResult


class CypherGraphRetriever:
    """The expansion as one Cypher query in ``store`` (generation ``generation``)."""

    name = "graph"

    def __init__(self, store: GraphStore, generation: str, *, hops: int = 2, top_n: int = 10,
                 decay: float = 0.5) -> None:
        if hops not in EXPANSION:
            raise ValueError(f"hops must be one of {sorted(EXPANSION)}, got {hops}")
        self.store, self.generation = store, generation
        self.cypher = EXPANSION[hops]
        self.top_n, self.decay = top_n, decay

    def retrieve(self, linked: LinkedEntities, k: int) -> RetrievalResult:
        started = time.perf_counter()
        if not linked.seeds:
            return RetrievalResult(self.name, [], time.perf_counter() - started)
        seeds = [{"id": entity + ID_BASE, "w": float(weight)} for entity, weight in linked.seeds.items()]
        rows = self.store.run(self.cypher, {"g": self.generation, "seeds": seeds, "top_n": self.top_n,
                                            "decay": float(self.decay), "k": int(k)})
        hits = [Hit(int(chunk) - ID_BASE, float(score)) for chunk, score in rows]
        return RetrievalResult(self.name, hits, time.perf_counter() - started)

    def ready(self) -> bool:
        return self.store.healthy()


class AdjacencyGraphRetriever:
    """The expansion over adjacency lists held in this process: ``neighbours[e]`` = [(entity, weight)] best first
    (already cut to ``top_n``), ``entity_chunks[e]`` = the chunks of the documents describing ``e``."""

    name = "graph"

    def __init__(self, neighbours: dict[int, list[tuple[int, float]]], entity_chunks: dict[int, list[int]], *,
                 hops: int = 2, top_n: int = 10, decay: float = 0.5) -> None:
        self.neighbours = {e: edges[:top_n] for e, edges in neighbours.items()}
        self.entity_chunks = entity_chunks
        self.hops, self.top_n, self.decay = hops, top_n, decay

    @classmethod
    def from_store(cls, store: GraphStore, generation: str, *, hops: int = 2, top_n: int = 10,
                   decay: float = 0.5) -> "AdjacencyGraphRetriever":
        neighbours: dict[int, list[tuple[int, float]]] = {}
        for a, b, w in store.run(ADJACENCY, {"g": generation, "top_n": top_n}):
            neighbours.setdefault(int(a) - ID_BASE, []).append((int(b) - ID_BASE, float(w)))
        chunks: dict[int, list[int]] = {}
        for e, c in store.run(DESCRIBED_CHUNKS, {"g": generation}):
            chunks.setdefault(int(e) - ID_BASE, []).append(int(c) - ID_BASE)
        return cls(neighbours, chunks, hops=hops, top_n=top_n, decay=decay)

    @classmethod
    def from_graph(cls, graph: KnowledgeGraph, *, hops: int = 2, top_n: int = 10,
                   decay: float = 0.5) -> "AdjacencyGraphRetriever":
        """Straight from the built graph, no store: the reference implementation."""
        return cls(graph.co_occurs, dict(enumerate(graph.entity_chunks)), hops=hops, top_n=top_n, decay=decay)

    def entity_scores(self, seeds: dict[int, float]) -> dict[int, float]:
        """Each reached entity's best path score (seed weight x decay x edge weight per hop)."""
        scores = dict(seeds)
        frontier = seeds
        for _ in range(self.hops):
            reached: dict[int, float] = {}
            for entity, score in frontier.items():
                for neighbour, weight in self.neighbours.get(entity, ()):
                    value = score * self.decay * weight
                    if value > reached.get(neighbour, 0.0):
                        reached[neighbour] = value
            for entity, value in reached.items():
                if value > scores.get(entity, 0.0):
                    scores[entity] = value
            frontier = reached
        return scores

    def retrieve(self, linked: LinkedEntities, k: int) -> RetrievalResult:
        started = time.perf_counter()
        chunk_scores: dict[int, float] = {}
        for entity, score in self.entity_scores(dict(linked.seeds)).items():
            for chunk in self.entity_chunks.get(entity, ()):
                chunk_scores[chunk] = chunk_scores.get(chunk, 0.0) + score
        ranked = sorted(chunk_scores.items(), key=lambda item: (-item[1], item[0]))[:k]
        return RetrievalResult(self.name, [Hit(c, s) for c, s in ranked], time.perf_counter() - started)

    def ready(self) -> bool:
        return True
