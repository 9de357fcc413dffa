"""What a converted encoder is named by and what its graph returns: the builder's version, the int8 schemes (and what
the query side's is calibrated on), the graph's output names.

The converters (``rag.embedding.onnx_builder``, ``rag.embedding.quantize``) import the ``onnx`` package, and this
module does not: a process that only opens conversions already cached (a service starting, a command answering)
never pays for importing it, most of which is its numpy dtype extensions registering themselves.
"""

from __future__ import annotations

from pathlib import Path

# Bump when the graph built by onnx_builder changes, so a cached one is rebuilt. What this version builds: int8 as
# blockwise MatMulNBits (rag.embedding.quantize), and a second output, token_embeddings (the last hidden states, for
# rag.rerank).
BUILDER_VERSION = 3
SENTENCE_OUTPUT = "sentence_embedding"
TOKEN_OUTPUT = "token_embeddings"

BLOCK = 32  # input channels per weight scale / activation scale; divides 384 and 1536
INT8_SCHEME = f"matmulnbits-w8-block{BLOCK}-a8-row"  # what manifests record; change it with the scheme
ROWWISE_SCHEME = "matmulinteger-w8-channel-a8-row-smoothed-down-asymmetric"  # the query side's int8-row encoder
# SmoothQuant's migration strength: how much of an input channel's range moves into the weight's row (0 none, 1 all);
# between, both the row of activations and the weight's output channel keep a range their one scale resolves.
SMOOTHING_ALPHA = 0.5
CALIBRATION_TEXT = Path(__file__).with_name("calibration.txt")  # what the smoothing factors are measured on
