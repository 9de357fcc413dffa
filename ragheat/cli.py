"""The ``ragheat`` command: the root Typer app, registering one module's commands per group
(``ragheat.commands``). Flags override settings from the environment (``RAGHEAT_<SECTION>__<FIELD>``), which
override defaults. Each command imports its heavy dependencies when it runs, so ``ragheat --help`` stays fast.
"""

from __future__ import annotations

import sys

import typer

from ragheat.commands import (bench, dashboards, demo, evaluate, explain, index, judge, keys, probes, quality, serve,
                              stack, steering, train, tune)

app = typer.Typer(help="ragheat: observability-first RAG on embedded defaults.", no_args_is_help=True,
                  pretty_exceptions_enable=False)

app.command()(index.ingest)
app.command()(serve.serve)
app.command()(serve.query)
app.command("eval")(evaluate.evaluate)
app.command("train-router")(train.train_router)
app.command("train-reranker")(train.train_reranker)
app.command("judge")(judge.judge)
app.command("calibrate-quality")(quality.calibrate_quality)
app.command("measure-ladder")(steering.measure_ladder)
app.command()(bench.bench)
app.command("ann-bench")(bench.ann_bench)
app.command("tune-vllm")(bench.tune_vllm)
app.command("tune")(tune.tune)
app.command()(demo.demo)
app.command()(explain.explain)
app.add_typer(dashboards.app, name="dashboards")
app.command("probes")(probes.probes)
app.add_typer(stack.app, name="stack")
app.add_typer(keys.app, name="keys")


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
