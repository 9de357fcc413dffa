"""The faults the explain drills inject (loadgen/faults.py), each on a throwaway process: they must do to it what
they say, and undo it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from loadgen.cpu import cpu_seconds
from loadgen.faults import DiskWriter, InProcessSpinner, MemoryCgroup, Paused, descendants_named


def _state(pid: int) -> str:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2]


@pytest.fixture
def sleeper():
    child = subprocess.Popen(["sleep", "60"])
    yield child
    child.kill()
    child.wait()


def test_descendants_are_found_by_command_name(sleeper):
    assert descendants_named(os.getpid(), "sleep") == [sleeper.pid]
    assert descendants_named(os.getpid(), "no-such-command") == []


def test_a_duty_cycle_stops_and_resumes_the_process_and_leaves_it_running(sleeper):
    states = []
    with Paused([sleeper.pid], stopped_s=0.3, period_s=0.6):
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            states.append(_state(sleeper.pid))
            time.sleep(0.02)
    assert "T" in states and "S" in states, states  # stopped part of each period, running the rest
    time.sleep(0.05)
    assert _state(sleeper.pid) == "S"


def test_a_stopped_dependency_stays_stopped_until_the_block_ends(sleeper):
    with Paused([sleeper.pid], stopped_s=1.0, period_s=1.0):
        time.sleep(0.1)
        states = set()
        for _ in range(30):
            states.add(_state(sleeper.pid))
            time.sleep(0.02)
    assert states == {"T"}
    time.sleep(0.05)
    assert _state(sleeper.pid) == "S"


def test_pausing_nothing_is_refused():
    with pytest.raises(ValueError, match="no process"):
        Paused([], stopped_s=0.1)


def test_the_spinner_burns_cpu_inside_the_process_only_while_on(tmp_path):
    spinner = InProcessSpinner(tmp_path / "spinner")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                             env=spinner.env(dict(os.environ)))
    try:
        time.sleep(1.0)  # started, idle
        idle_start = cpu_seconds(child.pid)
        time.sleep(0.6)
        idle = cpu_seconds(child.pid) - idle_start
        with spinner:
            time.sleep(0.3)  # the thread polls the trigger
            busy_start = cpu_seconds(child.pid)
            time.sleep(0.6)
            busy = cpu_seconds(child.pid) - busy_start
        time.sleep(0.4)
        after_start = cpu_seconds(child.pid)
        time.sleep(0.6)
        after = cpu_seconds(child.pid) - after_start
    finally:
        child.kill()
        child.wait()
    assert idle < 0.05 and after < 0.05, (idle, after)
    assert busy > 0.3, busy


def test_the_disk_writer_writes_and_cleans_up(tmp_path):
    with DiskWriter(tmp_path) as writer:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (writer.file.exists() and writer.file.stat().st_size >= 4 << 20):
            time.sleep(0.05)
        assert writer.file.stat().st_size >= 4 << 20
    assert not writer.file.exists()


@pytest.mark.root
def test_a_memory_cgroup_holds_new_children_and_caps_them_at_their_anonymous_memory_plus_a_share(tmp_path):
    group = MemoryCgroup(name=f"ragheat-test-{os.getpid()}")
    try:
        with group.holding_new_children():
            child = subprocess.Popen([sys.executable, "-c", "import time; b = bytearray(64 << 20); time.sleep(30)"])
        try:
            assert str(group.path.name) in Path(f"/proc/{child.pid}/cgroup").read_text()
            assert group.path.name not in Path("/proc/self/cgroup").read_text()  # the caller left it again
            time.sleep(1.0)
            limit_file = group._limit_file()
            with group.limited(keep=0.5) as limit:
                assert 64 << 20 <= int(limit_file.read_text()) <= limit  # the kernel rounds to pages
            assert limit_file.read_text().strip() in {"max", str(2**63 - 4096)}  # no limit again
        finally:
            child.kill()
            child.wait()
    finally:
        group.remove()
    assert not group.path.exists()
