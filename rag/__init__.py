"""The RAG domain: settings, stage Protocols, ingestion, hybrid retrieval, cited answers and the HTTP API.

It imports no other package of this repository (tests/test_layout.py); docs/architecture.md maps the rest."""

__version__ = "0.1.0"
