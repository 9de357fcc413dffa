"""``RagPipeline.warm_up()`` that fails after the language model and the graph store started closes both before it
raises: no open client, no in-process engine, no graph store process left behind; a retry starts afresh.

Real parts: the ``openai`` generator's client (its server need not answer at warm-up), the SciFact subset's graph in
the embedded FalkorDB (a child process), and a real failure after both: ``routed`` asked for with a router model
file that does not exist."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import rag.graph.serving
import rag.pipeline
from rag.childproc import free_port
from rag.errors import IndexLoadError
from rag.pipeline import RagPipeline


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def started(monkeypatch) -> dict:
    """What warm_up() starts, recorded as it is started: the language model and the graph store's process id."""
    seen: dict = {}
    make_llm, load_graph_stage = rag.pipeline._make_llm, rag.graph.serving.load_graph_stage

    def recording_llm(settings):
        seen["llm"] = make_llm(settings)
        return seen["llm"]

    def recording_graph(*args, **kwargs):
        stage = load_graph_stage(*args, **kwargs)
        seen["graph"], seen["graph_pid"] = stage.store, stage.store.store.child.pid
        return stage

    monkeypatch.setattr(rag.pipeline, "_make_llm", recording_llm)
    monkeypatch.setattr(rag.graph.serving, "load_graph_stage", recording_graph)
    return seen


def written_settings(settings, router_model: Path | None):
    generation = settings.generation.model_copy(update={
        "generator": "openai", "base_url": f"http://127.0.0.1:{free_port()}/v1", "model": "nobody"})
    retrieval = settings.retrieval.model_copy(update={"retrievers": ["routed"], "router_model": router_model})
    return settings.model_copy(update={"generation": generation, "retrieval": retrieval})


def test_a_failure_after_the_model_and_graph_started_closes_them_and_a_retry_starts_afresh(
        settings, subset_index, started, tmp_path):
    missing = tmp_path / "no-router.npz"
    pipeline = RagPipeline(written_settings(settings, missing), subset_index)
    with pytest.raises(IndexLoadError, match="no-router.npz"):
        pipeline.warm_up()
    llm, graph, pid = started["llm"], started["graph"], started["graph_pid"]
    assert llm.client is not None and llm.client.is_closed, "the model's client was left open"
    assert graph.store.child is None and not alive(pid), "the graph store's process outlived the failed warm-up"
    assert pipeline.llm is None and pipeline.graph is None and pipeline.linker is None and not pipeline.ready

    pipeline.settings = written_settings(settings, None)  # the shipped router: the retry succeeds
    pipeline.warm_up()
    try:
        assert pipeline.ready and pipeline.llm is started["llm"] is not llm and not pipeline.llm.client.is_closed
        assert pipeline.graph is started["graph"] is not graph and alive(started["graph_pid"])
    finally:
        pipeline.close()
    assert pipeline.llm.client.is_closed and not alive(started["graph_pid"])


def test_a_successful_warm_up_keeps_what_it_started(settings, subset_index, started):
    pipeline = RagPipeline(written_settings(settings, None), subset_index)
    pipeline.warm_up()
    try:
        assert pipeline.llm is started["llm"] and not pipeline.llm.client.is_closed
        assert pipeline.graph is started["graph"] and alive(started["graph_pid"])
    finally:
        pipeline.close()


def test_a_service_on_cached_conversions_starts_and_answers_without_importing_onnx(subset_index):
    """Only converting the encoder needs the onnx package (slow to import): with it made unimportable, the service's
    modules load and the default pipeline (reranking on) warms up on the conversions already cached and answers."""
    code = ("import sys; sys.modules['onnx'] = None\n"
            "import ragheat.service, rag.api.app\n"
            "from rag.pipeline import RagPipeline\n"
            "from rag.settings import RagheatSettings\n"
            f"pipeline = RagPipeline(RagheatSettings(), {str(subset_index)!r})\n"
            "pipeline.warm_up()\n"
            "result = pipeline.query('vitamin D and bone density', 5)\n"
            "print(len(result.sources) > 0, 'rerank' in {s.name for s in result.stages})\n"
            "pipeline.close()\n")
    env = {**os.environ, "RAGHEAT_GRAPH__ENABLED": "false"}  # no graph store child: not what this is about
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == ["True", "True"], run.stdout
