"""The query side's int8-row encoder (``embedding.query_precision=int8-row``, rag/embedding/quantize.py): the weight
MatMuls run on the integer kernel with one activation scale per token (inputs smoothed by factors fixed at build time,
the FFN's down-projection over each row's own range), so a query's vector does not depend on what shares its run, and
it lands next to the passages' own query vector."""

from __future__ import annotations

import typing
import uuid

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from rag.embedding import model_store
from rag.embedding.embedder import QUERY_PRECISIONS, SENTENCE_OUTPUT, OnnxEmbedder
from rag.embedding.encoder_spec import ROWWISE_SCHEME
from rag.settings import EmbeddingSettings


def _one_matmul(path, weight: np.ndarray) -> None:
    """Save a float graph of one MatMul, ``x @ weight``, at ``path``."""
    from onnx import helper

    rows, columns = weight.shape
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "one-matmul",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", rows])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", columns])],
                              [numpy_helper.from_array(weight, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))


def test_every_weight_matmul_runs_on_the_integer_kernel_with_per_channel_weights_and_smoothed_inputs(settings):
    embedder = OnnxEmbedder(settings.embedding.model_copy(update={"precision": "int8", "query_precision": "int8-row",
                                                                  "quiet_query_threads": 1}))
    embedder.warm_up()
    assert embedder.query_precision == "int8-row" and embedder.query_files.quantisation == ROWWISE_SCHEME
    assert embedder.files.precision == "int8"  # the passages' side is untouched
    graph = onnx.load(str(embedder.query_files.onnx_path)).graph
    weights = {init.name: init for init in graph.initializer}
    integer = [n for n in graph.node if n.op_type == "MatMulInteger"]
    assert len(integer) == 6 * 6  # six layers x (Q, K, V, attention output, FFN in, FFN out)
    for node in integer:
        weight = weights[node.input[1]]
        assert weight.data_type == onnx.TensorProto.INT8 and len(weight.dims) == 2
        scale = weights[node.input[1].removesuffix(".s8") + ".wscale"]
        assert list(scale.dims) == [weight.dims[1]]  # one scale per output channel
    assert not [n for n in graph.node if n.op_type == "MatMul" and n.input[1] in weights]
    smoothed = [weights[n.input[1]] for n in graph.node if n.op_type == "Mul" and n.input[1].endswith("unsmooth")]
    assert len(smoothed) == 6 * 3  # per layer: what Q/K/V read, the attention's output, the FFN's input
    for factors in smoothed:
        values = numpy_helper.to_array(factors)
        assert values.shape == (384,) and np.all(values > 0) and values.max() > 2 * values.min()


def test_smoothing_moves_an_outlier_channel_into_the_weight_and_keeps_the_product(tmp_path):
    """An input with one channel a hundred times the others: one scale per row rounds the small channels away;
    smoothed, the row's range is even and the product comes out at least twice as close, the same float product."""
    import onnxruntime as ort

    from rag.cpu import cpu_identity, exact_u8s8
    from rag.embedding.quantize import quantize_rowwise_int8, smoothing_factors

    rng = np.random.default_rng(1)
    dim = 64
    weight = rng.normal(size=(dim, dim)).astype(np.float32)
    _one_matmul(tmp_path / "fp32.onnx", weight)

    def rows(n):
        x = rng.normal(size=(n, dim)).astype(np.float32)
        x[:, 5] *= 100.0
        return x

    factors = smoothing_factors(tmp_path / "fp32.onnx", [{"x": rows(16)} for _ in range(4)])
    assert set(factors) == {"x"} and factors["x"][5] > 5 * np.median(factors["x"])
    quantize_rowwise_int8(tmp_path / "fp32.onnx", tmp_path / "plain.onnx")
    quantize_rowwise_int8(tmp_path / "fp32.onnx", tmp_path / "smoothed.onnx", factors)
    if not exact_u8s8(cpu_identity().get("isa", ())):
        pytest.skip("uint8 x int8 products are exact only on CPUs with VNNI or AMX, where int8-row is offered")
    x = rows(64)
    exact = x @ weight
    error = {}
    for name in ("plain", "smoothed"):
        got = ort.InferenceSession(str(tmp_path / f"{name}.onnx"), providers=["CPUExecutionProvider"]).run(["y"], {"x": x})
        error[name] = float(np.sqrt(np.mean((got[0] - exact) ** 2)))
    assert error["smoothed"] < 0.5 * error["plain"], error


def test_rows_of_an_all_positive_input_are_quantised_over_their_own_range(tmp_path):
    """The FFN's down-projection (input wider than output) reads the activation function's nearly all-positive
    output: its rows use all 256 steps from their minimum to their maximum, and the product still comes out right,
    clearly closer than one symmetric scale per row gets it."""
    import onnxruntime as ort

    from rag.cpu import cpu_identity, exact_u8s8
    from rag.embedding.quantize import quantize_rowwise_int8

    rng = np.random.default_rng(0)
    wide, narrow = 96, 32
    weight = rng.normal(size=(wide, narrow)).astype(np.float32)
    _one_matmul(tmp_path / "fp32.onnx", weight)
    quantize_rowwise_int8(tmp_path / "fp32.onnx", tmp_path / "row.onnx")
    nodes = onnx.load(str(tmp_path / "row.onnx")).graph.node
    assert {"ReduceMin", "MatMulInteger"} <= {n.op_type for n in nodes}
    if not exact_u8s8(cpu_identity().get("isa", ())):
        pytest.skip("uint8 x int8 products are exact only on CPUs with VNNI or AMX, where int8-row is offered")
    rows = (np.abs(rng.normal(size=(64, wide))) * 0.5 - 0.17).astype(np.float32)  # GELU-like: nearly all positive
    got = ort.InferenceSession(str(tmp_path / "row.onnx"), providers=["CPUExecutionProvider"]).run(["y"], {"x": rows})
    w_scale = np.abs(weight).max(axis=0) / 127
    w_q = np.clip(np.rint(weight / w_scale), -127, 127) * w_scale
    x_scale = np.abs(rows).max(axis=1, keepdims=True) / 127
    symmetric = (np.rint(rows / x_scale) * x_scale) @ w_q  # the same weights, one symmetric scale per row
    exact = rows @ weight
    rms = lambda y: float(np.sqrt(np.mean((y - exact) ** 2)))  # noqa: E731
    assert rms(got[0]) < 0.75 * rms(symmetric), (rms(got[0]), rms(symmetric))


def test_a_query_is_the_same_vector_alone_and_padded_in_a_batch_and_near_the_passages_precision(settings):
    row = OnnxEmbedder(settings.embedding.model_copy(update={"precision": "int8", "query_precision": "int8-row",
                                                             "quiet_query_threads": 1}))
    same = OnnxEmbedder(settings.embedding.model_copy(update={"precision": "int8", "query_precision": "same",
                                                              "quiet_query_threads": 1}))
    texts = ["what causes tides?", "Vitamin D deficiency raises the risk of multiple sclerosis in adults.",
             "α-synuclein aggregates in dopaminergic neurons", "x " * 300]
    alone = np.stack([row.embed_query(t).vector for t in texts])
    encoded = [row.tokenizer.encode(t) for t in texts]
    for order in (encoded, encoded[::-1]):  # padding and neighbours differ for every text
        batch = row._query_session.run([SENTENCE_OUTPUT], row._feed(order))[0]
        batch = batch if order is encoded else batch[::-1]
        cosine = (batch * alone).sum(axis=1) / np.linalg.norm(batch, axis=1)
        assert cosine.min() >= 0.9999, cosine
    passages_precision = np.stack([same.embed_query(t).vector for t in texts])
    agreement = (alone * passages_precision).sum(axis=1)
    assert agreement.min() > 0.99 and not np.allclose(alone, passages_precision), agreement


def test_every_query_precision_the_settings_offer_is_one_the_encoder_builds():
    offered = set(typing.get_args(EmbeddingSettings.model_fields["query_precision"].annotation))
    assert offered - {"same", "fastest"} == set(QUERY_PRECISIONS)
    passages = set(typing.get_args(EmbeddingSettings.model_fields["precision"].annotation))
    assert passages < set(QUERY_PRECISIONS)  # int8-row embeds queries only


def test_fastest_leaves_out_a_precision_a_read_only_cache_cannot_convert(settings, monkeypatch, caplog):
    """A cache folder made read-only before a precision was added: the service still starts, timing the rest."""
    from rag.embedding import embedder as module

    def ensure(model_dir, cache_dir, precision):
        if precision == "int8-row":  # as _atomic_build fails in a read-only folder
            raise PermissionError(13, "Read-only file system", str(cache_dir))
        return model_store.ensure_encoder(model_dir, cache_dir, precision)

    monkeypatch.setattr(module, "ensure_encoder", ensure)
    embedder = OnnxEmbedder(settings.embedding.model_copy(update={
        "precision": "int8", "query_precision": "fastest", "quiet_query_threads": 1}))
    embedder.warm_up()
    assert embedder.query_precision in ("int8", "fp32")
    assert "int8-row left out" in caplog.text and "Read-only file system" in caplog.text


def test_integer_products_are_exact_at_the_codes_extremes_or_the_encoder_is_refused(settings, tmp_path,
                                                                                     monkeypatch):
    """Rows and weights at int8's extremes, where a uint8 x int8 kernel that adds pairs in 16 bits saturates: on a CPU
    with VNNI the rewritten MatMul gives the float product exactly; on one without, int8-row is never chosen and
    asking for it is refused with the reason."""
    import onnxruntime as ort

    from rag.embedding import embedder as module
    from rag.cpu import exact_u8s8
    from rag.embedding.quantize import quantize_rowwise_int8
    from rag.errors import ConfigurationError

    if exact_u8s8(module.cpu_identity().get("isa", ())):
        dim = 64
        weight = np.where(np.add.outer(np.arange(dim), np.arange(dim)) % 2 == 0, 1.0, -1.0).astype(np.float32)
        _one_matmul(tmp_path / "fp32.onnx", weight)
        quantize_rowwise_int8(tmp_path / "fp32.onnx", tmp_path / "row.onnx")
        rows = np.stack([np.where(np.arange(dim) % 2 == 0, 1.0, -1.0), np.ones(dim), -np.ones(dim)]).astype(np.float32)
        session = ort.InferenceSession(str(tmp_path / "row.onnx"), providers=["CPUExecutionProvider"])
        assert np.allclose(session.run(["y"], {"x": rows})[0], rows @ weight, atol=1e-3)
    cpu = {"model": f"a CPU without VNNI {uuid.uuid4()}", "isa": ["avx2"]}  # never seen: nothing kept for it
    monkeypatch.setattr(module, "cpu_identity", lambda: cpu)
    with pytest.raises(ConfigurationError, match="no VNNI"):
        OnnxEmbedder(settings.embedding.model_copy(update={"query_precision": "int8-row"})).warm_up()
    timed = {}
    monkeypatch.setattr(module, "time_query_runs", lambda sessions, feeds, rounds=7: timed.update(sessions) or
                        {name: 1.0 for name in sessions})
    embedder = OnnxEmbedder(settings.embedding.model_copy(update={"precision": "int8", "query_precision": "fastest",
                                                                  "quiet_query_threads": 1}))
    embedder.warm_up()
    for kept in embedder.files.onnx_path.parent.glob("query-precision-*.json"):
        if cpu["model"] in kept.read_text():
            kept.unlink()
    assert set(timed) == {"int8", "fp32"}
