"""Fixtures for the eBPF tests: one workload process, probed once per session, its scenarios run in turn."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

WORKLOAD = Path(__file__).with_name("workload.py")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def ebpf():
    """The ``bcc`` module, or a failure naming what this machine lacks for real eBPF (never a silent skip)."""
    from probes.environment import ProbesUnavailable, prepare

    try:
        return prepare()
    except ProbesUnavailable as exc:
        pytest.fail(f"the root-marked probe tests need working eBPF: {exc}")


class Workload:
    """``tests/probes/workload.py`` as a child process; ``run(name)`` runs one scenario to its end."""

    def __init__(self) -> None:
        self.process = subprocess.Popen([sys.executable, str(WORKLOAD)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True, cwd=REPO)
        ready = self.process.stdout.readline().split()
        assert ready and ready[0] == "ready", f"workload did not start: {ready}"
        self.pid, self.port = self.process.pid, int(ready[1])

    def run(self, name: str) -> None:
        self.process.stdin.write(name + "\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline().strip()
        assert answer == f"done {name}", f"workload scenario {name} failed: {answer!r}"

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=10)


@pytest.fixture(scope="session")
def workload():
    w = Workload()
    yield w
    w.close()


@dataclass
class Measured:
    snapshot: object   # probes.stats.KernelSnapshot after every scenario
    options: object    # probes.program.ProgramOptions the probes ran with


@pytest.fixture(scope="session")
def measured(ebpf, workload) -> Measured:
    """Every probe (syscalls included) attached to the workload while each scenario runs once."""
    from probes.discover import listening_ports
    from probes.loader import KernelProbes
    from rag.settings import ProbeSettings

    with KernelProbes.attach(workload.pid, ProbeSettings(syscalls=True),
                             tcp_ports=listening_ports(workload.pid)) as probes:
        for scenario in ("sleeper", "reader", "spinners", "stages", "tcp"):
            workload.run(scenario)
        return Measured(probes.snapshot(), probes.options)
