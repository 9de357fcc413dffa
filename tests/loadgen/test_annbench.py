"""ann-bench maths and mechanics on real embeddings (the SciFact subset index)."""

from __future__ import annotations

import numpy as np
import pytest

from loadgen import annbench


@pytest.fixture(scope="module")
def vectors(pipeline):
    index = pipeline.index.faiss_index
    base = index.reconstruct_n(0, index.ntotal)
    queries = np.stack([pipeline.embedder.embed_query(q).vector for q in
                        ["vitamin D and bone density", "aspirin and heart attacks", "gene expression in cancer",
                         "antibiotic resistance", "sleep and memory", "obesity and diabetes risk"] * 5])
    return base, queries


def test_recall_and_exact_search(vectors):
    base, queries = vectors
    truth = annbench.exact_top_k(base, queries)
    brute = np.argsort(-(queries @ base.T), axis=1)[:, :10]
    assert annbench.recall_at_k(brute, truth) > 0.99  # ties aside, FAISS's exact search is exact
    assert annbench.recall_at_k(truth[:, ::-1], truth) == 1.0  # order inside the top 10 does not matter
    assert annbench.recall_at_k(np.full_like(truth, -1), truth) == 0.0


def test_run_ann_bench_covers_every_index_and_orders_recall(vectors):
    base, queries = vectors
    lines = []
    points = annbench.run_ann_bench("subset", base, queries, threads=[1, 2], seconds=0.2, report=lines.append)
    labels = {p.index for p in points}
    assert "flat" in labels and {f"hnsw M={m}" for m in annbench.HNSW_M} <= labels
    assert any(label.startswith("ivfpq") for label in labels)
    flat = next(p for p in points if p.index == "flat")
    assert flat.recall_at_10 == pytest.approx(1.0) and set(flat.concurrency) == {"1", "2"}
    hnsw = [p for p in points if p.index == "hnsw M=32"]
    assert hnsw[-1].recall_at_10 >= hnsw[0].recall_at_10  # more efSearch never finds less
    ivf = [p for p in points if p.index.startswith("ivfpq")]
    assert max(p.recall_at_10 for p in ivf) < 1.0  # product quantisation is lossy
    assert all(p.qps_1 > 0 and p.p99_ms_1 > 0 and p.memory_mb > 0 for p in points)
    assert len(lines) == len(points)
