"""MaxSim, the late-interaction score: for each query token its best match among a document's tokens, averaged
over the query's tokens (ColBERT sums; the mean keeps scores comparable between short and long queries)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def limit_blas_threads() -> None:
    """One BLAS thread for this process's numpy products (MaxSim's matrix product is the reranker's one).

    A served query runs on one worker thread beside others; a BLAS call that fans out across the cores only waits
    for them: with OpenBLAS's default threads the rerank stage's wall time is mostly waiting, with one thread it is
    the thread's own CPU time (both side by side: docs/benchmarks.md, "Late-interaction reranker: what it costs").
    Process-wide and permanent: the limit is a property of the BLAS library, and switching it per call would race
    between request threads."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1, user_api="blas")


def maxsim(query: np.ndarray, tokens: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Scores of the documents whose token vectors are ``tokens[starts[i]:starts[i+1]]`` (the last runs to the end).

    ``query`` (q, dim) and ``tokens`` (n, dim) are unit vectors; one matrix product, then a segmented max. Every
    document needs at least one token (each stored chunk has [CLS] and [SEP])."""
    if len(starts) == 0:
        return np.zeros(0, np.float32)
    # (n, q): each document's rows are contiguous, so the segmented max runs down whole rows.
    sims = np.asarray(tokens, np.float32) @ np.asarray(query, np.float32).T
    best = np.maximum.reduceat(sims, np.asarray(starts, np.intp), axis=0)  # (docs, q)
    return best.mean(axis=1)


class Int8MaxSim:
    """MaxSim over int8 token vectors on ONNX Runtime's integer matrix product, without turning them into floats.

    The stored int8 codes (one scale per token) are fed as unsigned bytes with a zero point of 128 (the sign bit
    flipped: the same numbers), the query's unit vectors are quantised to int8 with one scale per query token, and
    ``MatMulInteger`` gives exact int32 dot products of the codes; the token scales go on before the segmented max,
    the query's after it (one positive number per column). The query is fed signed where the CPU has VNNI or AMX
    (``rag.cpu.exact_u8s8``), where ONNX Runtime's uint8 x int8 kernel accumulates in 32 bits and outruns uint8 x
    uint8; elsewhere it is fed unsigned too (zero point 128), since that kernel on CPUs without
    VNNI (AVX2's ``vpmaddubsw``) adds pairs of products in 16 bits and saturates, which would give wrong scores, while
    uint8 x uint8 widens first and is exact on every CPU. Either way it skips building the float32 matrix of the
    candidates' vectors. The rerank stage with either product, side by side on the same candidates, and the
    retrieval quality of both: ``benchmarks/bench_rerank.py --part latency`` (docs/benchmarks.md). The query's
    quantisation error is below int8's step (1/254 of its largest component)."""

    def __init__(self, signed_query: bool | None = None) -> None:
        """``signed_query``: feed the query as int8 (None: where ``rag.cpu.exact_u8s8`` says it is exact)."""
        import onnxruntime as ort

        from rag.cpu import cpu_identity, exact_u8s8

        self.signed_query = exact_u8s8(cpu_identity().get("isa", ())) if signed_query is None else signed_query
        # the query's codes as the product reads them: int8 as they are, or shifted into uint8 (zero point 128)
        self._query_dtype, self._query_offset = (np.int8, 0) if self.signed_query else (np.uint8, 128)
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1  # the request's own thread, as for BLAS (limit_blas_threads)
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(product_graph_path(self.signed_query).read_bytes(), options,
                                            providers=["CPUExecutionProvider"])

    def __call__(self, query: np.ndarray, codes: np.ndarray, scales: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """Scores as ``maxsim`` gives them for ``codes * scales[:, None]``; ``codes`` (n, dim) are the offset bytes
        ``TokenVectors.gather_codes`` returns (int8 + 128 as uint8)."""
        if len(starts) == 0:
            return np.zeros(0, np.float32)
        query = np.asarray(query, np.float32)
        query_scales = np.maximum(np.abs(query).max(axis=1), 1e-12) / 127.0
        query_codes = np.rint(query / query_scales[:, None]).astype(np.int16) + self._query_offset
        quantised = np.ascontiguousarray(query_codes.astype(self._query_dtype).T)
        dots = self.session.run(None, {"tokens": codes, "query": quantised})[0]  # (n, q) int32
        sims = dots.astype(np.float32)
        sims *= scales[:, None]
        best = np.maximum.reduceat(sims, np.asarray(starts, np.intp), axis=0)  # (docs, q)
        return (best * query_scales.astype(np.float32)).mean(axis=1)


GRAPHS = Path(__file__).with_name("graphs")  # the product's two graphs, shipped: a service never imports onnx


def product_graph_path(signed_query: bool) -> Path:
    """The shipped ONNX graph of ``Int8MaxSim``'s product for a signed or an unsigned query."""
    return GRAPHS / f"maxsim-int8-query-{'s8' if signed_query else 'u8'}.onnx"


def product_graph(signed_query: bool):
    """``Int8MaxSim``'s product as an ONNX model: the codes (uint8, zero point 128) times the query's codes (int8, or
    uint8 with zero point 128), exact int32 dot products. What the shipped files hold (``python -m
    rag.rerank.maxsim`` writes them; tests/rag/test_rerank.py compares)."""
    from onnx import TensorProto, helper, numpy_helper

    query_type, query_zero = ((TensorProto.INT8, np.array(0, np.int8)) if signed_query
                              else (TensorProto.UINT8, np.array(128, np.uint8)))
    node = helper.make_node("MatMulInteger", ["tokens", "query", "zero", "query_zero"], ["dots"])
    graph = helper.make_graph(
        [node], "maxsim_int8",
        [helper.make_tensor_value_info("tokens", TensorProto.UINT8, ["n", "dim"]),
         helper.make_tensor_value_info("query", query_type, ["dim", "q"])],
        [helper.make_tensor_value_info("dots", TensorProto.INT32, ["n", "q"])],
        [numpy_helper.from_array(np.array(128, np.uint8), "zero"),
         numpy_helper.from_array(query_zero, "query_zero")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="ragheat")
    model.ir_version = 8
    return model


if __name__ == "__main__":  # rewrite the shipped graphs from product_graph
    import onnx

    GRAPHS.mkdir(exist_ok=True)
    for signed in (True, False):
        onnx.save(product_graph(signed), str(product_graph_path(signed)))
        print(product_graph_path(signed))
