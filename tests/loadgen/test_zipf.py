"""``ragheat bench --zipf S``: queries drawn from a seeded Zipf law over the query file, and each response's ``cache``
field recorded, so the summary, results.json and report.html show the answer cache's hit rate per step. The server
here is a fake that answers ``hit`` for a question it has seen before, like a cache that never evicts."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from aiohttp import web

from loadgen.runner import open_loop, run, zipf_picks


class RememberingServer:
    """aiohttp on loopback: /v1/query answers ``cache: hit`` for a query seen before, else ``miss``."""

    def __init__(self) -> None:
        self.seen: Counter[str] = Counter()

    async def handle(self, request: web.Request) -> web.Response:
        query = json.loads(await request.read())["query"]
        self.seen[query] += 1
        return web.json_response({"answer": "x", "stages": [{"name": "embed", "ms": 1.0}],
                                  "cache": "hit" if self.seen[query] > 1 else "miss"})

    def __enter__(self) -> str:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.loop, ready = asyncio.new_event_loop(), threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(self.loop)
            app = web.Application()
            app.router.add_post("/v1/query", self.handle)
            self.runner = web.AppRunner(app, shutdown_timeout=0.5)
            self.loop.run_until_complete(self.runner.setup())
            self.loop.run_until_complete(web.SockSite(self.runner, sock).start())
            ready.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()
        ready.wait(10)
        return f"http://127.0.0.1:{sock.getsockname()[1]}"

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def test_zipf_picks_are_seeded_and_follow_the_law():
    picks = zipf_picks(100, 1.1, 200_000, seed=3)
    assert np.array_equal(picks, zipf_picks(100, 1.1, 200_000, seed=3))
    assert not np.array_equal(picks, zipf_picks(100, 1.1, 200_000, seed=4))
    assert picks.min() >= 0 and picks.max() <= 99
    counts = np.bincount(picks, minlength=100)
    weights = np.arange(1, 101) ** -1.1
    expected = weights / weights.sum()
    assert abs(counts[0] / len(picks) - expected[0]) < 0.01  # the most popular query's share
    assert abs(counts[0] / counts[1] - 2 ** 1.1) < 0.1  # rank 1 vs rank 2: 2^s
    assert counts[:10].sum() > counts[10:].sum() * 0.9  # a heavy head: the top 10 draw about half


@pytest.mark.parametrize("n, s", [(0, 1.1), (10, 0.0), (10, -1.0)])
def test_zipf_picks_refuse_what_has_no_law(n, s):
    with pytest.raises(ValueError, match="Zipf"):
        zipf_picks(n, s, 10, 0)


def test_the_open_loop_sends_zipf_draws_and_counts_hits():
    queries = [f"question {i}" for i in range(40)]
    server = RememberingServer()
    with server as url:
        step = run(open_loop(url + "/v1/query", queries, 200, 1.5, 0.0, seed=1, zipf_s=1.1))
    assert step.errors == 0 and step.requests == sum(server.seen.values())
    assert sum(step.cache.values()) == step.requests - step.errors
    assert step.cache["miss"] == len(server.seen)  # one miss per distinct question sent (all measured: no warm-up)
    assert step.to_json()["cache_hit_rate"] == pytest.approx(step.cache["hit"] / step.requests)
    top = server.seen.most_common(1)[0][0]
    assert top == queries[0] or server.seen[top] == server.seen[queries[0]]  # the first query is the popular one
    assert step.samples["cache"].count("hit") == step.cache["hit"]


def test_the_bench_command_reports_the_hit_rate_per_step(tmp_path):
    ragheat = Path(sys.executable).parent / "ragheat"
    queries = tmp_path / "queries.txt"
    queries.write_text("".join(f"question {i}\n" for i in range(60)))
    with RememberingServer() as url:
        done = subprocess.run([str(ragheat), "bench", "--url", url, "--rates", "20,40", "--duration", "1",
                               "--warmup", "0.5", "--zipf", "1.1", "--queries", str(queries), "--out",
                               str(tmp_path / "out")], capture_output=True, text=True, timeout=120,
                              env={"COLUMNS": "250", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["zipf_s"] == 1.1
    rates = [step["cache_hit_rate"] for step in results["steps"]]
    assert all(0 < rate < 1 for rate in rates), rates
    assert "cache hits" in done.stdout
    assert "Answer cache hit rate per step (queries drawn from a Zipf law, s = 1.1)" in \
        (tmp_path / "out" / "report.html").read_text()
