"""Wiring into the web app: a pure-ASGI middleware around the query routes and ``GET /metrics``.

The endpoints leave what they learned on ``request.state`` (``rag_query``, ``rag_top_k``,
``rag_result``, ``rag_error``); the middleware reads it when the response is complete, so the
API code never calls telemetry and a telemetry failure can never fail a request.
"""

from __future__ import annotations

from prometheus_client.exposition import choose_encoder
from starlette.requests import Request
from starlette.responses import Response

from telemetry.metrics import ROUTES
from telemetry.recorder import RequestInfo, Telemetry


class TelemetryMiddleware:
    def __init__(self, app, telemetry: Telemetry) -> None:
        self.app, self.telemetry = app, telemetry

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in ROUTES:
            return await self.app(scope, receive, send)
        trace_headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", ())
                         if k in (b"traceparent", b"tracestate")}
        request_scope = self.telemetry.start(scope["path"], trace_headers or None)
        status = 500  # if the app dies before sending a status line, that is what the client sees

        async def send_with_status(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_with_status)
        finally:
            state = scope.get("state") or {}
            info = RequestInfo(query=state.get("rag_query"), top_k=state.get("rag_top_k"),
                               result=state.get("rag_result"), error=state.get("rag_error"))
            self.telemetry.finish(request_scope, status, info)


def metrics_endpoint(telemetry: Telemetry):
    """Prometheus text format, or OpenMetrics (with exemplars) when the scraper's Accept header asks."""

    async def metrics(request: Request) -> Response:
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encoder(telemetry.registry), headers={"Content-Type": content_type})

    return metrics


def instrument_app(app, telemetry: Telemetry) -> None:
    """Add the middleware and, when metrics are on, ``GET /metrics``. Call before the app starts."""
    app.add_middleware(TelemetryMiddleware, telemetry=telemetry)
    if telemetry.metrics is not None:
        app.add_route("/metrics", metrics_endpoint(telemetry), methods=["GET"], include_in_schema=False)
