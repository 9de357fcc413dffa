"""The knowledge graph of a chunked corpus, built at ingest without any language model.

Entities: one per distinct normalised document title; the document DESCRIBES it. Mentions: the title aliases
(``rag.graph.aliases``) found in each chunk's text by the Aho-Corasick gazetteer; an alias found in more than
``max_alias_df`` of the chunks is a word, not a name, and makes no mention; an ambiguous alias spreads its prior over
its entities. Co-occurrence: two entities mentioned in one chunk (the chunk's own title entity counts), weighted by
positive PMI over chunks so that hubs ("United States") weigh little; each entity's edges are scaled by its best
edge and ranked, so that keeping the top N neighbours per hop is a ``rank < N`` filter at query time.

Named entities from a spaCy model are left out as an extra source of entities: on hotpotqa-dev they bring no
significant nDCG gain and cost a large share more ingest CPU.
"""

from __future__ import annotations

import html
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Sequence

from rag.graph.aliases import Gazetteer, normalise, title_aliases, usable_alias
from rag.types import Chunk

GRAPH_FORMAT = 1
"""Version of what the build produces; part of the ingest fingerprint, so a change here rebuilds graphs."""


@dataclass
class KnowledgeGraph:
    """The built graph as plain lists (ids are positions): what the store loads, what the linker and the in-memory
    reference read."""

    entity_names: list[str]  # normalised title, per entity
    entity_titles: list[str]  # the title as written (HTML entities decoded)
    entity_chunks: list[list[int]]  # chunks of the documents that DESCRIBE the entity
    doc_keys: list[str]  # document id, per document number
    doc_entity: list[int]  # the entity each document DESCRIBES
    chunk_doc: list[int]  # document number, per chunk
    alias_entities: dict[str, list[tuple[int, float]]]  # alias -> [(entity, prior)]
    alias_df: dict[str, int]  # chunks an alias occurs in
    chunk_mentions: list[dict[int, float]]  # chunk -> {entity: weight}
    co_occurs: dict[int, list[tuple[int, float]]]  # entity -> [(entity, weight scaled to its best)], best first
    stats: dict = field(default_factory=dict)

    @property
    def n_chunks(self) -> int:
        return len(self.chunk_doc)


def build_graph(chunks: Sequence[Chunk], *, max_alias_df: float = 0.01, min_alias_chars: int = 3,
                comma_aliases: str = "short", advance: Callable[[int], None] | None = None) -> KnowledgeGraph:
    """The graph of ``chunks`` (in chunk-id order); ``advance(n)`` is told of chunks matched, for a progress bar."""
    started = time.perf_counter()
    entity_of: dict[str, int] = {}
    names: list[str] = []
    titles: list[str] = []
    entity_chunks: list[list[int]] = []
    doc_number: dict[str, int] = {}
    doc_entity: list[int] = []
    chunk_doc: list[int] = []
    for position, chunk in enumerate(chunks):
        if chunk.chunk_id != position:
            raise ValueError(f"chunks must come in chunk-id order from 0; chunk {chunk.chunk_id} is at {position}")
        d = doc_number.get(chunk.doc_id)
        if d is None:
            d = doc_number[chunk.doc_id] = len(doc_number)
            name = normalise(chunk.title) or normalise(chunk.doc_id) or chunk.doc_id
            e = entity_of.get(name)
            if e is None:
                e = entity_of[name] = len(names)
                names.append(name)
                titles.append(html.unescape(chunk.title) or chunk.doc_id)
                entity_chunks.append([])
            doc_entity.append(e)
        chunk_doc.append(d)
        entity_chunks[doc_entity[d]].append(chunk.chunk_id)

    alias_entities: dict[str, list[tuple[int, float]]] = {}
    for e, title in enumerate(titles):
        for alias, prior in title_aliases(title, comma_aliases):
            if usable_alias(alias, min_alias_chars):
                alias_entities.setdefault(alias, []).append((e, prior))
    aliases_done = time.perf_counter()

    gazetteer = Gazetteer(alias_entities)
    found_per_chunk: list[list[str]] = []
    alias_df: Counter = Counter()
    for i, chunk in enumerate(chunks):
        found = gazetteer.find(normalise(chunk.text))
        found_per_chunk.append(found)
        alias_df.update(set(found))
        if advance is not None and (i + 1) % 512 == 0:
            advance(512)
    if advance is not None and len(chunks) % 512:
        advance(len(chunks) % 512)
    matched = time.perf_counter()

    n = len(chunks)
    max_df = max(2, int(max_alias_df * n))
    chunk_mentions: list[dict[int, float]] = []
    for chunk, found in zip(chunks, found_per_chunk):
        own = doc_entity[chunk_doc[chunk.chunk_id]]  # chunk ids are positions (checked above)
        mentions: dict[int, float] = {}
        for alias in found:
            if alias_df[alias] > max_df:
                continue
            candidates = alias_entities[alias]
            for e, prior in candidates:
                if e != own:
                    mentions[e] = mentions.get(e, 0.0) + prior / len(candidates)
        chunk_mentions.append(mentions)

    pair_counts: dict[int, Counter] = {}
    occurrences: Counter = Counter()
    for chunk, mentions in zip(chunks, chunk_mentions):
        if not mentions:
            occurrences[doc_entity[chunk_doc[chunk.chunk_id]]] += 1
            continue
        members = {*mentions, doc_entity[chunk_doc[chunk.chunk_id]]}
        occurrences.update(members)
        for a in members:
            row = pair_counts.setdefault(a, Counter())
            for b in members:
                if a != b:
                    row[b] += 1
    co_occurs: dict[int, list[tuple[int, float]]] = {}
    for a, row in pair_counts.items():
        ppmi = [(b, math.log(n * c / (occurrences[a] * occurrences[b]))) for b, c in row.items()]
        ranked = sorted(((b, w) for b, w in ppmi if w > 0), key=lambda edge: (-edge[1], edge[0]))
        if ranked:
            best = ranked[0][1]
            co_occurs[a] = [(b, w / best) for b, w in ranked]
    edges_done = time.perf_counter()
    stats = {"entities": len(names), "documents": len(doc_keys := list(doc_number)), "chunks": n,
             "aliases": len(alias_entities), "mentions": sum(len(m) for m in chunk_mentions),
             "co_occurs": sum(len(r) for r in co_occurs.values()),
             "aliases_too_common": sum(1 for c in alias_df.values() if c > max_df),
             "seconds": {"aliases": round(aliases_done - started, 3), "match": round(matched - aliases_done, 3),
                         "edges": round(edges_done - matched, 3)}}
    return KnowledgeGraph(names, titles, entity_chunks, doc_keys, doc_entity, chunk_doc, alias_entities,
                          dict(alias_df), chunk_mentions, co_occurs, stats)
