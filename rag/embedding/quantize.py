"""The int8 encoders: int8 weights in blocks, activations quantised row by row at run time; and a query-side variant
with one scale per row.

Why not ORT's ``quantize_dynamic``: it takes one activation scale per MatMul input tensor, i.e. per *batch*, so a
text's vector depends on its batch neighbours (the same text embedded alone and next to a long one gets
another vector). Here every weight MatMul becomes ORT's ``MatMulNBits`` (bits=8): weights are int8 with one
scale per block of ``BLOCK`` input channels, and with ``accuracy_level=4`` the kernel quantises each row of the
activations to int8 per block of the same size. A token's row is quantised from its own values alone, so batch
size, padding and neighbours cannot change a vector; and the finer scales track fp32 more closely than one scale
per tensor.

Why int8 activations (level 4) and not float ones (level 1), which are batch-independent too: level 1 dequantises
the weights on every call, which costs it the speed int8 is for, while int8 activations per row and block are
batch-independent and run faster than fp32. ``quantize_dynamic`` is faster still, but its vectors depend on the batch.
``benchmarks/bench_embedding.py`` compares the schemes (speed, batch independence, agreement with fp32); the
figures are in docs/benchmarks.md, "Embedding quantisation schemes side by side".

The query side may run ``int8-row`` instead (``quantize_rowwise_int8``): per-channel int8 weights and one activation
scale per row (a token's whole hidden vector), on ORT's integer ``MatMulInteger`` kernel, with the FFN's
down-projection left in float (one scale per row of the activation function's output loses what reranking reads).
Batch-independent for the same reason; coarser scales than the blocks, so its vectors sit a little further from fp32,
and on CPUs where the integer kernel outruns ``MatMulNBits`` it embeds a lone query in less time. It never embeds
passages: an index records one scheme, and a query vector only has to land near its passages.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

BLOCK = 32  # input channels per weight scale / activation scale; divides 384 and 1536
ACCURACY_INT8 = 4  # MatMulNBits: 4 = int8 activations (per row and block), 1 = float activations
INT8_SCHEME = f"matmulnbits-w8-block{BLOCK}-a8-row"  # what manifests record; change it with the scheme
ROWWISE_SCHEME = "matmulinteger-w8-channel-a8-row-down-float"  # the query side's int8-row encoder


# ONNX Runtime's uint8 x int8 kernel adds pairs of products in 16 bits, and saturates, on x86 CPUs without these;
# with VNNI or AMX it accumulates in 32 bits and is exact.
EXACT_U8S8_ISA = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})


def exact_u8s8(isa: Iterable[str]) -> bool:
    """Whether a CPU with these instruction-set flags (``rag.embedding.embedder.cpu_identity``) runs int8-row's
    uint8 x int8 products exactly."""
    return bool(EXACT_U8S8_ISA & set(isa))


def quantize_weight_blocks(weight: np.ndarray, block: int = BLOCK) -> tuple[np.ndarray, np.ndarray]:
    """``weight`` (K x N) -> MatMulNBits' packed bytes (N, K/block, block) and scales (N * K/block).

    Symmetric: int8 in [-127, 127] stored with the implicit zero point 128 that MatMulNBits assumes
    when no zero points are given.
    """
    k, n = weight.shape
    blocks_per_column = -(-k // block)
    padded = np.zeros((blocks_per_column * block, n), np.float32)
    padded[:k] = weight
    blocks = padded.T.reshape(n, blocks_per_column, block)
    scales = np.abs(blocks).max(axis=2) / 127.0
    scales[scales == 0] = 1.0  # an all-zero block: any scale reproduces it
    q = np.clip(np.rint(blocks / scales[:, :, None]), -127, 127).astype(np.int16) + 128
    return q.astype(np.uint8), scales.astype(np.float32).reshape(-1)


def _rewrite_weight_matmuls(source: Path, target: Path, rewrite: Callable) -> Path:
    """Save ``source`` to ``target`` with each MatMul of a constant 2-D weight replaced by the nodes
    ``rewrite(graph, node, weight_initializer)`` returns (None keeps the MatMul); the replaced weights are dropped."""
    model = onnx.load(str(source))
    graph = model.graph
    weights = {init.name: init for init in graph.initializer}
    replaced: set[str] = set()
    nodes = []
    for node in graph.node:
        init = weights.get(node.input[1]) if node.op_type == "MatMul" else None
        new = rewrite(graph, node, init) if init is not None and len(init.dims) == 2 else None
        if new is None:
            nodes.append(node)
            continue
        nodes += new
        replaced.add(init.name)
    if not replaced:
        raise ValueError(f"{source}: no MatMul with a constant weight to quantise")
    del graph.node[:]
    graph.node.extend(nodes)
    kept = [init for init in graph.initializer if init.name not in replaced]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    if any(n.domain == "com.microsoft" for n in nodes) and not any(op.domain == "com.microsoft"
                                                                   for op in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    onnx.save(model, str(target))
    return target


def quantize_blockwise_int8(source: Path, target: Path, block: int = BLOCK,
                            accuracy_level: int = ACCURACY_INT8) -> Path:
    """Rewrite every MatMul with a constant 2-D weight in ``source`` as an 8-bit ``MatMulNBits``."""
    def blockwise(graph, node, init):
        weight = numpy_helper.to_array(init).astype(np.float32)
        packed, scales = quantize_weight_blocks(weight, block)
        graph.initializer.extend([numpy_helper.from_array(packed, f"{init.name}.q8"),
                                  numpy_helper.from_array(scales, f"{init.name}.scales")])
        return [helper.make_node(
            "MatMulNBits", [node.input[0], f"{init.name}.q8", f"{init.name}.scales"], list(node.output),
            name=f"{node.name}.q8", domain="com.microsoft", K=weight.shape[0], N=weight.shape[1], bits=8,
            block_size=block, accuracy_level=accuracy_level)]

    return _rewrite_weight_matmuls(source, target, blockwise)


def quantize_rowwise_int8(source: Path, target: Path) -> Path:
    """Rewrite every MatMul with a constant 2-D weight in ``source`` (but the FFN's down-projection) as
    ``MatMulInteger`` over int8 weights (one scale per output channel) and the input quantised per row in the graph
    (symmetric, max |x| / 127); uint8 with zero point 128, the operand order ORT's fast u8s8 kernel takes (a uint8 x
    uint8 product is exact everywhere but runs no faster than fp32). Q, K and V share one quantised input. The u8s8
    kernel is exact only where it accumulates in 32 bits: ``exact_u8s8`` says where."""
    consts = {"rw.eps": np.array(1e-8, np.float32), "rw.127": np.array(127.0, np.float32),
              "rw.128": np.array(128.0, np.float32), "rw.zp": np.array(128, np.uint8), "rw.wzp": np.array(0, np.int8)}
    quantised: dict[str, tuple[str, str]] = {}  # a MatMul input -> its uint8 rows and their scales

    def rowwise(graph, node, init):
        # The FFN's down-projection (its input wider than its output) reads the activation function's output, whose
        # few large values would leave one scale per row too coarse for the rest: it stays float.
        if init.dims[0] > init.dims[1]:
            return None
        if not quantised:
            graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in consts.items())
        new = []
        x = node.input[0]
        if x not in quantised:
            p = f"rw{len(quantised)}."
            new += [helper.make_node("Abs", [x], [p + "abs"]),
                    helper.make_node("ReduceMax", [p + "abs"], [p + "amax"], axes=[-1], keepdims=1),
                    helper.make_node("Max", [p + "amax", "rw.eps"], [p + "amax+"]),
                    helper.make_node("Div", [p + "amax+", "rw.127"], [p + "scale"]),
                    helper.make_node("Div", [x, p + "scale"], [p + "scaled"]),
                    helper.make_node("Round", [p + "scaled"], [p + "rounded"]),
                    helper.make_node("Add", [p + "rounded", "rw.128"], [p + "shifted"]),
                    helper.make_node("Cast", [p + "shifted"], [p + "u8"], to=TensorProto.UINT8)]
            quantised[x] = (p + "u8", p + "scale")
        x_u8, x_scale = quantised[x]
        w = numpy_helper.to_array(init).astype(np.float32)
        w_scale = np.abs(w).max(axis=0) / 127.0
        w_scale[w_scale == 0] = 1.0  # an all-zero column: any scale reproduces it
        graph.initializer.extend([
            numpy_helper.from_array(np.clip(np.rint(w / w_scale), -127, 127).astype(np.int8), init.name + ".s8"),
            numpy_helper.from_array(w_scale.astype(np.float32), init.name + ".wscale")])
        o = node.name + ".rw"
        return new + [
            helper.make_node("MatMulInteger", [x_u8, init.name + ".s8", "rw.zp", "rw.wzp"], [o + ".i32"]),
            helper.make_node("Cast", [o + ".i32"], [o + ".f"], to=TensorProto.FLOAT),
            helper.make_node("Mul", [o + ".f", init.name + ".wscale"], [o + ".fw"]),
            helper.make_node("Mul", [o + ".fw", x_scale], list(node.output))]

    return _rewrite_weight_matmuls(source, target, rowwise)
