"""Graphs and stores for the graph tests: the hand-written and random graphs (``graph_testkit``), and stores
holding them: the embedded FalkorDB over its unix socket (backend falkordb) and the neo4j driver over the same kind of
server's Bolt listener (backend neo4j)."""

from __future__ import annotations

from pathlib import Path

import pytest

from graph_testkit import random_chunks, toy_chunks
from rag.graph.build import build_graph
from rag.graph.cypher import load_graph
from rag.graph.falkordb import FalkorDBStore, free_bolt_port
from rag.graph.neo4j import Neo4jStore


@pytest.fixture(scope="session")
def toy_graph():
    return build_graph(toy_chunks(), max_alias_df=0.5)


@pytest.fixture(scope="session")
def random_graph():
    return build_graph(random_chunks(), max_alias_df=0.5)


@pytest.fixture(scope="module", params=["falkordb", "neo4j"])
def loaded_store(request, random_graph, tmp_path_factory):
    """(backend, store, toy graph) with generations "toy" and "random", each loaded through that backend itself. The
    neo4j backend talks Bolt to an embedded FalkorDB started with its (test-only) Bolt listener, and its toy graph
    leaves out the titles that listener cannot carry (``graph_testkit.BOLT_UNSAFE``)."""
    folder = tmp_path_factory.mktemp(f"store-{request.param}")
    bolt = request.param == "neo4j"
    server = FalkorDBStore(folder, persist=True, bolt_port=free_bolt_port() if bolt else None)
    server.warm_up()
    store = server
    if bolt:
        store = Neo4jStore(f"bolt://127.0.0.1:{server.bolt_port}", "falkordb", "", "ignored-by-falkordb",
                           timeout_ms=10_000)
        store.warm_up()
    toy = build_graph(toy_chunks(bolt=bolt), max_alias_df=0.5)
    load_graph(store, toy, "toy", batch=7)
    load_graph(store, random_graph, "random", batch=50)
    yield request.param, store, toy
    if store is not server:
        store.close()
    server.close()


@pytest.fixture(scope="session")
def hotpot_subset(tmp_path_factory):
    """A BEIR folder: the gold paragraphs of the first hotpotqa-dev questions plus three times as many others."""
    from graph_testkit import hotpot_subset as make

    source = Path(__file__).resolve().parents[3] / "datasets" / "hotpotqa-dev"  # shipped with the repository
    return make(source, tmp_path_factory.mktemp("hotpot-subset"), questions=12)


@pytest.fixture(scope="session")
def graph_index(hotpot_subset, settings, embedder, tmp_path_factory):
    """A real index of the hotpotqa subset with its knowledge graph (read-only: tests that modify copy it), built by
    this checkout's ingest from the encoder's outputs kept between runs (tests/kept_vectors.py)."""
    from kept_vectors import kept_ingest

    index = tmp_path_factory.mktemp("graph-index") / "hotpot"
    kept_ingest("hotpot-subset", hotpot_subset, index, settings, embedder)
    return index


@pytest.fixture(scope="session")
def graph_pipeline(settings, graph_index):
    from rag.pipeline import RagPipeline

    pipeline = RagPipeline(settings, graph_index)
    pipeline.warm_up()
    yield pipeline
    pipeline.close()
