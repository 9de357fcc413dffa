"""The sections of docs/benchmarks.md: which results files each is rendered from, by which builder, and whether
the doc is complete without it.

``REQUIRED`` sections must have their results files for ``render_docs.py --check`` (and the test) to pass; the
slots (``build=None``) are for benchmarks still being written and render as "not yet measured" until their file
exists. ``STEPS`` names the ``benchmarks/run_all.sh`` step that writes each results file.
"""

from __future__ import annotations

from . import capacity, extra, latency, quality
from .render import Section

STEPS = {
    "ingest": "ingest", "eval-scifact": "eval", "eval-scifact-fp32": "eval-fp32", "fusion": "fusion",
    "query": "query", "telemetry": "telemetry", "telemetry-recording": "telemetry-recording", "loadgen": "loadgen",
    "knee-scifact": "knee", "ann": "ann", "probes": "probes", "tune-vllm": "tune-vllm",
    # slots: benchmarks being written by others (see benchmarks/README.md, "Adopting the results file")
    "embedding": "embedding", "graph": "graph", "rerank": "rerank", "rerank-latency": "rerank-latency", "cache": "cache", "answers": "answers",
    "vllm-ttft": "vllm-ttft", "hyde": "hyde", "judge": "judge", "capacity": "capacity", "batching": "batching",
    "tune-vllm-real": "tune-vllm-real",
    "replicas": "replicas",
}

SECTIONS = (
    Section("retrieval", ("eval-scifact",), quality.retrieval, required=True),
    Section("fusion", ("fusion",), quality.fusion, required=True),
    Section("precision", ("eval-scifact", "eval-scifact-fp32", "ingest", "query"), quality.precision, required=True),
    Section("embedding", ("embedding",), extra.embedding, required=True),
    Section("graph", ("graph",), extra.graph, required=True),
    Section("rerank", ("rerank",), None, required=False),
    Section("rerank-latency", ("rerank-latency",), None, required=False),
    Section("query", ("query",), latency.query, required=True),
    Section("ingest", ("ingest",), latency.ingest, required=True),
    Section("telemetry", ("telemetry", "telemetry-recording"), latency.telemetry, required=True),
    Section("cache", ("cache",), None, required=False),
    Section("loadgen", ("loadgen",), capacity.loadgen, required=True),
    Section("knee", ("knee-scifact",), capacity.knee, required=True),
    Section("capacity", ("capacity",), None, required=False),
    Section("batching", ("batching",), None, required=False),
    Section("replicas", ("replicas",), None, required=False),  # renders the file's data["doc_tables"]
    Section("ann", ("ann",), capacity.ann, required=True),
    Section("probes", ("probes",), capacity.probes, required=True),
    Section("tune-vllm", ("tune-vllm",), capacity.tune_vllm, required=True),
    Section("tune-vllm-real", ("tune-vllm-real",), capacity.tune_vllm_real, required=False),
    Section("vllm-ttft", ("vllm-ttft",), extra.vllm_ttft, required=True),
    Section("answers", ("answers",), None, required=False),
    Section("hyde", ("hyde",), None, required=False),
    Section("judge", ("judge",), None, required=False),
)
