"""Slow and oversized clients, handled where uvicorn reads the bytes, before the app sees a request.

uvicorn alone waits for a request's head for ever and keeps every header byte it is sent: one client dribbling a
header a byte a second holds a connection, and one sending an endless header grows the process without bound. The
protocol built here (uvicorn's httptools protocol, plus three limits) closes both:

- the request line and headers must arrive within ``server.header_timeout_s`` of the connection opening or of the
  request's first byte, else 408 (nothing is written to a connection that never sent a byte) and the connection closes;
- the body must arrive within ``server.body_timeout_s`` of the headers, else 408 and close;
- the request line plus headers may hold ``server.max_header_bytes``, else 431 and close.

Bodies over ``server.max_body_bytes`` are refused by ``rag.api.middleware.BodyLimitMiddleware`` (413). Each refusal
is counted (``rag.api.access.Rejections``). Other connections are unaffected: nothing here blocks the event loop, and
a closed connection's buffers are freed at once. ``ragheat serve`` runs uvicorn with ``uvicorn_config``.
"""

from __future__ import annotations

import asyncio
from typing import Callable

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from rag.settings import ServerSettings

_REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


def guarded_protocol(server: ServerSettings, on_reject: Callable[[str], None]) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol with ``server``'s head and body deadlines and head size limit; ``on_reject``
    hears each refusal's reason (``request_timeout``, ``headers_too_large``)."""
    header_timeout_s, body_timeout_s = server.header_timeout_s, server.body_timeout_s
    max_header_bytes = server.max_header_bytes

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        _head_timer: asyncio.TimerHandle | None = None
        _body_timer: asyncio.TimerHandle | None = None
        _head_bytes = 0
        _in_body = False
        _refused = False  # answered and closing: the rest of what was read is not parsed into a request

        # -- the head: its deadline and its size ------------------------------------------------------------
        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm_head()

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return
            if not self._in_body:
                self._head_bytes += len(data)  # counted as it arrives: a header that never ends is caught too
            super().data_received(data)
            if not self._in_body and self._head_bytes > max_header_bytes:
                self._refuse(431, "headers_too_large", f"the request line and headers exceed {max_header_bytes} "
                                                       f"bytes (server.max_header_bytes)")

        def on_message_begin(self) -> None:
            if self._refused:
                return
            super().on_message_begin()
            if self._head_timer is None:
                self._arm_head()

        def on_url(self, url: bytes) -> None:
            if not self._refused:
                super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            if not self._refused:
                super().on_header(name, value)

        def on_headers_complete(self) -> None:
            if self._refused:
                return
            self._cancel_head()
            size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
            if size > max_header_bytes:  # a whole oversized head that arrived in one read
                self._refuse(431, "headers_too_large", f"the request line and headers exceed {max_header_bytes} "
                                                       f"bytes (server.max_header_bytes)")
                return
            self._in_body = True
            self._body_timer = self.loop.call_later(body_timeout_s, self._body_late)
            super().on_headers_complete()

        def on_body(self, body: bytes) -> None:
            if not self._refused:
                super().on_body(body)

        def on_message_complete(self) -> None:
            if self._refused:
                return
            self._in_body, self._head_bytes = False, 0
            self._cancel_body()
            super().on_message_complete()

        def connection_lost(self, exc) -> None:
            self._cancel_head()
            self._cancel_body()
            super().connection_lost(exc)

        # -- deadlines --------------------------------------------------------------------------------------
        def _arm_head(self) -> None:
            self._head_timer = self.loop.call_later(header_timeout_s, self._head_late)

        def _cancel_head(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _cancel_body(self) -> None:
            if self._body_timer is not None:
                self._body_timer.cancel()
                self._body_timer = None

        def _busy(self) -> bool:
            """A response is being produced: reading may be paused by us (pipelining), not slowed by the client."""
            return self.cycle is not None and not self.cycle.response_complete and (
                self.cycle.response_started or bool(self.pipeline))

        def _head_late(self) -> None:
            self._head_timer = None
            if self.transport.is_closing():
                return
            if self._busy() or (self.cycle is not None and not self.cycle.response_complete):
                self._arm_head()  # the server is still answering the previous request; the client is not late
                return
            self._refuse(408, "request_timeout", f"the request line and headers did not arrive within "
                                                 f"{header_timeout_s:g} s (server.header_timeout_s)",
                         silent=self._head_bytes == 0)

        def _body_late(self) -> None:
            self._body_timer = None
            if self.transport.is_closing() or not self._in_body or self._busy():
                return
            self._refuse(408, "request_timeout", f"the request body did not arrive within {body_timeout_s:g} s "
                                                 f"of its headers (server.body_timeout_s)")

        def _refuse(self, status: int, reason: str, sentence: str, silent: bool = False) -> None:
            """Answer ``status`` with a JSON reason (unless ``silent``: nothing was asked) and close."""
            if self.transport.is_closing():
                return
            self._refused = True
            on_reject(reason)
            self._cancel_head()
            self._cancel_body()
            if not silent and (self.cycle is None or not self.cycle.response_started):
                body = ('{"error": "%s", "reason": "%s"}' % (reason, sentence)).encode()
                self.transport.write(b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                                     b"connection: close\r\n\r\n" % (status, _REASONS[status], len(body)) + body)
            self.transport.close()

    return GuardedHttpToolsProtocol


def uvicorn_config(app, server: ServerSettings, **options) -> uvicorn.Config:
    """The uvicorn configuration ``ragheat serve`` runs ``app`` with: the guarded protocol, refusals counted on the
    app's ``rag.api.access.Rejections``; ``options`` go to ``uvicorn.Config`` (host, port, log_level, ...)."""
    access = getattr(app.state, "access", None)
    on_reject = access.rejections.count if access is not None else (lambda reason: None)
    return uvicorn.Config(app, http=guarded_protocol(server, on_reject), **options)
