"""The routes: ``/v1/query``, ``/v1/query/stream`` (SSE), ``/healthz``, ``/readyz``. Each reads the pipeline and
the server settings from ``app.state`` (set by ``create_app``) and leaves what it learned about a query on the
request's ``RequestRecord`` for whoever observes requests; none of them calls telemetry."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from rag.api.errors import ApiError
from rag.api.schemas import ErrorBody, QueryRequest, QueryResponse
from rag.api.streaming import QueryStream
from rag.pipeline import RagPipeline
from rag.settings import ServerSettings
from rag.types import REQUEST_RECORD_KEY, QueryResult, RequestRecord

ERROR_RESPONSES = {status: {"model": ErrorBody} for status in (400, 413, 422, 500, 503)}

router = APIRouter()


def _pipeline(http: Request) -> RagPipeline:
    return http.app.state.pipeline


def _server(http: Request) -> ServerSettings:
    return http.app.state.server


def _start_record(request: QueryRequest, http: Request) -> RequestRecord:
    """Attach the request's record (query and ``top_k`` known now) and check what the schema cannot."""
    server = _server(http)
    record = RequestRecord(request.query, request.top_k or server.default_top_k)
    setattr(http.state, REQUEST_RECORD_KEY, record)
    if len(request.query) > server.max_query_chars:
        raise ApiError("invalid_request", f"query: {len(request.query)} characters is over the limit of "
                                          f"{server.max_query_chars} (server.max_query_chars)")
    if not _pipeline(http).ready:
        raise ApiError("not_ready", "the index is still loading")
    if request.retrievers is not None and (problem := _pipeline(http).check_retrievers(request.retrievers)):
        raise ApiError("invalid_request", f"retrievers: {problem}")
    return record


def _run(request: QueryRequest, http: Request, record: RequestRecord, **callbacks) -> QueryResult:
    record.result = _pipeline(http).query(request.query, record.top_k, request.retrievers, **callbacks)
    return record.result


@router.post("/v1/query", response_model=QueryResponse, responses=ERROR_RESPONSES)
def query(request: QueryRequest, http: Request) -> QueryResponse:
    """Retrieve, fuse and answer; the answer's ``[n]`` markers refer to ``citations[n-1]``."""
    record = _start_record(request, http)
    return QueryResponse.from_result(_run(request, http, record))


@router.post("/v1/query/stream", responses={200: {"content": {"text/event-stream": {}}}, **ERROR_RESPONSES})
async def query_stream(request: QueryRequest, http: Request):
    """Server-sent events: ``sources`` first; with a language model, one ``token`` event per streamed piece
    as it arrives (and ``degraded`` if the model failed and the extractive answer follows); then one
    ``answer`` event per sentence; then ``done`` with the generator, stage timings and flags."""
    record = _start_record(request, http)
    stream = QueryStream(lambda **callbacks: _run(request, http, record, **callbacks), record)
    first = await stream.start()
    if first[0] == "error":
        raise first[1]  # nothing sent yet: the usual JSON error and status
    return StreamingResponse(stream.events(first), media_type="text/event-stream",
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


@router.get("/healthz")
def healthz() -> dict:
    """Liveness: the process answers."""
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"model": ErrorBody}})
def readyz(http: Request):
    """Readiness: the index and model are loaded and queries can be served. With a knowledge graph, ``graph`` says
    whether its store answers; while it is being restarted the service stays ready and answers without the graph
    (degraded), so a store outage never takes the service out of rotation."""
    pipeline = _pipeline(http)
    if not pipeline.ready:
        raise ApiError("not_ready", "the index is still loading")
    described = pipeline.describe()
    body = {"status": "ready", "generation": described.generation, "chunks": described.chunks,
            "corpus": described.corpus}
    if described.graph_backend is not None:
        body["graph"] = {"backend": described.graph_backend, "ready": described.graph_ready}
    return JSONResponse(body)
