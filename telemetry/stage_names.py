"""Stage names of a service ragheat did not write, mapped onto the closed ``stage`` label.

A foreign service names its stages as it likes ("vector_search", "BM25Retriever", "llm"); the boards, rules and
probes know only ``telemetry.metrics.STAGE_LABELS``. ``StageNames.label`` maps a name onto that set: a label itself,
then a documented alias, then a few words a name may contain, else ``other``. Whatever the caller passes, the label
set never grows: an unmapped name is counted (``ragheat_unmapped_stage_names_total``), not labelled.
"""

from __future__ import annotations

import re
import threading
from typing import Callable, Mapping

from telemetry.metrics import STAGE_LABELS

ALIASES: dict[str, str] = {
    # embedding the query
    "embedding": "embed", "embeddings": "embed", "embed_query": "embed", "query_embedding": "embed",
    "encode": "embed", "text_embedder": "embed",
    # retrieval, by kind where the name says it
    "retrieval": "retrieve", "retriever": "retrieve", "search": "retrieve", "ensemble": "retrieve",
    "dense": "retrieve_dense", "vector": "retrieve_dense", "vector_search": "retrieve_dense",
    "embedding_retriever": "retrieve_dense", "similarity_search": "retrieve_dense", "knn": "retrieve_dense",
    "bm25": "retrieve_bm25", "keyword": "retrieve_bm25", "sparse": "retrieve_bm25", "bm25_retriever": "retrieve_bm25",
    "full_text": "retrieve_bm25", "graph": "retrieve_graph", "knowledge_graph": "retrieve_graph",
    # fusion of several retrievers' lists
    "fusion": "fuse", "join": "fuse", "joiner": "fuse", "document_joiner": "fuse", "rrf": "fuse", "merge": "fuse",
    # reranking
    "reranker": "rerank", "reranking": "rerank", "ranker": "rerank", "cross_encoder": "rerank",
    # the language model
    "llm": "generate", "chat": "generate", "completion": "generate", "text_completion": "generate",
    "generation": "generate", "generator": "generate", "answer": "generate", "generate_content": "generate",
    "prefill": "generate_prefill", "decode": "generate_decode",
    # tools and agents' calls
    "execute_tool": "tool", "tool_call": "tool", "function_call": "tool",
    # the rest of ragheat's own vocabulary, as other services spell it
    "cache": "cache_lookup", "semantic_cache": "cache_lookup", "entity_linking": "link_entities",
    "router": "route", "routing": "route", "query_rewrite": "hyde", "grounding": "support_check",
}
"""Common stage names (lower case, words joined by ``_``) and the label each is recorded under."""

_WORDS = (  # (the start of a word in a name, its label): the first that matches wins, so specific ones come first
    ("bm25", "retrieve_bm25"), ("keyword", "retrieve_bm25"), ("sparse", "retrieve_bm25"),
    ("graph", "retrieve_graph"), ("vector", "retrieve_dense"), ("dense", "retrieve_dense"),
    ("faiss", "retrieve_dense"), ("embedding_retriever", "retrieve_dense"), ("ensemble", "retrieve"),
    ("fusion", "retrieve"), ("retriev", "retrieve"), ("joiner", "fuse"), ("rerank", "rerank"), ("ranker", "rerank"),
    ("embed", "embed"), ("llm", "generate"), ("chat", "generate"), ("generat", "generate"), ("tool", "tool"),
)
_SEPARATORS = re.compile(r"[^a-z0-9]+")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_MEMO_LIMIT = 4096  # distinct raw names remembered; beyond it they are mapped afresh each time (never unbounded)


def normalise(name: str) -> str:
    """``"BM25Retriever.run"`` -> ``"bm25_retriever_run"``: lower case, words joined by ``_``."""
    return _SEPARATORS.sub("_", _CAMEL.sub("_", name).lower()).strip("_")


class StageNames:
    """Maps caller-chosen stage names onto ``STAGE_LABELS``. ``aliases`` add to (or override) ``ALIASES``;
    ``on_unmapped`` is called once per use of a name that maps to ``other``."""

    def __init__(self, aliases: Mapping[str, str] | None = None,
                 on_unmapped: Callable[[], None] | None = None) -> None:
        extra = {normalise(name): label for name, label in (aliases or {}).items()}
        wrong = sorted({label for label in extra.values() if label not in STAGE_LABELS})
        if wrong:
            raise ValueError(f"stage aliases must map onto ragheat's stage labels {STAGE_LABELS}; "
                             f"not labels: {wrong}")
        self.aliases = {**ALIASES, **extra}
        self.on_unmapped = on_unmapped
        self._memo: dict[str, str] = {}
        self._lock = threading.Lock()

    def label(self, name: str, count: bool = True) -> str:
        """The label ``name`` is recorded under (``other`` when nothing matches; that use is counted unless
        ``count`` is false: a guess from a span's name, not a name the caller chose)."""
        if not isinstance(name, str):
            name = "?"  # maps to other, and is counted as unmapped
        label = self._memo.get(name)
        if label is None:
            label = self._map(name)
            if len(self._memo) < _MEMO_LIMIT:
                with self._lock:
                    self._memo[name] = label
        if label == "other" and count and self.on_unmapped is not None and name != "other":
            self.on_unmapped()
        return label

    def _map(self, name: str) -> str:
        if name in STAGE_LABELS:
            return name
        words = normalise(name)
        if words in STAGE_LABELS:
            return words
        if words in self.aliases:
            return self.aliases[words]
        padded = f"_{words}_"
        for word, label in _WORDS:
            if f"_{word}" in padded:  # a word's start, so "paragraph" is no graph
                return label
        return "other"
