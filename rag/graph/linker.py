"""Stage ``link_entities``: the knowledge-graph entities a query names, found in process (no store round trip).

The gazetteer is the ingest's alias table (``graph_aliases.json`` in the generation: alias -> [(entity, prior)] and
how many chunks each alias occurs in), compiled into an Aho-Corasick automaton at warm-up. A query's seed weight for
an entity is the alias prior x its specificity / its ambiguity, where specificity = log((N+1)/(df+1)) / log(N+1) is 1
for an alias found in no chunk and 0 for one found in all: "paris" seeds less than "tour de france".

Optionally (``graph.link_by_embedding``) the entity titles nearest the query's embedding are seeds too, weighted by
cosine; the titles are embedded at ingest (``graph_entities.npy``). Measured on hotpotqa-dev it makes the graph
alone better but the fused ranking worse (it finds what the dense retriever found already), so it is off by default.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np

from rag.errors import IndexLoadError
from rag.graph.aliases import Gazetteer, normalise
from rag.graph.build import KnowledgeGraph
from rag.types import LinkedEntities

ALIASES_FILE = "graph_aliases.json"
ENTITY_VECTORS_FILE = "graph_entities.npy"


class GazetteerLinker:
    """``EntityLinker``: aliases found in the query, plus (``embedding_seeds`` > 0 with ``entity_vectors``) the
    nearest entity titles by embedding."""

    def __init__(self, alias_entities: dict[str, list[tuple[int, float]]], alias_df: dict[str, int], n_chunks: int,
                 *, entity_vectors: np.ndarray | None = None, embedding_seeds: int = 0,
                 embedding_min_similarity: float = 0.5, embedding_seed_weight: float = 0.3) -> None:
        if embedding_seeds and entity_vectors is None:
            raise ValueError("embedding_seeds needs the entity title vectors")
        self.alias_entities, self.alias_df, self.n_chunks = alias_entities, alias_df, n_chunks
        self.entity_vectors = entity_vectors
        self.embedding_seeds = min(embedding_seeds, 0 if entity_vectors is None else len(entity_vectors))
        self.embedding_min_similarity, self.embedding_seed_weight = embedding_min_similarity, embedding_seed_weight
        self.needs_vector = self.embedding_seeds > 0
        self.gazetteer = Gazetteer(alias_entities)
        self._log_n = math.log(n_chunks + 1)

    @classmethod
    def from_graph(cls, graph: KnowledgeGraph, **options) -> "GazetteerLinker":
        return cls(graph.alias_entities, graph.alias_df, graph.n_chunks, **options)

    def link(self, query: str, query_vector: np.ndarray | None = None) -> LinkedEntities:
        started = time.perf_counter()
        seeds: dict[int, float] = {}
        for alias in self.gazetteer.find(normalise(query)):
            df = self.alias_df.get(alias, 0)
            specificity = math.log((self.n_chunks + 1) / (df + 1)) / self._log_n if self._log_n else 1.0
            candidates = self.alias_entities[alias]
            for entity, prior in candidates:
                weight = prior * specificity / len(candidates)
                if weight > seeds.get(entity, 0.0):
                    seeds[entity] = weight
        if self.needs_vector and query_vector is not None:
            similarities = self.entity_vectors @ np.asarray(query_vector, np.float32).reshape(-1)
            nearest = np.argpartition(-similarities, self.embedding_seeds - 1)[: self.embedding_seeds]
            for entity in nearest.tolist():
                similarity = float(similarities[entity])
                weight = self.embedding_seed_weight * similarity
                if similarity >= self.embedding_min_similarity and weight > seeds.get(entity, 0.0):
                    seeds[entity] = weight
        # A seed of weight 0 (an alias found in every chunk) would still reach its neighbours in Cypher: drop it.
        return LinkedEntities({e: w for e, w in seeds.items() if w > 0}, time.perf_counter() - started)

    # -- the generation's files ----------------------------------------------------------------------------
    def save(self, folder: Path) -> list[str]:
        """Write the alias table (and the title vectors, if any) into the generation; the file names."""
        payload = {"n_chunks": self.n_chunks,
                   "aliases": {a: [[e, p] for e, p in entities] for a, entities in self.alias_entities.items()},
                   "df": {a: self.alias_df.get(a, 0) for a in self.alias_entities}}
        (folder / ALIASES_FILE).write_text(json.dumps(payload, ensure_ascii=False))
        if self.entity_vectors is None:
            return [ALIASES_FILE]
        np.save(folder / ENTITY_VECTORS_FILE, self.entity_vectors.astype(np.float32))
        return [ALIASES_FILE, ENTITY_VECTORS_FILE]

    @classmethod
    def load(cls, folder: Path, *, embedding_seeds: int = 0, **options) -> "GazetteerLinker":
        """The linker of a generation; ``embedding_seeds`` > 0 needs the title vectors built at ingest."""
        try:
            payload = json.loads((folder / ALIASES_FILE).read_text(encoding="utf-8"))
            aliases = {a: [(int(e), float(p)) for e, p in entities] for a, entities in payload["aliases"].items()}
            df, n_chunks = {a: int(c) for a, c in payload["df"].items()}, int(payload["n_chunks"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise IndexLoadError(folder, f"{ALIASES_FILE} is unreadable ({exc})") from exc
        vectors = None
        if embedding_seeds:
            path = folder / ENTITY_VECTORS_FILE
            if not path.is_file():
                raise IndexLoadError(folder, f"graph.link_by_embedding is on but {ENTITY_VECTORS_FILE} is missing: "
                                             "rebuild the index with it on (`ragheat ingest`)")
            vectors = np.load(path, allow_pickle=False)
        return cls(aliases, df, n_chunks, entity_vectors=vectors, embedding_seeds=embedding_seeds, **options)
