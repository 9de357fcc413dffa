"""LLM-as-judge (rag/eval/judge.py) with a scripted model: junk-tolerant parsing, resuming from the out file, BEIR qrels
written, and the agreement figures against hand-computed values. The real model judging real pairs through
``ragheat judge`` is in tests/vllm/test_real_model.py."""

from __future__ import annotations

import math

import pytest

from rag.eval.beir import ndcg_at
from rag.eval.judge import (HEADER, JUDGE_REGEX, CompleterAsker, Judge, agreement, build_messages, cohen_kappa,
                            parse_label, read_judged, read_margins, retrieved_pairs, yes_no_margin)
from rag.generation.llm import GeneratorTooSlow


@pytest.mark.parametrize("reply, label", [
    ("Yes", 1), ("No", 0), (" yes.", 1), ("NO", 0), ("The passage is relevant.", 1),
    ("The passage is not relevant to the query.", 0), ("Irrelevant", 0), ("Yes, it is relevant", 1),
    ("No, this is not relevant.", 0), ("", None), ("Maybe? <|im_end|>", None), ("Nobody knows", None),
])
def test_parse_label_reads_junk_and_prose(reply, label):
    assert parse_label(reply) == label


def test_the_prompt_bounds_the_passage_and_names_both_texts():
    messages = build_messages("Does aspirin prevent heart attacks?", "Aspirin", "word " * 2000)
    user = messages[-1]["content"]
    assert "Does aspirin prevent heart attacks?" in user and "Aspirin" in user and len(user) < 1500
    assert JUDGE_REGEX == "(Yes|No)"


def test_cohen_kappa_against_hand_computed_values():
    assert cohen_kappa([1, 0, 1, 0], [1, 0, 1, 0]) == 1.0
    assert cohen_kappa([1, 0, 1, 0], [0, 1, 0, 1]) == -1.0
    # observed 3/5 = 0.6; both say 1 for 0.6 of the items: expected 0.6*0.6 + 0.4*0.4 = 0.52 -> (0.6-0.52)/0.48
    assert cohen_kappa([1, 1, 1, 0, 0], [1, 1, 0, 1, 0]) == pytest.approx((0.6 - 0.52) / 0.48)
    assert math.isnan(cohen_kappa([1, 1], [1, 1]))
    with pytest.raises(ValueError):
        cohen_kappa([1], [1, 0])


class Scripted:
    """Replies by the passage's text: ``replies[text]`` (an exception is raised); counts the calls."""

    def __init__(self, replies: dict) -> None:
        self.replies, self.calls = replies, []

    def complete(self, messages, max_tokens, timeout_s, regex=None):
        text = messages[-1]["content"].split("Passage: ", 1)[1].split("\n", 1)[1].split("\n\n")[0]
        self.calls.append((text, regex))
        reply = self.replies[text]
        if isinstance(reply, Exception):
            raise reply
        return reply


PAIRS = [("q1", "d1", "query one", "T1", "alpha"), ("q1", "d2", "query one", "T2", "beta"),
         ("q2", "d3", "query two", "T3", "gamma"), ("q2", "d4", "query two", "T4", "delta")]


def test_the_judge_writes_qrels_skips_junk_and_resumes(tmp_path):
    out = tmp_path / "judged.tsv"
    llm = Scripted({"alpha": "Yes", "beta": "I cannot tell <|im_end|>", "gamma": "No.",
                    "delta": GeneratorTooSlow("read timed out")})
    ticks = []
    stats = Judge(CompleterAsker(llm), out, workers=2).run(PAIRS, on_done=lambda: ticks.append(1))
    assert stats | {"unparsed_examples": None} == {"pairs": 4, "resumed": 0, "asked": 4, "unparsed": 1, "errors": 1,
                                                   "unparsed_examples": None, "threshold": 0.0}
    assert len(ticks) == 4 and {regex for _, regex in llm.calls} == {JUDGE_REGEX}
    lines = out.read_text().splitlines()
    assert lines == [HEADER, "q1\td1\t1", "q2\td3\t0"]  # BEIR qrels; the junk and the failure are not written
    # Resumed: only the two pairs without a label are asked again; the file keeps one header.
    out.write_text(out.read_text() + "q2\td4\t")  # a line cut short by a kill mid-write: asked again
    again = Scripted({"beta": "Yes", "delta": "No"})
    stats = Judge(CompleterAsker(again), out).run(PAIRS)
    assert stats["resumed"] == 2 and stats["asked"] == 2 and sorted(t for t, _ in again.calls) == ["beta", "delta"]
    assert read_judged(out) == {("q1", "d1"): 1, ("q1", "d2"): 1, ("q2", "d3"): 0, ("q2", "d4"): 0}
    assert out.read_text().count(HEADER) == 1


def test_agreement_against_the_human_qrels():
    judged = {("q1", "d1"): 1, ("q1", "d2"): 1, ("q2", "d3"): 0, ("q2", "d4"): 1}
    human = {"q1": {"d1": 1}, "q2": {"d4": 2, "d9": 1}}  # d2, d3 unjudged by humans: not relevant
    ranked = {"q1": ["d1", "d2"], "q2": ["d3", "d4"]}
    a = agreement(judged, human, ranked)
    assert (a["pairs"], a["queries"], a["human_relevant"], a["judge_relevant"]) == (4, 2, 2, 3)
    assert a["agreement"] == 0.75 and a["precision"] == pytest.approx(2 / 3) and a["recall"] == 1.0
    assert a["kappa"] == pytest.approx(cohen_kappa([1, 1, 0, 1], [1, 0, 0, 1]))
    human_ndcg = (ndcg_at(["d1", "d2"], human["q1"], 10) + ndcg_at(["d3", "d4"], human["q2"], 10)) / 2
    judge_ndcg = (ndcg_at(["d1", "d2"], {"d1": 1, "d2": 1}, 10) + ndcg_at(["d3", "d4"], {"d3": 0, "d4": 1}, 10)) / 2
    assert a["ndcg@10_human"] == pytest.approx(human_ndcg) and a["ndcg@10_judge"] == pytest.approx(judge_ndcg)


def test_retrieved_pairs_are_the_top_documents_as_retrieved(pipeline):
    ranked, pairs = retrieved_pairs(pipeline, {"q": "Vitamin D deficiency and fractures"}, ["dense", "bm25"], 5)
    assert len(ranked["q"]) == 5 == len(set(ranked["q"])) and [p[1] for p in pairs] == ranked["q"]
    fused = pipeline.retrieve("Vitamin D deficiency and fractures", 15, ["dense", "bm25"], rerank=False, hyde=False)
    assert ranked["q"] == [d for d, _ in pipeline.chunk_hits_to_docs(fused.hits)][:5]
    assert all(p[2] == "Vitamin D deficiency and fractures" and p[4] for p in pairs)


def test_the_margin_decides_when_the_server_gives_one(tmp_path):
    assert yes_no_margin({"No": -0.9, "Yes": -2.6, "The": -0.8}) == pytest.approx(-1.7)
    pooled = yes_no_margin({"Yes": math.log(0.1), " yes": math.log(0.1), "No": math.log(0.4)})
    assert pooled == pytest.approx(math.log(0.2 / 0.4))
    assert yes_no_margin({"No": -1.0, "The": -3.0}) == pytest.approx(-2.0)  # Yes below the last of the top
    assert yes_no_margin({"The": -1.0}) is None

    class Margins:  # replies "No" to everything, as the 135M model does; the margin carries the signal
        def ask(self, messages):
            return "No", {"alpha": -1.4, "beta": -2.3, "gamma": -1.9, "delta": -1.6}[
                messages[-1]["content"].split("\n")[3]]

    out = tmp_path / "judged.tsv"
    Judge(Margins(), out, threshold=-1.75).run(PAIRS)
    assert read_judged(out) == {("q1", "d1"): 1, ("q1", "d2"): 0, ("q2", "d3"): 0, ("q2", "d4"): 1}
    assert read_margins(out.with_name("judged.tsv.margins.tsv"))[("q1", "d2")] == pytest.approx(-2.3)
