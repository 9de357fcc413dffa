"""ragheat's RAG service: ingestion, hybrid retrieval, cited answers, the HTTP API and CLI."""

__version__ = "0.1.0"
