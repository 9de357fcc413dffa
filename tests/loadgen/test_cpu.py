"""CPU time per request (loadgen/cpu.py): the service's process tree and the generator, read from /proc."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from loadgen.cpu import CpuWindow, cpu_seconds_by_process, process_tree

# A parent that starts a child which burns ~0.5 s of CPU and then both sleep: the child stands for a --workers child.
_TREE = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
                          "import time\\nend = time.process_time() + 0.5\\nwhile time.process_time() < end: pass\\n"
                          "time.sleep(30)"])
time.sleep(30)
"""


def _wait_for_child(pid: int, timeout_s: float = 10.0) -> set[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        tree = process_tree([pid])
        if len(tree) >= 2:
            return tree
        time.sleep(0.02)
    raise AssertionError(f"process {pid} started no child within {timeout_s} s")


def test_the_window_counts_the_service_tree_and_the_generator_apart():
    parent = subprocess.Popen([sys.executable, "-c", _TREE])
    try:
        tree = _wait_for_child(parent.pid)
        window = CpuWindow([parent.pid])
        window.start()
        time.sleep(1.5)  # the child burns its 0.5 s inside the window (its interpreter start is before it)
        window.stop()
        assert tree <= process_tree([parent.pid]) and set(cpu_seconds_by_process([parent.pid])) == tree
        assert 0.35 <= window.service_s <= 1.5, window.service_s
        assert window.generator_s < 0.3, "this process slept"
        cost = window.per_answer(10)
        assert cost["service"] == pytest.approx(window.service_s * 100)
        assert cost["cores"] == len(os.sched_getaffinity(0))
        assert cost["ceiling_qps"] == pytest.approx(cost["cores"] * 1000 / (cost["service"] + cost["generator"]))
        assert window.per_answer(0) == {}
    finally:
        for pid in sorted(process_tree([parent.pid]), reverse=True):
            os.kill(pid, 9)
        parent.wait()


def test_a_process_that_is_not_here_is_refused_with_a_reason():
    with pytest.raises(ValueError, match="no process 999999999 on this machine"):
        CpuWindow([999999999])
    with pytest.raises(ValueError, match="none given"):
        CpuWindow([])
    with pytest.raises(RuntimeError, match="before start"):
        CpuWindow([os.getpid()]).stop()
