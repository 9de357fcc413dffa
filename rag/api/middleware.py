"""ASGI middleware in front of the routes, outermost first: who may ask and how often (``AccessMiddleware``), bounded
UTF-8 bodies (``BodyLimitMiddleware``), and the index generation a request is served by (``IndexGenerationMiddleware``)."""

from __future__ import annotations

from rag.api.access import AccessPolicy, Rejections
from rag.api.errors import error_response
from rag.index_generations import IndexGenerationSwitch

LEASE_KEY = "generation_lease"
"""Where ``IndexGenerationMiddleware`` leaves the request's ``rag.index_generations.Lease`` (``request.state``)."""
GENERATION_HEADER = b"x-ragheat-generation"
LEASED_PREFIXES = ("/v1/", "/readyz")


class AccessMiddleware:
    """Turns a request away (401, 403, 429, with a JSON reason and ``WWW-Authenticate`` or ``Retry-After``) when
    ``policy`` refuses it, before its body is read; counts each refusal by reason."""

    def __init__(self, app, policy: AccessPolicy) -> None:
        self.app, self.policy = app, policy

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        client = scope.get("client")
        refusal = self.policy.check(scope["path"], dict(scope.get("headers") or ()), client[0] if client else None,
                                    scope.setdefault("state", {}))
        if refusal is None:
            return await self.app(scope, receive, send)
        self.policy.rejections.count(refusal.reason)
        response = error_response(refusal.reason, refusal.sentence, headers=dict(refusal.headers))
        await response(scope, receive, send)


class IndexGenerationMiddleware:
    """Pins each query (and ``/readyz``) to the generation served when it arrived: a ``Lease`` taken here, left on
    ``request.state`` for the routes and released when the response is complete (a stream's last event included), so
    a swap never changes the index under a request. Responses say which generation answered
    (``X-Ragheat-Generation``)."""

    def __init__(self, app, switch: IndexGenerationSwitch) -> None:
        self.app, self.switch = app, switch

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].startswith(LEASED_PREFIXES):
            return await self.app(scope, receive, send)
        lease = self.switch.lease()
        scope.setdefault("state", {})[LEASE_KEY] = lease
        if lease is None:  # still loading: the routes answer 503
            return await self.app(scope, receive, send)
        header = (GENERATION_HEADER, lease.generation.encode("ascii"))

        async def send_with_generation(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), header]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_generation)
        finally:
            lease.release()


class BodyLimitMiddleware:
    """Rejects request bodies over ``limit`` bytes with 413, by header or by counting what arrives, and bodies
    that are not UTF-8 with 400, before any route reads them."""

    def __init__(self, app, limit: int, rejections: Rejections | None = None) -> None:
        self.app, self.limit, self.rejections = app, limit, rejections

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
            if message["type"] != "http.request":
                # The client went away (or rag.api.connections closed it: too slow) before its body arrived. Nobody
                # reads this answer; it is sent so that whoever observes requests records a 4xx, not a server error.
                response = error_response("request_timeout", "the request body did not arrive")
                return await response(scope, receive, send)
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
        if self.rejections is not None:
            self.rejections.count("body_too_large")
        response = error_response("body_too_large", f"request body exceeds {self.limit} bytes (server.max_body_bytes)")
        await response(scope, receive, send)
