"""The ``GraphStore`` contract, run against both backends with the same Cypher: the embedded FalkorDB over its unix
socket, and the neo4j driver over Bolt (FalkorDB's own Bolt listener stands in for a Neo4j server here)."""

from __future__ import annotations

import math

import pytest

from rag.graph.cypher import (COUNT_NODES, count_generation, delete_generation, load_graph, stored_generations)
from rag.graph.linker import GazetteerLinker
from rag.graph.retriever import AdjacencyGraphRetriever, CypherGraphRetriever
from rag.graph.store import GraphStoreUnavailable
from rag.protocols import GraphStore
from rag.types import LinkedEntities

from graph_testkit import CountingStore, injections, snapshot

# Over Bolt, FalkorDB sends some doubles with ~6 significant digits: scores are compared with a tolerance, and the
# order only up to near-ties.
REL = 1e-5


def assert_same_ranking(got, expected) -> None:
    assert len(got) == len(expected)
    scores = {h.chunk_id: h.score for h in expected}
    assert {h.chunk_id for h in got} == set(scores)
    for h in got:
        assert math.isclose(h.score, scores[h.chunk_id], rel_tol=REL), (h, scores[h.chunk_id])
    for position, (a, b) in enumerate(zip(got, expected)):  # the same score at every rank
        assert math.isclose(a.score, b.score, rel_tol=REL), (position, a, b)


def test_both_backends_are_graph_stores(loaded_store):
    backend, store, toy = loaded_store
    assert isinstance(store, GraphStore) and store.healthy()


def test_the_load_is_counted_back_exactly(loaded_store):
    backend, store, toy = loaded_store
    counts = count_generation(store, "toy")
    assert counts == {"entity": len(toy.entity_names), "doc": len(toy.doc_keys), "chunk": toy.n_chunks,
                      "describes": len(toy.doc_keys), "has_chunk": toy.n_chunks,
                      "mentions": toy.stats["mentions"], "co_occurs": toy.stats["co_occurs"]}
    assert stored_generations(store) >= {"toy", "random"}


@pytest.mark.parametrize("hops", [1, 2])
def test_the_cypher_expansion_equals_the_in_memory_reference(loaded_store, random_graph, hops):
    backend, store, toy = loaded_store
    linker = GazetteerLinker.from_graph(random_graph)
    cypher = CypherGraphRetriever(store, "random", hops=hops, top_n=3, decay=0.5)
    reference = AdjacencyGraphRetriever.from_graph(random_graph, hops=hops, top_n=3, decay=0.5)
    compared = 0
    for e, title in enumerate(random_graph.entity_titles[:40]):
        other = random_graph.entity_titles[(e * 7 + 3) % len(random_graph.entity_titles)]
        linked = linker.link(f"What links {title} to {other}?")
        assert linked.seeds, title
        expected = reference.retrieve(linked, 1000).hits
        assert_same_ranking(cypher.retrieve(linked, 1000).hits, expected)
        compared += len(expected)
    assert compared > 200, "the random graph should reach many chunks"


def test_hops_and_pruning_reach_what_the_graph_says(loaded_store):
    """Black Book -> Paul Verhoeven (1 hop) -> RoboCop, Detroit (2 hops) -> Michigan (3 hops, not reached)."""
    backend, store, toy = loaded_store
    entity = {name: e for e, name in enumerate(toy.entity_names)}
    doc_chunks = {key: [c for c, d in enumerate(toy.chunk_doc) if toy.doc_keys[d] == key]
                  for key in toy.doc_keys}
    linked = LinkedEntities({entity["black book film"]: 1.0}, 0.0)
    one = {h.chunk_id for h in CypherGraphRetriever(store, "toy", hops=1, top_n=10).retrieve(linked, 100).hits}
    two = {h.chunk_id for h in CypherGraphRetriever(store, "toy", hops=2, top_n=10).retrieve(linked, 100).hits}
    assert set(doc_chunks["black-book"]) | set(doc_chunks["verhoeven"]) <= one
    assert not set(doc_chunks["robocop"]) & one and set(doc_chunks["robocop"]) <= two
    assert set(doc_chunks["detroit"]) <= two and not set(doc_chunks["michigan"]) & two
    hits = CypherGraphRetriever(store, "toy", hops=2, top_n=10, decay=0.5).retrieve(linked, 100).hits
    score = {h.chunk_id: h.score for h in hits}
    assert score[doc_chunks["black-book"][0]] == pytest.approx(1.0)  # the seed keeps its own weight
    assert score[doc_chunks["verhoeven"][0]] <= 0.5 + 1e-9  # one hop: decay x an edge weight <= 1
    pruned = CypherGraphRetriever(store, "toy", hops=1, top_n=1).retrieve(linked, 100).hits
    assert len({toy.chunk_doc[h.chunk_id] for h in pruned}) == 2  # the seed's document + its best neighbour


def test_a_query_that_links_nothing_makes_no_round_trip(loaded_store):
    backend, store, toy = loaded_store
    counting = CountingStore(store)
    retriever = CypherGraphRetriever(counting, "toy")
    assert retriever.retrieve(LinkedEntities({}, 0.0), 10).hits == [] and counting.calls == 0
    assert retriever.retrieve(LinkedEntities({0: 1.0}, 0.0), 10).hits and counting.calls == 1


def test_injection_strings_travel_as_values_and_change_nothing(loaded_store):
    backend, store, toy = loaded_store
    before = snapshot(store)
    titles = {row[0] for row in store.run("MATCH (e:Entity {g: $g}) RETURN e.title", {"g": "toy"})}
    assert set(injections(bolt=backend == "neo4j")) <= titles, "titles are stored verbatim"
    keys = {row[0] for row in store.run("MATCH (d:Doc {g: $g}) RETURN d.key", {"g": "toy"})}
    assert {k for k in toy.doc_keys if k.startswith("inject-")} <= keys
    for payload in injections(bolt=backend == "neo4j"):
        rows = store.run("MATCH (e:Entity {g: $g}) WHERE e.title = $title RETURN count(e)", {"g": "toy", "title": payload})
        assert rows == [(1,)], payload
        assert store.run(COUNT_NODES["Entity"], {"g": payload}) == [(0,)]  # as a generation key: matches nothing
    assert snapshot(store) == before


def test_a_generation_can_be_removed_without_touching_another(loaded_store, random_graph):
    backend, store, toy = loaded_store
    load_graph(store, toy, "scratch")
    before = count_generation(store, "random")
    assert delete_generation(store, "scratch", batch=5) == (len(toy.entity_names) + len(toy.doc_keys)
                                                           + toy.n_chunks)
    assert "scratch" not in stored_generations(store)
    assert count_generation(store, "random") == before and count_generation(store, "toy")["entity"] > 0


def test_a_store_that_is_gone_says_so_with_its_own_error(tmp_path):
    from rag.graph.falkordb import FalkorDBStore
    from rag.graph.neo4j import Neo4jStore

    with pytest.raises(GraphStoreUnavailable, match="not running"):
        FalkorDBStore(tmp_path).run("RETURN 1")
    with pytest.raises(GraphStoreUnavailable, match="cannot be reached"):
        Neo4jStore("bolt://127.0.0.1:9", "neo4j", "x", timeout_ms=500).warm_up()
