"""Fault drills around ingest, with the service running, and many slow clients at once (docs/reliability.md lists each
drill and its outcome).

- ``kill -9`` of ``ingest`` at each step of building and publishing a generation: the service stays up and keeps
  answering from the previous generation, which still loads from disk; killed after the swap, the new (complete)
  generation is served; the next ingest removes the leftovers and is served.
- A full disk during ingest, simulated without privileges by a per-file size limit (``RLIMIT_FSIZE``: writes fail with
  EFBIG) and for real on a small tmpfs (root: ENOSPC): a non-zero exit with a sentence naming the failure, the previous
  generation intact and loadable, no half-built generation left behind.
- 100 slow-loris heads and 100 endless headers at once against ``ragheat serve``: resident memory bounded, every one
  refused and closed, another client served meanwhile.

Each kill point is a function the ingest calls, wrapped in the child process to ``SIGKILL`` itself there, so every
point is hit exactly, whatever the machine's speed.
"""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from api_testkit import metric_values, serve_live, with_sections
from index_copy import copy_index
from rag.index.store import CURRENT, GENERATIONS, load_index, read_manifest
from rag.ingest.pipeline import ingest
from rag.pipeline import RagPipeline
from stack.servers import ServeProcess

RAGHEAT = Path(sys.executable).parent / "ragheat"
TINY_DOCS = {
    "tides.txt": "Tides are caused by the gravitational pull of the Moon and the Sun on the oceans.",
    "volcanoes.md": "# Volcanoes\nA volcano erupts when molten rock called magma rises through the crust.",
    "bread.txt": "Bread dough rises because yeast ferments sugar and releases carbon dioxide gas.",
}
QUERY = "0-dimensional biomaterials lack inductive properties."

# The child: wrap one function of the ingest so that the process SIGKILLs itself there, then ingest.
KILLER = r"""
import os, signal, sys, threading
from pathlib import Path
import rag.ingest.pipeline as P, rag.index.store as S, rag.index.dense as D, rag.index.sparse as SP
from rag.embedding.embedder import OnnxEmbedder
from rag.settings import RagheatSettings

point, source, index = sys.argv[1:4]
def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)
def after(owner, name):
    real = getattr(owner, name)
    def wrapped(*args, **kwargs):
        result = real(*args, **kwargs)
        die()
        return result
    setattr(owner, name, wrapped)
def before(owner, name, when=lambda *args, **kwargs: True):
    real = getattr(owner, name)
    def wrapped(*args, **kwargs):
        if when(*args, **kwargs):
            die()
        return real(*args, **kwargs)
    setattr(owner, name, wrapped)
def during(owner, name, delay_s):
    real = getattr(owner, name)
    def wrapped(*args, **kwargs):
        threading.Timer(delay_s, die).start()
        return real(*args, **kwargs)
    setattr(owner, name, wrapped)

{
    "chunks_written": lambda: after(P, "write_chunks"),
    "embedding": lambda: during(OnnxEmbedder, "embed_many", 1.0),
    "dense_saved": lambda: after(D, "save_index"),
    "bm25_saved": lambda: after(SP, "save_bm25"),
    "graph_built": lambda: after(P, "build_generation_graph"),
    "before_rename": lambda: after(S, "_fsync_tree"),
    "before_swap": lambda: before(S.os, "replace", lambda src, dst, *a, **k: Path(dst).name == S.CURRENT),
    "after_swap": lambda: before(S.IndexWriter, "_prune"),
}[point]()
P.ingest(source, Path(index), RagheatSettings(), force=True)
print("the ingest finished: the kill point", point, "was never reached")
"""
# (point, source): "embedding" needs a corpus that takes longer than 1 s to embed.
KILL_POINTS = [("chunks_written", "tiny"), ("embedding", "subset"), ("dense_saved", "tiny"), ("bm25_saved", "tiny"),
               ("graph_built", "tiny"), ("before_rename", "tiny"), ("before_swap", "tiny")]


def current_generation(index: Path) -> str:
    return Path(os.readlink(index / CURRENT)).name


def served_generation(url: str) -> str:
    ready = httpx.get(url + "/readyz", timeout=30)
    assert ready.status_code == 200, ready.text
    return ready.json()["generation"]


def ask(url: str) -> httpx.Response:
    response = httpx.post(url + "/v1/query", json={"query": QUERY, "top_k": 3}, timeout=60)
    assert response.status_code == 200, response.text
    return response


def wait_served(url: str, generation: str, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while served_generation(url) != generation:
        assert time.monotonic() < deadline, f"generation {generation} not served within {timeout_s} s"
        time.sleep(0.1)


@pytest.fixture
def tiny(tmp_path) -> Path:
    folder = tmp_path / "tiny"
    folder.mkdir()
    for name, text in TINY_DOCS.items():
        (folder / name).write_text(text, encoding="utf-8")
    return folder


def kill_at(point: str, source: Path, index: Path, log: Path) -> None:
    with open(log, "wb") as out:
        done = subprocess.run([sys.executable, "-c", KILLER, point, str(source), str(index)], stdout=out,
                              stderr=subprocess.STDOUT, timeout=600)
    assert done.returncode == -signal.SIGKILL, f"{point}: exit {done.returncode}: {log.read_text(errors='replace')}"


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_kill_9_at_every_ingest_step_keeps_the_service_serving(settings, subset_index, scifact_subset, tiny, tmp_path,
                                                               embedder):
    index = copy_index(subset_index, tmp_path / "index")
    before = current_generation(index)
    s = with_sections(settings, server={"reload_poll_s": 0.2}, telemetry={"otlp": "off"})
    sources = {"tiny": tiny, "subset": scifact_subset}
    with serve_live(s, RagPipeline(s, index)) as live:
        for point, source in KILL_POINTS:
            kill_at(point, sources[source], index, tmp_path / f"{point}.log")
            assert current_generation(index) == before, f"{point}: current moved"
            assert read_manifest(index)["generation"] == before
            assert load_index(index, s.index).manifest["generation"] == before, point
            assert served_generation(live.url) == before, point
            assert ask(live.url).headers["x-ragheat-generation"] == before, point
        assert live.service.generations.swaps == 0
        # Killed after the swap: the new generation is complete, and it is what the service serves now.
        kill_at("after_swap", tiny, index, tmp_path / "after_swap.log")
        killed_late = current_generation(index)
        assert killed_late != before
        assert load_index(index, s.index).manifest["counts"]["documents"] == len(TINY_DOCS)
        wait_served(live.url, killed_late)
        assert ask(live.url).headers["x-ragheat-generation"] == killed_late
        # The next ingest takes the lock the killed ones released, removes their leftovers and is served.
        report = ingest(str(tiny), index, s, embedder=embedder, force=True)
        assert list((index / GENERATIONS).glob(".tmp-*")) == []
        assert list(index.glob(f".{CURRENT}.*")) == []
        wait_served(live.url, report.manifest["generation"])
        ask(live.url)


def run_ingest_cli(source: Path, index: Path, *extra: str, preexec=None) -> subprocess.CompletedProcess:
    return subprocess.run([str(RAGHEAT), "ingest", str(source), "--index", str(index), *extra], capture_output=True,
                          text=True, timeout=900, preexec_fn=preexec)


def assert_failed_cleanly(done: subprocess.CompletedProcess, index: Path, before: str, settings):
    """The ingest failed and left the previous generation served, loadable and alone; then, that it said so in a
    sentence naming the index, not a traceback."""
    output = done.stdout + done.stderr
    assert done.returncode != 0, output[-3000:]
    assert current_generation(index) == before
    assert load_index(index, settings.index).manifest["generation"] == before
    assert list((index / GENERATIONS).glob(".tmp-*")) == [], "the half-built generation is removed"
    assert "Traceback" not in output, output[-3000:]
    assert str(index) in output, output[-3000:]


def _file_size_limit(limit: int):
    def limit_writes() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, not a signal
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return limit_writes


def test_disk_full_simulated_by_a_file_size_limit_keeps_the_previous_generation(subset_index, tiny, tmp_path,
                                                                                settings):
    index = copy_index(subset_index, tmp_path / "index")
    before = current_generation(index)
    done = run_ingest_cli(tiny, index, "--force", preexec=_file_size_limit(4096))  # dense.faiss is larger
    assert_failed_cleanly(done, index, before, settings)
    # Space back: the same ingest succeeds.
    done = run_ingest_cli(tiny, index, "--force")
    assert done.returncode == 0, done.stdout + done.stderr
    assert current_generation(index) != before


def test_a_dense_index_write_that_fails_at_close_is_an_error(tmp_path):
    """faiss writes through stdio: when only the last buffered block fails (the disk fills at close), faiss prints
    "close error" and returns normally, and an ingest would publish a truncated index. Saving must raise instead."""
    import faiss
    import numpy as np

    from rag.index.dense import DENSE_FILE, save_index

    index = faiss.IndexFlatIP(8)
    index.add(np.random.default_rng(0).random((600, 8), dtype=np.float32))
    (tmp_path / "full").mkdir()
    save_index(index, tmp_path / "full")
    size = (tmp_path / "full" / DENSE_FILE).stat().st_size
    faiss.write_index(index, str(tmp_path / "source.faiss"))
    (tmp_path / "short").mkdir()
    code = ("import faiss, resource, signal, sys; from pathlib import Path; from rag.index.dense import save_index; "
            "signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
            f"resource.setrlimit(resource.RLIMIT_FSIZE, ({size - 10}, {size - 10})); "
            f"save_index(faiss.read_index({str(tmp_path / 'source.faiss')!r}), Path({str(tmp_path / 'short')!r}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[3])
    assert done.returncode != 0, "a write that fails at close() must raise, not leave a truncated index"
    assert "File too large" in done.stderr or "Errno 27" in done.stderr, done.stderr[-2000:]


def ingest_command(source: Path, index: Path, *extra: str) -> subprocess.CompletedProcess:
    """``ragheat ingest`` as the entry point runs it, in this process; an exception the command did not turn into an
    exit (a traceback, from the entry point) fails here."""
    from typer.testing import CliRunner

    from ragheat.cli import app

    args = ["ingest", str(source), "--index", str(index), *extra]
    done = CliRunner(env={"COLUMNS": "400", "NO_COLOR": "1"}).invoke(app, args)
    assert done.exception is None or isinstance(done.exception, SystemExit), done.exception
    return subprocess.CompletedProcess(args, done.exit_code, done.stdout, done.stderr)


@pytest.mark.root
def test_disk_full_on_a_small_tmpfs_keeps_the_previous_generation(subset_index, scifact_subset, tmp_path, settings,
                                                                  kept_ingest_outputs):
    """A real ENOSPC: the index on a tmpfs with room for the served generation and little more (mounting needs
    root: CAP_SYS_ADMIN). The command runs in this process, with the encoder's outputs kept between runs: what is
    tested is what it writes, and what it says when the disk is full."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    used = sum(p.stat().st_size for p in subset_index.rglob("*") if p.is_file() and not p.is_symlink())
    size_kb = used // 1024 + 512
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(mount)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.fail(f"mounting a tmpfs needs root (CAP_SYS_ADMIN): {mounted.stderr.strip()}; deselect with "
                    f"-m 'not root'", pytrace=False)
    try:
        index = copy_index(subset_index, mount / "index")
        before = current_generation(index)
        done = ingest_command(scifact_subset, index, "--window", "128")
        assert_failed_cleanly(done, index, before, settings)
        pipeline = RagPipeline(settings, index)
        pipeline.warm_up()
        try:
            assert pipeline.describe().generation == before
            assert pipeline.query(QUERY, 3).sources
        finally:
            pipeline.close()
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


# -- slow and oversized clients: bounded memory ------------------------------------------------------------------
SLOW_HEADS = OVERSIZED_HEADS = 100
OVERSIZED_SEND = 2 << 20  # each oversized client offers 2 MiB of one header: 200 MiB in all if it were all kept
HEADER_TIMEOUT_S = 5.0  # long enough for 200 connections to be opened and a query served within it
# The server's VmRSS may grow by at most this while 200 clients hold half-sent or oversized heads. Measured on the
# 2-core dev VM (2026-12-01, 3 runs): peak growth 256, 264 and 292 KiB, the same after. Plain uvicorn (httptools, no
# guard) under the 100 oversized heads alone grew by 205 MiB: it keeps all it is sent. 16 MiB leaves room for
# allocator noise and still catches keeping 8 % of what the oversized clients offer.
RSS_GROWTH_BOUND_KIB = 16 << 10


def proc_status_kib(pid: int, field: str) -> int:
    """A ``kB`` field of /proc/PID/status (``VmRSS``, ``VmHWM``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"/proc/{pid}/status has no {field}")


def rejections(url: str) -> dict[str, float]:
    return metric_values(httpx.get(url + "/metrics", timeout=30).text, "ragheat_requests_rejected_total", "reason")


def read_to_close(sock, timeout_s: float) -> bytes:
    """What the server writes before closing; a reset after a refusal counts as closed too."""
    sock.settimeout(timeout_s)
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except ConnectionResetError:
        pass
    return received


def test_slow_loris_and_oversized_heads_keep_memory_bounded_and_others_served(subset_index):
    """``ragheat serve`` as a child process; 100 clients each hold a head half-sent (8 KiB, within the limit) and 100
    each send a 2 MiB header. The server's resident memory stays within a bound, every one of the 200 is answered
    (408 or 431) and closed, and a query from another client is served meanwhile."""
    max_header_bytes = 16384
    env = {**os.environ, "RAGHEAT_SERVER__HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
           "RAGHEAT_SERVER__MAX_HEADER_BYTES": str(max_header_bytes), "RAGHEAT_SERVER__RELOAD_POLL_S": "0",
           "RAGHEAT_TELEMETRY__OTLP": "off"}
    with ServeProcess(subset_index, env=env) as service:
        for _ in range(5):  # warm: the first queries allocate the ONNX arenas and the code paths' caches
            ask(service.url)
        before_counts = rejections(service.url)
        rss_before = proc_status_kib(service.pid, "VmRSS")
        peak = [rss_before]
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.wait(0.02):
                peak.append(proc_status_kib(service.pid, "VmRSS"))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        slow, big = [], []
        try:
            started = time.monotonic()  # the slow heads' deadlines run from their connections
            for _ in range(SLOW_HEADS):
                sock = socket.create_connection(("127.0.0.1", service.port), timeout=10)
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"s" * (max_header_bytes // 2))
                slow.append(sock)
            for _ in range(OVERSIZED_HEADS):
                sock = socket.create_connection(("127.0.0.1", service.port), timeout=10)
                big.append(sock)
                try:
                    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * OVERSIZED_SEND)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # refused and closed part-way: the point
            # Another client, while 100 heads are still pending: served.
            asked = time.monotonic()
            assert ask(service.url).json()["answer"]
            assert time.monotonic() - asked < HEADER_TIMEOUT_S, "a query waited behind slow clients"
            assert time.monotonic() - started < HEADER_TIMEOUT_S, "the slow heads timed out before the check ran"
            for sock in big:
                answer = read_to_close(sock, 10)
                assert answer == b"" or answer.startswith(b"HTTP/1.1 431"), answer[:200]
            for sock in slow:
                answer = read_to_close(sock, HEADER_TIMEOUT_S + 10)
                assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        finally:
            sampling.set()
            sampler.join()
            for sock in slow + big:
                sock.close()
        rss_after = proc_status_kib(service.pid, "VmRSS")
        growth_kib = {"peak": max(peak) - rss_before, "after": rss_after - rss_before}
        print(f"server VmRSS {rss_before} KiB before; growth {growth_kib} KiB; {len(peak)} samples")
        assert growth_kib["peak"] < RSS_GROWTH_BOUND_KIB and growth_kib["after"] < RSS_GROWTH_BOUND_KIB, growth_kib
        counts = rejections(service.url)
        assert counts["request_timeout"] - before_counts.get("request_timeout", 0) == SLOW_HEADS, counts
        assert counts["headers_too_large"] - before_counts.get("headers_too_large", 0) == OVERSIZED_HEADS, counts
        assert ask(service.url).status_code == 200
