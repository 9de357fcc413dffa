"""``ragheat dashboards``: render writes both profiles, mistakes get a sentence (not a traceback), and importing
the commands stays light."""

from __future__ import annotations

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from dashboards import render, slo
from ragheat.cli import app


def test_cli_render_writes_both_profiles(tmp_path):
    runner = CliRunner()
    for profile in slo.PROFILES:
        result = runner.invoke(app, ["dashboards", "render", str(tmp_path / profile), "--profile", profile])
        assert result.exit_code == 0, result.output
        for relative, text in render.rendered_files(slo.PROFILES[profile]).items():
            assert (tmp_path / profile / relative).read_text(encoding="utf-8") == text


@pytest.mark.parametrize("args, message", [
    (["render", "{tmp}/out", "--profile", "staging"], "--profile must be one of production, test"),
    (["render", "{tmp}/file"], "exists and is not a folder"),
    (["check", "--prometheus", "http://127.0.0.1:9"], "cannot reach Prometheus at http://127.0.0.1:9"),
    (["snapshot", "--prometheus", "http://127.0.0.1:9", "--out", "{tmp}/png"], "cannot reach Prometheus"),
    (["snapshot", "--prometheus", "http://127.0.0.1:9", "--boards", "latency,grafana"], "no board called grafana"),
])
def test_cli_mistakes_get_a_sentence(tmp_path, args, message):
    (tmp_path / "file").write_text("")
    result = CliRunner().invoke(app, ["dashboards", *[a.format(tmp=tmp_path) for a in args]])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert "Traceback" not in result.output


@pytest.mark.parametrize("module, heavy", [
    ("ragheat.commands.dashboards", {"grafanalib", "matplotlib", "httpx", "yaml"}),
    # the root app registers every command group: `ragheat --help` must not load what the commands use
    ("ragheat.cli", {"grafanalib", "matplotlib", "httpx", "yaml", "numpy", "faiss", "onnxruntime", "fastapi",
                     "uvicorn", "prometheus_client", "opentelemetry"}),
])
def test_importing_the_cli_stays_light(module, heavy):
    code = f"import sys, {module}; print(sorted(set({sorted(heavy)!r}) & {{m.split('.')[0] for m in sys.modules}}))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "[]", result.stdout + result.stderr
