"""The OpenAPI schema as served: FastAPI's, completed so that it states every bound the service enforces.

Some bounds depend on settings (``server.max_query_chars``) or on the generation served (``graph`` needs an index with
a knowledge graph, ``routed`` the router model), and keys add a security requirement, so the schema is patched on each
``GET /openapi.json`` from a copy of FastAPI's (a few kilobytes: a hot swap may change what can be answered). A
request the schema allows is served, and one it forbids is refused with a 4xx: ``tests/rag/api/test_contract.py`` runs
schemathesis against a live server to hold both directions.
"""

from __future__ import annotations

import copy
from typing import Callable

from fastapi import FastAPI

from rag.api.access import ADMIN_PREFIX, OPEN_PATHS
from rag.api.schemas import BLANK_CHARACTERS, MAX_RETRIEVER_NAME_CHARS, MAX_RETRIEVER_NAMES
from rag.pipeline import RagPipeline
from rag.settings import ServerSettings

QUERY_PATTERN = "[^" + "".join(f"\\u{ord(c):04x}" for c in BLANK_CHARACTERS) + "]"
"""Not all blank: one character outside ``BLANK_CHARACTERS`` (written as ``\\uXXXX``, which ECMA-262 and Python
regular expressions read alike)."""
RETRIEVER_PARTS = ("dense", "bm25", "hybrid")
SECURITY_SCHEMES = {
    "bearer": {"type": "http", "scheme": "bearer", "description": "an API key (server.api_keys, api_keys_file)"},
    "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key", "description": "the same key, another header"},
}
GENERATION_HEADER = {"description": "the index generation that answered (rag.index_generations)", "required": True,
                     "schema": {"type": "string", "minLength": 1}}
RESPONSE_HEADERS = {
    "401": {"WWW-Authenticate": {"description": "how to authenticate", "required": True,
                                 "schema": {"type": "string"}}},
    "429": {"Retry-After": {"description": "whole seconds until the key's next request is admitted", "required": True,
                            "schema": {"type": "integer", "minimum": 1}}},
}


def install_openapi(app: FastAPI, server: ServerSettings, keys_enabled: bool,
                    pipeline: Callable[[], RagPipeline | None]) -> None:
    """Serve the completed schema at ``/openapi.json``; ``pipeline()`` is the one served now (None while loading)."""
    base: dict = {}

    def openapi() -> dict:
        if not base:
            base.update(FastAPI.openapi(app))
        schema = copy.deepcopy(base)
        complete(schema, server, keys_enabled, pipeline())
        # The deadline's bound is a setting too (admission.max_timeout_ms, rag.api.admission).
        schema["components"]["schemas"]["QueryRequest"]["properties"]["timeout_ms"]["anyOf"][0]["maximum"] = int(
            app.state.admission.max_timeout_ms)
        return schema

    app.openapi = openapi


def complete(schema: dict, server: ServerSettings, keys_enabled: bool, pipeline: RagPipeline | None) -> None:
    """Patch ``schema`` in place: the query's bounds, the retriever names this generation can run, the headers every
    response carries, and the keys' security."""
    request = schema["components"]["schemas"]["QueryRequest"]["properties"]
    request["query"].update({"minLength": 1, "maxLength": server.max_query_chars, "pattern": QUERY_PATTERN})
    request["retrievers"] = {"anyOf": retriever_schemas(pipeline) + [{"type": "null"}],
                             "description": request["retrievers"].get("description", ""), "title": "Retrievers"}
    for path, operations in schema["paths"].items():
        for operation in operations.values():
            responses = operation.get("responses", {})
            for status, headers in RESPONSE_HEADERS.items():
                if status in responses:
                    responses[status]["headers"] = headers
            if path.startswith("/v1/") and "200" in responses:
                responses["200"]["headers"] = {"X-Ragheat-Generation": GENERATION_HEADER}
            if keys_enabled and path not in OPEN_PATHS:
                operation["security"] = [{name: []} for name in SECURITY_SCHEMES]
            elif path.startswith(ADMIN_PREFIX):
                operation["description"] = (operation.get("description", "") + " Refused (403) while the service "
                                            "has no API keys.").strip()
    if keys_enabled:
        schema["components"]["securitySchemes"] = copy.deepcopy(SECURITY_SCHEMES)


def retriever_schemas(pipeline: RagPipeline | None) -> list[dict]:
    """The ``retrievers`` arrays a request may send: +-joined retriever names (graph only where the index has a
    knowledge graph), and ``["routed"]`` alone where the router model is loaded."""
    can_graph = pipeline is None or pipeline.check_retrievers(["graph"]) is None
    can_route = pipeline is None or pipeline.check_retrievers(["routed"]) is None
    names = "|".join(RETRIEVER_PARTS + (("graph",) if can_graph else ()))
    fused = {"type": "array", "minItems": 1, "maxItems": MAX_RETRIEVER_NAMES, "uniqueItems": True,
             "items": {"type": "string", "maxLength": MAX_RETRIEVER_NAME_CHARS,
                       "pattern": rf"^({names})(\+({names}))*$"}}
    routed = {"type": "array", "minItems": 1, "maxItems": 1, "items": {"type": "string", "enum": ["routed"]}}
    return [fused, routed] if can_route else [fused]
