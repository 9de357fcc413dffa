"""``ragheat demo``: the main job on embedded defaults, end to end over real HTTP."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from rag.api.app import create_app
from rag.api.server import BackgroundServer
from rag.errors import IndexLoadError
from rag.index.store import read_manifest
from rag.ingest.pipeline import ingest
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


def run_demo(settings: RagheatSettings, index: Path, source: str, port: int, *, console: Console,
             progress) -> None:
    try:
        manifest = read_manifest(index)
        console.print(f"using index {index} ({manifest['counts']['chunks']} chunks of {manifest['corpus']['name']})")
    except IndexLoadError:
        console.print(f"no index at {index}: ingesting {source!r} (one time)")
        with progress() as bar:
            report = ingest(source, index, settings, progress=bar)
        manifest = report.manifest
        console.print(f"indexed {manifest['counts']['documents']} documents as {manifest['counts']['chunks']} "
                      f"chunks in {manifest['timings_s']['total']:.1f} s")
    questions = SAMPLE_QUESTIONS["wiki" if manifest["corpus"]["kind"] == "wiki" else "default"]

    with BackgroundServer(create_app(settings, index), port=port) as url, httpx.Client(base_url=url) as client:
        console.print(f"serving on {url}  (OpenAPI: {url}/docs)\n")
        for question in questions:
            data = _ask(client, question)
            console.print(f"[bold cyan]Q:[/] {question}")
            console.print(f"[bold]A:[/] {data['answer']}")
            for c in data["citations"][:3]:
                console.print(f"   [{c['number']}] {c['title']} [dim]({c['doc_id']}, chars {c['chunk_start']}-"
                              f"{c['chunk_end']})[/]")
            console.print()
        console.print(_timing_table(client, questions))


def _ask(client: httpx.Client, question: str) -> dict:
    response = client.post("/v1/query", json={"query": question, "top_k": 5})
    response.raise_for_status()
    return response.json()


def _timing_table(client: httpx.Client, questions: list[str]) -> Table:
    """Median and worst of each stage (server-side) and end to end (client-side) over repeated asks."""
    per_stage: dict[str, list[float]] = {}
    end_to_end: list[float] = []
    for _ in range(REPEATS):
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
