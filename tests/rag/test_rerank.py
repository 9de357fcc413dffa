"""The late-interaction reranker (rag/rerank): MaxSim against a brute-force reference, the head without torch, stored
token vectors round-tripping through an index generation, and the reranker's order."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from rag.errors import ConfigurationError, IndexLoadError, IngestError
from rag.rerank.features import RerankQuery, candidate_features
from rag.rerank.head import DEFAULT_HEAD, FEATURES, RerankHead
from rag.rerank.maxsim import Int8MaxSim, maxsim
from rag.rerank.reranker import LateInteractionReranker
from rag.rerank.store import TokenVectorWriter, load_token_vectors, product_quantize, quantize_int8
from rag.types import Hit


def _unit(rng, *shape):
    x = rng.standard_normal(shape).astype(np.float32)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _brute_maxsim(query, docs):
    return np.array([np.mean([max(float(q @ t) for t in doc) for q in query]) for doc in docs])


def test_maxsim_matches_a_brute_force_reference():
    rng = np.random.default_rng(7)
    query = _unit(rng, 9, 16)
    docs = [_unit(rng, n, 16) for n in (1, 5, 31, 2, 64)]
    starts = np.concatenate([[0], np.cumsum([len(d) for d in docs])[:-1]])
    got = maxsim(query, np.concatenate(docs), starts)
    np.testing.assert_allclose(got, _brute_maxsim(query, docs), rtol=1e-5, atol=1e-6)
    # One document: the same; a document identical to the query scores 1 (every query token finds itself).
    assert maxsim(query, query, np.array([0]))[0] == pytest.approx(1.0, abs=1e-5)
    assert maxsim(query, np.zeros((0, 16), np.float32), np.array([], np.int64)).shape == (0,)


def test_the_int8_product_matches_maxsim_over_the_dequantised_vectors(tmp_path):
    """Int8MaxSim (ONNX Runtime's integer product over the stored codes, the query quantised per token) gives the
    scores float MaxSim gives over codes x scales, within the query's quantisation step."""
    rng = np.random.default_rng(11)
    head = _head(rng, dim=16)
    states = [rng.standard_normal((n, 24)).astype(np.float32) for n in (1, 5, 31, 2, 64, 9)]
    writer = TokenVectorWriter(head, "int8")
    for i, st in enumerate(states):
        writer.add(i, st)
    vectors = load_token_vectors(tmp_path, writer.write(tmp_path, len(states)), head, len(states))
    ids = [4, 0, 5, 2]
    codes, scales, starts = vectors.gather_codes(ids)
    matrix, float_starts = vectors.gather(ids)
    np.testing.assert_array_equal(starts, float_starts)
    np.testing.assert_array_equal(codes.astype(np.int16) - 128, np.asarray(vectors.codes)[
        np.concatenate([np.arange(vectors.offsets[i], vectors.offsets[i + 1]) for i in ids])])
    query_states = rng.standard_normal((7, 24)).astype(np.float32)
    query = head.project(query_states)
    exact = maxsim(query, matrix, float_starts)
    got = Int8MaxSim()(query, codes, scales, starts)
    np.testing.assert_allclose(got, exact, atol=2e-3)  # int8's step on unit query components: ~1/254 each
    assert Int8MaxSim()(query, codes[:0], scales[:0], starts[:0]).shape == (0,)
    # The reranker serves int8 vectors with it; float_product keeps numpy's float32 product (the reference).
    served, reference = LateInteractionReranker(head, vectors), LateInteractionReranker(head, vectors,
                                                                                         float_product=True)
    hits = [Hit(i, 1.0) for i in ids]
    asked = RerankQuery(query_states, {})
    np.testing.assert_allclose(served.scores(asked, hits), reference.scores(asked, hits), atol=2e-3)
    assert served._int8 is not None and reference._int8 is None


def test_the_int8_product_is_exact_at_the_codes_extremes(monkeypatch):
    """Codes and query components at int8's ends (every product as large as it gets, long rows of one sign): the
    integer product is exact on this CPU, whatever its kernels (a uint8 x int8 kernel without VNNI adds pairs of
    products in 16 bits and would saturate here): the query is fed signed only where the CPU has VNNI or AMX, and
    both ways give the same scores there."""
    from rag import cpu
    rng = np.random.default_rng(5)
    dim = 128
    codes = np.where(rng.random((40, dim)) < 0.9, 127, -127).astype(np.int16)
    codes[:8] = 127  # whole rows at the top end
    scales = np.full(40, 1 / 127 / np.sqrt(dim), np.float32)
    query = np.where(rng.random((6, dim)) < 0.9, 1.0, -1.0).astype(np.float32) / np.sqrt(dim)
    starts = np.array([0, 8, 21, 33])
    exact = maxsim(query, codes.astype(np.float32) * scales[:, None], starts)
    product = Int8MaxSim()
    assert product.signed_query == cpu.exact_u8s8(cpu.cpu_identity().get("isa", ()))
    ways = [product, Int8MaxSim(signed_query=False)] + ([Int8MaxSim(signed_query=True)] if product.signed_query else [])
    for way in ways:
        got = way(query, (codes + 128).astype(np.uint8), scales, starts)
        np.testing.assert_allclose(got, exact, rtol=1e-5, atol=1e-6)
    monkeypatch.setattr(cpu, "cpu_identity", lambda: {"model": "a CPU without VNNI", "isa": ["avx2", "avx512f"]})
    assert not Int8MaxSim().signed_query
    monkeypatch.setattr(cpu, "cpu_identity", lambda: {"model": "a CPU with VNNI", "isa": ["avx2", "avx512_vnni"]})
    assert Int8MaxSim().signed_query


def test_the_shipped_product_graphs_are_the_ones_built():
    """The service reads MaxSim's two graphs from the package (it never imports onnx); they are what
    ``product_graph`` builds (``python -m rag.rerank.maxsim`` rewrites them)."""
    import onnx

    from rag.rerank.maxsim import product_graph, product_graph_path

    for signed in (True, False):
        shipped = onnx.load(str(product_graph_path(signed)))
        assert onnx.printer.to_text(shipped.graph) == onnx.printer.to_text(product_graph(signed).graph), signed


def _head(rng, hidden=24, dim=8, weights=(1.0, 0.0, 0.0, 0.0)) -> RerankHead:
    return RerankHead(rng.standard_normal((hidden, dim)).astype(np.float32), np.array(weights, np.float32))


def test_the_head_saves_and_loads_with_its_metadata(tmp_path):
    rng = np.random.default_rng(1)
    head = RerankHead(rng.standard_normal((24, 8)).astype(np.float32), np.array([1, 2, 3, 4], np.float32), 0.5,
                      meta={"seed": 3, "command": "ragheat train-reranker"})
    loaded = RerankHead.load(head.save(tmp_path / "head"))
    np.testing.assert_array_equal(loaded.projection, head.projection)
    assert loaded.meta == head.meta and loaded.projection_sha256 == head.projection_sha256 and loaded.bias == 0.5
    assert (tmp_path / "head.onnx").is_file()  # the projection's ONNX export, beside the weights
    (tmp_path / "bad.npz").write_bytes(b"not a head")
    with pytest.raises(ConfigurationError, match="bad.npz"):
        RerankHead.load(tmp_path / "bad.npz")


def test_the_projection_runs_on_onnx_runtime_from_the_exported_graph(tmp_path):
    """project() runs the .onnx beside the .npz (ONNX Runtime), equal to the matrix product and row normalisation
    it exports; an all-zero row stays zero; a graph exported from another projection is refused."""
    rng = np.random.default_rng(2)
    states = rng.standard_normal((7, 24)).astype(np.float32)
    states[3] = 0.0
    head = RerankHead.load(_head(rng).save(tmp_path / "head.npz"))
    expected = states @ head.projection
    expected[[0, 1, 2, 4, 5, 6]] /= np.linalg.norm(expected[[0, 1, 2, 4, 5, 6]], axis=1, keepdims=True)
    np.testing.assert_allclose(head.project(states), expected, atol=1e-6)
    assert head._onnx is not None and not np.any(head.project(states)[3])
    _head(rng).save(tmp_path / "other.npz")
    (tmp_path / "other.onnx").replace(tmp_path / "head.onnx")  # another head's graph beside this head's weights
    with pytest.raises(ConfigurationError, match="exported from another projection"):
        RerankHead.load(tmp_path / "head.npz").project(states)


def test_the_shipped_head_has_its_onnx_export():
    import onnx

    from rag.rerank import onnx_head

    shipped = RerankHead.load(DEFAULT_HEAD)
    onnx_head.load(DEFAULT_HEAD.with_suffix(".onnx"), shipped.projection_sha256)  # refused if stale
    model = onnx.load(str(DEFAULT_HEAD.with_suffix(".onnx")))
    assert onnx.printer.to_text(model.graph) == onnx.printer.to_text(shipped.to_onnx().graph)


def test_the_shipped_head_and_the_serving_path_load_without_torch():
    """Serving is torch-free: with torch made unimportable, the shipped head loads and projects on ONNX Runtime."""
    code = ("import sys; sys.modules['torch'] = None\n"
            "import numpy as np\n"
            "from rag.rerank.head import DEFAULT_HEAD, RerankHead\n"
            "import rag.rerank.reranker, rag.rerank.store, rag.rerank.ingest, rag.eval.runner\n"
            "head = RerankHead.load(DEFAULT_HEAD)\n"
            "print(head.hidden, head.dim, head.project(np.ones((3, head.hidden), np.float32)).shape, "
            "sorted(head.meta)[:0], 'torch' in sys.modules and sys.modules['torch'] is not None)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["384", "128", "(3,", "128)", "[]", "False"]
    meta = RerankHead.load(DEFAULT_HEAD).meta
    assert {"command", "data", "seed"} <= set(meta), "the shipped head records how it was trained"


@pytest.mark.parametrize("dtype,tolerance", [("fp16", 2e-3), ("int8", 1.5e-2)])
def test_stored_token_vectors_round_trip(tmp_path, dtype, tolerance):
    rng = np.random.default_rng(2)
    head = _head(rng)
    states = [rng.standard_normal((n, 24)).astype(np.float32) for n in (3, 7, 2, 11)]
    writer = TokenVectorWriter(head, dtype)
    for i in (2, 0, 3, 1):  # batch order, not chunk order
        writer.add(i, states[i])
    block = writer.write(tmp_path, len(states))
    assert block["tokens"] == 23 and block["dtype"] == dtype and block["bytes"] > 0
    vectors = load_token_vectors(tmp_path, block, head, len(states))
    matrix, starts = vectors.gather([3, 1])
    np.testing.assert_array_equal(starts, [0, 11])
    np.testing.assert_allclose(matrix, np.concatenate([head.project(states[3]), head.project(states[1])]),
                               atol=tolerance)
    with pytest.raises(IndexLoadError, match="another rerank head"):
        load_token_vectors(tmp_path, block, _head(rng), len(states))
    with pytest.raises(IndexLoadError, match="do not match"):
        load_token_vectors(tmp_path, block, head, len(states) + 1)
    with pytest.raises(IndexLoadError, match="no rerank token vectors"):
        load_token_vectors(tmp_path, None, head, len(states))
    with pytest.raises(ValueError, match="missing for 1 chunks"):
        partial = TokenVectorWriter(head, dtype)
        partial.add(0, states[0])
        partial.write(tmp_path / "partial", 2)


@pytest.mark.parametrize("dtype", ["pq32", "pq16"])
def test_product_coded_token_vectors_round_trip_and_rank_like_the_float_ones(tmp_path, dtype):
    rng = np.random.default_rng(5)
    head = _head(rng, dim=64)
    # Tokens near a few shared directions, as a corpus's are: the codebooks learn them.
    topics = rng.standard_normal((12, 24)).astype(np.float32)
    states = [topics[rng.integers(0, 12, n)] + 0.2 * rng.standard_normal((n, 24)).astype(np.float32)
              for n in rng.integers(6, 14, 60)]
    writer = TokenVectorWriter(head, dtype)
    for i in rng.permutation(len(states)):
        writer.add(int(i), states[i])
    block = writer.write(tmp_path, len(states))
    pieces = int(dtype[2:])
    assert block["dtype"] == dtype and "rerank_scales.npy" not in block["files"]
    assert {"rerank_codebook.npy", "rerank_rotation.npy"} <= set(block["files"])
    stored = np.load(tmp_path / "rerank_tokens.npy")
    assert stored.dtype == np.uint8 and stored.shape == (block["tokens"], pieces)  # a byte per piece
    vectors = load_token_vectors(tmp_path, block, head, len(states))
    exact = [head.project(s) for s in states]
    matrix, starts = vectors.gather(list(range(len(states))))
    rotation = vectors.product.rotation  # orthogonal: the query turned the same way keeps every dot product
    np.testing.assert_allclose(rotation @ rotation.T, np.eye(64), atol=1e-4)
    reference = vectors.query_space(np.concatenate(exact))  # the codes' space
    cosine = np.sum(matrix * reference, 1) / np.linalg.norm(matrix, axis=1) / np.linalg.norm(reference, axis=1)
    assert np.median(cosine) > 0.95, np.median(cosine)
    # Each chunk's own tokens as the query: MaxSim over the codes finds that chunk first, as over the floats.
    reranker = LateInteractionReranker(head, vectors, candidates=len(states))
    fused = [Hit(c, 1.0) for c in range(len(states))]
    for target in (0, 17, 41):
        assert reranker.rerank(RerankQuery(states[target], {}), fused, k=1).hits[0].chunk_id == target
    (tmp_path / "rerank_codebook.npy").unlink()
    with pytest.raises(IndexLoadError, match="cannot be read"):
        load_token_vectors(tmp_path, block, head, len(states))


@pytest.mark.parametrize("dtype", ["int8", "fp16", "pq16"])
def test_token_vectors_spill_to_disk_while_embedding_and_are_written_in_chunk_order(tmp_path, dtype):
    rng = np.random.default_rng(7)
    head = _head(rng, dim=32)
    states = [rng.standard_normal((n, 24)).astype(np.float32) for n in rng.integers(3, 12, 50)]
    blocks = {}
    for block_rows in (7, 1 << 20):  # many blocks, one block: the same files
        folder = tmp_path / str(block_rows)
        folder.mkdir()
        writer = TokenVectorWriter(head, dtype)
        writer.spill_into(folder)
        for i in rng.permutation(len(states)):
            writer.add(int(i), states[i])
        assert {p.name for p in folder.iterdir()} == {".rerank_tokens.spill", ".rerank_scales.spill"}
        block = writer.write(folder, len(states), block_rows=block_rows)
        assert not any(p.name.endswith(".spill") for p in folder.iterdir()), "the spill files are removed"
        blocks[block_rows] = (block, np.load(folder / "rerank_tokens.npy"))
    (small, small_codes), (large, large_codes) = blocks.values()
    assert small == large and small_codes.shape[0] == sum(len(x) for x in states)
    np.testing.assert_array_equal(small_codes, large_codes)
    if dtype == "pq16":  # what the ingest writes is what product_quantize makes of the int8 vectors in chunk order
        int8 = [quantize_int8(head.project(x)) for x in states]
        coded, _ = product_quantize(np.concatenate([c for c, _ in int8]), np.concatenate([s for _, s in int8]), 16)
        np.testing.assert_array_equal(small_codes, coded)
    vectors = load_token_vectors(tmp_path / "7", small, head, len(states))
    matrix, _ = vectors.gather([4])
    exact = vectors.query_space(head.project(states[4]))
    cosine = np.sum(matrix * exact, 1) / np.linalg.norm(matrix, axis=1) / np.linalg.norm(exact, axis=1)
    assert cosine.min() > (0.9 if dtype == "pq16" else 0.999)


def test_a_failed_write_leaves_no_spill_behind(tmp_path):
    writer = TokenVectorWriter(_head(np.random.default_rng(0), dim=32), "pq16")
    writer.spill_into(tmp_path)
    writer.add(0, np.ones((5, 24), np.float32))
    with pytest.raises(IngestError, match="needs at least 256"):
        writer.write(tmp_path, 1)
    assert list(tmp_path.iterdir()) == []


def test_product_codes_must_divide_the_heads_dimensions():
    with pytest.raises(ValueError, match="16 pieces do not divide the head's 8 dimensions"):
        TokenVectorWriter(_head(np.random.default_rng(0)), "pq16")


def test_the_reranker_orders_the_candidates_by_the_combined_score(tmp_path):
    rng = np.random.default_rng(3)
    head = _head(rng)  # weights: MaxSim alone
    states = [rng.standard_normal((n, 24)).astype(np.float32) for n in (4, 6, 5, 3, 8, 2)]
    writer = TokenVectorWriter(head, "fp16")
    for i, s in enumerate(states):
        writer.add(i, s)
    vectors = load_token_vectors(tmp_path, writer.write(tmp_path, len(states)), head, len(states))
    reranker = LateInteractionReranker(head, vectors, candidates=4)
    query_states = rng.standard_normal((5, 24)).astype(np.float32)
    fused = [Hit(c, 1.0 / (60 + r)) for r, c in enumerate([5, 2, 0, 4, 1, 3], 1)]
    result = reranker.rerank(RerankQuery(query_states, {}), fused, k=6)
    expected = _brute_maxsim(head.project(query_states), [head.project(states[h.chunk_id]) for h in fused[:4]])
    order = [fused[i].chunk_id for i in np.argsort(-expected, kind="stable")]
    assert [h.chunk_id for h in result.hits] == order + [1, 3]  # past `candidates`, the fused order stays
    assert [h.chunk_id for h in reranker.rerank(RerankQuery(query_states, {}), fused, k=2).hits] == order[:2]
    with pytest.raises(ValueError, match="candidates must be greater than 0"):
        LateInteractionReranker(head, vectors, candidates=0)


def _mapped_rss_bytes(path) -> int:
    """Resident bytes of this process's mappings of ``path`` (/proc/self/smaps): pages it has touched."""
    total, inside = 0, False
    for line in open("/proc/self/smaps"):
        if line[0] in "0123456789abcdef" and "-" in line.split()[0]:
            inside = line.rstrip().endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1]) * 1024
    return total


def test_warm_up_brings_the_mapped_token_vectors_in_and_runs_the_scoring_path(tmp_path):
    # A cold page cache made the first reranks take 0.1-0.8 s, long enough for the deadline to skip reranking.
    rng = np.random.default_rng(5)
    head = _head(rng, hidden=24, dim=64)
    writer = TokenVectorWriter(head, "int8")
    for i in range(400):
        writer.add(i, rng.standard_normal((64, 24)).astype(np.float32))  # 400 x 64 x 64 bytes: 400 pages
    vectors = load_token_vectors(tmp_path, writer.write(tmp_path, 400), head, 400)
    reranker = LateInteractionReranker(head, vectors, candidates=4)
    mapped = vectors.codes.filename
    assert _mapped_rss_bytes(mapped) < vectors.codes.nbytes / 4, "a fresh mapping has touched little"
    reranker.warm_up()
    assert _mapped_rss_bytes(mapped) >= 0.95 * vectors.codes.nbytes
    assert reranker._int8 is not None  # the int8 product's session ran once (no error on an arbitrary query)
    assert vectors.prefault(available_bytes=vectors.codes.nbytes) == 0, "more than half the memory: left to fault in"
    assert vectors.prefault(available_bytes=4 * vectors.codes.nbytes) == vectors.codes.nbytes


def test_features_fill_in_what_a_retriever_did_not_return():
    candidates = [Hit(1, 0.03), Hit(2, 0.015)]
    first = {"dense": [Hit(1, 0.8), Hit(9, 0.6)], "bm25": [Hit(2, 12.0), Hit(7, 6.0)]}
    f = candidate_features(np.array([0.5, 0.4]), candidates, first)
    assert f.shape == (2, len(FEATURES))
    np.testing.assert_allclose(f, [[0.5, 1.0, 0.8, 0.0], [0.4, 0.5, 0.6, 1.0]], rtol=1e-6)
