"""eBPF kernel probes (BCC) attributing run-queue, off-CPU and system-call latency to RAG stages.

``program`` (the C program and the tracepoint facts it needs), ``loader`` (attach, read the maps),
``stats`` (plain data: thread name -> stage, log2 slots -> buckets), ``collector`` (Prometheus export),
``inprocess`` (inside ``ragheat serve``); the ``ragheat probes`` command is ``ragheat.commands.probes``.
See docs/probes.md."""
