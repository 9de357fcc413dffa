"""``ragheat serve --workers 2``: two processes on one port, every scrape sums both workers' counters and reports the
whole service's CPU, and a worker that dies is restarted without its gauges lingering."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.parser import text_string_to_metric_families

from rag.childproc import ChildProcess, free_port
from ragheat.workers import worker_argv
from telemetry.metrics import HOST_CPU_MODES, HOST_METRICS
from telemetry.exemplars import read_exemplars


def _requests_total(text: str) -> float:
    return sum(s.value for f in text_string_to_metric_families(text) if f.name == "ragheat_requests"
               for s in f.samples if s.name == "ragheat_requests_total" and s.labels.get("route") == "/v1/query")


def _per_worker(folder: Path) -> dict[str, float]:
    """Each worker's own count of answered /v1/query requests, read from its file in the multiprocess folder."""
    counts: dict[str, float] = {}
    for path in folder.glob("counter_*.db"):
        total = sum(value for key, value, *_ in MmapedDict.read_all_values_from_file(str(path))
                    if key.startswith('["ragheat_requests", "ragheat_requests_total"') and '/v1/query' in key)
        counts[path.stem.removeprefix("counter_")] = total
    return counts


def test_worker_argv_drops_what_the_parent_handles():
    assert worker_argv(["--index", "x", "--workers", "2", "--prometheus", "--port", "9"]) == ["--index", "x", "--port",
                                                                                               "9"]
    assert worker_argv(["--workers=3", "--port", "9"]) == ["--port", "9"]


def test_workers_need_a_fixed_port_and_a_reload_poll(subset_index):
    from typer.testing import CliRunner

    from ragheat.cli import app

    result = CliRunner().invoke(app, ["serve", "--index", str(subset_index), "--port", "0", "--workers", "2"])
    assert result.exit_code != 0 and "--workers > 1 needs a fixed --port" in result.output
    # POST /admin/reload reaches one worker: without a poll the others would keep serving the old generation.
    result = CliRunner().invoke(app, ["serve", "--index", str(subset_index), "--port", str(free_port()), "--workers",
                                      "2", "--reload-poll", "0"])
    assert result.exit_code != 0 and "--workers > 1 needs --reload-poll > 0" in result.output


def test_two_workers_counters_sum_in_one_scrape(subset_index, tmp_path):
    port = free_port()
    ragheat = str(Path(sys.executable).parent / "ragheat")
    url = f"http://127.0.0.1:{port}"
    with ChildProcess("serve-workers", [ragheat, "serve", "--index", str(subset_index), "--host", "127.0.0.1",
                                        "--port", str(port), "--workers", "2", "--log-level", "warning"],
                      log_path=tmp_path / "serve.log", die_with_parent=True,
                      env={**os.environ, "TMPDIR": str(tmp_path)}) as parent:  # the metrics folder lands here
        parent.wait_until_ok(f"{url}/readyz", 300)
        folders = []
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:  # both workers loaded: each has bound the port and made its files
            folders = list(tmp_path.glob("ragheat-metrics-*"))
            if folders and len(list(folders[-1].glob("counter_*.db"))) >= 2:
                break
            time.sleep(0.5)
        folder = folders[-1]
        time.sleep(3)  # a worker makes its files before it binds the port
        sent = 40
        for i in range(sent):  # a new connection each time: the kernel spreads connections, not requests
            with httpx.Client(timeout=30) as client:
                assert client.post(f"{url}/v1/query", json={"query": f"vitamin D and bone {i}"}).status_code == 200
        per_worker = _per_worker(folder)
        assert sum(per_worker.values()) == sent
        assert sum(1 for n in per_worker.values() if n > 0) == 2, f"one worker served everything: {per_worker}"
        for _ in range(6):  # whichever worker answers the scrape, it reports both workers' requests
            with httpx.Client(timeout=30) as client:
                assert _requests_total(client.get(f"{url}/metrics").text) == sent


def _workers(parent_pid: int) -> set[int]:
    """The supervisor's worker processes (its children)."""
    children = Path(f"/proc/{parent_pid}/task/{parent_pid}/children").read_text().split()
    return {int(pid) for pid in children}


def _in_flight_pids(text: str) -> set[int]:
    return {int(s.labels["pid"]) for f in text_string_to_metric_families(text) if f.name == "ragheat_requests_in_flight"
            for s in f.samples}


def test_a_worker_that_dies_is_restarted_and_its_gauges_leave_the_scrape(subset_index, tmp_path):
    port = free_port()
    ragheat = str(Path(sys.executable).parent / "ragheat")
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "TMPDIR": str(tmp_path), "RAGHEAT_SERVER__WORKER_MIN_UPTIME_S": "1"}
    with ChildProcess("serve-workers", [ragheat, "serve", "--index", str(subset_index), "--host", "127.0.0.1",
                                        "--port", str(port), "--workers", "2", "--log-level", "warning"],
                      log_path=tmp_path / "serve.log", die_with_parent=True, env=env) as parent:
        parent.wait_until_ok(f"{url}/readyz", 300)
        deadline = time.monotonic() + 300
        pids: set[int] = set()
        sent = 0
        while time.monotonic() < deadline:  # until each worker has answered and so made its in-flight series
            with httpx.Client(timeout=30) as client:
                assert client.post(f"{url}/v1/query", json={"query": f"vitamin D {sent}"}).status_code == 200
                sent += 1
                pids = _in_flight_pids(client.get(f"{url}/metrics").text)
            if len(pids) == 2:
                break
        workers = _workers(parent.pid)
        assert pids == workers, (pids, workers)
        victim = min(workers)
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and (victim in _workers(parent.pid) or len(_workers(parent.pid)) < 2):
            time.sleep(0.2)
        replacement = _workers(parent.pid) - workers
        assert len(replacement) == 1 and parent.alive(), f"no worker replaced pid {victim}"
        parent.wait_until_ok(f"{url}/readyz", 300)
        for _ in range(6):  # whichever worker answers: the dead worker's gauge is gone, its counts are kept
            with httpx.Client(timeout=30) as client:
                text = client.get(f"{url}/metrics").text
            assert victim not in _in_flight_pids(text), text
            assert _requests_total(text) == sent
        assert "restarting it" in (tmp_path / "serve.log").read_text()


def test_exemplars_of_every_worker_reach_an_openmetrics_scrape(subset_index, tmp_path):
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families

    port = free_port()
    ragheat = str(Path(sys.executable).parent / "ragheat")
    url = f"http://127.0.0.1:{port}"
    # Tracing needs a span exporter: one pointed at a port nobody listens on (its spans are dropped and counted); only
    # the requests sent with a sampled traceparent below are traced, so every exemplar must name one of them.
    env = {**os.environ, "TMPDIR": str(tmp_path), "RAGHEAT_TELEMETRY__OTLP": "on",
           "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{free_port()}",
           "RAGHEAT_TELEMETRY__TRACE_SAMPLE_RATIO": "0"}
    with ChildProcess("serve-workers", [ragheat, "serve", "--index", str(subset_index), "--host", "127.0.0.1",
                                        "--port", str(port), "--workers", "2", "--log-level", "warning"],
                      log_path=tmp_path / "serve.log", die_with_parent=True, env=env) as parent:
        parent.wait_until_ok(f"{url}/readyz", 300)
        folder = next(tmp_path.glob("ragheat-metrics-*"))
        sent: set[str] = set()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and len(list(folder.glob("exemplars_*.json"))) < 2:
            trace_id = os.urandom(16).hex()
            with httpx.Client(timeout=30) as client:  # a new connection each time: both workers answer some
                response = client.post(f"{url}/v1/query", json={"query": f"vitamin D and bone {len(sent)}"},
                                       headers={"traceparent": f"00-{trace_id}-{os.urandom(8).hex()}-01"})
            assert response.status_code == 200
            sent.add(trace_id)
            time.sleep(0.1)
        assert len(list(folder.glob("exemplars_*.json"))) == 2, "a worker shared no exemplar"
        # Each worker writes its latest exemplars once a second (ExemplarShare): two seconds on, both files hold the
        # last answers' and stay as they are, so the scrape and the files below are read in the same state.
        time.sleep(2.5)
        with httpx.Client(timeout=30) as client:
            text = client.get(f"{url}/metrics", headers={"Accept": "application/openmetrics-text"}).text
        shared = {e.labels["trace_id"] for e in read_exemplars(folder).values()}
    seen: dict[str, set[str]] = {}
    for family in openmetrics_families(text):
        for sample in family.samples:
            if sample.exemplar is not None:
                seen.setdefault(family.name, set()).add(sample.exemplar.labels["trace_id"])
    assert seen.get("ragheat_request_duration_seconds") and seen.get("ragheat_stage_duration_seconds"), seen
    assert set().union(*seen.values()) <= sent
    # The scrape came from one worker and carries what both workers shared.
    assert shared == set().union(*seen.values())


def _family(text: str, name: str) -> list:
    return [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


def _tree_cpu_s(root: int) -> dict[int, float]:
    """pid -> user + system CPU seconds, its reaped children's included, of ``root`` and every process under it."""
    tick = os.sysconf("SC_CLK_TCK")
    seconds, todo = {}, [root]
    while todo:
        pid = todo.pop()
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except OSError:  # gone
            continue
        seconds[pid] = sum(int(f) for f in fields[11:15]) / tick
        for task in tasks:  # a child is listed under the thread that forked it
            try:
                todo += [int(child) for child in (task / "children").read_text().split()]
            except OSError:
                pass
    return seconds


@pytest.mark.slow
@pytest.mark.serial  # compares CPU time: other tests' load would only blur it
def test_the_exported_process_cpu_is_every_workers(subset_index, tmp_path):
    port = free_port()
    ragheat = str(Path(sys.executable).parent / "ragheat")
    url = f"http://127.0.0.1:{port}"
    process_cpu, host_cpu = HOST_METRICS["process_cpu"], HOST_METRICS["host_cpu"]
    with ChildProcess("serve-workers", [ragheat, "serve", "--index", str(subset_index), "--host", "127.0.0.1",
                                        "--port", str(port), "--workers", "2", "--log-level", "warning"],
                      log_path=tmp_path / "serve.log", die_with_parent=True,
                      env={**os.environ, "TMPDIR": str(tmp_path)}) as parent:
        parent.wait_until_ok(f"{url}/readyz", 300)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and len(_workers(parent.pid)) < 2:
            time.sleep(0.5)
        time.sleep(3)  # a worker is up before it binds the port
        stop = threading.Event()

        def load() -> None:
            i = 0
            while not stop.is_set():  # a new connection each time: the kernel spreads them over both workers
                with httpx.Client(timeout=30) as client:
                    client.post(f"{url}/v1/query", json={"query": f"vitamin D and bone {i}"})
                i += 1

        def scrape() -> tuple[float, dict[int, float], str]:
            with httpx.Client(timeout=30) as client:
                text = client.get(f"{url}/metrics").text
            return _family(text, process_cpu)[0].value, _tree_cpu_s(parent.pid), text

        senders = [threading.Thread(target=load) for _ in range(2)]
        for sender in senders:
            sender.start()
        try:
            time.sleep(2)
            workers = _workers(parent.pid)
            exported = [scrape()]
            for _ in range(8):  # each scrape on a new connection: either worker answers
                time.sleep(1)
                exported.append(scrape())
        finally:
            stop.set()
            for sender in senders:
                sender.join()
    (first, tree_first, _), (last, tree_last, text) = exported[0], exported[-1]
    values = [value for value, _, _ in exported]
    assert values == sorted(values), f"the counter stepped back between workers' answers: {values}"
    spent = {pid: tree_last[pid] - tree_first.get(pid, 0.0) for pid in tree_last}
    assert all(spent[pid] > 0.2 * sum(spent.values()) for pid in workers), f"one worker did all the work: {spent}"
    assert abs((last - first) - sum(spent.values())) < 0.1 * sum(spent.values()) + 0.1, (last - first, spent)
    # The host is one machine whichever worker answers: one series per mode, none per worker.
    assert sorted(s.labels["mode"] for s in _family(text, host_cpu)) == sorted(HOST_CPU_MODES)
