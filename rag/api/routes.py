"""The routes: ``/v1/query``, ``/v1/query/stream`` (SSE), ``/healthz``, ``/readyz``, ``/admin/reload``. A query is
answered by the generation its ``Lease`` holds (taken by ``rag.api.middleware.IndexGenerationMiddleware`` when it arrived);
the server settings and the ``IndexGenerationSwitch`` are on ``app.state`` (set by ``create_app``). Each route leaves what
it learned about a query on the request's ``RequestRecord`` for whoever observes requests; none of them calls
telemetry."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from fastapi.concurrency import run_in_threadpool

from rag.api.access import KEY_PRIORITY
from rag.api.admission import (PRIORITY_HEADER, TIMEOUT_HEADER, AdmissionController, Shed, Slot, arrival_of,
                                parse_priority_header)
from rag.api.errors import ApiError
from rag.errors import ConfigurationError
from rag.api.middleware import LEASE_KEY
from rag.api.schemas import ErrorBody, QueryRequest, QueryResponse, ReloadResponse
from rag.api.worker_priority import lower_this_thread
from rag.api.streaming import QueryStream
from rag.index_generations import IndexGenerationSwitch, ReloadError
from rag.pipeline import RagPipeline
from rag.settings import ServerSettings
from rag.stages import TOP_LEVEL
from rag.types import REQUEST_RECORD_KEY, QueryResult, RequestRecord

# Every status a query can get (408 and 431 come from the connection layer, rag.api.connections).
ERROR_RESPONSES = {status: {"model": ErrorBody} for status in (400, 401, 408, 413, 422, 429, 431, 500, 503)}
# 503 also sheds a query that cannot be answered within its deadline (rag.api.admission), with Retry-After.
ADMIN_RESPONSES = {status: {"model": ErrorBody} for status in (401, 403, 429, 500)}

router = APIRouter()


def _pipeline(http: Request) -> RagPipeline | None:
    """The generation this request holds (None while the first one loads)."""
    lease = getattr(http.state, LEASE_KEY, None)
    return None if lease is None else lease.pipeline


def _switch(http: Request) -> IndexGenerationSwitch:
    return http.app.state.generations


def _server(http: Request) -> ServerSettings:
    return http.app.state.server


def _start_record(request: QueryRequest, http: Request) -> RequestRecord:
    """Attach the request's record (query and ``top_k`` known now) and check what the schema cannot."""
    server = _server(http)
    record = RequestRecord(request.query.strip(), request.top_k or server.default_top_k)
    setattr(http.state, REQUEST_RECORD_KEY, record)
    if len(request.query) > server.max_query_chars:  # as sent, as the schema's maxLength counts
        raise ApiError("invalid_request", f"query: {len(request.query)} characters is over the limit of "
                                          f"{server.max_query_chars} (server.max_query_chars)")
    pipeline = _pipeline(http)
    if pipeline is None or not pipeline.ready:
        raise ApiError("not_ready", "the index is still loading")
    if request.retrievers is not None and (problem := pipeline.check_retrievers(request.retrievers)):
        raise ApiError("invalid_request", f"retrievers: {problem}")
    return record


async def _admit(request: QueryRequest, http: Request) -> tuple[Slot, float, float]:
    """A slot among the queries in flight (``rag.api.admission``), or the 503 that sheds the query, decided on the
    event loop before any thread-pool hop; with the query's arrival and deadline (seconds)."""
    admission: AdmissionController = http.app.state.admission
    try:
        deadline_s = admission.deadline_s(request.timeout_ms, http.headers.get(TIMEOUT_HEADER))
        priority = http.state.priority = _priority(http)  # read again by the worker (_run)
    except ValueError as exc:
        raise ApiError("invalid_request", str(exc)) from None
    arrival = arrival_of(http.state)
    outcome = await admission.acquire(arrival, deadline_s, priority)
    if isinstance(outcome, Shed):
        raise ApiError(outcome.reason, outcome.sentence, outcome.headers)
    return outcome, arrival, deadline_s


def _priority(http: Request) -> str:
    """The request's priority: its header, within its API key's (``rag.api.access``)."""
    return parse_priority_header(http.headers.get(PRIORITY_HEADER), getattr(http.state, KEY_PRIORITY, "normal"))


def _run(request: QueryRequest, http: Request, record: RequestRecord, arrival: float, deadline_s: float,
         **callbacks) -> QueryResult:
    """On the worker thread: the pipeline, timed from its start (the queue stage ends here) for admission's
    predictions."""
    admission: AdmissionController = http.app.state.admission
    lower_this_thread(admission.worker_nice)
    start = time.perf_counter()
    priority = http.state.priority  # parsed and checked by _admit
    steering = http.app.state.steering
    level = TOP_LEVEL if steering is None else steering.level_for(priority)  # the rung when it starts, not arrives
    record.result = _pipeline(http).query(record.query, record.top_k, request.retrievers, arrival=arrival,
                                          deadline=admission.deadline(arrival, deadline_s), level=level, **callbacks)
    admission.observe(record.result.stages, time.perf_counter() - start, priority, record.result.level)
    return record.result


def _answer(request: QueryRequest, http: Request, record: RequestRecord, arrival: float, deadline_s: float) -> bytes:
    # The response is encoded on the worker thread too, keeping the event loop free to admit and shed.
    return QueryResponse.from_result(_run(request, http, record, arrival, deadline_s)).model_dump_json().encode()


@router.post("/v1/query", response_model=QueryResponse, responses=ERROR_RESPONSES)
async def query(request: QueryRequest, http: Request) -> QueryResponse:
    """Retrieve, fuse and answer; the answer's ``[n]`` markers refer to ``citations[n-1]``. Refused with 503 and
    Retry-After when the service cannot answer it within its deadline (``timeout_ms``, X-Request-Timeout-Ms)."""
    record = _start_record(request, http)
    slot, arrival, deadline_s = await _admit(request, http)
    try:
        body = await run_in_threadpool(_answer, request, http, record, arrival, deadline_s)
    finally:
        slot.release()
    return Response(body, media_type="application/json")


@router.post("/v1/query/stream", responses={200: {"content": {"text/event-stream": {}}}, **ERROR_RESPONSES})
async def query_stream(request: QueryRequest, http: Request):
    """Server-sent events: ``sources`` first; with a language model, one ``token`` event per streamed piece
    as it arrives (and ``degraded`` if the model failed and the extractive answer follows); then one
    ``answer`` event per sentence; then ``done`` with the generator, stage timings and flags."""
    record = _start_record(request, http)
    slot, arrival, deadline_s = await _admit(request, http)
    stream = QueryStream(lambda **callbacks: _run(request, http, record, arrival, deadline_s, **callbacks), record)
    try:
        first = await stream.start()
    finally:  # the slot is held until the pipeline's worker is done (the stream may outlive this call)
        slot.release_when_done(getattr(stream, "worker", None))
    if first[0] == "error":
        raise first[1]  # nothing sent yet: the usual JSON error and status
    return StreamingResponse(stream.events(first), media_type="text/event-stream",
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


@router.get("/healthz")
async def healthz() -> dict:
    """Liveness: the process answers. Async, so it is answered on the event loop: a sync route would run on the
    thread pool, whose threads run queries below the event loop's priority (rag/api/worker_priority.py)."""
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"model": ErrorBody}})
def readyz(http: Request):
    """Readiness: the index and model are loaded and queries can be served. With a knowledge graph, ``graph`` says
    whether its store answers; while it is being restarted the service stays ready and answers without the graph
    (degraded), so a store outage never takes the service out of rotation."""
    pipeline = _pipeline(http)
    if pipeline is None or not pipeline.ready:
        raise ApiError("not_ready", "the index is still loading")
    described = pipeline.describe()
    body = {"status": "ready", "generation": described.generation, "chunks": described.chunks,
            "corpus": described.corpus,
            "embedding": {"passages": described.passage_precision, "queries": described.query_precision,
                          "lone_query_threads": described.lone_query_threads}}
    if described.graph_backend is not None:
        body["graph"] = {"backend": described.graph_backend, "ready": described.graph_ready}
    if described.vector_store is not None:  # down: its fallback answers (or the stages are skipped); still ready
        body["vector_store"] = described.vector_store
    if (error := _switch(http).last_error) is not None:  # a newer generation failed to load; this one still serves
        body["reload_error"] = error
    return JSONResponse(body)


@router.post("/admin/reload", response_model=ReloadResponse, responses=ADMIN_RESPONSES)
async def reload(http: Request) -> ReloadResponse:
    """Serve the generation the index folder's ``current`` link points at now: it is loaded beside the one served,
    then swapped in; requests in flight finish on the old one. Also re-reads server.api_keys_file. Needs an API key."""
    access = http.app.state.access
    if (refusal := access.admin_refusal()) is not None:
        raise ApiError(refusal.reason, refusal.sentence)
    try:
        await run_in_threadpool(access.keys.reload)
        outcome = await run_in_threadpool(_switch(http).reload)
    except (ReloadError, ConfigurationError) as exc:
        raise ApiError("reload_failed", str(exc)) from None
    return ReloadResponse(outcome=outcome.outcome, generation=outcome.generation, previous=outcome.previous)
