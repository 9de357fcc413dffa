"""``SemanticCache``: a bounded, thread-safe answer cache looked up by embedding similarity.

The stored query vectors are rows of one float32 matrix, so a lookup is one matrix-vector product over every entry
(single-threaded; 6 MiB of rows at the default 4,096 entries x 384 dimensions; its cost is in docs/benchmarks.md,
"Semantic answer cache") followed by a look at the few rows at or above the threshold, best first. A
row matches only when its ``CacheKey.scope`` (top_k, retrievers, rerank, generation) equals the query's; an expired
match is dropped where it is found. Rows freed by eviction or expiry are zeroed (a zero row scores 0, below any threshold) and reused.

Bounds: ``max_entries`` and ``max_bytes`` (least recently served out first) and ``ttl_s`` (age since stored; a hit
does not extend it). Bytes are an estimate of what an entry holds beyond the index: its vector, the answer's and
sentences' text and a fixed overhead per object; the cited passages are the index's own chunk objects, shared, so
they are not counted.

    cache = SemanticCache(CacheSettings(enabled=True))
    cache.put(key, result); cache.get(key)   # -> result (or None: a miss)
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Callable

import numpy as np

from rag.settings import CacheSettings
from rag.types import CacheKey, CacheStats, QueryResult

OBJECT_OVERHEAD_BYTES = 96
"""Per object an entry holds (the entry, the result, each source, sentence, support row): CPython's dataclass
instances with their ``__dict__`` are of this order."""


@dataclass
class _Entry:
    scope: tuple
    result: QueryResult
    nbytes: int
    expires: float


class SemanticCache:
    """An ``AnswerCache`` (``rag.protocols``) keyed by query embedding; see the module docstring. ``clock`` (seconds,
    monotonic) is a parameter so tests can age entries without sleeping."""

    def __init__(self, settings: CacheSettings, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.threshold = float(settings.threshold)
        self.max_entries, self.max_bytes, self.ttl_s = settings.max_entries, settings.max_bytes, settings.ttl_s
        self._clock = clock
        self._lock = threading.Lock()  # guards everything below: lookups run on many request threads
        self._matrix: np.ndarray | None = None  # (capacity, dim) float32, allocated by the first put, grown x2
        self._rows = 0  # rows ever used (the lookup's extent); freed ones are zero and listed in _free
        self._free: list[int] = []
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # row -> entry, least recently served first
        self._stored: deque[tuple[float, int, _Entry]] = deque()  # (expires, row, entry) in insertion = expiry order
        self._bytes = 0
        self._hits = self._misses = self._evictions = self._expirations = 0

    # -- the AnswerCache protocol ------------------------------------------------------------------------------
    def get(self, key: CacheKey) -> QueryResult | None:
        """The stored result of the nearest stored query with the same scope, if its cosine reaches the threshold
        and it has not expired; else None."""
        vector = _unit(key.vector)
        with self._lock:
            row = self._match(vector, key.scope, self._clock())
            if row is None:
                self._misses += 1
                return None
            self._entries.move_to_end(row)
            self._hits += 1
            return self._entries[row].result

    def put(self, key: CacheKey, result: QueryResult) -> None:
        """Store ``result`` for ``key``, replacing a stored match (two misses on one question store it once) and
        evicting the least recently served entries until both bounds hold. An entry larger than ``max_bytes`` alone
        is not stored."""
        vector = _unit(key.vector)
        nbytes = entry_bytes(vector, result)
        if nbytes > self.max_bytes:
            return
        with self._lock:
            now = self._clock()
            self._expire(now)
            existing = self._match(vector, key.scope, now)
            if existing is not None:
                self._drop(existing)
            while self._entries and (len(self._entries) >= self.max_entries or self._bytes + nbytes > self.max_bytes):
                self._drop(next(iter(self._entries)))
                self._evictions += 1
            row = self._take_row(vector.shape[0])
            self._matrix[row] = vector
            entry = _Entry(key.scope, result, nbytes, now + self.ttl_s)
            self._entries[row] = entry
            self._stored.append((entry.expires, row, entry))
            self._bytes += nbytes

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(len(self._entries), self._bytes, self._hits, self._misses, self._evictions,
                              self._expirations)

    def clear(self) -> None:
        """Forget every entry (the counts stay)."""
        with self._lock:
            for row in list(self._entries):
                self._drop(row)
            self._stored.clear()

    # -- inside the lock ---------------------------------------------------------------------------------------
    def _match(self, vector: np.ndarray, scope: tuple, now: float) -> int | None:
        if not self._entries:
            return None
        if vector.shape[0] != self._matrix.shape[1]:
            raise ValueError(f"cache_lookup: a {vector.shape[0]}-d query vector, but the cache holds "
                             f"{self._matrix.shape[1]}-d ones")
        # einsum, not ``@``: OpenBLAS runs a matrix-vector product this size on all cores, and on busy cores a
        # descheduled helper thread stalls the product far beyond what one thread takes for it (both side by side:
        # docs/benchmarks.md, "Semantic answer cache"). One thread per lookup; requests run in parallel.
        scores = np.einsum("ij,j->i", self._matrix[: self._rows], vector)
        near = np.flatnonzero(scores >= self.threshold)
        for row in near[np.argsort(-scores[near], kind="stable")]:
            entry = self._entries.get(int(row))
            if entry is None or entry.scope != scope:
                continue
            if entry.expires <= now:
                self._drop(int(row))
                self._expirations += 1
                continue
            return int(row)
        return None

    def _expire(self, now: float) -> None:
        """Drop the entries past their time (oldest first, stopping at the first that is not)."""
        stored = self._stored
        while stored and stored[0][0] <= now:
            _, row, entry = stored.popleft()
            if self._entries.get(row) is entry:
                self._drop(row)
                self._expirations += 1
        # Entries replaced or evicted leave stale records behind; keep the deque from outgrowing the cache.
        if len(stored) > 2 * self.max_entries + 64:
            self._stored = deque(r for r in stored if self._entries.get(r[1]) is r[2])

    def _drop(self, row: int) -> None:
        entry = self._entries.pop(row)
        self._bytes -= entry.nbytes
        self._matrix[row] = 0.0
        self._free.append(row)

    def _take_row(self, dim: int) -> int:
        if self._free:
            return self._free.pop()
        if self._matrix is None:
            self._matrix = np.zeros((min(self.max_entries, 256), dim), dtype=np.float32)
        elif self._rows == self._matrix.shape[0]:
            grown = np.zeros((min(self.max_entries, 2 * self._rows), dim), dtype=np.float32)
            grown[: self._rows] = self._matrix
            self._matrix = grown
        self._rows += 1
        return self._rows - 1


def _unit(vector: np.ndarray) -> np.ndarray:
    v = np.asarray(vector, dtype=np.float32).reshape(-1)
    norm = float(np.linalg.norm(v))
    if not np.isfinite(norm) or norm == 0.0:
        raise ValueError("cache_lookup: the query vector is zero or not finite")
    return v / norm


def entry_bytes(vector: np.ndarray, result: QueryResult) -> int:
    """The estimated bytes one entry holds beyond the index (see the module docstring)."""
    texts = [result.answer, *(s.text for s in result.sentences), *(s.text for s in result.support)]
    objects = 2 + len(result.sources) + len(result.sentences) + len(result.support)
    return int(vector.nbytes + sum(len(t.encode("utf-8")) for t in texts) + OBJECT_OVERHEAD_BYTES * objects)
