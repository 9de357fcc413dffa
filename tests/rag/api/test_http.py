"""The HTTP API over real sockets: a real uvicorn on loopback serving a real SciFact-subset index.

Covers the response contract of ``/v1/query`` and ``/v1/query/stream`` (citations, stage timings,
answer markers), the probes and OpenAPI, and that bad input is always a 4xx with a JSON reason
that names what was wrong, never a 500.
"""

from __future__ import annotations

import json
import random
import re

import httpx
import pytest

from rag.api.app import create_app
from stack.servers import BackgroundServer
from rag.index.store import read_manifest
from rag.stages import DEFAULT_STAGES, STAGES

QUERY = "0-dimensional biomaterials lack inductive properties."
MARKER = re.compile(r" \[(\d+)\](?= |$)")  # the generator writes "<sentence> [n]" joined by spaces


@pytest.fixture(scope="module")
def server_url(settings, subset_index):
    with BackgroundServer(create_app(settings, subset_index)) as url:
        yield url


@pytest.fixture(scope="module")
def client(server_url):
    with httpx.Client(base_url=server_url, timeout=60) as c:
        yield c


def ask(client, **body) -> dict:
    response = client.post("/v1/query", json={"query": QUERY, **body})
    assert response.status_code == 200, response.text
    return response.json()


def split_answer(answer: str) -> list[tuple[str, int]]:
    """``[(sentence, n), ...]`` from ``"s1 [1] s2 [3]"``."""
    parts, pos = [], 0
    for m in MARKER.finditer(answer):
        parts.append((answer[pos:m.start()].strip(), int(m.group(1))))
        pos = m.end()
    assert answer[pos:].strip() == "", f"text after the last [n] marker: {answer[pos:]!r}"
    return parts


def parse_sse(text: str) -> list[tuple[str, object]]:
    events = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        fields = dict(line.split(": ", 1) for line in block.splitlines())
        events.append((fields["event"], json.loads(fields["data"])))
    return events


def assert_error(response: httpx.Response, status: int, *needles: str, error: str | None = None) -> dict:
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json"), response.headers
    body = response.json()
    assert isinstance(body, dict) and isinstance(body.get("error"), str) and body["error"], body
    assert isinstance(body.get("reason"), str) and len(body["reason"]) > 5, body
    if error:
        assert body["error"] == error, body
    for needle in needles:
        assert needle.lower() in body["reason"].lower(), (needle, body["reason"])
    return body


# --------------------------------------------------------------------------------------- happy path


def test_query_response_contract(client):
    data = ask(client)
    assert data["generator"] == "extractive"
    citations = data["citations"]
    assert len(citations) == 5  # server.default_top_k
    assert [c["number"] for c in citations] == list(range(1, len(citations) + 1))
    for c in citations:
        assert c["doc_id"] and isinstance(c["title"], str) and c["text"].strip()
        assert 0 <= c["chunk_start"] < c["chunk_end"]
        assert isinstance(c["score"], float)
    scores = [c["score"] for c in citations]
    assert scores == sorted(scores, reverse=True), scores

    names = [s["name"] for s in data["stages"]]
    # queue: admission; the router decides per question whether the reranker (and, for an entity, the graph) runs
    assert names == [s for s in STAGES if s in names], "in the stage table's order"
    assert {"queue", *DEFAULT_STAGES} - {"rerank"} <= set(names) <= {"queue", *DEFAULT_STAGES, "retrieve_graph"}
    assert set(names) <= set(STAGES)
    assert all(s["ms"] >= 0 for s in data["stages"])

    sentences = split_answer(data["answer"])
    assert sentences, data["answer"]
    for sentence, n in sentences:
        assert 1 <= n <= len(citations), (n, data["answer"])
        assert sentence and sentence in citations[n - 1]["text"], (sentence, n)


def test_every_marker_refers_to_a_citation(client):
    data = ask(client, top_k=2)
    numbers = {c["number"] for c in data["citations"]}
    markers = {int(n) for n in re.findall(r"\[(\d+)\]", data["answer"])}
    assert markers and markers <= numbers, (markers, numbers)


@pytest.mark.parametrize("top_k", [1, 3, 12])
def test_top_k_is_respected(client, top_k):
    assert len(ask(client, top_k=top_k)["citations"]) == top_k


def test_single_retrievers_skip_the_other_stages(client):
    # reranking is on by default: it reads the query's token states, so BM25 alone still runs the embed stage
    bm25 = [s["name"] for s in ask(client, retrievers=["bm25"])["stages"]]
    assert bm25 == ["queue", "embed", "retrieve_bm25", "rerank", "generate"]
    dense = [s["name"] for s in ask(client, retrievers=["dense"])["stages"]]
    assert dense == ["queue", "embed", "retrieve_dense", "rerank", "generate"]
    both = [s["name"] for s in ask(client, retrievers=["bm25", "dense"])["stages"]]
    assert "fuse" in both and "embed" in both


def test_query_at_the_length_limit_is_accepted(client):
    text = ("protein folding " * 200)[:2000]
    assert len(ask(client, query=text, top_k=1)["citations"]) == 1


def test_stream_events_match_the_plain_answer(client):
    body = {"query": QUERY, "top_k": 4}
    plain = client.post("/v1/query", json=body).json()
    response = client.post("/v1/query/stream", json=body)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(response.text)
    kinds = [kind for kind, _ in events]
    assert kinds[0] == "sources" and kinds[-1] == "done", kinds
    assert kinds[1:-1] and set(kinds[1:-1]) == {"answer"}, kinds

    sources = events[0][1]
    assert sources == plain["citations"]
    answers = [data for kind, data in events if kind == "answer"]
    assert " ".join(a["text"] for a in answers) == plain["answer"]
    for a in answers:
        suffix = f" [{a['citation']}]"
        assert a["text"].endswith(suffix), a
        assert a["text"][: -len(suffix)] in sources[a["citation"] - 1]["text"], a

    done = events[-1][1]
    assert done["generator"] == "extractive"
    assert [s["name"] for s in done["stages"]] == [s["name"] for s in plain["stages"]]
    assert all(s["name"] in STAGES and s["ms"] >= 0 for s in done["stages"])


def test_health_ready_and_openapi(client, subset_index):
    health = client.get("/healthz")
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200, ready.text
    manifest = read_manifest(subset_index)
    assert ready.json()["status"] == "ready"
    assert ready.json()["generation"] == manifest["generation"]
    assert ready.json()["chunks"] == manifest["counts"]["chunks"] > 0
    # which precision embeds the queries (chosen for this CPU) beside the one the index's chunks were embedded at
    embedding = ready.json()["embedding"]
    assert embedding["passages"] == manifest["model"]["precision"]
    assert embedding["queries"] in ("fp32", "int8", "int8-row")
    assert embedding["lone_query_threads"] >= 1  # the quiet case's threads, as timed or as set
    spec = client.get("/openapi.json")
    assert spec.status_code == 200
    paths = spec.json()["paths"]
    assert "post" in paths["/v1/query"] and "post" in paths["/v1/query/stream"]
    assert "/healthz" in paths and "/readyz" in paths


# --------------------------------------------------------------------------------------- bad input

BAD_BODIES = {
    "empty query": ({"query": ""}, 422, ["query", "empty"]),
    "whitespace query": ({"query": " \n\t  "}, 422, ["query", "empty"]),
    "query over the limit": ({"query": "x" * 2001}, 422, ["query", "2001", "2000"]),
    "missing query": ({"top_k": 3}, 422, ["query", "required"]),
    "query not a string": ({"query": 42}, 422, ["query", "string"]),
    "query null": ({"query": None}, 422, ["query"]),
    "top_k 0": ({"query": QUERY, "top_k": 0}, 422, ["top_k", "1"]),
    "top_k 101": ({"query": QUERY, "top_k": 101}, 422, ["top_k", "100"]),
    "top_k string": ({"query": QUERY, "top_k": "abc"}, 422, ["top_k", "integer"]),
    "top_k fraction": ({"query": QUERY, "top_k": 2.5}, 422, ["top_k"]),
    "top_k huge": ({"query": QUERY, "top_k": 10 ** 30}, 422, ["top_k"]),
    "unknown field": ({"query": QUERY, "topk": 3}, 422, ["topk", "unknown field"]),
    "unknown retriever": ({"query": QUERY, "retrievers": ["splade"]}, 422, ["retrievers", "dense", "bm25"]),
    "duplicate retrievers": ({"query": QUERY, "retrievers": ["bm25", "bm25"]}, 422, ["retrievers", "repeat"]),
    "empty retrievers": ({"query": QUERY, "retrievers": []}, 422, ["retrievers", "at least 1"]),
    "retrievers not a list": ({"query": QUERY, "retrievers": "dense"}, 422, ["retrievers"]),
    "array body": ([{"query": QUERY}], 422, ["body"]),
    "string body": ("what is a protein?", 422, ["body"]),
}


@pytest.mark.parametrize("path", ["/v1/query", "/v1/query/stream"])
@pytest.mark.parametrize("case", list(BAD_BODIES))
def test_bad_json_bodies_are_422_with_a_reason(client, path, case):
    body, status, needles = BAD_BODIES[case]
    assert_error(client.post(path, json=body), status, *needles, error="invalid_request")


RAW_BODIES = {
    "truncated JSON": (b'{"query": "tides', 400, "invalid_json", ["not valid json"]),
    "trailing comma": (b'{"query": "tides",}', 400, "invalid_json", ["not valid json"]),
    "not JSON at all": (b"query=tides", 400, "invalid_json", ["not valid json"]),
}


@pytest.mark.parametrize("case", list(RAW_BODIES))
def test_malformed_json_is_400_invalid_json(client, case):
    content, status, error, needles = RAW_BODIES[case]
    response = client.post("/v1/query", content=content, headers={"content-type": "application/json"})
    assert_error(response, status, *needles, error=error)


def test_invalid_utf8_is_a_4xx(client):
    response = client.post("/v1/query", content=b'{"query": "caf\xe9 \xff\xfe"}',
                           headers={"content-type": "application/json"})
    assert_error(response, 400)


def test_empty_body_is_a_4xx(client):
    response = client.post("/v1/query", content=b"", headers={"content-type": "application/json"})
    assert_error(response, 422, "body")


def test_non_json_content_type_is_a_4xx(client):
    response = client.post("/v1/query", content=json.dumps({"query": QUERY}).encode(),
                           headers={"content-type": "text/plain"})
    assert 400 <= response.status_code < 500
    assert_error(response, response.status_code)


def test_deeply_nested_json_is_a_4xx(client):
    depth = 20_000  # under max_body_bytes, deeper than Python's recursion limit
    response = client.post("/v1/query", content=b"[" * depth + b"]" * depth,
                           headers={"content-type": "application/json"})
    assert 400 <= response.status_code < 500, response.text
    assert_error(response, response.status_code)


@pytest.mark.parametrize("path", ["/v1/query", "/v1/query/stream"])
def test_lone_surrogate_in_query_is_422(client, path):
    """Valid JSON ("\\ud800" is a legal escape) that parses into text no encoder accepts: a request that parses
    but is invalid, so 422 naming the query (README: "422 for a request that parses but is invalid"). Serving
    it would mean repairing the caller's text behind their back, and an unpaired surrogate cannot be echoed."""
    response = client.post(path, content=b'{"query": "tides \\ud800"}', headers={"content-type": "application/json"})
    assert_error(response, 422, "query", "surrogate", error="invalid_request")


def oversized_body(limit: int) -> bytes:
    return json.dumps({"query": "a" * (limit + 100)}).encode()


def test_body_over_limit_with_content_length_is_413(client, settings):
    limit = settings.server.max_body_bytes
    response = client.post("/v1/query", content=oversized_body(limit), headers={"content-type": "application/json"})
    assert_error(response, 413, str(limit), error="body_too_large")


def test_body_over_limit_streamed_without_content_length_is_413(client, settings):
    limit = settings.server.max_body_bytes
    payload = oversized_body(limit)

    def chunks():
        for i in range(0, len(payload), 4096):
            yield payload[i:i + 4096]

    request = client.build_request("POST", "/v1/query", content=chunks(), headers={"content-type": "application/json"})
    assert "content-length" not in request.headers and request.headers.get("transfer-encoding") == "chunked"
    assert_error(client.send(request), 413, str(limit), error="body_too_large")


def test_streamed_body_under_limit_is_served(client):
    payload = json.dumps({"query": QUERY, "top_k": 2}).encode()
    request = client.build_request("POST", "/v1/query", content=iter([payload[:10], payload[10:]]),
                                   headers={"content-type": "application/json"})
    response = client.send(request)
    assert response.status_code == 200, response.text
    assert len(response.json()["citations"]) == 2


def test_wrong_method_and_unknown_route(client):
    assert_error(client.get("/v1/query"), 405, error="method_not_allowed")
    assert_error(client.put("/v1/query", json={"query": QUERY}), 405, error="method_not_allowed")
    assert_error(client.get("/v2/nothing-here"), 404, error="not_found")


def random_body(rng: random.Random) -> bytes:
    """Mostly-almost-right request bodies: wrong types, odd values, broken syntax, random bytes."""
    values = [None, True, False, 0, -1, 1, 100, 101, 1.5, -0.0, 1e308, "", " ", "x" * 3000, "tides", "\u0000",
              "é" * 10, [], ["dense"], ["bm25", "dense", "bm25"], ["DENSE"], [None], {}, {"query": "x"}]
    keys = ["query", "top_k", "retrievers", "Query", "", "stream", "k"]
    kind = rng.randrange(5)
    if kind == 0:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))
    body = {k: rng.choice(values) for k in rng.sample(keys, rng.randrange(0, 4))}
    text = json.dumps(body)
    if kind == 1:
        return text[: rng.randrange(len(text) + 1)].encode()  # truncated
    if kind == 2:
        return json.dumps(rng.choice(values)).encode()  # not an object (or a nested one)
    if kind == 3:
        i = rng.randrange(len(text) + 1)
        return (text[:i] + rng.choice(['"', "}", "{", ",", ":", "\\", "NaN", "\\ud800"]) + text[i:]).encode()
    return text.encode()


def test_random_malformed_bodies_never_500(client):
    rng = random.Random(20240601)
    for i in range(30):
        content = random_body(rng)
        path = "/v1/query/stream" if i % 3 == 0 else "/v1/query"
        response = client.post(path, content=content, headers={"content-type": "application/json"})
        assert response.status_code < 500, (content[:200], response.status_code, response.text[:300])
        if response.status_code >= 400:
            assert_error(response, response.status_code)
