"""``vector_store.backend=milvus``: ingest publishes each index generation into its own collection on a Milvus server
(here milvus-lite's, speaking Milvus' protocol to the same client), the dense and BM25 stages search it, and what
they find is what the generation's own files find."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rag.errors import ConfigurationError, IndexLoadError, IngestError
from rag.index.milvus import MilvusStore, collection_name, index_tag
from rag.index.store import read_manifest
from rag.settings import RagheatSettings

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def milvus(tmp_path_factory):
    from stack.milvus_lite import MilvusLiteServer

    with MilvusLiteServer(tmp_path_factory.mktemp("milvus")) as server:
        yield server


def on_milvus(settings: RagheatSettings, uri: str, **vector_store) -> RagheatSettings:
    """The defaults with an exact dense index (both backends then rank alike), no graph, and the collections on
    ``uri``."""
    return settings.model_copy(update={
        "index": settings.index.model_copy(update={"kind": "flat"}),
        "graph": settings.graph.model_copy(update={"enabled": False}),
        "vector_store": settings.vector_store.model_copy(update={"backend": "milvus", "uri": uri, **vector_store})})


@pytest.fixture(scope="module")
def milvus_index(milvus, scifact_subset, settings, embedder, tmp_path_factory) -> Path:
    from kept_vectors import kept_ingest

    index = tmp_path_factory.mktemp("milvus-index") / "scifact-subset"
    kept_ingest("scifact-subset-milvus", scifact_subset, index, on_milvus(settings, milvus.uri), embedder)
    return index


def local(settings: RagheatSettings) -> RagheatSettings:
    return settings.model_copy(update={"vector_store": settings.vector_store.model_copy(update={"backend": "local"})})


def test_the_generation_is_published_into_its_own_collection(milvus, milvus_index, settings):
    manifest = read_manifest(milvus_index)
    block = manifest["vector_store"]
    assert block["backend"] == "milvus" and block["dense_index"] == "FLAT"
    assert block["collection"] == collection_name("ragheat", milvus_index, manifest["generation"])
    assert block["counts"]["rows"] == manifest["counts"]["chunks"] > 0
    store = MilvusStore(on_milvus(settings, milvus.uri).vector_store)
    try:
        assert store.collections(index_tag("ragheat", milvus_index)) == [block["collection"]]
        assert store.count(block["collection"]) == manifest["counts"]["chunks"]
    finally:
        store.close()


def test_milvus_finds_what_the_generations_own_files_find(milvus, milvus_index, settings, scifact_subset):
    from rag.eval.beir import load_qrels, load_queries
    from rag.eval.runner import evaluate
    from rag.pipeline import RagPipeline

    served = on_milvus(settings, milvus.uri)
    pipelines = {"milvus": RagPipeline(served, milvus_index), "local": RagPipeline(local(served), milvus_index)}
    try:
        for p in pipelines.values():
            p.warm_up()
        assert type(pipelines["milvus"].retrievers["dense"]).__name__ == "MilvusDenseRetriever"
        queries, qrels = load_queries(scifact_subset), load_qrels(scifact_subset, "train")
        # Each retriever's own list, query by query: the same passages in the same order (ties aside).
        same = {"dense": 0, "bm25": 0}
        judged = [text for qid, text in queries.items() if qid in qrels]
        for text in judged:
            vector = pipelines["local"].embedder.embed_query(text).vector
            for name in same:
                lists = [p.retrievers[name].retrieve(text, vector, 10).hits for p in pipelines.values()]
                ids = [[h.chunk_id for h in hits] for hits in lists]
                same[name] += ids[0] == ids[1]
                scores = [np.array([h.score for h in hits]) for hits in lists]
                if name == "dense":  # inner products of the same vectors
                    np.testing.assert_allclose(np.sort(scores[0]), np.sort(scores[1]), atol=1e-4)
        assert all(count >= 0.95 * len(judged) for count in same.values()), (same, len(judged))
        # What ragheat eval reports: within 0.01 nDCG@10 on every combination.
        reports = {name: evaluate(p, queries, qrels, ["dense", "bm25", "hybrid"])["retrievers"]
                   for name, p in pipelines.items()}
        for combo in ("dense", "bm25", "hybrid"):
            assert abs(reports["milvus"][combo]["ndcg@10"] - reports["local"][combo]["ndcg@10"]) <= 0.01, combo
        # every list above came from the server: a failed search would have fallen back to the local files unseen
        assert pipelines["milvus"].vector_store.failures == 0
        answer = pipelines["milvus"].query(judged[0], 5, ["hybrid"])
        assert answer.sources and {s.name for s in answer.stages} >= {"retrieve_dense", "retrieve_bm25"}
    finally:
        for p in pipelines.values():
            p.close()


def test_each_ingest_publishes_a_new_collection_and_drops_those_of_pruned_generations(
        milvus, milvus_index, scifact_subset, settings, embedder, tmp_path):
    from kept_vectors import kept_ingest

    index = tmp_path / "index"
    served = on_milvus(settings, milvus.uri)
    tag = index_tag("ragheat", index)
    store = MilvusStore(served.vector_store)
    try:
        collections = []
        for k1 in (1.2, 1.3, 1.4):  # a new fingerprint each time, the same passages (their vectors kept)
            kept_ingest("scifact-subset-milvus", scifact_subset, index,
                        served.model_copy(update={"retrieval": served.retrieval.model_copy(update={"bm25_k1": k1})}),
                        embedder)
            collections.append(read_manifest(index)["vector_store"]["collection"])
            # the served generation and the one kept before it for rollback, nothing older
            assert store.collections(tag) == sorted(collections[-2:])
        assert len(set(collections)) == 3
        # another index's collections on the same server are not this index's to prune
        other = read_manifest(milvus_index)["vector_store"]["collection"]
        assert store.collections(index_tag("ragheat", milvus_index)) == [other]
        # a collection gone from the server: the index cannot be served from it, and the error says what to do
        store.drop(collections[-1])
        with pytest.raises(IndexLoadError, match="has no collection .*ingest it again"):
            from rag.pipeline import RagPipeline

            RagPipeline(served, index).warm_up()
    finally:
        store.close()


def test_after_a_switch_back_to_local_the_collections_go_with_their_generations(
        milvus, scifact_subset, settings, embedder, tmp_path):
    """The server's collections belong to generations: a local generation published after them keeps the one it may
    roll back to, and its next ingest drops that collection with the generation, though it publishes nothing there."""
    from kept_vectors import kept_ingest

    index = tmp_path / "index"
    served = on_milvus(settings, milvus.uri)
    store = MilvusStore(served.vector_store)

    def ingest_with(chosen: RagheatSettings, k1: float) -> dict:
        kept_ingest("scifact-subset-milvus", scifact_subset, index,
                    chosen.model_copy(update={"retrieval": chosen.retrieval.model_copy(update={"bm25_k1": k1})}),
                    embedder)
        return read_manifest(index)

    try:
        on_server = ingest_with(served, 1.2)["vector_store"]["collection"]
        assert ingest_with(local(served), 1.3)["vector_store"] is None
        assert store.collections(index_tag("ragheat", index)) == [on_server]  # the generation kept for rollback
        ingest_with(local(served), 1.4)
        assert store.collections(index_tag("ragheat", index)) == []
    finally:
        store.close()


def test_serving_an_index_never_published_to_milvus_says_how(milvus, subset_index, settings):
    from rag.pipeline import RagPipeline

    with pytest.raises(IndexLoadError, match="RAGHEAT_VECTOR_STORE__BACKEND=milvus"):
        RagPipeline(on_milvus(settings, milvus.uri), subset_index).warm_up()


def test_a_server_that_is_down_fails_the_ingest_and_keeps_the_served_generation(
        milvus_index, settings, embedder, tmp_path):
    import os

    from rag.childproc import free_port
    from rag.index.store import CURRENT, GENERATIONS, link_files, resolve_generation
    from rag.ingest.pipeline import ingest

    index, generation = tmp_path / "index", resolve_generation(milvus_index)
    link_files(generation, index / GENERATIONS / generation.name)
    os.symlink(Path(GENERATIONS) / generation.name, index / CURRENT)
    before = read_manifest(index)["generation"]
    nowhere = on_milvus(settings, f"http://127.0.0.1:{free_port()}", collection_prefix="elsewhere", timeout_ms=500)
    with pytest.raises(IngestError, match="publishing the passages to Milvus failed.*served generation is unchanged"):
        ingest(str(Path(read_manifest(index)["corpus"]["location"])), index, nowhere, embedder=embedder)
    assert read_manifest(index)["generation"] == before


def test_an_ivfpq_index_is_not_given_to_milvus(settings, embedder, scifact_subset, tmp_path):
    from rag.ingest.pipeline import ingest

    chosen = on_milvus(settings, "http://127.0.0.1:19530")
    chosen = chosen.model_copy(update={"index": chosen.index.model_copy(update={"kind": "ivfpq"})})
    with pytest.raises(ConfigurationError, match="index.kind=ivfpq"):  # before anything is embedded
        ingest(str(scifact_subset), tmp_path / "index", chosen, embedder=embedder)
    assert not (tmp_path / "index").exists()


def test_the_vector_store_settings_refuse_what_cannot_be_a_server():
    from pydantic import ValidationError

    for bad in ({"uri": "bolt://127.0.0.1:7687"}, {"collection_prefix": "has-dash"}, {"timeout_ms": 0}):
        with pytest.raises(ValidationError):
            RagheatSettings(vector_store=bad)


def test_while_the_server_is_down_the_generations_own_files_answer_and_milvus_is_asked_again(
        settings, embedder, scifact_subset, tmp_path):
    """A dead server costs one failed search, not one per request: the answers come from the generation's files
    (the same passages), the description /readyz shows says so, and once it is back the searches go to it again."""
    import json
    import shutil
    import time

    from kept_vectors import kept_ingest
    from rag.index.milvus import RETRY_AFTER_S
    from rag.pipeline import RagPipeline
    from stack.milvus_lite import MilvusLiteServer

    # A server of its own (the module's keeps serving the other tests), holding a copy of the collection's data.
    own = MilvusLiteServer(tmp_path / "milvus").start()
    served = on_milvus(settings, own.uri, timeout_ms=1000)
    texts = [json.loads(line)["text"] for line in (scifact_subset / "queries.jsonl").read_text().splitlines()][:5]
    index = tmp_path / "index"
    pipeline = local_answers = None
    try:
        kept_ingest("scifact-subset-milvus", scifact_subset, index, served, embedder)
        pipeline = RagPipeline(served, index)
        pipeline.warm_up()
        local_answers = RagPipeline(local(served), index)
        local_answers.warm_up()
        expected = {t: [s.chunk.chunk_id for s in local_answers.query(t, 5, ["hybrid"]).sources] for t in texts}
        assert pipeline.describe().vector_store["down"] is False
        own.stop()
        started = time.perf_counter()
        for text in texts:  # answered, from the generation's own files, the same passages
            assert [s.chunk.chunk_id for s in pipeline.query(text, 5, ["hybrid"]).sources] == expected[text]
        # one search waited for the dead server; the rest were answered at once
        assert time.perf_counter() - started < served.vector_store.timeout_ms / 1000 + 2.0
        described = pipeline.describe().vector_store
        assert described["down"] and described["failed_searches"] >= 1
        own.start()  # the same data folder and port: the collection is back
        deadline = time.monotonic() + sum(RETRY_AFTER_S) + 10
        while pipeline.describe().vector_store["down"] and time.monotonic() < deadline:
            pipeline.query(texts[0], 5, ["hybrid"])
            time.sleep(0.2)
        assert not pipeline.describe().vector_store["down"]
        assert [s.chunk.chunk_id for s in pipeline.query(texts[1], 5, ["hybrid"]).sources] == expected[texts[1]]
    finally:
        for p in (pipeline, local_answers):
            if p is not None:
                p.close()
        own.stop()
        shutil.rmtree(tmp_path / "milvus", ignore_errors=True)


# -- a server that cannot be reached when the service starts -------------------------------------------------------

@pytest.fixture
def stopped_server(settings, embedder, scifact_subset, tmp_path, monkeypatch):
    """A server of its own holding a freshly ingested index's collection, then stopped: (server, settings on it, the
    index, five queries, each query's sources from the generation's own files). Asked again soon after a failure,
    so the tests wait fractions of a second for a probe."""
    import json

    from kept_vectors import kept_ingest
    from rag.index import milvus as milvus_module
    from rag.pipeline import RagPipeline
    from stack.milvus_lite import MilvusLiteServer

    monkeypatch.setattr(milvus_module, "RETRY_AFTER_S", (0.1, 0.2))
    own = MilvusLiteServer(tmp_path / "milvus").start()
    served = on_milvus(settings, own.uri, timeout_ms=1000)
    index = tmp_path / "index"
    texts = [json.loads(line)["text"] for line in (scifact_subset / "queries.jsonl").read_text().splitlines()][:5]
    try:
        kept_ingest("scifact-subset-milvus", scifact_subset, index, served, embedder)
        files = RagPipeline(local(served), index)
        try:
            files.warm_up()
            expected = {t: [s.chunk.chunk_id for s in files.query(t, 5, ["hybrid"]).sources] for t in texts}
        finally:
            files.close()
        own.stop()
        yield own, served, index, texts, expected
    finally:
        own.stop()


def spy_on_searches(pipeline, monkeypatch) -> tuple[list[str], list[str]]:
    """(the store's searches that answered, the generation's files' searches), each appended as it runs."""
    reached, fell_back = [], []
    store = pipeline.vector_store
    for name in ("dense_search", "bm25_search"):
        def answered(*args, _search=getattr(store, name), _name=name, **kwargs):
            found = _search(*args, **kwargs)
            reached.append(_name)
            return found
        monkeypatch.setattr(store, name, answered)
    for name in ("dense", "bm25"):
        fallback = pipeline.retrievers[name].fallback
        def searched(*args, _retrieve=fallback.retrieve, _name=name, **kwargs):
            fell_back.append(_name)
            return _retrieve(*args, **kwargs)
        monkeypatch.setattr(fallback, "retrieve", searched)
    return reached, fell_back


def sources(pipeline, text: str) -> list[int]:
    return [s.chunk.chunk_id for s in pipeline.query(text, 5, ["hybrid"]).sources]


def test_a_server_unreachable_at_start_up_leaves_the_files_answering_until_it_comes_back(
        stopped_server, monkeypatch, caplog):
    """The service starts with the server down: ready, its answers from the generation's own files, /readyz saying
    so, a warning naming the server. Once the server is up, the first search that reaches it checks the collection
    and loads it, and from then on the searches are the server's."""
    import logging
    import time

    import httpx

    from rag.api.app import create_app
    from rag.pipeline import RagPipeline
    from stack.servers import BackgroundServer

    own, served, index, texts, expected = stopped_server
    pipeline = RagPipeline(served, index)
    with caplog.at_level(logging.WARNING, logger="ragheat.vector_store"), \
            BackgroundServer(create_app(served, pipeline=pipeline)) as url, httpx.Client(base_url=url) as client:
        collection = read_manifest(index)["vector_store"]["collection"]
        assert f"the Milvus server at {own.uri} cannot be reached" in caplog.text
        assert f"its collection {collection} checked then" in caplog.text
        described = client.get("/readyz").json()["vector_store"]
        assert described == {"backend": "milvus", "collection": collection, "fallback": "files", "down": True,
                             "down_because": "unreachable", "failed_searches": 0}
        reached, fell_back = spy_on_searches(pipeline, monkeypatch)
        for text in texts:  # the same passages, from the files
            assert sources(pipeline, text) == expected[text]
        assert not reached and len(fell_back) == 2 * len(texts)
        assert pipeline.describe().vector_store["down"]
        own.start()  # the same data folder and port: the collection is back
        deadline = time.monotonic() + 30
        while pipeline.describe().vector_store["down"] and time.monotonic() < deadline:
            sources(pipeline, texts[0])
            time.sleep(0.05)
        described = client.get("/readyz").json()["vector_store"]
        assert described["down"] is False and described["down_because"] is None, described
        assert "answers again" in caplog.text
        failures, reached[:], fell_back[:] = described["failed_searches"], [], []
        for text in texts:
            assert sources(pipeline, text) == expected[text]
        assert sorted(reached) == sorted(["dense_search", "bm25_search"] * len(texts)) and not fell_back
        assert pipeline.vector_store.failures == failures


def test_without_a_fallback_the_indexes_stay_on_disk_and_a_down_server_degrades_the_answer(stopped_server):
    """``vector_store.fallback=none``: the service holds no FAISS or BM25 index of its own (that memory moves to
    Milvus). While the server is down the dense and BM25 stages are skipped and the answer says it is degraded and
    why (200 over HTTP, never a 500); once the server is back, its answers are the same passages as the files'."""
    import time

    import httpx

    from rag.api.app import create_app
    from rag.pipeline import RagPipeline
    from stack.servers import BackgroundServer

    own, served, index, texts, expected = stopped_server
    bare = served.model_copy(update={"vector_store": served.vector_store.model_copy(update={"fallback": "none"})})
    pipeline = RagPipeline(bare, index)
    with BackgroundServer(create_app(bare, pipeline=pipeline)) as url, httpx.Client(base_url=url) as client:
        assert pipeline.index.faiss_index is None and pipeline.index.bm25 is None
        assert [r.fallback for r in pipeline.retrievers.values()] == [None, None]
        described = client.get("/readyz").json()["vector_store"]
        assert described["fallback"] == "none" and described["down"], described
        response = client.post("/v1/query", json={"query": texts[0], "retrievers": ["hybrid"]})
        assert response.status_code == 200, response.text
        body = response.json()
        skipped = {s["stage"]: s["reason"] for s in body["skipped_stages"]}
        assert body["degraded"] and {"retrieve_dense", "retrieve_bm25"} <= set(skipped), body
        assert own.uri in skipped["retrieve_dense"] or "Milvus" in skipped["retrieve_dense"], skipped
        assert not body["citations"]
        own.start()  # the same data folder and port: the collection is back
        deadline = time.monotonic() + 30
        while pipeline.describe().vector_store["down"] and time.monotonic() < deadline:
            pipeline.query(texts[0], 5, ["hybrid"])
            time.sleep(0.05)
        answered = pipeline.query(texts[1], 5, ["hybrid"])
        assert not answered.degraded and [s.chunk.chunk_id for s in answered.sources] == expected[texts[1]]


def test_a_server_back_without_the_collection_keeps_the_files_answering_and_says_why(
        stopped_server, tmp_path, monkeypatch, caplog):
    """A server that comes back without the generation's collection (a new data volume), or with another count of
    passages in it, is not trusted: each probe checks it again, the files go on answering, and the log and /readyz
    say why."""
    import logging
    import time

    from rag.pipeline import RagPipeline
    from stack.milvus_lite import MilvusLiteServer

    own, served, index, texts, expected = stopped_server
    collection = read_manifest(index)["vector_store"]["collection"]
    pipeline = RagPipeline(served, index)
    empty = MilvusLiteServer(tmp_path / "empty", port=own.port)
    try:
        pipeline.warm_up()  # down
        reached, fell_back = spy_on_searches(pipeline, monkeypatch)
        empty.start()  # the same address, no data

        def until_it_says(sentence: str) -> None:
            deadline = time.monotonic() + 30
            while sentence not in caplog.text and time.monotonic() < deadline:
                assert sources(pipeline, texts[0]) == expected[texts[0]]
                time.sleep(0.05)
            assert sentence in caplog.text
            failures = pipeline.vector_store.failures
            end = time.monotonic() + 15.0  # several probes: each finds it so again
            while pipeline.vector_store.failures < failures + 2 and time.monotonic() < end:
                for text in texts:
                    assert sources(pipeline, text) == expected[text]
                time.sleep(0.05)
            described = pipeline.describe().vector_store
            assert described["down"] and described["down_because"] == "collection", described
            assert described["failed_searches"] >= failures + 2
            assert not reached and fell_back

        with caplog.at_level(logging.WARNING, logger="ragheat.vector_store"):
            until_it_says(f"the Milvus server at {own.uri} has no collection {collection}; searching the "
                          f"generation's own files until it holds it")
            # a collection of that name with three passages, where the manifest says more
            store = MilvusStore(served.vector_store)
            try:
                vectors = np.eye(3, pipeline.index.faiss_index.d, dtype=np.float32)
                store.publish(collection, vectors, ["a", "b", "c"], served.index, served.retrieval)
            finally:
                store.close()
            until_it_says(f"the Milvus collection {collection} holds 3 passages, the manifest says "
                          f"{read_manifest(index)['counts']['chunks']}")
    finally:
        pipeline.close()
        empty.stop()
