"""eBPF kernel probes (BCC) attributing run-queue, off-CPU and syscall latency to RAG stages.
Nothing here yet: the probes land with their own issue."""
