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
scale per row (a token's whole hidden vector), on ORT's integer ``MatMulInteger`` kernel. Batch-independent for the
same reason, and on CPUs where the integer kernel outruns ``MatMulNBits`` it embeds a lone query in less time. It
never embeds passages: an index records one scheme, and a query vector only has to land near its passages.

One scale per row is coarse where a few channels of the row run far larger than the rest. Two inputs are like that:
- The layer norms' outputs (what Q, K, V and the FFN's up-projection read) and the attention's context (what its
  output projection reads) carry a few outlier channels. They are smoothed (SmoothQuant, ``smoothing_factors``):
  each channel divided by a constant factor before quantising and the weight's row multiplied by it, so the product
  is unchanged and the row's range is even. The factors are fixed when the graph is built, from real text
  (``calibration.txt``, general sentences and questions), so the graph stays batch-independent.
- The FFN's down-projection reads the activation function's output, nearly all positive (GELU never goes below
  -0.17): a symmetric scale would spend half its 256 steps on values that do not occur. Its rows are quantised from
  their own minimum to their maximum instead, the minimum added back through the weight's column sums.
Keeping either in float instead costs the speed: the down-projection's weights are most of the encoder's bytes, and a
lone query, whose weights the request's other stages have pushed out of the cache, waits on memory for them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from rag.embedding.encoder_spec import BLOCK, CALIBRATION_TEXT, SMOOTHING_ALPHA

ACCURACY_INT8 = 4  # MatMulNBits: 4 = int8 activations (per row and block), 1 = float activations


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


def _is_down_projection(init) -> bool:
    """The FFN's down-projection: the only weight MatMul whose input is wider than its output."""
    return init.dims[0] > init.dims[1]


def _quantised_inputs(graph) -> dict[str, list]:
    """Each input of the MatMuls ``quantize_rowwise_int8`` quantises symmetrically -> the weights that read it."""
    weights = {init.name: init for init in graph.initializer}
    readers: dict[str, list] = {}
    for node in graph.node:
        init = weights.get(node.input[1]) if node.op_type == "MatMul" else None
        if init is not None and len(init.dims) == 2 and not _is_down_projection(init):
            readers.setdefault(node.input[0], []).append(init)
    return readers


def calibration_feeds(tokenizer_path: Path, max_length: int = 256) -> list[dict]:
    """``CALIBRATION_TEXT``'s lines (but ``#`` comments), one encoder input each, tokenised as the embedder tokenises
    a query."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    tokenizer.enable_truncation(max_length=max_length)
    tokenizer.no_padding()
    feeds = []
    for line in CALIBRATION_TEXT.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            ids = np.array([tokenizer.encode(line.strip()).ids], np.int64)
            feeds.append({"input_ids": ids, "attention_mask": np.ones_like(ids)})
    return feeds


def smoothing_factors(source: Path, feeds: Iterable[dict], alpha: float = SMOOTHING_ALPHA) -> dict[str, np.ndarray]:
    """SmoothQuant's factor for each channel of each symmetrically quantised MatMul input of ``source`` (the float
    graph), by input name: ``max|x| ** alpha / max|w| ** (1 - alpha)``, ``max|x|`` the largest value the channel
    reaches while ``source`` runs ``feeds``, ``max|w|`` the largest in that row of the weights reading it."""
    model = onnx.load(str(source))
    readers = _quantised_inputs(model.graph)
    names = list(readers)
    model.graph.output.extend(helper.make_tensor_value_info(x, TensorProto.FLOAT, None) for x in names)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    reached: dict[str, np.ndarray] = {}
    for feed in feeds:
        for x, value in zip(names, session.run(names, feed)):
            row_max = np.abs(value).reshape(-1, value.shape[-1]).max(axis=0)
            reached[x] = np.maximum(reached[x], row_max) if x in reached else row_max
    if not reached:
        raise ValueError("smoothing_factors: no calibration text to measure the activations on")
    factors = {}
    for x, weights in readers.items():
        weight_max = np.max([np.abs(numpy_helper.to_array(w)).max(axis=1) for w in weights], axis=0)
        factor = np.maximum(reached[x], 1e-5) ** alpha / np.maximum(weight_max, 1e-5) ** (1 - alpha)
        factors[x] = factor.astype(np.float32)
    return factors


def _symmetric_rows(x: str, p: str) -> tuple[list, str, str]:
    """Nodes quantising ``x`` row by row around zero: uint8 = round(x / s) + 128 with s = max |x| / 127."""
    return ([helper.make_node("Abs", [x], [p + "abs"]),
             helper.make_node("ReduceMax", [p + "abs"], [p + "amax"], axes=[-1], keepdims=1),
             helper.make_node("Max", [p + "amax", "rw.eps"], [p + "amax+"]),
             helper.make_node("Div", [p + "amax+", "rw.127"], [p + "scale"]),
             helper.make_node("Div", [x, p + "scale"], [p + "scaled"]),
             helper.make_node("Round", [p + "scaled"], [p + "rounded"]),
             helper.make_node("Add", [p + "rounded", "rw.128"], [p + "shifted"]),
             helper.make_node("Cast", [p + "shifted"], [p + "u8"], to=TensorProto.UINT8)],
            p + "u8", p + "scale")


def _asymmetric_rows(x: str, p: str) -> tuple[list, str, str, str]:
    """Nodes quantising ``x`` row by row over its own range: uint8 = round((x - min) / s) with s = (max - min) / 255;
    the row's minimum is returned for the product to add back."""
    return ([helper.make_node("ReduceMin", [x], [p + "min"], axes=[-1], keepdims=1),
             helper.make_node("ReduceMax", [x], [p + "max"], axes=[-1], keepdims=1),
             helper.make_node("Sub", [p + "max", p + "min"], [p + "range"]),
             helper.make_node("Max", [p + "range", "rw.eps"], [p + "range+"]),
             helper.make_node("Div", [p + "range+", "rw.255"], [p + "scale"]),
             helper.make_node("Sub", [x, p + "min"], [p + "above"]),
             helper.make_node("Div", [p + "above", p + "scale"], [p + "scaled"]),
             helper.make_node("Round", [p + "scaled"], [p + "rounded"]),
             helper.make_node("Cast", [p + "rounded"], [p + "u8"], to=TensorProto.UINT8)],
            p + "u8", p + "scale", p + "min")


def quantize_rowwise_int8(source: Path, target: Path, smoothing: dict[str, np.ndarray] | None = None) -> Path:
    """Rewrite every MatMul with a constant 2-D weight in ``source`` as ``MatMulInteger`` over int8 weights (one scale
    per output channel) and its input quantised per row in the graph: symmetric (max |x| / 127, zero point 128) after
    dividing by ``smoothing``'s factors where it names the input (``smoothing_factors``; the weight's rows multiplied
    by them), and the FFN's down-projection's input over the row's own range (the module docstring says why). uint8
    activations, the operand order ORT's fast u8s8 kernel takes (a uint8 x uint8 product is exact everywhere but runs
    no faster than fp32); the MatMuls reading one input share its quantised rows. The u8s8 kernel is exact only where
    it accumulates in 32 bits: ``rag.cpu.exact_u8s8`` says where."""
    smoothing = smoothing or {}
    consts = {"rw.eps": np.array(1e-8, np.float32), "rw.127": np.array(127.0, np.float32),
              "rw.128": np.array(128.0, np.float32), "rw.255": np.array(255.0, np.float32),
              "rw.zp": np.array(128, np.uint8), "rw.zp0": np.array(0, np.uint8), "rw.wzp": np.array(0, np.int8)}
    quantised: dict[str, tuple] = {}  # a MatMul input -> its uint8 rows, their scales (and minimums: asymmetric)

    def rowwise(graph, node, init):
        if not quantised:
            graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in consts.items())
        new = []
        x = node.input[0]
        factor = None if _is_down_projection(init) else smoothing.get(x)
        if x not in quantised:
            p = f"rw{len(quantised)}."
            if _is_down_projection(init):
                nodes, *quantised[x] = _asymmetric_rows(x, p)
            elif factor is None:
                nodes, *quantised[x] = _symmetric_rows(x, p)
            else:
                graph.initializer.append(numpy_helper.from_array((1.0 / factor).astype(np.float32), p + "unsmooth"))
                rows, *quantised[x] = _symmetric_rows(p + "smoothed", p)
                nodes = [helper.make_node("Mul", [x, p + "unsmooth"], [p + "smoothed"]), *rows]
            new += nodes
        x_u8, x_scale, *x_min = quantised[x]
        w = numpy_helper.to_array(init).astype(np.float32)
        if factor is not None:
            w = w * factor[:, None]
        w_scale = np.abs(w).max(axis=0) / 127.0
        w_scale[w_scale == 0] = 1.0  # an all-zero column: any scale reproduces it
        w_q = np.clip(np.rint(w / w_scale), -127, 127)
        graph.initializer.extend([numpy_helper.from_array(w_q.astype(np.int8), init.name + ".s8"),
                                  numpy_helper.from_array(w_scale.astype(np.float32), init.name + ".wscale")])
        o = node.name + ".rw"
        product = [
            helper.make_node("MatMulInteger", [x_u8, init.name + ".s8", "rw.zp0" if x_min else "rw.zp", "rw.wzp"],
                             [o + ".i32"]),
            helper.make_node("Cast", [o + ".i32"], [o + ".f"], to=TensorProto.FLOAT),
            helper.make_node("Mul", [o + ".f", init.name + ".wscale"], [o + ".fw"])]
        if not x_min:
            return new + product + [helper.make_node("Mul", [o + ".fw", x_scale], list(node.output))]
        # (x - min) . w + min * (the quantised weight's column sums): the row's minimum added back
        graph.initializer.append(numpy_helper.from_array((w_q * w_scale).sum(axis=0).astype(np.float32),
                                                         init.name + ".colsum"))
        return new + product + [
            helper.make_node("Mul", [o + ".fw", x_scale], [o + ".above"]),
            helper.make_node("Mul", [x_min[0], init.name + ".colsum"], [o + ".base"]),
            helper.make_node("Add", [o + ".above", o + ".base"], list(node.output))]

    return _rewrite_weight_matmuls(source, target, rowwise)
