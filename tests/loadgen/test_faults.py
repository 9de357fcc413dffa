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
from loadgen.faults import (DiskWriter, InProcessSpinner, MemoryCgroup, MemoryHog, Paused, descendants_named,
                            evict_page_cache)


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


def _available_mib() -> int:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) >> 10 for line in f if line.startswith("MemAvailable:"))


def _rss_mib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return next(int(line.split()[1]) >> 10 for line in status.splitlines() if line.startswith("VmRSS:"))


@pytest.mark.serial  # what it takes is what the host has available: another test's memory moves it
def test_the_memory_hog_takes_what_is_free_but_its_headroom_then_the_rest_and_holds_it():
    # A small bite of this machine, to see the mechanism: 128 MiB first, 128 more once on.
    hog = MemoryHog(leave_mib=_available_mib() - 256, headroom_mib=128)
    with hog:
        pid = hog._child.pid
        deadline, rss = time.monotonic() + 20, 0
        while time.monotonic() < deadline and rss < 192:
            rss = _rss_mib(pid)
            time.sleep(0.1)
        assert rss >= 192, rss  # pages touched, not merely reserved
        assert Path(f"/proc/{pid}/oom_score_adj").read_text().strip() == "1000"
    assert hog._child is None


@pytest.mark.serial  # what it takes is what the host has available: another test's memory moves it
def test_a_prepared_memory_hog_holds_its_first_bite_before_it_is_turned_on():
    hog = MemoryHog(leave_mib=_available_mib() - 256, headroom_mib=128)
    held = hog.prepare()
    try:
        assert held >= 64 and _rss_mib(hog._child.pid) >= held
    finally:
        with hog:
            pass
    assert hog._child is None


@pytest.mark.root
def test_a_memory_cgroup_is_charged_for_the_files_its_process_reads_once_evicted_and_can_be_capped(tmp_path):
    data = tmp_path / "index" / "tokens.bin"
    data.parent.mkdir()
    data.write_bytes(os.urandom(32 << 20))
    data.read_bytes()  # cached now, charged to this test's cgroup
    assert evict_page_cache(data.parent) == 32 << 20
    group = MemoryCgroup(name=f"ragheat-test-{os.getpid()}")
    try:
        with group.holding_new_children():
            child = subprocess.Popen([sys.executable, "-c", f"import time; open({str(data)!r}, 'rb').read(); "
                                                            "time.sleep(30)"])
        try:
            assert group.path.name in Path(f"/proc/{child.pid}/cgroup").read_text()
            assert group.path.name not in Path("/proc/self/cgroup").read_text()  # the caller left it again
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and group._stat()["file" if group.v2 else "cache"] < 31 << 20:
                time.sleep(0.1)
            assert group._stat()["file" if group.v2 else "cache"] >= 31 << 20  # the file's pages are the group's
            with group.limited(keep=0.25) as limit:
                assert int(group._limit_file().read_text()) <= limit
                assert group._stat()["file" if group.v2 else "cache"] <= 28 << 20  # reclaimed to fit the limit
            assert group._limit_file().read_text().strip() in {"max", str(2**63 - 4096)}  # no limit again
        finally:
            child.kill()
            child.wait()
    finally:
        group.remove()
    assert not group.path.exists()


@pytest.mark.root
def test_a_process_whose_memory_grows_past_the_cap_waits_and_lives_while_its_page_cache_stays_squeezed(tmp_path):
    """A service's anonymous memory grows under load (a queue, its buffers): the drill squeezes its page cache, it
    does not kill it. The child reads a file, then on a line from the test takes 64 MiB more than the cap left."""
    data = tmp_path / "tokens.bin"
    data.write_bytes(os.urandom(32 << 20))
    evict_page_cache(tmp_path)
    grow = ("import sys, time\n"
            f"open({str(data)!r}, 'rb').read()\n"
            "print('read', flush=True)\n"
            "sys.stdin.readline()\n"
            "held = bytearray(64 << 20)\n"
            "for i in range(0, len(held), 4096): held[i] = 1\n"
            "print('grew', flush=True)\n"
            "time.sleep(30)\n")
    group = MemoryCgroup(name=f"ragheat-test-{os.getpid()}")
    try:
        with group.holding_new_children():
            child = subprocess.Popen([sys.executable, "-c", grow], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        try:
            assert child.stdout.readline().strip() == "read"
            with group.limited(keep=0.25) as first_limit:
                child.stdin.write("go\n")
                child.stdin.flush()
                assert child.stdout.readline().strip() == "grew"
                assert child.poll() is None  # alive
                if group.v2:  # memory.high throttles, the kernel lets the group past it
                    assert int((group.path / "memory.current").read_text()) > first_limit
                else:  # the watcher raised the hard limit while the child waited at it
                    assert int(group._limit_file().read_text()) > first_limit + (32 << 20)
        finally:
            child.kill()
            child.wait()
    finally:
        group.remove()
