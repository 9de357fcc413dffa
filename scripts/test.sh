#!/usr/bin/env bash
# Install everything the tests need, then run the whole suite.
#   scripts/test.sh            two passes: the tests not marked serial on RAGHEAT_TEST_WORKERS pytest-xdist workers
#                              (default 2: much of the suite waits on servers, scrapes and alerts), then the serial
#                              ones alone (they measure CPU time, scheduling or latency that other tests would change);
#                              a last line sums both passes
#   scripts/test.sh ARGS...    one pytest run with ARGS (a file, -k, -m, ...), nothing in parallel
# RAGHEAT_TEST_WORKERS=1 runs the whole suite in one pass, one test at a time.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh --test
# vLLM (CPU build) in its own environment, for the generation tests (tests/vllm).
bash scripts/install_vllm.sh
pytest=(.venv/bin/python -m pytest)
workers=${RAGHEAT_TEST_WORKERS:-2}
# The slowest setups, calls and teardowns close each report, so that CI's output says where the time goes.
if [ $# -gt 0 ] || [ "$workers" -le 1 ]; then
  exec "${pytest[@]}" --durations=25 "$@"
fi

# The JUnit reports stay in out/test-reports: scripts/test_group_seconds.py reads where the time went from them.
reports=out/test-reports
rm -rf "$reports" && mkdir -p "$reports"
# A short base folder: xdist adds a folder per worker to every test's path, and the graph store's Unix socket inside
# an index folder must stay under the kernel's 108 bytes.
basetemp=$(mktemp -d /tmp/rh.XXXX)
trap 'rm -rf "$basetemp"' EXIT
started=$SECONDS
parallel=0 serial=0
"${pytest[@]}" -n "$workers" --dist loadfile -m "not gpu and not serial" --durations=25 \
  --basetemp="$basetemp/parallel" --junitxml="$reports/parallel.xml" || parallel=$?
# Where the parallel pass's time went, by the groups its workers take whole (tests/conftest.py).
.venv/bin/python scripts/test_group_seconds.py "$reports/parallel.xml" --top 12 || true
"${pytest[@]}" -m "serial and not gpu" --durations=10 --junitxml="$reports/serial.xml" || serial=$?
.venv/bin/python - "$reports" "$((SECONDS - started))" <<'EOF'
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

totals = dict.fromkeys(("tests", "failures", "errors", "skipped"), 0)
for report in sorted(Path(sys.argv[1]).glob("*.xml")):
    for suite in ET.parse(report).getroot().iter("testsuite"):
        for key in totals:
            totals[key] += int(suite.get(key, 0))
failed = totals["failures"] + totals["errors"]
passed = totals["tests"] - failed - totals["skipped"]
print(f"\nboth passes, {sys.argv[2]} s in all:")
print(f"suite: {passed} passed, {failed} failed, {totals['skipped']} skipped")
EOF
[ "$parallel" -eq 0 ] && [ "$serial" -eq 0 ]
