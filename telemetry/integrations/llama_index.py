"""LlamaIndex: a span handler on ``llama_index.core.instrumentation``'s root dispatcher that makes each retriever,
embedding, language-model, reranker and tool call one stage of the request.

    import ragheat.observe as rh

    observer = rh.Observer(service="my-rag", routes=("/query",))
    rh.llama_index.enable(observer)     # get_dispatcher().add_span_handler(...) with ragheat's handler

LlamaIndex opens a span (``ClassName.method-<uuid>``) around every instrumented method, public and private. The
handler keeps the public entry point of each kind and ignores the rest, so one call is one stage:

- a ``BaseRetriever``'s ``retrieve``/``aretrieve``: named by its class (``BM25Retriever`` -> ``retrieve_bm25``,
  ``VectorIndexRetriever`` -> ``retrieve_dense``), else ``retrieve`` (``QueryFusionRetriever``);
- a ``BaseEmbedding``'s ``get_query_embedding``, ``get_text_embedding``, ``get_text_embedding_batch`` (and their
  ``a`` forms): ``embed``;
- a ``BaseLLM``'s ``chat``, ``complete`` (and their ``a`` forms): ``generate``;
- a ``BaseNodePostprocessor``'s ``_postprocess_nodes``/``_apostprocess_nodes`` when its class says rerank:
  ``rerank`` (its public methods are not instrumented);
- a ``BaseTool``'s ``__call__``, ``call``, ``acall``: ``tool``.

Query and chat engines, synthesizers, agents and workflows are structure: their calls are made of the ones above.
A streamed model call (``stream_chat``...) is no stage: its span ends when the stream is handed back, before any
token. A stage inside a stage of the same label counts once, as the outer one; stages of different labels nest (a
fusion retriever is ``retrieve``, its own retrievers ``retrieve_dense`` and ``retrieve_bm25``).
"""

from __future__ import annotations

import functools
from typing import Any

from telemetry.integrations._common import close_stage, log, observer_for, open_stage, retriever_label

METHODS = {
    "retriever": frozenset({"retrieve", "aretrieve"}),
    "embedding": frozenset({"get_query_embedding", "aget_query_embedding", "get_text_embedding",
                            "aget_text_embedding", "get_text_embedding_batch", "aget_text_embedding_batch"}),
    "llm": frozenset({"chat", "achat", "complete", "acomplete"}),
    "postprocessor": frozenset({"_postprocess_nodes", "_apostprocess_nodes"}),
    "tool": frozenset({"__call__", "call", "acall"}),
}
"""The methods of each kind of instance whose span is a stage; the private ones only where no public one is
instrumented."""
FIXED_STAGES = {"embedding": "embed", "llm": "generate", "tool": "tool"}
_MAX_CLASSES = 4096  # classes whose kind is remembered; beyond it a kind is found afresh each time


def _method(span_id: str) -> str:
    """``"VectorIndexRetriever.retrieve-<uuid>"`` -> ``"retrieve"``."""
    return span_id.partition("-")[0].rpartition(".")[2]


class _SpanStages:
    """The handler's logic, free of LlamaIndex so that importing this module imports none (``span_handler`` binds
    it). Each span it keeps carries the labels of the stages open above it and its own stage, if it is one."""

    def __init__(self, observer, span_class, bases: tuple[tuple[type, str], ...]) -> None:
        self.observer, self.span_class, self.bases = observer, span_class, bases
        self._kinds: dict[type, str | None] = {}

    def kind(self, cls: type) -> str | None:
        try:
            return self._kinds[cls]
        except KeyError:
            kind = next((kind for base, kind in self.bases if issubclass(cls, base)), None)
            if len(self._kinds) < _MAX_CLASSES:
                self._kinds[cls] = kind
            return kind

    def enter(self, open_spans: dict, span_id: str, instance: Any, parent_id: str | None):
        parent = open_spans.get(parent_id) if parent_id is not None else None
        above = parent.labels if parent is not None else ()
        label = observer = None
        if instance is not None:
            kind = self.kind(type(instance))
            if kind is not None and _method(span_id) in METHODS[kind]:
                observer = observer_for(self.observer)
                if observer is not None:
                    label = self._label(kind, type(instance).__name__, observer.names)
        if label is None or label in above:
            # Kept only inside a stage, so that the calls under it still see the stage above them.
            return self.span_class(id_=span_id, parent_id=parent_id, labels=above) if above else None
        return self.span_class(id_=span_id, parent_id=parent_id, labels=above + (label,),
                               stage=open_stage(observer, label))

    @staticmethod
    def _label(kind: str, class_name: str, names) -> str | None:
        if kind == "retriever":
            return retriever_label(names, class_name)
        if kind == "postprocessor":
            return "rerank" if names.label(class_name, count=False) == "rerank" else None
        return FIXED_STAGES[kind]

    @staticmethod
    def exit(open_spans: dict, span_id: str, error: BaseException | None):
        span = open_spans.get(span_id)
        if span is not None:
            close_stage(span.stage, error)
        return span


@functools.cache
def _handler_class():
    from llama_index.core.base.base_retriever import BaseRetriever
    from llama_index.core.base.embeddings.base import BaseEmbedding
    from llama_index.core.base.llms.base import BaseLLM
    from llama_index.core.instrumentation.span import BaseSpan
    from llama_index.core.instrumentation.span_handlers import BaseSpanHandler
    from llama_index.core.postprocessor.types import BaseNodePostprocessor
    from llama_index.core.tools.types import BaseTool
    from pydantic import PrivateAttr

    bases = ((BaseRetriever, "retriever"), (BaseEmbedding, "embedding"), (BaseLLM, "llm"),
             (BaseNodePostprocessor, "postprocessor"), (BaseTool, "tool"))

    class RagheatSpan(BaseSpan):
        labels: tuple = ()
        stage: Any = None

    class RagheatSpanHandler(BaseSpanHandler[RagheatSpan]):
        """A LlamaIndex span handler whose stage spans are ragheat stages (see ``telemetry.integrations.
        llama_index``). It keeps only the spans open inside a stage, and no finished span."""

        _stages: Any = PrivateAttr()

        def __init__(self, observer=None) -> None:
            super().__init__(open_spans={}, completed_spans=[], dropped_spans=[], current_span_ids={})
            self._stages = _SpanStages(observer, RagheatSpan, bases)

        @classmethod
        def class_name(cls) -> str:
            return "RagheatSpanHandler"

        def new_span(self, id_: str, bound_args, instance: Any = None, parent_span_id: str | None = None,
                     tags=None, **kwargs: Any):
            try:
                return self._stages.enter(self.open_spans, id_, instance, parent_span_id)
            except Exception:  # pragma: no cover - a handler must never fail the traced call
                log.exception("ragheat could not open a stage for LlamaIndex's %s", id_)
                return None

        def prepare_to_exit_span(self, id_: str, bound_args, instance: Any = None, result: Any = None,
                                 **kwargs: Any):
            return self._stages.exit(self.open_spans, id_, None)

        def prepare_to_drop_span(self, id_: str, bound_args, instance: Any = None, err: BaseException | None = None,
                                 **kwargs: Any):
            return self._stages.exit(self.open_spans, id_, err)

    RagheatSpan.__qualname__, RagheatSpanHandler.__qualname__ = "RagheatSpan", "RagheatSpanHandler"
    return RagheatSpanHandler


def span_handler(observer=None):
    """ragheat's LlamaIndex span handler, to add to a dispatcher by hand. ``observer``: the Observer of stages
    outside any request (default: the first made); a request's stages go to its own Observer."""
    return _handler_class()(observer)


def enable(observer=None):
    """Add ragheat's span handler to LlamaIndex's root dispatcher; idempotent (a second call rebinds
    ``observer``). Returns the handler, or None without LlamaIndex."""
    try:
        from llama_index.core.instrumentation import get_dispatcher
    except ImportError:
        log.warning("rh.llama_index.enable: llama-index-core is not installed; no LlamaIndex stages are recorded")
        return None
    root = get_dispatcher()
    for handler in root.span_handlers:
        if isinstance(handler, _handler_class()):
            handler._stages.observer = observer
            return handler
    handler = span_handler(observer)
    root.add_span_handler(handler)
    return handler


def disable() -> None:
    """Remove ragheat's span handler from LlamaIndex's root dispatcher."""
    try:
        from llama_index.core.instrumentation import get_dispatcher
    except ImportError:
        return
    root = get_dispatcher()
    root.span_handlers = [h for h in root.span_handlers if not isinstance(h, _handler_class())]
