"""``POST /v1/query/stream``: the pipeline runs on a worker thread and hands what it produces (sources, tokens,
the result or an error) to the event loop through a queue, which turns each into server-sent events."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from typing import AsyncIterator, Callable

from fastapi.concurrency import run_in_threadpool

from rag.api.schemas import SkippedStageOut, citation, generation_out, quality_out
from rag.errors import StageError
from rag.types import QueryResult, RequestRecord

log = logging.getLogger("ragheat.api")


class ClientDisconnected(Exception):
    """Raised into a streamed generation whose client has gone, to stop it."""


class QueryStream:
    """One streamed query. ``start()`` runs ``run(on_sources=..., on_token=...)`` on a worker thread and returns
    the first item it produced: an error there (nothing sent yet) is raised by the caller as the usual JSON error;
    anything else starts ``events()``."""

    def __init__(self, run: Callable[..., QueryResult], record: RequestRecord) -> None:
        self.run, self.record = run, record
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()
        self.client_gone = threading.Event()  # set when the response ends, the client's disconnect included

    def _put(self, kind: str, value) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, (kind, value))

    def _on_token(self, text: str) -> None:
        if self.client_gone.is_set():  # stop generating for nobody: the stream's close aborts the model's request
            raise ClientDisconnected("the client closed the stream")
        self._put("token", text)

    def _work(self) -> None:
        try:
            self._put("result", self.run(on_sources=lambda s: self._put("sources", s), on_token=self._on_token))
        except BaseException as exc:  # handed to the event loop; raised or reported there
            self._put("error", exc)

    async def start(self) -> tuple[str, object]:
        """Start the pipeline on a worker thread; the first thing it produced."""
        self.worker = asyncio.ensure_future(run_in_threadpool(self._work))
        return await self.queue.get()

    async def events(self, first: tuple[str, object]) -> AsyncIterator[bytes]:
        """Server-sent events from ``first`` on, until the result (or a failure) has been sent."""
        try:
            async for chunk in self._events(first):
                yield chunk
        finally:
            self.client_gone.set()

    async def _events(self, item: tuple[str, object]) -> AsyncIterator[bytes]:
        tokens = 0
        while True:
            kind, value = item
            if kind == "sources":
                yield sse("sources", [citation(s).model_dump() for s in value])
            elif kind == "token":
                tokens += 1
                yield sse("token", {"text": value})
            elif kind == "result":
                for chunk in final_events(value, tokens):
                    yield chunk
                break
            else:  # a stage failed after the status line went out: say so in the stream
                self.record.error = value
                stage = value.stage if isinstance(value, StageError) else "generate"
                log.error("stage %s failed during a stream", stage, exc_info=getattr(value, "cause", value))
                yield sse("error", {"error": "stage_failed", "reason": f"the {stage} stage failed", "stage": stage})
                break
            item = await self.queue.get()
        await self.worker


def final_events(result: QueryResult, tokens_sent: int):
    """After the streamed tokens: ``degraded`` (the tokens must be discarded: the extractive answer follows), or
    ``dropped`` (the unsupported sentences left out of the answer); one ``answer`` per sentence of the answer as
    served; then ``done``."""
    if result.fell_back and tokens_sent:
        yield sse("degraded", {"reason": result.degraded_reason, "detail": result.degraded_detail,
                               "discard_tokens": tokens_sent})
    if result.support and not result.fell_back:
        dropped = [(i, s) for i, s in enumerate(result.support) if result.dropped(s)]
        if dropped:
            yield sse("dropped", {"count": len(dropped), "sentences": [
                {"position": i, "text": s.text, "citations": list(s.citations), "score": s.score} for i, s in dropped]})
        for s in result.support:
            if not result.dropped(s):
                yield sse("answer", {"text": s.text, "citation": s.citations[0] if s.citations else None,
                                     "citations": list(s.citations), "supported": s.supported, "score": s.score,
                                     "marked": not s.supported})
    else:
        for sentence in result.sentences:
            yield sse("answer", {"text": f"{sentence.text} [{sentence.citation}]", "citation": sentence.citation})
    generation = generation_out(result)
    # The same fields, meaning the same, as the JSON response (rag.api.schemas.QueryResponse): a skipped stage makes
    # the answer degraded too, while the ``degraded`` event above is only about discarding streamed tokens.
    yield sse("done", {"generator": result.generator,
                       "stages": [{"name": t.name, "ms": round(t.ms, 3)} for t in result.stages],
                       "route": result.route, "quality_level": result.level,
                       "skipped_stages": [SkippedStageOut(stage=stage, reason=reason).model_dump()
                                          for stage, reason in result.skipped.items()],
                       "degraded": result.degraded, "degraded_reason": result.degraded_reason,
                       "degraded_detail": result.degraded_detail,
                       "unsupported_sentences": result.unsupported_sentences,
                       "dropped_sentences": result.dropped_sentences, "unsupported_policy": result.unsupported_policy,
                       "generation": generation.model_dump() if generation else None, "cache": result.cache,
                       "quality": quality.model_dump() if (quality := quality_out(result)) else None})


def sse(event: str, data) -> bytes:
    """One server-sent event."""
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()
