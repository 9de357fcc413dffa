"""Named histogram bucket sets, shared by the metrics (``telemetry.metrics``) and the dashboards.

Change an edge here and both follow; ``tests/telemetry/test_buckets.py`` holds a literal snapshot so
that a change is always deliberate.
"""

from __future__ import annotations

from rag.slo import SLO_SECONDS

LATENCY_SECONDS: tuple[float, ...] = (
    0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075,
    0.01, 0.015, 0.02, 0.03, 0.05, 0.075,
    0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.38,
    0.4, 0.42, 0.45, 0.5, 0.6, 0.75,
    1.0, 1.5, 2.5, 5.0, 10.0,
)
"""Stage and request latency, 0.5 ms to 10 s.

Roughly log-spaced (about 1.5x per step) from 0.5 ms, where the cheapest stages (fusion, BM25) live, up to
0.3 s; then dense between 0.3 and 0.5 s (0.35, 0.38, 0.40, 0.42, 0.45, 0.50) so heatmaps show how close
to the 420 ms objective the tail runs and burn-rate rules can use 0.42 exactly; then coarse up to 10 s,
past any sane request. 30 edges keep per-series cost moderate: a label combination costs 32 series.
"""

RETRIEVED_DOCUMENTS: tuple[float, ...] = (0, 1, 2, 3, 5, 10, 20, 50, 100, 200, 500, 1000)
"""Documents a retriever returned for one request: zero (nothing matched) must stand out, then the
usual top-k sizes, then the deep candidate lists handed to fusion."""

KERNEL_LOG2_SECONDS: tuple[float, ...] = tuple(2.0 ** k / 1e6 for k in range(24))
"""Kernel-side latencies (run-queue wait, off-CPU, system calls): powers of two from 1 us to 8.4 s.

The eBPF probes aggregate in log2 slots of microseconds, as BCC's tools do, because a power of two is
what the kernel can compute per event for the price of a few instructions; these edges are exactly
those slots' upper bounds, so exporting them to Prometheus loses nothing and invents nothing."""

VLLM_STEP_TOKENS: tuple[float, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
"""Tokens one vLLM engine step schedules in one phase: powers of two, because a decode step carries one token
per running sequence (1..max_num_seqs) and a prefill step up to max_num_batched_tokens (8k-16k)."""

VLLM_STEP_BLOCKS: tuple[float, ...] = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
"""KV-cache blocks allocated or freed in one vLLM engine step: zero (the common decode step within a block)
must stand out; a prefill of N tokens takes N/block_size blocks, a finished long request frees hundreds."""

UNIT_SCORES: tuple[float, ...] = tuple(round(0.05 * i, 2) for i in range(1, 21))
"""Quality signals between 0 and 1 (best passage similarity, retriever agreement, fused top, answer support): steps of 0.05, so
the low tail where answers go wrong (a best similarity under about 0.45) and a drifting median both show."""

RERANK_SCORES: tuple[float, ...] = (0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 8.0)
"""The reranker head's top score and its margin over the second: in-domain questions score a top of about 2 to 8,
questions the corpus does not cover about -1 to 1 (docs/quality.md). No negative edge: OpenMetrics drops a histogram's
sum when one exists, and a score under 0 counts in the first bucket."""

PER_SENTENCE: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0)
"""Counts per written sentence (the passages a sentence cites): zero on its own edge, as an answer citing nothing is
the case to see, and steps of a quarter around one citation a sentence."""

assert SLO_SECONDS in LATENCY_SECONDS, "the latency SLO (rag.slo) must be an exact bucket edge"

BUCKET_SETS: dict[str, tuple[float, ...]] = {
    "latency_seconds": LATENCY_SECONDS,
    "retrieved_documents": RETRIEVED_DOCUMENTS,
    "kernel_log2_seconds": KERNEL_LOG2_SECONDS,
    "vllm_step_tokens": VLLM_STEP_TOKENS,
    "vllm_step_blocks": VLLM_STEP_BLOCKS,
    "unit_scores": UNIT_SCORES,
    "rerank_scores": RERANK_SCORES,
    "per_sentence": PER_SENTENCE,
}
