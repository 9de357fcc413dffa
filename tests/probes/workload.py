"""A process with known kernel behaviour for the eBPF tests, driven over stdin.

It prints ``ready <port>`` (a TCP listener with a backlog of 0, for the retransmit scenario), then runs
each scenario named on a stdin line and answers ``done <scenario>``. Each scenario runs in threads named for
a stage (``rag.threadnames``), so the tests can tell the scenarios apart by the ``stage`` label.
"""

from __future__ import annotations

import hashlib
import os
import socket
import sys
import threading
import time

from rag.threadnames import set_name, stage_comm

SLEEPS, SLEEP_S = 30, 0.010          # sleeper: rh:embed
READS = 500                           # reader: rh:fuse, exactly this many read(2) calls
STAGE_SLEEPS = 10                     # stages: each named thread sleeps this many times
STAGE_THREADS = {"retrieve_dense": stage_comm("retrieve_dense"), "retrieve_bm25": stage_comm("retrieve_bm25"),
                 "http": stage_comm("http"), "other": b"worker-7"}
SPIN_S = 0.6                          # spinners: two rh:generate threads pinned to one CPU

listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(0)


def in_thread(name: bytes, fn) -> threading.Thread:
    def run():
        set_name(name)
        fn()
    thread = threading.Thread(target=run)
    thread.start()
    return thread


def sleeper():
    def loop():
        for _ in range(SLEEPS):
            time.sleep(SLEEP_S)
    in_thread(stage_comm("embed"), loop).join()


def reader():
    fd = os.open("/dev/zero", os.O_RDONLY)  # opened before the thread takes its stage name

    def loop():
        for _ in range(READS):
            os.read(fd, 1)
    try:
        in_thread(stage_comm("fuse"), loop).join()
    finally:
        os.close(fd)


def spinners():
    cpu = min(os.sched_getaffinity(0))
    data = os.urandom(1 << 20)  # hashing 1 MiB releases the GIL, so both threads really compete for the CPU

    def spin():
        os.sched_setaffinity(threading.get_native_id(), {cpu})
        deadline = time.monotonic() + SPIN_S
        while time.monotonic() < deadline:
            hashlib.sha256(data).digest()
    threads = [in_thread(stage_comm("generate"), spin) for _ in range(2)]
    for thread in threads:
        thread.join()


def stages():
    def loop():
        for _ in range(STAGE_SLEEPS):
            time.sleep(0.002)
    for thread in [in_thread(name, loop) for name in STAGE_THREADS.values()]:
        thread.join()


def tcp():
    """Fill the listener's accept queue (backlog 0), so the next SYN is dropped and retransmitted (~1 s)."""
    first = socket.create_connection(listener.getsockname())
    second = socket.socket()
    second.setblocking(False)
    second.connect_ex(listener.getsockname())
    time.sleep(1.4)
    second.close()
    first.close()


SCENARIOS = {"sleeper": sleeper, "reader": reader, "spinners": spinners, "stages": stages, "tcp": tcp}

if __name__ == "__main__":
    print(f"ready {listener.getsockname()[1]}", flush=True)
    for line in sys.stdin:
        name = line.strip()
        if name:
            SCENARIOS[name]()
            print(f"done {name}", flush=True)
