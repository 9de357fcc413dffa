"""The default ``Generator``: an answer made of the passages' own most query-relevant sentences.

Sentences are scored lexically (IDF-weighted share of the query's content terms they contain, with
the index's own IDF and the same stemming as BM25, function words like "how" and "does" left out) plus a prior for the
passage's rank. That costs a few look-ups per term, where re-running the encoder on every sentence would cost a
model run each. Every sentence keeps a ``[n]`` marker pointing at the passage it was copied from.
"""

from __future__ import annotations

import time
from typing import Mapping, Sequence

from rag.ingest.sentences import sentence_spans
from rag.retrieval.lexical import LexicalAnalyzer
from rag.types import AnswerSentence, Chunk, GenerationResult

RANK_PRIOR = 0.15  # a top-ranked passage's sentence wins ties against a lower one's


class ExtractiveGenerator:
    """The extractive ``Generator``: the passages' most query-relevant sentences, each cited."""

    name = "extractive"

    def __init__(self, analyzer: LexicalAnalyzer, idf: Mapping[str, float], max_sentences: int = 3) -> None:
        if max_sentences < 1:
            raise ValueError(f"max_sentences must be greater than 0. Currently, it is {max_sentences}")
        self.analyzer = analyzer
        self.idf = idf
        self.unknown_idf = max(idf.values(), default=1.0)  # a term the corpus never saw is maximally rare
        self.max_sentences = max_sentences

    def generate(self, query: str, passages: Sequence[Chunk]) -> GenerationResult:
        start = time.perf_counter()
        terms = self.analyzer.content_terms(query) or set(self.analyzer.tokens(query))
        weights = {t: self.idf.get(t, self.unknown_idf) for t in terms}
        total = sum(weights.values())
        scored: list[tuple[float, int, int, str]] = []
        for number, passage in enumerate(passages, 1):
            for position, (a, b) in enumerate(sentence_spans(passage.text)):
                sentence = passage.text[a:b]
                terms = set(self.analyzer.tokens(sentence))
                coverage = sum(weights[t] for t in terms & weights.keys()) / total if total else 0.0
                if coverage > 0:
                    scored.append((coverage + RANK_PRIOR / number, number, position, sentence))
        scored.sort(key=lambda s: (-s[0], s[1], s[2]))
        chosen: list[AnswerSentence] = []
        keys: list[str] = []
        for _, number, _, sentence in scored:
            key = " ".join(sentence.lower().split())
            # Overlapping chunks repeat sentences, whole or cut at a chunk edge (a prefix or suffix).
            if any(k.startswith(key) or k.endswith(key) for k in keys):
                continue
            whole = next((i for i, k in enumerate(keys) if key.startswith(k) or key.endswith(k)), None)
            if whole is not None:  # the full sentence of a fragment chosen earlier replaces it
                keys[whole], chosen[whole] = key, AnswerSentence(sentence, number)
                continue
            keys.append(key)
            chosen.append(AnswerSentence(sentence, number))
            if len(chosen) == self.max_sentences:
                break
        if not chosen and passages:  # no query term anywhere: fall back to the top passage's lead
            spans = sentence_spans(passages[0].text)
            if spans:
                chosen.append(AnswerSentence(passages[0].text[spans[0][0]:spans[0][1]], 1))
        return GenerationResult(self.name, chosen, time.perf_counter() - start)
