"""``ragheat tune``: the four-step tuning pipeline (tuning/) as one resumable command: labels, the reranker's head,
the model server's batch limits, hardware-aware placement; a settings file ``ragheat serve --settings`` reads and a
report of what each step bought."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ragheat.clikit import fail as _fail, guard, load_settings, out, progress_bar

_guard = guard()


def _positive_ints(flag: str, text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        _fail(f"{flag} takes whole numbers separated by commas, not {text!r}")
    if not values or min(values) < 1:
        _fail(f"{flag} needs at least one value, each at least 1 (got {text!r})")
    return values


def _rates(text: str) -> tuple[float, ...]:
    from loadgen.arrivals import parse_rates

    try:
        return tuple(parse_rates(text))
    except ValueError as exc:
        _fail(str(exc))


def _knobs(text: str) -> tuple[str, ...] | None:
    from tuning.placement_step import KNOBS  # numpy behind it: not loaded for every command's start

    if text == "all":
        return None
    if text == "none":
        return ()
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in KNOBS]
    if unknown or not names:
        _fail(f"--knobs takes all, none or some of {', '.join(KNOBS)} (comma-separated), not {text!r}")
    return names


@_guard
def tune(
    beir: Path = typer.Option(..., "--beir", help="the corpus and questions: a BEIR folder (corpus.jsonl, "
                                                  "queries.jsonl; qrels/<split>.tsv when there are relevance labels)"),
    split: str = typer.Option("train", "--split", help="which qrels split holds the labels (when there are some)"),
    index: Optional[Path] = typer.Option(None, "--index", help="the service's index of that corpus (default "
                                                               "data/index/<folder name>; built if absent)"),
    out_dir: Path = typer.Option(Path("out/tune"), "--out", help="settings.json, the trained artefacts, the report "
                                                                  "and the run's state go here (re-run to resume)"),
    labels: str = typer.Option("auto", "--labels", help="auto (the human labels when there are some, else the "
                                                        "language-model judge), human, or judge"),
    judge_sample: int = typer.Option(20, "--judge-sample", min=0, help="beside human labels: queries the judge "
                                     "labels too, to report its agreement (0 = none; needs a model)"),
    llm_url: Optional[str] = typer.Option(None, "--llm-url", help="the judge's OpenAI-compatible /v1 URL; default: "
                                          "vLLM started on the installed SmolLM2-135M-Instruct when a judge is needed"),
    llm_model: Optional[Path] = typer.Option(None, "--llm-model", help="a model folder: step 3 sweeps vLLM's "
                                             "max_num_seqs x max_model_len on it (skipped without one), and step 4 "
                                             "measures its server beside the service, under load"),
    llm_max_num_seqs: str = typer.Option("4,8,16", "--llm-max-num-seqs", help="step 3's max_num_seqs values, "
                                         "comma-separated"),
    llm_max_model_len: str = typer.Option("1024,2048", "--llm-max-model-len", help="step 3's max_model_len values, "
                                          "comma-separated"),
    llm_duration: float = typer.Option(20.0, "--llm-duration", min=1.0, help="step 3: measured seconds per cell "
                                       "(and per step of the written answers under load)"),
    llm_rate: float = typer.Option(2.0, "--llm-rate", min=0.1, max=1000.0, help="step 3: requests per second "
                                   "offered to each cell, and to the service writing its answers"),
    llm_slo_ttft_ms: float = typer.Option(1000.0, "--llm-slo-ttft-ms", min=1.0, help="step 3: the model's "
                                          "objective for the first token's P99; a cell meeting both may be chosen"),
    llm_slo_e2e_ms: float = typer.Option(10000.0, "--llm-slo-e2e-ms", min=1.0, max=600_000.0, help="step 3: the model's "
                                         "objective for a whole completion's P99 (and the written answers' deadline)"),
    llm_questions: int = typer.Option(20, "--llm-questions", min=1, help="step 3: questions per round of the "
                                      "service writing its answers through the model server, at concurrency 1"),
    llm_load_format: str = typer.Option("auto", "--llm-load-format", help="auto, or dummy: random weights (a model "
                                        "folder with a config and tokenizer only, as the tests build)"),
    queries_limit: Optional[int] = typer.Option(None, "--queries", min=3, help="use at most this many queries, "
                                                "drawn with --seed (default: all)"),
    rounds: int = typer.Option(5, "--rounds", min=3, max=50, help="concurrency-1 rounds per configuration (a knob is "
                                "kept when it beats the rounds' spread)"),
    rates: str = typer.Option("40:320:40", "--rates", help="offered req/s of the knee sweep: a comma list or "
                                                          "start:stop:step (it stops two steps past the SLO)"),
    duration: float = typer.Option(8.0, "--duration", min=0.5, help="measured seconds per sweep step"),
    target: float = typer.Option(40.0, "--target-qps", min=0.1, help="the rate whose P99 the report shows"),
    seed: int = typer.Option(0, "--seed", help="the query draw, the held-out split and the training"),
    epochs: int = typer.Option(6, "--epochs", min=1, max=100, help="the reranker head's passes"),
    knobs: str = typer.Option("all", "--knobs", help="step 4's knobs to measure, comma-separated "
                              "(lone_query_threads_1, faiss_threads_1, memory_lock, memory_hugepages, "
                              "separate_cores), all, or none (step 4 skipped)"),
    results_file: Optional[Path] = typer.Option(None, "--results-file", help="also write the report as a benchmark "
                                                "results file (command, commit, machine; benchmarks/README.md)"),
) -> None:
    """Tune the service on a corpus and its questions: labels, the reranker's head, the model server's batch
    limits, placement; each step measured (nDCG@10, stage P50/P99 at concurrency 1, the knee, P99 at a target rate)
    and kept only when it wins. Writes settings.json (ragheat serve --settings) and report.json/html."""
    import contextlib
    import itertools

    from rag.pipeline import RagPipeline
    from rag.ingest.pipeline import ingest as run_ingest
    from tuning.pipeline import TuneRequest, TuneRun
    from tuning.report import lines, write_report

    from loadgen.resultsfile import BenchmarkRun

    run_record = BenchmarkRun(results_file.stem) if results_file else None
    if labels not in ("auto", "human", "judge"):
        _fail(f"--labels must be auto, human or judge, not {labels!r}")
    if not (beir / "corpus.jsonl").is_file() or not (beir / "queries.jsonl").is_file():
        _fail(f"--beir {beir}: corpus.jsonl and queries.jsonl are needed there")
    if llm_model is not None and not (llm_model / "config.json").is_file():
        _fail(f"--llm-model {llm_model}: no config.json there (a Hugging Face model folder is needed)")
    if llm_load_format not in ("auto", "dummy"):
        _fail(f"--llm-load-format must be auto or dummy, not {llm_load_format!r}")
    grid = (_positive_ints("--llm-max-num-seqs", llm_max_num_seqs),
            _positive_ints("--llm-max-model-len", llm_max_model_len))
    asked_knobs = _knobs(knobs)
    settings = load_settings()
    index = index or Path("data/index") / beir.resolve().name
    request = TuneRequest(beir=beir, split=split, index=index, out=out_dir, labels=labels, judge_sample=judge_sample,
                          queries_limit=queries_limit, llm_model=llm_model, llm_grid=grid,
                          llm_duration_s=llm_duration, llm_load_format=llm_load_format, llm_rate=llm_rate,
                          llm_slo_ms=(llm_slo_ttft_ms, llm_slo_e2e_ms), llm_questions=llm_questions, rounds=rounds,
                          rates=_rates(rates), duration_s=duration, target_qps=target, seed=seed,
                          epochs=epochs, knobs=asked_knobs)

    def with_sections(sections: dict):
        return load_settings(**sections) if sections else settings

    def pipeline_factory(at: Path, sections: dict) -> RagPipeline:
        pipeline = RagPipeline(with_sections(sections), at)
        pipeline.warm_up()
        return pipeline

    @contextlib.contextmanager
    def asker_factory():
        from ragheat.commands.judge import _judge_model

        with _judge_model(settings, llm_url) as asker:
            yield asker

    launches = itertools.count(1)
    parked: dict[tuple[int, int], tuple] = {}  # limits -> (server, RunningModel): idle, kept for the next step
    # What a model server starts with when the settings name no limits (step 3's first side, or no cell met the
    # objective): the grid's smallest batch at its longest context.
    unchosen = (min(grid[0]), max(grid[1]))

    def running(server, seqs: int, length: int) -> tuple:
        """(server, RunningModel): a started model server as the steps use it."""
        from tuning.model_server_load import RunningModel

        return server, RunningModel(server.url, server.child.pid, "model", max_model_len=length, max_num_seqs=seqs)

    def llm_sweep(req: TuneRequest) -> dict:
        from loadgen.vllm_tuning import run_tuning
        from stack.vllm import vllm_python

        def keep(cell, server) -> bool:  # the last cell's server serves step 3's first side: a launch fewer
            parked[cell.max_num_seqs, cell.max_model_len] = running(server, cell.max_num_seqs, cell.max_model_len)
            return True

        seqs, lens = req.llm_grid
        # Batch sizes from the largest, lengths from the shortest: the last cell swept has the unchosen limits.
        return run_tuning(req.llm_model, max_num_seqs=sorted(seqs, reverse=True), max_model_len=sorted(lens),
                          block_sizes=[None], rate=req.llm_rate, duration_s=req.llm_duration_s, prompt_tokens=256,
                          max_tokens=128, slo_ttft_ms=req.llm_slo_ms[0], slo_e2e_ms=req.llm_slo_ms[1],
                          load_format=req.llm_load_format, python=vllm_python(settings.generation.vllm_python),
                          cpu=True, served_name="model", logs=out_dir / "logs" / "sweep", keep_last=keep)

    @contextlib.contextmanager
    def model_server(sections: dict):
        from rag.childproc import free_port
        from stack.vllm import VllmServer

        limits = sections.get("generation", {})  # step 3's choice, or none
        seqs = limits.get("vllm_max_num_seqs", unchosen[0])
        length = limits.get("vllm_max_model_len", unchosen[1])
        # A server the sweep or a step left idle with these limits serves the next (step 4 runs step 3's chosen one:
        # a launch fewer); one with other limits stops first, so that no idle server shares the machine with a
        # measurement.
        for key in [k for k in parked if k != (seqs, length)]:
            parked.pop(key)[0].__exit__(None, None, None)
        kept = parked.pop((seqs, length), None)
        if kept is not None and not kept[0].child.alive():
            kept[0].__exit__(None, None, None)
            kept = None
        if kept is None:
            # two may run at once (step 3's two sides): a folder each
            logs = out_dir / "logs" / f"model-server-{next(launches)}-{seqs}x{length}"
            server = VllmServer(request.llm_model, port=free_port(), python=settings.generation.vllm_python,
                                served_name="model", max_model_len=length, max_num_seqs=seqs,
                                load_format=request.llm_load_format, work_dir=logs)
            try:
                server.__enter__()
            except (RuntimeError, TimeoutError, OSError) as exc:
                raise ValueError(f"the model server on {request.llm_model} ({seqs} x {length}) did not start "
                                 f"({exc}); its log: {logs}") from None
            kept = running(server, seqs, length)
        server, model = kept
        try:
            yield model
        except BaseException:
            server.__exit__(None, None, None)
            raise
        if server.child.alive():
            parked[seqs, length] = kept
        else:
            server.__exit__(None, None, None)

    with progress_bar() as progress:
        run_ingest(str(beir), index, settings, progress=progress)  # no-op when up to date
        task = progress.add_task("tune", total=None)

        def ingest(at: Path, sections: dict) -> None:
            run_ingest(str(beir), at, with_sections(sections), progress=progress)

        try:
            report = TuneRun(request, pipeline_factory=pipeline_factory, ingest=ingest, asker_factory=asker_factory,
                             llm_sweep=llm_sweep, model_server=model_server,
                             log=lambda m: progress.console.print(m, highlight=False),
                             advance=lambda: progress.advance(task)).run()
        except ValueError as exc:
            _fail(str(exc))
        finally:
            for server, _ in parked.values():
                server.__exit__(None, None, None)
    for line in lines(report):
        out.print(line, highlight=False)
    json_path, html_path = write_report(report, out_dir)
    out.print(f"wrote {report['settings_file']} (ragheat serve --settings {report['settings_file']}), {json_path} "
              f"and {html_path}")
    if run_record is not None:
        out.print(f"wrote {run_record.write(report, results_file)}")
