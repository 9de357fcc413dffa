"""Capacity under overload: admission control on vs off, side by side.

Three ``ragheat serve`` processes over the same index, identical but for the admission settings (``on``: the
defaults, a bounded number of queries in flight and a bounded queue, queries that cannot meet their deadline shed with
503, the worker threads at ``admission.worker_nice``; ``on-nice-0``: the same with the workers at the event loop's
priority; ``off``: every query queued). All run for the whole benchmark; every step is
measured on each in turn (the order rotating), with the project's open-loop generator (Poisson arrivals, latency from
the intended send time, loadgen/runner.py), SciFact train claims as queries. Each step also records the CPU ms per
answer of the service and of the generator (loadgen/cpu.py), and the rate ceiling those set on the shared cores.

1. The knee: ascending rates until a configuration's P99 passes ``--stop-factor`` SLOs (or it sheds or fails more
   than 10 %); the knee is the highest rate meeting the SLO with every lower rate meeting it (``find_knee``: shed
   queries count against it like errors). The overload steps are multiples of admission-on's knee.
2. Steady overload: 2x the knee for ``--duration``.
3. A short burst: 4x the knee for ``--burst`` seconds, measured from its first request (no warm-up).

Per step: P99 of the answered (admitted) queries, goodput (answers within the SLO per second), shed queries by
reason and their refusal latency as the client saw it (loopback included), errors. The generator shares the machine's
cores with both services: on two cores it costs the service capacity, as it would any load test on one machine.
docs/benchmarks.md, "Capacity and admission control", shows the results.

    .venv/bin/python benchmarks/bench_capacity.py --index data/index/scifact \\
        --queries datasets/scifact --results-file benchmarks/results/capacity.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import MAX_ERROR_RATE, check_index, rotated, sweep_parser  # noqa: E402
from benchmarks.docgen.page import preview  # noqa: E402
from loadgen.arrivals import parse_rates  # noqa: E402
from loadgen.cpu import CpuWindow  # noqa: E402
from loadgen.resultsfile import BenchmarkRun  # noqa: E402
from loadgen.runner import StopSignals, open_loop, run, shuffled  # noqa: E402
from loadgen.stats import find_knee  # noqa: E402
from stack.servers import ServeFleet  # noqa: E402

# Admission control alone: steering (on by default) is measured against it in bench_steering.py.
STEERING_OFF = {"RAGHEAT_STEERING__ENABLED": "false"}
CONFIGS = {"on": STEERING_OFF, "on-nice-0": {**STEERING_OFF, "RAGHEAT_ADMISSION__WORKER_NICE": "0"},
           "off": {**STEERING_OFF, "RAGHEAT_ADMISSION__ENABLED": "false", "RAGHEAT_ADMISSION__DEGRADE": "false"}}
SATURATED = 0.10  # past this share of errors or shed queries a configuration is not offered higher knee rates


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = sweep_parser(__doc__.split("\n\n")[0], rates="50:400:50", duration=10.0, stop_factor=3.0,
                     ready_timeout=240.0, work="service logs")
    p.add_argument("--queries", type=Path, default=Path("datasets/scifact"),
                   help="a BEIR folder (its train claims: qrels/train.tsv) or a queries file")
    p.add_argument("--burst", type=float, default=3.0, help="seconds of the 4x burst (all measured)")
    p.add_argument("--rounds", type=int, default=1, help="repeat the 2x and 4x steps this many times")
    args = p.parse_args(argv)
    check_index(p, args.index)
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    return args


def train_claims(path: Path) -> list[str]:
    """SciFact's train claims (the queries in qrels/train.tsv) from a BEIR folder; a plain queries file as it is."""
    from loadgen.runner import load_queries

    if path.is_dir():
        ids = {line.split("\t")[0] for line in (path / "qrels" / "train.tsv").read_text().splitlines()[1:] if line}
        rows = [json.loads(line) for line in (path / "queries.jsonl").read_text().splitlines() if line.strip()]
        texts = [r["text"] for r in rows if r["_id"] in ids]
        if not texts:
            raise SystemExit(f"{path}: no train claims (qrels/train.tsv ids absent from queries.jsonl)")
        return texts
    return load_queries(path)


def row(step, phase: str) -> dict:
    return {"phase": phase, "offered_qps": step.offered_qps, "duration_s": step.duration_s,
            "requests": step.requests, "achieved_qps": round(step.achieved_qps, 2),
            "goodput_qps": round(step.goodput_qps, 2), "errors": step.errors, "error_rate": round(step.error_rate, 5),
            "shed": step.shed, "shed_rate": round(step.shed_rate, 5), "shed_reasons": step.shed_reasons,
            "refusal_ms": step.refusal_ms, "refusal_server_ms": step.refusal_server_ms, "expired_ms": step.expired_ms,
            "latency_ms": step.latency_ms, "send_error_ms": step.send_error_ms,
            "queue_ms": step.stages_ms.get("queue"), "cpu_ms_per_answer": step.cpu_ms_per_answer,
            "interrupted": step.interrupted}


def main(argv: list[str] | None = None) -> int:
    record = BenchmarkRun("capacity")
    args = parse_args(argv)
    texts = shuffled(train_claims(args.queries), 0)
    rates = parse_rates(args.rates)
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-capacity-"))
    work.mkdir(parents=True, exist_ok=True)
    configs = list(CONFIGS)
    knee_steps: dict[str, list] = {c: [] for c in configs}
    overload: dict[str, list[dict]] = {c: [] for c in configs}
    stopped: dict[str, str] = {}
    load_before = os.getloadavg()
    fleet = {name: ((), env) for name, env in CONFIGS.items()}
    with ServeFleet(args.index, fleet, work, args.ready_timeout) as services, StopSignals() as stop:
        def measure(config: str, rate: float, duration: float, warmup: float, seed: int):
            cpu = CpuWindow([services.pids[config]])
            step = run(open_loop(services.urls[config] + "/v1/query", texts, rate, duration, warmup, seed=seed,
                                 timeout_s=args.timeout, slo_ms=args.slo_ms, cpu=cpu), stop)
            if step is not None:
                p99 = step.latency_ms.get("p99")
                nan = float("nan")
                print(f"{config:9s} {rate:7g} req/s  answered {step.achieved_qps:7.1f}/s  goodput "
                      f"{step.goodput_qps:7.1f}/s  P99 {p99 or nan:8.1f} ms  shed {step.shed:5d} {step.shed_reasons} "
                      f"(refusal P50/P99 {step.refusal_ms.get('p50') or nan:.2f}/{step.refusal_ms.get('p99') or nan:.2f}"
                      f" ms, in the service {step.refusal_server_ms.get('p99') or nan:.2f} ms)  errors "
                      f"{step.errors}", flush=True)
            return step

        for i, rate in enumerate(rates):  # 1. the knee
            for config in rotated(configs, i):
                if config in stopped or stop.presses:
                    continue
                step = measure(config, rate, args.duration, args.warmup, i)
                if step is None:
                    break
                knee_steps[config].append(step)
                p99 = step.latency_ms.get("p99")
                if (p99 is None or p99 > args.stop_factor * args.slo_ms or step.error_rate > SATURATED
                        or step.shed_rate > SATURATED):
                    stopped[config] = f"saturated at {rate:g} req/s"
            if len(stopped) == len(configs):
                break
        knees = {c: find_knee(knee_steps[c], args.slo_ms, MAX_ERROR_RATE) for c in configs}
        reference = knees["on"] or rates[0]
        for r in range(args.rounds):  # 2. and 3. overload, alternating which configuration goes first
            for config in rotated(configs, r):
                for phase, factor, duration, warmup in (("2x", 2, args.duration, args.warmup),
                                                        ("4x burst", 4, args.burst, 0.0)):
                    if stop.presses:
                        continue
                    step = measure(config, factor * reference, duration, warmup, 1000 + r)
                    if step is not None:
                        overload[config].append(row(step, phase))
    results = {
        "slo_ms": args.slo_ms, "max_error_rate": MAX_ERROR_RATE, "duration_s": args.duration, "warmup_s": args.warmup,
        "burst_s": args.burst, "rounds": args.rounds, "rates": rates, "queries": len(texts),
        "queries_source": str(args.queries), "index": str(args.index), "cores": os.cpu_count(),
        "load_average_before": load_before, "load_average_after": os.getloadavg(), "reference_knee_qps": reference,
        "configs": {c: {"env": CONFIGS[c], "knee_qps": knees[c], "stopped": stopped.get(c),
                        "knee_steps": [row(s, "knee") for s in knee_steps[c]], "overload": overload[c]}
                    for c in configs},
        "interrupted": bool(stop.presses),
    }
    if args.results_file is not None:
        print(f"wrote {record.write(results, args.results_file)}")
    print(preview("capacity", results))
    return 0


if __name__ == "__main__":
    started = time.monotonic()
    code = main()
    print(f"took {time.monotonic() - started:.0f} s")
    sys.exit(code)
