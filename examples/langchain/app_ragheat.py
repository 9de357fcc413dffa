"""``app.py`` with ragheat's instrumentation: the middleware times POST /query and serves GET /metrics, and
ragheat's LangChain callback handler makes each retriever run a stage: ``retrieve`` (the ensemble),
``retrieve_dense``, ``retrieve_bm25``.

    uvicorn examples.langchain.app_ragheat:app --port 8003
"""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

import ragheat.observe as rh
from examples._shared import Answer, Query, answer_from
from examples.langchain.pipeline import HybridRetriever

observer = rh.Observer(service="langchain-rag", routes=("/query",))
rh.langchain.enable(observer)  # its callbacks, on every run: each retriever run is a stage


@asynccontextmanager
async def lifespan(app: FastAPI):
    app.state.retriever = HybridRetriever()
    yield


app = FastAPI(title="langchain-rag", lifespan=lifespan)
rh.instrument(app, observer)


@app.post("/query")
async def query(body: Query) -> Answer:
    # The retriever is synchronous and CPU-bound: run it off the event loop.
    return answer_from(await run_in_threadpool(app.state.retriever.run, body.question))
