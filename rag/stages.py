"""The closed sets of pipeline stage and retriever names, used as metric label values.

Kept in a module of their own, free of heavy imports, so that processes that only label metrics
(vLLM's, the probes exporter, dashboards) need not load ONNX Runtime, FAISS and bm25s with them.
"""

from __future__ import annotations

STAGES = ("embed", "retrieve_dense", "retrieve_bm25", "fuse", "generate", "generate_prefill", "generate_decode",
          "support_check", "link_entities", "route", "retrieve_graph", "rerank", "queue", "cache_lookup", "hyde")
"""``generate`` is the extractive answer (and the fallback); an LLM answer is ``generate_prefill`` (to the first
token), ``generate_decode`` (the rest) and ``support_check`` (each sentence against the passages it cites).
``link_entities`` finds the knowledge-graph entities a query names, ``route`` lets the router pick the retrievers,
``retrieve_graph`` expands the linked entities in the graph store (rag/graph, rag/routing). ``rerank`` rescores the
fused candidates by late interaction (rag/rerank), after ``fuse``. ``queue`` is the wait from a request's arrival to
its first stage (admission, the thread pool, a micro-batch); ``cache_lookup`` looks the query's embedding up in the
semantic answer cache (rag/cache); ``hyde`` has the language model write a hypothetical passage whose embedding
drives dense retrieval beside the question's own."""
CONDITIONAL_STAGES = ("link_entities", "route", "retrieve_graph", "cache_lookup", "rerank", "hyde")
"""Stages only some requests run (the graph, the router, the answer cache, the reranker, HyDE), each with a heatmap of
its own: their latency series are created at zero, so a board reads "none yet" rather than "no data" where the
feature is off or idle."""
RETRIEVERS = ("dense", "bm25", "graph")
RETRIEVER_CHOICES = RETRIEVERS + ("routed",)
"""What a request or ``retrieval.retrievers`` may name: retrievers (fused when several), or ``routed`` alone."""
SKIPPABLE_STAGES = ("retrieve_graph",)
"""Stages a request is answered without when their backend is down (the answer is then degraded, never failed)."""
ROUTER_ARMS = ("hybrid", "hybrid+graph", "bm25-heavy", "dense-heavy", "bm25-heavy+graph")
"""The routes the router chooses between (weights in ``rag.routing.arms``)."""
RETRIEVAL_ROUTES = ("dense", "bm25", "graph", "hybrid", "dense+graph", "bm25+graph", "hybrid+graph", "bm25-heavy",
                    "dense-heavy", "bm25-heavy+graph", "none")
"""The ``retrieval_route`` label of request metrics (and the ``rag.route`` span attribute): the retrievers a request
ran, named as in ``ragheat eval`` (``hybrid`` = dense+bm25), or the router's arm; ``none`` = it ended before
retrieving (refused, or failed first)."""
DEFAULT_STAGES = ("embed", "retrieve_dense", "retrieve_bm25", "fuse", "rerank", "generate")
"""The stages the default service runs for a query, in order: hybrid retrieval, reranked (``rerank.enabled``),
answered by the extractive generator."""
DEGRADED_REASONS = ("unavailable", "slow", "unsupported")
"""Why an answer fell back to the extractive generator (``rag.types.DegradedReason``): the model was down or failed
(``unavailable``), sent no token or finished too late (``slow``), or none of its sentences was supported by the
passages (``unsupported``)."""
