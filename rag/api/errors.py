"""The one place where errors become HTTP status codes, always with a JSON reason.

``STATUS`` maps every error kind the API answers with to its status; ``ApiError`` (raised by the routes and the
middleware), validation errors, Starlette's own HTTP errors and ``StageError`` all become a response here.
"""

from __future__ import annotations

import json
import logging
from typing import Mapping

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from rag.errors import StageError
from rag.types import REQUEST_RECORD_KEY, RequestRecord

log = logging.getLogger("ragheat.api")

STATUS = {
    "invalid_json": 400,       # the body is not JSON
    "invalid_utf8": 400,       # the body is not UTF-8
    "bad_request": 400,        # Starlette could not read the request
    "unauthenticated": 401,    # no API key, or not a valid one (rag.api.access)
    "forbidden": 403,          # an admin call on a service without API keys
    "not_found": 404,
    "method_not_allowed": 405,  # with an Allow header
    "request_timeout": 408,    # the head or body did not arrive within server.header_timeout_s / body_timeout_s
    "body_too_large": 413,     # over server.max_body_bytes
    "invalid_request": 422,    # parses, but a field is invalid (query too long, top_k out of range, ...)
    "rate_limited": 429,       # over server.rate_limit_per_s for this key; with Retry-After
    "headers_too_large": 431,  # request line and headers over server.max_header_bytes
    "stage_failed": 500,       # a pipeline stage raised; the body names the stage
    "reload_failed": 500,      # POST /admin/reload: the new generation cannot be loaded (the old one still serves)
    "not_ready": 503,          # the index is still loading
    "queue_full": 503,         # shed: admission.max_queue queries already wait (rag.api.admission); with Retry-After
    "deadline": 503,           # shed: it would finish after its deadline, predicted at arrival; with Retry-After
    "expired": 503,            # shed: its deadline passed while it waited for a slot; with Retry-After
}
"""Error kind (the ``error`` field of the body) -> HTTP status."""
HTTP_KINDS = {status: kind for kind, status in STATUS.items() if kind in ("bad_request", "not_found",
                                                                            "method_not_allowed")}


class ApiError(Exception):
    """A request the API refuses: ``kind`` is a key of ``STATUS``, ``reason`` a sentence saying what was wrong."""

    def __init__(self, kind: str, reason: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(reason)
        self.status, self.error, self.reason, self.headers = STATUS[kind], kind, reason, headers


def error_response(kind: str, reason: str, stage: str | None = None, status: int | None = None,
                   headers: Mapping[str, str] | None = None) -> JSONResponse:
    """The JSON error body ``{"error", "reason"[, "stage"]}`` with ``kind``'s status (or ``status``)."""
    body = {"error": kind, "reason": reason}
    if stage:
        body["stage"] = stage
    return JSONResponse(body, status_code=status or STATUS[kind], headers=dict(headers) if headers else None)


def _describe(errors) -> tuple[str, str]:
    """Turn pydantic's error list into one error kind and one readable sentence."""
    first = errors[0]
    kind = first.get("type", "")
    if kind == "json_invalid":
        cause = first.get("ctx", {}).get("error", "malformed JSON")
        return "invalid_json", f"request body is not valid JSON: {cause}"
    parts = []
    for err in errors[:5]:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        msg = err.get("msg", "invalid").removeprefix("Value error, ")
        if err.get("type") == "extra_forbidden":
            msg = "unknown field"
        parts.append(f"{loc}: {msg}")
    return "invalid_request", "; ".join(parts)


def record_failure(request: Request, exc: BaseException) -> None:
    """Note on the request's ``RequestRecord`` that ``exc`` ended it (for telemetry)."""
    record = getattr(request.state, REQUEST_RECORD_KEY, None)
    if isinstance(record, RequestRecord):
        record.error = exc


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers that turn every error into ``error_response``."""

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        return error_response(*_describe(exc.errors()))

    @app.exception_handler(ApiError)
    async def _api(request: Request, exc: ApiError):
        return error_response(exc.error, exc.reason, headers=exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        # FastAPI raises a 400 with this text when the body cannot be decoded (e.g. invalid UTF-8).
        detail = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        allow = (exc.headers or {}).get("Allow")
        if exc.status_code == 405 and allow:
            detail = f"{request.method} is not allowed on {request.url.path}; use {allow}"
        # Starlette's own headers stay: a 405 carries the Allow header listing the path's methods (RFC 9110).
        return error_response(HTTP_KINDS.get(exc.status_code, "http_error"), detail, status=exc.status_code,
                              headers=exc.headers)

    @app.exception_handler(StageError)
    async def _stage(request: Request, exc: StageError):
        record_failure(request, exc)
        log.exception("stage %s failed", exc.stage, exc_info=exc.cause)
        return error_response("stage_failed", f"the {exc.stage} stage failed", stage=exc.stage)
