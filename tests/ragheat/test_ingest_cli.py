"""``ragheat ingest`` as a command (the one the entry point runs, in this process): each ``--index-kind`` with its
build flags, and ``--chunker semantic``, each recorded in the manifest exactly as given and searchable. The command's
encoder outputs are kept between runs (``kept_ingest_outputs``): its flags and what the ingest builds from them are
what is tested here."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rag.index import dense
from rag.index.store import load_index, read_manifest
from rag.ingest.chunking import plain_tokenizer
from rag.ingest.sources import load_source
from rag.settings import IndexSettings
from ragheat.cli import app

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("kept_ingest_outputs")]


def ingest_cli(source: Path, index: Path, *flags: str) -> dict:
    runner = CliRunner(env={"COLUMNS": "400", "NO_COLOR": "1"})
    done = runner.invoke(app, ["ingest", str(source), "--index", str(index), *flags])
    assert done.exit_code == 0 and done.exception is None, (done.exception, done.stdout + done.stderr)
    manifest = read_manifest(index)
    assert f"indexed {manifest['counts']['documents']} documents as {manifest['counts']['chunks']} chunks" \
        in " ".join(done.stdout.split()), done.stdout
    return manifest


@pytest.fixture(scope="module")
def abstracts(scifact_dir, tmp_path_factory) -> Path:
    """The first 20 SciFact abstracts as a BEIR folder."""
    out = tmp_path_factory.mktemp("abstracts")
    with open(scifact_dir / "corpus.jsonl", encoding="utf-8") as fh:
        (out / "corpus.jsonl").write_text("".join(line for _, line in zip(range(20), fh)), encoding="utf-8")
    return out


def titles_found(index: Path, embedder, source: Path, k: int) -> list[str]:
    """Documents whose title, as a query, does not bring one of their chunks into the dense top ``k``."""
    loaded = load_index(index, IndexSettings(device="cpu"))
    missed = []
    for doc in load_source(str(source)).documents:
        ids = dense.search(loaded.faiss_index, embedder.embed_query(doc.title).vector, k)[0].tolist()
        if doc.doc_id not in {loaded.chunks[i].doc_id for i in ids if i >= 0}:
            missed.append(doc.doc_id)
    return missed


@pytest.mark.parametrize("kind,flags,expected", [
    ("flat", [], {"kind": "flat", "metric": "inner_product"}),
    ("hnsw", ["--hnsw-m", "16", "--ef-construction", "100"],
     {"kind": "hnsw", "metric": "inner_product", "M": 16, "efConstruction": 100}),
])
def test_index_kind_flags_reach_the_manifest_and_the_index(abstracts, embedder, tmp_path, kind, flags, expected):
    index = tmp_path / kind
    manifest = ingest_cli(abstracts, index, "--index-kind", kind, *flags, "--window", "128", "--overlap", "8")
    assert manifest["dense"] == expected
    assert manifest["chunking"] == {"strategy": "tokens", "window_tokens": 128, "overlap_tokens": 8}
    assert manifest["counts"]["documents"] == 20
    faiss_index = load_index(index, IndexSettings(device="cpu")).faiss_index
    assert type(faiss_index).__name__ == {"flat": "IndexFlatIP", "hnsw": "IndexHNSWFlat"}[kind]
    if kind == "hnsw":
        assert faiss_index.hnsw.efConstruction == 100
    assert titles_found(index, embedder, abstracts, 3) == []


def test_ivfpq_flags_on_the_subset(scifact_subset, embedder, tmp_path):
    """IVF-PQ trains 256 centroids per sub-quantiser: the 300-abstract subset has enough chunks for that."""
    index = tmp_path / "ivfpq"
    manifest = ingest_cli(scifact_subset, index, "--index-kind", "ivfpq", "--nlist", "8", "--pq-m", "24")
    assert manifest["dense"] == {"kind": "ivfpq", "metric": "inner_product", "nlist": 8, "m": 24, "nbits": 8}
    loaded = load_index(index, IndexSettings(device="cpu"))
    assert type(loaded.faiss_index).__name__ == "IndexIVFPQ"
    assert (loaded.faiss_index.nlist, loaded.faiss_index.pq.M) == (8, 24)
    # Compressed vectors still find their own passage: each sampled chunk's embedded text, as a query.
    sample = random.Random(11).sample(loaded.chunks, 20)
    vectors = embedder.embed_many([f"{c.title}\n{c.text}" if c.title else c.text for c in sample])
    missed = [c.chunk_id for c, v in zip(sample, vectors)
              if c.chunk_id not in dense.search(loaded.faiss_index, v, 10)[0].tolist()]
    assert missed == []


def test_semantic_chunker_flag(abstracts, embedder, tmp_path):
    index = tmp_path / "semantic"
    manifest = ingest_cli(abstracts, index, "--chunker", "semantic")
    assert manifest["chunking"] == {"strategy": "semantic", "semantic_threshold": 0.45, "min_tokens": 48,
                                    "max_tokens": 200}
    loaded = load_index(index, IndexSettings(device="cpu"))
    documents = {d.doc_id: d for d in load_source(str(abstracts)).documents}
    tokenizer = plain_tokenizer(embedder.tokenizer)  # no truncation: count every word piece
    by_doc: dict[str, list] = {}
    for chunk in loaded.chunks:
        assert documents[chunk.doc_id].text[chunk.start:chunk.end] == chunk.text
        by_doc.setdefault(chunk.doc_id, []).append(chunk)
    assert set(by_doc) == set(documents)
    for doc_id, chunks in by_doc.items():
        text = documents[doc_id].text
        # Whole sentences, no overlap (unlike the token windows), and within max_tokens word pieces.
        for a, b in zip(chunks, chunks[1:]):
            assert a.end <= b.start and text[a.end:b.start].strip() == "", (doc_id, a, b)
            assert a.text.rstrip()[-1] in ".!?)]\"'%", (doc_id, a.text[-40:])
        assert all(len(tokenizer.encode(c.text, add_special_tokens=False).ids) <= 200 for c in chunks)
    assert any(len(chunks) > 1 for chunks in by_doc.values()), "no document was cut anywhere"
    assert titles_found(index, embedder, abstracts, 3) == []
