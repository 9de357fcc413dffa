"""A plain FastAPI RAG service observed with ``ragheat.observe`` whose keyword retriever is made slow by an
environment variable: the fault the watched-stack alert drill pages on. ``python slow_retriever_app.py PORT``."""

from __future__ import annotations

import os
import sys
import time

import uvicorn
from fastapi import FastAPI

import ragheat.observe as rh

DELAY_S = float(os.environ.get("SLOW_RETRIEVER_DELAY_S", "0"))
app = FastAPI()
rh.instrument(app, rh.Observer(service="slow-retriever", routes=("/query",)))


@rh.stage("embed")
def embed(question: str) -> list[float]:
    return [float(len(question))]


@rh.stage("BM25Retriever")
def keyword_search(question: str) -> list[str]:
    time.sleep(DELAY_S)
    return [question]


@rh.stage("llm")
def answer(passages: list[str]) -> str:
    return passages[0]


@app.post("/query")
def query(body: dict) -> dict:
    embed(body["question"])
    return {"answer": answer(keyword_search(body["question"]))}


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
