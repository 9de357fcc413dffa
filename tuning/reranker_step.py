"""Step 2: the reranker's head trained on step 1's labels, kept only when it wins on queries it was not trained on.

The labelled queries are split once (seeded) into a training part and a held-out part; a head is trained on the
first (hard negatives from the service's own hybrid retrieval, as ``ragheat train-reranker``), and the held-out
queries are ranked by it and by the head the service runs now. It is kept when its mean nDCG@10 there beats the
current head's by more than one standard error of the paired per-query differences: a smaller gain is within what
another split would undo. A kept head needs the index's token vectors projected by it: the index is ingested anew
with it (chunks and dense vectors unchanged)."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Callable, Mapping

from rag.eval.beir import Qrels
from rag.rerank.head import DEFAULT_HEAD, RerankHead

HELD_OUT_SHARE = 0.25
MIN_HELD_OUT = 8


def split_queries(qids, share: float, seed: int) -> tuple[set[str], set[str]]:
    """(training, held-out) query ids: ``share`` of them held out, at least ``MIN_HELD_OUT`` when there are enough."""
    ordered = sorted(qids)
    random.Random(seed).shuffle(ordered)
    held = max(MIN_HELD_OUT, int(round(len(ordered) * share))) if len(ordered) >= 2 * MIN_HELD_OUT else \
        max(1, len(ordered) // 3)
    return set(ordered[held:]), set(ordered[:held])


def trained_on_these(head: RerankHead, corpus_sha256: str, split: str | None) -> bool:
    """Whether ``head`` was trained on this corpus's ``split`` labels (its metadata says where it learned): then the
    questions held out here were not held out from it."""
    data = head.meta.get("data") or {}
    return data.get("corpus_sha256") == corpus_sha256 and split is not None and data.get("split") == split


def train_head(pipeline, queries: Mapping[str, str], qrels: Qrels, *, current_head: Path | None, out_path: Path,
               held_out: frozenset[str] | None = None, split: str | None = None, candidates: int = 50,
               epochs: int = 6, distill: float = 0.1, seed: int = 0,
               log: Callable[[str], None] | None = None, advance: Callable[[], None] | None = None) -> dict:
    """Train, compare on the held-out queries (``held_out``, else a seeded share), and write the head to ``out_path``
    when it wins; the comparison."""
    from rag.ingest.pipeline import passage_text
    from rag.rerank.train import RawTokens, collect_examples, fit_head, ndcg_table, score_examples

    labelled = {q: t for q, t in queries.items() if q in qrels and any(g > 0 for g in qrels[q].values())}
    if len(labelled) < 3:
        return {"kept": False, "reason": f"only {len(labelled)} queries with a relevant document: too few to train "
                                         "and check a head"}
    examples = collect_examples(pipeline, labelled, qrels, candidates, advance=advance)
    needed = {int(i) for ex in examples for i in ex.ids}
    chunks = pipeline.index.chunks
    raw = RawTokens.encode(pipeline.embedder, [passage_text(c) for c in chunks], needed)
    qids = [ex.qid for ex in examples]
    if held_out is None:
        train_ids, held_ids = split_queries(qids, HELD_OUT_SHARE, seed)
    else:
        held_ids = set(qids) & set(held_out)
        train_ids = set(qids) - held_ids
    train = [ex for ex in examples if ex.qid in train_ids]
    held = [ex for ex in examples if ex.qid in held_ids]
    if not any(ex.labels.max() > 0 for ex in train):
        return {"kept": False, "reason": "no training query has a relevant document among its candidates"}
    head = fit_head(train, raw, epochs=epochs, distill=distill, seed=seed, log=log)
    current = RerankHead.load(current_head or DEFAULT_HEAD)
    fused = ndcg_table(held, qrels)
    before = ndcg_table(held, qrels, score_examples(current, held, raw))
    after = ndcg_table(held, qrels, score_examples(head, held, raw))
    gain = after - before
    se = float(gain.std(ddof=1) / math.sqrt(len(gain))) if len(gain) > 1 else float("inf")
    kept = bool(gain.mean() > se)
    result = {"train_queries": len(train), "held_out_queries": len(held), "candidates": candidates, "seed": seed,
              "held_out_ndcg@10": {"fused": float(fused.mean()), "current_head": float(before.mean()),
                                   "trained_head": float(after.mean())},
              "gain": float(gain.mean()), "gain_standard_error": se, "kept": kept,
              "current_head": str(current_head or DEFAULT_HEAD),
              "current_head_trained_on_these": trained_on_these(
                  current, pipeline.index.manifest["corpus"]["content_sha256"], split)}
    if kept:
        meta = {**head.meta, "trained_by": "ragheat tune", "train_queries": sorted(train_ids), "seed": seed}
        type(head)(head.projection, head.weights, head.bias, head.mean, head.std, meta).save(out_path)
        result["head"] = str(out_path)
        result["reason"] = (f"kept: held-out nDCG@10 {before.mean():.4f} -> {after.mean():.4f} "
                            f"({gain.mean():+.4f} ± {se:.4f})")
    else:
        result["reason"] = (f"not kept: held-out nDCG@10 {before.mean():.4f} -> {after.mean():.4f} "
                            f"({gain.mean():+.4f} ± {se:.4f}, not above one standard error)")
    if result["current_head_trained_on_these"]:
        result["reason"] += (f"; the current head was trained on this corpus's {split} labels, so these held-out "
                             "questions were not held out from it: the comparison favours it")
    return result

