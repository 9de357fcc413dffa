"""The nginx balancer of ``--replicas N`` and compose (stack/nginx.py), run for real: Debian's nginx, unprivileged,
from a config generated into a temporary folder, in front of two small HTTP servers that say which replica
answered. Seconds, no model: the end-to-end run with real ``ragheat serve`` replicas is test_stack_replicas.py."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from rag.childproc import ChildProcess, free_port
from rag.errors import ConfigurationError
from stack import nginx, topology
from tests.stack.conftest import REPO


class Replica(ThreadingHTTPServer):
    """A stand-in API replica on loopback: counts what it receives, by path."""

    daemon_threads = True

    def __init__(self, name: str) -> None:
        self.name, self.seen = name, {}
        self.release, self.finished = threading.Event(), threading.Event()  # of the stream below
        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"

    def kill(self) -> None:
        """Gone like a crashed process: nothing listens on its port any more (connections are refused)."""
        self.shutdown()
        self.server_close()


class Handler(BaseHTTPRequestHandler):
    server: Replica

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        self._answer(200, {"replica": self.server.name})

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.seen[self.path] = self.server.seen.get(self.path, 0) + 1
        if self.path == "/crash-after-receiving":  # received, then dies before answering
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if self.path == nginx.STREAM_PATH:  # one event now, the next only once the test has seen the first
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            self.wfile.write(b"event: first\ndata: {}\n\n")
            self.wfile.flush()
            self.server.release.wait(5)
            self.wfile.write(b"event: done\ndata: {}\n\n")
            self.server.finished.set()
            self.close_connection = True
            return
        self._answer(200, {"replica": self.server.name, "bytes": len(body)})

    def _answer(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def balanced(tmp_path):
    """Two replicas behind a real nginx; yields (balancer URL, replicas)."""
    replicas = [Replica("api-1"), Replica("api-2")]
    port = free_port()
    config = nginx.write_local_config(tmp_path / "nginx", f"127.0.0.1:{port}", [r.address for r in replicas])
    child = ChildProcess("nginx", nginx.argv(config, nginx.nginx_binary()), log_path=tmp_path / "nginx.log",
                         die_with_parent=True).start()
    try:
        child.wait_until_ok(f"http://127.0.0.1:{port}{nginx.HEALTH_PATH}", 20)
        yield f"http://127.0.0.1:{port}", replicas
    finally:
        child.stop()
        for r in replicas:
            r.release.set()
            if r.socket.fileno() != -1:
                r.kill()
    assert not child.alive()


def test_requests_reach_every_replica_through_one_port(balanced):
    url, replicas = balanced
    with httpx.Client(timeout=10) as client:
        answered = [client.post(url + "/v1/query", json={"query": "q"}).json()["replica"] for _ in range(20)]
    assert {r.name: answered.count(r.name) for r in replicas} == {r.name: r.seen["/v1/query"] for r in replicas}
    assert all(r.seen["/v1/query"] >= 5 for r in replicas), [r.seen for r in replicas]


def test_a_dead_replica_is_routed_around_without_an_error(balanced):
    url, (first, second) = balanced
    second.kill()
    with httpx.Client(timeout=10) as client:
        statuses = [client.post(url + "/v1/query", json={"query": "q"}).status_code for _ in range(20)]
    assert statuses == [200] * 20  # the refused connection is retried on the live replica (never sent: safe)
    assert first.seen["/v1/query"] == 20


def test_a_query_the_replica_received_is_never_sent_twice(balanced):
    """The choice for a non-idempotent POST: retried only when the first replica never got it (above); once a
    replica received it, its failure is the client's 502, not a second execution elsewhere."""
    url, replicas = balanced
    response = httpx.post(url + "/crash-after-receiving", json={"query": "q"}, timeout=10)
    assert response.status_code == 502
    assert sum(r.seen.get("/crash-after-receiving", 0) for r in replicas) == 1


def test_server_sent_events_pass_unbuffered(balanced):
    """The first event reaches the client while the replica still holds the stream open."""
    url, replicas = balanced
    with httpx.stream("POST", url + nginx.STREAM_PATH, json={"query": "q"}, timeout=10) as response:
        assert response.headers["content-type"] == "text/event-stream"
        lines = response.iter_lines()
        assert next(lines) == "event: first"
        # Buffered, it would have come only with the end of the stream, written after the replica's 5 s wait.
        assert not any(r.finished.is_set() for r in replicas)
        for r in replicas:
            r.release.set()
        rest = list(lines)
    assert "event: done" in rest


def test_the_config_says_what_the_docstring_promises(tmp_path):
    text = nginx.render(nginx.BalancerConfig("127.0.0.1:1", ("127.0.0.1:2", "127.0.0.1:3"), str(tmp_path)))
    upstream = text[text.index("upstream"):text.index("server {")]
    assert "least_conn;" in upstream and "keepalive 64;" in upstream and upstream.count("max_fails=1") == 2
    stream = text[text.index(f"location = {nginx.STREAM_PATH}"):]
    assert "proxy_buffering off;" in stream[:stream.index("}")]
    assert "non_idempotent" not in text and "proxy_next_upstream error timeout;" in text
    assert 'proxy_set_header Connection "";' in text and "daemon off;" in text
    assert f"pid {tmp_path}/nginx.pid;" in text and "/etc/" not in text and "/var/" not in text


def test_the_config_refuses_what_nginx_would_misread(tmp_path):
    with pytest.raises(ConfigurationError, match="absolute"):
        nginx.BalancerConfig("127.0.0.1:1", ("127.0.0.1:2",), "relative/folder")
    with pytest.raises(ConfigurationError, match="at least one"):
        nginx.BalancerConfig("127.0.0.1:1", (), str(tmp_path))
    with pytest.raises(ConfigurationError, match="nginx -t refused"):  # nginx's own check runs before any start
        nginx.write_local_config(tmp_path, "127.0.0.1:1", ["127.0.0.1:2 no_such_parameter"])


def test_composes_config_is_the_rendered_one_and_nginx_accepts_it(tmp_path):
    committed = nginx.COMPOSE_CONFIG.read_text()
    assert committed == nginx.render_compose_config(), "re-render deploy/nginx/nginx.conf from stack/nginx.py"
    assert f"server {nginx.COMPOSE_UPSTREAM} resolve" in committed and f"resolver {nginx.DOCKER_DNS}" in committed
    # Debian's nginx (1.22) predates `resolve` and cannot resolve `api`: check the rest with those two swapped.
    local = (committed.replace(" resolve ", " ").replace(nginx.COMPOSE_UPSTREAM, "127.0.0.1:9")
             .replace("/var/cache/nginx", str(tmp_path)).replace("listen 8000;", f"listen 127.0.0.1:{free_port()};"))
    path = tmp_path / "nginx.conf"
    path.write_text(local)
    result = subprocess.run(nginx.argv(path, nginx.nginx_binary()) + ["-t"], capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 0, result.stderr


def test_compose_runs_api_replicas_behind_nginx(compose):
    model = compose.model()
    services = model["services"]
    assert services["api"]["deploy"]["replicas"] == 2 and "ports" not in services["api"]
    front = services["nginx"]
    assert [p["target"] for p in front["ports"]] == [8000] and front["ports"][0]["published"] == "8000"
    assert front["depends_on"]["api"]["condition"] == "service_healthy"
    mount = next(v for v in front["volumes"] if v["type"] == "bind")
    assert mount["source"] == str(REPO / "deploy" / "nginx" / "nginx.conf") and mount["read_only"]
    assert front["command"][front["command"].index("-c") + 1] == mount["target"]
    assert nginx.HEALTH_PATH in " ".join(front["healthcheck"]["test"])
    scaled = compose.run("config", "--format", "json", env={**_required(), "RAGHEAT_API_REPLICAS": "3"})
    assert scaled.returncode == 0, scaled.stderr
    assert json.loads(scaled.stdout)["services"]["api"]["deploy"]["replicas"] == 3


def _required() -> dict:
    from tests.stack.conftest import REQUIRED_ENV

    return dict(REQUIRED_ENV)


def test_prometheus_scrapes_each_local_replica_with_its_name(tmp_path):
    addresses = topology.LocalAddresses({"api": "127.0.0.1:8000", "prometheus": "127.0.0.1:9090"},
                                        ("127.0.0.1:8101", "127.0.0.1:8102"))
    config, _ = topology.local_prometheus_config(addresses, tmp_path)
    (api,) = [j for j in config["scrape_configs"] if j["job_name"] == topology.API_JOB]
    assert api["static_configs"] == [{"targets": ["127.0.0.1:8101"], "labels": {"replica": "api-1"}},
                                     {"targets": ["127.0.0.1:8102"], "labels": {"replica": "api-2"}}]
    assert "dns_sd_configs" not in api and "relabel_configs" not in api  # compose's address label would override
    single, _ = topology.local_prometheus_config(topology.LocalAddresses({"api": "127.0.0.1:8000"}), tmp_path)
    assert single["scrape_configs"][0]["static_configs"] == [{"targets": ["127.0.0.1:8000"],
                                                              "labels": {"replica": "api"}}]


def test_a_relabelling_the_local_stack_would_lose_is_refused(tmp_path):
    config = topology.load_yaml(topology.PROMETHEUS_CONFIG)
    api = next(j for j in config["scrape_configs"] if j["job_name"] == topology.API_JOB)
    api["relabel_configs"].append({"source_labels": ["__address__"], "target_label": "zone"})
    with pytest.raises(ConfigurationError, match="relabels more than"):
        topology.local_prometheus_config(topology.LocalAddresses({"api": "127.0.0.1:8000"}), tmp_path, config)


def test_a_missing_nginx_is_named_with_its_package(monkeypatch):
    monkeypatch.setattr(nginx.shutil, "which", lambda name: None)
    monkeypatch.setattr(nginx.os, "access", lambda *args: False)
    with pytest.raises(ConfigurationError, match="Debian's package 'nginx'"):
        nginx.nginx_binary()
