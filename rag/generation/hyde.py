"""HyDE (Gao et al., 2022, "Precise Zero-Shot Dense Retrieval without Relevance Labels"): the language model writes a
short hypothetical passage that would answer the question; that passage, embedded, is searched as a second dense query
beside the question itself, and the two dense runs are fused by reciprocal rank (stage ``hyde`` writes and embeds it;
``retrieve_dense`` runs both searches and fuses them, so the rest of the path sees one ``dense`` run).

A passage whose facts are wrong can still sit near the right documents in embedding space: the encoder matches
vocabulary and topic, not truth. A small model on a CPU is slow to its first token and its passages are plain, so
the stage has a deadline (``hyde.deadline_ms``): a model that is down, slow or writes nothing usable is skipped, said
so in the answer (``skipped_stages``), and retrieval goes on with the question alone.

    >>> writer = HydeWriter(llm, settings.hyde)          # llm: a warmed-up openai or vllm generator
    >>> writer.write("what causes tides?")               # 'Tides are caused by the moon ...' or HydeSkipped
"""

from __future__ import annotations

import re
import time
from typing import Protocol, Sequence

from rag.errors import RagheatError
from rag.generation.llm import GeneratorUnavailable

SYSTEM_PROMPT = ("Write one short factual passage, like a paragraph from an encyclopedia or a scientific abstract, "
                 "that answers the question. Do not repeat the question. No lists, no preamble.")
MIN_WORDS = 3
"""Fewer words than this is nothing to search with (an empty or cut-off reply): skipped, not embedded."""


class Completer(Protocol):
    """What HyDE and the judge need of a language model: one whole completion within a time limit (the ``openai``
    and ``vllm`` generators have it), raising ``GeneratorUnavailable`` (or its ``GeneratorTooSlow``)."""

    def complete(self, messages: Sequence[dict], max_tokens: int, timeout_s: float,
                 regex: str | None = None) -> str: ...


class HydeSkipped(RagheatError):
    """No hypothetical passage this time (the model down, slow, or its text unusable): a sentence for the answer's
    ``skipped_stages``; ``reason`` is a closed label (``unavailable``, ``slow``, ``empty``)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def build_messages(query: str) -> list[dict]:
    """The chat messages asking for a hypothetical passage that answers ``query``."""
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": query}]


def clean_passage(text: str) -> str:
    """The model's reply as a passage: chat markers, a leading "Passage:"/"Answer:" label and surrounding quotes or
    whitespace dropped, and an unfinished last sentence cut when whole ones come before it (``max_tokens`` stops
    mid-sentence)."""
    text = re.sub(r"<\|[^|>]*\|>", " ", text)
    text = re.sub(r"^\s*(passage|answer|hypothetical passage)\s*:\s*", "", text, flags=re.I).strip().strip('"').strip()
    text = " ".join(text.split())
    if text and text[-1] not in ".!?":
        cut = max(text.rfind(". "), text.rfind("! "), text.rfind("? "))
        if cut > 0:
            text = text[: cut + 1]
    return text


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


class HydeWriter:
    """Writes the hypothetical passage for the ``hyde`` stage within ``settings.deadline_ms``.

    ``write`` returns the passage or raises ``HydeSkipped``; it never raises anything else for a model failure, so a
    down model costs at most the deadline (and the connect timeout, which is shorter)."""

    def __init__(self, llm: Completer, settings) -> None:
        if not hasattr(llm, "complete"):
            raise ValueError(f"HyDE needs a language model that can complete a prompt; {type(llm).__name__} cannot")
        self.llm, self.settings = llm, settings

    @property
    def deadline_s(self) -> float:
        return self.settings.deadline_ms / 1000.0

    def write(self, query: str) -> str:
        start = time.perf_counter()
        try:
            text = self.llm.complete(build_messages(query), self.settings.max_tokens, self.deadline_s)
        except GeneratorUnavailable as exc:
            reason = getattr(exc, "reason", "unavailable")
            raise HydeSkipped(reason, f"hyde: no hypothetical passage within {self.settings.deadline_ms:g} ms "
                                      f"({reason}): {exc}") from exc
        passage = clean_passage(text)
        if len(passage.split()) < MIN_WORDS:
            raise HydeSkipped("empty", f"hyde: the model's passage was unusable ({len(passage.split())} words)")
        if _words(passage) == _words(query):  # a small model restating a claim: a second search would add nothing
            raise HydeSkipped("empty", "hyde: the model only repeated the question")
        if time.perf_counter() - start > self.deadline_s:  # a model that ignores its timeout still loses its turn
            raise HydeSkipped("slow", f"hyde: the passage took longer than hyde.deadline_ms "
                                      f"({self.settings.deadline_ms:g} ms)")
        return passage
