"""``app.py`` with ragheat's instrumentation: the middleware times POST /query and serves GET /metrics, and
ragheat's Haystack tracer makes each component the pipeline runs a stage: ``embed``, ``retrieve_dense``,
``retrieve_bm25``, ``fuse``.

    uvicorn examples.haystack.app_ragheat:app --port 8001
"""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

import ragheat.observe as rh
from examples._shared import Answer, Query, answer_from
from examples.haystack.pipeline import HybridRetriever

observer = rh.Observer(service="haystack-rag", routes=("/query",))
rh.haystack.enable(observer)  # haystack.tracing: each component Haystack runs is a stage


@asynccontextmanager
async def lifespan(app: FastAPI):
    app.state.retriever = HybridRetriever()
    yield


app = FastAPI(title="haystack-rag", lifespan=lifespan)
rh.instrument(app, observer)


@app.post("/query")
async def query(body: Query) -> Answer:
    # The pipeline is synchronous and CPU-bound: run it off the event loop.
    return answer_from(await run_in_threadpool(app.state.retriever.run, body.question))
