"""Step 1: relevance labels. The human qrels when the user has them, the language-model judge otherwise; both when
asked, so that the judge's agreement with the humans is measured on the user's own questions.

A judge's labels are trained on only when they can be trusted: beside human labels, its Cohen's kappa with them
must reach ``MIN_KAPPA``; alone, it must find enough relevant passages to train on (``MIN_RELEVANT_SHARE`` of the
queries with at least one). Otherwise the step says so and later steps that need labels are skipped.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, ContextManager, Mapping

from rag.eval.beir import Qrels
from rag.eval.judge import Judge, agreement, read_judged, retrieved_pairs, write_json_safe

MIN_KAPPA = 0.4
"""Cohen's kappa with the human labels below which a judge's labels are not trained on ("moderate" agreement)."""
MIN_RELEVANT_SHARE = 0.3
"""Without human labels: the share of judged queries with at least one relevant passage below which the judge's
labels are too sparse to train on."""
JUDGED_PER_QUERY = 10


@dataclass
class Labels:
    """What step 1 decided: the labels later steps use (None: none usable), where they came from, and why."""

    qrels: Qrels | None
    source: str  # "human", "judge" or "none"
    reason: str
    judge: dict = field(default_factory=dict)  # the judge's run and, beside human labels, its agreement

    def to_json(self) -> dict:
        return {"source": self.source, "reason": self.reason, "queries": len(self.qrels or {}),
                "relevant_pairs": sum(1 for rel in (self.qrels or {}).values() for g in rel.values() if g > 0),
                "judge": write_json_safe(self.judge)}


def judge_queries(pipeline, asker_factory: Callable[[], ContextManager], queries: Mapping[str, str], out_file: Path,
                  *, threshold: float, advance: Callable[[], None] | None = None) -> tuple[Qrels, dict, dict]:
    """The judge's labels of each query's top hybrid documents (resumed from ``out_file``), the ranking judged, and
    the run's counts."""
    ranked, pairs = retrieved_pairs(pipeline, queries, ["dense", "bm25"], JUDGED_PER_QUERY)
    with asker_factory() as asker:
        stats = Judge(asker, out_file, threshold=threshold).run(pairs, on_done=advance)
    judged = read_judged(out_file)
    qrels: Qrels = {}
    for qid, doc, *_ in pairs:
        if (qid, doc) in judged:
            qrels.setdefault(qid, {})[doc] = judged[(qid, doc)]
    return qrels, ranked, stats


def choose_labels(human: Qrels | None, queries: Mapping[str, str], mode: str, *, pipeline_factory,
                  asker_factory: Callable[[], ContextManager] | None, judge_sample: int, seed: int, out_dir: Path,
                  threshold: float = 0.0, advance: Callable[[], None] | None = None) -> Labels:
    """``mode``: ``auto`` (human labels when there are any, the judge otherwise, and the judge beside the humans on
    ``judge_sample`` queries to measure it), ``human`` or ``judge`` (the judge's labels, checked against the humans
    when there are some)."""
    if mode not in ("auto", "human", "judge"):
        raise ValueError(f"labels must be auto, human or judge, got {mode!r}")
    if mode == "human" and not human:
        raise ValueError("labels=human, but the query set has no relevance labels (qrels)")
    wants_judge = mode == "judge" or not human or judge_sample > 0
    if not wants_judge:
        return Labels(human, "human", "the human relevance labels given with the queries")
    if asker_factory is None:
        if human:
            return Labels(human, "human", "the human relevance labels (no language model to judge beside them)")
        raise ValueError("no relevance labels and no language model to judge: give qrels or a model (--llm-url)")
    judged_ids = sorted(q for q in queries if (q in human if human else True))
    if human and mode != "judge" and judge_sample < len(judged_ids):
        judged_ids = sorted(random.Random(seed).sample(judged_ids, judge_sample))
    chosen = {q: queries[q] for q in judged_ids}
    pipeline = pipeline_factory()
    try:
        qrels, ranked, stats = judge_queries(pipeline, asker_factory, chosen, out_dir / "judged.tsv",
                                             threshold=threshold, advance=advance)
    finally:
        pipeline.close()
    report: dict = {"queries": len(chosen), "run": stats}
    with_relevant = sum(1 for rel in qrels.values() if any(g > 0 for g in rel.values()))
    report["queries_with_relevant"] = with_relevant
    if human:
        report["agreement"] = agreement({(q, d): g for q, rel in qrels.items() for d, g in rel.items()}, human,
                                        ranked)
        kappa = report["agreement"]["kappa"]
        trusted = kappa == kappa and kappa >= MIN_KAPPA  # NaN: undefined (one class only)
        if mode == "judge" and trusted:
            return Labels(qrels, "judge", f"the judge's labels (kappa {kappa:.2f} with the human ones, at least "
                                          f"{MIN_KAPPA})", report)
        if mode == "judge":
            return Labels(human, "human", f"the human labels: the judge's kappa with them is {kappa:.2f}, below "
                                          f"{MIN_KAPPA}, too low to train on", report)
        return Labels(human, "human", f"the human relevance labels; the judge beside them on {len(chosen)} queries: "
                                      f"kappa {kappa:.2f}" + ("" if trusted else f", below {MIN_KAPPA}: not used"),
                      report)
    share = with_relevant / len(chosen) if chosen else 0.0
    if share < MIN_RELEVANT_SHARE:
        return Labels(None, "none", f"no human labels, and the judge found a relevant passage for only "
                                    f"{with_relevant} of {len(chosen)} queries ({share:.0%}, below "
                                    f"{MIN_RELEVANT_SHARE:.0%}): too sparse to train or score on", report)
    return Labels(qrels, "judge", f"the judge's labels ({with_relevant} of {len(chosen)} queries with a relevant "
                                  "passage; agreement unmeasured: no human labels)", report)
