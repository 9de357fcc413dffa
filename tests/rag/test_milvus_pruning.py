"""Which Milvus servers an ingest prunes, and with which credentials (rag/ingest/pipeline.py): every server a
generation on disk was published to, the configured one with its token, the others with none, and a server that could
not be reached kept for the next ingest. The pruning itself against a real server: tests/rag/test_milvus_store.py."""

from __future__ import annotations

import json

import pytest
from pydantic import SecretStr

import rag.ingest.pipeline as pipeline
from rag.index.milvus import VectorStoreUnavailable
from rag.index.store import GENERATIONS, MANIFEST
from rag.settings import RagheatSettings


def generation(index, name: str, uri: str | None) -> None:
    folder = index / GENERATIONS / name
    folder.mkdir(parents=True)
    block = None if uri is None else {"backend": "milvus", "uri": uri, "collection": f"c_{name}"}
    (folder / MANIFEST).write_text(json.dumps({"vector_store": block}))


@pytest.fixture
def reached(monkeypatch):
    """Each prune's (server, token); a server in ``down`` fails as unreachable."""
    calls, down = [], set()

    def prune(settings, index_dir, keep):
        calls.append((settings.uri, settings.token.get_secret_value()))
        if settings.uri in down:
            raise VectorStoreUnavailable(f"the Milvus server at {settings.uri} cannot be reached")
        return []

    monkeypatch.setattr(pipeline, "prune_collections", prune)
    return calls, down


def on(uri: str, token: str = "") -> RagheatSettings:
    s = RagheatSettings()
    return s.model_copy(update={"graph": s.graph.model_copy(update={"enabled": False}),
                                "vector_store": s.vector_store.model_copy(update={"backend": "milvus", "uri": uri,
                                                                                  "token": SecretStr(token)})})


def local() -> RagheatSettings:
    s = RagheatSettings()
    return s.model_copy(update={"graph": s.graph.model_copy(update={"enabled": False})})


def test_every_server_a_generation_names_is_pruned_the_configured_one_with_its_token(tmp_path, reached):
    calls, _ = reached
    index = tmp_path / "index"
    generation(index, "g1", "http://old:19530")
    generation(index, "g2", "http://new:19530")  # manifests record a server without credentials
    servers = pipeline._milvus_servers(index)
    pipeline._prune_stores(on("http://user:pw@new:19530", "secret"), index, index / GENERATIONS / "g2", servers)
    assert sorted(calls) == [("http://old:19530", ""), ("http://user:pw@new:19530", "secret")]


def test_a_server_down_is_pruned_by_the_next_ingest_after_its_generations_are_gone(tmp_path, reached):
    calls, down = reached
    index = tmp_path / "index"
    generation(index, "g1", "http://old:19530")
    down.add("http://old:19530")
    servers = pipeline._milvus_servers(index)
    (index / GENERATIONS / "g1" / MANIFEST).unlink()  # pruned from the folder by the publish before the stores
    (index / GENERATIONS / "g1").rmdir()
    generation(index, "g2", None)
    pipeline._prune_stores(local(), index, index / GENERATIONS / "g2", servers)
    assert json.loads((index / pipeline.PENDING_SERVERS).read_text()) == ["http://old:19530"]
    down.clear()
    calls.clear()
    pipeline._prune_stores(local(), index, index / GENERATIONS / "g2", pipeline._milvus_servers(index))
    assert calls == [("http://old:19530", "")]
    assert not (index / pipeline.PENDING_SERVERS).exists()


def test_a_local_index_never_published_prunes_nothing(tmp_path, reached):
    calls, _ = reached
    index = tmp_path / "index"
    generation(index, "g1", None)
    pipeline._prune_stores(local(), index, index / GENERATIONS / "g1", pipeline._milvus_servers(index))
    assert calls == [] and not (index / pipeline.PENDING_SERVERS).exists()
