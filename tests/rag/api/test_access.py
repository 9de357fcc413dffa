"""API keys, the per-key rate limit and refusals counted by reason (``rag.api.access``), on a real server.

The server runs as ``ragheat serve`` runs it (``ragheat.service`` + ``Service.uvicorn_config``), so refusals made by the
connection layer (431, 408) are counted too. Secrets and query text are searched for in every log record and span.
"""

from __future__ import annotations

import socket
import time

import httpx
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import ValidationError
from typer.testing import CliRunner

from api_testkit import KEYS, LogCapture, metric_values, serve_live, span_text, with_sections
from rag.api.access import (REJECTION_REASONS, AccessPolicy, KeyRing, Rejections, TokenBucketLimit, key_line,
                            presented_key, read_keys_file)
from rag.childproc import free_port
from rag.errors import ConfigurationError
from rag.pipeline import RagPipeline
from rag.settings import RagheatSettings, ServerSettings

QUERY = "0-dimensional biomaterials lack inductive properties."
REJECTED = "ragheat_requests_rejected_total"
BURST, RATE = 8, 0.5
GUARDED = [("POST", "/v1/query"), ("POST", "/v1/query/stream"), ("POST", "/admin/reload"), ("GET", "/metrics")]


def bearer(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[name]}"}


@pytest.fixture(scope="module")
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture(scope="module")
def live(settings, subset_index, exporter):
    keyed = with_sections(
        settings,
        server={"api_keys": list(KEYS.values()), "rate_limit_per_s": RATE, "rate_limit_burst": BURST,
                "header_timeout_s": 1.0, "body_timeout_s": 1.0, "reload_poll_s": 0},
        telemetry={"trace_sample_ratio": 1.0, "otlp": "off"})
    with serve_live(keyed, RagPipeline(keyed, subset_index), span_exporter=exporter) as served:
        yield served


@pytest.fixture(scope="module")
def client(live):
    with httpx.Client(base_url=live.url, timeout=60) as c:
        yield c


def rejected(client) -> dict[str, float]:
    scrape = client.get("/metrics", headers=bearer("admin"))
    assert scrape.status_code == 200, scrape.text
    return metric_values(scrape.text, REJECTED, "reason")


def raw_exchange(port: int, data: bytes, wait_s: float = 5.0) -> bytes:
    """Send ``data`` on a fresh connection and read until the server closes it (or ``wait_s`` passes)."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as sock:
        sock.sendall(data)
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except (socket.timeout, ConnectionResetError):
            pass
    return received


# -- on a live server ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("method,path", GUARDED)
def test_no_key_is_401_with_www_authenticate(client, method, path):
    response = client.request(method, path, json={"query": QUERY})
    assert response.status_code == 401, response.text
    assert response.json()["error"] == "unauthenticated"
    assert response.headers["www-authenticate"].startswith("Bearer")


@pytest.mark.parametrize("headers", [
    {"Authorization": "Bearer rh_not-a-key-at-all-000000000"},
    {"X-API-Key": "rh_not-a-key-at-all-000000000"},
    {"Authorization": "Bearer " + KEYS["main"][:-1]},  # one character short
    {"Authorization": "Basic " + KEYS["main"]},        # the right key under the wrong scheme
    {"Authorization": "Bearer"},
    {"X-API-Key": ""},
], ids=["bearer-wrong", "x-api-key-wrong", "bearer-prefix", "basic-scheme", "bearer-empty", "x-api-key-blank"])
def test_wrong_key_is_401_and_never_echoed(client, headers):
    response = client.post("/v1/query", json={"query": QUERY}, headers=headers)
    assert response.status_code == 401, response.text
    assert response.json()["error"] == "unauthenticated"
    for value in headers.values():
        token = value.split(" ", 1)[-1].strip()
        if len(token) >= 16:  # a key (not the scheme word the reason names)
            assert token not in response.text


@pytest.mark.parametrize("headers", [bearer("main"), {"X-API-Key": KEYS["alt"]},
                                     {"authorization": "bearer " + KEYS["main"]}],
                         ids=["bearer", "x-api-key", "lowercase-scheme"])
def test_valid_key_is_served_in_either_header(client, headers):
    response = client.post("/v1/query", json={"query": QUERY, "top_k": 3}, headers=headers)
    assert response.status_code == 200, response.text
    assert len(response.json()["citations"]) >= 1
    assert response.headers["x-ragheat-generation"]


def test_probes_and_description_are_open(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ready", ready.text
    spec = client.get("/openapi.json")
    assert spec.status_code == 200
    assert set(spec.json()["components"]["securitySchemes"]) == {"bearer", "apiKey"}
    assert spec.json()["paths"]["/v1/query"]["post"]["security"], "keyed routes declare their security"
    assert "security" not in spec.json()["paths"]["/healthz"]["get"]


def test_metrics_on_the_api_port_need_a_key_and_list_every_reason(client):
    assert client.get("/metrics").status_code == 401
    assert set(rejected(client)) == set(REJECTION_REASONS), "every reason is exported from the start"


def test_rate_limit_is_429_with_retry_after_per_key_and_counted(client):
    before = rejected(client)["rate_limited"]
    started, admitted, refusals = time.monotonic(), 0, []
    for _ in range(BURST * 4):
        response = client.post("/v1/query", json={"query": ""}, headers=bearer("limited"))  # a cheap 422
        if response.status_code == 429:
            refusals.append(response)
            if len(refusals) == 2:
                break
        else:
            assert response.status_code == 422, response.text
            admitted += 1
    elapsed = time.monotonic() - started
    assert refusals, f"no 429 after {admitted} requests in {elapsed:.1f} s (burst {BURST}, {RATE}/s)"
    assert BURST <= admitted <= BURST + elapsed * RATE + 1, (admitted, elapsed)
    body = refusals[0].json()
    assert body["error"] == "rate_limited" and "server.rate_limit_per_s" in body["reason"], body
    retry_after = int(refusals[0].headers["retry-after"])
    assert 1 <= retry_after <= int(1 / RATE) + 1
    # Another key's bucket is its own: it is still served.
    assert client.post("/v1/query", json={"query": ""}, headers=bearer("alt")).status_code == 422
    assert rejected(client)["rate_limited"] - before == len(refusals)
    # After Retry-After the key is admitted again.
    time.sleep(retry_after)
    assert client.post("/v1/query", json={"query": ""}, headers=bearer("limited")).status_code == 422


def test_every_refusal_is_counted_by_its_reason(client, live, settings):
    before = rejected(client)
    assert client.post("/v1/query", json={"query": QUERY}).status_code == 401
    assert client.post("/v1/query", json={"query": QUERY}, headers={"X-API-Key": "rh_wrong-key-0000000000"}
                       ).status_code == 401
    big = b'{"query": "' + b"x" * (settings.server.max_body_bytes + 10) + b'"}'
    response = client.post("/v1/query", content=big, headers={**bearer("admin"), "content-type": "application/json"})
    assert response.status_code == 413 and response.json()["error"] == "body_too_large", response.text
    # A request head over server.max_header_bytes: 431 from the connection layer, connection closed.
    head = (b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Filler: " + b"a" * (settings.server.max_header_bytes + 100)
            + b"\r\n\r\n")
    answer = raw_exchange(live.port, head)
    assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
    assert b"headers_too_large" in answer
    # Slow loris: a head that stops half-way is answered 408 after server.header_timeout_s and the connection
    # closed, while other clients are served meanwhile.
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", live.port), timeout=10) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        assert client.get("/healthz").status_code == 200
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert 0.9 <= time.monotonic() - started < 8
    after = rejected(client)
    delta = {reason: after[reason] - before[reason] for reason in REJECTION_REASONS}
    assert delta == {"unauthenticated": 2, "forbidden": 0, "rate_limited": 0, "body_too_large": 1,
                     "headers_too_large": 1, "request_timeout": 1}, delta


def test_a_slow_body_is_408_and_many_slow_clients_do_not_block_others(client, live):
    before = rejected(client)["request_timeout"]
    # Headers complete, body promised and never finished: 408 after server.body_timeout_s, connection closed.
    head = (f"POST /v1/query HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEYS['admin']}\r\n"
            "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"query\": ").encode()
    answer = raw_exchange(live.port, head)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    # Fifty half-sent heads at once: the others are still served meanwhile, and all fifty are cut off.
    slow = [socket.create_connection(("127.0.0.1", live.port), timeout=10) for _ in range(50)]
    try:
        for sock in slow:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        asked = client.post("/v1/query", json={"query": QUERY}, headers=bearer("alt"))
        assert asked.status_code == 200 and time.monotonic() - started < 5, asked.text
        for sock in slow:
            assert sock.recv(65536).startswith(b"HTTP/1.1 408")
            assert sock.recv(65536) == b"", "the connection is closed after the 408"
    finally:
        for sock in slow:
            sock.close()
    assert rejected(client)["request_timeout"] - before == 51


def test_keys_and_query_text_never_reach_logs_or_spans(client, exporter):
    """Content capture is off by default: neither the keys (valid or not) nor the question appear anywhere."""
    assert RagheatSettings().telemetry.capture_content is False
    secret_question = "Do zebra-striped harden-marker proteins regulate tides?"
    wrong = "rh_wrong-but-secret-key-123456789"
    capture = LogCapture()
    with capture.installed():
        since = len(exporter.get_finished_spans())
        for headers in (bearer("spans"), {"X-API-Key": KEYS["spans"]}, {"Authorization": f"Bearer {wrong}"},
                        {"X-API-Key": wrong}):
            client.post("/v1/query", json={"query": secret_question}, headers=headers)
            client.post("/v1/query/stream", json={"query": secret_question}, headers=headers)
        deadline = time.monotonic() + 15
        while len(exporter.get_finished_spans()) - since < 8 and time.monotonic() < deadline:
            time.sleep(0.1)
    assert len(exporter.get_finished_spans()) - since >= 8, "every request (refused ones too) is traced"
    spans, logs = span_text(exporter), capture.text
    for secret in (KEYS["spans"], wrong, secret_question, "zebra-striped"):
        assert secret not in spans, f"{secret!r} reached a span"
        assert secret not in logs, f"{secret!r} reached a log record"


def test_metrics_port_and_content_capture_when_enabled(settings, subset_index):
    """/metrics on its own, open port (server.metrics_port); and with telemetry.capture_content on, the question
    does reach the spans (the flag is what keeps it out by default)."""
    exporter = InMemorySpanExporter()
    port = free_port()
    s = with_sections(settings, server={"api_keys": [KEYS["main"]], "metrics_port": port, "reload_poll_s": 0},
                      telemetry={"trace_sample_ratio": 1.0, "otlp": "off", "capture_content": True})
    question = "Does the harden-capture marker reach spans?"
    with serve_live(s, RagPipeline(s, subset_index), span_exporter=exporter) as served:
        assert served.service.metrics_url == f"http://127.0.0.1:{port}/metrics"
        with httpx.Client(base_url=served.url, timeout=60) as c:
            assert c.get("/metrics", headers=bearer("main")).status_code == 404, "not on the API port"
            assert c.post("/v1/query", json={"query": QUERY}).status_code == 401
            assert c.post("/v1/query", json={"query": question}, headers=bearer("main")).status_code == 200
        scrape = httpx.get(served.service.metrics_url, timeout=10)
        assert scrape.status_code == 200
        assert metric_values(scrape.text, REJECTED, "reason")["unauthenticated"] == 1
        deadline = time.monotonic() + 15
        while question not in span_text(exporter) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert question in span_text(exporter)
        assert KEYS["main"] not in span_text(exporter)


# -- the parts, without a server ----------------------------------------------------------------------------

def test_presented_key_reads_both_headers():
    assert presented_key({b"authorization": b"Bearer  abc "}) == "abc"
    assert presented_key({b"authorization": b"BEARER abc"}) == "abc"
    assert presented_key({b"x-api-key": b" abc "}) == "abc"
    assert presented_key({b"authorization": b"Basic abc", b"x-api-key": b"def"}) == "def"
    assert presented_key({b"authorization": b"Basic abc"}) is None
    assert presented_key({}) is None


def test_keys_file_round_trip_names_and_errors(tmp_path):
    key = "rh_" + "z" * 40
    path = tmp_path / "keys"
    path.write_text(f"# ragheat keys\n\n{key_line(key, 'ci')}\n{key_line('rh_' + 'y' * 40)}  # unnamed\n")
    ring = KeyRing(keys_file=path)
    assert len(ring) == 2 and ring.enabled
    assert ring.identify(key) == "ci"
    assert ring.identify("rh_" + "y" * 40).startswith("key-")
    assert ring.identify(key + "x") is None
    assert key not in path.read_text(), "the file stores digests only"
    # A broken file names its line, never its content, and a reload keeps the keys already loaded.
    path.write_text(f"{key_line(key, 'ci')}\nsha256:{'ab' * 31} x\n")
    with pytest.raises(ConfigurationError, match="line 2") as caught:
        read_keys_file(path)
    assert "ab" * 31 not in str(caught.value)
    with pytest.raises(ConfigurationError):
        ring.reload()
    assert ring.identify(key) == "ci"
    # An empty keys file still requires keys: none is accepted.
    path.write_text("")
    assert KeyRing(keys_file=path).enabled and KeyRing(keys_file=path).identify(key) is None


def test_token_bucket_refills_at_its_rate_and_bounds_its_clients():
    now = [100.0]
    bucket = TokenBucketLimit(2.0, 3, clock=lambda: now[0], max_clients=2)
    assert [bucket.admit("a", "/v1/query") for _ in range(3)] == [None] * 3
    refusal = bucket.admit("a", "/v1/query")
    assert refusal.reason == "rate_limited" and dict(refusal.headers)["Retry-After"] == "1"
    assert bucket.admit("a", "/healthz") is None, "only /v1 and /admin are limited"
    assert bucket.admit("b", "/v1/query") is None, "each client has its own bucket"
    now[0] += 0.5  # one token back at 2/s
    assert bucket.admit("a", "/v1/query") is None
    assert bucket.admit("a", "/v1/query") is not None
    slow = TokenBucketLimit(0.1, 1, clock=lambda: now[0])
    slow.admit("a", "/v1/x")
    assert dict(slow.admit("a", "/v1/x").headers)["Retry-After"] == "10"
    bucket.admit("c", "/v1/query")  # a third client: the least recently used bucket ("b") is dropped
    assert len(bucket._buckets) == 2 and "b" not in bucket._buckets
    with pytest.raises(ValueError, match="rate_per_s"):
        TokenBucketLimit(0, 1)


def test_admin_without_keys_is_forbidden_and_reasons_are_closed():
    policy = AccessPolicy(KeyRing())
    assert policy.check("/v1/query", {}, "10.0.0.1") is None, "without keys the API is open"
    assert policy.admin_refusal().reason == "forbidden" and policy.rejections.counts["forbidden"] == 1
    assert AccessPolicy(KeyRing(["rh_" + "a" * 20])).admin_refusal() is None
    with pytest.raises(ValueError, match="REJECTION_REASONS"):
        Rejections().count("because")
    heard = []
    rejections = Rejections()
    rejections.listeners.append(heard.append)
    rejections.listeners.append(lambda reason: 1 / 0)  # an observer that fails never fails the request
    rejections.count("rate_limited")
    assert heard == ["rate_limited"] and rejections.counts["rate_limited"] == 1


def test_weak_keys_fail_start_up_and_no_settings_error_echoes_a_key():
    weak, good = "hunter2", "rh_" + "g" * 30
    with pytest.raises(ConfigurationError, match="key 2") as caught:
        AccessPolicy.from_settings(ServerSettings(api_keys=[good, weak]))
    assert weak not in str(caught.value) and good not in str(caught.value)
    # Any other error in the server section names its field, never the section's input (which holds the keys).
    for bad in ({"port": 9000, "metrics_port": 9000}, {"port": "x"}, {"rate_limit_per_s": -1}):
        with pytest.raises(ValidationError) as caught:
            RagheatSettings(server={"api_keys": [good], **bad})
        assert good not in str(caught.value), bad
    with pytest.raises(ValidationError, match="metrics_port"):
        ServerSettings(port=9000, metrics_port=9000)
    assert "rh_" + "q" * 30 not in repr(ServerSettings(api_keys=["rh_" + "q" * 30]))


def test_keys_new_prints_a_key_its_file_line_accepts(tmp_path):
    from ragheat.cli import app

    path = tmp_path / "keys"
    result = CliRunner().invoke(app, ["keys", "new", "ci-bot", "--file", str(path)])
    assert result.exit_code == 0, result.output
    key = result.stdout.strip().splitlines()[-1]
    assert key.startswith("rh_") and len(key) >= 40
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert KeyRing(keys_file=path).identify(key) == "ci-bot"
    bad = CliRunner().invoke(app, ["keys", "new", "two words"])
    assert bad.exit_code != 0
    batch = CliRunner().invoke(app, ["keys", "new", "batch", "--priority", "low", "--file", str(path)])
    assert batch.exit_code == 0, batch.output
    assert KeyRing(keys_file=path).find(batch.stdout.strip().splitlines()[-1]).priority == "low"
    assert CliRunner().invoke(app, ["keys", "new", "--priority", "urgent"]).exit_code != 0


def test_keys_hash_reads_a_key_on_stdin(tmp_path):
    from ragheat.cli import app

    key = "rh_" + "h" * 40
    result = CliRunner().invoke(app, ["keys", "hash", "ops"], input=key + "\n")
    assert result.exit_code == 0, result.output
    (tmp_path / "keys").write_text(result.stdout)
    assert KeyRing(keys_file=tmp_path / "keys").identify(key) == "ops"
    assert key not in result.stdout
    short = CliRunner().invoke(app, ["keys", "hash"], input="short\n")
    assert short.exit_code != 0 and "16" in short.output


# -- exposure: who may serve without a key ---------------------------------------------------------------------

@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "127.255.255.254", "::1", "[::1]", "localhost",
                                  "LOCALHOST"])
def test_loopback_hosts_serve_without_a_key(host):
    from rag.api.access import is_loopback, open_api_problem

    assert is_loopback(host)
    assert open_api_problem(ServerSettings(host=host)) is None


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "192.0.2.7", "10.0.0.1", "fe80::1", "example.org",
                                  "localhost.example.org", "128.0.0.1"])
def test_a_reachable_host_without_keys_is_refused_naming_both_ways_out(host):
    from rag.api.access import INSECURE_FLAG, is_loopback, open_api_problem

    assert not is_loopback(host)
    problem = open_api_problem(ServerSettings(host=host))
    assert problem is not None and repr(host) in problem
    assert "ragheat keys new" in problem and "--api-keys-file" in problem and INSECURE_FLAG in problem


def test_a_reachable_host_serves_with_keys_or_the_named_opt_out(tmp_path):
    from rag.api.access import open_api_problem

    keys_file = tmp_path / "keys"
    keys_file.write_text(key_line(KEYS["main"], "main") + "\n")
    assert open_api_problem(ServerSettings(host="0.0.0.0", api_keys=[KEYS["main"]])) is None
    assert open_api_problem(ServerSettings(host="0.0.0.0", api_keys_file=keys_file)) is None
    assert open_api_problem(ServerSettings(host="0.0.0.0", insecure_no_api_key=True)) is None
