"""Sentence spans by a punctuation rule; cheap enough for the request path."""

from __future__ import annotations

import re

# A sentence ends at . ! or ? (optionally closed by a quote or bracket) followed by whitespace and
# an upper-case letter, digit or opening quote/bracket. Lower-case continuations ("e.g. the") stay.
_BOUNDARY = re.compile(r"(?<=[.!?])([\"')\]]?)\s+(?=[A-Z0-9\"'(\[])")


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """``[start, end)`` character spans of the sentences in ``text``, whitespace trimmed."""
    spans: list[tuple[int, int]] = []
    start = 0
    for match in _BOUNDARY.finditer(text):
        _append(spans, text, start, match.start() + len(match.group(1)))
        start = match.end()
    _append(spans, text, start, len(text))
    return spans


def _append(spans: list[tuple[int, int]], text: str, start: int, end: int) -> None:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    if end > start:
        spans.append((start, end))
