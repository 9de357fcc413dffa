"""BM25 over chunks with ``bm25s`` (scores precomputed into a sparse matrix at index time)."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import bm25s
import numpy as np

BM25_DIR = "bm25"
IDF_FILE = "idf.json"


def build_bm25(token_lists: list[list[str]], k1: float, b: float) -> tuple[bm25s.BM25, dict[str, float]]:
    """Index ``token_lists`` (one list per chunk) and return the index and each term's IDF."""
    # bm25s cannot index an empty list of tokens meaningfully; a placeholder keeps row ids aligned.
    safe = [tokens if tokens else [""] for tokens in token_lists]
    model = bm25s.BM25(k1=k1, b=b, method="lucene")
    model.index(safe, show_progress=False)
    df = Counter(term for tokens in token_lists for term in set(tokens))
    n = len(token_lists)
    idf = {term: math.log(1.0 + (n - count + 0.5) / (count + 0.5)) for term, count in df.items()}
    return model, idf


def save_bm25(model: bm25s.BM25, idf: dict[str, float], folder: Path) -> None:
    """Write the BM25 model and its IDF table into the generation ``folder``."""
    model.save(str(folder / BM25_DIR), show_progress=False)
    (folder / IDF_FILE).write_text(json.dumps(idf, ensure_ascii=False))


def load_bm25(folder: Path) -> tuple[bm25s.BM25, dict[str, float]]:
    """The BM25 model and IDF table saved in ``folder``."""
    model = bm25s.BM25.load(str(folder / BM25_DIR), mmap=False, show_progress=False, verbosity=0)
    return model, load_idf(folder)


def load_idf(folder: Path) -> dict[str, float]:
    """The IDF table saved in ``folder`` (the generator's and the support check's term weights)."""
    return json.loads((folder / IDF_FILE).read_text())


def bm25_top_k(model: bm25s.BM25, tokens: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
    """Chunk ids and scores of the ``k`` best chunks; empty when no query term is in the vocabulary."""
    ids = model.get_tokens_ids(tokens)
    if not ids:
        return np.zeros(0, np.int64), np.zeros(0, np.float32)
    scores = model.get_scores_from_ids(ids)
    k = min(k, scores.shape[0])
    top = np.argpartition(-scores, k - 1)[:k]
    top = top[np.argsort(-scores[top], kind="stable")]
    top = top[scores[top] > 0]
    return top, scores[top]


def bm25_size(model: bm25s.BM25) -> int:
    """How many documents (chunks) the BM25 model holds."""
    return int(model.scores["num_docs"])
