"""The passages' dense vectors and BM25 terms on a Milvus server (``vector_store.backend=milvus``): one collection per
index generation, loaded by ``ragheat ingest`` beside the served one before the generation is published, and dropped
once the generation is pruned from the index folder, so one atomic swap still publishes everything (the Neo4j graph
backend's pattern). The same client code (``pymilvus``) talks to a Milvus server or cluster and to ``milvus-lite``'s
server (the tests, or one machine without Milvus).

BM25 terms arrive analysed: a chunk is stored as ragheat's own lexical analyser's terms (stop words out,
Snowball-stemmed: the analyser the local BM25 and the extractive generator share), and a query is sent as its terms, so
the store's analyser only splits them and its BM25 (``retrieval.bm25_k1``/``bm25_b``) ranks the terms the local index
ranks. The generation's own files (FAISS, bm25s, chunks) are written either way; chunk texts are read from them.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
import time
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from rag.errors import ConfigurationError, IndexLoadError, RagheatError
from rag.settings import IndexSettings, RetrievalSettings, VectorStoreSettings

log = logging.getLogger("ragheat.vector_store")

ID, VECTOR, TERMS, SPARSE = "id", "vector", "terms", "sparse"
MAX_TERMS_BYTES = 65_535  # Milvus' longest VARCHAR
# After a failed search the server is given this long (longer after each failure in a row) before it is asked again:
# meanwhile searches fail at once, so a dead or hung server costs one timeout, not one per request.
RETRY_AFTER_S = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
# The calls of the request that asks again (connect, look up, count, load, search), each bounded by timeout_ms: the
# other requests fail at once for as long as they may take.
PROBE_CALLS = 5
INDEX_TYPES = {"flat": "FLAT", "hnsw": "HNSW"}  # index.kind -> the collection's dense index


class VectorStoreUnavailable(RagheatError):
    """The Milvus server cannot serve the searches now: it cannot be reached, or did not answer within
    ``vector_store.timeout_ms`` (the searches go to the generation's own files meanwhile, or with
    ``vector_store.fallback=none`` the two stages are skipped)."""


class CollectionUnusable(VectorStoreUnavailable):
    """The server answers, but the generation's collection is missing or holds another count of passages than its
    manifest: when the server comes back so (an empty data volume, a collection dropped by hand), the searches go on
    falling back rather than trusting it."""


def index_tag(prefix: str, index_dir: Path) -> str:
    """What every collection of the index at ``index_dir`` starts with: the prefix and a digest of the folder's path,
    so that pruning one index never drops another's collections on the same server."""
    digest = hashlib.sha256(str(Path(index_dir).resolve()).encode()).hexdigest()[:10]
    return f"{prefix}_{digest}_"


def collection_name(prefix: str, index_dir: Path, generation: str) -> str:
    """The collection holding generation ``generation`` of the index at ``index_dir`` (Milvus names: letters, digits
    and underscores)."""
    return index_tag(prefix, index_dir) + re.sub(r"[^0-9A-Za-z_]", "_", generation)


def dense_index_type(settings: IndexSettings) -> str:
    """The collection's dense index for ``index.kind``; ``ConfigurationError`` for a kind Milvus is not given here."""
    if settings.kind not in INDEX_TYPES:
        raise ConfigurationError(f"vector_store.backend=milvus builds {' or '.join(INDEX_TYPES)} collections; "
                                 f"index.kind={settings.kind} is served by the local FAISS index only")
    return INDEX_TYPES[settings.kind]


class MilvusStore:
    """A ``pymilvus.MilvusClient`` of its own on ``vector_store.uri``; every failure to reach the server is
    ``VectorStoreUnavailable`` naming it, and every call has a deadline (searches and look-ups ``timeout_ms``, an
    ingest's loading ``load_timeout_s``). A search that fails marks the server down for ``RETRY_AFTER_S``: searches
    meanwhile fail at once; after it one request asks again (checking the collection against the count its manifest
    gave ``expect`` and loading it first: a restarted server holds it released, or may have lost it) while the others
    still fail at once. A store opened while the server cannot be reached starts down (``start_down``), asked again
    the same way. ``failures`` counts failed searches; ``down_because`` says why they fail now (``unreachable``,
    ``collection``; None while they do not)."""

    def __init__(self, settings: VectorStoreSettings) -> None:
        self.settings = settings
        self.uri = without_credentials(settings.uri)
        self.timeout_s = settings.timeout_ms / 1000
        self.load_timeout_s = settings.load_timeout_s
        self._client = None
        self.failures = 0
        self.down_because: str | None = None
        self._expected: dict[str, int] = {}  # collection -> the passages its manifest says, checked by each probe
        self._told: str | None = None  # the failure the latest warning was about
        self._in_a_row = 0
        self._retry_at = 0.0  # time.monotonic() before which searches fail at once
        self._lock = threading.Lock()
        self._client_lock = threading.Lock()  # one client at a time: a probe and a hot swap's close may race
        self._closed = False
        # What serves the dense and BM25 stages while the server is down, for the warnings.
        self.meanwhile = ("searching the generation's own files" if settings.fallback == "files" else
                           "the dense and BM25 stages are skipped (vector_store.fallback=none)")

    def _search(self, what: str, collection: str, **request) -> list:
        with self._lock:
            now = time.monotonic()
            if now < self._retry_at:
                raise VectorStoreUnavailable(f"the Milvus server at {self.uri} is down (asked again in "
                                             f"{self._retry_at - now:.1f} s)")
            probe = self._in_a_row > 0
            if probe:  # this request asks again; the others fail at once until it has an answer
                self._retry_at = now + PROBE_CALLS * self.timeout_s

        def search():
            if probe:  # a restarted server may have lost the collection, and holds it released
                if collection in self._expected:
                    self.check(collection, self._expected[collection])
                self.load(collection, self.timeout_s)
            return self.client.search(collection, timeout=self.timeout_s, **request)

        try:
            found = self._call(what, search)
        except VectorStoreUnavailable as exc:
            because = "collection" if isinstance(exc, CollectionUnusable) else "unreachable"
            news = str(exc) if because == "collection" else because  # what a warning is logged for when it changes
            with self._lock:
                self.failures += 1
                self._in_a_row += 1
                self._retry_at = time.monotonic() + RETRY_AFTER_S[min(self._in_a_row, len(RETRY_AFTER_S)) - 1]
                changed, self._told, self.down_because = news != self._told, news, because
            if changed:
                log.warning("%s; %s until it %s", exc, self.meanwhile,
                            "holds it (ingest again: `ragheat ingest --force`)" if because == "collection"
                            else "answers again")
            raise
        if self._in_a_row:
            with self._lock:
                failed, self._in_a_row, self._retry_at = self._in_a_row, 0, 0.0
                self.down_because = self._told = None
            if failed:
                log.warning("the Milvus server at %s answers again after %d failed attempts%s; the searches go to "
                            "it again", self.uri, failed,
                            f", collection {collection} checked" if collection in self._expected else "")
        return found

    def start_down(self) -> None:
        """Open with the server unreachable: searches fail at once (the generation's own files answer) until the first
        retry asks it again, checking and loading the collection as after any outage."""
        with self._lock:
            self._in_a_row = max(self._in_a_row, 1)
            self._retry_at = time.monotonic() + RETRY_AFTER_S[0]
            self.down_because = self._told = "unreachable"

    def expect(self, collection: str, rows: int) -> None:
        """Have every probe check that ``collection`` holds ``rows`` passages (its manifest's) before trusting it."""
        self._expected[collection] = rows

    @property
    def down(self) -> bool:
        """Whether the latest search failed, or the server could not be reached when the store was opened (searches
        go to the generation's own files meanwhile)."""
        return self._in_a_row > 0

    def connect(self) -> "MilvusStore":
        with self._client_lock:
            if self._closed:
                raise VectorStoreUnavailable(f"the store for the Milvus server at {self.uri} is closed")
            if self._client is None:
                self._client = self._new_client()
        return self

    def _new_client(self):
        from pymilvus import MilvusClient

        try:
            # dedicated: pymilvus would otherwise share one connection per address, which close() keeps open
            return MilvusClient(uri=self.settings.uri, token=self.settings.token.get_secret_value(),
                                timeout=self.timeout_s, dedicated=True)
        except Exception as exc:  # noqa: BLE001 - pymilvus raises its own and grpc's types
            raise VectorStoreUnavailable(f"the Milvus server at {self.uri} cannot be reached: "
                                         f"{type(exc).__name__}: {exc}") from exc

    @property
    def client(self):
        return self.connect()._client

    def _call(self, what: str, call: Callable, *args, **kwargs):
        try:
            return call(*args, **kwargs)
        except VectorStoreUnavailable:
            raise
        except Exception as exc:  # noqa: BLE001 - pymilvus raises its own and grpc's types
            raise VectorStoreUnavailable(f"the Milvus server at {self.uri} failed to {what}: "
                                         f"{type(exc).__name__}: {exc}") from exc

    # -- a generation's collection ---------------------------------------------------------------
    def publish(self, collection: str, vectors: np.ndarray, terms: Sequence[str], index: IndexSettings,
                retrieval: RetrievalSettings, *, advance: Callable[[int], None] = lambda n: None) -> dict:
        """Create ``collection`` with ``vectors`` (row i: chunk i) and ``terms`` (chunk i's analysed terms), flush
        and load it; its block of the manifest. A collection of that name left by a failed ingest is replaced."""
        from pymilvus import DataType, Function, FunctionType

        if len(vectors) != len(terms):
            raise ValueError(f"{len(vectors)} vectors but {len(terms)} term lists")
        index_type = dense_index_type(index)
        client = self.client
        started = time.perf_counter()
        if self.has(collection):
            self.drop(collection)
        schema = client.create_schema(auto_id=False)
        schema.add_field(ID, DataType.INT64, is_primary=True)
        schema.add_field(VECTOR, DataType.FLOAT_VECTOR, dim=int(vectors.shape[1]))
        schema.add_field(TERMS, DataType.VARCHAR, max_length=MAX_TERMS_BYTES, enable_analyzer=True,
                         analyzer_params={"tokenizer": "standard"})
        schema.add_field(SPARSE, DataType.SPARSE_FLOAT_VECTOR)
        schema.add_function(Function(name="bm25", function_type=FunctionType.BM25, input_field_names=[TERMS],
                                     output_field_names=[SPARSE]))
        indexes = client.prepare_index_params()
        dense_params = {"M": index.hnsw_m, "efConstruction": index.hnsw_ef_construction} if index_type == "HNSW" \
            else {}
        bm25_params = {"bm25_k1": retrieval.bm25_k1, "bm25_b": retrieval.bm25_b}
        indexes.add_index(field_name=VECTOR, index_type=index_type, metric_type="IP", params=_both_ways(dense_params))
        indexes.add_index(field_name=SPARSE, index_type="SPARSE_INVERTED_INDEX", metric_type="BM25",
                          params=_both_ways(bm25_params))
        self._call("create a collection", client.create_collection, collection, schema=schema, index_params=indexes,
                   timeout=self.load_timeout_s)
        timings = {"create": time.perf_counter() - started}
        started = time.perf_counter()
        batch = self.settings.load_batch
        for offset in range(0, len(vectors), batch):
            rows = [{ID: i, VECTOR: vectors[i].tolist(), TERMS: _fit(terms[i])}
                    for i in range(offset, min(offset + batch, len(vectors)))]
            self._call("insert passages", client.insert, collection, rows, timeout=self.load_timeout_s)
            advance(len(rows))
        timings["insert"] = time.perf_counter() - started
        started = time.perf_counter()
        self._call("flush a collection", client.flush, collection, timeout=self.load_timeout_s)
        self.load(collection)
        timings["flush_and_load"] = time.perf_counter() - started
        stored = self.count(collection)
        if stored != len(vectors):
            raise RagheatError(f"the Milvus collection {collection} holds {stored} passages, {len(vectors)} were "
                               f"inserted")
        return {"backend": "milvus", "collection": collection, "uri": self.uri, "dense_index": index_type,
                "metric": "IP", "bm25": {"k1": retrieval.bm25_k1, "b": retrieval.bm25_b}, "counts": {"rows": stored},
                "timings_s": {k: round(v, 3) for k, v in timings.items()}}

    def check(self, collection: str, rows: int) -> None:
        """``CollectionUnusable`` naming the server and collection unless it exists and holds ``rows`` passages;
        ``VectorStoreUnavailable`` when the server cannot be asked."""
        if not self.has(collection):
            raise CollectionUnusable(f"the Milvus server at {self.uri} has no collection {collection}")
        if (stored := self.count(collection)) != rows:
            raise CollectionUnusable(f"the Milvus collection {collection} holds {stored} passages, the manifest says "
                                     f"{rows}")

    def has(self, collection: str) -> bool:
        return bool(self._call("look up a collection", self.client.has_collection, collection, timeout=self.timeout_s))

    def load(self, collection: str, timeout_s: float | None = None) -> None:
        """Load ``collection`` into the server's memory for searches (``load_timeout_s`` unless told)."""
        self._call("load a collection", self.client.load_collection, collection,
                   timeout=self.load_timeout_s if timeout_s is None else timeout_s)

    def count(self, collection: str) -> int:
        stats = self._call("count a collection's rows", self.client.get_collection_stats, collection,
                           timeout=self.timeout_s)
        return int(stats["row_count"])

    def collections(self, starting: str) -> list[str]:
        names = self._call("list collections", self.client.list_collections, timeout=self.timeout_s)
        return sorted(n for n in names if n.startswith(starting))

    def drop(self, collection: str) -> None:
        self._call("drop a collection", self.client.drop_collection, collection, timeout=self.load_timeout_s)

    # -- searches ---------------------------------------------------------------------------------
    def dense_search(self, collection: str, vector: np.ndarray, k: int,
                     ef: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Chunk ids and inner products of the ``k`` nearest passages; ``ef``: HNSW's search breadth."""
        params = {"metric_type": "IP", **({"params": {"ef": max(ef, k)}} if ef else {})}
        found = self._search("search vectors", collection, data=[vector.tolist()], anns_field=VECTOR, limit=k,
                             search_params=params, output_fields=[ID])
        return _arrays(found[0], lambda distance: distance)

    def bm25_search(self, collection: str, terms: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """Chunk ids and BM25 scores of the ``k`` best passages for the analysed ``terms``."""
        if not terms:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        found = self._search("search terms", collection, data=[" ".join(terms)], anns_field=SPARSE, limit=k,
                             search_params={"metric_type": "BM25"}, output_fields=[ID])
        # A Milvus server reports the BM25 score as the distance, milvus-lite its negative: the magnitude either way.
        ids, scores = _arrays(found[0], abs)
        keep = scores > 0
        return ids[keep], scores[keep]

    def close(self) -> None:
        with self._client_lock:
            client, self._client, self._closed = self._client, None, True
        if client is not None:
            try:
                client.close()
            except Exception as exc:  # noqa: BLE001 - closing a dead connection must not fail a shutdown
                log.warning("closing the Milvus client failed: %s", exc)


def without_credentials(uri: str) -> str:
    """``uri`` as errors and logs may show it: a ``user:password@`` in it left out."""
    scheme, sep, rest = uri.partition("://")
    return f"{scheme}{sep}{rest.rsplit('@', 1)[-1]}" if sep else uri


def _both_ways(params: dict) -> dict:
    """An index's parameters as pymilvus sends them (each its own key, as a Milvus server reads them) and again as
    one JSON ``params`` key (the older form, the only one milvus-lite's server reads)."""
    return {**params, "params": dict(params)} if params else {}


def _fit(terms: str) -> str:
    """``terms`` cut at a whole term to fit Milvus' longest VARCHAR (a chunk's terms are far shorter)."""
    data = terms.encode()
    if len(data) <= MAX_TERMS_BYTES:
        return terms
    return data[:MAX_TERMS_BYTES].decode(errors="ignore").rsplit(" ", 1)[0]


def _arrays(hits: Iterable[dict], score: Callable[[float], float]) -> tuple[np.ndarray, np.ndarray]:
    rows = [(int(h["id"]), float(score(h["distance"]))) for h in hits]
    ids = np.fromiter((r[0] for r in rows), np.int64, len(rows))
    scores = np.fromiter((r[1] for r in rows), np.float32, len(rows))
    return ids, scores


def prune_collections(settings: VectorStoreSettings, index_dir: Path, keep: set[str]) -> list[str]:
    """Drop the collections of the index at ``index_dir`` whose generation it no longer has (``keep``: the
    generations' names): those pruned from the folder, and those of ingests that never published."""
    if settings.backend != "milvus":
        return []
    store = MilvusStore(settings)
    try:
        wanted = {collection_name(settings.collection_prefix, index_dir, g) for g in keep}
        tag = index_tag(settings.collection_prefix, index_dir)
        gone = [name for name in store.collections(tag) if name not in wanted]
        for name in gone:
            store.drop(name)
        return gone
    finally:
        store.close()


def open_generation(settings: VectorStoreSettings, folder: Path, manifest: dict) -> tuple[MilvusStore, str, bool]:
    """The store holding generation ``folder``'s collection, checked against its manifest: (store, collection, whether
    its dense index is exact). ``IndexLoadError`` naming the folder when it cannot be served from Milvus: never
    published there, or its collection missing or holding another count of passages. A server that cannot be reached
    is not one of those: the store is returned down, the generation's own files answer as during any outage, and the
    first search that reaches the server checks the collection before trusting it."""
    block = manifest.get("vector_store") or {}
    if block.get("backend") != "milvus":
        raise IndexLoadError(folder, "its passages were not published to a Milvus server (it was ingested with "
                                     "vector_store.backend=local); ingest it again with "
                                     "RAGHEAT_VECTOR_STORE__BACKEND=milvus (nothing is embedded again)")
    store = MilvusStore(settings)
    collection, expected = block["collection"], manifest["counts"]["chunks"]
    store.expect(collection, expected)
    try:
        store.check(collection, expected)
        store.load(collection)
    except CollectionUnusable as exc:
        store.close()
        raise IndexLoadError(folder, f"{exc}; ingest it again (`ragheat ingest --force`)") from None
    except VectorStoreUnavailable as exc:
        store.start_down()
        log.warning("%s; generation %s: %s until the server answers, its collection %s checked then", exc,
                    folder.name, store.meanwhile, collection)
    except BaseException:
        store.close()
        raise
    return store, collection, block.get("dense_index") == "FLAT"


def publish_generation(settings: VectorStoreSettings, index: IndexSettings, retrieval: RetrievalSettings,
                       index_dir: Path, generation: str, vectors: np.ndarray, terms: Sequence[str], *,
                       advance: Callable[[int], None] = lambda n: None) -> dict:
    """Load generation ``generation`` of the index at ``index_dir`` into its collection (before the generation is
    published: a failure leaves the served one as it was, and drops the half-loaded collection); the manifest's
    ``vector_store`` block."""
    store = MilvusStore(settings)
    collection = collection_name(settings.collection_prefix, index_dir, generation)
    try:
        return store.publish(collection, vectors, terms, index, retrieval, advance=advance)
    except BaseException:
        try:
            store.drop(collection)
        except VectorStoreUnavailable:
            pass  # the server is gone: the next ingest's pruning drops it
        raise
    finally:
        store.close()
