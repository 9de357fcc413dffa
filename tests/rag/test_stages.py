"""Each pipeline stage on its own: retrievers, fusion, generator, lexical analyser, BEIR metrics."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from rag.eval.beir import mrr_at, ndcg_at, recall_at, score_run
from rag.generation.extractive import ExtractiveGenerator
from rag.index.store import load_index
from rag.ingest.sentences import sentence_spans
from rag.protocols import Fuser, Generator, Retriever
from rag.retrieval.fusion import WeightedRRF
from rag.retrieval.lexical import LexicalAnalyzer
from rag.retrieval.retrievers import BM25Retriever, DenseRetriever
from rag.types import Chunk, Hit, RetrievalResult

# -- retrievers: one shared contract ----------------------------------------------------------------


@pytest.fixture(scope="module")
def loaded(subset_index, settings):
    return load_index(subset_index, settings.index)


@pytest.fixture(scope="module")
def retrievers(loaded):
    analyzer = LexicalAnalyzer(loaded.manifest["lexical"]["stemmer"])
    return {"dense": DenseRetriever(loaded.faiss_index), "bm25": BM25Retriever(loaded.bm25, analyzer)}


@pytest.fixture(scope="module")
def sample_chunks(loaded) -> list[Chunk]:
    return random.Random(1234).sample(loaded.chunks, 15)


def run(retriever, embedder, query: str, k: int):
    vector = embedder.embed_query(query).vector if retriever.name == "dense" else None
    return retriever.retrieve(query, vector, k)


@pytest.mark.parametrize("name", ["dense", "bm25"])
def test_retriever_satisfies_the_protocol(retrievers, name):
    retriever = retrievers[name]
    assert isinstance(retriever, Retriever)
    assert retriever.name == name


def test_protocol_check_is_not_vacuous():
    class NoRetrieve:
        name = "x"

    assert not isinstance(NoRetrieve(), Retriever)
    assert isinstance(WeightedRRF({}), Fuser)
    assert isinstance(ExtractiveGenerator(LexicalAnalyzer(), {}), Generator)


@pytest.mark.parametrize("name", ["dense", "bm25"])
@pytest.mark.parametrize("k", [1, 5, 37])
def test_retriever_returns_at_most_k_sorted_hits(retrievers, embedder, loaded, name, k):
    result = run(retrievers[name], embedder, "vitamin D deficiency and bone fractures in elderly patients", k)
    assert isinstance(result, RetrievalResult)
    assert result.retriever == name
    assert 0 < len(result.hits) <= k
    assert result.seconds >= 0
    scores = [h.score for h in result.hits]
    assert scores == sorted(scores, reverse=True)
    ids = [h.chunk_id for h in result.hits]
    assert len(set(ids)) == len(ids)
    assert all(0 <= i < len(loaded.chunks) for i in ids)
    assert all(isinstance(i, int) for i in ids)


@pytest.mark.parametrize("name", ["dense", "bm25"])
def test_retriever_k_larger_than_the_index(retrievers, embedder, loaded, name):
    result = run(retrievers[name], embedder, "cancer cells", 5000)
    assert 0 < len(result.hits) <= len(loaded.chunks)
    assert all(h.chunk_id >= 0 for h in result.hits)


@pytest.mark.parametrize("name", ["dense", "bm25"])
def test_query_copied_from_a_chunk_finds_that_chunk_first(retrievers, embedder, sample_chunks, name):
    misses = []
    for chunk in sample_chunks:
        result = run(retrievers[name], embedder, chunk.text, 10)
        if result.hits[0].chunk_id != chunk.chunk_id:
            misses.append(chunk.chunk_id)
    assert misses == []


def test_bm25_finds_a_chunk_from_one_of_its_sentences(retrievers, loaded, sample_chunks):
    for chunk in sample_chunks:
        spans = sentence_spans(chunk.text)
        a, b = max(spans, key=lambda s: s[1] - s[0])
        hits = retrievers["bm25"].retrieve(chunk.text[a:b], None, 10).hits
        # The same document's other chunks share its title (and maybe the overlap), so they may
        # outrank it; the chunk itself must still be near the top, and the document first.
        assert loaded.chunks[hits[0].chunk_id].doc_id == chunk.doc_id
        assert chunk.chunk_id in [h.chunk_id for h in hits[:3]]


@pytest.mark.parametrize("query", ["zzyzx qwertyuiopasdf", "the and of to was", "", "!!! ???"])
def test_bm25_without_a_known_term_returns_no_hits(retrievers, query):
    result = retrievers["bm25"].retrieve(query, None, 10)
    assert result.hits == []
    assert result.seconds >= 0


def test_bm25_scores_are_positive(retrievers):
    result = retrievers["bm25"].retrieve("insulin resistance", None, 50)
    assert result.hits and all(h.score > 0 for h in result.hits)


def test_dense_retriever_needs_the_query_vector(retrievers):
    with pytest.raises(ValueError, match="embedding"):
        retrievers["dense"].retrieve("anything", None, 5)


def test_dense_scores_are_cosine_similarities(retrievers, embedder, loaded):
    vector = embedder.embed_query("stem cell differentiation").vector
    result = retrievers["dense"].retrieve("stem cell differentiation", vector, 5)
    for hit in result.hits:
        stored = loaded.faiss_index.reconstruct(hit.chunk_id)
        assert hit.score == pytest.approx(float(np.dot(stored, vector)), abs=1e-4)
        assert -1.0 <= hit.score <= 1.0 + 1e-5


# -- WeightedRRF ------------------------------------------------------------------------------------

def result(name: str, ids: list[int]) -> RetrievalResult:
    return RetrievalResult(name, [Hit(i, 100.0 - n) for n, i in enumerate(ids)], 0.0)


def test_rrf_exact_scores_with_weights_and_k():
    fuser = WeightedRRF({"dense": 1.0, "bm25": 2.0}, k=10)
    fused = fuser.fuse([result("dense", [7, 3, 9]), result("bm25", [3, 5])], k=10)
    expected = {
        3: 1.0 / 12 + 2.0 / 11,
        5: 2.0 / 12,
        7: 1.0 / 11,
        9: 1.0 / 13,
    }
    assert [h.chunk_id for h in fused.hits] == [3, 5, 7, 9]
    for hit in fused.hits:
        assert hit.score == pytest.approx(expected[hit.chunk_id], rel=1e-12)
    assert fused.seconds >= 0


def test_rrf_top_score_range_runs_from_first_in_the_heaviest_list_to_first_in_every_list():
    fuser = WeightedRRF({"dense": 1.0, "bm25": 2.0}, k=10)
    agreeing = [result("dense", [3, 7]), result("bm25", [3, 5])]
    disagreeing = [result("dense", [7, 8]), result("bm25", [3, 5])]
    assert fuser.top_score_range(agreeing) == pytest.approx((2.0 / 11, 3.0 / 11))
    assert fuser.fuse(agreeing, k=3).hits[0].score == pytest.approx(3.0 / 11)  # the most
    assert fuser.fuse(disagreeing, k=3).hits[0].score == pytest.approx(2.0 / 11)  # the least
    assert fuser.top_score_range([result("dense", [3]), result("bm25", [])]) == pytest.approx((1.0 / 11, 1.0 / 11))


def test_rrf_ignores_the_retrievers_raw_scores():
    fuser = WeightedRRF({"dense": 1.0, "bm25": 1.0}, k=60)
    a = fuser.fuse([RetrievalResult("dense", [Hit(1, 0.9), Hit(2, 0.1)], 0.0)], k=5)
    b = fuser.fuse([RetrievalResult("dense", [Hit(1, 1e6), Hit(2, -3.0)], 0.0)], k=5)
    assert a.hits == b.hits
    assert a.hits[0].score == pytest.approx(1 / 61)


def test_rrf_cuts_to_k():
    fused = WeightedRRF({}, k=1).fuse([result("dense", list(range(20)))], k=4)
    assert [h.chunk_id for h in fused.hits] == [0, 1, 2, 3]
    assert fused.hits[0].score == pytest.approx(1 / 2)


def test_rrf_unknown_retriever_counts_with_weight_one():
    fused = WeightedRRF({"dense": 3.0}, k=1).fuse([result("splade", [4])], k=5)
    assert fused.hits == [Hit(4, 0.5)]


def test_rrf_zero_weight_keeps_ids_but_adds_nothing():
    fused = WeightedRRF({"dense": 1.0, "bm25": 0.0}, k=1).fuse([result("dense", [1]), result("bm25", [2, 1])], k=5)
    assert fused.hits[0] == Hit(1, 0.5)
    assert fused.hits[1] == Hit(2, 0.0)


def test_rrf_ties_are_ordered_by_chunk_id():
    fuser = WeightedRRF({"dense": 1.0, "bm25": 1.0}, k=60)
    # 42 is first for dense and 8 is first for bm25: equal fused scores, likewise 17 and 5.
    fused = fuser.fuse([result("dense", [42, 17]), result("bm25", [8, 5])], k=10)
    assert [h.chunk_id for h in fused.hits] == [8, 42, 5, 17]
    assert fused.hits[0].score == fused.hits[1].score
    swapped = fuser.fuse([result("bm25", [8, 5]), result("dense", [42, 17])], k=10)
    assert swapped.hits == fused.hits


def test_rrf_of_nothing_is_empty():
    assert WeightedRRF({}).fuse([], k=5).hits == []
    assert WeightedRRF({}).fuse([result("dense", []), result("bm25", [])], k=5).hits == []


@pytest.mark.parametrize("k", [0, -1.0, -60])
def test_rrf_rejects_non_positive_k(k):
    with pytest.raises(ValueError, match="k"):
        WeightedRRF({"dense": 1.0}, k=k)


@pytest.mark.parametrize("k", [math.nan])
def test_rrf_rejects_nan_k(k):
    with pytest.raises(ValueError, match="k"):
        WeightedRRF({"dense": 1.0}, k=k)


@pytest.mark.parametrize("weights", [{"dense": -0.5}, {"dense": 1.0, "bm25": -1e-9}, {"bm25": math.nan}])
def test_rrf_rejects_invalid_weights(weights):
    with pytest.raises(ValueError, match="weight"):
        WeightedRRF(weights, k=60)


# -- ExtractiveGenerator ----------------------------------------------------------------------------

ANALYZER = LexicalAnalyzer("english")


def chunk(chunk_id: int, text: str, doc_id: str = "d", start: int = 0) -> Chunk:
    return Chunk(chunk_id, doc_id, "Title", text, start, start + len(text))


def idf_for(*texts: str) -> dict[str, float]:
    """Document frequencies over the given texts, turned into the index's IDF formula."""
    from rag.index.sparse import build_bm25

    _, idf = build_bm25(ANALYZER.tokens_many(texts), 1.2, 0.75)
    return idf


def test_every_sentence_cites_a_passage_that_contains_it():
    passages = [
        chunk(0, "Aspirin lowers fever. It also thins the blood. Doctors prescribe it after heart attacks."),
        chunk(1, "Ibuprofen lowers fever too. It is an anti-inflammatory drug."),
        chunk(2, "Paracetamol is another drug that lowers fever in children."),
    ]
    idf = idf_for(*(p.text for p in passages), "Unrelated filler text about rivers.")
    generated = ExtractiveGenerator(ANALYZER, idf, max_sentences=3).generate("which drug lowers fever", passages)
    assert generated.generator == "extractive"
    assert len(generated.sentences) == 3
    for sentence in generated.sentences:
        assert 1 <= sentence.citation <= len(passages)
        assert sentence.text in passages[sentence.citation - 1].text
    assert generated.answer == " ".join(f"{s.text} [{s.citation}]" for s in generated.sentences)
    assert generated.seconds >= 0


def test_rare_query_terms_win_over_common_ones():
    common = "Patients were treated in the study."
    texts = [common] * 30 + ["Metformin was given daily."]
    idf = idf_for(*texts)
    passage = chunk(0, "Patients in the study were treated well. Metformin reduced glucose. The weather was mild.")
    generated = ExtractiveGenerator(ANALYZER, idf, max_sentences=1).generate(
        "did metformin help patients in the study", [passage])
    assert [s.text for s in generated.sentences] == ["Metformin reduced glucose."]


def test_rare_term_in_a_lower_ranked_passage_still_wins():
    idf = idf_for(*(["Patients were treated in the study."] * 50), "Metformin was given daily.")
    passages = [chunk(0, "Patients in the study were treated."), chunk(1, "Metformin reduced glucose levels.")]
    generated = ExtractiveGenerator(ANALYZER, idf, max_sentences=1).generate(
        "metformin in study patients", passages)
    assert generated.sentences[0].citation == 2


def test_equal_sentences_prefer_the_higher_ranked_passage():
    idf = idf_for("Glucose rose.", "Glucose fell.", "Other text.")
    passages = [chunk(0, "Glucose rose."), chunk(1, "Glucose fell.")]
    generated = ExtractiveGenerator(ANALYZER, idf, max_sentences=2).generate("glucose", passages)
    assert [s.citation for s in generated.sentences] == [1, 2]


@pytest.mark.parametrize("max_sentences", [1, 2, 4])
def test_max_sentences_is_respected(max_sentences):
    passages = [chunk(i, f"Tides rise at dawn number {i}. Tides fall at dusk number {i}.") for i in range(5)]
    idf = idf_for(*(p.text for p in passages))
    generated = ExtractiveGenerator(ANALYZER, idf, max_sentences=max_sentences).generate("tides", passages)
    assert len(generated.sentences) == max_sentences


def test_max_sentences_must_be_positive():
    with pytest.raises(ValueError, match="max_sentences"):
        ExtractiveGenerator(ANALYZER, {}, max_sentences=0)


GLACIERS = ("Glaciers carve deep valleys. Glacial valleys have a U shape. Rivers carve V-shaped valleys. "
            "Erosion by ice is slow.")


def test_overlapping_passages_do_not_repeat_a_sentence():
    shared = "Glacial valleys have a U shape."
    cut = GLACIERS.index("Rivers")
    first = chunk(0, GLACIERS[:cut - 1], doc_id="geo", start=0)
    start = GLACIERS.index(shared)
    second = chunk(1, GLACIERS[start:], doc_id="geo", start=start)
    assert shared in first.text and shared in second.text
    idf = idf_for(GLACIERS, "Unrelated text about cooking.")
    generated = ExtractiveGenerator(ANALYZER, idf, max_sentences=5).generate("glacial valleys carve", [first, second])
    texts = [" ".join(s.text.lower().split()) for s in generated.sentences]
    assert len(texts) == len(set(texts))
    assert sorted(texts) == sorted(["glaciers carve deep valleys.", "glacial valleys have a u shape.",
                                    "rivers carve v-shaped valleys."])


def test_sentence_cut_by_a_chunk_edge_is_not_repeated_as_a_fragment():
    """Token windows end mid-sentence; the neighbour holds the whole sentence. Answer it once."""
    cut = GLACIERS.index("valleys. Erosion")  # a word boundary inside the third sentence
    first = chunk(0, GLACIERS[:cut].rstrip(), doc_id="geo", start=0)  # ends "... Rivers carve V-shaped"
    start = GLACIERS.index("Glacial")
    second = chunk(1, GLACIERS[start:], doc_id="geo", start=start)
    assert first.text.endswith("Rivers carve V-shaped")
    idf = idf_for(GLACIERS, "Unrelated text about cooking.")
    generated = ExtractiveGenerator(ANALYZER, idf, max_sentences=5).generate("rivers carve valleys", [first, second])
    texts = [" ".join(s.text.lower().split()) for s in generated.sentences]
    repeats = [(a, b) for a in texts for b in texts if a != b and a in b]
    assert repeats == [], "a fragment of an answer sentence was answered again"
    for sentence in generated.sentences:
        assert sentence.text in (first, second)[sentence.citation - 1].text


def test_duplicate_detection_ignores_case_and_spacing():
    passages = [chunk(0, "Tides follow  the Moon."), chunk(1, "tides follow the\nmoon.")]
    idf = idf_for("Tides follow the Moon.", "Other.")
    generated = ExtractiveGenerator(ANALYZER, idf, max_sentences=3).generate("tides moon", passages)
    assert [s.citation for s in generated.sentences] == [1]


def test_fallback_to_the_top_passage_lead_when_no_term_matches():
    passages = [chunk(0, "Volcanoes erupt lava. Ash clouds follow."), chunk(1, "Tides follow the Moon.")]
    idf = idf_for(*(p.text for p in passages))
    generated = ExtractiveGenerator(ANALYZER, idf).generate("quantum chromodynamics", passages)
    assert [(s.text, s.citation) for s in generated.sentences] == [("Volcanoes erupt lava.", 1)]


def test_no_passages_no_answer():
    generated = ExtractiveGenerator(ANALYZER, {"tide": 1.0}).generate("tides", [])
    assert generated.sentences == [] and generated.answer == ""


def test_stopword_only_query_falls_back():
    passages = [chunk(0, "The first sentence. The second one.")]
    generated = ExtractiveGenerator(ANALYZER, idf_for(passages[0].text)).generate("the and of", passages)
    assert [s.text for s in generated.sentences] == ["The first sentence."]


def test_generator_on_real_passages(pipeline):
    result = pipeline.query("What is the role of TNF in inflammation?", top_k=5)
    assert result.sentences
    for sentence in result.sentences:
        assert sentence.text in result.sources[sentence.citation - 1].chunk.text


# -- LexicalAnalyzer --------------------------------------------------------------------------------

def test_analyzer_lowercases_stems_and_removes_stopwords():
    tokens = ANALYZER.tokens("The Running of the Studies and Mice was Quickly DONE")
    assert "the" not in tokens and "and" not in tokens and "of" not in tokens
    assert "run" in tokens
    assert "studi" in tokens
    assert "quick" in tokens
    assert all(t == t.lower() for t in tokens)


def test_analyzer_same_stem_for_inflections():
    assert ANALYZER.tokens("infection") == ANALYZER.tokens("infections")
    assert ANALYZER.tokens("treated") == ANALYZER.tokens("treating") == ANALYZER.tokens("treat")


def test_analyzer_drops_single_characters_and_punctuation():
    assert ANALYZER.tokens("a b c x-ray, p < 0.05!") == ["ray", "05"]


def test_analyzer_without_stemmer():
    plain = LexicalAnalyzer("")
    assert plain.tokens("Running studies") == ["running", "studies"]
    assert plain.params()["stemmer"] == ""
    assert ANALYZER.params()["stemmer"] == "english"


def test_analyzer_tokens_many():
    assert ANALYZER.tokens_many(["Cells divide", "the"]) == [["cell", "divid"], []]


# -- BEIR metrics -----------------------------------------------------------------------------------

def test_ndcg_binary_relevance():
    relevant = {"a": 1, "b": 1}
    # hits at ranks 1 and 3: DCG = 1 + 1/log2(4) = 1.5; IDCG = 1 + 1/log2(3)
    assert ndcg_at(["a", "x", "b"], relevant, 10) == pytest.approx(1.5 / (1 + 1 / math.log2(3)))
    assert ndcg_at(["a", "b"], relevant, 10) == pytest.approx(1.0)
    assert ndcg_at(["x", "y"], relevant, 10) == 0.0


def test_ndcg_graded_relevance():
    relevant = {"a": 2, "b": 1, "c": 0}
    # ranked b, x, a: DCG = 1/log2(2) + 0 + 2/log2(4) = 2; IDCG = 2/log2(2) + 1/log2(3)
    assert ndcg_at(["b", "x", "a"], relevant, 3) == pytest.approx(2 / (2 + 1 / math.log2(3)))
    assert ndcg_at(["a", "b"], relevant, 3) == pytest.approx(1.0)
    # order matters with grades: b before a is worse than a before b
    assert ndcg_at(["b", "a"], relevant, 3) < ndcg_at(["a", "b"], relevant, 3)
    assert ndcg_at(["b", "a"], relevant, 3) == pytest.approx((1 + 2 / math.log2(3)) / (2 + 1 / math.log2(3)))


def test_ndcg_cutoff():
    relevant = {"a": 1}
    assert ndcg_at(["x", "y", "a"], relevant, 2) == 0.0
    # ideal ordering is cut at k too: with k=1 and 3 relevant docs, IDCG = 1
    assert ndcg_at(["a", "b", "c"], {"a": 1, "b": 1, "c": 1}, 1) == pytest.approx(1.0)


def test_ndcg_without_relevant_documents_is_zero():
    assert ndcg_at(["a"], {"a": 0}, 10) == 0.0
    assert ndcg_at(["a"], {}, 10) == 0.0


def test_recall_at_k():
    relevant = {"a": 1, "b": 2, "c": 1, "d": 0}
    assert recall_at(["a", "x", "b", "d"], relevant, 10) == pytest.approx(2 / 3)
    assert recall_at(["a", "x", "b"], relevant, 2) == pytest.approx(1 / 3)
    assert recall_at(["d"], relevant, 10) == 0.0
    assert recall_at(["a"], {"a": 0}, 10) == 0.0


def test_mrr_at_k():
    relevant = {"b": 1, "c": 2, "z": 0}
    assert mrr_at(["z", "b", "c"], relevant, 10) == pytest.approx(1 / 2)
    assert mrr_at(["x", "y", "z", "c"], relevant, 10) == pytest.approx(1 / 4)
    assert mrr_at(["x", "y", "z", "c"], relevant, 3) == 0.0
    assert mrr_at(["c"], relevant, 10) == 1.0


def test_score_run_averages_over_judged_queries_and_counts_missing_as_zero():
    qrels = {
        "q1": {"a": 1},
        "q2": {"b": 1, "c": 1},
        "q3": {"d": 0},  # no relevant document: not judged, not averaged
        "q4": {"e": 1},  # judged but missing from the run: scores 0
    }
    run = {"q1": ["a", "x"], "q2": ["x", "b"], "q3": ["d"], "q5": ["e"]}
    scores = score_run(run, qrels)
    assert set(scores) == {"ndcg@10", "recall@10", "recall@100", "mrr@10"}
    q2_ndcg = (1 / math.log2(3)) / (1 + 1 / math.log2(3))
    assert scores["ndcg@10"] == pytest.approx((1.0 + q2_ndcg + 0.0) / 3)
    assert scores["recall@10"] == pytest.approx((1.0 + 0.5 + 0.0) / 3)
    assert scores["recall@100"] == pytest.approx((1.0 + 0.5 + 0.0) / 3)
    assert scores["mrr@10"] == pytest.approx((1.0 + 0.5 + 0.0) / 3)


def test_score_run_recall_at_100_sees_past_rank_10():
    run = {"q": [f"x{i}" for i in range(50)] + ["a"]}
    scores = score_run(run, {"q": {"a": 1}})
    assert scores["recall@10"] == 0.0
    assert scores["recall@100"] == 1.0
    assert scores["mrr@10"] == 0.0


def test_score_run_without_judgments():
    assert score_run({"q": ["a"]}, {}) == {"ndcg@10": 0.0, "recall@10": 0.0, "recall@100": 0.0, "mrr@10": 0.0}


def test_a_stage_names_its_thread_for_the_kernel_and_restores_it():
    from rag.query_context import StageOptions, StageTimer

    def comm() -> str:
        return open("/proc/thread-self/comm").read().strip()

    before, stages = comm(), []
    with StageTimer("retrieve_bm25", stages, StageOptions(True, None, 0.0)):
        inside = comm()
    assert (inside, comm()) == ("rh:retrieve_bm2", before)  # the kernel keeps 15 bytes
    with StageTimer("fuse", stages, StageOptions(False, "fuse", 0.02)):
        assert comm() == before  # naming off: untouched
    assert [s.name for s in stages] == ["retrieve_bm25", "fuse"]
    assert stages[1].seconds >= 0.02  # the injected delay is inside the stage's timing


def test_a_worker_started_by_a_stage_named_thread_is_not_counted_as_that_stage():
    import threading

    from rag.threadnames import original_name, set_name, stage_comm

    seen = []

    def loop():  # like the event loop (rh:http) starting its worker threads, which inherit its name
        set_name(stage_comm("http"))
        worker = threading.Thread(target=lambda: seen.append(original_name()), name="AnyIO worker thread")
        worker.start()
        worker.join()

    outer = threading.Thread(target=loop)
    outer.start()
    outer.join()
    assert seen == [b"AnyIO worker th"]
