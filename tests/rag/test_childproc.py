"""``rag.childproc``: ``ChildProcess``, the one start / wait-until-ready / TERM-then-KILL helper, on real processes;
and a ``die_with_parent`` child that outlives the thread that started it and dies with its parent.

Linux sends PR_SET_PDEATHSIG when the *thread* that forked the child exits; a child started from a server's worker
thread would die when that worker retires. So such children are forked from the main thread or from one spawner
thread that lives as long as the process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from rag.childproc import ChildProcess, free_port, group_members

REPO = Path(__file__).resolve().parents[2]

# A loopback HTTP server that answers 200 on any path, after ``delay`` seconds.
SERVER = textwrap.dedent("""
    import sys, time
    from http.server import BaseHTTPRequestHandler, HTTPServer
    class Ok(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers()
        def log_message(self, *args):
            pass
    time.sleep(float(sys.argv[2]))
    print("listening", flush=True)
    HTTPServer(("127.0.0.1", int(sys.argv[1])), Ok).serve_forever()
""")


def test_it_waits_until_the_child_answers_and_stops_it(tmp_path):
    port = free_port()
    child = ChildProcess("server", [sys.executable, "-c", SERVER, str(port), "0.3"], log_path=tmp_path / "server.log")
    with child:
        child.wait_until_ok(f"http://127.0.0.1:{port}/ready", timeout_s=30)
        assert child.alive()
    assert not child.alive() and child.process.returncode == -15  # stopped by SIGTERM, and reaped
    assert "listening" in (tmp_path / "server.log").read_text()


def test_a_child_that_exits_during_start_up_is_reported_with_its_code_and_log(tmp_path):
    code = "import sys; print('no model folder here'); sys.exit(3)"
    with ChildProcess("broken", [sys.executable, "-c", code], log_path=tmp_path / "broken.log") as child:
        with pytest.raises(RuntimeError) as info:
            child.wait_until_ok(f"http://127.0.0.1:{free_port()}/", timeout_s=30)
    message = str(info.value)
    assert "broken exited with code 3 during start-up" in message and "no model folder here" in message
    assert str(tmp_path / "broken.log") in message


def test_a_child_that_never_answers_times_out_naming_its_log(tmp_path):
    with ChildProcess("silent", [sys.executable, "-c", "import time; time.sleep(60)"],
                      log_path=tmp_path / "silent.log") as child:
        started = time.monotonic()
        with pytest.raises(TimeoutError, match=r"silent: .* did not answer 200 within 0.5 s \(log .*silent.log\)"):
            child.wait_until_ok(f"http://127.0.0.1:{free_port()}/", timeout_s=0.5)
        assert time.monotonic() - started < 10
        assert child.alive(), "a failed wait leaves the child to stop()"


def test_sigterm_then_sigkill_for_a_child_that_ignores_sigterm(tmp_path):
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    child = ChildProcess("stubborn", [sys.executable, "-c", code], log_path=tmp_path / "stubborn.log",
                         stop_timeout_s=0.5).start()
    deadline = time.monotonic() + 20
    while "up" not in (tmp_path / "stubborn.log").read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    started = time.monotonic()
    child.stop()
    assert child.process.returncode == -9, child.process.returncode  # SIGKILL, after the ignored SIGTERM
    assert 0.4 < time.monotonic() - started < 10


def test_a_stopped_child_ends_on_sigterm_without_waiting_for_the_kill():
    child = ChildProcess("stopped", [sys.executable, "-c", "import time; time.sleep(60)"], stop_timeout_s=30).start()
    os.kill(child.pid, signal.SIGSTOP)
    started = time.monotonic()
    child.stop()
    assert child.process.returncode == -15, child.process.returncode  # its SIGTERM, delivered by the SIGCONT after it
    assert time.monotonic() - started < 10


def test_its_own_session_stops_the_grandchildren_too(tmp_path):
    code = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            "print('spawned', flush=True); time.sleep(60)")
    child = ChildProcess("leader", [sys.executable, "-c", code], log_path=tmp_path / "leader.log").start()
    deadline = time.monotonic() + 20
    while len(group_members(child.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(group_members(child.pid)) == 2
    child.stop()
    assert group_members(child.pid) == []


def test_without_a_session_it_stays_in_this_process_group():
    child = ChildProcess("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"], own_session=False).start()
    try:
        assert os.getpgid(child.pid) == os.getpgid(0)
    finally:
        child.stop()
    assert child.process.returncode == -15  # SIGTERM was enough


def test_free_port_is_bindable():
    port = free_port()
    with HTTPServer(("127.0.0.1", port), BaseHTTPRequestHandler) as server:
        assert server.server_address[1] == port


# --- die_with_parent ------------------------------------------------------------------------------------------

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
