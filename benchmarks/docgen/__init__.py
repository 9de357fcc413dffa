"""docs/benchmarks.md from the results files in benchmarks/results/: the page is ``page.PAGE``
(``python benchmarks/render_docs.py``; ``--check`` in CI and tests/test_benchmarks_doc.py)."""
