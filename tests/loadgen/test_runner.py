"""The load generator against a fake server on loopback with a known delay."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from aiohttp import web
from rich.console import Console

from loadgen.runner import closed_loop, load_queries, open_loop
from loadgen.sweep import results_table, run_sweep, sweep_and_report, write_results
from rag.stages import DEFAULT_STAGES

DELAY_S = 0.020


class FakeServer:
    """aiohttp on a loopback port: /v1/query sleeps DELAY_S (or ``stall_s`` once) and returns stage timings."""

    def __init__(self, stall_s: float = 0.0, fail_every: int = 0, serial: bool = False) -> None:
        self.stall_s, self.fail_every, self.count = stall_s, fail_every, 0
        self.bodies: set[bytes] = set()  # every distinct request body
        self.serial = asyncio.Lock() if serial else None  # one request at a time, like a single worker

    async def handle(self, request: web.Request) -> web.Response:
        self.bodies.add(await request.read())
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

    async def _cancel_the_rest(self) -> None:
        """A request still stalled once the client stopped waiting for it."""
        rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in rest:
            task.cancel()
        await asyncio.gather(*rest, return_exceptions=True)

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
            # Shutdown does not wait for a stalled request the client gave up on (_cancel_the_rest ends it).
            self.runner = web.AppRunner(app, shutdown_timeout=0.5)
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
        asyncio.run_coroutine_threadsafe(self._cancel_the_rest(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.mark.serial  # milliseconds of a shared CPU: its P99 bound holds for a client and server alone
def test_open_loop_measures_the_known_delay():
    server = FakeServer()
    with server as url:
        step = asyncio.run(open_loop(url + "/v1/query", ["q"], rate=40, duration_s=3, warmup_s=0.5, seed=1))
    assert server.bodies == {b'{"query": "q", "top_k": 5}'}  # ragheat's body, unchanged by HttpTarget's default
    assert step.errors == 0 and step.requests > 80
    assert step.achieved_qps == pytest.approx(40, rel=0.35)  # Poisson count over 3 s
    lat = step.latency_ms
    # Never below the server's delay (latency counts from the intended send time); the upper margins leave
    # room for a loaded 2-core machine (client and server share it) but not for a lost or doubled delay.
    assert DELAY_S * 1000 <= lat["p50"] < DELAY_S * 1000 + 15
    assert DELAY_S * 1000 <= lat["p99"] < DELAY_S * 1000 + 60
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
    assert step.error_reasons == {"HTTP 500": step.errors}
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


def test_sweep_records_cpu_per_request_when_given_the_service_pid():
    # The fake service runs in this process, so its CPU is the generator's too: the figures are checked for shape and
    # sense here; test_cpu.py checks that a separate service's tree is counted apart.
    with FakeServer() as url:
        results = run_sweep(url, ["q"], mode="open", levels=[20], duration_s=1.0, warmup_s=0.2, slo_ms=1000,
                            max_error_rate=0.001, server_pids=[os.getpid()])
        closed = run_sweep(url, ["q"], mode="closed", levels=[2], duration_s=0.5, warmup_s=0.1, slo_ms=1000,
                           max_error_rate=0.001, server_pids=[os.getpid()])
        plain = run_sweep(url, ["q"], mode="open", levels=[20], duration_s=0.5, warmup_s=0.1, slo_ms=1000,
                          max_error_rate=0.001)
    for step in results["steps"] + closed["steps"]:
        cpu = step["cpu_ms_per_answer"]
        assert cpu["answers"] == step["requests"] > 0 and cpu["service"] > 0 and cpu["generator"] > 0, cpu
        assert cpu["ceiling_qps"] == pytest.approx(cpu["cores"] * 1000 / (cpu["service"] + cpu["generator"]))
    assert plain["steps"][0]["cpu_ms_per_answer"] == {}
    console = Console(width=250, record=True)
    console.print(results_table(results))
    assert "CPU ms/answer svc + gen" in console.export_text()
    with pytest.raises(ValueError, match="no process"):
        run_sweep("http://127.0.0.1:9", ["q"], mode="open", levels=[20], duration_s=0.5, warmup_s=0.1, slo_ms=1000,
                  max_error_rate=0.001, server_pids=[999999999])


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
    for bad, message in ((["--rates", "x"], "--rates"), (["--mode", "sideways"], "--mode"),
                         (["--server-pid", "abc"], "give process ids"),
                         (["--server-pid", "999999999"], "no process 999999999 on this machine")):
        failed = subprocess.run([str(ragheat), "bench", "--url", "http://127.0.0.1:9", *bad, "--out", str(tmp_path)],
                                capture_output=True, text=True, timeout=60, env=env)
        assert failed.returncode == 2 and message in failed.stdout + failed.stderr


def test_stage_percentiles_from_a_real_prometheus(settings, pipeline):
    """--prometheus: per-stage percentiles read back from a real Prometheus scraping the real service."""
    from prometheus_client import CollectorRegistry

    from rag.api.app import create_app
    from stack.servers import BackgroundServer
    from telemetry import build_telemetry
    from telemetry.asgi import instrument_app
    from stack.prometheus import LocalPrometheus

    app = create_app(settings, pipeline=pipeline)
    telemetry = build_telemetry(settings, pipeline, registry=CollectorRegistry())
    instrument_app(app, telemetry)
    with BackgroundServer(app) as url, LocalPrometheus(url.removeprefix("http://"), scrape_interval_s=1) as prom:
        results = run_sweep(url, ["vitamin D and bone density", "aspirin"], mode="open", levels=[20],
                            duration_s=4.0, warmup_s=0.5, slo_ms=420, max_error_rate=0.001, prometheus_url=prom)
    telemetry.shutdown()
    step = results["steps"][0]
    assert step["stages_source"] == "prometheus"
    # the router decides per question whether the reranker (and, for an entity, the graph) runs
    assert {"queue", *DEFAULT_STAGES} - {"rerank"} <= set(step["stages_ms"]) <= {"queue", *DEFAULT_STAGES,
                                                                                  "retrieve_graph"}
    for stage, p in step["stages_ms"].items():
        assert p["p50"] is not None and 0 < p["p50"] <= p["p99"] < 1000, (stage, p)


# -- Ctrl-C -------------------------------------------------------------------------------------------------
# A press must stop the sweep and keep what was measured wherever it lands, so the presses below are placed
# by events (a step being added, its n-th request going out, a step ending), not by sleeps that land somewhere
# different on a loaded machine.

class EscapedPress(Exception):
    pass


@pytest.fixture
def press():
    """Presses Ctrl-C (or sends SIGTERM) to this very process. While the test runs, a press that the sweep does
    not take fails the test instead of stopping pytest, and SIGINT is taken even if the suite was started as a
    background job (which inherits SIGINT ignored)."""
    def escaped(signum, frame):
        raise EscapedPress(f"signal {signum} reached code outside the sweep's handling")

    previous = {signum: signal.signal(signum, escaped) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield lambda signum=signal.SIGINT: os.kill(os.getpid(), signum)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class PressingProgress:
    """Stands in for the progress bar and presses at a chosen point: ``add`` (as step 1 is added, before its
    event loop exists), ``first`` (from step 1's first progress tick, as its first request goes out), ``mid``
    (from its second tick, 64 requests in) or ``end`` (as step 1 is marked complete); ``again_after_s``: a
    second press that long after the first."""

    def __init__(self, press, at: str, signum: int = signal.SIGINT, again_after_s: float | None = None) -> None:
        self.press, self.at, self.signum, self.ticks, self.pressed_at = press, at, signum, 0, None
        self.again = threading.Timer(again_after_s, self._press_again) if again_after_s is not None else None
        self.pressed_again_at = None

    def _press_again(self) -> None:
        self.pressed_again_at = time.monotonic()
        self.press(self.signum)

    def _press(self) -> None:
        if self.pressed_at is None:
            self.pressed_at = time.monotonic()
            self.press(self.signum)
            if self.again is not None:
                self.again.start()

    def add_task(self, description: str, total: float) -> int:
        if self.at == "add":
            self._press()
        return 1

    def update(self, task: int, completed: float) -> None:
        if completed >= 1.0:
            if self.at == "end":
                self._press()
            return
        self.ticks += 1
        if (self.at, self.ticks) in (("first", 1), ("mid", 2)):
            self._press()


def sweep(url: str, progress, mode: str = "open", levels=(100, 200), **kwargs) -> dict:
    options = dict(duration_s=30.0, warmup_s=0.0, slo_ms=1000.0, max_error_rate=0.5, progress=progress)
    return run_sweep(url, ["q"], mode=mode, levels=list(levels), **{**options, **kwargs})


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_press_mid_step_keeps_every_request_sent(press, signum):
    """Sending stops, the requests in flight are waited for and counted: none is lost or double counted."""
    server = FakeServer()
    with server as url:
        progress = PressingProgress(press, "mid", signum)
        results = sweep(url, progress)
        received = server.count
    assert progress.pressed_at is not None and time.monotonic() - progress.pressed_at < 5  # not the 30 s step
    assert results["interrupted"] and len(results["steps"]) == 1
    step = results["steps"][0]
    assert step["interrupted"] and step["errors"] == 0 and 64 < step["requests"] == received
    assert step["duration_s"] < 5 and step["achieved_qps"] == pytest.approx(100, rel=0.5)
    assert signal.getsignal(signal.SIGINT).__name__ == "escaped"  # the sweep gave Ctrl-C back


def test_a_press_as_a_step_is_added_ends_the_sweep_before_it_sends(press):
    """The press lands before the step's event loop exists (where asyncio.Runner would not yet have its handler)."""
    server = FakeServer()
    with server as url:
        results = sweep(url, PressingProgress(press, "add"))
        received = server.count
    assert results["interrupted"] and results["steps"] == [] and received == 0


def test_a_press_as_the_first_request_goes_out_keeps_the_cut_step(press):
    server = FakeServer()
    with server as url:
        results = sweep(url, PressingProgress(press, "first"), warmup_s=0.5)
        received = server.count
    assert results["interrupted"] and len(results["steps"]) == 1 and results["steps"][0]["interrupted"]
    assert results["steps"][0]["requests"] == 0 and received <= 3  # all of it was warm-up


def test_a_press_between_steps_keeps_the_finished_step_whole(press):
    server = FakeServer()
    with server as url:
        results = sweep(url, PressingProgress(press, "end"), levels=(40, 80), duration_s=1.0)
        received = server.count
    assert results["interrupted"] and len(results["steps"]) == 1  # the second step never started
    step = results["steps"][0]
    assert not step["interrupted"] and step["requests"] == received and step["duration_s"] == 1.0


def test_a_second_press_drops_the_requests_still_in_flight(press):
    """The 20th request stalls 15 s: after the first press the step would wait for it, the second stops waiting."""
    server = FakeServer(stall_s=15.0)
    with server as url:
        progress = PressingProgress(press, "mid", again_after_s=0.3)
        try:
            results = sweep(url, progress, timeout_s=30.0)
        finally:
            progress.again.cancel()
        elapsed = time.monotonic() - progress.pressed_at
        received = server.count
    assert elapsed < 8
    step = results["steps"][0]
    assert step["interrupted"] and step["errors"] == 0 and step["requests"] == received - 1


def test_a_press_mid_step_in_the_closed_loop(press):
    server = FakeServer()
    with server as url:
        results = sweep(url, PressingProgress(press, "mid"), mode="closed", levels=(2, 4))
        received = server.count
    assert results["interrupted"] and len(results["steps"]) == 1
    step = results["steps"][0]
    assert step["interrupted"] and 0 < step["requests"] == received and step["duration_s"] < 5


def test_presses_once_the_sweep_is_over_wait_for_the_results_and_the_report(press, tmp_path):
    """Two presses as the last step ends: the step is whole, and results.json and report.html are both written
    (the second press lands while they are, where it used to be a KeyboardInterrupt)."""
    server = FakeServer()
    with server as url:
        progress = PressingProgress(press, "end", again_after_s=0.05)
        results, path, report = sweep_and_report(tmp_path, url, ["q"], mode="open", levels=[40], duration_s=1.0,
                                                 warmup_s=0.0, slo_ms=1000.0, max_error_rate=0.5, progress=progress)
        returned_at = time.monotonic()
    assert progress.pressed_again_at is not None and progress.pressed_again_at < returned_at
    assert json.loads(path.read_text())["steps"][0]["requests"] == server.count and report.is_file()
    assert not results["interrupted"]  # the last step had ended: nothing was cut
    assert signal.getsignal(signal.SIGINT).__name__ == "escaped"


@contextmanager
def sigint_for_the_child(disposition):
    """What SIGINT is set to in a child when it starts: exec keeps an ignored signal ignored and resets a caught
    one to the default. A terminal's foreground command gets the default; a shell's background job, SIG_IGN.
    Set here, because how the suite itself was started decides what pytest has (and the child would inherit)."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN if disposition == "ignored" else signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def start_bench(url: str, out_dir, sigint: str = "default") -> subprocess.Popen:
    ragheat = Path(sys.executable).parent / "ragheat"
    with sigint_for_the_child(sigint):
        return subprocess.Popen([str(ragheat), "bench", "--url", url, "--rates", "10,20", "--duration", "60",
                                 "--warmup", "0.2", "--out", str(out_dir)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})


def wait_for_requests(server: "FakeServer", process: subprocess.Popen, n: int, within_s: float = 120) -> None:
    """Until the server has seen ``n`` requests: the sweep is measuring (start-up time varies with the load)."""
    deadline = time.monotonic() + within_s
    while server.count < n:
        if process.poll() is not None:
            pytest.fail(f"bench exited ({process.returncode}) before sending {n} requests: {process.stderr.read()}")
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"bench sent {server.count} requests in {within_s} s")
        time.sleep(0.02)


def assert_cut_and_reported(process: subprocess.Popen, out_dir) -> None:
    out, err = process.communicate(timeout=30)  # far sooner than the 120 s the sweep would take
    assert process.returncode == 0, err
    results = json.loads((out_dir / "results.json").read_text())
    assert results["interrupted"] is True and len(results["steps"]) == 1
    step = results["steps"][0]
    assert step["interrupted"] and step["requests"] > 10 and step["duration_s"] < 10
    assert "(cut)" in out and (out_dir / "report.html").exists()


def test_ctrl_c_stops_the_bench_command_and_keeps_what_was_measured(tmp_path):
    server = FakeServer()
    with server as url:
        process = start_bench(url, tmp_path)
        try:
            wait_for_requests(server, process, 20)
            process.send_signal(signal.SIGINT)
            assert_cut_and_reported(process, tmp_path)
        finally:
            process.kill()


def test_a_bench_started_in_the_background_keeps_ignoring_sigint_and_stops_on_sigterm(tmp_path):
    """A shell starts background jobs with SIGINT ignored (Ctrl-C is for the foreground): the bench leaves it so,
    which is why a suite run in the background once saw it sail through Ctrl-C. SIGTERM stops it the same way."""
    server = FakeServer()
    with server as url:
        process = start_bench(url, tmp_path, sigint="ignored")
        try:
            wait_for_requests(server, process, 20)
            process.send_signal(signal.SIGINT)
            wait_for_requests(server, process, server.count + 10)  # still sending
            process.send_signal(signal.SIGTERM)
            assert_cut_and_reported(process, tmp_path)
        finally:
            process.kill()
