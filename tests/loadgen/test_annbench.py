"""ann-bench maths and mechanics on real embeddings (the SciFact subset index, its own claims as queries)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from loadgen import annbench

MIB = 2 ** 20


@pytest.fixture(scope="module")
def vectors(pipeline, scifact_subset):
    index = pipeline.index.faiss_index
    base = index.reconstruct_n(0, index.ntotal)
    with open(scifact_subset / "queries.jsonl", encoding="utf-8") as fh:
        claims = [json.loads(line)["text"] for line in fh if line.strip()]
    assert len(claims) >= 20, len(claims)
    queries = np.stack([pipeline.embedder.embed_query(q).vector for q in claims])
    return base, queries


@pytest.fixture(scope="module")
def bench(vectors):
    base, queries = vectors
    lines: list[str] = []
    points = annbench.run_ann_bench("subset", base, queries, threads=[1, 2], seconds=0.2, report=lines.append)
    return points, lines


def test_recall_and_exact_search(vectors):
    base, queries = vectors
    truth = annbench.exact_top_k(base, queries)
    brute = np.argsort(-(queries @ base.T), axis=1)[:, :10]
    assert annbench.recall_at_k(brute, truth) > 0.99  # ties aside, FAISS's exact search is exact
    assert annbench.recall_at_k(truth[:, ::-1], truth) == 1.0  # order inside the top 10 does not matter
    assert annbench.recall_at_k(np.full_like(truth, -1), truth) == 0.0
    half = truth.copy()
    half[:, 5:] = -1
    assert annbench.recall_at_k(half, truth) == 0.5


def test_every_index_and_search_setting_is_measured(bench, vectors):
    points, lines = bench
    n = len(vectors[0])
    nlist = min(int(4 * np.sqrt(n)), n // 39)  # README: nlist=0 picks about 4*sqrt(N), >= 39 vectors a list
    expected = [("flat", "exact")]
    expected += [(f"hnsw M={m}", f"efSearch={ef}") for m in (16, 32, 64) for ef in (16, 32, 64, 128, 256)]
    expected += [(f"ivfpq nlist={nlist} m=48", f"nprobe={p}") for p in (1, 4, 16, 64) if p <= nlist]
    assert [(p.index, p.search) for p in points] == expected
    assert all(p.vectors == n and p.dataset == "subset" for p in points)
    # The concurrency sweep runs at the default search setting only (flat, efSearch=128, nprobe=16; an index
    # with fewer than 16 lists, as a few hundred vectors give, never reaches nprobe=16 and is not swept).
    swept = {(p.index, p.search) for p in points if p.concurrency}
    assert swept == {("flat", "exact"), *((f"hnsw M={m}", "efSearch=128") for m in (16, 32, 64)),
                     *([(f"ivfpq nlist={nlist} m=48", "nprobe=16")] if nlist >= 16 else [])}
    assert all(set(p.concurrency) == {"1", "2"} for p in points if p.concurrency)
    assert len(lines) == len(points)
    assert all(f"recall@10 {p.recall_at_10:.4f}" in line and p.index in line for p, line in zip(points, lines))


def test_recall_follows_the_search_effort(bench):
    points, _ = bench
    flat = next(p for p in points if p.index == "flat")
    assert flat.recall_at_10 == pytest.approx(1.0)
    for m in (16, 32, 64):
        sweep = [p.recall_at_10 for p in points if p.index == f"hnsw M={m}"]
        assert sweep[-1] >= sweep[0], (m, sweep)  # more efSearch never finds less
        assert sweep[-1] >= 0.95, (m, sweep)  # efSearch=256 on a few hundred vectors is all but exact
    ivf = [p.recall_at_10 for p in points if p.index.startswith("ivfpq")]
    assert ivf[0] < ivf[-1], ivf  # probing more lists finds more
    assert 0.3 < ivf[-1] < 1.0, ivf  # product quantisation is lossy, but not noise


def test_memory_is_the_serialised_size_of_each_index(bench, vectors):
    points, _ = bench
    n, dim = vectors[0].shape
    raw = n * dim * 4  # float32 vectors
    by_label = {p.index: p.memory_mb * MIB for p in points}
    rounding = 0.005 * MIB  # memory_mb has two decimals
    assert raw - rounding <= by_label["flat"] <= raw + 8192 + rounding  # the vectors plus a header
    previous = by_label["flat"]
    for m in (16, 32, 64):  # vectors plus at least 2*M four-byte links a vector at level 0
        size = by_label[f"hnsw M={m}"]
        assert size >= raw + n * 2 * m * 4 - rounding, (m, size)
        assert size > previous, (m, size, previous)
        previous = size
    label, ivf = next((label, size) for label, size in by_label.items() if label.startswith("ivfpq"))
    nlist = int(label.split("nlist=")[1].split()[0])
    codebooks = 48 * 256 * (dim // 48) * 4  # m sub-quantisers x 256 centroids x dim/m floats
    # 48-byte codes (not 1,536 bytes of floats) and an 8-byte id a vector, plus the codebooks and list centroids.
    fixed = codebooks + nlist * dim * 4
    assert fixed + n * 48 - rounding <= ivf <= fixed + n * (48 + 8) + 16384 + rounding, (ivf, fixed, n)


def test_latency_and_throughput_agree(bench):
    """Checks that no unit or bookkeeping error survives: for one searcher, the mean latency cannot exceed the
    measured time per query (1000/QPS ms), so by Markov's inequality the median is at most twice that; with
    t searchers, t times that. And no FAISS search called from Python takes under half a microsecond."""
    points, _ = bench
    for p in points:
        assert p.qps_1 > 0 and 0.0005 <= p.p99_ms_1, p
        for threads, sweep in p.concurrency.items():
            per_query_ms = int(threads) * 1000 / sweep["qps"]
            assert 0.0005 <= sweep["p50_ms"] <= sweep["p99_ms"], (p.index, threads, sweep)
            assert sweep["p50_ms"] <= 2 * per_query_ms, (p.index, threads, sweep)
