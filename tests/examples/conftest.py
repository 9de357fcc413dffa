"""Fixtures of tests/examples: the OTLP receiver form (i) exports to, and the claims the services are asked."""

from __future__ import annotations

import json

import pytest

from examples_live import DOCS, SCIFACT, Claim  # tests/examples/examples_live.py, beside this file
from stack.otlp_receiver import OtlpReceiver


@pytest.fixture(scope="session")
def otlp_receiver():
    receiver = OtlpReceiver()
    with receiver:
        yield receiver


@pytest.fixture(scope="session")
def claims() -> list[Claim]:
    """SciFact train claims whose relevant abstracts are all among the first DOCS indexed."""
    with open(SCIFACT / "corpus.jsonl", encoding="utf-8") as fh:
        indexed = {json.loads(line)["_id"] for _, line in zip(range(DOCS), fh)}
    relevant: dict[str, set[str]] = {}
    for line in (SCIFACT / "qrels" / "train.tsv").read_text().splitlines()[1:]:
        query_id, doc_id = line.split("\t")[:2]
        relevant.setdefault(query_id, set()).add(doc_id)
    texts = {row["_id"]: row["text"] for row in map(json.loads, (SCIFACT / "queries.jsonl").read_text().splitlines())}
    return [Claim(texts[q], frozenset(docs)) for q, docs in sorted(relevant.items(), key=lambda kv: int(kv[0]))
            if docs <= indexed and q in texts]
