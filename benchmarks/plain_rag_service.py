"""A small RAG service that ragheat did not write, for measuring what observing it costs.

    RAGHEAT_OBSERVE=off|library [PLAIN_RAG_DOCUMENTS=3000] .venv/bin/python benchmarks/plain_rag_service.py PORT CORPUS.jsonl

Plain Python and numpy over the first documents of a BEIR corpus: a hashed bag-of-words "embedding", a dense
matrix-vector search, a BM25 over an inverted index, reciprocal-rank fusion and an extractive answer. With
``library`` the same code runs with ``ragheat.observe``'s middleware and one stage scope per step, as a user would
add them; with ``off`` it runs bare. Nothing else differs.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import zlib
from collections import Counter, defaultdict

import numpy as np
import uvicorn
from fastapi import FastAPI

DIMENSIONS, TOP_K = 384, 10
DOCUMENTS = int(os.environ.get("PLAIN_RAG_DOCUMENTS", "3000"))
WORD = re.compile(r"[a-z0-9]+")
OBSERVE = os.environ.get("RAGHEAT_OBSERVE", "off")
if OBSERVE not in ("off", "library"):
    raise SystemExit(f"RAGHEAT_OBSERVE must be off or library, got {OBSERVE!r}")

if OBSERVE == "library":
    import ragheat.observe as rh

    stage = rh.stage
else:
    def stage(name):
        return lambda function: function


def words(text: str) -> list[str]:
    return WORD.findall(text.lower())


def hashed_vector(tokens: list[str]) -> np.ndarray:
    vector = np.zeros(DIMENSIONS, dtype=np.float32)
    for token in tokens:
        vector[zlib.crc32(token.encode()) % DIMENSIONS] += 1.0
    norm = np.linalg.norm(vector)
    return vector / norm if norm else vector


class Corpus:
    def __init__(self, path: str) -> None:
        with open(path, encoding="utf-8") as lines:
            self.docs = [json.loads(line) for _, line in zip(range(DOCUMENTS), lines)]
        tokenised = [words(d.get("title", "") + " " + d["text"]) for d in self.docs]
        self.matrix = np.stack([hashed_vector(t) for t in tokenised])
        self.postings: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for i, tokens in enumerate(tokenised):
            for token, tf in Counter(tokens).items():
                self.postings[token].append((i, tf))
        self.lengths = np.array([len(t) for t in tokenised], dtype=np.float32)
        self.mean_length = float(self.lengths.mean())


corpus: Corpus | None = None
app = FastAPI()


@stage("embed")
def embed(query: str) -> np.ndarray:
    return hashed_vector(words(query))


@stage("retrieve_dense")
def dense_search(vector: np.ndarray) -> list[int]:
    scores = corpus.matrix @ vector
    return [int(i) for i in np.argsort(-scores)[:TOP_K]]


@stage("retrieve_bm25")
def bm25_search(query: str, k1: float = 1.2, b: float = 0.75) -> list[int]:
    scores: dict[int, float] = defaultdict(float)
    n = len(corpus.docs)
    for token in set(words(query)):
        postings = corpus.postings.get(token, ())
        idf = math.log(1 + (n - len(postings) + 0.5) / (len(postings) + 0.5))
        for doc, tf in postings:
            norm = tf + k1 * (1 - b + b * corpus.lengths[doc] / corpus.mean_length)
            scores[doc] += idf * tf * (k1 + 1) / norm
    return [doc for doc, _ in sorted(scores.items(), key=lambda item: -item[1])[:TOP_K]]


@stage("fuse")
def fuse(*lists: list[int], k: int = 60) -> list[int]:
    scores: dict[int, float] = defaultdict(float)
    for ranked in lists:
        for rank, doc in enumerate(ranked):
            scores[doc] += 1.0 / (k + rank + 1)
    return [doc for doc, _ in sorted(scores.items(), key=lambda item: -item[1])[:TOP_K]]


@stage("generate")
def extract_answer(docs: list[int]) -> str:
    return corpus.docs[docs[0]]["text"].split(". ")[0] if docs else ""


@app.post("/query")
def query(body: dict) -> dict:
    question = body["question"]
    docs = fuse(dense_search(embed(question)), bm25_search(question))
    return {"answer": extract_answer(docs), "documents": [corpus.docs[d]["_id"] for d in docs]}


if OBSERVE == "library":
    rh.instrument(app, rh.Observer(service="plain-rag", routes=("/query",)))


if __name__ == "__main__":
    port, path = int(sys.argv[1]), sys.argv[2]
    corpus = Corpus(path)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
