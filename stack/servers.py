"""Run the service for a while on a loopback port and wait until it answers: in a background thread of this
process (demo, tests), as a ``ragheat serve`` child process (benchmarks, probe tests), or as several of them side by
side (benchmarks comparing configurations)."""

from __future__ import annotations

import os
import socket
import sys
import threading
from pathlib import Path
from typing import Mapping, Sequence

import uvicorn

from rag.childproc import ChildProcess, free_port, wait_until_ok


class ServeProcess:
    """``with ServeProcess(index) as service:`` runs ``ragheat serve --index INDEX`` on a free port as a child
    process until the block ends; ``service.url`` and ``service.pid`` once it answers ``/readyz``.

    Its output goes where this process's goes, and it shares this process's group, as a command run by hand
    would (``ChildProcess`` stops it: SIGTERM, then SIGKILL after ``stop_timeout_s``). ``port``: the port of a
    service it replaces (a redeploy), instead of a free one."""

    def __init__(self, index: Path, extra_args: Sequence[str] = (), env: Mapping[str, str] | None = None,
                 ready_timeout_s: float = 120.0, stop_timeout_s: float = 30.0, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        ragheat = Path(sys.executable).parent / "ragheat"
        self.child = ChildProcess("ragheat serve", [ragheat, "serve", "--index", index, "--port", self.port,
                                                    "--log-level", "warning", *extra_args],
                                  env=env, own_session=False, stop_timeout_s=stop_timeout_s)
        self.ready_timeout_s = ready_timeout_s

    @property
    def pid(self) -> int:
        return self.child.pid

    def __enter__(self) -> "ServeProcess":
        self.child.start()
        try:
            self.child.wait_until_ok(self.url + "/readyz", self.ready_timeout_s)
        except BaseException:
            self.child.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.child.stop()


class ServeFleet:
    """``with ServeFleet(index, configs, log_dir) as fleet:`` one ``ragheat serve`` child per named configuration
    (``configs``: name -> (extra arguments, environment overrides)), each on a free loopback port and logging to
    ``log_dir/api-<name>.log``; all are started before any is waited for, so they load side by side.
    ``fleet.urls[name]`` once every one answers ``/readyz``. They stop when the block ends, or with this process.
    ``indexes``: name -> another index that configuration serves instead of ``index``. An environment override of
    None removes that variable from the child's environment."""

    def __init__(self, index: Path, configs: Mapping[str, tuple[Sequence[str], Mapping[str, str]]], log_dir: Path,
                 ready_timeout_s: float = 300.0, indexes: Mapping[str, Path] | None = None) -> None:
        self.index, self.configs, self.log_dir = Path(index).resolve(), dict(configs), Path(log_dir)
        self.indexes = {name: Path(path).resolve() for name, path in (indexes or {}).items()}
        self.ready_timeout_s = ready_timeout_s
        self.children: list[ChildProcess] = []
        self.urls: dict[str, str] = {}

    def __enter__(self) -> "ServeFleet":
        ragheat = Path(sys.executable).parent / "ragheat"
        try:
            for name, (extra_args, env) in self.configs.items():
                port = free_port()
                index = self.indexes.get(name, self.index)
                child = ChildProcess(f"api-{name}", [ragheat, "serve", "--index", index, "--host", "127.0.0.1",
                                                     "--port", port, "--log-level", "warning", *extra_args],
                                     log_path=self.log_dir / f"api-{name}.log",
                                     env={k: v for k, v in {**os.environ, **env}.items() if v is not None},
                                     die_with_parent=True).start()
                self.children.append(child)
                self.urls[name] = f"http://127.0.0.1:{port}"
            for child, url in zip(self.children, self.urls.values()):
                child.wait_until_ok(url + "/readyz", self.ready_timeout_s)
        except BaseException:
            self.__exit__()
            raise
        return self

    @property
    def pids(self) -> dict[str, int]:
        """Each configuration's ``ragheat serve`` process id (for loadgen.cpu: its CPU per answer)."""
        return {name: child.pid for name, child in zip(self.configs, self.children)}

    def __exit__(self, *exc) -> None:
        for child in reversed(self.children):
            child.stop()


class BackgroundServer:
    """``with BackgroundServer(app) as url:`` serves ``app`` in a thread of this process until the block ends.

    The socket is bound before uvicorn starts (port 0 = a free port), so there is no race
    between choosing a port and listening on it.
    """

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, ready_timeout: float = 120.0) -> None:
        self.app, self.host, self.port, self.ready_timeout = app, host, port, ready_timeout
        self.url = ""

    def __enter__(self) -> str:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        self.url = f"http://{self.host}:{self.port}"
        config = uvicorn.Config(self.app, log_level="warning", access_log=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]},
                                       name="ragheat-uvicorn", daemon=True)
        self.thread.start()
        wait_until_ok(self.url + "/readyz", self.ready_timeout, self.thread.is_alive, "the server")
        return self.url

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
