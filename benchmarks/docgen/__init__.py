"""docs/benchmarks.md from benchmarks/doc_template.md and the results files in benchmarks/results/
(``python benchmarks/render_docs.py``; ``--check`` in CI and tests/test_benchmarks_doc.py)."""
