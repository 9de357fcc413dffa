"""Render docs/benchmarks.md from benchmarks/doc_template.md and the results files in benchmarks/results/.

    .venv/bin/python benchmarks/render_docs.py            write docs/benchmarks.md
    .venv/bin/python benchmarks/render_docs.py --check    exit 1 with a diff if the doc differs from a fresh
                                                          rendering, or if a required section has no results

The template holds the prose; every figure comes from a results file (benchmarks/docgen/). A results file is
written by its benchmark (loadgen/resultsfile.py), so re-measuring a section is one command
(benchmarks/run_all.sh STEP) followed by this one.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere: benchmarks.docgen, loadgen

from benchmarks.docgen.render import RenderError, render  # noqa: E402
from benchmarks.docgen.sections import SECTIONS, STEPS  # noqa: E402

TEMPLATE = REPO / "benchmarks" / "doc_template.md"
DOC = REPO / "docs" / "benchmarks.md"
RESULTS = REPO / "benchmarks" / "results"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    parser.add_argument("--results", type=Path, default=RESULTS, help="results folder (default benchmarks/results)")
    parser.add_argument("--template", type=Path, default=TEMPLATE)
    parser.add_argument("--out", type=Path, default=DOC, help="the doc to write or check")
    args = parser.parse_args(argv)
    try:
        rendered = render(args.template.read_text(encoding="utf-8"), SECTIONS, args.results, STEPS)
    except RenderError as exc:
        print(f"render_docs: {exc}", file=sys.stderr)
        return 2
    missing = rendered.missing_required
    for section, files in missing.items():
        print(f"required section {section!r} has no results: {', '.join(f + '.json' for f in files)} "
              f"(bash benchmarks/run_all.sh {' '.join(dict.fromkeys(STEPS.get(f, f) for f in files))})",
              file=sys.stderr)
    if not args.check:
        args.out.write_text(rendered.text, encoding="utf-8")
        print(f"wrote {args.out}: {len(rendered.measured)} sections measured, {len(rendered.missing)} not yet")
        return 1 if missing else 0
    current = args.out.read_text(encoding="utf-8") if args.out.is_file() else ""
    if current != rendered.text:
        sys.stdout.writelines(difflib.unified_diff(current.splitlines(keepends=True),
                                                   rendered.text.splitlines(keepends=True),
                                                   str(args.out), "rendered from the results files"))
        print(f"\n{args.out} differs from its rendering: run .venv/bin/python benchmarks/render_docs.py",
              file=sys.stderr)
        return 1
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
