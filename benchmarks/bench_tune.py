"""``ragheat tune`` end to end, four ways: SciFact train with its human labels, the same claims without any (a
folder of the corpus and the questions alone: the language-model judge labels them, or says why it cannot), HotpotQA
dev with its labels, and SciFact train again with a model server (``--llm-model``: step 3's sweep, and step 4 with
the model server beside the service; it starts from the first run's finished steps, copied, which its same inputs
reuse). Each run is the command itself, writing its report as a results file
(``benchmarks/results/tune-<name>.json``); docs/benchmarks.md, "Tuning pipeline", renders them.

    .venv/bin/python benchmarks/bench_tune.py --queries 300 --unlabelled-queries 50
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def unlabelled_copy(beir: Path, split: str, folder: Path) -> Path:
    """``beir``'s corpus and the queries of ``split``, without any qrels: what a user without labels has."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(beir / "corpus.jsonl", folder / "corpus.jsonl")
    qids = {line.split("\t")[0] for line in (beir / "qrels" / f"{split}.tsv").read_text().splitlines()[1:]}
    lines = [line for line in (beir / "queries.jsonl").read_text().splitlines() if json.loads(line)["_id"] in qids]
    (folder / "queries.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queries", type=int, default=300, help="labelled queries per run (drawn with the seed)")
    parser.add_argument("--unlabelled-queries", type=int, default=50, help="queries the judge labels in the run "
                                                                            "without labels")
    parser.add_argument("--judge-sample", type=int, default=20, help="beside human labels: queries judged too")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rates", default="40:320:40")
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--only", default="scifact,scifact-unlabelled,hotpotqa-dev,scifact-model")
    parser.add_argument("--llm-model", default="data/models/SmolLM2-135M-Instruct",
                        help="the model folder of the scifact-model run (scripts/install_vllm.sh converts it)")
    parser.add_argument("--llm-grid", default="4,8:2048", help="that run's step 3 grid: MAX_NUM_SEQS:MAX_MODEL_LEN")
    parser.add_argument("--scifact", default="datasets/scifact:train:data/index/scifact",
                        help="BEIR:SPLIT:INDEX of the SciFact runs")
    parser.add_argument("--hotpot", default="datasets/hotpotqa-dev:dev:data/index/hotpotqa-dev",
                        help="BEIR:SPLIT:INDEX of the HotpotQA run")
    # Relative to the repository (the runs' working folder), so the recorded commands hold on any checkout.
    parser.add_argument("--out", type=Path, default=Path("out/tune"))
    parser.add_argument("--results", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    ragheat = str(Path(sys.executable).parent / "ragheat")
    common = ["--rounds", str(args.rounds), "--rates", args.rates, "--duration", str(args.duration)]
    sci_beir, sci_split, sci_index = args.scifact.split(":")
    hot_beir, hot_split, hot_index = args.hotpot.split(":")
    runs = {
        "scifact": ["--beir", sci_beir, "--split", sci_split, "--index", sci_index,
                    "--queries", str(args.queries), "--judge-sample", str(args.judge_sample)],
        "scifact-unlabelled": ["--beir", str(unlabelled_copy(REPO / sci_beir, sci_split,
                                                             REPO / args.out / "scifact-unlabelled-beir")
                                             .relative_to(REPO)),
                               "--index", sci_index, "--queries", str(args.unlabelled_queries)],
        "hotpotqa-dev": ["--beir", hot_beir, "--split", hot_split, "--index", hot_index,
                         "--queries", str(args.queries), "--judge-sample", str(args.judge_sample)],
    }
    seqs, lens = args.llm_grid.split(":")
    runs["scifact-model"] = [*runs["scifact"], "--llm-model", args.llm_model, "--llm-max-num-seqs", seqs,
                             "--llm-max-model-len", lens]
    for name in [n.strip() for n in args.only.split(",") if n.strip()]:
        first, state = REPO / args.out / "scifact", REPO / args.out / name / "state.json"
        if name == "scifact-model" and not state.exists() and (first / "state.json").exists():
            # The first run's folder: its labels, baseline and head steps have the same inputs here and are reused.
            shutil.copytree(first, state.parent, dirs_exist_ok=True)
        command = [ragheat, "tune", *runs[name], "--out", str(args.out / name), *common,
                   "--results-file", str(args.results / f"tune-{name}.json")]
        print("$", " ".join(command), flush=True)
        subprocess.run(command, cwd=REPO, check=True)


if __name__ == "__main__":
    main()
