"""One request's state on its way through the pipeline, and the timer that records each stage it runs.

``RagPipeline.query`` creates a ``QueryContext`` and passes it down: the retrievers the request runs (after
routing), its deadline, the stages it ran, its route, the linked entities, each retriever's list, the fused hits,
the stages it skipped and why, and the query's vector and token states (embedded once, on first use). Nothing is
kept twice: the answer's ``skipped`` is this context's, and ``QueryResult.degraded`` reads it.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

import numpy as np

from rag.deadline import Deadline
from rag.errors import StageError
from rag.protocols import Fuser, Reranker
from rag.stages import LEVEL_BY_NAME, TOP_LEVEL, QualityLevel, still_to_run
from rag.threadnames import original_name, set_name, stage_comm
from rag.types import (NO_ENTITIES, CacheKey, GenerationResult, Hit, LinkedEntities, QueryResult, RetrievalResult,
                       Source, StageTiming)


@dataclass(frozen=True)
class StageOptions:
    """How every stage of a pipeline is timed: ``thread_names`` names the OS thread ``rh:<stage>`` meanwhile (see
    ``rag.threadnames``); ``delay_stage``/``delay_s`` add injected latency to one stage (``faults`` settings)."""

    thread_names: bool = False
    delay_stage: str | None = None
    delay_s: float = 0.0


class StageTimer:
    """Times a block as one stage, appends its ``StageTiming`` to ``stages``, and re-raises any failure as a
    ``StageError`` naming the stage.

    The block may set ``device`` to the ``rag.devicetime.DeviceTiming`` of its GPU-capable work, and ``waited`` to
    the seconds of it spent queueing (reported as ``queue``, not as this stage)."""

    def __init__(self, name: str, stages: list[StageTiming], options: StageOptions) -> None:
        self.name, self.stages, self.options = name, stages, options

    def __enter__(self) -> "StageTimer":
        self.device, self.waited = None, 0.0
        if self.options.thread_names:
            self.restore_name = original_name()  # read before the first rename, cached per thread
            set_name(stage_comm(self.name))
        self.start = time.perf_counter()
        if self.name == self.options.delay_stage and self.options.delay_s > 0:
            time.sleep(self.options.delay_s)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        device = self.device
        self.stages.append(StageTiming(self.name, time.perf_counter() - self.start - self.waited, self.start,
                                       None if device is None else device.device_seconds,
                                       None if device is None else device.clock))
        if self.options.thread_names:
            set_name(self.restore_name)
        if exc is not None and not isinstance(exc, StageError):
            raise StageError(self.name, exc) from exc
        return False


@dataclass
class QueryContext:
    """What one request is and has done so far. ``names``: the retrievers it runs (``routed`` until the router has
    chosen); ``rerank``/``hyde``: whether those stages are asked for; ``deadline``: None = no deadline (every
    optional stage runs). The rest is filled in as the stages run."""

    query: str
    top_k: int
    names: tuple[str, ...]
    rerank: bool = False
    hyde: bool = False
    deadline: Deadline | None = None
    options: StageOptions = StageOptions()
    level: QualityLevel = LEVEL_BY_NAME[TOP_LEVEL]  # the quality ladder's rung it is served at (rag.steering)
    rerank_depth: int = 0  # fused candidates the reranker rescores, when reranking
    reranker: Reranker | None = None  # the pipeline's, or another head's (evaluation)
    stages: list[StageTiming] = field(default_factory=list)
    route: str = "none"  # a closed label (rag.stages.RETRIEVAL_ROUTES)
    linked: LinkedEntities = NO_ENTITIES
    fuser: Fuser | None = None  # the fusion weights: the route's own when routed
    vector: np.ndarray | None = None  # the query's embedding, once the embed stage has run
    token_states: np.ndarray | None = None  # from the same model run, when reranking
    results: list[RetrievalResult] = field(default_factory=list)  # each retriever's list, before fusion
    retrieved: dict[str, int] = field(default_factory=dict)  # hits per retriever, before fusion
    hits: list[Hit] = field(default_factory=list)  # the fused (and reranked) top k
    skipped: dict[str, str] = field(default_factory=dict)  # stage -> why it did not run
    cache_key: CacheKey | None = None  # set when the answer cache was asked
    best_similarity: float | None = None  # the question's own dense search: its closest passage's score
    fused_top_score: float | None = None  # the first fused passage's score, when more than one list was fused
    reranked: list[Hit] | None = None  # the reranker's top hits with its scores, when it ran

    def cut_by_level(self, names: tuple[str, ...]) -> tuple[str, ...]:
        """``names`` without the retrievers this request's level leaves out (BM25 stays whatever the level)."""
        kept = tuple(n for n in names if (n != "graph" or self.level.graph) and (n != "dense" or self.level.dense))
        return kept or ("bm25",)

    def stage(self, name: str) -> StageTimer:
        """``with context.stage("fuse"): ...`` times the block as that stage of this request."""
        return StageTimer(name, self.stages, self.options)

    def planned(self) -> set[str]:
        """The mandatory-or-asked stages this request is set to run from here on, as far as it is known."""
        planned = {f"retrieve_{name}" for name in self.names} | {"generate"}
        if len(self.names) > 1:
            planned.add("fuse")
        if self.rerank:
            planned.add("rerank")
        return planned

    def fits(self, stage: str) -> bool:
        """Whether the deadline holds optional ``stage`` with the mandatory stages still to run after it; when not,
        ``skipped`` says why and the stage does not run."""
        if self.deadline is None or not self.deadline.enabled:  # every optional stage runs
            return True
        why = self.deadline.shortfall(stage, still_to_run(stage, self.planned()))
        if why is None:
            return True
        self.skipped[stage] = why
        return False

    def add_wait(self, start: float, seconds: float) -> None:
        """Count ``seconds`` spent waiting (from the request's arrival for a worker thread, for an embedding
        micro-batch) as the request's one ``queue`` stage: the first wait starts it (placed first), later waits add
        to it."""
        for i, stage in enumerate(self.stages):
            if stage.name == "queue":
                self.stages[i] = dataclasses.replace(stage, seconds=stage.seconds + seconds)
                return
        self.stages.insert(0, StageTiming("queue", seconds, start))

    def result(self, generation: GenerationResult, sources: list[Source]) -> QueryResult:
        return QueryResult(generation.answer, generation.generator, sources, self.stages, generation.sentences,
                           self.retrieved, generation.stats, generation.support, generation.degraded_reason,
                           generation.degraded_detail, generation.unsupported_policy, route=self.route,
                           skipped=self.skipped, cache="off" if self.cache_key is None else "miss",
                           level=self.level.name)
