"""Wiring into the web app: a pure-ASGI middleware around the query routes and ``GET /metrics``.

The routes attach one typed ``rag.types.RequestRecord`` to the request (``request.state.rag``: the query,
``top_k``, then the result or the error that ended it); the middleware reads it as the response's last bytes go
out (or when the app ends without them), so the API code never calls telemetry and a telemetry failure can never
fail a request.
"""

from __future__ import annotations

from prometheus_client.exposition import choose_encoder
from starlette.requests import Request
from starlette.responses import Response

from rag.types import REQUEST_RECORD_KEY, RequestRecord
from telemetry.metrics import ROUTES
from telemetry.recorder import Telemetry


class TelemetryMiddleware:
    """Times each query request and hands its ``RequestRecord`` and status to ``Telemetry.finish``."""

    def __init__(self, app, telemetry: Telemetry) -> None:
        self.app, self.telemetry = app, telemetry

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in ROUTES:
            return await self.app(scope, receive, send)
        trace_headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", ())
                         if k in (b"traceparent", b"tracestate")}
        request_scope = self.telemetry.start(scope["path"], trace_headers or None)
        status = 500  # if the app dies before sending a status line, that is what the client sees
        finished = False

        def finish() -> None:
            nonlocal finished
            if not finished:
                finished = True
                # Absent when the request never reached a route (unreadable JSON, a body over the limit).
                record = (scope.get("state") or {}).get(REQUEST_RECORD_KEY) or RequestRecord()
                self.telemetry.finish(request_scope, status, record)

        async def send_with_status(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                # Recorded before the last bytes go out: a client that has read the whole response and then scrapes
                # /metrics finds its request counted (a stream's ``done`` event included).
                finish()
            await send(message)

        try:
            await self.app(scope, receive, send_with_status)
        finally:
            finish()


def metrics_endpoint(telemetry: Telemetry):
    """Prometheus text format, or OpenMetrics (with exemplars) when the scraper's Accept header asks."""

    async def metrics(request: Request) -> Response:
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encoder(telemetry.registry), headers={"Content-Type": content_type})

    return metrics


def instrument_app(app, telemetry: Telemetry, metrics_route: bool = True) -> None:
    """Add the middleware and, when metrics are on and ``metrics_route``, ``GET /metrics`` (without it, metrics are
    served on a port of their own: ``ragheat.service``). Call before the app starts."""
    app.add_middleware(TelemetryMiddleware, telemetry=telemetry)
    if telemetry.metrics is not None and metrics_route:
        app.add_route("/metrics", metrics_endpoint(telemetry), methods=["GET"], include_in_schema=False)
