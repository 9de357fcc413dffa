"""The Haystack example's form (i), unchanged, with one fault injected from outside: its BM25 retriever sleeps
``SLOW_BM25_DELAY_S`` seconds per call (the alert drill's slow retriever). ``python slow_bm25_haystack.py PORT``."""

from __future__ import annotations

import functools
import os
import sys
import time

import uvicorn
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever

DELAY_S = float(os.environ.get("SLOW_BM25_DELAY_S", "1.0"))
original_run = InMemoryBM25Retriever.run


@functools.wraps(original_run)  # Haystack reads the component's inputs off run's signature
def slow_run(self, *args, **kwargs):
    time.sleep(DELAY_S)
    return original_run(self, *args, **kwargs)


InMemoryBM25Retriever.run = slow_run

from examples.haystack.app_ragheat import app  # noqa: E402 - the example, after its retriever is made slow

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
