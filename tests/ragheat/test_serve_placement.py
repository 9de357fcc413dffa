"""``ragheat serve --settings FILE`` with placement: every thread of the service on the listed core, its memory
locked once warm, and it answers; a settings file it cannot read stops it before it binds, with a sentence."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from rag.placement import parse_cpu_list, usable_cpus
from rag.settings import SETTINGS_FILE_ENV
from stack.servers import ServeProcess
from test_calibrate_quality_cli import run_cli


def _status(pid: int, field: str, task: str | None = None) -> str:
    path = Path(f"/proc/{pid}/task/{task}/status") if task else Path(f"/proc/{pid}/status")
    return next(line.split(":", 1)[1].strip() for line in path.read_text().splitlines() if line.startswith(field))


@pytest.mark.slow
def test_the_service_runs_where_the_settings_file_places_it(subset_index, tmp_path):
    core = max(usable_cpus())
    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps({"placement": {"cpus": str(core), "memory": "lock", "math_threads": 1}}))
    with ServeProcess(subset_index, ["--settings", str(settings)], env={"RAGHEAT_GRAPH__ENABLED": "false"}) as service:
        response = httpx.post(service.url + "/v1/query", json={"query": "vitamin D and bone density"}, timeout=30)
        assert response.status_code == 200 and response.json()["citations"]
        tasks = [t.name for t in Path(f"/proc/{service.pid}/task").iterdir()]
        assert len(tasks) > 3  # the web server, ONNX Runtime's and the workers' threads
        placed = {t: parse_cpu_list(_status(service.pid, "Cpus_allowed_list", t)) for t in tasks}
        assert all(cpus == {core} for cpus in placed.values()), placed
        locked_kib = int(_status(service.pid, "VmLck").split()[0])
        assert locked_kib > 100 * 1024, f"VmLck {locked_kib} kB: the models and the index are locked once warm"


def test_a_settings_file_that_cannot_be_read_stops_serve_with_its_name(tmp_path, monkeypatch):
    # serve names the file to its --workers through the environment: this process's is restored afterwards
    monkeypatch.setenv(SETTINGS_FILE_ENV, str(tmp_path / "restored-after-the-test.json"))
    result = run_cli("serve", "--settings", str(tmp_path / "missing.json"), "--index", str(tmp_path), cwd=tmp_path)
    assert result.exit_code == 2 and "missing.json: no such file" in result.output, result.output
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"placement": {"cpus": "all"}}))
    result = run_cli("serve", "--settings", str(bad), "--index", str(tmp_path), cwd=tmp_path)
    assert result.exit_code == 2 and "placement.cpus" in result.output, result.output
