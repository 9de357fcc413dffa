"""Request and response bodies of the HTTP API (they are also the OpenAPI schema)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rag.routing.names import expand
from rag.stages import QUALITY_LEVELS
from rag.types import QueryResult

MAX_RETRIEVER_NAMES = 4
MAX_RETRIEVER_NAME_CHARS = 64
BLANK_CHARACTERS = "".join(sorted({chr(c) for c in range(0x3001) if chr(c).isspace()} | {"\ufeff"}))
"""What a query may not consist of only: Python's whitespace (``str.isspace``, which ``str.strip`` trims) and JSON
Schema's (ECMA-262 ``\\s``, which adds U+FEFF), so the schema's pattern (``rag.api.openapi``) and the service agree on
every string (a query of U+0085 alone is blank to Python, not to ``\\S``). No whitespace lies above U+3000."""


class QueryRequest(BaseModel):
    """``POST /v1/query`` body. Unknown fields are rejected rather than silently ignored."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={
        "examples": [{"query": "What causes the seasons on Earth?", "top_k": 5, "retrievers": ["dense", "bm25"]}]})

    # Every bound the service enforces is stated in the OpenAPI schema (rag.api.openapi adds those that depend on
    # settings or on the index served: server.max_query_chars, whether graph and routed can run).
    query: str = Field(description="the question: 1 to server.max_query_chars characters as sent, not all "
                                   "whitespace; surrounding whitespace is trimmed before it is answered")
    top_k: int | None = Field(None, ge=1, le=100, description="sources to return (default: server.default_top_k)")
    retrievers: list[str] | None = Field(
        None, min_length=1, max_length=MAX_RETRIEVER_NAMES,
        description="dense, bm25, graph (several are fused by weighted RRF), +-joined combinations (hybrid = "
                    "dense+bm25, hybrid+graph), or routed alone (the router picks per query); no spaces, no name "
                    "twice; default: retrieval.retrievers")

    timeout_ms: int | None = Field(
        None, ge=1, le=600_000, description="this query's deadline in milliseconds from its arrival, at most "
                                            "admission.max_timeout_ms (default admission.deadline_ms, the SLO; the "
                                            "X-Request-Timeout-Ms header may set it too: the tighter wins). A query "
                                            "that cannot finish in time is refused (503, Retry-After); optional stages "
                                            "the time left cannot hold are skipped (skipped_stages)")

    @field_validator("query")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        # Kept as sent: the length limit (checked by the route against server.max_query_chars) counts what was sent,
        # as the schema's maxLength does; the route answers the trimmed text.
        if not value.strip(BLANK_CHARACTERS):
            raise ValueError("query must not be empty")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("query must be valid Unicode text (it contains an unpaired surrogate)") from None
        return value

    @field_validator("top_k", "timeout_ms", mode="before")
    @classmethod
    def _json_integer(cls, value):
        # As JSON Schema reads "integer": 5 and 5.0 are, "5" and true are not (pydantic would accept both).
        if isinstance(value, (bool, str)):
            raise ValueError("Input should be a valid integer")
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return value

    @field_validator("retrievers")
    @classmethod
    def _known(cls, value):
        if value is None:
            return value
        if len(set(value)) != len(value):
            raise ValueError("retrievers must not repeat a name")
        for name in value:
            if len(name) > MAX_RETRIEVER_NAME_CHARS or any(c.isspace() for c in name):
                raise ValueError(f"retrievers: {name[:MAX_RETRIEVER_NAME_CHARS]!r} is not a name (at most "
                                 f"{MAX_RETRIEVER_NAME_CHARS} characters, no spaces)")
        return list(expand(value))  # a ValueError names what is wrong: a 422 with that reason


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
    dropped: bool = Field(False, description="true = left out of the answer (unsupported, and generation.unsupported "
                                             "is drop or no sentence was supported)")


class GenerationStatsOut(BaseModel):
    """Client-side timing of a streamed (language-model) answer; present also when the written text was
    discarded for the extractive answer (the model did answer, and was timed)."""

    model: str
    ttft_ms: float = Field(description="request sent -> first token, as ragheat saw it")
    time_per_output_token_ms: float | None = Field(description="mean gap between streamed tokens")
    output_tokens: int


class SkippedStageOut(BaseModel):
    """A stage the answer was served without: its backend was unavailable (the graph store, say), or the query's
    deadline could not hold it."""

    stage: str
    reason: str


class QualityOut(BaseModel):
    """The answer's label-free quality signals (rag/quality, docs/quality.md) and the verdict the quality SLO counts;
    a signal is null where this request did not compute it."""

    verdict: Literal["good", "no_good_passage", "fell_back", "unsupported", "unscored"] = Field(
        description="good; no_good_passage = the closest passage's similarity lies under the calibrated threshold "
                    "(the corpus may not cover the question); fell_back = the language model's answer was replaced; "
                    "unsupported = too few written sentences supported; unscored = no dense search ran")
    best_similarity: float | None = Field(None, description="cosine of the query with the closest passage found")
    retriever_agreement: float | None = Field(None, description="share of the dense top 10 that BM25's top 10 holds")
    rerank_top: float | None = Field(None, description="the reranker's score of the first passage")
    rerank_margin: float | None = Field(None, description="its lead over the second")
    fused_top: float | None = Field(None, description="the first fused passage's score between the least it can be "
                                                      "(first in one list, 0) and the most (first in all, 1)")
    answer_support: float | None = Field(None, description="share of the written sentences the support check "
                                                           "accepted")
    citations_per_sentence: float | None = Field(None, description="citation markers per written sentence")


def quality_out(result: QueryResult) -> QualityOut | None:
    q = result.quality
    return None if q is None else QualityOut(verdict=q.verdict, **{k: round(v, 4) for k, v in q.values().items()})


class QueryResponse(BaseModel):
    """``POST /v1/query`` response: the answer, its citations and every stage's time."""

    answer: str
    citations: list[Citation]
    stages: list[StageTimingOut]
    generator: str
    degraded: bool = Field(False, description="true when the answer is the extractive fallback (the language model "
                                              "was down or slow, or none of its sentences was supported: "
                                              "degraded_reason says which), when a stage was skipped because its "
                                              "backend was unavailable (skipped_stages names it), or when it was "
                                              "served below the quality ladder's top rung (quality_level)")
    quality_level: Literal[QUALITY_LEVELS] = Field("full", description="the quality ladder's rung that served it: full, or a cheaper one "
                                                   "the load controller stepped down to (steering.enabled): no_hyde, "
                                                   "extractive, no_graph, shallow_rerank, no_rerank, light_search, bm25_only")
    degraded_reason: Literal["unavailable", "slow", "unsupported"] | None = Field(
        None, description="why it is degraded: unavailable (down, refusing, erroring), slow (no token within "
                          "generation.first_token_timeout_s or not done by deadline_s), unsupported (no written "
                          "sentence supported by the passages; the written text is not served)")
    degraded_detail: str | None = Field(None, description="the same in a sentence: the error, the timeout, the count")
    unsupported_sentences: int = Field(0, description="written-answer sentences flagged by the support check")
    dropped_sentences: int = Field(0, description="written sentences left out of the answer")
    unsupported_policy: Literal["drop", "mark"] | None = Field(
        None, description="written answers: what was done with unsupported sentences (generation.unsupported): drop = "
                          "left out, mark = kept with [unsupported] after them")
    support: list[SentenceSupportOut] = Field(default_factory=list, description="written answers: each sentence "
                                                                                 "scored against its cited passages")
    generation: GenerationStatsOut | None = None
    route: str = Field("none", description="the retrievers that ran, or the router's choice (hybrid, hybrid+graph, "
                                           "bm25-heavy, ...)")
    skipped_stages: list[SkippedStageOut] = Field(
        default_factory=list, description="stages skipped because their backend was unavailable, or because the "
                                          "query's deadline could not hold them (reason 'deadline: ...'; rerank, "
                                          "retrieve_graph, hyde, generate_prefill = the language model); the answer "
                                          "is then degraded")
    cache: Literal["hit", "miss", "off"] = Field(
        "off", description="the semantic answer cache (cache.enabled): hit = the answer stored for a query this close "
                           "(same top_k, retrievers, index generation), its stages only embed and cache_lookup; miss = "
                           "answered afresh (and stored unless degraded); off = the cache is not in use")
    quality: QualityOut | None = Field(None, description="label-free quality signals and verdict (quality.enabled)")

    @classmethod
    def from_result(cls, result: QueryResult) -> "QueryResponse":
        """The response for a pipeline ``QueryResult``."""
        return cls(
            answer=result.answer,
            generator=result.generator,
            citations=[citation(s) for s in result.sources],
            stages=[StageTimingOut(name=t.name, ms=round(t.ms, 3)) for t in result.stages],
            degraded=result.degraded,
            quality_level=result.level,
            degraded_reason=result.degraded_reason,
            degraded_detail=result.degraded_detail,
            unsupported_sentences=result.unsupported_sentences,
            dropped_sentences=result.dropped_sentences,
            unsupported_policy=result.unsupported_policy,
            support=support_out(result),
            generation=generation_out(result),
            route=result.route,
            skipped_stages=[SkippedStageOut(stage=stage, reason=reason) for stage, reason in result.skipped.items()],
            cache=result.cache,
            quality=quality_out(result),
        )


def support_out(result: QueryResult) -> list[SentenceSupportOut]:
    """The support check's per-sentence results, for the response."""
    return [SentenceSupportOut(text=s.text, citations=list(s.citations), score=s.score, supported=s.supported,
                               dropped=result.dropped(s))
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


class ReloadResponse(BaseModel):
    """``POST /admin/reload``: what the reload did."""

    outcome: Literal["swapped", "unchanged"] = Field(description="swapped = a newer generation is served now; "
                                                                 "unchanged = the served one is still the newest")
    generation: str = Field(description="the generation served from now on")
    previous: str = Field(description="the generation served before the call")
