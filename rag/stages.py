"""The closed sets of pipeline stage and retriever names, used as metric label values.

Kept in a module of their own, free of heavy imports, so that processes that only label metrics
(vLLM's, the probes exporter, dashboards) need not load ONNX Runtime, FAISS and bm25s with them.
"""

from __future__ import annotations

STAGES = ("embed", "retrieve_dense", "retrieve_bm25", "fuse", "generate", "generate_prefill", "generate_decode",
          "support_check")
"""``generate`` is the extractive answer (and the fallback); an LLM answer is ``generate_prefill`` (to the first
token), ``generate_decode`` (the rest) and ``support_check`` (each sentence against the passages it cites)."""
RETRIEVERS = ("dense", "bm25")
EXTRACTIVE_STAGES = ("embed", "retrieve_dense", "retrieve_bm25", "fuse", "generate")
"""The stages a hybrid query answered by the extractive generator runs, in order (the default service)."""
