"""A plain FastAPI service that ragheat did not write, observed with the library: its stages block in the kernel
in known ways, so the probes' attribution can be checked against them. ``python observed_app.py PORT``."""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time

import uvicorn
from fastapi import FastAPI

import ragheat.observe as rh

app = FastAPI()
observer = rh.instrument(app, rh.Observer(service="observed-app", routes=("/search", "/answer")))
scratch = tempfile.TemporaryFile()


@rh.stage("retrieve_bm25")
def keyword_search(query: str) -> list[str]:
    for _ in range(20):  # file system calls while the thread is rh:retrieve_bm2
        scratch.write(query.encode())
        os.fsync(scratch.fileno())
    time.sleep(0.002)
    return [query]


@rh.stage("generate")
async def generate(passages: list[str]) -> str:
    for _ in range(3):
        time.sleep(0.002)  # blocks the loop inside one of this coroutine's steps: charged to generate
        await asyncio.sleep(0.001)
    return passages[0]


@app.post("/search")
def search(body: dict) -> dict:  # a sync route: FastAPI runs it in a worker thread
    return {"documents": keyword_search(body["question"])}


@app.post("/answer")
async def answer(body: dict) -> dict:
    async with rh.stage("rerank"):  # a block on the loop: its time stays the loop's (event_loop), not rerank's
        time.sleep(0.002)
    return {"answer": await generate([body["question"]])}


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
