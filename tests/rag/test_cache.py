"""The semantic answer cache (rag/cache, stage ``cache_lookup``): the cache's own bounds (entries, bytes, TTL), scope
and thread safety on unit vectors, then the pipeline with real embeddings of the SciFact subset: a paraphrase within
the threshold hits, a different question misses, a degraded or failed answer is never stored, a miss embeds once."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from rag.cache import SemanticCache
from rag.cache.semantic import entry_bytes
from rag.errors import StageError
from rag.pipeline import RagPipeline
from rag.protocols import AnswerCache
from rag.settings import CacheSettings
from rag.types import CacheKey, QueryResult

DIM = 8
CLAIM = "Vitamin D deficiency is associated with bone density loss."
PARAPHRASE = "Vitamin D deficiency is linked to loss of bone density."  # cosine 0.984 with CLAIM (all-MiniLM-L6-v2)
NEAR_MISS = "0-dimensional biomaterials lack inductive properties."
OTHER = "1-dimensional biomaterials lack inductive properties."  # cosine 0.927 with NEAR_MISS: another claim


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def unit(i: int, dim: int = DIM) -> np.ndarray:
    v = np.zeros(dim, dtype=np.float32)
    v[i % dim] = 1.0
    return v


def key(vector, top_k=5, retrievers=("dense", "bm25"), rerank=False, generation="g1") -> CacheKey:
    return CacheKey(np.asarray(vector, dtype=np.float32), top_k, tuple(retrievers), rerank, generation)


def answer(text: str = "an answer [1]") -> QueryResult:
    return QueryResult(text, "extractive", [])


def cache(clock=None, **settings) -> SemanticCache:
    return SemanticCache(CacheSettings(enabled=True, **settings), clock=clock or Clock())


# -- the cache alone ---------------------------------------------------------------------------------------------

def test_it_is_an_answer_cache():
    assert isinstance(cache(), AnswerCache)


def test_a_vector_within_the_threshold_hits_and_one_outside_misses():
    c = cache(threshold=0.97)
    stored = answer()
    c.put(key(unit(0)), stored)
    inside = unit(0) + 0.2 * unit(1)  # cosine 0.981
    outside = unit(0) + 0.3 * unit(1)  # cosine 0.958
    assert c.get(key(inside)) is stored
    assert c.get(key(outside)) is None
    assert (c.stats().hits, c.stats().misses) == (1, 1)


def test_the_nearest_stored_query_answers():
    c = cache(threshold=0.85)
    c.put(key(unit(0) + 0.2 * unit(1)), answer("near"))  # cosine 0.98 with unit(0)
    c.put(key(unit(0) + 0.6 * unit(2)), answer("far"))  # 0.86 with unit(0); 0.84 with the first: both kept
    assert c.stats().entries == 2
    assert c.get(key(unit(0))).answer == "near"
    assert c.get(key(unit(0) + 0.5 * unit(2))).answer == "far"


@pytest.mark.parametrize("change", [{"top_k": 3}, {"retrievers": ("dense",)}, {"rerank": True},
                                    {"generation": "g2"}])
def test_the_same_vector_in_another_scope_misses(change):
    c = cache()
    c.put(key(unit(0)), answer())
    assert c.get(key(unit(0), **change)) is None
    assert c.get(key(unit(0))) is not None


def test_entries_expire_after_ttl_and_a_hit_does_not_extend_it():
    clock = Clock()
    c = cache(clock, ttl_s=10)
    c.put(key(unit(0)), answer())
    clock.now += 9
    assert c.get(key(unit(0))) is not None
    clock.now += 1.5
    assert c.get(key(unit(0))) is None
    assert c.stats().entries == 0 and c.stats().expirations == 1 and c.stats().bytes == 0


def test_expired_entries_are_dropped_when_others_are_stored():
    clock = Clock()
    c = cache(clock, ttl_s=10)
    for i in range(3):
        c.put(key(unit(i)), answer())
    clock.now += 11
    c.put(key(unit(5)), answer())
    assert c.stats().entries == 1 and c.stats().expirations == 3


def test_entries_are_bounded_least_recently_served_out_first():
    c = cache(max_entries=3)
    for i in range(3):
        c.put(key(unit(i)), answer(str(i)))
    assert c.get(key(unit(0))) is not None  # 0 served: 1 is now the least recently used
    c.put(key(unit(3)), answer("3"))
    assert c.stats().entries == 3 and c.stats().evictions == 1
    assert c.get(key(unit(1))) is None
    assert [c.get(key(unit(i))).answer for i in (0, 2, 3)] == ["0", "2", "3"]


def test_bytes_are_bounded_and_accounted():
    one = entry_bytes(unit(0), answer("x" * 1000))
    c = cache(max_bytes=max(4096, int(2.5 * one)))
    per_entry_room = c.max_bytes // one
    for i in range(per_entry_room + 2):
        c.put(key(unit(i)), answer("x" * 1000))
    stats = c.stats()
    assert stats.entries == per_entry_room and stats.bytes == per_entry_room * one <= c.max_bytes
    assert stats.evictions == 2
    assert c.get(key(unit(0))) is None and c.get(key(unit(per_entry_room + 1))) is not None


def test_an_entry_larger_than_the_byte_bound_is_not_stored():
    c = cache(max_bytes=4096)
    c.put(key(unit(0)), answer("x" * 5000))
    assert c.stats().entries == 0 and c.get(key(unit(0))) is None


def test_storing_the_same_question_twice_keeps_one_entry():
    c = cache()
    c.put(key(unit(0)), answer("first"))
    c.put(key(unit(0) + 0.01 * unit(1)), answer("second"))
    assert c.stats().entries == 1 and c.get(key(unit(0))).answer == "second"


def test_freed_rows_are_reused_and_the_matrix_stays_bounded():
    c = cache(max_entries=4)
    for i in range(50):
        c.put(key(unit(i % DIM) + 0.001 * i * unit((i + 1) % DIM)), answer())
    assert c.stats().entries == 4 and c._rows == 4


def test_a_zero_vector_is_refused_naming_the_stage():
    with pytest.raises(ValueError, match="cache_lookup"):
        cache().get(key(np.zeros(DIM)))


def test_concurrent_lookups_and_stores_keep_the_bounds():
    c = cache(max_entries=64, threshold=0.999)
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(200, 32)).astype(np.float32)
    errors = []

    def work(offset: int) -> None:
        try:
            for i in range(400):
                v = vectors[(offset + i * 7) % len(vectors)]
                if c.get(key(v)) is None:
                    c.put(key(v), answer(str(i)))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    stats = c.stats()
    assert stats.hits + stats.misses == 8 * 400
    assert stats.entries <= 64 and stats.bytes == sum(e.nbytes for e in c._entries.values())
    assert len(c._entries) == stats.entries and not set(c._entries) & set(c._free)


# -- the pipeline, real embeddings -----------------------------------------------------------------------------

def _with(settings, **sections):
    return settings.model_copy(update={name: getattr(settings, name).model_copy(update=values)
                                       for name, values in sections.items()})


@pytest.fixture(scope="module")
def cached(settings, subset_index):
    p = RagPipeline(_with(settings, cache={"enabled": True}, graph={"enabled": False}), subset_index)
    p.warm_up()
    yield p
    p.close()


def cosine(pipeline, a: str, b: str) -> float:
    va, vb = (pipeline.embedder.embed_query(t).vector for t in (a, b))
    return float(va @ vb / np.linalg.norm(va) / np.linalg.norm(vb))


def names(result: QueryResult) -> list[str]:
    return [s.name for s in result.stages if s.name != "queue"]


def test_without_the_setting_there_is_no_cache_and_answers_say_off(pipeline):
    assert pipeline.cache is None and pipeline.cache_stats() is None
    result = pipeline.query(CLAIM, 3)
    assert result.cache == "off" and "cache_lookup" not in names(result)


def test_a_paraphrase_within_the_threshold_hits(cached):
    threshold = cached.settings.cache.threshold
    assert cosine(cached, CLAIM, PARAPHRASE) >= threshold  # the premise, measured with the served model
    first = cached.query(CLAIM, 3)
    assert first.cache == "miss"
    assert names(first)[:2] == ["embed", "cache_lookup"] and names(first).count("embed") == 1  # embedded once
    assert "retrieve_dense" in names(first) and "generate" in names(first)
    hit = cached.query(PARAPHRASE, 3)
    assert hit.cache == "hit" and names(hit) == ["embed", "cache_lookup"]
    assert hit.answer == first.answer and [s.chunk.chunk_id for s in hit.sources] == \
        [s.chunk.chunk_id for s in first.sources]
    assert hit.retrieved == {} and hit.generation is None  # nothing retrieved or generated now
    assert hit.stages is not first.stages


def test_a_different_question_misses(cached):
    assert cosine(cached, NEAR_MISS, OTHER) < cached.settings.cache.threshold
    assert cached.query(NEAR_MISS, 3).cache in ("miss", "hit")  # stored by now either way
    result = cached.query(OTHER, 3)
    assert result.cache == "miss"


def test_another_top_k_or_retriever_set_misses(cached):
    cached.query(CLAIM, 3)
    assert cached.query(CLAIM, 3).cache == "hit"
    assert cached.query(CLAIM, 4).cache == "miss"
    assert cached.query(CLAIM, 3, ["bm25"]).cache == "miss"
    assert cached.query(CLAIM, 3, ["bm25"]).cache == "hit"


def test_a_new_generation_starts_empty(settings, cached, subset_index):
    cached.query(CLAIM, 3)
    assert cached.cache_stats().entries > 0
    successor = RagPipeline(cached.settings, subset_index)  # what IndexGenerationSwitch builds for a new generation
    successor.warm_up()
    try:
        assert successor.cache is not cached.cache and successor.cache_stats().entries == 0
        assert successor.query(CLAIM, 3).cache == "miss"
    finally:
        successor.close()


def test_a_degraded_answer_is_not_stored(cached, monkeypatch):
    run_retrievers = cached._run_retrievers

    def graph_down(context):
        run_retrievers(context)
        context.skipped["retrieve_graph"] = "the graph store is down"

    monkeypatch.setattr(cached, "_run_retrievers", graph_down)
    question = "Is mitochondrial dysfunction a cause of Parkinson disease in degraded mode?"
    before = cached.cache_stats().entries
    assert [cached.query(question, 2).cache for _ in range(2)] == ["miss", "miss"]
    assert cached.cache_stats().entries == before


def test_a_failed_answer_is_not_stored(cached, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("bm25 shard unavailable")

    monkeypatch.setattr(cached.retrievers["bm25"], "retrieve", broken)
    question = "Does a failing retriever leave anything in the answer cache?"
    before = cached.cache_stats().entries
    with pytest.raises(StageError) as failed:
        cached.query(question, 2)
    assert failed.value.stage == "retrieve_bm25"
    assert [s.name for s in failed.value.stages][:2] == ["embed", "cache_lookup"]
    assert cached.cache_stats().entries == before
    monkeypatch.undo()
    assert cached.query(question, 2).cache == "miss"


def test_with_reranking_a_miss_reuses_the_token_states_and_the_flag_is_in_the_key(settings, subset_index):
    s = _with(settings, cache={"enabled": True}, graph={"enabled": False}, rerank={"enabled": True})
    p = RagPipeline(s, subset_index)
    p.warm_up()
    try:
        first = p.query(CLAIM, 3)
        assert first.cache == "miss" and names(first).count("embed") == 1 and "rerank" in names(first)
        hit = p.query(PARAPHRASE, 3)
        assert hit.cache == "hit" and [s.chunk.chunk_id for s in hit.sources] == \
            [s.chunk.chunk_id for s in first.sources]
        vector = p.embedder.embed_query(CLAIM).vector
        generation = p.index.manifest["generation"]
        served = s.retrieval.retrievers  # the request's own retrievers are the key's (routed: the router's choice
        # depends on the question alone, so the same question is routed the same way)
        assert p.cache.get(CacheKey(vector, 3, tuple(served), True, generation)) is not None
        assert p.cache.get(CacheKey(vector, 3, tuple(served), False, generation)) is None
    finally:
        p.close()
