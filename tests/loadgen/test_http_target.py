"""Any JSON HTTP API as the sweep's target: a plain Starlette app on loopback that is not ragheat, with a body shape
of its own ({"question", "options"} -> {"answer"}), loaded by the runner, the sweep and the ``ragheat bench``
command; and the flags that describe the request, parsed and refused."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import threading
import time

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from typer.testing import CliRunner

from loadgen.http_target import HttpTarget, TargetError
from loadgen.runner import closed_loop, open_loop, run
from loadgen.sweep import sweep_and_report

SKY, NO_ANSWER, NO_FIELD, BOOM = "Why is the sky blue?", "an unanswerable one", "a shapeless one", "boom"
TEMPLATE = '{"question": "", "options": {"k": 5}}'


class ForeignService:
    """``with ForeignService() as url:`` a Starlette app under uvicorn in a thread, on a free loopback port.

    ``POST|PUT /ask`` takes {"question", "options"} and answers {"answer": ...}: empty for NO_ANSWER, no field at all
    for NO_FIELD, a 500 for BOOM. ``POST /chat`` takes {"messages": [{"content"}]} and answers in the OpenAI chat
    shape. ``GET /api/v1/query`` stands in for a Prometheus that holds no ragheat series. ``received``: (body,
    headers) of every request to /ask and /chat."""

    def __init__(self) -> None:
        self.received: list[tuple[dict, dict]] = []

    async def ask(self, request: Request) -> JSONResponse:
        body = await request.json()
        self.received.append((body, dict(request.headers)))
        question = body.get("question")
        if question == BOOM:
            return JSONResponse({"detail": "boom"}, status_code=500)
        if question == NO_FIELD:
            return JSONResponse({"result": "x"})
        return JSONResponse({"answer": "" if question == NO_ANSWER else f"because: {question}"})

    async def chat(self, request: Request) -> JSONResponse:
        body = await request.json()
        self.received.append((body, dict(request.headers)))
        return JSONResponse({"choices": [{"message": {"content": body["messages"][0]["content"].upper()}}]})

    async def empty_prometheus(self, request: Request) -> JSONResponse:
        return JSONResponse({"status": "success", "data": {"resultType": "vector", "result": []}})

    def __enter__(self) -> str:
        app = Starlette(routes=[Route("/ask", self.ask, methods=["POST", "PUT"]),
                                Route("/chat", self.chat, methods=["POST"]),
                                Route("/api/v1/query", self.empty_prometheus, methods=["GET"])])
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "the foreign service did not start"
            time.sleep(0.01)
        return f"http://127.0.0.1:{sock.getsockname()[1]}"

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def service():
    foreign = ForeignService()
    with foreign as url:
        foreign.url = url
        yield foreign


def ask_target(**flags) -> HttpTarget:
    return HttpTarget.from_flags(**{"path": "/ask", "body": TEMPLATE, "query_field": "question",
                                    "expect_field": "answer", "headers": ["Authorization: Bearer x"], **flags})


# -- the flags ------------------------------------------------------------------------------------------------

def test_the_default_request_is_ragheats_own_body_byte_for_byte():
    target = HttpTarget.from_flags()
    assert (target.method, target.url("http://h:1/"), target.expect_field) == ("POST", "http://h:1/v1/query", None)
    assert target.body_for("q") == json.dumps({"query": "q", "top_k": 5}).encode()
    assert dict(target.request_headers()) == {"Content-Type": "application/json"}


def test_field_paths_reach_into_objects_and_lists(tmp_path):
    template = tmp_path / "chat.json"
    template.write_text('{"model": "m", "messages": [{"role": "user", "content": ""}]}')
    target = HttpTarget.from_flags(body=f"@{template}", query_field="messages.0.content",
                                   expect_field="choices.0.message.content",
                                   headers=["content-type: application/json; charset=utf-8", "X-Key:  k "])
    assert json.loads(target.body_for("hi")) == {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert target.request_headers().getall("Content-Type") == ["application/json; charset=utf-8"]
    assert target.request_headers()["x-key"] == "k"
    ok = {"choices": [{"message": {"content": "hello"}}]}
    assert target.failure(200, ok) is None and target.failure(404, ok) == "HTTP 404"
    assert target.failure(200, {"choices": []}) == "no choices.0.message.content in the response"
    assert target.failure(200, {"choices": [{"message": {"content": ""}}]}) == "choices.0.message.content empty"
    assert target.describe()["headers"] == ["content-type", "X-Key"]  # names only: values may be credentials


@pytest.mark.parametrize("flags, message", [
    ({"body": "{question: 1}"}, "--body is not JSON"),
    ({"body": "@/nonexistent/body.json"}, "--body @/nonexistent/body.json: cannot read the file"),
    ({"body": '"just text"'}, "--body: give a JSON object"),
    ({"body": TEMPLATE, "query_field": "input.text"}, "--query-field 'input.text': the --body template has no"),
    ({"body": '{"messages": []}', "query_field": "messages.0.content"}, "--query-field 'messages.0.content'"),
    ({"query_field": "question"},
     "--query-field 'question': the --body template has no such field (its fields: query, top_k)"),
    ({"expect_field": "answer."}, "--expect-field 'answer.'"),
    ({"headers": ["Authorization Bearer x"]}, "--header 'Authorization Bearer x': give 'Name: value'"),
    ({"headers": ["Bad Name: x"]}, "--header 'Bad Name: x'"),
    ({"method": "GET"}, "--method 'GET'"),
    ({"path": "ask"}, "--path 'ask'"),
])
def test_a_bad_flag_is_refused_naming_it(flags, message):
    with pytest.raises(TargetError, match="^" + re.escape(message)):
        HttpTarget.from_flags(**flags)


# -- load against the foreign service ---------------------------------------------------------------------------

def test_the_open_loop_puts_each_query_at_its_field_and_counts_empty_answers_as_errors(service):
    queries = [SKY, NO_ANSWER, NO_FIELD, BOOM]
    step = run(open_loop(service.url + "/ask", queries, 60, 1.0, 0.0, seed=1, target=ask_target()))
    bodies = [body for body, _ in service.received]
    assert step.requests == len(bodies) > 30
    assert all(body["options"] == {"k": 5} and set(body) == {"question", "options"} for body in bodies)
    sent = [body["question"] for body in bodies]
    assert {q: sent.count(q) for q in queries} == {q: len(range(i, len(sent), 4)) for i, q in enumerate(queries)}
    headers = [h for _, h in service.received]
    assert all(h["authorization"] == "Bearer x" and h["content-type"] == "application/json" for h in headers)
    assert step.error_reasons == {reason: sent.count(q) for q, reason in
                                  ((NO_ANSWER, "answer empty"), (NO_FIELD, "no answer in the response"),
                                   (BOOM, "HTTP 500"))}
    assert step.errors == len(sent) - sent.count(SKY) and step.shed == 0
    assert step.latency_ms["p50"] is not None and step.stages_ms == {}  # no ragheat stage timings there


def test_the_closed_loop_sends_a_chat_body_with_put_or_post(service):
    target = HttpTarget.from_flags(path="/chat", body='{"messages": [{"role": "user", "content": ""}]}',
                                   query_field="messages.0.content", expect_field="choices.0.message.content")
    step = run(closed_loop(service.url + "/chat", ["hi there"], 2, 0.5, 0.0, target=target))
    assert step.requests > 5 and step.errors == 0, step.error_reasons
    assert {body["messages"][0]["content"] for body, _ in service.received} == {"hi there"}
    put = ask_target(method="put")
    step = run(closed_loop(service.url + "/ask", [SKY], 1, 0.3, 0.0, target=put))
    assert put.method == "PUT" and step.requests > 0 and step.errors == 0


def test_a_sweep_against_it_finds_the_knee_keeps_cpu_per_answer_and_says_what_it_lacks(service, tmp_path):
    results, path, report = sweep_and_report(
        tmp_path, service.url, [SKY], mode="open", levels=[10, 20], duration_s=1.0, warmup_s=0.2, slo_ms=500.0,
        max_error_rate=0.001, prometheus_url=service.url, server_pids=[os.getpid()], target=ask_target())
    assert results["knee_qps"] == 20 and [s["errors"] for s in results["steps"]] == [0, 0]
    for step in results["steps"]:
        assert 0 < step["latency_ms"]["p50"] <= step["latency_ms"]["p99"] < 500
        assert step["stages_ms"] == {} and step["stages_source"] == "responses"
        assert step["cpu_ms_per_answer"]["answers"] == step["requests"]  # the service runs in this process
    assert results["target"] == {"path": "/ask", "method": "POST", "body": json.loads(TEMPLATE),
                                 "query_field": "question", "expect_field": "answer", "headers": ["Authorization"]}
    assert "Bearer x" not in path.read_text()
    notes = results["notes"]
    assert len(notes) == 2 and "no ragheat_stage_duration_seconds samples" in notes[0]
    assert "no per-stage timings" in notes[1] and "end-to-end latency only" in notes[1]
    page = report.read_text()
    assert f"POST {service.url}/ask" in page and page.count("Note: ") == 2
    assert (tmp_path / "heatmap_time_stage.png").is_file() and (tmp_path / "latency_vs_load.png").is_file()


def test_the_bench_command_loads_it(service, tmp_path):
    from ragheat.cli import app

    (tmp_path / "body.json").write_text(TEMPLATE)
    with contextlib.chdir(tmp_path):
        done = CliRunner(env={"COLUMNS": "300", "NO_COLOR": "1"}).invoke(app, [
            "bench", "--url", service.url, "--path", "/ask", "--body", "@body.json", "--query-field", "question",
            "--expect-field", "answer", "--header", "Authorization: Bearer x", "--header", "X-Tenant: t1",
            "--rates", "10", "--duration", "0.6", "--warmup", "0.1", "--out", "out"])
    assert done.exit_code == 0, done.output
    assert "knee: 10 req/s" in done.output and f"POST {service.url}/ask" in done.output
    assert done.output.count("note: no per-stage timings") == 1
    assert all(h["x-tenant"] == "t1" and h["authorization"] == "Bearer x" for _, h in service.received)
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["target"]["headers"] == ["Authorization", "X-Tenant"] and results["steps"][0]["requests"] > 0
