"""Plain data passed between stages, and out of the pipeline to whoever observes it. Each stage returns its
result with its own timing; nothing here imports a metrics or tracing library."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Mapping, get_args

import numpy as np

from rag.errors import StageError
from rag.stages import CACHE_OUTCOMES, DEGRADED_REASONS, QUALITY_SIGNALS, QUALITY_VERDICTS, TOP_LEVEL

if TYPE_CHECKING:
    from rag.devicetime import DeviceTiming


DegradedReason = Literal["unavailable", "slow", "unsupported"]
"""Why an answer fell back to the extractive generator (``rag.stages.DEGRADED_REASONS``, the metric label set)."""
assert get_args(DegradedReason) == DEGRADED_REASONS
UnsupportedPolicy = Literal["drop", "mark"]
"""What happens to the unsupported sentences of a partly supported written answer (``generation.unsupported``)."""
UNSUPPORTED_MARK = "[unsupported]"
"""Written after each unsupported sentence of an answer when ``generation.unsupported`` is ``mark``."""
CacheOutcome = Literal["hit", "miss", "off"]
"""What the semantic answer cache did for a query (``QueryResult.cache``, the ``result`` label of
``ragheat_cache_requests_total``): served a stored answer, looked and stored the new one, or was not consulted."""
assert get_args(CacheOutcome) == CACHE_OUTCOMES


Verdict = Literal["good", "no_good_passage", "fell_back", "unsupported", "unscored"]
"""What the quality SLO counts an answer as (``rag.quality``; ``rag.stages.QUALITY_VERDICTS``, the metric label set)."""
assert get_args(Verdict) == QUALITY_VERDICTS


@dataclass(frozen=True)
class QualitySignals:
    """One answer's signals (None: not computed for this request) and its verdict."""

    verdict: Verdict
    best_similarity: float | None = None
    retriever_agreement: float | None = None
    rerank_top: float | None = None
    rerank_margin: float | None = None
    answer_support: float | None = None
    fused_top: float | None = None
    citations_per_sentence: float | None = None

    def values(self) -> dict[str, float]:
        """Signal name -> value, for those computed."""
        return {name: value for name in QUALITY_SIGNALS if (value := getattr(self, name)) is not None}



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
    """A query's vector, its token count and how long the model took."""

    vector: np.ndarray
    tokens: int
    seconds: float
    device: DeviceTiming | None = None  # the model run alone (rag.devicetime), tokenising excluded
    queued: float = 0.0  # seconds waiting for a shared model run (rag.embedding.batcher); not in ``seconds``


@dataclass(frozen=True)
class RetrievalResult:
    """One retriever's ranked hits for a query, and how long it took."""

    retriever: str
    hits: list[Hit]
    seconds: float
    device: DeviceTiming | None = None  # the index search alone (dense only: BM25 never runs on a GPU)


@dataclass(frozen=True)
class FusionResult:
    """The fused ranking of several retrievers' hits."""

    hits: list[Hit]
    seconds: float


@dataclass(frozen=True)
class AnswerSentence:
    """One sentence of an extractive answer and the source it was copied from."""

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
    """An answer (extractive sentences or a written text) with how it was produced."""

    generator: str
    sentences: list[AnswerSentence]
    seconds: float
    text: str | None = None  # a written answer, verbatim (extractive answers are built from ``sentences``)
    stats: GenerationStats | None = None
    support: tuple[SentenceSupport, ...] = ()  # the written text's sentences, also when they were discarded
    degraded_reason: DegradedReason | None = None  # why the answer fell back to the extractive generator
    degraded_detail: str | None = None  # the same in a sentence (the error, the timeout, the sentence count)
    unsupported_policy: UnsupportedPolicy | None = None  # written answers: how unsupported sentences were handled

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
    """Everything one query produced: the answer, its sources, every stage's timing, and generation details."""

    answer: str
    generator: str
    sources: list[Source]
    stages: list[StageTiming] = field(default_factory=list)
    sentences: list[AnswerSentence] = field(default_factory=list)
    retrieved: dict[str, int] = field(default_factory=dict)  # hits per retriever, before fusion
    generation: GenerationStats | None = None  # streamed generators only
    support: tuple[SentenceSupport, ...] = ()  # written answers only: each sentence vs its cited passages
    degraded_reason: DegradedReason | None = None  # set when the answer is the extractive fallback
    degraded_detail: str | None = None
    unsupported_policy: UnsupportedPolicy | None = None  # set when a model wrote (part of) the text
    route: str = "none"  # the retrievers that ran, as a closed label (rag.stages.RETRIEVAL_ROUTES)
    skipped: dict[str, str] = field(default_factory=dict)  # stage -> why it did not run (backend down, deadline)
    cache: CacheOutcome = "off"  # the semantic answer cache: hit (a stored answer), miss (looked, stored), off
    quality: QualitySignals | None = None  # label-free quality signals and verdict (rag.quality); None when off
    level: str = TOP_LEVEL  # the quality ladder's rung that served it (rag.stages.QUALITY_LEVELS)

    @property
    def fell_back(self) -> bool:
        """The answer is the extractive fallback of a language model (``degraded_reason`` says why)."""
        return self.degraded_reason is not None

    @property
    def degraded(self) -> bool:
        """Less than the full answer: the model's fallback, a stage skipped (``skipped`` says which and why), or served
        below the quality ladder's top rung (``level``)."""
        return self.fell_back or bool(self.skipped) or self.level != TOP_LEVEL

    @property
    def unsupported_sentences(self) -> int:
        return sum(not s.supported for s in self.support)

    def dropped(self, sentence: SentenceSupport) -> bool:
        """Whether a written sentence was left out of ``answer``: unsupported, and either the policy is ``drop``
        or no sentence was supported (the whole written answer was replaced by the extractive one)."""
        return not sentence.supported and (self.unsupported_policy == "drop" or self.degraded_reason == "unsupported")

    @property
    def dropped_sentences(self) -> int:
        return sum(self.dropped(s) for s in self.support)


@dataclass(frozen=True)
class RerankResult:
    """A reranker's new order of the candidates it was given (``Hit.score`` is its own score)."""

    hits: list[Hit]
    seconds: float


@dataclass(frozen=True)
class LinkedEntities:
    """The knowledge-graph entities a query names (stage ``link_entities``): entity id -> seed weight (how surely
    and how specifically the query names it), and how long linking took. Empty: the graph has nothing to add."""

    seeds: Mapping[int, float]
    seconds: float

NO_ENTITIES = LinkedEntities({}, 0.0)
"""What a query that names no entity links."""


@dataclass(frozen=True, eq=False)
class CacheKey:
    """What makes two requests the same question for the semantic answer cache (rag/cache): a query embedding within
    the cosine threshold of a stored one, and exactly the same ``scope``: how many sources, which retrievers
    (expanded, ``rag.routing.names.expand``), whether reranked, and the index generation that answered."""

    vector: np.ndarray
    top_k: int
    retrievers: tuple[str, ...]
    rerank: bool
    generation: str

    @property
    def scope(self) -> tuple:
        return self.top_k, self.retrievers, self.rerank, self.generation


@dataclass(frozen=True)
class CacheStats:
    """An answer cache's state, read by whoever exports it (telemetry's gauges, benchmarks): entries held, their
    estimated bytes, and counts since it was made (lookups that hit or missed, entries evicted for room, expired)."""

    entries: int
    bytes: int
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    expirations: int = 0


@dataclass(frozen=True)
class Route:
    """A router's choice for one query (stage ``route``): its name (one of ``rag.stages.ROUTER_ARMS``), the
    retrievers to run and their weights in fusion, how long deciding took, and whether the reranker runs when the
    request asks for it (False: the fused order is kept for this query)."""

    name: str
    retrievers: tuple[str, ...]
    weights: Mapping[str, float]
    seconds: float = 0.0
    rerank: bool = True


@dataclass(frozen=True)
class PipelineDescription:
    """What a warmed-up pipeline serves, for whoever reports on it (telemetry, ``/readyz``, logs), so that
    nobody reaches into the pipeline's stages."""

    index_folder: Path
    generation: str  # the index generation's name
    corpus: str
    chunks: int
    embedding_model: str
    generator: Literal["extractive", "openai", "vllm"]
    passage_precision: str = "int8"  # the precision the index's chunks were embedded at
    query_precision: str = "int8"  # the precision queries are embedded at (embedding.query_precision)
    lone_query_threads: int = 1  # the threads a query that finds the model to itself runs on (quiet_query_threads)
    vector_store: dict | None = None  # vector_store.backend=milvus: its collection, and whether searches fail now
    engine_metrics_dir: Path | None = None  # where an in-process vLLM engine's child process writes its metrics
    graph_backend: str | None = None  # the knowledge-graph store serving the graph retriever, None without a graph
    graph_ready: bool | None = None  # whether it answers right now (False while it is being restarted)


REQUEST_RECORD_KEY = "rag"
"""The attribute of Starlette's ``request.state`` (the key of the ASGI scope's ``state``) holding the
``RequestRecord``."""


@dataclass
class RequestRecord:
    """What the API learned about one query request, attached once to the request (``request.state.rag``) and
    filled in as it goes: the query and ``top_k`` first, then the result or the error that ended it. Whoever
    observes requests (telemetry's middleware) reads it when the response is complete; the API never calls them."""

    query: str | None = None
    top_k: int | None = None
    result: QueryResult | None = None
    error: BaseException | None = None
    observed: list[StageTiming] | None = None  # a service ragheat did not write: its stage scopes' timings

    @property
    def failed_stage(self) -> str | None:
        """The pipeline stage whose failure ended the request, if one did."""
        return self.error.stage if isinstance(self.error, StageError) else None

    @property
    def stages(self) -> list[StageTiming]:
        """The stages that ran: all of them, or those up to (and including) the one that failed."""
        if self.observed is not None:
            return self.observed
        if self.result is not None:
            return self.result.stages
        return self.error.stages if isinstance(self.error, StageError) else []
