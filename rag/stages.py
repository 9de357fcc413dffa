"""The stage table: every pipeline stage in the order a query runs them, with its properties, and the closed name
sets derived from it (metric label values, span names, ``rh:<stage>`` thread names).

Kept in a module of its own, free of heavy imports, so that processes that only label metrics (vLLM's, the probes
exporter, dashboards) need not load ONNX Runtime, FAISS and bm25s with it.

``RagPipeline.query`` (rag/pipeline.py) runs the stages in this order; a request runs a subset of them. The deadline
check (``rag.deadline``) reads the table to know which stages a request must still run after an optional one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Literal

Dependency = Literal["language_model", "graph_store", "vector_store"]


@dataclass(frozen=True)
class Stage:
    """One row of the stage table.

    ``optional``: a request's deadline may skip it (the answer is then degraded, not late). ``skippable``: a request
    is answered without it when its ``dependency`` is down. ``dependency``: the service outside the request's thread
    whose work or wait its time mostly is (the vector store only where it is a server: ``vector_store.backend``
    milvus; in process, the search is the stage's own work). ``wait``: time spent waiting, not working (left out of
    service times). ``language_model``: a part of running the language model. ``conditional``: only some requests run it
    (its latency series are created at zero, so a board reads "none yet" rather than "no data" where the feature is
    off). ``by_default``: the default service runs it for every query. ``instead_of``: the stage it replaces when it
    runs (the language model's answer replaces the extractive one)."""

    name: str
    summary: str
    optional: bool = False
    skippable: bool = False
    wait: bool = False
    language_model: bool = False
    conditional: bool = False
    by_default: bool = False
    instead_of: str | None = None
    dependency: Dependency | None = None


STAGE_TABLE: tuple[Stage, ...] = (
    Stage("queue", "the wait from arrival to the first stage: admission, the thread pool, an embedding micro-batch",
          wait=True),
    Stage("embed", "the query's vector and token states, one model run, on first use: before the cache lookup, the "
                   "entity linker (when it reads vectors), dense retrieval or the reranker", by_default=True),
    Stage("cache_lookup", "the query's embedding looked up in the semantic answer cache (rag/cache); a hit ends here",
          conditional=True),
    Stage("link_entities", "the knowledge-graph entities the query names (graph or routed requests)", conditional=True,
          by_default=True),
    Stage("route", "the router picks the retrievers, their fusion weights and whether the reranker runs (routed "
                   "requests)", conditional=True, by_default=True),
    Stage("hyde", "the language model writes a hypothetical passage, embedded to drive dense retrieval beside the "
                  "question", optional=True, conditional=True, dependency="language_model"),
    Stage("retrieve_dense", "FAISS search with the query's vector (or the vector store's, with vector_store.backend "
                            "milvus)", by_default=True, skippable=True, dependency="vector_store"),
    Stage("retrieve_bm25", "BM25 over the stemmed query (or the vector store's, with vector_store.backend milvus)",
          by_default=True, skippable=True, dependency="vector_store"),
    Stage("retrieve_graph", "the linked entities expanded in the graph store (only when an entity was linked)",
          optional=True, skippable=True, conditional=True, dependency="graph_store"),
    Stage("fuse", "weighted reciprocal-rank fusion of the retrievers' lists", by_default=True),
    Stage("rerank", "the fused candidates rescored by late interaction (rag/rerank)", optional=True, conditional=True,
          by_default=True),
    Stage("generate_prefill", "request sent to the language model -> its first token (the time to first token)",
          optional=True, language_model=True, instead_of="generate", dependency="language_model"),
    Stage("generate_decode", "the language model's first -> last token", language_model=True,
          dependency="language_model"),
    Stage("support_check", "each written sentence checked against the passages it cites", language_model=True),
    Stage("generate", "the extractive answer: the passages' own sentences, cited (also the language model's fallback)",
          by_default=True),
)
STAGE_BY_NAME = {stage.name: stage for stage in STAGE_TABLE}

STAGES = tuple(stage.name for stage in STAGE_TABLE)
"""Every stage name, in run order: the closed label set."""
CONDITIONAL_STAGES = tuple(s.name for s in STAGE_TABLE if s.conditional)
OPTIONAL_STAGES = tuple(s.name for s in STAGE_TABLE if s.optional)
"""Stages a request may be answered without when its deadline cannot hold them (``generate_prefill`` stands for the
whole language model; the extractive answer replaces it)."""
SKIPPABLE_STAGES = tuple(s.name for s in STAGE_TABLE if s.skippable)
LANGUAGE_MODEL_STAGES = tuple(s.name for s in STAGE_TABLE if s.language_model)
WAIT_STAGES = tuple(s.name for s in STAGE_TABLE if s.wait)
DEPENDENCY = {s.name: s.dependency for s in STAGE_TABLE if s.dependency}
"""Stage -> the service outside the request's thread it calls (``Stage.dependency``): a stage skipped more often
points at it (explain)."""
SLOWED_BY_DEPENDENCY = {stage: d for stage, d in DEPENDENCY.items() if d != "vector_store"}
"""Stages whose time is mostly their dependency's wherever ragheat runs: explain and the Why board charge their growth
to it. The vector store's stages are left out: by default the search runs in process, its time the stage's own work
(a server's waits show in the kernel's view of the stage, as the network)."""
DEFAULT_STAGES = tuple(s.name for s in STAGE_TABLE if s.by_default)
"""The stages the default service runs for a question that names no entity, in order: routed (its entities looked
for, the router's choice), hybrid retrieval, reranked when the router keeps the reranker, the extractive answer. A
question that names an entity also runs ``retrieve_graph``."""


def estimated_as(name: str) -> tuple[str, ...]:
    """The stages whose recent times make up what ``name`` costs: the language model's first stage stands for all
    of the model's stages (deciding to run it commits to the rest)."""
    return LANGUAGE_MODEL_STAGES if STAGE_BY_NAME[name].language_model else (name,)


def still_to_run(name: str, planned: Iterable[str]) -> tuple[str, ...]:
    """The mandatory stages of ``planned`` that run after optional stage ``name``: what a deadline must still hold
    once ``name`` has run. Optional stages are not reserved (each is checked in its turn), nor is the stage ``name``
    replaces, nor ``name``'s own parts."""
    stage = STAGE_BY_NAME[name]
    planned = set(planned)
    after = STAGES[STAGES.index(name) + 1:]
    own = set(estimated_as(name))
    return tuple(n for n in after if n in planned and n not in own and n != stage.instead_of
                 and not STAGE_BY_NAME[n].optional and not STAGE_BY_NAME[n].wait)


def describes(name: str) -> str:
    """How a deadline's sentence names a stage: the language model's first stage is "the language model"."""
    return "the language model" if STAGE_BY_NAME[name].language_model else name


RETRIEVERS = ("dense", "bm25", "graph")
RETRIEVER_CHOICES = RETRIEVERS + ("routed",)
"""What a request or ``retrieval.retrievers`` may name: retrievers (fused when several), or ``routed`` alone."""
ROUTER_ARMS = ("hybrid", "hybrid+graph", "bm25-heavy", "dense-heavy", "bm25-heavy+graph")
"""The routes the router chooses between (weights in ``rag.routing.arms``)."""
RETRIEVAL_ROUTES = ("dense", "bm25", "graph", "hybrid", "dense+graph", "bm25+graph", "hybrid+graph", "bm25-heavy",
                    "dense-heavy", "bm25-heavy+graph", "none")
"""The ``retrieval_route`` label of request metrics (and the ``rag.route`` span attribute): the retrievers a request
ran, named as in ``ragheat eval`` (``hybrid`` = dense+bm25), or the router's arm; ``none`` = it ended before
retrieving (refused, or failed first)."""
DEGRADED_REASONS = ("unavailable", "slow", "unsupported")
"""Why an answer fell back to the extractive generator (``rag.types.DegradedReason``): the model was down or failed
(``unavailable``), sent no token or finished too late (``slow``), or none of its sentences was supported by the
passages (``unsupported``)."""
RELOAD_OUTCOMES = ("swapped", "unchanged", "failed")
"""What a reload did (``rag.index_generations``): a new generation is served, the served one is still the newest, or
the new one could not be loaded (the old one keeps serving). The ``outcome`` label of
``ragheat_index_reloads_total``."""
UNIT_SIGNALS = ("best_similarity", "retriever_agreement", "fused_top", "answer_support")
"""Answer-quality signals between 0 and 1 (``rag.quality``; the ``signal`` label of ``ragheat_quality_score``)."""
RERANK_SIGNALS = ("rerank_top", "rerank_margin")
"""The reranker's scores as quality signals (the ``signal`` label of ``ragheat_quality_rerank_score``): its head's
scale, not 0..1."""
PER_SENTENCE_SIGNALS = ("citations_per_sentence",)
"""Counts per written sentence as quality signals (the ``signal`` label of ``ragheat_quality_sentence_citations``)."""
QUALITY_SIGNALS = UNIT_SIGNALS + RERANK_SIGNALS + PER_SENTENCE_SIGNALS
QUALITY_VERDICTS = ("good", "no_good_passage", "fell_back", "unsupported", "unscored")
"""What the quality SLO counts an answer as (``rag.quality.signals.Verdict``; the ``verdict`` label of
``ragheat_answer_quality_total``)."""
BAD_VERDICTS = ("no_good_passage", "fell_back", "unsupported")
"""Verdicts that spend the quality SLO's error budget; ``unscored`` answers count on neither side."""
JUDGE_OUTCOMES = ("relevant", "not_relevant", "unparsed", "failed", "dropped")
"""What became of a pair the sampled judge (``rag.quality.judge``) was offered (the ``outcome`` label of
``ragheat_quality_judged_total``)."""

CACHE_OUTCOMES = ("hit", "miss", "off")
"""What the semantic answer cache did for a query (``rag.types.CacheOutcome``): served a stored answer, looked and
stored the new one, or was not consulted. The ``result`` label of ``ragheat_cache_requests_total``."""


@dataclass(frozen=True)
class QualityLevel:
    """One rung of the quality ladder: what a request runs at this level, of what the service is configured to run
    (a knob the service does not use changes nothing). Each rung keeps the cuts of the rungs above it.

    ``rerank_candidates``: None = ``rerank.candidates``; a number caps it; 0 = no rerank. ``search_effort``: the share
    of the dense search's effort (HNSW efSearch, IVF nprobe) and of the candidates each retriever hands to fusion
    (``retrieval.candidates``)."""

    name: str
    summary: str
    hyde: bool = True
    language_model: bool = True
    graph: bool = True
    rerank_candidates: int | None = None
    dense: bool = True
    search_effort: float = 1.0


LEVEL_TABLE: tuple[QualityLevel, ...] = (
    QualityLevel("full", "everything the service is configured to run"),
    QualityLevel("no_hyde", "without the hypothetical passage (HyDE)", hyde=False),
    QualityLevel("extractive", "the extractive answer instead of the language model's", hyde=False,
                 language_model=False),
    QualityLevel("no_graph", "without the knowledge graph's expansion", hyde=False, language_model=False, graph=False),
    QualityLevel("shallow_rerank", "the reranker rescores 20 candidates", hyde=False, language_model=False, graph=False,
                 rerank_candidates=20),
    QualityLevel("no_rerank", "the fused lists without reranking", hyde=False, language_model=False, graph=False,
                 rerank_candidates=0),
    QualityLevel("light_search", "a quarter of the dense search's effort and of the candidates fused", hyde=False,
                 language_model=False, graph=False, rerank_candidates=0, search_effort=0.25),
    QualityLevel("bm25_only", "BM25 alone: the query is never embedded", hyde=False, language_model=False,
                 graph=False, rerank_candidates=0, dense=False, search_effort=0.25),
)
LEVEL_BY_NAME = {level.name: level for level in LEVEL_TABLE}
SEARCH_EFFORTS = tuple(sorted({level.search_effort for level in LEVEL_TABLE}))
QUALITY_LEVELS = tuple(level.name for level in LEVEL_TABLE)
"""The quality ladder's rungs, best first (``rag.steering``); with ``none`` (not answered by the pipeline) the
``quality_level`` label of ``ragheat_request_duration_seconds``."""
TOP_LEVEL = QUALITY_LEVELS[0]
LEVEL_LABELS = QUALITY_LEVELS + ("none",)
LEVEL_DIRECTIONS = ("down", "up")
"""The ``direction`` label of ``ragheat_quality_level_changes_total``."""
PRIORITIES = ("high", "normal", "low")
"""A request's priority (``X-Request-Priority``): low-priority requests are served a lower level, and refused,
first."""
PRIORITY_OUTCOMES = ("answered", "shed")
