"""The one place where errors become HTTP status codes, always with a JSON reason."""

from __future__ import annotations

import json
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from rag.errors import StageError

log = logging.getLogger("ragheat.api")


class ApiError(Exception):
    def __init__(self, status: int, error: str, reason: str) -> None:
        super().__init__(reason)
        self.status, self.error, self.reason = status, error, reason


def error_response(status: int, error: str, reason: str, stage: str | None = None) -> JSONResponse:
    body = {"error": error, "reason": reason}
    if stage:
        body["stage"] = stage
    return JSONResponse(body, status_code=status)


def _describe(errors) -> tuple[int, str, str]:
    """Turn pydantic's error list into one status and one readable sentence."""
    first = errors[0]
    kind = first.get("type", "")
    if kind == "json_invalid":
        cause = first.get("ctx", {}).get("error", "malformed JSON")
        return 400, "invalid_json", f"request body is not valid JSON: {cause}"
    parts = []
    for err in errors[:5]:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        msg = err.get("msg", "invalid").removeprefix("Value error, ")
        if err.get("type") == "extra_forbidden":
            msg = "unknown field"
        parts.append(f"{loc}: {msg}")
    return 422, "invalid_request", "; ".join(parts)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        status, error, reason = _describe(exc.errors())
        return error_response(status, error, reason)

    @app.exception_handler(ApiError)
    async def _api(request: Request, exc: ApiError):
        return error_response(exc.status, exc.error, exc.reason)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        # FastAPI raises a 400 with this text when the body cannot be decoded (e.g. invalid UTF-8).
        detail = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        kind = {400: "bad_request", 404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return error_response(exc.status_code, kind, detail)

    @app.exception_handler(StageError)
    async def _stage(request: Request, exc: StageError):
        request.state.rag_error = exc
        log.exception("stage %s failed", exc.stage, exc_info=exc.cause)
        return error_response(500, "stage_failed", f"the {exc.stage} stage failed", stage=exc.stage)
