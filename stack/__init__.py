"""Processes on loopback: one ``ChildProcess`` helper (start, wait until ready, TERM then KILL, log file) under the
serve process, the local Prometheus, the vLLM server and ``ragheat stack up``; the in-thread server, the tiny model
builder and the OTLP receiver that tests and benchmarks run beside them; and the compose topology without Docker
(``ragheat stack up/down``)."""
