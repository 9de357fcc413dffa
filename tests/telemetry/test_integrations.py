"""The framework hooks (telemetry/integrations): Haystack's tracer, LlamaIndex's span handler and LangChain's
callback handler, each driven in-process by the framework's own components over a 20-document corpus, with a
fake embedder of the framework's interface so that no model loads."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

import ragheat.observe as rh
from rag.threadnames import get_name, stage_comm
from telemetry import observe as observe_module

STAGE_H = "ragheat_stage_duration_seconds"
TOPICS = ("alpha", "beta", "gamma", "delta", "epsilon")
CORPUS = [(str(i), f"document {i} is about {TOPICS[i % 5]} and {TOPICS[(i * 3) % 5]} with note {i % 4}")
          for i in range(20)]
QUESTION = "which document is about gamma"


def vector(text: str) -> list[float]:
    """A deterministic three-dimensional embedding: enough for a vector search to return something."""
    return [float(text.count("gamma") + 1), float(len(text) % 7), 1.0]


def samples(observer, name: str) -> list:
    text = generate_latest(observer.registry).decode()
    return [s for family in text_string_to_metric_families(text) for s in family.samples if s.name == name]


def counts(observer, outcome: str = "ok") -> dict[str, float]:
    found: dict[str, float] = {}
    for s in samples(observer, STAGE_H + "_count"):
        if s.labels["outcome"] == outcome and s.value:
            found[s.labels["stage"]] = found.get(s.labels["stage"], 0) + s.value
    return found


def stage_errors(observer) -> dict[str, float]:
    return {s.labels["stage"]: s.value for s in samples(observer, "ragheat_stage_errors_total") if s.value}


def unmapped(observer) -> float:
    return sum(s.value for s in samples(observer, "ragheat_unmapped_stage_names_total"))


@pytest.fixture
def observer():
    observer = rh.Observer(service="hooked-rag", routes=("/query",), environ={},
                           settings=rh.TelemetrySettings(otlp="off", tracing=False))
    yield observer.make_default()
    observer.close()


@pytest.fixture
def no_default(monkeypatch):
    """No Observer serves stages outside a request: one exists, but the hook is given none and none is default."""
    observer = rh.Observer(service="unbound", routes=("/query",), environ={},
                           settings=rh.TelemetrySettings(otlp="off", tracing=False))
    monkeypatch.setattr(observe_module, "_default", None)
    yield observer
    observer.close()


def test_importing_ragheat_observe_imports_no_framework():
    code = ("import sys, ragheat.observe as rh; rh.haystack, rh.llama_index, rh.langchain; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('haystack', 'llama_index', "
            "'llama_index_instrumentation', 'langchain', 'langchain_core', 'langchain_classic')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -- Haystack ---------------------------------------------------------------------------------------------------

@pytest.fixture
def haystack_pipeline():
    pytest.importorskip("haystack")
    from haystack import Document, Pipeline, component, tracing
    from haystack.components.joiners import DocumentJoiner
    from haystack.components.retrievers.in_memory import InMemoryBM25Retriever, InMemoryEmbeddingRetriever
    from haystack.document_stores.in_memory import InMemoryDocumentStore

    seen: list[bytes] = []

    @component
    class FakeTextEmbedder:
        fail = False

        @component.output_types(embedding=list[float])
        def run(self, text: str):
            seen.append(get_name())
            if self.fail:
                raise RuntimeError("embedder down")
            return {"embedding": vector(text)}

    @component
    class KeywordSearch:
        """A component of the bm25 kind that runs a BM25 retriever in a pipeline of its own."""

        def __init__(self, store) -> None:
            self.inner = Pipeline()
            self.inner.add_component("bm25", InMemoryBM25Retriever(document_store=store, top_k=5))

        @component.output_types(documents=list[Document])
        def run(self, query: str):
            return {"documents": self.inner.run({"bm25": {"query": query}})["bm25"]["documents"]}

    store = InMemoryDocumentStore()
    store.write_documents([Document(id=i, content=text, embedding=vector(text)) for i, text in CORPUS])
    pipe = Pipeline()
    pipe.add_component("text_embedder", FakeTextEmbedder())
    pipe.add_component("embedding_retriever", InMemoryEmbeddingRetriever(document_store=store, top_k=5))
    pipe.add_component("bm25_retriever", KeywordSearch(store))
    pipe.add_component("joiner", DocumentJoiner(join_mode="reciprocal_rank_fusion", top_k=3))
    pipe.connect("text_embedder.embedding", "embedding_retriever.query_embedding")
    pipe.connect("embedding_retriever", "joiner")
    pipe.connect("bm25_retriever", "joiner")
    pipe.seen = seen
    yield pipe
    rh.haystack.disable()
    tracing.disable_tracing()


def run_haystack(pipe):
    return pipe.run({"text_embedder": {"text": QUESTION}, "bm25_retriever": {"query": QUESTION}})


def test_haystack_components_are_stages_and_the_pipeline_is_structure(observer, haystack_pipeline):
    from haystack import tracing
    from haystack.tracing.logging_tracer import LoggingSpan

    class Recording(tracing.Tracer):
        """A tracer enabled before ragheat's: it still sees every span."""

        def __init__(self) -> None:
            self.operations: list[str] = []

        @contextlib.contextmanager
        def trace(self, operation_name, tags=None, parent_span=None):
            self.operations.append(operation_name)
            yield LoggingSpan(operation_name)

        def current_span(self):
            return None

    recording = Recording()
    tracing.enable_tracing(recording)
    assert rh.haystack.enable(observer) is rh.haystack.enable(observer)  # idempotent
    with observer.request("/query") as request:
        documents = run_haystack(haystack_pipeline)["joiner"]["documents"]
    assert documents
    # One stage per component; the KeywordSearch component's own BM25 retriever, a stage of the same label
    # inside it, counts once.
    assert sorted(s.name for s in request.state.stages) == ["embed", "fuse", "retrieve_bm25", "retrieve_dense"]
    assert counts(observer) == {"embed": 1, "fuse": 1, "retrieve_bm25": 1, "retrieve_dense": 1}
    assert unmapped(observer) == 0
    assert haystack_pipeline.seen == [stage_comm("embed")]  # the probes see the component's thread as its stage
    assert recording.operations.count("haystack.component.run") == 5  # four components and the nested one
    assert recording.operations.count("haystack.pipeline.run") == 2
    rh.haystack.disable()
    assert tracing.tracer.actual_tracer is recording  # the tracer ragheat wrapped is given back


def test_haystack_an_async_run_lands_in_its_request(observer, haystack_pipeline):
    rh.haystack.enable(observer)

    async def serve():
        async with observer.request("/query") as request:
            await haystack_pipeline.run_async({"text_embedder": {"text": QUESTION},
                                               "bm25_retriever": {"query": QUESTION}})
            return request

    request = asyncio.run(serve())
    assert sorted(s.name for s in request.state.stages) == ["embed", "fuse", "retrieve_bm25", "retrieve_dense"]
    # opened on the loop, no stage renames a thread: the sync embedder's worker thread keeps its own name
    assert not haystack_pipeline.seen[0].startswith(b"rh:")


def test_haystack_a_failing_component_is_the_failed_stage(observer, haystack_pipeline):
    from haystack.core.errors import PipelineRuntimeError

    rh.haystack.enable(observer)
    haystack_pipeline.get_component("text_embedder").fail = True
    with pytest.raises(PipelineRuntimeError):
        with observer.request("/query"):
            run_haystack(haystack_pipeline)
    assert stage_errors(observer) == {"embed": 1}
    assert counts(observer, "error") == {"embed": 1}


def test_haystack_records_nothing_without_an_observer(no_default, haystack_pipeline):
    rh.haystack.enable()
    assert run_haystack(haystack_pipeline)["joiner"]["documents"]
    assert counts(no_default) == {} and haystack_pipeline.seen == [get_name()]


# -- LlamaIndex -------------------------------------------------------------------------------------------------

@pytest.fixture
def llama_index():
    """LlamaIndex's own components over the corpus: a fake embedding, a vector index, BM25 and the fusion."""
    pytest.importorskip("llama_index.core")
    pytest.importorskip("llama_index.retrievers.bm25")
    from llama_index.core import VectorStoreIndex
    from llama_index.core.base.base_retriever import BaseRetriever
    from llama_index.core.base.embeddings.base import BaseEmbedding
    from llama_index.core.llms import MockLLM
    from llama_index.core.retrievers import QueryFusionRetriever
    from llama_index.core.schema import TextNode
    from llama_index.retrievers.bm25 import BM25Retriever

    seen: list[bytes] = []

    class FakeEmbedding(BaseEmbedding):
        def _get_query_embedding(self, query: str) -> list[float]:
            seen.append(get_name())
            return vector(query)

        async def _aget_query_embedding(self, query: str) -> list[float]:
            return self._get_query_embedding(query)

        def _get_text_embedding(self, text: str) -> list[float]:
            return vector(text)

    class BrokenKeywordRetriever(BaseRetriever):
        def _retrieve(self, query_bundle):
            raise RuntimeError("keyword index down")

    nodes = [TextNode(id_=i, text=text) for i, text in CORPUS]
    index = VectorStoreIndex(nodes, embed_model=FakeEmbedding())  # before the hook: no stage of its own

    def fusion(use_async: bool = False, broken: bool = False):
        keyword = BrokenKeywordRetriever() if broken else BM25Retriever.from_defaults(nodes=nodes, similarity_top_k=5)
        return QueryFusionRetriever([index.as_retriever(similarity_top_k=5), keyword], llm=MockLLM(),
                                    mode="reciprocal_rerank", num_queries=1, similarity_top_k=3, use_async=use_async)

    fusion.seen, fusion.index = seen, index
    yield fusion
    rh.llama_index.disable()


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_llama_index_calls_are_stages_once_each(observer, llama_index, use_async):
    from llama_index.core.instrumentation import get_dispatcher

    handler = rh.llama_index.enable(observer)
    assert rh.llama_index.enable(observer) is handler
    assert sum(h is handler for h in get_dispatcher().span_handlers) == 1
    with observer.request("/query") as request:
        assert llama_index(use_async).retrieve(QUESTION)
    # retrieve and _retrieve, get_query_embedding and _get_query_embedding: one stage per call
    assert sorted(s.name for s in request.state.stages) == ["embed", "retrieve", "retrieve_bm25", "retrieve_dense"]
    assert counts(observer) == {"embed": 1, "retrieve": 1, "retrieve_bm25": 1, "retrieve_dense": 1}
    assert handler.open_spans == {} and handler.completed_spans == []
    # sync: the thread carries the innermost stage; async: the sub-retrievers run on an event loop the fusion
    # starts, where no stage renames the thread, so it keeps the fusion's name
    assert llama_index.seen == [stage_comm("retrieve" if use_async else "embed")]
    rh.llama_index.disable()
    assert handler not in get_dispatcher().span_handlers


def test_llama_index_a_failing_retriever_is_the_failed_stage(observer, llama_index):
    rh.llama_index.enable(observer)
    with pytest.raises(RuntimeError, match="keyword index down"):
        with observer.request("/query"):
            llama_index(broken=True).retrieve(QUESTION)
    # The keyword retriever (bm25 by its name) failed first, inside the fusion: it is the request's failed stage.
    assert stage_errors(observer) == {"retrieve_bm25": 1}
    assert counts(observer, "error") == {"retrieve_bm25": 1}
    assert counts(observer) == {"embed": 1, "retrieve": 1, "retrieve_dense": 1}
    assert unmapped(observer) == 0


def test_llama_index_a_retriever_inside_one_of_its_kind_counts_once(observer, llama_index):
    from llama_index.core.base.base_retriever import BaseRetriever

    class DenseWrapperRetriever(BaseRetriever):
        def _retrieve(self, query_bundle):
            return llama_index.index.as_retriever(similarity_top_k=3).retrieve(query_bundle)

    rh.llama_index.enable(observer)
    with observer.request("/query") as request:
        assert DenseWrapperRetriever().retrieve(QUESTION)
    assert [s.name for s in request.state.stages] == ["embed", "retrieve_dense"]


def test_llama_index_models_rerankers_and_tools(observer, llama_index):
    from llama_index.core.llms import MockLLM
    from llama_index.core.postprocessor.types import BaseNodePostprocessor
    from llama_index.core.schema import NodeWithScore, TextNode
    from llama_index.core.tools import FunctionTool

    class TinyRerank(BaseNodePostprocessor):
        def _postprocess_nodes(self, nodes, query_bundle=None):
            return sorted(nodes, key=lambda n: -(n.score or 0))

    class KeepAll(BaseNodePostprocessor):
        def _postprocess_nodes(self, nodes, query_bundle=None):
            return nodes

    rh.llama_index.enable(observer)
    nodes = [NodeWithScore(node=TextNode(text=text), score=float(i)) for i, text in CORPUS[:3]]
    with observer.request("/query") as request:
        MockLLM(max_tokens=4).complete("hello")
        TinyRerank().postprocess_nodes(nodes, query_str=QUESTION)
        KeepAll().postprocess_nodes(nodes, query_str=QUESTION)  # a postprocessor that is no reranker: structure
        FunctionTool.from_defaults(fn=lambda x: x * 2, name="double").call(x=2)
        asyncio.run(MockLLM(max_tokens=4).acomplete("hello"))
    assert [s.name for s in request.state.stages] == ["generate", "rerank", "tool", "generate"]


def test_llama_index_records_nothing_without_an_observer(no_default, llama_index):
    rh.llama_index.enable()
    assert llama_index().retrieve(QUESTION)
    assert counts(no_default) == {} and llama_index.seen == [get_name()]


# -- LangChain --------------------------------------------------------------------------------------------------

@pytest.fixture
def langchain():
    """LangChain's own components over the corpus: FAISS on a fake embedding, BM25, the ensemble."""
    pytest.importorskip("langchain_classic")
    pytest.importorskip("langchain_community")
    from langchain_classic.retrievers import EnsembleRetriever
    from langchain_community.retrievers import BM25Retriever
    from langchain_community.vectorstores import FAISS
    from langchain_core.documents import Document
    from langchain_core.embeddings import Embeddings
    from langchain_core.retrievers import BaseRetriever

    seen: list[bytes] = []

    class FakeEmbeddings(Embeddings):
        def embed_documents(self, texts: list[str]) -> list[list[float]]:
            return [vector(text) for text in texts]

        def embed_query(self, text: str) -> list[float]:
            seen.append(get_name())
            return vector(text)

    class KeywordRetriever(BaseRetriever):
        """A retriever of the bm25 kind that runs the BM25 retriever as its child run (or fails)."""

        inner: BaseRetriever
        fail: bool = False

        def _get_relevant_documents(self, query, *, run_manager):
            if self.fail:
                raise RuntimeError("keyword index down")
            return self.inner.invoke(query, config={"callbacks": run_manager.get_child()})

    docs = [Document(id=i, page_content=text, metadata={"id": i}) for i, text in CORPUS]
    dense = FAISS.from_documents(docs, FakeEmbeddings()).as_retriever(search_kwargs={"k": 5})
    keyword = KeywordRetriever(inner=BM25Retriever.from_documents(docs, k=5))

    def ensemble(fail: bool = False):
        keyword.fail = fail
        return EnsembleRetriever(retrievers=[dense, keyword], weights=[0.5, 0.5], id_key="id")

    ensemble.seen, ensemble.dense, ensemble.keyword = seen, dense, keyword
    return ensemble


def test_langchain_runs_are_stages_sync_and_async(observer, langchain):
    handler = rh.langchain.callback_handler(observer)
    config = {"callbacks": [handler]}
    with observer.request("/query") as request:
        assert langchain().invoke(QUESTION, config=config)
    # The ensemble runs its retrievers one after the other, in this thread; the KeywordRetriever's own BM25
    # retriever, a stage of its kind inside it, counts once.
    assert sorted(s.name for s in request.state.stages) == ["retrieve", "retrieve_bm25", "retrieve_dense"]
    assert langchain.seen == [stage_comm("retrieve_dense")]

    async def serve():
        async with observer.request("/query") as request:
            assert await langchain().ainvoke(QUESTION, config=config)
            return request, get_name()

    request, loop_name = asyncio.run(serve())
    # Side by side on the loop (the handler runs inline there): every stage lands in the request, none renames it
    assert sorted(s.name for s in request.state.stages) == ["retrieve", "retrieve_bm25", "retrieve_dense"]
    assert not loop_name.startswith(b"rh:")
    assert counts(observer) == {"retrieve": 2, "retrieve_bm25": 2, "retrieve_dense": 2}
    assert handler._runs == {} and unmapped(observer) == 0


def test_langchain_runs_in_worker_threads_land_in_the_request(observer, langchain):
    from langchain_core.runnables import RunnableParallel

    both = RunnableParallel(dense=langchain.dense, keyword=langchain.keyword)  # a thread pool, in sync mode
    with observer.request("/query") as request:
        both.invoke(QUESTION, config={"callbacks": [rh.langchain.callback_handler(observer)]})
    assert sorted(s.name for s in request.state.stages) == ["retrieve_bm25", "retrieve_dense"]


def test_langchain_a_failing_retriever_is_the_failed_stage(observer, langchain):
    with pytest.raises(RuntimeError, match="keyword index down"):
        with observer.request("/query"):
            langchain(fail=True).invoke(QUESTION, config={"callbacks": [rh.langchain.callback_handler(observer)]})
    assert stage_errors(observer) == {"retrieve_bm25": 1}
    assert counts(observer, "error") == {"retrieve_bm25": 1}


def test_langchain_models_and_tools_and_the_global_hook(observer, langchain):
    from langchain_core.language_models.fake import FakeListLLM
    from langchain_core.language_models.fake_chat_models import FakeListChatModel
    from langchain_core.prompts import PromptTemplate
    from langchain_core.tools import tool

    @tool
    def double(x: int) -> int:
        """Twice x."""
        return 2 * x

    handler = rh.langchain.enable(observer)
    assert rh.langchain.enable(observer) is handler
    try:
        with observer.request("/query") as request:
            (PromptTemplate.from_template("{q}") | FakeListLLM(responses=["yes"])).invoke({"q": QUESTION})
            FakeListChatModel(responses=["yes"]).invoke("hi", config={"callbacks": [handler]})  # not added twice
            double.invoke({"x": 2})
            langchain().invoke(QUESTION)
        assert [s.name for s in request.state.stages] == ["generate", "generate", "tool", "retrieve_dense",
                                                          "retrieve_bm25", "retrieve"]
    finally:
        rh.langchain.disable()
    with observer.request("/query") as request:
        langchain().invoke(QUESTION)
    assert request.state.stages == []


def test_langchain_records_nothing_without_an_observer(no_default, langchain):
    assert langchain().invoke(QUESTION, config={"callbacks": [rh.langchain.callback_handler()]})
    assert counts(no_default) == {} and langchain.seen == [get_name()]
