"""Give a benchmark that writes plain JSON (``--json PATH``) a results file, until it writes one itself.

    .venv/bin/python benchmarks/wrap_results.py embedding benchmarks/results/embedding.json -- \
        .venv/bin/python benchmarks/bench_embedding.py --beir datasets/scifact

runs the command with ``--json <scratch file>`` appended and writes its JSON as the ``data`` of a results file
(loadgen/resultsfile.py). The clock, load average and CPU counters start before the command and stop after it,
and its CPU time counts as the benchmark's own; the command recorded is this line, which re-measures the file.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script: loadgen

from loadgen.resultsfile import BenchmarkRun  # noqa: E402

USAGE = "usage: wrap_results.py NAME RESULTS_FILE -- COMMAND [ARGS...]"


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print(USAGE, file=sys.stderr)
        return 2
    name, out, command = argv[0], Path(argv[1]), argv[3:]
    run = BenchmarkRun(name)
    with tempfile.TemporaryDirectory(prefix=f"wrap-{name}-") as scratch:
        raw = Path(scratch) / f"{name}.json"
        done = subprocess.run([*command, "--json", str(raw)])
        if done.returncode != 0:
            print(f"wrap_results: {name}: the benchmark exited {done.returncode}; no results file written",
                  file=sys.stderr)
            return done.returncode
        try:
            data = json.loads(raw.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            print(f"wrap_results: {name}: the benchmark left no JSON at --json ({exc})", file=sys.stderr)
            return 1
    print(f"wrote {run.write(data, out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
