"""``app.py`` with ragheat's instrumentation: the middleware times POST /query and serves GET /metrics, and the
pipeline's run is the ``retrieve`` stage (Haystack runs its components inside that one call).

    uvicorn examples.haystack.app_ragheat:app --port 8001
"""

from __future__ import annotations

import os
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

import ragheat.observe as rh
from examples._shared import Answer, Query, answer_from
from examples.haystack.pipeline import HybridRetriever

observer = rh.Observer(service="haystack-rag", routes=("/query",), settings=rh.TelemetrySettings(
    trace_sample_ratio=float(os.environ.get("RAGHEAT_TELEMETRY__TRACE_SAMPLE_RATIO", "0.1"))))


@asynccontextmanager
async def lifespan(app: FastAPI):
    app.state.retriever = HybridRetriever()
    yield


app = FastAPI(title="haystack-rag", lifespan=lifespan)
rh.instrument(app, observer)


@rh.stage("retrieve")
def retrieve(question: str):
    return app.state.retriever.run(question)


@app.post("/query")
async def query(body: Query) -> Answer:
    # The pipeline is synchronous and CPU-bound: run it off the event loop.
    return answer_from(await run_in_threadpool(retrieve, body.question))
