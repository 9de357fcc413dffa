"""``ragheat serve`` refuses to start on a missing or damaged index, naming the path; ``ragheat query`` works
in-process and against a running server. ``serve`` runs as a real subprocess (the installed entry point): that it
exits before it binds is what is tested; ``query`` runs in this process."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from index_copy import copy_index
from rag.api.app import create_app
from rag.childproc import ChildProcess, free_port
from stack.servers import BackgroundServer
from rag.errors import IndexLoadError
from rag.index.store import resolve_generation
from rag.pipeline import RagPipeline
from rag.stages import DEFAULT_STAGES
from ragheat.cli import app

RAGHEAT = Path(sys.executable).parent / "ragheat"
QUERY = "0-dimensional biomaterials lack inductive properties."


def run_cli(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    # A wide console so rich does not wrap long paths in the middle.
    env = {**os.environ, "COLUMNS": "1000", "NO_COLOR": "1", "TERM": "dumb"}
    return subprocess.run([str(RAGHEAT), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def query_cli(*args: str, env: dict | None = None):
    """``ragheat query ARGS`` in this process, on a wide console; a traceback would be an exception other than
    the exit (and exit code 1)."""
    result = CliRunner(env={"COLUMNS": "1000", "NO_COLOR": "1", **(env or {})}).invoke(app, ["query", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def damage(folder: Path, kind: str) -> Path:
    """Break one file of the generation ``folder`` in place; returns the file."""
    if kind == "manifest_garbled":
        path = folder / "manifest.json"
        path.write_text('{"format_version": 1, "generation": ')
    elif kind == "manifest_missing":
        path = folder / "manifest.json"
        path.unlink()
    elif kind == "chunks_truncated":
        path = folder / "chunks.jsonl"
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        path.write_text("".join(lines[: len(lines) // 2]), encoding="utf-8")
    elif kind == "chunks_garbled":
        path = folder / "chunks.jsonl"
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        lines[3] = '{"doc_id": "x", "title": \n'
        path.write_text("".join(lines), encoding="utf-8")
    elif kind == "dense_truncated":
        path = folder / "dense.faiss"
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif kind == "dense_garbled":
        path = folder / "dense.faiss"
        path.write_bytes(b"\x13\x37not a faiss index" * 64)
    else:  # pragma: no cover
        raise ValueError(kind)
    return path


DAMAGES = ["manifest_garbled", "manifest_missing", "chunks_truncated", "chunks_garbled", "dense_truncated",
           "dense_garbled"]


@pytest.fixture
def index_copy(subset_index, tmp_path) -> Path:
    copy = tmp_path / "index-copy"
    copy_index(subset_index, copy)
    assert (copy / "current").is_symlink() and resolve_generation(copy).is_relative_to(copy.resolve())
    return copy


@pytest.fixture(scope="module")
def server_url(settings, subset_index, pipeline):
    with BackgroundServer(create_app(settings, subset_index, pipeline=pipeline)) as url:
        yield url


# ------------------------------------------------------------------------------------------- serve


def assert_refused(result: subprocess.CompletedProcess, elapsed: float, *needles: str) -> None:
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert elapsed < 60, f"took {elapsed:.0f} s to refuse"
    assert "Application startup complete" not in output and "Uvicorn running" not in output, output
    for needle in needles:
        assert needle in output, (needle, output[-3000:])


def test_serve_refuses_a_missing_index(tmp_path):
    missing = tmp_path / "no-such-index"
    start = time.monotonic()
    result = run_cli("serve", "--index", str(missing), "--port", "0", cwd=tmp_path)
    assert_refused(result, time.monotonic() - start, str(missing), "does not exist")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr, result.stderr
    assert not missing.exists()


def test_serve_refuses_a_folder_that_is_not_an_index(tmp_path):
    folder = tmp_path / "empty"
    folder.mkdir()
    start = time.monotonic()
    result = run_cli("serve", "--index", str(folder), "--port", "0", cwd=tmp_path)
    assert_refused(result, time.monotonic() - start, str(folder), "not a ragheat index")


@pytest.mark.parametrize("kind", DAMAGES)
def test_serve_refuses_a_corrupt_index(index_copy, tmp_path, kind):
    generation = resolve_generation(index_copy)
    damage(generation, kind)
    start = time.monotonic()
    result = run_cli("serve", "--index", str(index_copy), "--port", "0", cwd=tmp_path)
    # The message names the generation folder (or a file inside it) of the copy, not the original.
    assert_refused(result, time.monotonic() - start, str(index_copy.resolve()), "cannot be loaded")


# ----------------------------------------------------------------------------------------- warm_up


@pytest.mark.parametrize("kind", DAMAGES)
def test_warm_up_raises_index_load_error_naming_the_path(settings, index_copy, kind):
    generation = resolve_generation(index_copy)
    broken = damage(generation, kind)
    pipeline = RagPipeline(settings, index_copy)
    with pytest.raises(IndexLoadError) as info:
        pipeline.warm_up()
    message = str(info.value)
    assert str(index_copy.resolve()) in message, message
    if kind.startswith("chunks_garbled"):
        assert str(broken) in message or broken.name in message, message
    if kind.startswith("manifest"):
        assert "manifest.json" in message, message
    assert not pipeline.ready


def test_warm_up_raises_for_a_missing_index(settings, tmp_path):
    missing = tmp_path / "gone"
    with pytest.raises(IndexLoadError) as info:
        RagPipeline(settings, missing).warm_up()
    assert str(missing) in str(info.value)


def test_warm_up_succeeds_on_an_intact_copy(settings, index_copy, pipeline):
    copy = RagPipeline(settings, index_copy)
    copy.warm_up()
    try:
        assert copy.ready and len(copy.index.chunks) == len(pipeline.index.chunks)
    finally:
        copy.close()  # its graph store's process


# ------------------------------------------------------------------------------------------- query


def test_query_in_process_prints_json(subset_index):
    # Without the graph the router still picks (among the routes without it); no entities are looked for.
    result = query_cli(QUERY, "--index", str(subset_index), "--top-k", "3", "--json",
                       env={"RAGHEAT_GRAPH__ENABLED": "false"})
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    markers = {int(n) for n in re.findall(r"\[(\d+)\]", data["answer"])}
    assert data["answer"].strip() and markers and markers <= {1, 2, 3}, data["answer"]
    assert [c["number"] for c in data["citations"]] == [1, 2, 3]
    assert all(c["doc_id"] and c["chunk_end"] > c["chunk_start"] for c in data["citations"])
    assert data["generator"] == "extractive"
    ran = [s["name"] for s in data["stages"]]  # no graph: no entities looked for; the router decides the reranker
    assert ran == [s for s in DEFAULT_STAGES if s != "link_entities" and (s != "rerank" or "rerank" in ran)]


def test_query_against_a_server_matches_in_process(server_url, pipeline):
    result = query_cli(QUERY, "--url", server_url, "--top-k", "3", "--retrievers", "bm25", "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    expected = pipeline.query(QUERY, 3, ["bm25"])
    assert data["answer"] == expected.answer
    assert [c["doc_id"] for c in data["citations"]] == [s.chunk.doc_id for s in expected.sources]
    assert [s["name"] for s in data["stages"]] == ["queue", "embed", "retrieve_bm25", "rerank", "generate"]


def test_query_against_a_server_prints_a_readable_answer(server_url):
    result = query_cli(QUERY, "--url", server_url)
    assert result.exit_code == 0, result.stderr
    assert "[1]" in result.stdout and "extractive" in result.stdout and "generate" in result.stdout


def test_query_empty_text_exits_2(subset_index):
    result = query_cli("", "--index", str(subset_index))
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert "empty" in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_query_blank_text_against_a_server_exits_2(server_url):
    result = query_cli("   ", "--url", server_url)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert "422" in result.stderr and "empty" in result.stderr, result.stderr


def test_query_missing_index_exits_2_naming_it(tmp_path):
    missing = tmp_path / "nowhere"
    result = query_cli(QUERY, "--index", str(missing))
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert str(missing) in result.stderr and "Traceback" not in result.stderr, result.stderr


# ------------------------------------------------------------------ serve beyond loopback: a key, or the opt-out

OWN_ACCESS_SETTINGS = ("RAGHEAT_SERVER__API_KEYS", "RAGHEAT_SERVER__API_KEYS_FILE",
                       "RAGHEAT_SERVER__INSECURE_NO_API_KEY", "RAGHEAT_SERVER__HOST")
REFUSAL = ("no API key is configured", "ragheat keys new", "--api-keys-file", "--insecure-no-api-key")


def keyless_env(**extra: str) -> dict[str, str]:
    """This process's environment with no key, host or opt-out of its own, so only the test's flags decide."""
    return {**{k: v for k, v in os.environ.items() if k not in OWN_ACCESS_SETTINGS}, "COLUMNS": "1000",
            "NO_COLOR": "1", "TERM": "dumb", **extra}


@pytest.mark.parametrize("args, env", [
    (["--host", "0.0.0.0"], {}),
    (["--host", "::"], {}),
    (["--host", "0.0.0.0", "--workers", "2"], {}),  # the parent refuses before any worker starts
    ([], {"RAGHEAT_SERVER__HOST": "0.0.0.0"}),  # the API image's environment (Dockerfile), no key configured
], ids=["ipv4-any", "ipv6-any", "workers", "image-env"])
def test_serve_beyond_loopback_without_a_key_refuses_naming_both_ways_out(tmp_path, args, env):
    """Refused before the index is read (this one does not exist: the sentence must be about keys). In this
    process: the installed command's own exit is the next test."""
    runner = CliRunner(env={**dict.fromkeys(OWN_ACCESS_SETTINGS), "COLUMNS": "1000", "NO_COLOR": "1", **env})
    result = runner.invoke(app, ["serve", "--index", str(tmp_path / "index"), "--port", str(free_port()), *args])
    assert result.exit_code == 2, result.output
    for needle in REFUSAL:
        assert needle in result.output, result.output
    assert "does not exist" not in result.output and not (tmp_path / "index").exists()


def test_the_installed_serve_refuses_beyond_loopback_before_it_binds(tmp_path):
    start = time.monotonic()
    result = subprocess.run([str(RAGHEAT), "serve", "--index", str(tmp_path / "index"), "--host", "0.0.0.0",
                             "--port", str(free_port())], cwd=tmp_path, env=keyless_env(), capture_output=True,
                            text=True, timeout=120)
    assert_refused(result, time.monotonic() - start, *REFUSAL)
    assert result.returncode == 2 and "does not exist" not in result.stderr, result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("access", ["key", "insecure"])
def test_serve_beyond_loopback_with_a_key_or_the_opt_out(subset_index, tmp_path, access):
    """On 0.0.0.0 with a keys file a keyless query gets 401 and the key's gets an answer; with the opt-out flag
    the keyless query is answered and the log says, as a warning, that the API is open."""
    from rag.api.access import key_line, new_key

    key, port = new_key(), free_port()
    (tmp_path / "keys").write_text(key_line(key, "tester") + "\n")
    flags = ["--api-keys-file", str(tmp_path / "keys")] if access == "key" else ["--insecure-no-api-key"]
    log = tmp_path / "serve.log"
    url = f"http://127.0.0.1:{port}"
    with ChildProcess("serve", [str(RAGHEAT), "serve", "--index", str(subset_index), "--host", "0.0.0.0", "--port",
                                str(port), "--log-level", "warning", *flags],
                      log_path=log, die_with_parent=True, env=keyless_env()) as child:
        child.wait_until_ok(f"{url}/readyz", 300)
        keyless = httpx.post(f"{url}/v1/query", json={"query": QUERY}, timeout=60)
        if access == "key":
            assert keyless.status_code == 401, keyless.text
            keyed = httpx.post(f"{url}/v1/query", json={"query": QUERY}, timeout=60,
                               headers={"Authorization": f"Bearer {key}"})
            assert keyed.status_code == 200 and keyed.json()["citations"], keyed.text
        else:
            assert keyless.status_code == 200 and keyless.json()["citations"], keyless.text
    text = log.read_text()
    warned = [line for line in text.splitlines() if "WARNING" in line and "--insecure-no-api-key" in line]
    assert bool(warned) == (access == "insecure"), text[-3000:]
    if warned:
        assert f"0.0.0.0:{port}" in warned[0] and "without a key" in warned[0]
