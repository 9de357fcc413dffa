"""``rag.childproc``: a ``die_with_parent`` child outlives the thread that started it and dies with its parent.

Linux sends PR_SET_PDEATHSIG when the *thread* that forked the child exits; a child started from a server's worker
thread would die when that worker retires. So such children are forked from the main thread or from one spawner
thread that lives as long as the process (the rest of ChildProcess: tests/stack/test_children.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PARENT = textwrap.dedent("""
    import sys, threading, time
    sys.path.insert(0, sys.argv[1])
    from rag.childproc import ChildProcess
    children = []
    def start():
        children.append(ChildProcess("sleeper", ["sleep", "600"], die_with_parent=True).start())
    worker = threading.Thread(target=start)
    worker.start(); worker.join()            # the starting thread is gone
    main = ChildProcess("sleeper", ["sleep", "600"], die_with_parent=True).start()  # and one from the main thread
    time.sleep(0.5)
    print(children[0].pid, main.pid, children[0].alive(), flush=True)
    time.sleep(600)
""")


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_child_outlives_its_starting_thread_and_dies_with_its_parent():
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(REPO)], stdout=subprocess.PIPE, text=True)
    try:
        from_worker, from_main, reported_alive = parent.stdout.readline().split()
        assert reported_alive == "True" and alive(int(from_worker)) and alive(int(from_main))
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 15
    while (alive(int(from_worker)) or alive(int(from_main))) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(int(from_worker)) and not alive(int(from_main)), "a child outlived its killed parent"
