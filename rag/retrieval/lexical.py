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

    def tokens_many(self, texts: Iterable[str]) -> list[list[str]]:
        return [self.tokens(t) for t in texts]

    def params(self) -> dict:
        return {"token_pattern": _TOKEN.pattern, "stopwords": "bm25s.en", "stemmer": self.stemmer_language}
