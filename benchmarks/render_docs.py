"""Render docs/benchmarks.md from the results files in benchmarks/results/ (the page: benchmarks/docgen/page.py).

    .venv/bin/python benchmarks/render_docs.py            write docs/benchmarks.md and its images (docs/images/)
    .venv/bin/python benchmarks/render_docs.py --check    exit 1 with a diff if the doc or an image differs from a
                                                          fresh rendering, or if a section has no results

A results file is written by its benchmark (loadgen/resultsfile.py), so re-measuring a section is one command
(bash benchmarks/run_all.sh STEP) followed by this one.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere: benchmarks.docgen, loadgen

from benchmarks.docgen.page import render, render_images, step  # noqa: E402

DOC = REPO / "docs" / "benchmarks.md"
RESULTS = REPO / "benchmarks" / "results"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    parser.add_argument("--results", type=Path, default=RESULTS, help="results folder (default benchmarks/results)")
    parser.add_argument("--out", type=Path, default=DOC, help="the doc to write or check")
    args = parser.parse_args(argv)
    try:
        text, missing = render(args.results)
    except ValueError as exc:
        print(f"render_docs: {exc}", file=sys.stderr)
        return 2
    for section, files in missing.items():
        print(f"section {section!r} has no results: {', '.join(f + '.json' for f in files)} "
              f"(bash benchmarks/run_all.sh {' '.join(dict.fromkeys(step(f) for f in files))})", file=sys.stderr)
    try:
        images = {args.out.parent / "images" / name: svg for name, svg in render_images(args.results).items()}
    except ValueError as exc:
        print(f"render_docs: {exc}", file=sys.stderr)
        return 2
    if not args.check:
        args.out.write_text(text, encoding="utf-8")
        for path, svg in images.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(svg, encoding="utf-8")
        print(f"wrote {args.out}" + "".join(f", {path}" for path in images))
        return 0
    stale = [path for path, svg in images.items() if not path.is_file() or path.read_text(encoding="utf-8") != svg]
    for path in stale:
        print(f"{path} differs from its rendering: run .venv/bin/python benchmarks/render_docs.py", file=sys.stderr)
    current = args.out.read_text(encoding="utf-8") if args.out.is_file() else ""
    if stale and current == text:
        return 1
    if current != text:
        sys.stdout.writelines(difflib.unified_diff(current.splitlines(keepends=True), text.splitlines(keepends=True),
                                                   str(args.out), "rendered from the results files"))
        print(f"\n{args.out} differs from its rendering: run .venv/bin/python benchmarks/render_docs.py",
              file=sys.stderr)
        return 1
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
