"""The prompt budget: passages cut to their most query-relevant sentences so the prompt's prefill fits.

A small model on two CPU cores pays for every prompt token before the first answer token (prefill), so
``generation.prompt_budget_tokens`` caps the passages' share of the prompt. Over budget, each passage keeps its
sentences ranked by the same lexical score as the extractive answer (IDF-weighted share of the query's content
terms), in their original order, within an equal share of the budget (a passage's unused share goes to the
later ones); every passage keeps at least its best sentence. Passages keep their position, so ``[n]`` in the
answer still points at the n-th source. Token counts are estimated from characters (``CHARS_PER_TOKEN``): the
``openai`` generator has no tokenizer of the served model, and the estimate only has to keep prefill bounded.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

from rag.ingest.sentences import sentence_spans
from rag.retrieval.lexical import LexicalAnalyzer
from rag.types import Chunk

CHARS_PER_TOKEN = 4.0  # English under a ~50k BPE vocabulary, at the low end: the estimate errs long


def estimate_tokens(text: str) -> int:
    return int(len(text) / CHARS_PER_TOKEN) + 1


class PassageCompressor:
    """``compress(query, passages)``: the passages, each cut to its most query-relevant sentences when all of
    them together exceed ``budget_tokens``.

    >>> PassageCompressor(analyzer, index.idf, budget_tokens=400).compress("what causes tides?", passages)
    """

    def __init__(self, analyzer: LexicalAnalyzer, idf: Mapping[str, float], budget_tokens: int) -> None:
        if budget_tokens < 1:
            raise ValueError(f"budget_tokens must be greater than 0. Currently, it is {budget_tokens}")
        self.analyzer, self.idf, self.budget = analyzer, idf, budget_tokens
        self.unknown_idf = max(idf.values(), default=1.0)

    def compress(self, query: str, passages: Sequence[Chunk]) -> list[Chunk]:
        if sum(estimate_tokens(p.title + "\n" + p.text) for p in passages) <= self.budget:
            return list(passages)
        terms = self.analyzer.content_terms(query) or set(self.analyzer.tokens(query))
        weights = {t: self.idf.get(t, self.unknown_idf) for t in terms}
        out, left = [], self.budget
        for i, passage in enumerate(passages):
            share = left / (len(passages) - i)
            text = self._cut(passage, weights, share - estimate_tokens(passage.title + "\n"))
            left -= estimate_tokens(passage.title + "\n" + text)
            out.append(passage if text == passage.text else dataclasses.replace(passage, text=text))
        return out

    def _cut(self, passage: Chunk, weights: Mapping[str, float], allowed: float) -> str:
        spans = sentence_spans(passage.text)
        if estimate_tokens(passage.text) <= allowed or len(spans) <= 1:
            return passage.text
        scored = []
        for position, (a, b) in enumerate(spans):
            sentence_terms = set(self.analyzer.tokens(passage.text[a:b]))
            score = sum(w for t, w in weights.items() if t in sentence_terms)
            scored.append((-score, position))
        kept, used = [], 0
        for _, position in sorted(scored):
            a, b = spans[position]
            cost = estimate_tokens(passage.text[a:b])
            if kept and used + cost > allowed:
                continue
            kept.append(position)
            used += cost
        return " ".join(passage.text[spans[p][0]:spans[p][1]] for p in sorted(kept))
