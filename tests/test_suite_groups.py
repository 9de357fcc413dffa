"""The parallel pass's groups (tests/conftest.py): every test module that uses the shared vLLM server is in that
server's group, so one worker starts it, and every other module is a group of its own."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import SHARED_VLLM_FIXTURES, worker_group

TESTS = Path(__file__).resolve().parent


def _asks_for(path: Path) -> set[str]:
    """The parameter names of every function in ``path`` (tests and fixtures: what pytest fills in)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.update(arg.arg for arg in node.args.args + node.args.kwonlyargs)
        elif isinstance(node, ast.Constant) and node.value in SHARED_VLLM_FIXTURES:
            names.add(node.value)  # usefixtures("vllm_server") and the like
    return names


def test_every_module_of_the_shared_vllm_server_is_in_its_group():
    modules = {path.relative_to(TESTS.parent).as_posix(): _asks_for(path) for path in TESTS.rglob("test_*.py")}
    users = sorted(module for module, names in modules.items() if names & SHARED_VLLM_FIXTURES)
    assert users, "no test module uses the shared vLLM server: the group is stale"
    assert [module for module in users if worker_group(f"{module}::t") != "vllm-server"] == []
    assert worker_group("tests/rag/test_rerank.py::test_x[1]") == "tests/rag/test_rerank.py"
