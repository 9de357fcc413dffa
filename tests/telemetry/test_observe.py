"""The instrumentation library for services ragheat did not write: a plain FastAPI app, its stages, its scrape."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import generate_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

import ragheat.observe as rh
from rag.threadnames import get_name
from telemetry.metrics import STAGE_LABELS

STAGE_H, REQUEST_H = "ragheat_stage_duration_seconds", "ragheat_request_duration_seconds"


def samples(registry_text: str, name: str) -> list:
    parse = openmetrics_families if registry_text.rstrip().endswith("# EOF") else text_string_to_metric_families
    return [s for family in parse(registry_text) for s in family.samples if s.name == name]


def count(text: str, stage: str, outcome: str = "ok") -> float:
    return sum(s.value for s in samples(text, STAGE_H + "_count")
               if s.labels["stage"] == stage and s.labels["outcome"] == outcome)


@pytest.fixture
def observer():
    exporter = InMemorySpanExporter()
    observer = rh.Observer(service="plain-rag", routes=("/query", "/stream"), span_exporter=exporter,
                           settings=rh.TelemetrySettings(trace_sample_ratio=1.0, otlp="off"), environ={})
    observer.exporter = exporter
    yield observer.make_default()
    observer.close()


def plain_app(observer, seen: list) -> TestClient:
    """A RAG service as its authors would write it, plus the library's few lines."""
    app = FastAPI()

    @rh.stage("embedding")
    def embed(text: str) -> list[float]:
        seen.append(("embed", get_name()))
        time.sleep(0.002)
        return [float(len(text))]

    @rh.stage("llm")
    async def generate(passages: list[str]) -> str:
        seen.append(("generate", get_name()))
        await asyncio.sleep(0.002)
        seen.append(("generate", get_name()))
        return passages[0]

    @app.post("/query")
    async def query(body: dict):
        embed(body["question"])
        async with rh.stage("BM25Retriever"):
            seen.append(("bm25", get_name()))
            await asyncio.sleep(0.001)
        with rh.stage(body.get("step", "post-process")):
            pass
        if body.get("fail"):
            with rh.stage("rerank"):
                raise RuntimeError("reranker down")
        if body.get("recover"):
            try:
                with rh.stage("rerank"):
                    raise RuntimeError("a handled hiccup")
            except RuntimeError:
                pass
        return {"answer": await generate(["passage one"])}

    @app.post("/stream")
    async def stream(body: dict):
        async def chunks():
            for word in ("a", "b"):
                async with rh.stage("generate"):
                    await asyncio.sleep(0.001)
                yield word
        return StreamingResponse(chunks())

    @app.get("/health")
    async def health():
        return {"ok": True}

    rh.instrument(app, observer)
    return TestClient(app, raise_server_exceptions=False)


def scrape(client: TestClient, openmetrics: bool = False) -> str:
    headers = {"Accept": "application/openmetrics-text"} if openmetrics else {}
    return client.get("/metrics", headers=headers).text


def test_stages_of_a_plain_fastapi_app_land_in_ragheats_histograms(observer):
    client = plain_app(observer, [])
    for _ in range(3):
        assert client.post("/query", json={"question": "q"}).json() == {"answer": "passage one"}
    assert client.get("/health").status_code == 200  # an undeclared route is not timed
    text = scrape(client)
    # Aliases and names map onto the closed set; an unknown name is recorded as other and counted.
    for stage in ("embed", "retrieve_bm25", "generate", "other"):
        assert count(text, stage) == 3, stage
    assert samples(text, "ragheat_unmapped_stage_names_total")[0].value == 3
    requests = samples(text, REQUEST_H + "_count")
    assert {s.labels["route"] for s in requests if s.value} == {"/query"}
    assert all(s.labels["qps_bucket"] in observer.telemetry.buckets.labels for s in requests)
    assert sum(s.value for s in samples(text, "ragheat_requests_total") if s.labels["status_class"] == "2xx") == 3


def test_exemplars_point_at_the_exported_traces(observer):
    client = plain_app(observer, [])
    client.post("/query", json={"question": "q"})
    exemplars = [s.exemplar for s in samples(scrape(client, openmetrics=True), STAGE_H + "_bucket") if s.exemplar]
    observer.telemetry.force_flush()
    spans = observer.exporter.get_finished_spans()
    trace_ids = {format(span.context.trace_id, "032x") for span in spans}
    assert exemplars and {e.labels["trace_id"] for e in exemplars} <= trace_ids
    assert {"POST /query", "retrieval bm25", "embeddings", "generate"} <= {span.name for span in spans}
    assert all(span.resource.attributes["service.name"] == "plain-rag" for span in spans)


def test_a_stage_that_fails_the_request_is_named_and_a_handled_one_is_not(observer):
    client = plain_app(observer, [])
    assert client.post("/query", json={"question": "q", "fail": True}).status_code == 500
    assert client.post("/query", json={"question": "q", "recover": True}).status_code == 200
    text = scrape(client)
    assert count(text, "rerank", "error") == 1 and count(text, "rerank", "ok") == 1
    errors = {s.labels["stage"]: s.value for s in samples(text, "ragheat_stage_errors_total")}
    assert errors["rerank"] == 1 and sum(errors.values()) == 1
    assert {s.labels["status_class"]: s.value for s in samples(text, "ragheat_requests_total")
            if s.labels["route"] == "/query"} == {"2xx": 1, "4xx": 0, "5xx": 1}


def test_no_caller_chosen_name_creates_a_series(observer):
    client = plain_app(observer, [])
    for i in range(40):
        client.post("/query", json={"question": "q", "step": f"step-{i}-{'x' * i}"})
    stages = {s.labels["stage"] for s in samples(scrape(client), STAGE_H + "_count")}
    assert stages <= set(STAGE_LABELS) and "other" in stages
    assert samples(scrape(client), "ragheat_unmapped_stage_names_total")[0].value == 40


def test_threads_are_named_for_the_probes_and_the_event_loop_keeps_its_own_name(observer):
    seen: list = []
    client = plain_app(observer, seen)
    client.post("/query", json={"question": "q"})
    names = dict.fromkeys(stage for stage, _ in seen)
    assert set(names) == {"embed", "bm25", "generate"}
    # A sync function is all its thread's; each step of a decorated coroutine is renamed; a block on the loop may
    # await other tasks, so the loop keeps its own name there.
    assert [name for stage, name in seen if stage == "embed"] == [b"rh:embed"]
    assert [name for stage, name in seen if stage == "generate"] == [b"rh:generate", b"rh:generate"]
    assert [name for stage, name in seen if stage == "bm25"] == [b"rh:event_loop"]


def test_a_decorated_coroutine_gives_the_thread_back_between_its_steps():
    observer = rh.Observer(service="steps", settings=rh.TelemetrySettings(tracing=False), environ={})
    seen = []

    @observer.stage("retrieve_dense")
    async def slow_search():
        seen.append(("search", get_name()))
        await asyncio.sleep(0.01)
        seen.append(("search", get_name()))

    async def other_task():
        await asyncio.sleep(0.003)
        seen.append(("other", get_name()))

    async def main():
        from telemetry.observe import EVENT_LOOP_COMM, _rename

        _rename(EVENT_LOOP_COMM)
        with observer.request():
            await asyncio.gather(slow_search(), other_task())

    threading.Thread(target=asyncio.run, args=(main(),)).start()
    deadline = time.monotonic() + 5
    while len(seen) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert seen == [("search", b"rh:retrieve_den"), ("other", b"rh:event_loop"), ("search", b"rh:retrieve_den")]


def test_a_streamed_response_is_recorded_when_its_last_chunk_goes_out(observer):
    client = plain_app(observer, [])
    assert client.post("/stream", json={}).text == "ab"
    text = scrape(client)
    assert count(text, "generate") == 2
    assert sum(s.value for s in samples(text, REQUEST_H + "_count") if s.labels["route"] == "/stream") == 1


def test_the_function_form_for_other_servers_and_stages_outside_any_request(observer):
    with observer.request("/query") as request:
        with rh.stage("rerank"):
            pass
        request.status = 404

    async def handler():
        async with observer.request("/stream"):
            async with rh.stage("embed"):
                pass
    asyncio.run(handler())
    with rh.stage("tool"):  # a background job's stage: recorded at the load of the moment
        pass
    with pytest.raises(RuntimeError):
        with observer.request("/query"):
            raise RuntimeError("the handler failed")
    text = generate_latest(observer.registry).decode()
    assert count(text, "rerank") == 1 and count(text, "embed") == 1 and count(text, "tool") == 1
    classes = {(s.labels["route"], s.labels["status_class"]): s.value for s in samples(text, "ragheat_requests_total")}
    assert classes[("/query", "4xx")] == 1 and classes[("/stream", "2xx")] == 1 and classes[("/query", "5xx")] == 1


def test_one_scope_shared_by_many_threads_keeps_each_threads_frame(observer):
    shared = rh.stage("retrieve_dense")

    def work(delay: float):
        with observer.request("/query"):
            for _ in range(20):
                with shared:
                    time.sleep(delay)

    threads = [threading.Thread(target=work, args=(0.0005 * (i % 3),)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    text = generate_latest(observer.registry).decode()
    assert count(text, "retrieve_dense") == 120
    assert sum(s.value for s in samples(text, REQUEST_H + "_count")) == 6


def test_misuse_is_refused_with_the_reason(observer):
    with pytest.raises(ValueError, match="closed label set"):
        observer.request("/v1/other")
    with pytest.raises(ValueError, match="starting with"):
        rh.Observer(routes=("query",))
    with pytest.raises(TypeError, match="not generators"):
        @rh.stage("retrieve")
        def results():
            yield 1
    with pytest.raises(ValueError, match="stage labels"):
        rh.Observer(aliases={"search": "vector-search"})


def test_settings_come_from_the_environment_when_not_given():
    observer = rh.Observer(service="from-env", environ={"RAGHEAT_TELEMETRY__QPS_EDGES": "[2, 20]",
                                                         "RAGHEAT_TELEMETRY__TRACE_SAMPLE_RATIO": "0.5"})
    assert list(observer.telemetry.buckets.labels) == ["0-2", "2-20", "20+"]
    assert observer.telemetry.settings.trace_sample_ratio == 0.5
    with pytest.raises(ValueError, match="RAGHEAT_TELEMETRY__TRACE_SAMPLE_RATIO"):
        rh.Observer(environ={"RAGHEAT_TELEMETRY__TRACE_SAMPLE_RATIO": "2"})


def test_a_stage_opened_and_closed_by_callbacks(observer):
    with observer.request("/query"):
        outer = observer.open_stage("EnsembleRetriever")
        inner = observer.open_stage("BM25Retriever")
        assert get_name() == b"rh:retrieve_bm2"
        inner.close()
        assert get_name() == b"rh:retrieve"
        failed = observer.open_stage("CohereRerank")
        failed.close(RuntimeError("reranker down"))
        failed.close()  # a second close records nothing
        outer.close()
    text = generate_latest(observer.registry).decode()
    assert count(text, "retrieve") == 1 and count(text, "retrieve_bm25") == 1 and count(text, "rerank") == 1


def test_open_stages_close_in_any_order_and_after_their_request(observer):
    base = get_name()
    with observer.request("/query"):
        embed, rerank = observer.open_stage("embed"), observer.open_stage("rerank")
        embed.close()
        assert get_name() == b"rh:rerank"  # the innermost stage still open names the thread
        rerank.close()
        assert get_name() == base
        late = observer.open_stage("generate")
    late.close()  # its request ended first (a stream read later): recorded on its own
    assert rh.current_observer() is observer
    text = generate_latest(observer.registry).decode()
    assert count(text, "embed") == 1 and count(text, "rerank") == 1 and count(text, "generate") == 1
