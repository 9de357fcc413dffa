"""The graph part of ``ragheat ingest``: built in the same generation as the dense and BM25 indexes, described by
the manifest, part of the fingerprint (a graph-only change rebuilds only the graph), and on the Neo4j backend loaded
beside the served generation and pruned with the generations on disk."""

from __future__ import annotations

import json
import os

import pytest
from pydantic import SecretStr

from index_copy import copy_index
from rag.errors import IndexLoadError
from rag.graph.cypher import stored_generations
from rag.graph.falkordb import FalkorDBStore, free_bolt_port
from rag.graph.neo4j import Neo4jStore
from rag.index.store import read_manifest, resolve_generation
from rag.ingest.pipeline import ingest
from rag.pipeline import RagPipeline

from graph_testkit import DOCS, bolt_safe


def with_graph(settings, **graph):
    return settings.model_copy(update={"graph": settings.graph.model_copy(update=graph)})


def test_the_manifest_describes_the_graph_built_with_the_indexes(graph_index):
    manifest = read_manifest(graph_index)
    block = manifest["graph"]
    folder = resolve_generation(graph_index)
    assert block["backend"] == "falkordb" and block["generation"] == manifest["generation"]
    assert block["files"] == ["graph.rdb", "graph_aliases.json"] and all((folder / f).is_file() for f in block["files"])
    counts = block["counts"]
    assert counts["entities"] == counts["stored_entity"] > 0 and counts["chunks"] == manifest["counts"]["chunks"]
    assert counts["co_occurs"] == counts["stored_co_occurs"] > 0 and counts["mentions"] > 0
    assert block["config"]["max_alias_df"] == 0.01 and block["config"]["format"] >= 1
    assert {"build", "store_start", "store_load", "store_save"} <= set(block["timings_s"])
    assert manifest["timings_s"]["graph"] > 0 and manifest["fingerprint_indexes"] != manifest["fingerprint"]
    assert not list(folder.glob("*.sock")), "the ingest's store is gone, socket included"


def test_a_graph_only_change_reuses_chunks_and_embeddings(settings, embedder, graph_index, hotpot_subset, tmp_path):
    index = tmp_path / "index"
    copy_index(graph_index, index)
    before, old = read_manifest(index), resolve_generation(index)
    changed = with_graph(settings, max_alias_df=0.02)
    report = ingest(str(hotpot_subset), index, changed, embedder=embedder)
    after = report.manifest
    assert not report.skipped and after["generation"] != before["generation"]
    assert "reused" in after["timings_s"] and "embed" not in after["timings_s"]
    assert after["fingerprint_indexes"] == before["fingerprint_indexes"] and after["fingerprint"] != before["fingerprint"]
    assert after["graph"]["config"]["max_alias_df"] == 0.02 and after["graph"]["generation"] == after["generation"]
    new = report.generation
    assert os.stat(old / "dense.faiss").st_ino == os.stat(new / "dense.faiss").st_ino  # a hard link, not a copy
    assert (new / "chunks.jsonl").read_bytes() == (old / "chunks.jsonl").read_bytes()
    assert ingest(str(hotpot_subset), index, changed, embedder=embedder).skipped
    pipeline = RagPipeline(changed, index)
    pipeline.warm_up()
    try:
        run = pipeline.retrieve("Which film did Paul Verhoeven direct?", 5, ["hybrid+graph"])
        assert run.route in ("hybrid", "hybrid+graph") and not run.skipped
    finally:
        pipeline.close()


def test_with_the_graph_off_no_graph_is_built(settings, embedder, graph_index, hotpot_subset, tmp_path):
    index = tmp_path / "index"
    copy_index(graph_index, index)
    report = ingest(str(hotpot_subset), index, with_graph(settings, enabled=False), embedder=embedder)
    assert report.manifest["graph"] is None and "embed" not in report.manifest["timings_s"]
    assert not (report.generation / "graph.rdb").exists() and not (report.generation / "graph_aliases.json").exists()


def test_serving_a_graph_with_another_backend_than_it_was_built_for_is_refused(settings, graph_index):
    pipeline = RagPipeline(with_graph(settings, backend="neo4j"), graph_index)
    with pytest.raises(IndexLoadError, match="built for the falkordb store but graph.backend is neo4j"):
        pipeline.warm_up()


@pytest.fixture
def bolt_server(tmp_path):
    """An embedded FalkorDB with its Bolt listener, standing in for compose's Neo4j (graph key falkordb only)."""
    server = FalkorDBStore(tmp_path / "bolt-server", persist=True, bolt_port=free_bolt_port())
    (tmp_path / "bolt-server").mkdir()
    server.warm_up()
    yield server
    server.close()


def test_the_neo4j_backend_loads_beside_the_served_generation_and_prunes_with_the_disk(settings, embedder, tmp_path,
                                                                                      bolt_server):
    beir = tmp_path / "beir"
    beir.mkdir()
    docs = [d for d in DOCS if bolt_safe(d[1]) and bolt_safe(d[2])]  # FalkorDB's Bolt cannot carry quotes
    (beir / "corpus.jsonl").write_text("".join(json.dumps({"_id": i, "title": t, "text": x}) + "\n" for i, t, x in docs))
    neo4j = with_graph(settings, backend="neo4j", uri=f"bolt://127.0.0.1:{bolt_server.bolt_port}", user="falkordb",
                       password=SecretStr(""), timeout_ms=3000, max_alias_df=0.5)
    index = tmp_path / "index"
    generations = []
    for df in (0.5, 0.6, 0.7):  # graph-only changes: new generations, embeddings reused after the first
        report = ingest(str(beir), index, with_graph(neo4j, max_alias_df=df), embedder=embedder)
        generations.append(report.manifest["generation"])
        assert report.manifest["graph"]["backend"] == "neo4j"
        assert report.manifest["graph"]["files"] == ["graph_aliases.json"]  # the graph itself is in the server
    on_disk = {p.name for p in (index / "generations").iterdir()}
    assert on_disk == set(generations[1:])  # the current one and one previous, for rollback
    assert stored_generations(bolt_server) == on_disk, "the server holds exactly the generations on disk"

    pipeline = RagPipeline(with_graph(neo4j, max_alias_df=0.7), index)
    pipeline.warm_up()
    try:
        assert pipeline.describe().graph_backend == "neo4j" and isinstance(pipeline.graph.store, Neo4jStore)
        fused = run = pipeline.retrieve("Who directed Black Book?", 5, ["graph"])
        assert run.route == "graph" and fused.hits and not run.skipped
        titles = {pipeline.index.chunks[h.chunk_id].title for h in fused.hits}
        assert {"Black Book (film)", "Paul Verhoeven"} <= titles
    finally:
        pipeline.close()
