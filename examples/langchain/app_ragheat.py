"""``app.py`` with ragheat's instrumentation: the middleware times POST /query and serves GET /metrics, and the
ensemble retriever's call is the ``retrieve`` stage (it embeds, runs both retrievers and fuses inside that one call).

    uvicorn examples.langchain.app_ragheat:app --port 8003
"""

from __future__ import annotations

import os
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

import ragheat.observe as rh
from examples._shared import Answer, Query, answer_from
from examples.langchain.pipeline import HybridRetriever

observer = rh.Observer(service="langchain-rag", routes=("/query",), settings=rh.TelemetrySettings(
    trace_sample_ratio=float(os.environ.get("RAGHEAT_TELEMETRY__TRACE_SAMPLE_RATIO", "0.1"))))


@asynccontextmanager
async def lifespan(app: FastAPI):
    app.state.retriever = HybridRetriever()
    yield


app = FastAPI(title="langchain-rag", lifespan=lifespan)
rh.instrument(app, observer)


@rh.stage("retrieve")
def retrieve(question: str):
    return app.state.retriever.run(question)


@app.post("/query")
async def query(body: Query) -> Answer:
    # The retriever is synchronous and CPU-bound: run it off the event loop.
    return answer_from(await run_in_threadpool(retrieve, body.question))
