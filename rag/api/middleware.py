"""ASGI middleware in front of the routes: request bodies are bounded and must be UTF-8."""

from __future__ import annotations

from rag.api.errors import error_response


class BodyLimitMiddleware:
    """Rejects request bodies over ``limit`` bytes with 413, by header or by counting what arrives, and bodies
    that are not UTF-8 with 400, before any route reads them."""

    def __init__(self, app, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await self._reject(scope, receive, send)
        # Read the whole body here (at most ``limit`` bytes are held), then replay it to the app:
        # an exception raised inside the app's own body reading would be turned into a 400 there.
        chunks, received = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunks.append(message.get("body", b""))
            received += len(chunks[-1])
            if received > self.limit:
                return await self._reject(scope, receive, send)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as exc:
            response = error_response("invalid_utf8", f"request body is not valid UTF-8 "
                                                      f"({exc.reason} at byte {exc.start})")
            return await response(scope, receive, send)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _reject(self, scope, receive, send):
        response = error_response("body_too_large", f"request body exceeds {self.limit} bytes (server.max_body_bytes)")
        await response(scope, receive, send)
