"""One lexical analyser for BM25 indexing, BM25 queries and sentence scoring in the generator.

Using the same analyser everywhere means a query term that BM25 matched is also the term the
extractive generator looks for in sentences.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Iterable

from bm25s.stopwords import STOPWORDS_EN

_TOKEN = re.compile(r"(?u)\b\w\w+\b")

# Function words that carry no topic. BM25 keeps Lucene's short list (its IDF already discounts these,
# and the published BM25 baselines use that list); the generator drops these too when it decides which
# query terms a sentence must contain, so "how does X work" looks for X, not for "how" and "does".
FUNCTION_WORDS = frozenset("""
about above after again against all am any because been before being below between both can could did do
does doing down during each few from further had has have having he her here hers herself him himself his
how i its itself just me more most my myself nor now off once only other our ours ourselves out over own
same she should so some than theirs them themselves those through too under until up very we were what
when where which while who whom why would you your yours yourself yourselves also may might must shall
""".split())


class LexicalAnalyzer:
    """Lower-case word tokens (two or more characters), English stop words removed, Snowball-stemmed."""

    def __init__(self, stemmer_language: str = "english") -> None:
        self.stemmer_language = stemmer_language
        self._stopwords = frozenset(STOPWORDS_EN)
        if stemmer_language:
            import Stemmer

            stemmer = Stemmer.Stemmer(stemmer_language)
            self._stem = lru_cache(maxsize=200_000)(stemmer.stemWord)
        else:
            self._stem = lambda word: word

    def tokens(self, text: str) -> list[str]:
        stem = self._stem
        stop = self._stopwords
        return [stem(w) for w in _TOKEN.findall(text.lower()) if w not in stop]

    def content_terms(self, text: str) -> set[str]:
        """Stemmed terms of ``text`` without stop words or function words (what a question is about)."""
        stem = self._stem
        skip = self._stopwords | FUNCTION_WORDS
        return {stem(w) for w in _TOKEN.findall(text.lower()) if w not in skip}

    def tokens_many(self, texts: Iterable[str]) -> list[list[str]]:
        return [self.tokens(t) for t in texts]

    def params(self) -> dict:
        return {"token_pattern": _TOKEN.pattern, "stopwords": "bm25s.en", "stemmer": self.stemmer_language}
