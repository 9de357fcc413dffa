"""MaxSim, the late-interaction score: for each query token its best match among a document's tokens, averaged
over the query's tokens (ColBERT sums; the mean keeps scores comparable between short and long queries)."""

from __future__ import annotations

import numpy as np


def limit_blas_threads() -> None:
    """One BLAS thread for this process's numpy products (MaxSim's matrix product is the reranker's one).

    A served query runs on one worker thread beside others; a BLAS call that fans out across the cores only waits
    for them. Measured on SciFact, 50 candidates, 2 cores, a quiet machine: rerank stage P99 8.2 and 10.2 ms wall
    with OpenBLAS's default threads (this thread's CPU P99 4.2-4.7 ms: the rest was waiting), 5.0 ms with one
    (benchmarks/bench_rerank.py). Process-wide and permanent: the limit is a property of the BLAS library, and
    switching it per call would race between request threads."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1, user_api="blas")


def maxsim(query: np.ndarray, tokens: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Scores of the documents whose token vectors are ``tokens[starts[i]:starts[i+1]]`` (the last runs to the end).

    ``query`` (q, dim) and ``tokens`` (n, dim) are unit vectors; one matrix product, then a segmented max. Every
    document needs at least one token (each stored chunk has [CLS] and [SEP])."""
    if len(starts) == 0:
        return np.zeros(0, np.float32)
    # (n, q): each document's rows are contiguous, so the segmented max runs down whole rows.
    sims = np.asarray(tokens, np.float32) @ np.asarray(query, np.float32).T
    best = np.maximum.reduceat(sims, np.asarray(starts, np.intp), axis=0)  # (docs, q)
    return best.mean(axis=1)
