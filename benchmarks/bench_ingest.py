"""Ingestion time and peak memory: `ragheat ingest --force` of each corpus at each embedding precision, alike.

    .venv/bin/python benchmarks/bench_ingest.py --runs datasets/scifact:int8,datasets/scifact:fp32,wiki:int8

Each run is the plain command, in its own process, with nothing else inside it (no evaluation): wall time,
CPU time, peak RSS (the largest of the ingest process and the children it waited for, from wait4), and the
stage timings and counts from the manifest of the generation it published. Each precision's ONNX model is
built into the cache before the first run, so no run counts the conversion. --rounds repeats the whole list
(interleaved, so both precisions see the same machine) to show the spread. The indexes land in
--index-root/<corpus>[-<precision>] (no suffix for the configured precision, so data/index/scifact is the
index the other benchmarks use). Writes benchmarks/results/ingest.json (--json elsewhere).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from loadgen.resultsfile import BenchmarkRun
from rag.embedding.embedder import OnnxEmbedder
from rag.index.store import read_manifest
from rag.settings import RagheatSettings

RAGHEAT = Path(sys.executable).parent / "ragheat"


def index_dir(root: Path, source: str, precision: str, default_precision: str) -> Path:
    name = Path(source).name or source
    return root / (name if precision == default_precision else f"{name}-{precision}")


def ingest_once(source: str, index: Path, precision: str, log: Path) -> dict:
    """One `ragheat ingest --force`, timed from outside; its manifest's own timings and counts."""
    command = [str(RAGHEAT), "ingest", source, "--index", str(index), "--precision", precision, "--force"]
    with log.open("a") as out:
        out.write(f"\n$ {' '.join(command)}\n")
        out.flush()
        start = time.perf_counter()
        child = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed with exit status {child.returncode}; see {log}")
    manifest = read_manifest(index)
    return {"wall_s": round(wall, 2), "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
            "peak_rss_mib": round(usage.ru_maxrss / 1024, 1), "timings_s": manifest["timings_s"],
            "counts": manifest["counts"], "generation": manifest["generation"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", default="datasets/scifact:int8,datasets/scifact:fp32",
                        help="SOURCE:PRECISION, comma-separated (SOURCE: a BEIR folder, a text folder, or wiki)")
    parser.add_argument("--index-root", type=Path, default=Path("data/index"))
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--log", type=Path, default=Path("data/bench/ingest.log"))
    parser.add_argument("--json", type=Path, help="results file (default benchmarks/results/ingest.json)")
    args = parser.parse_args()
    run = BenchmarkRun("ingest")

    settings = RagheatSettings()
    default_precision = settings.embedding.precision
    plan = []
    for item in args.runs.split(","):
        source, _, precision = item.strip().rpartition(":")
        if not source or not precision:
            raise SystemExit(f"--runs: {item!r} is not SOURCE:PRECISION")
        plan.append((source, precision))
    args.log.parent.mkdir(parents=True, exist_ok=True)
    for precision in dict.fromkeys(p for _, p in plan):
        # The ONNX model of each precision is built and cached once, before any timing: a first ingest would
        # otherwise count the conversion (and quantisation) too.
        OnnxEmbedder(settings.embedding.model_copy(update={"precision": precision})).warm_up()
    rounds: dict[str, list[dict]] = {f"{s}:{p}": [] for s, p in plan}
    for r in range(args.rounds):
        for source, precision in plan:
            index = index_dir(args.index_root, source, precision, default_precision)
            result = ingest_once(source, index, precision, args.log)
            rounds[f"{source}:{precision}"].append(result)
            print(f"round {r + 1} {source} {precision}: {result['wall_s']:.1f} s wall, "
                  f"embed {result['timings_s'].get('embed', 0):.1f} s, peak RSS {result['peak_rss_mib']:.0f} MiB",
                  flush=True)
    runs = []
    for (source, precision) in plan:
        done = rounds[f"{source}:{precision}"]
        runs.append({"source": source, "precision": precision,
                     "index": str(index_dir(args.index_root, source, precision, default_precision)),
                     "documents": done[0]["counts"]["documents"], "chunks": done[0]["counts"]["chunks"],
                     "wall_s": statistics.median(d["wall_s"] for d in done),
                     "embed_s": statistics.median(d["timings_s"].get("embed", 0.0) for d in done),
                     "graph_s": statistics.median(d["timings_s"].get("graph", 0.0) for d in done),
                     "peak_rss_mib": max(d["peak_rss_mib"] for d in done), "rounds": done})
    results = {"rounds": args.rounds, "default_precision": default_precision,
               "runs": runs}
    print(f"wrote {run.write(results, args.json)}")


if __name__ == "__main__":
    main()
