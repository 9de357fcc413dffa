"""``ragheat demo``: the main job on embedded defaults, end to end over real HTTP."""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from ragheat.clikit import guard, load_settings, out, progress_bar

if TYPE_CHECKING:
    import httpx
    from rich.console import Console
    from rich.table import Table

    from rag.settings import RagheatSettings

SAMPLE_QUESTIONS = {
    "wiki": [
        "What causes the seasons on Earth?",
        "Who painted the Mona Lisa?",
        "How does photosynthesis work?",
        "When did the Roman Empire fall?",
        "What is the speed of light?",
    ],
    "default": [
        "What is the main finding?",
        "Which methods were used?",
        "What are the known risk factors?",
    ],
}
REPEATS = 20  # each sample question is asked this many times for the timing table
LLM_REPEATS = 2  # ... and with written answers (each one slow on a CPU)
SWEEP_RATES = (25, 50, 100, 150, 200, 250)  # req/s: a range wide enough to hold the demo's knee on a small machine
SWEEP_SECONDS = 3.0


_guard = guard()


@_guard
def demo(
    index: Optional[Path] = typer.Option(None, "--index", help="where the demo index lives (default data/index/wiki, "
                                                               "or data/index/wiki-first-N with --max-docs N)"),
    source: str = typer.Option("wiki", help="corpus to ingest when the index is absent"),
    port: int = typer.Option(0, help="port for the demo server (0 = any free port)"),
    max_docs: int = typer.Option(0, "--max-docs", min=0, help="ingest only the first N documents of the source "
                                                              "(0 = all): a first look in seconds"),
    sweep_seconds: float = typer.Option(SWEEP_SECONDS, "--sweep-seconds", min=0.2,
                                        help="measured seconds per step of the closing load sweep"),
    generator: str = typer.Option("extractive", "--generator",
                                  help="extractive (the passages' own sentences) | vllm (answers written by a model "
                                       "vLLM serves from .venv-vllm, streamed as they are generated)"),
    vllm_model: str = typer.Option("auto", "--vllm-model",
                                   help="with --generator vllm: auto (SmolLM2-135M-Instruct as scripts/install_vllm.sh "
                                        "converted it) | DIR (a model folder) | dummy (random weights: noise)"),
) -> None:
    """Ingest the demo corpus if absent, serve it, ask sample questions over HTTP, print stage timings."""
    if generator not in ("extractive", "vllm"):
        raise typer.BadParameter(f"must be extractive or vllm, not {generator!r}", param_hint="--generator")
    if index is None:
        index = Path("data/index") / (f"{_source_name(source)}-first-{max_docs}" if max_docs else _source_name(source))
    settings = load_settings()
    if generator == "extractive":
        run_demo(settings, index, source, port, console=out, progress=progress_bar, max_docs=max_docs,
                 sweep_seconds=sweep_seconds)
        return
    from ragheat.commands.demo_llm import served_model

    with served_model(settings, vllm_model, out) as llm_settings:
        run_demo(llm_settings, index, source, port, console=out, progress=progress_bar, max_docs=max_docs,
                 sweep_seconds=sweep_seconds, written=True)


def _source_name(source: str) -> str:
    return source if source == "wiki" else Path(source).resolve().name


def first_documents(source: str, count: int, folder: Path) -> Path:
    """The first ``count`` documents of ``source`` as a BEIR folder ``folder/<corpus>-first-<count>`` (kept inside
    the index folder, so the manifest names a corpus that exists and a rerun finds the index up to date)."""
    import json

    from rag.ingest.sources import load_source

    corpus = load_source(source)
    out_dir = folder / f"{corpus.name}-first-{count}"
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = ({"_id": d.doc_id, "title": d.title, "text": d.text} for d in corpus.documents[:count])
    (out_dir / "corpus.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                                          encoding="utf-8")
    return out_dir


def run_demo(settings: RagheatSettings, index: Path, source: str, port: int, *, console: Console,
             progress, bench_dir: Path = Path("out/demo-bench"), max_docs: int = 0,
             sweep_seconds: float = SWEEP_SECONDS, written: bool = False) -> None:
    """Ingest ``source`` (its first ``max_docs`` documents, if set) into ``index`` unless it is there, serve it with
    telemetry on ``port``, ask the sample questions over HTTP, print answers, per-stage timings and P99s, then a
    short load sweep's knee. ``written``: the answers come from a language model (``settings.generation``): each is
    streamed as its tokens arrive, with TTFT and tokens/s; fewer repeats, and no sweep (its rates are the
    extractive path's)."""
    import httpx

    from rag.errors import IndexLoadError
    from rag.index.store import read_manifest
    from rag.ingest.pipeline import ingest
    from ragheat.service import build_service
    from stack.servers import BackgroundServer

    try:
        manifest = read_manifest(index)
        if settings.rerank.enabled and not manifest.get("rerank"):  # ingested with rerank.store_tokens off
            raise IndexLoadError(index, "it has no rerank token vectors")
        console.print(f"using index {index} ({manifest['counts']['chunks']} chunks of {manifest['corpus']['name']})")
    except IndexLoadError as exc:
        what = f"the first {max_docs} documents of {source!r}" if max_docs else repr(source)
        console.print(f"no usable index at {index} ({exc.reason}): ingesting {what} (one time)")
        path = str(first_documents(source, max_docs, index / "source")) if max_docs else source
        with progress() as bar:
            report = ingest(path, index, settings, progress=bar)
        manifest = report.manifest
        console.print(f"indexed {manifest['counts']['documents']} documents as {manifest['counts']['chunks']} "
                      f"chunks in {manifest['timings_s']['total']:.1f} s")
    corpus = manifest["corpus"]
    questions = SAMPLE_QUESTIONS["wiki" if corpus["kind"] == "wiki" or corpus["name"].startswith("wiki-") else "default"]

    settings = settings.model_copy(update={"server": settings.server.model_copy(update={"index_dir": index})})
    with build_service(settings) as service, BackgroundServer(service.app, port=port) as url, \
            httpx.Client(base_url=url, timeout=300.0 if written else 5.0) as client:
        console.print(f"serving on {url}  (OpenAPI: {url}/docs, metrics: {url}/metrics)\n")
        for question in questions:
            console.print(f"[bold cyan]Q:[/] {question}")
            if written:
                from ragheat.commands.demo_llm import ask_streamed

                data = ask_streamed(client, question, console)
            else:
                data = _ask(client, question)
                console.print(f"[bold]A:[/] {data['answer']}")
            for c in data["citations"][:3]:
                console.print(f"   [{c['number']}] {c['title']} [dim]({c['doc_id']}, chars {c['chunk_start']}-"
                              f"{c['chunk_end']})[/]")
            console.print()
        console.print(_timing_table(client, questions, LLM_REPEATS if written else REPEATS))
        console.print(_p99_from_metrics(client))
        if written:
            console.print("\n(no load sweep with a written answer: its rates are sized for the extractive path; "
                          "`ragheat bench --rates 0.5,1,2` measures the model's)")
        else:
            _short_sweep(url, bench_dir, console, sweep_seconds)


def _short_sweep(url: str, out_dir: Path, console: Console, seconds: float = SWEEP_SECONDS) -> None:
    """A short open-loop sweep from a separate process (so the load generator does not share the server's
    interpreter), then the report's path and a one-screen summary."""
    import json
    import subprocess
    import sys

    console.print(f"\nshort load sweep ({', '.join(f'{r:g}' for r in SWEEP_RATES)} req/s, "
                  f"{seconds:g} s each) ...")
    ragheat = Path(sys.executable).parent / "ragheat"
    done = subprocess.run([str(ragheat), "bench", "--url", url, "--rates", ",".join(f"{r:g}" for r in SWEEP_RATES),
                           "--duration", str(seconds), "--warmup", "1", "--out", str(out_dir)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        console.print(f"[red]the sweep failed:[/] {done.stderr.strip()[-500:]}")
        return
    results = json.loads((out_dir / "results.json").read_text())
    knee = results["knee_qps"]
    console.print(f"report: {(out_dir / 'report.html').resolve()}")
    if knee is None:
        console.print(f"knee: none of the offered rates kept P99 within {results['slo_ms']:g} ms")
        return
    step = next(s for s in results["steps"] if s["offered_qps"] == knee)
    stages = ", ".join(f"{name} {p['p99']:.1f}" for name, p in step["stages_ms"].items())
    if knee == max(SWEEP_RATES):
        console.print("(the sweep's highest rate still met the objective: the real knee lies above it)")
    console.print(f"knee: [bold]{knee:g} req/s[/] (highest offered rate with P99 <= {results['slo_ms']:g} ms); "
                  f"at the knee P99 end to end {step['latency_ms']['p99']:.1f} ms; per stage (ms): {stages}")


def _ask(client: httpx.Client, question: str) -> dict:
    response = client.post("/v1/query", json={"query": question, "top_k": 5})
    response.raise_for_status()
    return response.json()


def _timing_table(client: httpx.Client, questions: list[str], repeats: int = REPEATS) -> Table:
    """Median and worst of each stage (server-side) and end to end (client-side) over repeated asks."""
    from rich.table import Table

    per_stage: dict[str, list[float]] = {}
    end_to_end: list[float] = []
    for _ in range(repeats):
        for question in questions:
            start = time.perf_counter()
            data = _ask(client, question)
            end_to_end.append((time.perf_counter() - start) * 1000)
            for stage in data["stages"]:
                per_stage.setdefault(stage["name"], []).append(stage["ms"])
    table = Table(title=f"per-stage latency over {len(end_to_end)} HTTP queries (ms)")
    for column in ("stage", "p50", "max"):
        table.add_column(column, justify="right" if column != "stage" else "left")
    for name, values in [*per_stage.items(), ("end to end (HTTP)", end_to_end)]:
        table.add_row(name, f"{statistics.median(values):.2f}", f"{max(values):.2f}")
    return table


def _p99_from_metrics(client: httpx.Client) -> str:
    """P99 per stage as the server's own histograms report it (bucket upper bounds, as Prometheus would)."""
    parts = [f"{stage} <= {p99 * 1000:g} ms" for stage, p99 in stage_p99s(client.get("/metrics").text).items()]
    return "P99 from GET /metrics (histogram bucket bounds): " + (", ".join(parts) or "no stage has run")


def stage_p99s(metrics_text: str) -> dict[str, float]:
    """Stage -> the upper bound (seconds) of the bucket holding its P99, read off a ``/metrics`` exposition, for
    the stages that ran: the service registers every stage's series at start-up, so a stage that never ran (an
    optional one switched off, or one its route does not take) has buckets holding nothing, and is left out."""
    from loadgen.stats import scraped_buckets

    p99s = {}
    for stage, counts in scraped_buckets(metrics_text, "ragheat_stage_duration_seconds", "stage").items():
        edges = sorted(counts)
        total = counts[edges[-1]]
        if total:
            p99s[stage] = next(edge for edge in edges if counts[edge] >= 0.99 * total)
    return p99s
