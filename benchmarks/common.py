"""What the benchmark scripts share: percentiles of timed calls, the options and rotation of the side-by-side
capacity benchmarks, and the real model the language-model benchmarks start.

A script run as ``.venv/bin/python benchmarks/bench_x.py`` puts the repository root on ``sys.path`` first
(``sys.path.insert(0, str(Path(__file__).resolve().parents[1]))``) and imports ``benchmarks.common``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import threading
import time
from pathlib import Path
from typing import Sequence, TypeVar

import numpy as np

from rag.slo import SLO_MS

SMOKE = os.environ.get("RAGHEAT_BENCH_SMOKE") == "1"  # run_all.sh SMOKE=1: tiny parameters, to prove a step runs
MAX_ERROR_RATE = 0.001  # the knee's error allowance, as `ragheat bench`
SERVED = "smollm2"  # the name the real model is served under
DEFAULT_SETS = ("scifact=datasets/scifact:train:data/index/scifact",
                "hotpotqa-dev=datasets/hotpotqa-dev:dev:data/index/hotpotqa-dev")
T = TypeVar("T")


def p50_p99(values: Sequence[float], scale: float = 1000.0) -> dict | None:
    """P50 / P99 of ``values`` times ``scale`` (default: seconds to ms) and how many there were; None when empty."""
    if len(values) == 0:
        return None
    scaled = np.asarray(values, dtype=float) * scale
    return {"p50": float(np.percentile(scaled, 50)), "p99": float(np.percentile(scaled, 99)), "n": int(len(scaled))}


def closed_loop_round(url: str, queries: Sequence[str], clients: int, seconds: float, path: str = "/v1/query",
                      field: str = "query") -> tuple[float, list[float]]:
    """``clients`` closed-loop clients posting ``queries`` (each its own share, in turn) to ``url``'s ``path`` (the
    query text as the body's ``field``) for ``seconds``: requests per second, and every request's latency in
    seconds."""
    import httpx

    latencies: list[list[float]] = [[] for _ in range(clients)]
    stop = time.monotonic() + seconds

    def client(i: int) -> None:
        with httpx.Client(base_url=url, timeout=30) as http:
            k = i
            while time.monotonic() < stop:
                start = time.perf_counter()
                http.post(path, json={field: queries[k % len(queries)]}).raise_for_status()
                latencies[i].append(time.perf_counter() - start)
                k += clients
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    flat = [x for per in latencies for x in per]
    return len(flat) / seconds, flat


def latency_interleaved(urls: dict[str, str], queries: Sequence[str], rounds: int, path: str = "/v1/query",
                        field: str = "query") -> dict:
    """Concurrency 1, request by request in turn across the servers (A, B, C, A, B, C, ...) so all see the same
    machine: per server P50/P99/mean ms, the count, and each round's P50/P99."""
    import httpx

    clients = {name: httpx.Client(base_url=url, timeout=30) for name, url in urls.items()}
    for q in queries[:20]:  # warm every server
        for client in clients.values():
            client.post(path, json={field: q})
    samples = {name: [] for name in urls}
    per_round = {name: {"p50_ms": [], "p99_ms": []} for name in urls}
    for _ in range(rounds):
        this_round = {name: [] for name in urls}
        for q in queries:
            for name, client in clients.items():
                start = time.perf_counter()
                client.post(path, json={field: q}).raise_for_status()
                this_round[name].append(time.perf_counter() - start)
        for name, values in this_round.items():
            samples[name].extend(values)
            per_round[name]["p50_ms"].append(float(np.percentile(values, 50) * 1000))
            per_round[name]["p99_ms"].append(float(np.percentile(values, 99) * 1000))
    for client in clients.values():
        client.close()
    return {name: {"p50_ms": float(np.percentile(v, 50) * 1000), "p99_ms": float(np.percentile(v, 99) * 1000),
                   "mean_ms": float(np.mean(v) * 1000), "n": len(v), "rounds": per_round[name]}
            for name, v in samples.items()}


def throughput_rounds(urls: dict[str, str], pids: dict[str, int], queries: Sequence[str], clients: int,
                      round_s: float, rounds: int, path: str = "/v1/query", field: str = "query") -> dict:
    """Closed-loop rounds of ``round_s`` seconds, alternating between the servers: per server the median requests/s
    and its process's CPU time per request (``/proc``), with every round's figures."""
    from loadgen.cpu import cpu_seconds

    per_round = {name: [] for name in urls}
    cpu_per_request = {name: [] for name in urls}
    for _ in range(rounds):
        for name, url in urls.items():
            cpu_before = cpu_seconds(pids[name])
            rps, latencies = closed_loop_round(url, queries, clients, round_s, path, field)
            per_round[name].append(rps)
            cpu_per_request[name].append((cpu_seconds(pids[name]) - cpu_before) / len(latencies) * 1e6)
    return {name: {"median_rps": statistics.median(v), "rounds_rps": v,
                   "server_cpu_us_per_request": statistics.median(cpu_per_request[name]),
                   "rounds_server_cpu_us_per_request": cpu_per_request[name]}
            for name, v in per_round.items()}


def resident_bytes(pid: int) -> int:
    """A process's resident memory (``VmRSS`` in /proc), bytes; 0 where it has none (a zombie)."""
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def rotated(items: Sequence[T], shift: int) -> list[T]:
    """``items`` starting at ``shift`` (modulo its length): the order that changes from step to step, so that a slow
    drift of the machine lands on every configuration alike."""
    shift %= len(items)
    return [*items[shift:], *items[:shift]]


def sweep_parser(description: str, *, rates: str, duration: float, stop_factor: float, ready_timeout: float,
                 work: str) -> argparse.ArgumentParser:
    """The options every side-by-side sweep takes (bench_batching, bench_capacity, bench_replicas)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--index", type=Path, default=Path("data/index/scifact"), help="index folder to serve")
    p.add_argument("--rates", default=rates, help="offered req/s, '50,100' or 'start:stop:step'")
    p.add_argument("--duration", type=float, default=duration, help="measured seconds per step")
    p.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds before each step")
    p.add_argument("--slo-ms", type=float, default=SLO_MS, help="P99 objective for the knee")
    p.add_argument("--stop-factor", type=float, default=stop_factor,
                   help="stop offering a configuration more once its P99 passes this many SLOs")
    p.add_argument("--timeout", type=float, default=10.0, help="per-request timeout, seconds (a timeout is an error)")
    p.add_argument("--ready-timeout", type=float, default=ready_timeout, help="seconds each server may take to load")
    p.add_argument("--work", type=Path, default=None, help=f"{work} (default: a temporary folder)")
    p.add_argument("--results-file", "--json", dest="results_file", type=Path, default=None,
                   help="write a benchmark results file (loadgen/resultsfile.py) here")
    return p


def check_index(parser: argparse.ArgumentParser, index: Path) -> None:
    if not (index / "current").exists():
        parser.error(f"--index {index} is not an index folder (no 'current'); build one with `ragheat ingest`")


def scifact_queries(path: Path | None) -> tuple[Path | None, list[str]]:
    """The queries file (``path``, else SciFact's when present) and its queries shuffled with seed 0 (the built-in
    ones without a file)."""
    from loadgen.runner import DEFAULT_QUERIES, load_queries, shuffled

    scifact = Path("datasets/scifact/queries.jsonl")
    path = path or (scifact if scifact.is_file() else None)
    return path, shuffled(load_queries(path) if path else DEFAULT_QUERIES, 0)


def parse_set(spec: str) -> tuple[str, Path, str, Path, Path | None]:
    """``NAME=BEIR:SPLIT:INDEX[:HEAD]`` -> its parts (HEAD: a reranker head, None when not given)."""
    name, _, rest = spec.partition("=")
    parts = rest.split(":")
    if not name or len(parts) not in (3, 4):
        raise ValueError(f"{spec}: expected NAME=BEIR:SPLIT:INDEX[:HEAD]")
    return name, Path(parts[0]), parts[1], Path(parts[2]), Path(parts[3]) if len(parts) == 4 else None


def model_sets_parser(description: str) -> argparse.ArgumentParser:
    """The options of the benchmarks that run the real model over judged query sets (bench_hyde, bench_judge)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--set", action="append", metavar="NAME=BEIR:SPLIT:INDEX",
                   help=f"default: {' and '.join(DEFAULT_SETS)} (an index absent is built first)")
    p.add_argument("--seed", type=int, default=16, help="draws the queries of each set")
    p.add_argument("--llm-url", help=f"a running OpenAI-compatible server's /v1 URL serving the model as {SERVED!r} "
                                     "(default: start vLLM on it)")
    p.add_argument("--json", type=Path, help="the results file (default benchmarks/results/<name>.json)")
    return p


def real_model(stack: contextlib.ExitStack, url: str | None, max_num_seqs: int) -> str:
    """``url``, or that of a vLLM server started in ``stack`` on the real model ``scripts/install_vllm.sh``
    installs, served as ``SERVED``."""
    if url is not None:
        return url
    from rag.childproc import free_port
    from stack.smollm import installed_model
    from stack.vllm import VllmServer

    folder = installed_model()
    if folder is None:
        raise SystemExit("the real model is not installed: run `bash scripts/install_vllm.sh` (or give --llm-url)")
    return stack.enter_context(VllmServer(folder, port=free_port(), served_name=SERVED, max_model_len=2048,
                                          max_num_seqs=max_num_seqs, block_size=32))
