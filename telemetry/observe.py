"""Observe a RAG service that ragheat did not write: request and stage scopes that emit ragheat's own metric
families, labels, buckets, ``qps_bucket``, exemplars and spans, so every board, rule and probe works unchanged.

    import ragheat.observe as rh

    observer = rh.Observer(service="my-rag", routes=("/query",))
    rh.instrument(app, observer)              # any Starlette/FastAPI app: times the routes, serves GET /metrics

    @rh.stage("embed")                        # a decorator on def or async def
    def embed(text): ...

    with rh.stage("retrieve_bm25"):           # or a block (``async with`` too)
        hits = bm25.search(query)

Without ASGI, ``with observer.request("/query"):`` scopes one request, and ``observer.serve_metrics(port)`` serves
the metrics. Stage names map onto ragheat's closed set (``telemetry.stage_names``); ``other`` takes the rest.

Kernel attribution: while a stage runs on a thread, the thread is named ``rh:<stage>`` so ``ragheat probes --pid``
charges its run-queue, off-CPU and syscall time to that stage. On an asyncio event loop stages interleave on one
thread, so a block (``with``/``async with``) there renames nothing: the loop thread is named ``rh:event_loop`` and
its time is labelled so, not charged to whichever stage happened to enter last. A coroutine function decorated
with ``stage`` is renamed step by step, at each of the loop's switches into and out of it, and is attributed
exactly; so is a sync function (it cannot yield to another task) and a block in a worker thread.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import os
import threading
import time
from contextvars import ContextVar
from typing import Mapping, Sequence

from opentelemetry.trace import get_current_span

from rag.errors import StageError
from rag.settings import TelemetrySettings, telemetry_from_environment
from rag.threadnames import original_name, set_name, stage_comm
from rag.types import RequestRecord, StageTiming
from telemetry.recorder import RequestScope, Telemetry
from telemetry.stage_names import StageNames

log = logging.getLogger("ragheat.observe")

EVENT_LOOP_COMM = stage_comm("event_loop")
_running_loop = asyncio._get_running_loop  # the C-level check: a stage boundary is hot


class _RequestState:
    """One observed request: its scope, the stages timed so far, the first stage that raised."""

    __slots__ = ("observer", "scope", "stages", "failure", "status", "finished")

    def __init__(self, observer: "Observer", scope: RequestScope) -> None:
        self.observer, self.scope = observer, scope
        self.stages: list[StageTiming] = []
        self.failure: tuple[str, BaseException] | None = None
        self.status = 200
        self.finished = False


_current: ContextVar[_RequestState | None] = ContextVar("ragheat_observed_request", default=None)
_default: "Observer | None" = None
_thread = threading.local()  # .comm: the name ragheat last gave this thread; .is_loop: an event loop's, named so;
# .open_stages: this thread's OpenStages still open, innermost last; .base: its name before the first of them


def _rename(comm: bytes) -> bytes:
    """Name this thread ``comm`` for the kernel; returns the name to restore."""
    previous = getattr(_thread, "comm", None) or original_name()
    set_name(comm)
    _thread.comm = comm
    return previous


def _restore(comm: bytes) -> None:
    set_name(comm)
    _thread.comm = comm


class Observer:
    """One observed service: its metrics registry, span export and stage-name mapping.

    ``service``: the OpenTelemetry ``service.name`` of its spans (``OTEL_SERVICE_NAME`` wins); on the boards services
    are told apart by their Prometheus scrape ``job``. ``routes``: the request routes, a closed label set (only these
    are timed by the middleware). ``settings``: rate window, qps edges, sampling, OTLP (``rag.settings.
    TelemetrySettings``; default: from the ``RAGHEAT_TELEMETRY__*`` variables). Exemplars need a trace: spans
    exported (an OTLP endpoint in the environment, or ``span_exporter``), or the service's own current span.
    ``aliases``: extra stage names -> labels. ``name_threads``: rename threads for the
    probes. The first Observer made (or the one ``make_default`` names) serves stages outside any request."""

    def __init__(self, service: str = "rag", routes: Sequence[str] = ("/query",), *,
                 settings: TelemetrySettings | None = None, registry=None, span_exporter=None,
                 aliases: Mapping[str, str] | None = None, name_threads: bool = True,
                 environ: Mapping[str, str] = os.environ) -> None:
        global _default
        routes = tuple(routes)
        if not routes or not all(isinstance(r, str) and r.startswith("/") for r in routes):
            raise ValueError(f"routes must be one or more paths starting with '/', got {routes!r}")
        if settings is None:
            settings = telemetry_from_environment(environ)
        settings = settings.model_copy(update={"service_name": service})
        self.service, self.routes, self.name_threads = service, routes, name_threads
        self.telemetry = Telemetry(settings, registry=registry, span_exporter=span_exporter, environ=environ,
                                   routes=routes, data_source=service)
        metrics = self.telemetry.metrics
        self.names = StageNames(aliases, on_unmapped=metrics.unmapped_stages.inc if metrics else None)
        self._stages: dict[str, StageScope] = {}
        if _default is None:
            _default = self

    @property
    def registry(self):
        """The ``prometheus_client`` registry holding this service's families."""
        return self.telemetry.registry

    def make_default(self) -> "Observer":
        """Make this the observer of stages that run outside any observed request."""
        global _default
        _default = self
        return self

    def stage(self, name: str) -> "StageScope":
        """A stage scope bound to this observer (``stage`` finds the request's own observer anyway)."""
        scope = self._stages.get(name)
        if scope is None:
            scope = StageScope(name, self)
            if len(self._stages) < 1024:
                self._stages[name] = scope
        return scope

    def open_stage(self, name: str) -> "OpenStage":
        """Start timing ``name`` now, in the current request; ``.close(error=None)`` ends it (see ``OpenStage``)."""
        return OpenStage(self, name)

    def request(self, route: str | None = None, trace_headers: Mapping[str, str] | None = None) -> "RequestObservation":
        """Scope one request (``with``/``async with``): ``route`` must be one of ``routes`` (default the first);
        ``trace_headers``: the caller's W3C ``traceparent``/``tracestate``. Set ``.status`` on the handle to the
        response's status; an exception out of the block is a 500."""
        route = self.routes[0] if route is None else route
        if route not in self.routes:
            raise ValueError(f"route {route!r} is not one of this observer's routes {self.routes}; routes are a "
                             "closed label set, declared when the Observer is made")
        return RequestObservation(self, route, trace_headers)

    def _start(self, route: str, trace_headers: Mapping[str, str] | None) -> _RequestState:
        scope = self.telemetry.start(route, trace_headers)
        if scope.trace_id is None:
            # The service may trace itself (its own TracerProvider): its current span's trace is the exemplar.
            context = _current_span_context()
            if context is not None and context.trace_flags.sampled:
                scope.trace_id = format(context.trace_id, "032x")
        return _RequestState(self, scope)

    def _finish(self, state: _RequestState) -> None:
        state.finished = True
        record = RequestRecord(observed=state.stages)
        if state.failure is not None and state.status >= 500:
            label, cause = state.failure
            record.error = StageError(label, cause)
        self.telemetry.finish(state.scope, state.status, record)

    def record_stage(self, label: str, seconds: float, failed: bool = False) -> None:
        """A stage timed outside any observed request: recorded at the load level of the moment."""
        metrics = self.telemetry.metrics
        if metrics is None:
            return
        qps_bucket = self.telemetry.buckets.label(self.telemetry.rate.rate())
        metrics.child(metrics.stage_duration, label, qps_bucket, "error" if failed else "ok").observe(seconds)
        if failed:
            metrics.stage_errors.labels(label).inc()

    # -- exporting ---------------------------------------------------------------------------------------------
    def metrics_endpoint(self):
        """A Starlette endpoint serving the metrics (OpenMetrics, with exemplars, when the scraper asks)."""
        from telemetry.asgi import metrics_endpoint

        return metrics_endpoint(self.telemetry)

    def serve_metrics(self, port: int, addr: str = "127.0.0.1"):
        """Serve the metrics on a port of their own (any server, not only ASGI); returns (server, thread)."""
        from prometheus_client import start_http_server

        return start_http_server(port, addr, registry=self.registry)

    def close(self) -> None:
        """Flush and stop the span and OTLP exporters."""
        self.telemetry.force_flush(2.0)
        self.telemetry.shutdown()


def _current_span_context():
    context = get_current_span().get_span_context()
    return context if context.is_valid else None


class RequestObservation:
    """``Observer.request``'s handle: a context manager, sync or async."""

    __slots__ = ("observer", "route", "trace_headers", "state", "token")

    def __init__(self, observer: Observer, route: str, trace_headers) -> None:
        self.observer, self.route, self.trace_headers = observer, route, trace_headers

    @property
    def status(self) -> int:
        return self.state.status

    @status.setter
    def status(self, value: int) -> None:
        self.state.status = int(value)

    def __enter__(self) -> "RequestObservation":
        self.state = self.observer._start(self.route, self.trace_headers)
        self.token = _current.set(self.state)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        _current.reset(self.token)
        if exc is not None and self.state.status < 500:
            self.state.status = 500
        self.observer._finish(self.state)
        return False

    async def __aenter__(self) -> "RequestObservation":
        return self.__enter__()

    async def __aexit__(self, exc_type, exc, tb) -> bool:
        return self.__exit__(exc_type, exc, tb)


class StageScope:
    """``stage(name)``: times a block or a function as one stage of the current request.

    A context manager (``with``, ``async with``) and a decorator (``def``, ``async def``). One scope may be entered
    by many threads and tasks at once: each keeps its own frame. Outside any observed request the stage is still
    recorded, at the load level of the moment; with no Observer at all it does nothing."""

    __slots__ = ("name", "observer", "_frames")

    def __init__(self, name: str, observer: Observer | None = None) -> None:
        self.name, self.observer = name, observer
        self._frames: ContextVar[tuple] = ContextVar(f"ragheat_stage_{name}", default=())

    def _enter(self, rename: bool) -> None:
        request = _current.get()
        observer = request.observer if request is not None else (self.observer or _default)
        if observer is None:
            self._frames.set(self._frames.get() + (None,))
            return
        label = observer.names.label(self.name)
        restore = _rename(stage_comm(label)) if rename and observer.name_threads else None
        self._frames.set(self._frames.get() + ((time.perf_counter(), label, request, observer, restore),))

    def _exit(self, exc: BaseException | None) -> None:
        frames = self._frames.get()
        frame = frames[-1]
        self._frames.set(frames[:-1])
        if frame is None:
            return
        start, label, request, observer, restore = frame
        seconds = time.perf_counter() - start
        if restore is not None:
            _restore(restore)
        _record(observer, request, label, start, seconds, exc)

    def __enter__(self) -> "StageScope":
        self._enter(rename=_running_loop() is None)  # on the loop thread a block may await: see the module doc
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self._exit(exc)
        return False

    async def __aenter__(self) -> "StageScope":
        self._enter(rename=False)
        return self

    async def __aexit__(self, exc_type, exc, tb) -> bool:
        self._exit(exc)
        return False

    def __call__(self, function):
        if inspect.iscoroutinefunction(function):
            @functools.wraps(function)
            async def timed_coroutine(*args, **kwargs):
                return await _RenamedSteps(self, function(*args, **kwargs))
            return timed_coroutine
        if inspect.isgeneratorfunction(function) or inspect.isasyncgenfunction(function):
            raise TypeError(f"stage({self.name!r}) times functions and coroutine functions, not generators "
                            f"({function.__qualname__}): time the loop that consumes it with a `with` block")

        @functools.wraps(function)
        def timed(*args, **kwargs):
            self._enter(rename=True)  # a plain function cannot yield to another task: the thread is all its own
            try:
                result = function(*args, **kwargs)
            except BaseException as exc:
                self._exit(exc)
                raise
            self._exit(None)
            return result
        return timed


class _RenamedSteps:
    """Awaits a coroutine as one stage, naming the thread ``rh:<stage>`` during each of its steps only: between
    steps the event loop runs other tasks, and the thread goes back to the loop's name."""

    __slots__ = ("scope", "coroutine")

    def __init__(self, scope: StageScope, coroutine) -> None:
        self.scope, self.coroutine = scope, coroutine

    def __await__(self):
        scope, coroutine = self.scope, self.coroutine
        scope._enter(rename=False)
        frame = scope._frames.get()[-1]
        comm = None
        if frame is not None and frame[3].name_threads:
            comm = stage_comm(frame[1])
        send_value, thrown = None, None
        try:
            while True:
                restore = _rename(comm) if comm is not None else None
                try:
                    if thrown is None:
                        yielded = coroutine.send(send_value)
                    else:
                        yielded, thrown = coroutine.throw(thrown), None
                except StopIteration as stop:
                    result = stop.value
                    break
                finally:
                    if restore is not None:
                        _restore(restore)
                try:
                    send_value = yield yielded
                except GeneratorExit:
                    coroutine.close()
                    raise
                except BaseException as exc:  # cancellation and the like: delivered into the coroutine
                    send_value, thrown = None, exc
        except BaseException as exc:
            scope._exit(exc)
            raise
        scope._exit(None)
        return result


class OpenStage:
    """A stage opened and closed by two calls instead of a block: for a framework's own callbacks (a tracer's span
    start and end, a callback handler's ``on_*_start``/``on_*_end``). ``Observer.open_stage`` makes one; ``close``
    records it, once. It belongs to the request current when it opened; closed after that request ended (a stream
    consumed later), it is recorded on its own, at the load of the moment. The thread is renamed only when opened off
    an event loop, and named back only on the thread that opened it, to the innermost stage still open there (so
    stages may close in any order)."""

    __slots__ = ("label", "request", "observer", "start", "thread", "comm", "closed")

    def __init__(self, observer: "Observer", name: str) -> None:
        self.request = _current.get()
        self.observer = self.request.observer if self.request is not None else observer
        self.label = self.observer.names.label(name)
        self.thread = threading.get_ident()
        self.comm = None
        if self.observer.name_threads and _running_loop() is None:
            self.comm = stage_comm(self.label)
            opened = _open_stages()
            if not opened:
                _thread.base = getattr(_thread, "comm", None) or original_name()
            opened.append(self)
            _rename(self.comm)
        self.closed = False
        self.start = time.perf_counter()

    def close(self, error: BaseException | None = None) -> None:
        if self.closed:
            return
        self.closed = True
        seconds = time.perf_counter() - self.start
        if self.comm is not None and threading.get_ident() == self.thread:
            opened = _open_stages()
            if self in opened:
                opened.remove(self)
            _restore(opened[-1].comm if opened else _thread.base)
        _record(self.observer, self.request, self.label, self.start, seconds, error)


def _record(observer: "Observer", request: "_RequestState | None", label: str, start: float, seconds: float,
            error: BaseException | None) -> None:
    """One timed stage: into its request while that is open (the innermost stage to raise is its failure), else
    on its own, at the load of the moment."""
    if request is not None and not request.finished:
        request.stages.append(StageTiming(label, seconds, start))
        if error is not None and request.failure is None:
            request.failure = (label, error)
    else:
        observer.record_stage(label, seconds, error is not None)


def _open_stages() -> list:
    opened = getattr(_thread, "open_stages", None)
    if opened is None:
        opened = _thread.open_stages = []
    return opened


def current_observer(bound: "Observer | None" = None) -> "Observer | None":
    """The Observer a call running now belongs to: its request's, else ``bound``, else the default one; None when no
    Observer exists (then nothing is recorded)."""
    request = _current.get()
    if request is not None:
        return request.observer
    return bound if bound is not None else _default


def stage(name: str) -> StageScope:
    """A stage scope for ``name`` (see ``StageScope``); scopes are shared per name."""
    observer = _default
    if observer is not None:
        return observer.stage(name)
    return StageScope(name)


class ObserveMiddleware:
    """Pure-ASGI middleware: each HTTP request to one of the observer's ``routes`` becomes an observed request
    (its stages, its status, its end when the last body bytes go out, streams included)."""

    def __init__(self, app, observer: Observer | None = None) -> None:
        self.app, self._observer = app, observer

    @property
    def observer(self) -> Observer:
        observer = self._observer or _default
        if observer is None:
            raise RuntimeError("ObserveMiddleware needs an Observer: make one (ragheat.observe.Observer(...)) "
                               "before the app serves, or pass observer=")
        return observer

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        observer = self.observer
        if scope["path"] not in observer.routes:
            return await self.app(scope, receive, send)
        if observer.name_threads and not getattr(_thread, "is_loop", False):
            _thread.is_loop = True
            _rename(EVENT_LOOP_COMM)  # the loop's own time, for the probes
        trace_headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", ())
                         if k in (b"traceparent", b"tracestate")}
        state = observer._start(scope["path"], trace_headers or None)
        state.status = 500  # if the app dies before a status line, that is what the client sees
        token = _current.set(state)
        finished = False

        def finish() -> None:
            nonlocal finished
            if not finished:
                finished = True
                try:
                    observer._finish(state)
                except Exception:  # pragma: no cover - telemetry must not fail a request
                    log.exception("ragheat could not record a request")

        async def send_with_status(message):
            if message["type"] == "http.response.start":
                state.status = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                finish()  # before the last bytes: a client that then scrapes finds its request counted
            await send(message)

        try:
            await self.app(scope, receive, send_with_status)
        finally:
            _current.reset(token)
            finish()


def instrument(app, observer: Observer | None = None, *, middleware: bool = True, metrics_path: str = "/metrics"):
    """Add ``ObserveMiddleware`` (unless ``middleware=False``: spans feed the metrics instead, through
    ``StageSpanProcessor``) and ``GET metrics_path`` to a Starlette or FastAPI app. Returns the observer."""
    observer = observer or _default or Observer()
    if middleware:
        app.add_middleware(ObserveMiddleware, observer=observer)
    if metrics_path:
        app.add_route(metrics_path, observer.metrics_endpoint(), methods=["GET"], include_in_schema=False)
    return observer
