"""The rooms and who may enter them (docs/architecture.md), read from the source: every import of every module,
those inside functions and under ``TYPE_CHECKING`` included, since a lazy import is still a dependency."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("rag", "telemetry", "probes", "stack", "loadgen", "dashboards", "explain", "tuning", "ragheat")
MAY_IMPORT = {
    "rag": set(),
    "telemetry": {"rag"},
    "probes": {"rag", "telemetry"},
    "dashboards": {"rag", "telemetry"},
    "stack": {"rag"},
    "loadgen": {"rag", "telemetry", "stack"},
    "explain": {"rag", "telemetry", "dashboards"},
    "tuning": {"rag", "telemetry", "stack", "loadgen"},
    "ragheat": set(PACKAGES) - {"ragheat"},
}
"""Top-level package -> the other packages of this repository it may import (docs/architecture.md)."""


def module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the packages (``pkg/__init__.py`` is ``pkg``)."""
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = module_files()


def imports_of(name: str, path: Path) -> set[str]:
    """The repository modules ``name`` imports: ``from a.b import c`` is ``a.b.c`` when that is a module, else
    ``a.b``; relative imports are resolved against ``name``'s package."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                targets.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
    return {t for t in targets if t.split(".")[0] in PACKAGES and t != name}


GRAPH = {name: imports_of(name, path) for name, path in MODULES.items()}


def test_every_package_of_the_layout_is_there():
    assert {name.split(".")[0] for name in MODULES} == set(PACKAGES)
    assert len(MODULES) > 60, "the walk found too few modules to be checking anything"


@pytest.mark.parametrize("package", PACKAGES)
def test_a_package_imports_only_the_rooms_below_it(package):
    crossing = sorted(f"{name} -> {target}" for name, targets in GRAPH.items() if name.split(".")[0] == package
                      for target in targets
                      if target.split(".")[0] != package and target.split(".")[0] not in MAY_IMPORT[package])
    assert not crossing, crossing


def test_rag_imports_no_other_package():
    outside = sorted(f"{name} -> {target}" for name, targets in GRAPH.items() if name.split(".")[0] == "rag"
                     for target in targets if target.split(".")[0] != "rag")
    assert not outside, outside


def test_no_package_imports_the_composition_root():
    into_root = sorted(f"{name} -> {target}" for name, targets in GRAPH.items() if not name.startswith("ragheat")
                       for target in targets if target.split(".")[0] == "ragheat")
    assert not into_root, into_root


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` (as the path that closes it), or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state and (found := visit(target)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycle_between_modules():
    assert _cycle(GRAPH) is None, " -> ".join(_cycle(GRAPH))


def test_no_import_cycle_between_packages():
    packages: dict[str, set[str]] = {}
    for name, targets in GRAPH.items():
        packages.setdefault(name.split(".")[0], set()).update(
            t.split(".")[0] for t in targets if t.split(".")[0] != name.split(".")[0])
    assert _cycle(packages) is None, " -> ".join(_cycle(packages))


def test_the_child_process_helper_lives_in_rag_and_stack_builds_on_it():
    """The RAG domain needs a child process at run time (the embedded graph store), and rag/ may import nothing of
    ours: so the one start / wait / TERM-then-KILL helper is ``rag.childproc``, and stack/ imports it from there."""
    assert "rag.childproc" in MODULES and "stack.children" not in MODULES
    assert "rag.childproc" in GRAPH["rag.graph.falkordb"]
    assert all("rag.childproc" in GRAPH[name] for name in ("stack.servers", "stack.processes", "stack.prometheus"))


def test_the_cycle_check_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_the_import_reader_sees_lazy_and_type_checking_imports(tmp_path):
    source = tmp_path / "probe.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                      "    from telemetry.recorder import Telemetry\n"
                      "def f():\n    import stack.processes\n    from rag import settings\n")
    assert imports_of("probe", source) == {"telemetry.recorder", "stack.processes", "rag.settings"}


def test_the_vllm_plugin_loads_without_the_services_dependencies():
    """vLLM loads the plugin in every one of its processes: it must not pull in ONNX Runtime, FAISS, bm25s or the
    web stack (``telemetry.vllm_plugin`` imports only the metrics contract and, to read its switch, settings)."""
    code = ("import sys, telemetry.vllm_plugin as p; from prometheus_client import CollectorRegistry; "
            "p.VllmStepMetrics(CollectorRegistry()); p.enabled(); "
            "print(sorted({'onnxruntime', 'faiss', 'bm25s', 'fastapi', 'uvicorn', 'numpy', 'torch', 'httpx'} "
            "& {m.split('.')[0] for m in sys.modules}))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stdout + result.stderr
