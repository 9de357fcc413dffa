"""The router's features: cheap, computed before anything expensive runs (no model call): the query's shape,
capitalisation, digits, question word, its linked entities (the gazetteer runs anyway), and the rarity of its terms
in this corpus (BM25's IDF table). The query embedding is not a feature: it adds nothing under cross-validation (its
dimensions overfit the training queries), and without it the router decides before ``embed`` runs."""

from __future__ import annotations

import math
import re
from typing import Mapping

import numpy as np

from rag.retrieval.lexical import LexicalAnalyzer
from rag.types import LinkedEntities

QUESTION_WORDS = ("who", "what", "which", "when", "where", "how", "why", "whose", "whom", "is", "are", "was", "did",
                  "does", "do", "in")
FEATURE_NAMES = ("log_words", "caps_ratio", "log_caps", "digit_ratio", "ends_qmark", "has_qword",
                 *(f"first_{q}" for q in QUESTION_WORDS), "log_seeds", "seed_max", "seed_top3", "any_seed",
                 "idf_mean", "idf_max", "oov_ratio")
_WORD = re.compile(r"\w+", re.UNICODE)
_QWORDS = frozenset(QUESTION_WORDS[:9])


def lexical_features(query: str, linked: LinkedEntities, idf: Mapping[str, float],
                     analyzer: LexicalAnalyzer) -> np.ndarray:
    """The ``FEATURE_NAMES`` of one query, as float64."""
    words = _WORD.findall(query)
    n = max(1, len(words))
    caps = sum(1 for i, w in enumerate(words) if i > 0 and w[:1].isupper())
    digits = sum(1 for w in words if any(ch.isdigit() for ch in w))
    first = words[0].lower() if words else ""
    terms = analyzer.tokens(query)
    idfs = [idf.get(t, 0.0) for t in terms]
    oov = sum(1 for t in terms if t not in idf) / max(1, len(terms))
    seeds = sorted(linked.seeds.values(), reverse=True)
    return np.array([
        math.log1p(len(words)), caps / n, math.log1p(caps), digits / n, float(query.rstrip().endswith("?")),
        float(any(w.lower() in _QWORDS for w in words)), *(float(first == q) for q in QUESTION_WORDS),
        math.log1p(len(seeds)), seeds[0] if seeds else 0.0, sum(seeds[:3]), float(bool(seeds)),
        float(np.mean(idfs)) if idfs else 0.0, float(np.max(idfs)) if idfs else 0.0, oov], dtype=np.float64)
