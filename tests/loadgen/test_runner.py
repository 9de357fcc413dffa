"""The load generator against a fake server on loopback with a known delay."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest
from aiohttp import web

from loadgen.runner import closed_loop, load_queries, open_loop
from loadgen.sweep import run_sweep, write_results

DELAY_S = 0.020


class FakeServer:
    """aiohttp on a loopback port: /v1/query sleeps DELAY_S (or ``stall_s`` once) and returns stage timings."""

    def __init__(self, stall_s: float = 0.0, fail_every: int = 0, serial: bool = False) -> None:
        self.stall_s, self.fail_every, self.count = stall_s, fail_every, 0
        self.serial = asyncio.Lock() if serial else None  # one request at a time, like a single worker

    async def handle(self, request: web.Request) -> web.Response:
        await request.read()
        self.count += 1
        if self.fail_every and self.count % self.fail_every == 0:
            return web.json_response({"error": "boom"}, status=500)
        stall = self.stall_s if self.count == 20 else 0.0  # decided on arrival, not once the lock is free
        if self.serial is not None:
            async with self.serial:
                await self._work(stall)
        else:
            await self._work(stall)
        return web.json_response({"answer": "x", "stages": [{"name": "embed", "ms": 3.0},
                                                            {"name": "generate", "ms": 1.0}]})

    async def _work(self, stall: float) -> None:
        await asyncio.sleep(stall + DELAY_S * (0.2 if self.serial else 1))

    def __enter__(self) -> str:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run():
            asyncio.set_event_loop(self.loop)
            app = web.Application()
            app.router.add_post("/v1/query", self.handle)
            self.runner = web.AppRunner(app)
            self.loop.run_until_complete(self.runner.setup())
            self.loop.run_until_complete(web.SockSite(self.runner, sock).start())
            ready.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        ready.wait(10)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc):
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def test_open_loop_measures_the_known_delay():
    with FakeServer() as url:
        step = asyncio.run(open_loop(url + "/v1/query", ["q"], rate=40, duration_s=3, warmup_s=0.5, seed=1))
    assert step.errors == 0 and step.requests > 80
    assert step.achieved_qps == pytest.approx(40, rel=0.35)  # Poisson count over 3 s
    lat = step.latency_ms
    assert DELAY_S * 1000 <= lat["p50"] < DELAY_S * 1000 + 10
    assert DELAY_S * 1000 <= lat["p99"] < DELAY_S * 1000 + 25
    assert step.stages_ms["embed"]["p50"] == pytest.approx(3.0)
    assert step.send_error_ms["p50"] < 5


def test_open_loop_counts_a_stall_against_every_request_it_delayed():
    """Coordinated omission: a single-worker server stalls 500 ms once. The ~25 requests that arrive
    meanwhile queue behind it and each is measured from its intended send time, so the stall shows in
    P90/P99 (about a sixth of the 150 requests), not only in one request's time."""
    with FakeServer(stall_s=0.5, serial=True) as url:
        step = asyncio.run(open_loop(url + "/v1/query", ["q"], rate=50, duration_s=3, warmup_s=0.0, seed=2))
    assert step.errors == 0
    assert step.latency_ms["p50"] < 50  # most requests see a 4 ms server
    assert step.latency_ms["p90"] > 100 and step.latency_ms["p99"] > 300


def test_closed_loop_and_errors():
    with FakeServer(fail_every=10) as url:
        step = asyncio.run(closed_loop(url + "/v1/query", ["q"], concurrency=2, duration_s=2, warmup_s=0.2))
    assert step.mode == "closed" and step.concurrency == 2
    # Two clients each complete one request per ~DELAY_S: about 2 / 0.02 = 100 req/s, less overheads.
    assert 40 < step.requests / 2 < 110
    assert step.error_rate == pytest.approx(0.1, abs=0.03)
    assert DELAY_S * 1000 <= step.latency_ms["p50"] < DELAY_S * 1000 + 10


def test_sweep_writes_results_and_finds_the_knee(tmp_path):
    with FakeServer() as url:
        results = run_sweep(url, ["q"], mode="open", levels=[10, 20], duration_s=1.0, warmup_s=0.2,
                            slo_ms=DELAY_S * 1000 + 30, max_error_rate=0.001)
    assert [s["offered_qps"] for s in results["steps"]] == [10, 20]
    assert results["knee_qps"] == 20
    path = write_results(results, tmp_path)
    assert path.read_text().count('"knee_qps": 20') == 1
    with FakeServer() as url:
        strict = run_sweep(url, ["q"], mode="open", levels=[10], duration_s=1.0, warmup_s=0.1,
                           slo_ms=DELAY_S * 1000 / 2, max_error_rate=0.001)
    assert strict["knee_qps"] is None  # the delay alone exceeds this objective


def test_load_queries_reads_plain_lines_and_beir(tmp_path, scifact_dir):
    plain = tmp_path / "q.txt"
    plain.write_text("first question\n\nsecond question\n")
    assert load_queries(plain) == ["first question", "second question"]
    beir = load_queries(scifact_dir / "queries.jsonl")
    assert len(beir) == 809 and all(isinstance(q, str) and q for q in beir)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"_id": "1"}\n')
    with pytest.raises(ValueError, match="text"):
        load_queries(bad)


def test_bench_command_end_to_end(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    ragheat = Path(sys.executable).parent / "ragheat"
    env = {"COLUMNS": "200", "PATH": "/usr/bin:/bin"}
    with FakeServer() as url:
        done = subprocess.run([str(ragheat), "bench", "--url", url, "--rates", "5,10", "--duration", "1",
                               "--warmup", "0.2", "--out", str(tmp_path)], capture_output=True, text=True,
                              timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    results = json.loads((tmp_path / "results.json").read_text())
    assert [s["offered_qps"] for s in results["steps"]] == [5, 10] and results["knee_qps"] == 10
    assert "knee: 10 req/s" in done.stdout
    for bad, message in ((["--rates", "x"], "--rates"), (["--mode", "sideways"], "--mode")):
        failed = subprocess.run([str(ragheat), "bench", "--url", "http://127.0.0.1:9", *bad, "--out", str(tmp_path)],
                                capture_output=True, text=True, timeout=60, env=env)
        assert failed.returncode == 2 and message in failed.stdout + failed.stderr


def test_stage_percentiles_from_a_real_prometheus(settings, pipeline):
    """--prometheus: per-stage percentiles read back from a real Prometheus scraping the real service."""
    from prometheus_client import CollectorRegistry

    from rag.api.app import create_app
    from rag.api.server import BackgroundServer
    from telemetry import build_telemetry
    from telemetry.asgi import instrument_app
    from telemetry.prometheus_server import LocalPrometheus

    app = create_app(settings, pipeline=pipeline)
    telemetry = build_telemetry(settings, pipeline, registry=CollectorRegistry())
    instrument_app(app, telemetry)
    with BackgroundServer(app) as url, LocalPrometheus(url.removeprefix("http://"), scrape_interval_s=1) as prom:
        results = run_sweep(url, ["vitamin D and bone density", "aspirin"], mode="open", levels=[20],
                            duration_s=4.0, warmup_s=0.5, slo_ms=420, max_error_rate=0.001, prometheus_url=prom)
    telemetry.shutdown()
    step = results["steps"][0]
    assert step["stages_source"] == "prometheus"
    assert set(step["stages_ms"]) == {"embed", "retrieve_dense", "retrieve_bm25", "fuse", "generate"}
    for stage, p in step["stages_ms"].items():
        assert p["p50"] is not None and 0 < p["p50"] <= p["p99"] < 1000, (stage, p)


def test_ctrl_c_stops_the_sweep_and_keeps_what_was_measured(tmp_path):
    import json
    import signal
    import subprocess
    import sys
    from pathlib import Path

    ragheat = Path(sys.executable).parent / "ragheat"
    with FakeServer() as url:
        process = subprocess.Popen([str(ragheat), "bench", "--url", url, "--rates", "10,20", "--duration", "60",
                                    "--warmup", "0.2", "--out", str(tmp_path)], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
        time.sleep(4)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=30)  # far sooner than the 120 s the sweep would take
    assert process.returncode == 0, err
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["interrupted"] is True and len(results["steps"]) == 1
    step = results["steps"][0]
    assert step["interrupted"] and step["requests"] > 10 and step["duration_s"] < 10
    assert "(cut)" in out and (tmp_path / "report.html").exists()
