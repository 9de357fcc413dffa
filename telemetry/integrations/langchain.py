"""LangChain: a callback handler that makes each retriever, model and tool run one stage of the request.

    import ragheat.observe as rh

    observer = rh.Observer(service="my-rag", routes=("/query",))
    rh.langchain.enable(observer)       # every run from now on, through langchain_core's configure hook

    chain.invoke(question, config={"callbacks": [rh.langchain.callback_handler(observer)]})   # or run by run

A retriever run is a stage named by the retriever (``BM25Retriever`` -> ``retrieve_bm25``), else
``retrieve_dense`` when LangChain says it searches a vector store (FAISS's ``VectorStoreRetriever``), else
``retrieve`` (``EnsembleRetriever``); a model run (LLM or chat model) is ``generate``, a tool run ``tool``. Chains
and agents are structure. LangChain's ``Embeddings`` make no callback, so a vector search's query embedding is part
of its retriever's stage. A stage inside a stage of the same label counts once, as the outer one.

Runs are keyed by their ``run_id``, so runs side by side (an async ensemble's retrievers, a parallel map) are kept
apart. The handler runs inline: on the event loop for an async run, where it renames no thread, rather than in an
executor thread it would otherwise rename.
"""

from __future__ import annotations

import functools
import threading
from contextvars import ContextVar
from typing import Any

from telemetry.integrations._common import close_stage, log, observer_for, open_stage, retriever_label

MAX_OPEN_RUNS = 4096  # runs started and not yet ended; beyond it the oldest is forgotten (its stage unrecorded)


class _RunStages:
    """The handler's logic, free of LangChain so that importing this module imports none (``callback_handler``
    binds it). ``_runs``: run id -> (labels of the stages open at and above the run, its stage or None); only runs
    that are a stage, or that run inside one, are kept."""

    def __init__(self, observer=None) -> None:
        self.observer, self.enabled = observer, True
        self._runs: dict[Any, tuple[tuple[str, ...], Any]] = {}
        self._lock = threading.Lock()

    # -- what LangChain asks of a handler -----------------------------------------------------------------------
    raise_error = False
    run_inline = True  # see the module doc

    @property
    def ignore_llm(self) -> bool:
        return not self.enabled

    ignore_chat_model = ignore_chain = ignore_agent = ignore_retriever = ignore_llm

    @property
    def ignore_retry(self) -> bool:
        return True

    ignore_custom_event = ignore_retry

    def on_retriever_start(self, serialized, query, *, run_id, parent_run_id=None, metadata=None, **kwargs) -> None:
        def label(names):
            name = kwargs.get("name") or _serialized_name(serialized)
            return retriever_label(names, name, dense=bool((metadata or {}).get("ls_vector_store_provider")))
        self._start(run_id, parent_run_id, label)

    def on_llm_start(self, serialized, prompts, *, run_id, parent_run_id=None, **kwargs) -> None:
        self._start(run_id, parent_run_id, lambda names: "generate")

    def on_chat_model_start(self, serialized, messages, *, run_id, parent_run_id=None, **kwargs) -> None:
        self._start(run_id, parent_run_id, lambda names: "generate")

    def on_tool_start(self, serialized, input_str, *, run_id, parent_run_id=None, **kwargs) -> None:
        self._start(run_id, parent_run_id, lambda names: "tool")

    def on_chain_start(self, serialized, inputs, *, run_id, parent_run_id=None, **kwargs) -> None:
        self._start(run_id, parent_run_id, None)  # structure, kept only to pass the stages above it down

    def on_retriever_end(self, documents, *, run_id, **kwargs) -> None:
        self._end(run_id)

    def on_llm_end(self, response, *, run_id, **kwargs) -> None:
        self._end(run_id)

    def on_tool_end(self, output, *, run_id, **kwargs) -> None:
        self._end(run_id)

    def on_chain_end(self, outputs, *, run_id, **kwargs) -> None:
        self._end(run_id)

    def on_retriever_error(self, error, *, run_id, **kwargs) -> None:
        self._end(run_id, error)

    def on_llm_error(self, error, *, run_id, **kwargs) -> None:
        self._end(run_id, error)

    def on_tool_error(self, error, *, run_id, **kwargs) -> None:
        self._end(run_id, error)

    def on_chain_error(self, error, *, run_id, **kwargs) -> None:
        self._end(run_id, error)

    # -- bookkeeping ----------------------------------------------------------------------------------------------
    def _start(self, run_id, parent_run_id, label_for) -> None:
        try:
            parent = self._runs.get(parent_run_id) if parent_run_id is not None else None
            above = parent[0] if parent is not None else ()
            label = observer = None
            if label_for is not None:
                observer = observer_for(self.observer)
                if observer is not None:
                    label = label_for(observer.names)
            if label is None or label in above:
                if above:
                    self._keep(run_id, (above, None))
                return
            self._keep(run_id, (above + (label,), open_stage(observer, label)))
        except Exception:  # pragma: no cover - a handler must never fail the run
            log.exception("ragheat could not open a stage for a LangChain run")

    def _keep(self, run_id, entry) -> None:
        with self._lock:
            self._runs[run_id] = entry
            if len(self._runs) > MAX_OPEN_RUNS:
                del self._runs[next(iter(self._runs))]

    def _end(self, run_id, error: BaseException | None = None) -> None:
        with self._lock:
            entry = self._runs.pop(run_id, None)
        if entry is not None:
            close_stage(entry[1], error)


def _serialized_name(serialized) -> str | None:
    if not serialized:
        return None
    ids = serialized.get("id")
    return serialized.get("name") or (ids[-1] if isinstance(ids, list) and ids else None)


@functools.cache
def _handler_class():
    from langchain_core.callbacks import BaseCallbackHandler

    class RagheatCallbackHandler(_RunStages, BaseCallbackHandler):
        """A LangChain callback handler whose retriever, model and tool runs are ragheat stages (see
        ``telemetry.integrations.langchain``)."""

    RagheatCallbackHandler.__qualname__ = "RagheatCallbackHandler"
    return RagheatCallbackHandler


def callback_handler(observer=None):
    """ragheat's LangChain callback handler, for ``config={"callbacks": [...]}`` or a chain's ``callbacks``.
    ``observer``: the Observer of stages outside any request (default: the first made); a request's stages go to
    its own Observer."""
    return _handler_class()(observer)


_global: list = []  # the handler enable() registered, once per process: a configure hook cannot be taken back


def enable(observer=None):
    """Add ragheat's handler to every LangChain run (``langchain_core.tracers.context.register_configure_hook``,
    the seam LangChain's own tracers use); idempotent (a second call rebinds ``observer``). Returns the handler,
    or None without LangChain; passed in a run's config as well, it is not added twice (another handler of
    ``callback_handler`` would be, and would count each run again)."""
    try:
        from langchain_core.tracers.context import register_configure_hook
    except ImportError:
        log.warning("rh.langchain.enable: langchain-core is not installed; no LangChain stages are recorded")
        return None
    if _global:
        handler = _global[0]
        handler.observer, handler.enabled = observer, True
        return handler
    handler = callback_handler(observer)
    # The variable's default is the handler, so every context (every thread, task and request) sees it.
    register_configure_hook(ContextVar("ragheat_langchain_handler", default=handler), inheritable=True)
    _global.append(handler)
    return handler


def disable() -> None:
    """Stop the handler ``enable`` registered: LangChain still holds it, but it asks for no callback."""
    if _global:
        _global[0].enabled = False
