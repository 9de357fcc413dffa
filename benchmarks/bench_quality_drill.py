"""The quality SLO's drill (loadgen/quality_drill.py), several rounds: after a healthy stretch, how long a broken index
generation published into a serving index folder (another encoder's space, shuffled vectors) and out-of-domain
traffic take to page for quality, on the test profile's windows (every window divided by 60: a
minute of the drill stands for an hour of production), while the service's own questions page nobody and no latency
page fires.

    .venv/bin/python benchmarks/bench_quality_drill.py --results-file benchmarks/results/quality-drill.json
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import SMOKE  # noqa: E402
from loadgen.resultsfile import BenchmarkRun  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--index", type=Path, default=Path("data/index/scifact"), help="the healthy service's index")
    p.add_argument("--questions", type=Path, default=REPO / "datasets" / "scifact" / "queries.jsonl",
                   help="the corpus's own questions (steady load)")
    p.add_argument("--other-questions", type=Path, default=REPO / "datasets" / "hotpotqa-dev" / "queries.jsonl",
                   help="another corpus's questions (the out-of-domain fault)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rate", type=float, default=5.0, help="requests per second to each service")
    p.add_argument("--results-file", type=Path, default=None,
                   help="write a benchmark results file (loadgen/resultsfile.py) here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    import shutil

    from dashboards import quality, render, slo
    from loadgen.quality_drill import BREAKERS, run_drill
    from telemetry.metrics import QUALITY_METRICS

    args = parse_args(argv)
    rounds = 1 if SMOKE else args.rounds
    record = BenchmarkRun("quality-drill")
    fast_long_s = next(a for a in slo.BURN_ALERTS if a.speed == "fast").long_s // slo.TEST.divisor
    runs = []
    with tempfile.TemporaryDirectory(prefix="quality-drill-") as tmp:
        folder = Path(tmp)
        render.write(folder / "rules", slo.TEST)
        env = {**os.environ, "RAGHEAT_GRAPH__ENABLED": "false", "RAGHEAT_SERVER__RELOAD_POLL_S": "1"}
        for i in range(rounds):
            broken = {}  # healthy copies, each round: the drill publishes a broken generation into them
            for fault in BREAKERS:
                shutil.rmtree(folder / fault, ignore_errors=True)
                broken[fault] = Path(shutil.copytree(args.index, folder / fault, symlinks=True))
            run = run_drill(args.index, broken, args.questions, args.other_questions,
                            folder / "rules" / render.RULES_FILE,
                            quality_alerts=[quality.DRIFT_ALERT, slo.alert_name(slo.QUALITY)],
                            latency_alert=slo.alert_name(slo.LATENCY), verdict_family=QUALITY_METRICS["answer_quality"],
                            rate=args.rate, healthy_s=fast_long_s + 5, fire_by_s=2 * fast_long_s, env=env,
                            progress=lambda message: print(f"round {i + 1}: {message}", flush=True))
            runs.append(dataclasses.asdict(run))
            print(f"round {i + 1}: fired after {run.fired_after_s}; healthy pages {len(run.before)}; latency pages "
                  f"{len(run.latency_pages)}", flush=True)
    data = {"rounds": runs, "rate": args.rate, "profile": slo.TEST.name, "divisor": slo.TEST.divisor,
            "drift_windows_s": [quality.DRIFT_LONG_S, quality.DRIFT_SHORT_S],
            "index": str(args.index), "questions": str(args.questions), "other_questions": str(args.other_questions)}
    print(f"wrote {record.write(data, args.results_file)}")


if __name__ == "__main__":
    main()
