"""eBPF probe overhead: the RAG service's throughput and P99 with probes off and on, side by side (root).

    sudo .venv/bin/python benchmarks/bench_probes.py --index data/index/scifact --beir datasets/scifact

Writes benchmarks/results/probes.json (--json elsewhere) with every round's figures, so the spread across rounds
can be set against the effect.

1. Service load: one ``ragheat serve`` process; rounds of --round-s seconds with --clients closed-loop clients,
   alternating three configurations so that all see the same machine: ``off``; ``scheduler`` (the default
   probes: run-queue, off-CPU, TCP retransmits) and ``scheduler+syscalls``, each a real ``ragheat probes --pid``
   exporter started before its round (compilation is outside the round) and scraped once after it. Median
   requests/s per configuration, throughput loss as the median of per-round ratios to ``off``, and P99 over
   all of a configuration's requests.
2. Scheduler cost: a target process and its child exchanging a byte over two pipes, ns per round trip
   with the scheduler probes off and on (each round trip: two wake-ups, four context switches).
3. System-call cost: a process calling getppid(2) in a loop, ns per call with the syscall probe off, on with
   that process as the target (enter + exit recorded), and on for another target (the in-kernel pid filter
   only, the cost every other process on the host pays); alternating, median of --syscall-runs.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Sequence

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import closed_loop_round  # noqa: E402
from loadgen.resultsfile import BenchmarkRun  # noqa: E402
from rag.eval.beir import load_queries  # noqa: E402
from stack.servers import ServeProcess  # noqa: E402

RAGHEAT = Path(sys.executable).parent / "ragheat"
CONFIGS = {"off": None, "scheduler": [], "scheduler+syscalls": ["--syscalls"]}
SYSCALL_LOOP = """
import os, sys, time
n = int(sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()
start = time.perf_counter_ns()
for _ in range(n):
    os.getppid()
print((time.perf_counter_ns() - start) / n, flush=True)
"""


class Exporter:
    """``ragheat probes --pid PID --port 0 [args]`` until the block ends; ``url`` is its /metrics."""

    def __init__(self, pid: int, args: list[str]) -> None:
        self.process = subprocess.Popen([str(RAGHEAT), "probes", "--pid", str(pid), "--port", "0", *args],
                                        stdout=subprocess.PIPE, text=True)
        line = self.process.stdout.readline()
        if "/metrics" not in line:
            self.process.kill()
            raise SystemExit(f"ragheat probes did not start (run this benchmark as root): {line!r}")
        self.url = line.strip().split(" at ")[-1]

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


def syscalls_counted(metrics_text: str) -> float:
    """Every system call the exporter has recorded for its target (all stages and families)."""
    from prometheus_client.parser import text_string_to_metric_families

    return sum(sample.value for family in text_string_to_metric_families(metrics_text)
               for sample in family.samples if sample.name == "ragheat_kernel_syscall_seconds_count")


def service_overhead(index: Path, queries: list[str], clients: int, round_s: float, rounds: int) -> dict:
    with ServeProcess(index) as service:
        url = service.url
        closed_loop_round(url, queries, clients, 2.0)  # warm-up
        rates = {name: [] for name in CONFIGS}
        samples = {name: [] for name in CONFIGS}
        p99s = {name: [] for name in CONFIGS}
        syscall_rates = []
        for _ in range(rounds):
            for name, args in CONFIGS.items():
                exporter = Exporter(service.pid, args) if args is not None else None
                try:
                    rate, lat = closed_loop_round(url, queries, clients, round_s)
                    if exporter is not None:
                        scraped = httpx.get(exporter.url, timeout=10).raise_for_status().text
                        if "--syscalls" in args:
                            syscall_rates.append(syscalls_counted(scraped) / round_s)
                finally:
                    if exporter is not None:
                        exporter.close()
                rates[name].append(rate)
                samples[name].extend(lat)
                p99s[name].append(float(np.percentile(lat, 99) * 1000))
    # Each round runs the configurations back to back, so a per-round ratio cancels most of the load that
    # other processes put on the machine; every round's ratio is kept, so the spread can be set against the effect.
    def losses_pct(name: str) -> list[float]:
        return [100 * (1 - r / o) for r, o in zip(rates[name], rates["off"])]
    out = {name: {"rps_median": statistics.median(rates[name]), "rps_rounds": rates[name],
                  "throughput_loss_pct": statistics.median(losses_pct(name)),
                  "rounds_throughput_loss_pct": losses_pct(name), "rounds_p99_ms": p99s[name],
                  "p50_ms": float(np.percentile(samples[name], 50) * 1000),
                  "p99_ms": float(np.percentile(samples[name], 99) * 1000), "requests": len(samples[name])}
           for name in CONFIGS}
    out["scheduler+syscalls"]["rounds_service_syscalls_per_s"] = syscall_rates
    return out


def _timed_loop(script: str, count: int, probe_pid=None, exporter_args: Sequence[str] = ()) -> float:
    """Run ``script`` (prints "ready", waits for a line, prints ns per iteration) in a fresh process; with
    ``probe_pid(loop_pid)`` returning a pid, the probes exporter watches that pid while the loop runs."""
    loop = subprocess.Popen([sys.executable, "-c", script, str(count)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    loop.stdout.readline()
    exporter = None
    try:
        pid = probe_pid(loop.pid) if probe_pid is not None else None
        if pid is not None:
            exporter = Exporter(pid, list(exporter_args))
        loop.stdin.write("go\n")
        loop.stdin.flush()
        return float(loop.stdout.readline())
    finally:
        loop.wait(timeout=60)
        if exporter is not None:
            exporter.close()


def syscall_ns(calls: int, target_self: bool | None) -> float:
    """ns per getppid() in a fresh process; probes on it (True), on another process (False) or off (None)."""
    if target_self is None:
        return _timed_loop(SYSCALL_LOOP, calls)
    args = ["--no-scheduler", "--syscalls", "--no-tcp-retransmits"]
    if target_self:
        return _timed_loop(SYSCALL_LOOP, calls, lambda pid: pid, args)
    bystander = subprocess.Popen(["sleep", "600"])
    try:
        return _timed_loop(SYSCALL_LOOP, calls, lambda pid: bystander.pid, args)
    finally:
        bystander.kill()
        bystander.wait()


PING_PONG = """
import os, sys, time
n = int(sys.argv[1])
up_r, up_w = os.pipe(); down_r, down_w = os.pipe()
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # both on one CPU: every hand-off is a context switch
child = os.fork()
if child == 0:
    os.close(down_w); os.close(up_r)  # so that the parent closing down_w ends this loop
    while os.read(down_r, 1):
        os.write(up_w, b"x")
    os._exit(0)
os.close(down_r); os.close(up_w)
print("ready", flush=True)
sys.stdin.readline()
start = time.perf_counter_ns()
for _ in range(n):
    os.write(down_w, b"x"); os.read(up_r, 1)
print((time.perf_counter_ns() - start) / n, flush=True)
os.close(down_w)
os.waitpid(child, 0)
"""


def switch_ns(round_trips: int, probes_on: bool) -> float:
    """ns per pipe round trip between a target process and its child (each one blocks, is woken, switches in)."""
    return _timed_loop(PING_PONG, round_trips, (lambda pid: pid) if probes_on else None, ["--no-tcp-retransmits"])


def scheduler_overhead(round_trips: int, runs: int) -> dict:
    ns = {"off": [], "on": []}
    for _ in range(runs):
        for name in ns:
            ns[name].append(switch_ns(round_trips, name == "on"))
    med = {name: statistics.median(v) for name, v in ns.items()}
    return {"ns_per_round_trip_median": med, "runs": ns, "probe_cost_ns_round_trip": med["on"] - med["off"]}


def syscall_overhead(calls: int, runs: int) -> dict:
    modes = {"off": None, "on_target": True, "on_other_process": False}
    ns = {name: [] for name in modes}
    for _ in range(runs):
        for name, mode in modes.items():
            ns[name].append(syscall_ns(calls, mode))
    med = {name: statistics.median(v) for name, v in ns.items()}
    return {"ns_per_call_median": med, "runs": ns,
            "probe_cost_ns_target": med["on_target"] - med["off"],
            "probe_cost_ns_other_process": med["on_other_process"] - med["off"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index", type=Path, default=Path("data/index/scifact"))
    parser.add_argument("--beir", type=Path, default=Path("datasets/scifact"))
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--round-s", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--syscall-calls", type=int, default=2_000_000)
    parser.add_argument("--round-trips", type=int, default=200_000, help="pipe round trips per scheduler run")
    parser.add_argument("--syscall-runs", type=int, default=5, help="alternating runs of each micro-benchmark")
    parser.add_argument("--json", type=Path, help="results file (default benchmarks/results/probes.json)")
    args = parser.parse_args()
    run = BenchmarkRun("probes")
    queries = list(load_queries(args.beir).values())[:200]
    result = {"service": service_overhead(args.index, queries, args.clients, args.round_s, args.rounds),
              "scheduler": scheduler_overhead(args.round_trips, args.syscall_runs),
              "syscall": syscall_overhead(args.syscall_calls, args.syscall_runs),
              "settings": {k: str(v) for k, v in vars(args).items()}}
    print(f"{'config':<20}{'req/s (median)':>16}{'loss %':>9}{'P50 ms':>9}{'P99 ms':>9}{'requests':>10}")
    for name, row in result["service"].items():
        print(f"{name:<20}{row['rps_median']:>16.1f}{row['throughput_loss_pct']:>9.2f}{row['p50_ms']:>9.2f}"
              f"{row['p99_ms']:>9.2f}{row['requests']:>10}")
    c = result["scheduler"]
    print("pipe round trip ns (median): " + ", ".join(f"{k} {v:.0f}" for k, v in c["ns_per_round_trip_median"].items())
          + f"; scheduler probes add {c['probe_cost_ns_round_trip']:.0f} ns per round trip "
          "(two wake-ups and four context switches, two of them the target's)")
    s = result["syscall"]
    print("getppid() ns per call (median): " + ", ".join(f"{k} {v:.0f}" for k, v in s["ns_per_call_median"].items()))
    print(f"syscall probe cost: {s['probe_cost_ns_target']:.0f} ns per syscall of the target, "
          f"{s['probe_cost_ns_other_process']:.0f} ns per syscall of any other process")
    print(f"wrote {run.write(result, args.json)}")


if __name__ == "__main__":
    main()
