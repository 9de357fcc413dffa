"""Sum a parallel pass's JUnit report (``scripts/test.sh`` keeps it in out/test-reports/) by the groups its workers
take whole (tests/conftest.py ``worker_group``) and print the longest: where the pass's time goes.

    .venv/bin/python scripts/test_group_seconds.py out/test-reports/parallel.xml [--top 15]
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.conftest import worker_group  # noqa: E402


def module_of(classname: str) -> str:
    """The test file of a JUnit ``classname`` (``tests.rag.test_x`` or ``tests.rag.test_x.SomeClass``)."""
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):
        path = "/".join(parts[:end]) + ".py"
        if (REPO / path).is_file():
            return path
    return classname


def group_seconds(report: Path) -> tuple[Counter, Counter]:
    seconds, tests = Counter(), Counter()
    for case in ET.parse(report).getroot().iter("testcase"):
        group = worker_group(f"{module_of(case.get('classname', ''))}::{case.get('name')}")
        seconds[group] += float(case.get("time", 0.0))
        tests[group] += 1
    return seconds, tests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", type=Path, help="the parallel pass's JUnit XML")
    parser.add_argument("--top", type=int, default=15, help="how many of the longest groups to print")
    args = parser.parse_args()
    if not args.report.is_file():
        parser.error(f"{args.report}: no such report (scripts/test.sh writes out/test-reports/parallel.xml)")
    seconds, tests = group_seconds(args.report)
    print(f"{len(seconds)} groups, {sum(seconds.values()):.0f} s of tests in all; the longest:")
    for group, total in seconds.most_common(args.top):
        print(f"{total:8.1f} s {tests[group]:5d} tests  {group}")


if __name__ == "__main__":
    main()
