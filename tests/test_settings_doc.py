"""docs/settings.md is generated, not copied: rendered from rag/settings.py by scripts/render_settings_doc.py, byte
for byte, with every section and field of the settings object in it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from rag.settings import RagheatSettings

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "render_settings_doc.py"
REGENERATE = ".venv/bin/python scripts/render_settings_doc.py"


def load_renderer():
    spec = importlib.util.spec_from_file_location("render_settings_doc", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_doc_is_what_the_settings_module_renders():
    done = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, cwd=REPO,
                          timeout=120)
    if done.returncode != 0:
        pytest.fail(f"docs/settings.md is not what rag/settings.py renders (edit the settings module, not the doc; "
                    f"then run {REGENERATE}):\n{done.stderr[-2000:]}\n{done.stdout[:4000]}")


def test_every_section_and_field_is_documented_with_its_environment_variable():
    text = load_renderer().render()
    for section, info in RagheatSettings.model_fields.items():
        assert f"\n## {section}\n" in text, section
        for field in info.annotation.model_fields:
            assert f"| `{field}` | `RAGHEAT_{section.upper()}__{field.upper()}` |" in text, f"{section}.{field}"


def test_the_rendering_does_not_depend_on_the_users_home(monkeypatch):
    renderer = load_renderer()
    here = renderer.render()
    monkeypatch.setenv("HOME", "/home/someone-else")
    monkeypatch.setenv("XDG_CACHE_HOME", "/var/cache/elsewhere")
    there = renderer.render()
    assert "someone-else" not in there and "elsewhere" not in there
    assert there == here
