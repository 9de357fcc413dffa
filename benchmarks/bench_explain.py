"""The fault matrix of ``ragheat explain``: a live ``ragheat serve`` under constant open-loop load, scraped by a real
Prometheus; each fault is injected in turn, after quiet seconds that serve as its baseline, and ``explain`` is run
every few seconds from the fault's start until its top cause is the right one (or the fault's time is up).

    .venv/bin/python benchmarks/bench_explain.py --index data/index/scifact --queries datasets/scifact/queries.jsonl

Faults: ``none`` (the explanation must say nothing is wrong: any cause is a false alarm), ``cpu_hog`` (one process
spinning per core beside the service: expected ``cpu_neighbour``), ``overload`` (the offered load multiplied past the
knee: expected ``overload``). Per fault and run: the verdict and the ranked causes at the end of the fault's window,
top-1 and top-2 correctness, and the seconds from the fault's start to the first correct explanation.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dashboards.promapi import PrometheusApi  # noqa: E402
from explain.causes import explain  # noqa: E402
from explain.report import as_json  # noqa: E402
from explain.signals import Span, gather  # noqa: E402
from loadgen.faults import CpuHog, OpenLoop, wait_until  # noqa: E402
from loadgen.resultsfile import BenchmarkRun  # noqa: E402
from stack.prometheus import LocalPrometheus  # noqa: E402
from stack.servers import ServeProcess  # noqa: E402

EXPECTED = {"none": None, "cpu_hog": "cpu_neighbour", "overload": "overload"}


def explained(api: PrometheusApi, window_s: int, at: float) -> dict:
    return as_json(explain(gather(api, None, Span(window_s), Span(window_s, window_s), at=at)))


def drill(fault: str, load: OpenLoop, api: PrometheusApi, args) -> dict:
    """One fault: quiet baseline, the fault with explanations every ``--every-s``, then quiet recovery."""
    start = time.time() + args.window_s  # the quiet seconds before are the baseline
    wait_until(start)
    tries, first_correct = [], None
    with contextlib.ExitStack() as fault_on:
        if fault == "cpu_hog":
            fault_on.enter_context(CpuHog())
        fault_on.callback(setattr, load, "rate", args.quiet_qps)
        if fault == "overload":
            load.rate = args.overload_qps
        offset = args.every_s
        while offset <= args.fault_s:
            at = start + offset
            wait_until(at + args.scrape_s)  # the sample at `at` is in
            result = explained(api, args.window_s, at)
            kinds = [c["kind"] for c in result["causes"]]
            tries.append({"after_s": offset, "verdict": result["verdict"], "causes": kinds})
            correct = (result["verdict"] == "ok") if EXPECTED[fault] is None else kinds[:1] == [EXPECTED[fault]]
            if correct and first_correct is None and EXPECTED[fault] is not None:
                first_correct = offset
            if offset >= args.window_s and (first_correct is not None or EXPECTED[fault] is None):
                break
            offset += args.every_s
    final = explained(api, args.window_s, start + min(args.window_s, args.fault_s))
    kinds = [c["kind"] for c in final["causes"]]
    expected = EXPECTED[fault]
    row = {"fault": fault, "expected": expected, "verdict": final["verdict"], "causes": kinds,
           "headline": final["headline"], "p99_ms": final["p99_ms"], "baseline_p99_ms": final["baseline_p99_ms"],
           "top1": (final["verdict"] == "ok") if expected is None else kinds[:1] == [expected],
           "top2": (final["verdict"] == "ok") if expected is None else expected in kinds[:2],
           "false_alarm": expected is None and final["verdict"] != "ok",
           "seconds_to_correct": first_correct, "tries": tries, "explanation": final}
    wait_until(time.time() + args.window_s)  # recovery: the next fault's baseline is quiet again
    return row


def summarise(rows: list[dict]) -> dict:
    by_fault = {}
    for fault in dict.fromkeys(r["fault"] for r in rows):
        mine = [r for r in rows if r["fault"] == fault]
        times = [r["seconds_to_correct"] for r in mine if r["seconds_to_correct"] is not None]
        by_fault[fault] = {"runs": len(mine), "top1": sum(r["top1"] for r in mine) / len(mine),
                           "top2": sum(r["top2"] for r in mine) / len(mine),
                           "false_alarms": sum(r["false_alarm"] for r in mine),
                           "median_seconds_to_correct": statistics.median(times) if times else None,
                           "max_seconds_to_correct": max(times) if times else None}
    faulty = [r for r in rows if r["expected"] is not None]
    return {"faults": by_fault,
            "top1": sum(r["top1"] for r in faulty) / len(faulty) if faulty else None,
            "top2": sum(r["top2"] for r in faulty) / len(faulty) if faulty else None,
            "false_alarms": sum(r["false_alarm"] for r in rows),
            "quiet_runs": sum(r["expected"] is None for r in rows)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index", type=Path, required=True, help="the index `ragheat serve` serves")
    parser.add_argument("--queries", type=Path, required=True, help="a BEIR queries.jsonl to send")
    parser.add_argument("--faults", default=",".join(EXPECTED), help=f"comma list of {', '.join(EXPECTED)}")
    parser.add_argument("--runs", type=int, default=3, help="runs of each fault")
    parser.add_argument("--window-s", type=int, default=20, help="the window explained (and its baseline)")
    parser.add_argument("--fault-s", type=int, default=60, help="the longest a fault lasts while not yet explained")
    parser.add_argument("--every-s", type=int, default=5, help="seconds between explanations during a fault")
    parser.add_argument("--scrape-s", type=float, default=1.0, help="Prometheus' scrape interval")
    parser.add_argument("--quiet-qps", type=float, default=6.0)
    parser.add_argument("--overload-qps", type=float, default=120.0)
    parser.add_argument("--json", type=Path, help="results file (default benchmarks/results/explain.json)")
    args = parser.parse_args()
    run = BenchmarkRun("explain")
    faults = [f.strip() for f in args.faults.split(",") if f.strip()]
    unknown = sorted(set(faults) - set(EXPECTED))
    if unknown:
        parser.error(f"--faults: unknown {', '.join(unknown)} (known: {', '.join(EXPECTED)})")
    env = {**os.environ, "RAGHEAT_CACHE__ENABLED": "false"}  # every request does the whole work
    rows = []
    with ServeProcess(args.index, env=env) as service, \
            LocalPrometheus(service.url.removeprefix("http://"), scrape_interval_s=args.scrape_s) as prometheus, \
            OpenLoop(service.url, args.quiet_qps, args.queries) as load:
        api = PrometheusApi(prometheus)
        time.sleep(args.window_s)  # warm-up: the first baseline starts after it
        for i in range(args.runs):
            for fault in faults:
                row = drill(fault, load, api, args)
                row["run"] = i
                rows.append(row)
                took = f", correct after {row['seconds_to_correct']} s" if row["seconds_to_correct"] else ""
                print(f"run {i + 1}/{args.runs} {fault}: {row['verdict']} {row['causes'][:3]}{took} | "
                      f"{row['headline']}", flush=True)
    summary = summarise(rows)
    print(f"top-1 {summary['top1']:.0%}, top-2 {summary['top2']:.0%}, false alarms {summary['false_alarms']} "
          f"of {summary['quiet_runs']} quiet runs")
    report = {"params": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "json"},
              "summary": summary, "rows": rows}
    print(f"wrote {run.write(report, args.json)}")


if __name__ == "__main__":
    main()
