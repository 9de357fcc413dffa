"""``ragheat ann-bench``: flat vs HNSW vs IVF-PQ on real embeddings — recall@10, QPS, P99, build, memory.

Each index is built by the same code the service uses (``rag.index.dense``). Recall@10 is measured
against exact inner-product search on the same vectors. Throughput and latency come from N threads each
searching one query at a time (FAISS releases the GIL; its OpenMP is pinned to one thread per search so
the threads, not OpenMP, provide the parallelism), as concurrent requests would.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass
from typing import Callable, Sequence

import faiss
import numpy as np

from rag.index import dense
from rag.settings import IndexSettings

HNSW_M = (16, 32, 64)
EF_SEARCH = (16, 32, 64, 128, 256)
NPROBE = (1, 4, 16, 64)
DEFAULT_SEARCH = {"hnsw": 128, "ivfpq": 16}  # the setting whose concurrency sweep is measured


@dataclass
class AnnPoint:
    """One index at one search setting on one data set: recall, single-searcher speed and the concurrency sweep."""

    dataset: str
    index: str  # e.g. "hnsw M=32"
    search: str  # e.g. "efSearch=128"
    vectors: int
    build_s: float
    memory_mb: float
    recall_at_10: float
    qps_1: float
    p99_ms_1: float
    concurrency: dict  # threads -> {"qps", "p50_ms", "p99_ms"}; only for the default search setting

    def to_json(self) -> dict:
        return asdict(self)


def exact_top_k(base: np.ndarray, queries: np.ndarray, k: int = 10) -> np.ndarray:
    """The true top ``k`` ids of each query by exact inner product (the recall reference)."""
    index = faiss.IndexFlatIP(base.shape[1])
    index.add(base)
    return index.search(queries, k)[1]


def recall_at_k(found: np.ndarray, truth: np.ndarray) -> float:
    """Mean share of each query's true top k found, order ignored."""
    k = truth.shape[1]
    return float(np.mean([len(set(f[:k]) & set(t)) / k for f, t in zip(found, truth)]))


def concurrent_search(index: faiss.Index, queries: np.ndarray, threads: int, seconds: float) -> dict:
    """``threads`` workers searching single queries for ``seconds``; QPS and latency percentiles."""
    latencies: list[list[float]] = [[] for _ in range(threads)]
    stop = time.perf_counter() + seconds

    def worker(w: int) -> None:
        i = w
        own = latencies[w]
        while time.perf_counter() < stop:
            q = queries[i % len(queries): i % len(queries) + 1]
            start = time.perf_counter()
            index.search(q, 10)
            own.append(time.perf_counter() - start)
            i += threads

    began = time.perf_counter()
    pool = [threading.Thread(target=worker, args=(w,)) for w in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    elapsed = time.perf_counter() - began
    flat = np.concatenate([np.asarray(x) for x in latencies if x]) * 1000
    return {"qps": len(flat) / elapsed, "p50_ms": float(np.percentile(flat, 50)),
            "p99_ms": float(np.percentile(flat, 99))}


def _set_search(index: faiss.Index, kind: str, value: int) -> None:
    settings = IndexSettings(kind=kind, hnsw_ef_search=value if kind == "hnsw" else 128,
                             ivf_nprobe=value if kind == "ivfpq" else 16)
    dense.apply_search_params(index, settings)


def index_configs(n: int, dim: int) -> list[tuple[str, dict, list[tuple[str, int]]]]:
    """(label, build params, [(search label, value)]) for every index compared."""
    configs = [("flat", dense.build_params(IndexSettings(kind="flat"), n, dim), [("exact", 0)])]
    for m in HNSW_M:
        params = dense.build_params(IndexSettings(kind="hnsw", hnsw_m=m), n, dim)
        configs.append((f"hnsw M={m}", params, [(f"efSearch={ef}", ef) for ef in EF_SEARCH]))
    ivf = dense.build_params(IndexSettings(kind="ivfpq"), n, dim)
    configs.append((f"ivfpq nlist={ivf['nlist']} m={ivf['m']}", ivf, [(f"nprobe={p}", p) for p in NPROBE
                                                                       if p <= ivf["nlist"]]))
    return configs


def run_ann_bench(dataset: str, base: np.ndarray, queries: np.ndarray, *, threads: Sequence[int],
                  seconds: float, report: Callable[[str], None] = print) -> list[AnnPoint]:
    """Build every index of ``index_configs`` over ``base`` and measure it with ``queries``; one line per point."""
    base = np.ascontiguousarray(base, dtype=np.float32)
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    truth = exact_top_k(base, queries)
    points: list[AnnPoint] = []
    previous_threads = faiss.omp_get_max_threads()
    for label, params, searches in index_configs(len(base), base.shape[1]):
        faiss.omp_set_num_threads(previous_threads)  # building may use every core
        start = time.perf_counter()
        index = dense.build_index(base, params)
        build_s = time.perf_counter() - start
        memory_mb = len(faiss.serialize_index(index)) / 2**20
        faiss.omp_set_num_threads(1)  # one core per search; the threads below are the concurrency
        kind = params["kind"]
        for search_label, value in searches:
            if kind != "flat":
                _set_search(index, kind, value)
            found = index.search(queries, 10)[1]
            single = concurrent_search(index, queries, 1, seconds)
            sweep = {}
            if kind == "flat" or value == DEFAULT_SEARCH.get(kind):
                sweep = {str(t): concurrent_search(index, queries, t, seconds) for t in threads}
            point = AnnPoint(dataset, label, search_label, len(base), round(build_s, 2), round(memory_mb, 2),
                             recall_at_k(found, truth), single["qps"], single["p99_ms"], sweep)
            points.append(point)
            report(f"{dataset:8} {label:26} {search_label:14} recall@10 {point.recall_at_10:.4f}  "
                   f"QPS@1 {point.qps_1:8.0f}  P99@1 {point.p99_ms_1:6.3f} ms")
    faiss.omp_set_num_threads(previous_threads)
    return points


def plot(points: Sequence[AnnPoint], out_dir) -> list:
    """recall-vs-QPS frontier and QPS-vs-P99 per index, one figure per data set for each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    for dataset in dict.fromkeys(p.dataset for p in points):
        mine = [p for p in points if p.dataset == dataset]
        fig, ax = plt.subplots(figsize=(8, 5))
        for label in dict.fromkeys(p.index for p in mine):
            series = [p for p in mine if p.index == label]
            ax.plot([p.recall_at_10 for p in series], [p.qps_1 for p in series], "o-", label=label)
        files.append(_finish(fig, ax, out_dir / f"ann_{dataset}_recall_qps.png", "recall@10 (against exact search)",
                             "queries/s, one searcher", f"{dataset}: recall vs throughput ({mine[0].vectors:,} vectors)"))

        fig, ax = plt.subplots(figsize=(8, 5))
        for p in mine:
            if p.concurrency:
                xs = [v["qps"] for v in p.concurrency.values()]
                ys = [v["p99_ms"] for v in p.concurrency.values()]
                ax.plot(xs, ys, "o-", label=f"{p.index} {p.search}")
                for threads, x, y in zip(p.concurrency, xs, ys):
                    ax.annotate(threads, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        files.append(_finish(fig, ax, out_dir / f"ann_{dataset}_qps_p99.png", "queries/s (labels: concurrent searchers)",
                             "P99 latency (ms)", f"{dataset}: throughput vs P99 under concurrency"))
    return files


def _finish(fig, ax, path, xlabel: str, ylabel: str, title: str):
    import matplotlib.pyplot as plt

    ax.set(xlabel=xlabel, ylabel=ylabel, title=title, yscale="log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
