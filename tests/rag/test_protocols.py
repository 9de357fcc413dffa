"""The typed seams: the pipeline's stages are typed by ``rag.protocols`` and the real implementations satisfy
them; ``describe()``/``close()`` speak for the pipeline; ``RequestRecord`` says which stage ended a request."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest

from rag import protocols
from rag.errors import StageError
from rag.generation.llm import OpenAIStreamGenerator
from rag.generation.vllm_engine import InProcessVllmGenerator
from rag.pipeline import RagPipeline
from rag.types import QueryResult, RequestRecord, StageTiming

STAGE_ATTRIBUTES = {"embedder": "Embedder", "retrievers": "Retriever", "fuser": "Fuser", "generator": "Generator",
                    "llm": "StreamingGenerator", "support": "SupportCheck", "graph": "GraphStore",
                    "linker": "EntityLinker", "graph_retriever": "GraphRetriever", "reranker": "Reranker",
                    "cache": "AnswerCache", "router": "Router"}


def test_every_stage_attribute_is_declared_by_its_protocol(settings, tmp_path):
    fresh = RagPipeline(settings, tmp_path)  # cheap: nothing is loaded before warm_up()
    for attribute, protocol in STAGE_ATTRIBUTES.items():
        assert hasattr(fresh, attribute), attribute
        assert protocol in dir(protocols), protocol
    source = Path(protocols.__file__).with_name("pipeline.py").read_text()
    for attribute, protocol in STAGE_ATTRIBUTES.items():
        assert f"self.{attribute}: " in source and protocol in source.split(f"self.{attribute}: ", 1)[1].split("=")[0]


def test_the_warmed_up_stages_satisfy_their_protocols(pipeline):
    assert isinstance(pipeline.embedder, protocols.Embedder)
    assert all(isinstance(r, protocols.Retriever) for r in pipeline.retrievers.values())
    assert isinstance(pipeline.fuser, protocols.Fuser)
    assert isinstance(pipeline.generator, protocols.Generator)
    assert isinstance(pipeline.support, protocols.SupportCheck)
    assert isinstance(pipeline.router, protocols.Router)
    if pipeline.graph is not None:  # the SciFact subset's index is built with its knowledge graph (graph.enabled)
        assert isinstance(pipeline.graph, protocols.GraphStore)
        assert isinstance(pipeline.linker, protocols.EntityLinker)
        assert isinstance(pipeline.graph_retriever, protocols.GraphRetriever)
    assert isinstance(pipeline.reranker, protocols.Reranker)  # rerank.enabled is the default
    assert pipeline.llm is None and pipeline.cache is None


@pytest.mark.parametrize("make", [OpenAIStreamGenerator, InProcessVllmGenerator])
def test_both_language_model_generators_are_streaming_generators(settings, make):
    generation = settings.generation.model_copy(update={"model": "m"})
    assert isinstance(make(generation), protocols.StreamingGenerator)


def test_a_class_missing_a_method_is_not_a_streaming_generator():
    class NoStream:
        name, metrics_dir = "x", None

        def warm_up(self) -> None: ...

        def close(self) -> None: ...

    assert not isinstance(NoStream(), protocols.StreamingGenerator)


def test_describe_names_what_is_served_and_close_is_safe(settings, subset_index):
    pipeline = RagPipeline(settings, subset_index)
    with pytest.raises(RuntimeError, match="warm_up"):
        pipeline.describe()
    pipeline.warm_up()
    described = pipeline.describe()
    manifest = pipeline.index.manifest
    assert (described.corpus, described.chunks, described.generation) == (
        manifest["corpus"]["name"], manifest["counts"]["chunks"], manifest["generation"])
    assert described.embedding_model == manifest["model"]["name"] and described.generator == "extractive"
    assert described.engine_metrics_dir is None
    pipeline.close()
    pipeline.close()  # idempotent


def test_a_request_record_names_the_stage_that_ended_the_request():
    timings = [StageTiming("embed", 0.001), StageTiming("retrieve_dense", 0.002)]
    failure = StageError("retrieve_dense", RuntimeError("index gone"))
    failure.stages = timings
    record = RequestRecord("q", 5, error=failure)
    assert record.failed_stage == "retrieve_dense" and record.stages == timings
    answered = RequestRecord("q", 5, result=QueryResult("a", "extractive", [], timings[:1]))
    assert answered.failed_stage is None and answered.stages == timings[:1]
    assert RequestRecord().stages == [] and RequestRecord(error=ValueError("x")).failed_stage is None


def test_protocol_signatures_use_the_shared_types():
    hints = typing.get_type_hints(protocols.Reranker.rerank)
    assert hints["return"].__name__ == "RerankResult"
    assert typing.get_type_hints(protocols.GraphRetriever.retrieve)["return"].__name__ == "RetrievalResult"
    assert typing.get_type_hints(protocols.EntityLinker.link)["return"].__name__ == "LinkedEntities"
    assert typing.get_type_hints(protocols.Router.route)["return"].__name__ == "Route"
    assert typing.get_type_hints(protocols.Router.route)["linked"].__name__ == "LinkedEntities"
