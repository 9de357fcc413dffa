"""The head's projection exported to ONNX and run on ONNX Runtime: token states (tokens, hidden) -> unit token vectors
(tokens, dim). Ingest and the query path both project through it, so stored and query vectors come from the same
graph; torch only ever trains the matrix (``rag.rerank.train``).

The graph is MatMul by the trained matrix, then division by each row's L2 norm (floored at ``EPS``, so an all-zero
row stays zero). Its metadata records the projection's sha256, which an index's stored vectors also carry: a graph
exported from another head is refused. A head file ``NAME.npz`` ships with ``NAME.onnx`` beside it
(``RerankHead.save`` writes both); a head without one is exported in memory when loaded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from rag.errors import ConfigurationError

OPSET = 17  # ReduceL2 takes its axes as an attribute up to opset 17
EPS = 1e-12
INPUT, OUTPUT = "token_states", "token_vectors"
SHA_KEY = "projection_sha256"


def export(projection: np.ndarray, sha256: str, meta: dict[str, str] | None = None):
    """The projection as an ONNX model (opset ``OPSET``), ``sha256`` and ``meta`` in its metadata. Only exporting
    imports onnx: loading an exported head reads it with ONNX Runtime alone."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    projection = np.ascontiguousarray(projection, np.float32)
    hidden, dim = projection.shape
    nodes = [
        helper.make_node("MatMul", [INPUT, "projection"], ["projected"]),
        helper.make_node("ReduceL2", ["projected"], ["norm"], axes=[-1], keepdims=1),
        helper.make_node("Max", ["norm", "eps"], ["floored"]),
        helper.make_node("Div", ["projected", "floored"], [OUTPUT]),
    ]
    graph = helper.make_graph(
        nodes, "rerank_head",
        [helper.make_tensor_value_info(INPUT, TensorProto.FLOAT, ["tokens", hidden])],
        [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["tokens", dim])],
        [numpy_helper.from_array(projection, "projection"), numpy_helper.from_array(np.float32(EPS), "eps")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="ragheat")
    model.ir_version = 8  # what every onnxruntime since 1.10 reads
    helper.set_model_props(model, {SHA_KEY: sha256, **(meta or {})})
    onnx.checker.check_model(model)
    return model


def load(path: Path, sha256: str) -> "OnnxProjection":
    """The exported head at ``path``, on ONNX Runtime; ``ConfigurationError`` naming it when unreadable or exported
    from another projection than the one whose digest is ``sha256``."""
    try:
        projection = OnnxProjection(path.read_bytes())
    except Exception as exc:  # OSError, or ONNX Runtime's own errors for a file it cannot parse: unreadable
        raise ConfigurationError(f"rerank head {path} cannot be read ({type(exc).__name__}: {exc})") from exc
    found = projection.session.get_modelmeta().custom_metadata_map.get(SHA_KEY)
    if found != sha256:
        raise ConfigurationError(f"rerank head {path} was exported from another projection ({str(found)[:12]}…, "
                                 f"the .npz beside it has {sha256[:12]}…): re-save the head (`ragheat "
                                 f"train-reranker` writes both)")
    return projection


class OnnxProjection:
    """One ONNX Runtime session of the exported head (a serialised model, or an ``onnx.ModelProto``), on one thread
    (it runs on the request's own thread, beside the others; InferenceSession.run is thread-safe)."""

    def __init__(self, model) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        serialised = model if isinstance(model, bytes) else model.SerializeToString()
        self.session = ort.InferenceSession(serialised, options, providers=["CPUExecutionProvider"])

    def __call__(self, states: np.ndarray) -> np.ndarray:
        return self.session.run([OUTPUT], {INPUT: np.ascontiguousarray(states, np.float32)})[0]
