"""Micro-batched query embedding: the queries of concurrent requests share one ONNX run.

No thread of its own and no timer: a request that finds fewer than ``max_runs`` model runs in flight runs its query
at once, alone (a lone request is never delayed). Requests that arrive while ``max_runs`` runs are in flight queue;
when a run ends, the oldest of them becomes the next runner and embeds itself and up to ``max_batch - 1`` queued
queries in one run, on its own thread (the others wait on an event: one wake-up each, no thread hop for the runner).
``max_wait_s`` lets that runner, and only one promoted under load, wait a little longer for the batch to fill.
``max_runs`` > 1 keeps both cores embedding when the batches themselves save little (on the CPU, see below): only the
overflow is batched.

A batch is sorted by length and cut into runs whose padding stays within ``PAD_LIMIT`` of the real tokens: a query's
cost is nearly all per token on the CPU, so padding a 10-token query to 46 costs more than the run overhead a batch
saves. The int8 scheme quantises each row on its own (rag/embedding/quantize.py), so a query's vector does not depend
on its batch neighbours (tests/rag/test_batcher.py asserts it).

Each ``EmbeddingResult`` keeps the timings truthful: ``queued`` is the wait from enqueueing to the start of the run
that served the query (the pipeline adds it to the request's ``queue`` stage), ``seconds`` the tokenising and that
run, ``device`` that run's timing.

    >>> embedder = MicroBatchEmbedder(OnnxEmbedder(EmbeddingSettings()), max_batch=8); embedder.warm_up()
    >>> embedder.embed_query("what causes tides?").vector.shape   # alone: run at once, ``queued`` ~ 0
    (384,)
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Sequence

import numpy as np

from rag.embedding.embedder import OnnxEmbedder
from rag.types import EmbeddingResult

PAD_LIMIT = 1.25  # padded tokens per real token allowed in one run (why: the module docstring)


class _Request:
    __slots__ = ("encoding", "tokens", "enqueued", "event", "promoted", "result", "states", "error")

    def __init__(self, encoding, tokens: bool, enqueued: float) -> None:
        self.encoding, self.tokens, self.enqueued = encoding, tokens, enqueued
        self.event = threading.Event()
        self.promoted = False  # set (with event) when this request is to run the next batch itself
        self.result: EmbeddingResult | None = None
        self.states: np.ndarray | None = None
        self.error: BaseException | None = None


class MicroBatchEmbedder:
    """The ``Embedder`` of the request path when ``embedding.query_batch_max`` > 1: ``OnnxEmbedder``'s query calls,
    batched across threads; ``embed_many`` (ingestion) goes straight to the wrapped embedder."""

    def __init__(self, inner: OnnxEmbedder, max_batch: int = 8, max_wait_s: float = 0.0, max_runs: int = 1) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1. Currently, it is {max_batch}")
        if max_wait_s < 0:
            raise ValueError(f"max_wait_s must not be negative. Currently, it is {max_wait_s}")
        if max_runs < 1:
            raise ValueError(f"max_runs must be at least 1. Currently, it is {max_runs}")
        self.inner, self.max_batch, self.max_wait_s, self.max_runs = inner, max_batch, max_wait_s, max_runs
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)  # a runner gathering a batch waits on it
        self._pending: deque[_Request] = deque()  # queued queries, runners excluded
        self._runs_in_flight = 0
        self.runs = 0  # model runs so far, and the queries they served (batch sizes, for tests and benchmarks)
        self.served = 0

    # -- what the wrapped embedder offers unchanged ---------------------------------------------
    def warm_up(self) -> None:
        self.inner.warm_up()

    @property
    def files(self):
        return self.inner.files

    @property
    def query_precision(self) -> str:
        return self.inner.query_precision

    @property
    def lone_query_threads(self) -> int:
        return self.inner.lone_query_threads

    @property
    def dimension(self) -> int:
        return self.inner.dimension

    @property
    def tokenizer(self):
        return self.inner.tokenizer

    def identity(self) -> dict:
        return self.inner.identity()

    def count_tokens(self, texts) -> list[int]:
        return self.inner.count_tokens(texts)

    def embed_many(self, texts: Sequence[str], progress=None, on_tokens=None) -> np.ndarray:
        return self.inner.embed_many(texts, progress, on_tokens)

    # -- the batched query path -----------------------------------------------------------------
    def embed_query(self, text: str) -> EmbeddingResult:
        return self._submit(text, False).result

    def embed_query_tokens(self, text: str) -> tuple[EmbeddingResult, np.ndarray]:
        request = self._submit(text, True)
        return request.result, request.states

    def _submit(self, text: str, tokens: bool) -> _Request:
        start = time.perf_counter()
        request = _Request(self.inner.tokenizer.encode(text), tokens, 0.0)
        with self._lock:
            request.enqueued = time.perf_counter()
            runner = self._runs_in_flight < self.max_runs
            if runner:
                self._runs_in_flight += 1
            else:
                self._pending.append(request)
                if len(self._pending) >= self.max_batch - 1:
                    self._arrived.notify()  # a runner gathering a batch: it is full
        if not runner:
            request.event.wait()
            if not request.promoted:  # served by another request's run
                return self._finished(request, start)
        self._run_batches(request)
        return self._finished(request, start)

    def _finished(self, request: _Request, start: float) -> _Request:
        if request.error is not None:
            raise request.error
        tokenise = request.enqueued - start
        request.result = _with_tokenising(request.result, tokenise)
        return request

    def _run_batches(self, me: _Request) -> None:
        """Run ``me`` and the queries queued behind it in one batch, deliver the results, then make the oldest query
        still queued the next runner (or give the run slot back)."""
        try:
            with self._lock:
                room = self.max_batch - 1
                if me.promoted and self.max_wait_s > 0 and len(self._pending) < room:
                    deadline = time.perf_counter() + self.max_wait_s
                    while len(self._pending) < room and (left := deadline - time.perf_counter()) > 0:
                        self._arrived.wait(left)
                batch = [me] + [self._pending.popleft() for _ in range(min(room, len(self._pending)))]
            self._run(batch, me)
        finally:
            with self._lock:
                if self._pending:
                    following = self._pending.popleft()
                    following.promoted = True
                    following.event.set()
                else:
                    self._runs_in_flight -= 1

    def _run(self, batch: list[_Request], me: _Request) -> None:
        for group in _groups(batch):
            started = time.perf_counter()
            try:
                vectors, states, device = self.inner.run_query_batch([r.encoding for r in group],
                                                                     any(r.tokens for r in group))
            except BaseException as exc:  # noqa: BLE001 - every query of the run gets the error, its caller raises it
                for request in group:
                    request.error = exc
                    if request is not me:
                        request.event.set()
                continue
            seconds = time.perf_counter() - started
            self.runs += 1
            self.served += len(group)
            for row, request in enumerate(group):
                request.result = EmbeddingResult(vector=vectors[row], tokens=len(request.encoding.ids),
                                                 seconds=seconds, device=device, queued=started - request.enqueued)
                if request.tokens:
                    request.states = states[row, : len(request.encoding.ids)]
                if request is not me:
                    request.event.set()
        if me.result is None and me.error is None:  # cannot happen: the runner's own query is in its batch
            me.error = RuntimeError("embed: the runner's query was not in its batch")


def _with_tokenising(result: EmbeddingResult, seconds: float) -> EmbeddingResult:
    return EmbeddingResult(result.vector, result.tokens, result.seconds + seconds, result.device, result.queued)


def _groups(batch: list[_Request]) -> list[list[_Request]]:
    """``batch`` sorted by length, cut where a run's padded tokens would pass ``PAD_LIMIT`` times its real ones."""
    groups: list[list[_Request]] = []
    current: list[_Request] = []
    real = 0
    for request in sorted(batch, key=lambda r: len(r.encoding.ids)):
        width = len(request.encoding.ids)
        if current and width * (len(current) + 1) > PAD_LIMIT * (real + width):
            groups.append(current)
            current, real = [], 0
        current.append(request)
        real += width
    if current:
        groups.append(current)
    return groups
