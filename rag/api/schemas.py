"""Request and response bodies of the HTTP API (they are also the OpenAPI schema)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rag.types import QueryResult


class QueryRequest(BaseModel):
    """``POST /v1/query`` body. Unknown fields are rejected rather than silently ignored."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={
        "examples": [{"query": "What causes the seasons on Earth?", "top_k": 5, "retrievers": ["dense", "bm25"]}]})

    query: str = Field(description="the question; 1 to server.max_query_chars characters after trimming")
    top_k: int | None = Field(None, ge=1, le=100, description="sources to return (default: server.default_top_k)")
    retrievers: list[Literal["dense", "bm25"]] | None = Field(
        None, min_length=1, max_length=2, description="subset of dense, bm25; both = hybrid (default)")

    @field_validator("query")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        value = value.strip()
        if not value:
            raise ValueError("query must not be empty")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("query must be valid Unicode text (it contains an unpaired surrogate)") from None
        return value

    @field_validator("retrievers")
    @classmethod
    def _unique(cls, value):
        if value is not None and len(set(value)) != len(value):
            raise ValueError("retrievers must not repeat a name")
        return value


class Citation(BaseModel):
    """One returned passage as the response shows it; ``number`` is the ``[n]`` the answer cites."""

    number: int = Field(description="the n of the [n] markers in the answer")
    doc_id: str
    title: str
    chunk_start: int = Field(description="first character of the passage in the document text")
    chunk_end: int = Field(description="one past its last character")
    score: float = Field(description="fused (or single-retriever) score; higher is better")
    text: str


class StageTimingOut(BaseModel):
    """One stage's server-side time, in milliseconds."""

    name: str
    ms: float


class SentenceSupportOut(BaseModel):
    """One written-answer sentence scored against the passages it cites."""

    text: str = Field(description="one sentence of the written answer, markers included")
    citations: list[int] = Field(description="the [n] it cites")
    score: float = Field(description="share of its content terms found in the cited passages, 0..1")
    supported: bool = Field(description="false = flagged: the cited passages do not carry what it says")


class GenerationStatsOut(BaseModel):
    """Client-side timing of a streamed (language-model) answer."""

    model: str
    ttft_ms: float = Field(description="request sent -> first token, as ragheat saw it")
    time_per_output_token_ms: float | None = Field(description="mean gap between streamed tokens")
    output_tokens: int


class QueryResponse(BaseModel):
    """``POST /v1/query`` response: the answer, its citations and every stage's time."""

    answer: str
    citations: list[Citation]
    stages: list[StageTimingOut]
    generator: str
    degraded: bool = Field(False, description="true when the language model was down or slow and the answer "
                                              "is the extractive fallback")
    degraded_reason: str | None = None
    unsupported_sentences: int = Field(0, description="written-answer sentences flagged by the support check")
    support: list[SentenceSupportOut] = Field(default_factory=list, description="written answers: each sentence "
                                                                                 "scored against its cited passages")
    generation: GenerationStatsOut | None = None

    @classmethod
    def from_result(cls, result: QueryResult) -> "QueryResponse":
        """The response for a pipeline ``QueryResult``."""
        return cls(
            answer=result.answer,
            generator=result.generator,
            citations=[citation(s) for s in result.sources],
            stages=[StageTimingOut(name=t.name, ms=round(t.ms, 3)) for t in result.stages],
            degraded=result.degraded,
            degraded_reason=result.degraded_reason,
            unsupported_sentences=result.unsupported_sentences,
            support=support_out(result),
            generation=generation_out(result),
        )


def support_out(result: QueryResult) -> list[SentenceSupportOut]:
    """The support check's per-sentence results, for the response."""
    return [SentenceSupportOut(text=s.text, citations=list(s.citations), score=s.score, supported=s.supported)
            for s in result.support]


def generation_out(result: QueryResult) -> GenerationStatsOut | None:
    """Streamed-generation timing in milliseconds, or None for an extractive answer."""
    g = result.generation
    if g is None:
        return None
    tpot = g.time_per_output_token_s
    return GenerationStatsOut(model=g.model, ttft_ms=round(g.ttft_s * 1000, 3), output_tokens=g.output_tokens,
                              time_per_output_token_ms=None if tpot is None else round(tpot * 1000, 3))


def citation(source) -> Citation:
    """The ``Citation`` of a returned ``Source``."""
    c = source.chunk
    return Citation(number=source.number, doc_id=c.doc_id, title=c.title, chunk_start=c.start, chunk_end=c.end,
                    score=round(source.score, 6), text=c.text)


class ErrorBody(BaseModel):
    """Every error response's body (``rag.api.errors``)."""

    error: str = Field(description="machine-readable kind, e.g. invalid_request")
    reason: str = Field(description="a sentence saying what was wrong")
    stage: str | None = Field(None, description="the pipeline stage that failed, for server errors")
