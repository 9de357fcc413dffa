"""Chunkers: documents -> passages measured in the embedding model's own word pieces.

Measuring in model tokens (not words) means a chunk never silently loses its tail to the
encoder's truncation. Both chunkers return spans into the document text so citations can point
at exact characters.
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence

import numpy as np
from tokenizers import Tokenizer

from rag.ingest.sentences import sentence_spans
from rag.types import Document

Span = tuple[int, int]


class Chunker(Protocol):
    """Splits documents into passages: one list of ``(start, end)`` character spans per document."""

    name: str

    def split(self, documents: Sequence[Document]) -> list[list[Span]]: ...


def plain_tokenizer(tokenizer: Tokenizer) -> Tokenizer:
    """A copy of ``tokenizer`` that neither truncates nor pads nor adds [CLS]/[SEP]."""
    plain = Tokenizer.from_str(tokenizer.to_str())
    plain.no_truncation()
    plain.no_padding()
    return plain


def _token_windows(offsets, word_ids, window: int, overlap: int) -> list[Span]:
    """Windows of ``window`` tokens sharing ``overlap``; cuts move back to a word start."""
    n = len(offsets)
    if n == 0:
        return []
    spans: list[Span] = []
    start = 0
    while True:
        end = min(start + window, n)
        if end < n:  # do not split a word into two chunks when a boundary is close
            back = end
            while back > start + window // 2 and word_ids[back] == word_ids[back - 1]:
                back -= 1
            end = back if word_ids[back] != word_ids[back - 1] else end
        spans.append((offsets[start][0], offsets[end - 1][1]))
        if end >= n:
            return spans
        next_start = max(end - overlap, start + 1)
        word_start = next_start  # begin the overlap at a word start, not on a word's tail
        while word_start > start and word_ids[word_start] == word_ids[word_start - 1]:
            word_start -= 1
        start = word_start if word_start > start else next_start


class TokenWindowChunker:
    """Fixed windows of ``window`` word pieces with ``overlap`` shared between neighbours.

    The title is embedded with every chunk, so a document's window shrinks by its title's length
    to keep title + chunk within ``budget`` tokens (the encoder's limit less [CLS]/[SEP]); it never
    shrinks below half the window, so only titles longer than that lose tokens to truncation.
    """

    name = "tokens"

    def __init__(self, tokenizer: Tokenizer, window: int, overlap: int, budget: int | None = None) -> None:
        if overlap >= window:
            raise ValueError(f"overlap ({overlap}) must be smaller than window ({window})")
        self.tokenizer = plain_tokenizer(tokenizer)
        self.window, self.overlap = window, overlap
        self.budget = budget  # None: titles are not embedded with chunks, or may be truncated

    def split(self, documents: Sequence[Document]) -> list[list[Span]]:
        encodings = self.tokenizer.encode_batch([d.text for d in documents], add_special_tokens=False)
        titles = self.tokenizer.encode_batch([d.title for d in documents], add_special_tokens=False)
        spans = []
        for enc, title in zip(encodings, titles):
            window = self.window if self.budget is None else \
                max(self.window // 2, min(self.window, self.budget - len(title.ids)))
            spans.append(_token_windows(enc.offsets, enc.word_ids, window, min(self.overlap, window - 1)))
        return spans

    def params(self) -> dict:
        return {"strategy": self.name, "window_tokens": self.window, "overlap_tokens": self.overlap}


class SemanticDensityChunker:
    """Cut between sentences where the meaning shifts.

    Adjacent sentences are embedded; a chunk ends where their cosine similarity falls below
    ``threshold`` (once the chunk has ``min_tokens``), and always before it would pass
    ``max_tokens``. A sentence longer than ``max_tokens`` is split into token windows. As with the
    token-window chunker, a long title lowers a document's ``max_tokens`` so title + chunk fit ``budget``.
    """

    name = "semantic"

    def __init__(self, tokenizer: Tokenizer, embed: Callable[[Sequence[str]], np.ndarray],
                 threshold: float, min_tokens: int, max_tokens: int, budget: int | None = None) -> None:
        if min_tokens > max_tokens:
            raise ValueError(f"min_tokens ({min_tokens}) must not exceed max_tokens ({max_tokens})")
        self.tokenizer = plain_tokenizer(tokenizer)
        self.embed = embed
        self.threshold, self.min_tokens, self.max_tokens = threshold, min_tokens, max_tokens
        self.budget = budget

    def params(self) -> dict:
        return {"strategy": self.name, "semantic_threshold": self.threshold,
                "min_tokens": self.min_tokens, "max_tokens": self.max_tokens}

    def split(self, documents: Sequence[Document]) -> list[list[Span]]:
        per_doc = [sentence_spans(d.text) for d in documents]
        texts = [d.text[a:b] for d, spans in zip(documents, per_doc) for a, b in spans]
        encodings = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        vectors = self.embed(texts) if texts else np.zeros((0, 1), np.float32)
        titles = self.tokenizer.encode_batch([d.title for d in documents], add_special_tokens=False)
        out: list[list[Span]] = []
        cursor = 0
        for spans, title in zip(per_doc, titles):
            count = len(spans)
            limit = self.max_tokens if self.budget is None else \
                max(self.max_tokens // 2, min(self.max_tokens, self.budget - len(title.ids)))
            out.append(self._group(spans, encodings[cursor:cursor + count], vectors[cursor:cursor + count], limit))
            cursor += count
        return out

    def _group(self, spans: list[Span], encodings, vectors: np.ndarray, max_tokens: int) -> list[Span]:
        chunks: list[Span] = []
        current: Span | None = None
        size = 0
        for i, (span, enc) in enumerate(zip(spans, encodings)):
            tokens = len(enc.ids)
            if tokens > max_tokens:  # one huge sentence: flush, then window it
                if current:
                    chunks.append(current)
                windows = _token_windows(enc.offsets, enc.word_ids, max_tokens, 0)
                chunks.extend((span[0] + a, span[0] + b) for a, b in windows)
                current, size = None, 0
                continue
            similar = i > 0 and float(vectors[i] @ vectors[i - 1]) >= self.threshold
            if current is not None and (size + tokens > max_tokens or (size >= self.min_tokens and not similar)):
                chunks.append(current)
                current, size = None, 0
            current = span if current is None else (current[0], span[1])
            size += tokens
        if current:
            chunks.append(current)
        return chunks
