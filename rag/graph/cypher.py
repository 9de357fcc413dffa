"""The Cypher every graph store runs, always with parameters: the query text is a constant (its plan is cached),
and values (titles, document ids, weights, seeds) travel as parameters, never pasted into the text.

Schema; ``g`` is the index generation the node belongs to, so one Neo4j server can hold the served generation and
the one being built, and a generation swap stays atomic for the graph too::

    (:Entity {g, id, name, title})  (:Doc {g, id, key})  (:Chunk {g, id})
    (:Doc)-[:DESCRIBES]->(:Entity)  (:Doc)-[:HAS_CHUNK]->(:Chunk)  (:Chunk)-[:MENTIONS {w}]->(:Entity)
    (:Entity)-[:CO_OCCURS {w, rank}]->(:Entity)   both directions; w scaled to the source's best edge, rank = its
                                                   position among the source's edges (top-N pruning = rank < N)

Ids in the store are the index's ids + 1 (``ID_BASE``): FalkorDB 4.16's range index loses the entry whose value is
the integer 0 when a graph is reloaded from its RDB file (``MATCH (e:Entity {id: 0})`` finds nothing after a restart,
every other id is found), so 0 is never stored. Only the Cypher subset FalkorDB and Neo4j both accept is used: no
``IF NOT EXISTS``, no ``EXISTS { }``, no ``shortestPath`` in MATCH, no ``CALL ... IN TRANSACTIONS``.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable, Iterator

from rag.graph.build import KnowledgeGraph
from rag.protocols import GraphStore

ID_BASE = 1
LABELS = ("Entity", "Doc", "Chunk")
SCHEMA = tuple(f"CREATE INDEX FOR (n:{label}) ON (n.id)" for label in LABELS)
ALREADY_INDEXED = ("already indexed", "already exists", "equivalentschemarule")
"""An index that exists already is fine (FalkorDB: "Attribute 'id' is already indexed"; Neo4j: an equivalent
schema rule exists): the unnamed ``CREATE INDEX`` has no ``IF NOT EXISTS`` form that both stores take."""

CREATE_ENTITIES = "UNWIND $rows AS r CREATE (:Entity {g: $g, id: r.id, name: r.name, title: r.title})"
CREATE_DOCS = "UNWIND $rows AS r CREATE (:Doc {g: $g, id: r.id, key: r.key})"
CREATE_CHUNKS = ("UNWIND $rows AS r MATCH (d:Doc {g: $g, id: r.doc}) "
                 "CREATE (d)-[:HAS_CHUNK]->(:Chunk {g: $g, id: r.id})")
CREATE_DESCRIBES = ("UNWIND $rows AS r MATCH (d:Doc {g: $g, id: r.doc}), (e:Entity {g: $g, id: r.entity}) "
                    "CREATE (d)-[:DESCRIBES]->(e)")
CREATE_MENTIONS = ("UNWIND $rows AS r MATCH (c:Chunk {g: $g, id: r.chunk}), (e:Entity {g: $g, id: r.entity}) "
                   "CREATE (c)-[:MENTIONS {w: r.w}]->(e)")
CREATE_CO_OCCURS = ("UNWIND $rows AS r MATCH (a:Entity {g: $g, id: r.a}), (b:Entity {g: $g, id: r.b}) "
                    "CREATE (a)-[:CO_OCCURS {w: r.w, rank: r.rank}]->(b)")

# Seeds are [{id, w}]. An entity's score is its best path: seed w, times decay and the edge weight per hop; a
# chunk gets the score of the entity its document DESCRIBES. Grouping by node rather than by id halves FalkorDB's
# execution time (one index lookup fewer).
TWO_HOPS = """UNWIND $seeds AS seed
MATCH (e0:Entity {g: $g, id: seed.id})
OPTIONAL MATCH (e0)-[r1:CO_OCCURS]->(e1:Entity) WHERE r1.rank < $top_n
OPTIONAL MATCH (e1)-[r2:CO_OCCURS]->(e2:Entity) WHERE r2.rank < $top_n
UNWIND [[e0, seed.w], [e1, seed.w * $decay * r1.w], [e2, seed.w * $decay * $decay * r1.w * r2.w]] AS hit
WITH hit[0] AS e, max(hit[1]) AS score
WHERE e IS NOT NULL
MATCH (d:Doc)-[:DESCRIBES]->(e)
MATCH (d)-[:HAS_CHUNK]->(c:Chunk)
RETURN c.id AS chunk, sum(score) AS score
ORDER BY score DESC, chunk ASC
LIMIT $k"""
ONE_HOP = """UNWIND $seeds AS seed
MATCH (e0:Entity {g: $g, id: seed.id})
OPTIONAL MATCH (e0)-[r1:CO_OCCURS]->(e1:Entity) WHERE r1.rank < $top_n
UNWIND [[e0, seed.w], [e1, seed.w * $decay * r1.w]] AS hit
WITH hit[0] AS e, max(hit[1]) AS score
WHERE e IS NOT NULL
MATCH (d:Doc)-[:DESCRIBES]->(e)
MATCH (d)-[:HAS_CHUNK]->(c:Chunk)
RETURN c.id AS chunk, sum(score) AS score
ORDER BY score DESC, chunk ASC
LIMIT $k"""
EXPANSION = {1: ONE_HOP, 2: TWO_HOPS}

ADJACENCY = ("MATCH (a:Entity {g: $g})-[r:CO_OCCURS]->(b:Entity) WHERE r.rank < $top_n "
             "RETURN a.id, b.id, r.w ORDER BY a.id, r.rank")
DESCRIBED_CHUNKS = ("MATCH (d:Doc {g: $g})-[:DESCRIBES]->(e:Entity) MATCH (d)-[:HAS_CHUNK]->(c:Chunk) "
                    "RETURN e.id, c.id ORDER BY e.id, c.id")
COUNT_NODES = {label: f"MATCH (n:{label} {{g: $g}}) RETURN count(n)" for label in LABELS}
COUNT_EDGES = {
    "describes": "MATCH (:Doc {g: $g})-[r:DESCRIBES]->() RETURN count(r)",
    "has_chunk": "MATCH (:Doc {g: $g})-[r:HAS_CHUNK]->() RETURN count(r)",
    "mentions": "MATCH (:Chunk {g: $g})-[r:MENTIONS]->() RETURN count(r)",
    "co_occurs": "MATCH (:Entity {g: $g})-[r:CO_OCCURS]->() RETURN count(r)",
}
GENERATIONS = "MATCH (e:Entity) RETURN DISTINCT e.g"
ANY_ENTITY = "MATCH (e:Entity) RETURN e.id LIMIT 1"
DELETE_BATCH = {label: f"MATCH (n:{label} {{g: $g}}) WITH n LIMIT $batch DETACH DELETE n RETURN count(*)"
                for label in LABELS}


def batches(rows: Iterable[dict], size: int) -> Iterator[list[dict]]:
    batch: list[dict] = []
    for row in rows:
        batch.append(row)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def create_schema(store: GraphStore) -> None:
    for statement in SCHEMA:
        try:
            store.run(statement, write=True)
        except Exception as exc:  # noqa: BLE001 - both stores refuse a second identical index, each its own way
            if not any(marker in str(exc).lower() for marker in ALREADY_INDEXED):
                raise


def load_rows(graph: KnowledgeGraph) -> list[tuple[str, str, Iterable[dict], int]]:
    """(step, statement, rows, row count) in load order: nodes first, then the edges that match them."""
    b = ID_BASE
    describes = [{"doc": d + b, "entity": e + b} for d, e in enumerate(graph.doc_entity)]
    mentions = [{"chunk": c + b, "entity": e + b, "w": w}
                for c, found in enumerate(graph.chunk_mentions) for e, w in found.items()]
    co_occurs = [{"a": a + b, "b": n + b, "w": w, "rank": rank}
                 for a, edges in graph.co_occurs.items() for rank, (n, w) in enumerate(edges)]
    return [
        ("entities", CREATE_ENTITIES, ({"id": e + b, "name": name, "title": title}
                                       for e, (name, title) in enumerate(zip(graph.entity_names, graph.entity_titles))),
         len(graph.entity_names)),
        ("docs", CREATE_DOCS, ({"id": d + b, "key": key} for d, key in enumerate(graph.doc_keys)), len(graph.doc_keys)),
        ("chunks", CREATE_CHUNKS, ({"id": c + b, "doc": d + b} for c, d in enumerate(graph.chunk_doc)), graph.n_chunks),
        ("describes", CREATE_DESCRIBES, describes, len(describes)),
        ("mentions", CREATE_MENTIONS, mentions, len(mentions)),
        ("co_occurs", CREATE_CO_OCCURS, co_occurs, len(co_occurs)),
    ]


def load_graph(store: GraphStore, graph: KnowledgeGraph, generation: str, *, batch: int = 5000,
               advance: Callable[[int], None] | None = None) -> dict[str, float]:
    """Write ``graph`` into ``store`` as generation ``generation`` (UNWIND batches); seconds per step."""
    timings: dict[str, float] = {}
    started = time.perf_counter()
    # Indexes are made before a store's first node, so a store holding entities has them already (and a second
    # CREATE INDEX fails in each store its own way; over FalkorDB's Bolt listener without a readable message).
    if not store.run(ANY_ENTITY):
        create_schema(store)
    timings["schema"] = time.perf_counter() - started
    for step, statement, rows, _count in load_rows(graph):
        started = time.perf_counter()
        for chunk in batches(rows, batch):
            store.run(statement, {"g": generation, "rows": chunk}, write=True)
            if advance is not None:
                advance(len(chunk))
        timings[step] = time.perf_counter() - started
    return timings


def total_rows(graph: KnowledgeGraph) -> int:
    """Rows ``load_graph`` writes (for a progress bar)."""
    return (len(graph.entity_names) + len(graph.doc_keys) + graph.n_chunks + len(graph.doc_entity)
            + sum(len(m) for m in graph.chunk_mentions) + sum(len(e) for e in graph.co_occurs.values()))


def count_generation(store: GraphStore, generation: str) -> dict[str, int]:
    """Nodes per label and edges per type of ``generation`` in ``store``."""
    counts = {label.lower(): int(store.run(q, {"g": generation})[0][0]) for label, q in COUNT_NODES.items()}
    counts.update({kind: int(store.run(q, {"g": generation})[0][0]) for kind, q in COUNT_EDGES.items()})
    return counts


def stored_generations(store: GraphStore) -> set[str]:
    """The generations that have entities in ``store``."""
    return {row[0] for row in store.run(GENERATIONS) if row[0] is not None}


def delete_generation(store: GraphStore, generation: str, batch: int = 10_000) -> int:
    """Remove every node (and edge) of ``generation``, in bounded transactions; nodes removed."""
    removed = 0
    for label in ("Chunk", "Doc", "Entity"):
        while True:
            n = int(store.run(DELETE_BATCH[label], {"g": generation, "batch": batch}, write=True)[0][0])
            removed += n
            if n < batch:
                break
    return removed
