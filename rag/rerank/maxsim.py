"""MaxSim, the late-interaction score: for each query token its best match among a document's tokens, averaged
over the query's tokens (ColBERT sums; the mean keeps scores comparable between short and long queries)."""

from __future__ import annotations

import numpy as np


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
