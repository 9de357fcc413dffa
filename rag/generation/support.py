"""Does each sentence of a written answer say what the passages it cites say? (The seed's "self-correction".)

A sentence's score is the IDF-weighted share of its content terms (stemmed, function words left out, the
same analysis as BM25) that occur in the passages it cites with ``[n]``. Below ``threshold`` it is flagged
unsupported; a sentence that cites nothing, or cites a passage that was not given, scores 0. Lexical
overlap cannot prove entailment, but it catches the usual failures (an invented fact, a citation to the
wrong passage, an uncited claim) for a few look-ups per term, where a cross-encoder would add a model run per
sentence to every answer.
"""

from __future__ import annotations

import re
from typing import Mapping, Sequence

from rag.ingest.sentences import sentence_spans
from rag.retrieval.lexical import LexicalAnalyzer
from rag.types import Chunk, SentenceSupport

MARKER = re.compile(r"\[(\d{1,3})\]")
_LEADING_MARKERS = re.compile(r"^(\s*\[\d{1,3}\])+")


def split_cited_sentences(answer: str) -> list[tuple[str, tuple[int, ...]]]:
    """``(sentence, citation numbers)`` pairs. Markers written after the full stop ("... tides. [2] The")
    belong to the sentence before them, not the one they precede."""
    pieces = [answer[a:b] for a, b in sentence_spans(answer)]
    for i in range(1, len(pieces)):
        lead = _LEADING_MARKERS.match(pieces[i])
        if lead:
            pieces[i - 1] += " " + lead.group(0).strip()
            pieces[i] = pieces[i][lead.end():].strip()
    return [(p, tuple(dict.fromkeys(int(n) for n in MARKER.findall(p)))) for p in pieces if p and not MARKER.fullmatch(p)]


class SupportChecker:
    """Scores written answers against their cited passages.

    >>> checker = SupportChecker(analyzer, index.idf, threshold=0.5)
    >>> [s.supported for s in checker.check("Tides follow the moon [1].", passages)]
    """

    def __init__(self, analyzer: LexicalAnalyzer, idf: Mapping[str, float], threshold: float = 0.5) -> None:
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"threshold must be between 0 and 1. Currently, it is {threshold}")
        self.analyzer, self.idf, self.threshold = analyzer, idf, threshold
        self.unknown_idf = max(idf.values(), default=1.0)

    def check(self, answer: str, passages: Sequence[Chunk]) -> tuple[SentenceSupport, ...]:
        passage_terms: dict[int, set[str]] = {}
        results = []
        for sentence, citations in split_cited_sentences(answer):
            terms = self.analyzer.content_terms(MARKER.sub(" ", sentence))
            cited: set[str] = set()
            for n in citations:
                if 1 <= n <= len(passages):
                    if n not in passage_terms:
                        passage_terms[n] = set(self.analyzer.tokens(passages[n - 1].title + " " + passages[n - 1].text))
                    cited |= passage_terms[n]
            if not terms:  # nothing to check ("Yes [1].")
                score = 1.0 if cited else 0.0
            else:
                weights = {t: self.idf.get(t, self.unknown_idf) for t in terms}
                score = sum(w for t, w in weights.items() if t in cited) / sum(weights.values())
            results.append(SentenceSupport(sentence, citations, round(score, 4), bool(cited) and score >= self.threshold))
        return tuple(results)
