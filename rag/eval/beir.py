"""BEIR data (queries.jsonl + qrels/<split>.tsv) and the standard retrieval metrics.

Metric definitions follow BEIR's use of trec_eval: nDCG@k with linear gains and a log2(rank+1)
discount against the ideal ordering of all judged-relevant documents; recall@k as the share of
relevant documents in the top k; MRR@k as the reciprocal rank of the first relevant one.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Mapping, Sequence

from rag.errors import IngestError

Qrels = dict[str, dict[str, int]]


def load_queries(folder: Path) -> dict[str, str]:
    """Query id -> text from a BEIR folder's ``queries.jsonl``."""
    path = Path(folder) / "queries.jsonl"
    if not path.is_file():
        raise IngestError(f"{path} does not exist: --beir must be a BEIR folder")
    queries = {}
    with open(path, encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, 1):
            if line.strip():
                try:
                    row = json.loads(line)
                    queries[str(row["_id"])] = row["text"]
                except (json.JSONDecodeError, KeyError) as exc:
                    raise IngestError(f"{path}:{line_no}: not a BEIR query row ({exc})") from exc
    return queries


def load_qrels(folder: Path, split: str) -> Qrels:
    """Query id -> {document id: relevance} from ``qrels/<split>.tsv``; a missing split names the ones there."""
    path = Path(folder) / "qrels" / f"{split}.tsv"
    if not path.is_file():
        available = sorted(p.stem for p in (Path(folder) / "qrels").glob("*.tsv"))
        raise IngestError(f"{path} does not exist; splits here: {', '.join(available) or 'none'}")
    qrels: Qrels = {}
    with open(path, encoding="utf-8", newline="") as fh:
        reader = csv.reader(fh, delimiter="\t")
        header = next(reader, None)
        if header and header[0] != "query-id":
            fh.seek(0)
            reader = csv.reader(fh, delimiter="\t")
        for row in reader:
            if len(row) >= 3:
                qrels.setdefault(row[0], {})[row[1]] = int(row[2])
    return qrels


def ndcg_at(ranked: Sequence[str], relevant: Mapping[str, int], k: int) -> float:
    """nDCG@k of one ranked list of document ids against graded relevance."""
    dcg = sum(relevant.get(doc, 0) / math.log2(i + 2) for i, doc in enumerate(ranked[:k]))
    ideal = sorted((g for g in relevant.values() if g > 0), reverse=True)[:k]
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    return dcg / idcg if idcg else 0.0


def recall_at(ranked: Sequence[str], relevant: Mapping[str, int], k: int) -> float:
    """Share of the relevant documents found in the top k."""
    positives = {doc for doc, g in relevant.items() if g > 0}
    return len(positives.intersection(ranked[:k])) / len(positives) if positives else 0.0


def mrr_at(ranked: Sequence[str], relevant: Mapping[str, int], k: int) -> float:
    """Reciprocal rank of the first relevant document within the top k (0 if none)."""
    for i, doc in enumerate(ranked[:k]):
        if relevant.get(doc, 0) > 0:
            return 1.0 / (i + 1)
    return 0.0


def score_run(run: Mapping[str, Sequence[str]], qrels: Qrels) -> dict[str, float]:
    """Mean metrics over the queries that have judgments; a query missing from ``run`` scores 0."""
    judged = [q for q, rel in qrels.items() if any(g > 0 for g in rel.values())]
    totals = {"ndcg@10": 0.0, "recall@10": 0.0, "recall@100": 0.0, "mrr@10": 0.0}
    for qid in judged:
        ranked, rel = run.get(qid, []), qrels[qid]
        totals["ndcg@10"] += ndcg_at(ranked, rel, 10)
        totals["recall@10"] += recall_at(ranked, rel, 10)
        totals["recall@100"] += recall_at(ranked, rel, 100)
        totals["mrr@10"] += mrr_at(ranked, rel, 10)
    return {name: value / len(judged) if judged else 0.0 for name, value in totals.items()}
