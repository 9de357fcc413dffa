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


def test_the_longest_recorded_groups_are_handed_out_first():
    from collections import OrderedDict

    from tests.conftest import longest_first

    queue = OrderedDict((name, {f"{name}::t": False}) for name in ("many-tests", "short", "unrecorded", "long"))
    longest_first(queue, {"short": 3.0, "long": 300.0, "many-tests": 40.0})
    assert list(queue) == ["long", "many-tests", "short", "unrecorded"]
    assert queue["long"] == {"long::t": False}  # the tests go with their group


def test_the_recorded_group_seconds_name_groups_that_exist():
    """tests/group_seconds.json orders the parallel pass (longest first): a group it names that no longer exists
    is a stale record (re-write it with scripts/test_group_seconds.py --write after a full run)."""
    from tests.conftest import known_group_seconds

    recorded = known_group_seconds()
    assert recorded, "tests/group_seconds.json is missing or unreadable"
    groups = {worker_group(f"{path.relative_to(TESTS.parent).as_posix()}::t") for path in TESTS.rglob("test_*.py")}
    assert sorted(set(recorded) - groups) == []
