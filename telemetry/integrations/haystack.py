"""Haystack 2: a ``haystack.tracing`` Tracer that makes each component a pipeline runs one stage of the request.

    import ragheat.observe as rh

    observer = rh.Observer(service="my-rag", routes=("/query",))
    rh.haystack.enable(observer)        # haystack.tracing.enable_tracing(...) with ragheat's tracer

Haystack opens a span around every component's ``run`` (``haystack.component.run``, tagged with the component's
type and name), around a chat generator that another component calls, and around an agent's model call and each
of its tool calls. A component's stage is named by its type (``InMemoryBM25Retriever`` -> ``retrieve_bm25``,
``SentenceTransformersTextEmbedder`` -> ``embed``, ``DocumentJoiner`` -> ``fuse``), else by its name in the
pipeline; a component that says no stage (a prompt builder, a router, an agent) is structure, as is the
pipeline's own span. A stage inside a stage of the same label counts once, as the outer one.

A tracer already enabled (OpenTelemetry, Langfuse...) keeps working: ragheat's wraps it and hands it every span.
No tag is recorded, content or not: Haystack's content-tracing switch governs the wrapped tracer's spans only.
"""

from __future__ import annotations

import contextlib
import functools
from contextvars import ContextVar
from typing import Any, Iterator

from telemetry.integrations._common import close_stage, label_of, log, observer_for, open_stage

COMPONENT_RUN = "haystack.component.run"
CHAT_GENERATOR_RUN = "haystack.chat_generator.run"  # a chat generator called by a component, not by the pipeline
FIXED_STAGES = {"haystack.agent.step.llm": "generate", "haystack.agent.step.tool": "tool"}
"""Spans whose operation alone says the stage; every other operation but the two above is structure."""

# The labels of the stages open in this context: a stage inside one of its own label is not opened again.
_active: ContextVar[tuple[str, ...]] = ContextVar("ragheat_haystack_stages", default=())


class _StageTracing:
    """The tracer's logic, free of Haystack so that importing this module imports none (``tracer`` binds it)."""

    def __init__(self, observer=None, inner=None) -> None:
        self.observer, self.inner = observer, inner

    @contextlib.contextmanager
    def trace(self, operation_name: str, tags: dict[str, Any] | None = None, parent_span=None) -> Iterator[Any]:
        stage, token = self._open(operation_name, tags)
        error = None
        try:
            if self.inner is None:
                yield _null_span()
            else:
                with self.inner.trace(operation_name, tags=tags, parent_span=parent_span) as span:
                    yield span
        except GeneratorExit:
            raise
        except BaseException as exc:
            error = exc
            raise
        finally:
            if token is not None:
                try:
                    _active.reset(token)
                except ValueError:  # pragma: no cover - ended in another context than it began: nothing to undo
                    pass
            close_stage(stage, error)

    def current_span(self):
        # ragheat's spans hold nothing, so one shared span stands for all of them; a wrapped tracer knows its own.
        return _null_span() if self.inner is None else self.inner.current_span()

    def _open(self, operation_name: str, tags: dict[str, Any] | None):
        if operation_name not in FIXED_STAGES and operation_name not in (COMPONENT_RUN, CHAT_GENERATOR_RUN):
            return None, None  # the pipeline, an agent's run and steps, hooks: structure
        try:
            observer = observer_for(self.observer)
            if observer is None:
                return None, None
            label = FIXED_STAGES.get(operation_name)
            if label is None:
                tags = tags or {}
                label = label_of(observer.names, tags.get("haystack.component.type"),
                                 tags.get("haystack.component.name"))
                if label is None and operation_name == CHAT_GENERATOR_RUN:
                    label = "generate"
            above = _active.get()
            if label is None or label in above:
                return None, None
            return open_stage(observer, label), _active.set(above + (label,))
        except Exception:  # pragma: no cover - a tracer must never fail the pipeline
            log.exception("ragheat could not open a stage for Haystack's %s", operation_name)
            return None, None


@functools.cache
def _classes():
    from haystack import tracing

    class RagheatSpan(tracing.Span):
        """A span that keeps nothing: ragheat needs only when a component starts and ends."""

        def set_tag(self, key: str, value: Any) -> None:
            pass

        def set_content_tag(self, key: str, value: Any) -> None:
            pass  # no content is kept, whatever the switch says

    class RagheatTracer(_StageTracing, tracing.Tracer):
        """``haystack.tracing.Tracer``: each component's run is a ragheat stage (see ``telemetry.integrations.
        haystack``); ``inner``, a tracer already in use, gets every span as before."""

    RagheatSpan.__qualname__, RagheatTracer.__qualname__ = "RagheatSpan", "RagheatTracer"
    return RagheatSpan(), RagheatTracer


def _null_span():
    return _classes()[0]


def tracer(observer=None, inner=None):
    """ragheat's Haystack tracer, to enable by hand or to wrap in a tracer of your own. ``observer``: the Observer
    of stages outside any request (default: the first made); a request's stages go to its own Observer."""
    return _classes()[1](observer, inner)


def enable(observer=None):
    """Make ragheat's tracer Haystack's (``haystack.tracing.enable_tracing``), wrapping any tracer already
    enabled; idempotent (a second call rebinds ``observer``). Returns the tracer, or None without Haystack."""
    try:
        from haystack import tracing
    except ImportError:
        log.warning("rh.haystack.enable: haystack-ai is not installed; no Haystack stages are recorded")
        return None
    current = tracing.tracer.actual_tracer
    if isinstance(current, _classes()[1]):
        current.observer = observer
        return current
    ours = tracer(observer, current if tracing.is_tracing_enabled() else None)
    tracing.enable_tracing(ours)
    return ours


def disable() -> None:
    """Give Haystack back the tracer ragheat's wrapped (or none)."""
    try:
        from haystack import tracing
    except ImportError:
        return
    current = tracing.tracer.actual_tracer
    if isinstance(current, _classes()[1]):
        if current.inner is not None:
            tracing.enable_tracing(current.inner)
        else:
            tracing.disable_tracing()
