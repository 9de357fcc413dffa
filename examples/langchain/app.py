"""The LangChain hybrid retriever behind FastAPI: POST /query {"question": ...} -> {"answer", "documents"}.

    uvicorn examples.langchain.app:app --port 8003
"""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from examples._shared import Answer, Query, answer_from
from examples.langchain.pipeline import HybridRetriever


@asynccontextmanager
async def lifespan(app: FastAPI):
    app.state.retriever = HybridRetriever()
    yield


app = FastAPI(title="langchain-rag", lifespan=lifespan)


@app.post("/query")
async def query(body: Query) -> Answer:
    # The retriever is synchronous and CPU-bound: run it off the event loop.
    return answer_from(await run_in_threadpool(app.state.retriever.run, body.question))
