"""Plain data passed between stages. Each stage returns its result with its own timing."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from rag.devicetime import DeviceTiming


@dataclass(frozen=True)
class Document:
    """A source document before chunking."""

    doc_id: str
    title: str
    text: str


@dataclass(frozen=True)
class Chunk:
    """A passage: a span ``[start, end)`` of a document's text (title excluded)."""

    chunk_id: int
    doc_id: str
    title: str
    text: str
    start: int
    end: int


@dataclass(frozen=True)
class Hit:
    """One retrieved chunk with the score its retriever (or the fuser) gave it."""

    chunk_id: int
    score: float


@dataclass(frozen=True)
class EmbeddingResult:
    vector: np.ndarray
    tokens: int
    seconds: float
    device: DeviceTiming | None = None  # the model run alone (rag.devicetime), tokenising excluded


@dataclass(frozen=True)
class RetrievalResult:
    retriever: str
    hits: list[Hit]
    seconds: float
    device: DeviceTiming | None = None  # the index search alone (dense only: BM25 never runs on a GPU)


@dataclass(frozen=True)
class FusionResult:
    hits: list[Hit]
    seconds: float


@dataclass(frozen=True)
class AnswerSentence:
    text: str
    citation: int  # 1-based number of the source it came from


@dataclass(frozen=True)
class SentenceSupport:
    """One sentence of a written (LLM) answer, scored against the passages it cites."""

    text: str  # as written, markers included
    citations: tuple[int, ...]  # the [n] it carries (1-based), in order
    score: float  # share of its content terms found in the cited passages, 0..1
    supported: bool


@dataclass(frozen=True)
class GenerationStats:
    """Client-side timing of a streamed generation: time to first token, the gaps between tokens
    (one per streamed chunk after the first) and the output-token count the server reported."""

    ttft_s: float
    inter_token_s: tuple[float, ...]
    output_tokens: int
    model: str = ""

    @property
    def time_per_output_token_s(self) -> float | None:
        return sum(self.inter_token_s) / len(self.inter_token_s) if self.inter_token_s else None


@dataclass(frozen=True)
class GenerationResult:
    generator: str
    sentences: list[AnswerSentence]
    seconds: float
    text: str | None = None  # a written answer, verbatim (extractive answers are built from ``sentences``)
    stats: GenerationStats | None = None
    support: tuple[SentenceSupport, ...] = ()
    degraded_reason: str | None = None  # why the answer fell back to the extractive generator

    @property
    def answer(self) -> str:
        if self.text is not None:
            return self.text
        return " ".join(f"{s.text} [{s.citation}]" for s in self.sentences)


@dataclass(frozen=True)
class StageTiming:
    """How long one stage took; ``start`` is a ``time.perf_counter()`` reading, so telemetry can place
    the stage on a trace's timeline after the fact without the stages knowing about tracing.

    ``device_seconds`` is set for stages that wrap work a GPU may run (embed, retrieve_dense): the time the
    device spent on it by CUDA events (``clock="cuda"``) or, without a GPU, the wrapped call's own host
    time (``clock="monotonic"``). It covers only the wrapped call, so it is at most ``seconds`` on the CPU."""

    name: str
    seconds: float
    start: float = 0.0
    device_seconds: float | None = None
    clock: str | None = None  # rag.devicetime.CLOCKS, set with device_seconds

    @property
    def ms(self) -> float:
        return self.seconds * 1000.0


@dataclass(frozen=True)
class Source:
    """A returned passage, numbered as the answer cites it."""

    number: int
    chunk: Chunk
    score: float


@dataclass
class QueryResult:
    answer: str
    generator: str
    sources: list[Source]
    stages: list[StageTiming] = field(default_factory=list)
    sentences: list[AnswerSentence] = field(default_factory=list)
    retrieved: dict[str, int] = field(default_factory=dict)  # hits per retriever, before fusion
    generation: GenerationStats | None = None  # streamed generators only
    support: tuple[SentenceSupport, ...] = ()  # written answers only: each sentence vs its cited passages
    degraded_reason: str | None = None  # set when the generator was down or slow and the answer is extractive

    @property
    def degraded(self) -> bool:
        return self.degraded_reason is not None

    @property
    def unsupported_sentences(self) -> int:
        return sum(not s.supported for s in self.support)
