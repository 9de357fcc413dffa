"""The FastAPI service: ``/v1/query``, ``/v1/query/stream`` (SSE), ``/healthz``, ``/readyz``, OpenAPI at ``/docs``."""

from __future__ import annotations

import asyncio
import gc
import threading
import json
import logging
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, StreamingResponse

from rag import __version__
from rag.api.errors import ApiError, error_response, install_error_handlers
from rag.api.schemas import ErrorBody, QueryRequest, QueryResponse, citation, generation_out
from rag.errors import StageError
from rag.pipeline import RagPipeline
from rag.settings import RagheatSettings
from rag.threadnames import set_name, stage_comm

log = logging.getLogger("ragheat.api")
ERROR_RESPONSES = {status: {"model": ErrorBody} for status in (400, 413, 422, 500, 503)}


class BodyLimitMiddleware:
    """Rejects request bodies over ``limit`` bytes with 413, by header or by counting what arrives."""

    def __init__(self, app, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await self._reject(scope, receive, send)
        # Read the whole body here (at most ``limit`` bytes are held), then replay it to the app:
        # an exception raised inside the app's own body reading would be turned into a 400 there.
        chunks, received = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunks.append(message.get("body", b""))
            received += len(chunks[-1])
            if received > self.limit:
                return await self._reject(scope, receive, send)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as exc:
            response = error_response(400, "invalid_utf8", f"request body is not valid UTF-8 "
                                                           f"({exc.reason} at byte {exc.start})")
            return await response(scope, receive, send)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _reject(self, scope, receive, send):
        response = error_response(413, "body_too_large",
                                  f"request body exceeds {self.limit} bytes (server.max_body_bytes)")
        await response(scope, receive, send)


def create_app(settings: RagheatSettings, index_dir: Path | None = None,
               pipeline: RagPipeline | None = None) -> FastAPI:
    """Build the app; the index and model load in the lifespan, before the first request is accepted."""
    pipeline = pipeline or RagPipeline(settings, index_dir or settings.server.index_dir)
    server = settings.server

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if server.stage_thread_names:
            set_name(stage_comm("http"))  # the event-loop thread, for kernel probes (rag.threadnames)
        await run_in_threadpool(pipeline.warm_up)  # raises IndexLoadError naming the path: startup fails
        # The index, model and their Python objects live as long as the process: move them out of the garbage
        # collector's reach, so collections triggered by per-request allocations stop re-scanning them.
        gc.freeze()
        log.info("index %s loaded: %s chunks", pipeline.index.folder, pipeline.index.manifest["counts"]["chunks"])
        yield
        if pipeline.llm is not None:  # the model client's connections, or the in-process engine's processes
            pipeline.llm.close()

    app = FastAPI(title="ragheat", version=__version__, lifespan=lifespan,
                  description="Observability-first RAG: hybrid retrieval with cited, per-stage-timed answers.")
    app.state.pipeline = pipeline
    app.add_middleware(BodyLimitMiddleware, limit=server.max_body_bytes)
    install_error_handlers(app)

    def run_query(request: QueryRequest, http: Request, **callbacks):
        # Left on request.state for whoever observes requests (telemetry's middleware); rag/ never calls it.
        top_k = request.top_k or server.default_top_k
        http.state.rag_query, http.state.rag_top_k = request.query, top_k
        if len(request.query) > server.max_query_chars:
            raise ApiError(422, "invalid_request", f"query: {len(request.query)} characters is over the limit of "
                                                   f"{server.max_query_chars} (server.max_query_chars)")
        if not pipeline.ready:
            raise ApiError(503, "not_ready", "the index is still loading")
        result = pipeline.query(request.query, top_k, request.retrievers, **callbacks)
        http.state.rag_result = result
        return result

    @app.post("/v1/query", response_model=QueryResponse, responses=ERROR_RESPONSES)
    def query(request: QueryRequest, http: Request) -> QueryResponse:
        """Retrieve, fuse and answer; the answer's ``[n]`` markers refer to ``citations[n-1]``."""
        return QueryResponse.from_result(run_query(request, http))

    @app.post("/v1/query/stream", responses={200: {"content": {"text/event-stream": {}}}, **ERROR_RESPONSES})
    async def query_stream(request: QueryRequest, http: Request):
        """Server-sent events: ``sources`` first; with a language model, one ``token`` event per streamed piece
        as it arrives (and ``degraded`` if the model failed and the extractive answer follows); then one
        ``answer`` event per sentence; then ``done`` with the generator, stage timings and flags."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        client_gone = threading.Event()  # set when the response ends, the client's disconnect included

        def put(kind: str, value) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, (kind, value))

        def on_token(text: str) -> None:
            if client_gone.is_set():  # stop generating for nobody: the stream's close aborts the model's request
                raise ClientDisconnected("the client closed the stream")
            put("token", text)

        def work() -> None:
            try:
                put("result", run_query(request, http, on_sources=lambda s: put("sources", s), on_token=on_token))
            except BaseException as exc:  # handed to the event loop; raised or reported there
                put("error", exc)

        worker = asyncio.ensure_future(run_in_threadpool(work))
        first = await queue.get()
        if first[0] == "error":
            raise first[1]  # nothing sent yet: the usual JSON error and status

        async def events():
            try:
                async for chunk in _stream_events(first):
                    yield chunk
            finally:
                client_gone.set()

        async def _stream_events(first_item):
            item, tokens = first_item, 0
            while True:
                kind, value = item
                if kind == "sources":
                    yield _sse("sources", [citation(s).model_dump() for s in value])
                elif kind == "token":
                    tokens += 1
                    yield _sse("token", {"text": value})
                elif kind == "result":
                    for chunk in _final_events(value, tokens):
                        yield chunk
                    break
                else:  # a stage failed after the status line went out: say so in the stream
                    http.state.rag_error = value
                    stage = value.stage if isinstance(value, StageError) else "generate"
                    log.error("stage %s failed during a stream", stage, exc_info=getattr(value, "cause", value))
                    yield _sse("error", {"error": "stage_failed", "reason": f"the {stage} stage failed", "stage": stage})
                    break
                item = await queue.get()
            await worker

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    @app.get("/healthz")
    def healthz() -> dict:
        """Liveness: the process answers."""
        return {"status": "ok"}

    @app.get("/readyz", responses={503: {"model": ErrorBody}})
    def readyz():
        """Readiness: the index and model are loaded and queries can be served."""
        if not pipeline.ready:
            return error_response(503, "not_ready", "the index is still loading")
        manifest = pipeline.index.manifest
        return JSONResponse({"status": "ready", "generation": manifest["generation"],
                             "chunks": manifest["counts"]["chunks"], "corpus": manifest["corpus"]["name"]})

    return app


class ClientDisconnected(Exception):
    """Raised into a streamed generation whose client has gone, to stop it."""


def _final_events(result, tokens_sent: int):
    if result.degraded and tokens_sent:
        yield _sse("degraded", {"reason": result.degraded_reason, "discard_tokens": tokens_sent})
    if result.support:
        for s in result.support:
            yield _sse("answer", {"text": s.text, "citation": s.citations[0] if s.citations else None,
                                  "citations": list(s.citations), "supported": s.supported, "score": s.score})
    else:
        for sentence in result.sentences:
            yield _sse("answer", {"text": f"{sentence.text} [{sentence.citation}]", "citation": sentence.citation})
    generation = generation_out(result)
    yield _sse("done", {"generator": result.generator,
                        "stages": [{"name": t.name, "ms": round(t.ms, 3)} for t in result.stages],
                        "degraded": result.degraded, "degraded_reason": result.degraded_reason,
                        "unsupported_sentences": result.unsupported_sentences,
                        "generation": generation.model_dump() if generation else None})


def _sse(event: str, data) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()
