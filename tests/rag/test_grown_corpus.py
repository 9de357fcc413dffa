"""The growth benchmark's larger corpora (benchmarks/bench_growth.py): grown from a real index, they must be whole
indexes the service loads, keep every real chunk as it is, and give each grown chunk its source's shape."""

from __future__ import annotations

import numpy as np

from benchmarks.bench_growth import NOISE_COSINE, grow, link_generation
from rag.index import dense
from rag.index.store import load_index, read_manifest, resolve_generation
from rag.rerank.reranker import load_reranker
from rag.settings import IndexSettings


def test_a_grown_corpus_is_a_whole_index_that_keeps_the_real_chunks(subset_index, tmp_path):
    real = load_index(subset_index, IndexSettings())
    n_real = len(real.chunks)
    size = n_real + 200
    index, timings = grow(subset_index, size, tmp_path / "growth", seed=1)
    assert set(timings) == {"text", "dense", "bm25", "rerank_tokens"}
    grown = load_index(index, IndexSettings())  # every part present and counted alike
    manifest = grown.manifest
    assert manifest["counts"]["chunks"] == size and manifest["graph"] is None
    assert [c.text for c in grown.chunks[:n_real]] == [c.text for c in real.chunks]
    assert all(c.doc_id.startswith("grown-") for c in grown.chunks[n_real:])

    real_vectors = real.faiss_index.reconstruct_n(0, n_real)
    vectors = grown.faiss_index.reconstruct_n(0, size)
    np.testing.assert_allclose(vectors[:n_real], real_vectors, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(vectors[n_real:], axis=1), 1.0, atol=1e-4)
    best = (vectors[n_real:] @ real_vectors.T).max(axis=1)  # each grown vector is near its source, not on it
    assert np.median(best) > NOISE_COSINE - 0.05 and best.max() < 0.999

    reranker = load_reranker(resolve_generation(index), manifest)  # the token store loads and matches the index
    real_reranker = load_reranker(resolve_generation(subset_index), real.manifest)
    assert len(reranker.vectors) == size and manifest["rerank"]["tokens"] == int(reranker.vectors.offsets[-1])
    ids = [0, n_real // 2, n_real - 1]
    np.testing.assert_array_equal(reranker.vectors.gather(ids)[0], real_reranker.vectors.gather(ids)[0])

    again, _ = grow(subset_index, size, tmp_path / "growth", seed=1)  # kept, not rebuilt
    assert again == index and read_manifest(again)["generation"] == manifest["generation"]


def test_a_linked_generation_is_published_without_copying_its_files(subset_index, tmp_path):
    index = tmp_path / "linked"
    first = link_generation(subset_index, index)
    second = link_generation(index, index)
    assert first != second and read_manifest(index)["generation"] == second
    served = resolve_generation(index) / dense.DENSE_FILE
    assert served.stat().st_nlink >= 3  # the real index's file, and both linked generations'
    assert read_manifest(index)["counts"] == read_manifest(subset_index)["counts"]
