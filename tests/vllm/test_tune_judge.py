"""``ragheat tune``'s step 1 with a real judge (the shared vLLM server; its tiny model's weights are random, so its
labels are arbitrary): the labels it writes are the ones step 1 hands on, and whether they are used follows the
stated rule, beside human labels and without them."""

from __future__ import annotations

import contextlib

import pytest

from rag.eval.beir import load_qrels, load_queries
from rag.eval.judge import YesNoClient, read_judged
from tuning.labels import MIN_KAPPA, MIN_RELEVANT_SHARE, choose_labels

pytestmark = pytest.mark.slow


@contextlib.contextmanager
def asker(url: str):
    client = YesNoClient(url, "tiny")
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def five_queries(scifact_subset):
    qrels = load_qrels(scifact_subset, "train")
    queries = {q: t for q, t in load_queries(scifact_subset).items() if q in qrels}
    chosen = dict(sorted(queries.items())[:5])
    return chosen, {q: qrels[q] for q in chosen}


def test_without_human_labels_the_judges_labels_are_used_only_when_dense_enough(pipeline, vllm_server, five_queries,
                                                                                tmp_path):
    queries, _ = five_queries
    labels = choose_labels(None, queries, "auto", pipeline_factory=lambda: _Borrowed(pipeline),
                           asker_factory=lambda: asker(vllm_server.url), judge_sample=0, seed=0, out_dir=tmp_path)
    judged = read_judged(tmp_path / "judged.tsv")
    assert len(judged) == 5 * 10 and {q for q, _ in judged} == set(queries)
    with_relevant = sum(1 for q in queries if any(judged[(q2, d)] for q2, d in judged if q2 == q))
    assert labels.judge["queries_with_relevant"] == with_relevant
    if with_relevant / 5 < MIN_RELEVANT_SHARE:
        assert labels.source == "none" and labels.qrels is None and "too sparse" in labels.reason
    else:
        assert labels.source == "judge" and "agreement unmeasured" in labels.reason
        assert labels.qrels == {q: {d: g for (q2, d), g in judged.items() if q2 == q} for q in queries}


def test_beside_human_labels_the_judge_is_measured_and_used_only_when_it_agrees(pipeline, vllm_server, five_queries,
                                                                                tmp_path):
    queries, human = five_queries
    labels = choose_labels(human, queries, "judge", pipeline_factory=lambda: _Borrowed(pipeline),
                           asker_factory=lambda: asker(vllm_server.url), judge_sample=3, seed=0, out_dir=tmp_path)
    kappa = labels.judge["agreement"]["kappa"]
    assert labels.judge["agreement"]["pairs"] == 50  # --labels judge: every query judged, not a sample
    if kappa == kappa and kappa >= MIN_KAPPA:
        assert labels.source == "judge"
    else:
        assert labels.source == "human" and labels.qrels == human and "too low to train on" in labels.reason


class _Borrowed:
    """The session's pipeline lent to step 1, which closes what it is given: closing the loan leaves it open."""

    def __init__(self, pipeline) -> None:
        self._pipeline = pipeline

    def __getattr__(self, name):
        return getattr(self._pipeline, name)

    def close(self) -> None:
        pass
