"""``app.py`` with ragheat's instrumentation: the middleware times POST /query and serves GET /metrics, and
ragheat's LlamaIndex span handler makes each retriever and embedding call a stage: ``retrieve`` (the fusion),
``retrieve_dense``, ``embed``, ``retrieve_bm25``.

    uvicorn examples.llama_index.app_ragheat:app --port 8002
"""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

import ragheat.observe as rh
from examples._shared import Answer, Query, answer_from
from examples.llama_index.pipeline import HybridRetriever

observer = rh.Observer(service="llama-index-rag", routes=("/query",))
rh.llama_index.enable(observer)  # its instrumentation dispatcher: each retriever and embedding call is a stage


@asynccontextmanager
async def lifespan(app: FastAPI):
    app.state.retriever = HybridRetriever()
    yield


app = FastAPI(title="llama-index-rag", lifespan=lifespan)
rh.instrument(app, observer)


@app.post("/query")
async def query(body: Query) -> Answer:
    # The retriever is synchronous and CPU-bound: run it off the event loop.
    return answer_from(await run_in_threadpool(app.state.retriever.run, body.question))
