"""The written answer's prompt, without a model: the worked example, the citation pattern the constrained decoder
enforces, and the prompt budget (passages cut to their most query-relevant sentences, numbering kept)."""

from __future__ import annotations

import re

import pytest

from rag.generation.prompt_budget import PassageCompressor, estimate_tokens
from rag.generation.llm import EXAMPLE_ANSWER, build_messages, citation_regex
from rag.generation.support import split_cited_sentences
from rag.retrieval.lexical import LexicalAnalyzer
from rag.types import Chunk

FILLER = " ".join(f"Sentence {i} is about nothing in particular at all." for i in range(40))
PASSAGES = [Chunk(0, "d1", "Tides", FILLER + " Tides are caused by the gravitational pull of the moon. " + FILLER, 0, 9),
            Chunk(1, "d2", "Seasons", "Seasons follow from the tilt of the Earth's axis toward the sun.", 0, 9),
            Chunk(2, "d3", "Noise", FILLER, 0, 9)]


def test_the_worked_example_is_an_answer_the_pattern_and_the_splitter_accept():
    messages = build_messages("What causes tides?", PASSAGES)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert re.fullmatch(citation_regex(2), EXAMPLE_ANSWER)
    assert all(citations == (1,) for _, citations in split_cited_sentences(EXAMPLE_ANSWER))
    assert "[3] Noise" in messages[-1]["content"] and messages[-1]["content"].endswith("Question: What causes tides?")


@pytest.mark.parametrize("text, ok", [
    ("Tides follow the moon. [1]", True), ("A dose of 2.5 mg works. [2] It is safe. [1]", True),
    ("Tides follow the moon.", False), ("Tides follow the moon. [4]", False),
    ("Tides follow the moon [1].", False), ("Tides. [1] Moon. [2] Sun. [3] Sea. [1]", False)])
def test_the_citation_pattern_needs_a_marker_naming_a_given_passage_after_each_sentence(text, ok):
    assert bool(re.fullmatch(citation_regex(3), text)) is ok


def test_over_budget_passages_keep_their_most_relevant_sentences_and_their_numbers():
    budget = 120
    compressor = PassageCompressor(LexicalAnalyzer(), {}, budget_tokens=budget)
    out = compressor.compress("What causes tides? the gravitational pull of the moon", PASSAGES)
    assert [p.doc_id for p in out] == ["d1", "d2", "d3"]  # [n] still names the n-th source
    assert sum(estimate_tokens(p.title + "\n" + p.text) for p in out) <= budget * 1.1
    assert "Tides are caused by the gravitational pull of the moon." in out[0].text  # the relevant one survives
    assert out[1] == PASSAGES[1]  # a short passage is left whole
    assert out[2].text and len(out[2].text) < len(PASSAGES[2].text) // 4  # at least one sentence, far shorter


def test_within_budget_passages_are_left_whole_and_the_budget_is_validated():
    assert PassageCompressor(LexicalAnalyzer(), {}, budget_tokens=100_000).compress("tides", PASSAGES) == PASSAGES
    with pytest.raises(ValueError, match="budget_tokens"):
        PassageCompressor(LexicalAnalyzer(), {}, budget_tokens=0)
