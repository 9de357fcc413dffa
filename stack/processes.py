"""Detached processes recorded in a state file, so ``ragheat stack down`` (another process, later) stops
exactly what ``up`` started and nothing else.

Each process runs in its own session (its own process group, so its children stop with it). It is
recorded by pid *and* kernel start time: a pid reused by an unrelated process after a reboot or a crash
never matches, so a stale state file can be cleaned without risk.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

from rag.childproc import ChildProcess, group_members, stat_fields, terminate

STATE_FILE = "state.json"


def start_time(pid: int, proc: Path = Path("/proc")) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat); None when gone."""
    fields = stat_fields(pid, proc)
    if fields is None or fields[0] == "Z":  # a zombie has exited, waiting to be reaped by its (new) parent
        return None
    return int(fields[19])


@dataclass
class Managed:
    """One started process: what it is, where it listens, where it logs."""

    name: str
    pid: int
    started: int
    argv: list[str]
    log: str
    url: str = ""

    def alive(self) -> bool:
        return start_time(self.pid) == self.started

    def leftovers(self) -> list[int]:
        """Members of its process group started no earlier than it: after the leader died (a crashed vLLM API
        server), its children (the engine core) still hold the group. A pid reused by an unrelated process
        would have its own group, and one started before ours cannot be its child."""
        return [pid for pid in group_members(self.pid) if (start_time(pid) or -1) >= self.started]

    def running(self) -> bool:
        return self.alive() or bool(self.leftovers())

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM to its process group, then SIGKILL after ``timeout_s``; returns once the whole group is gone
        (vLLM's engine, a shell's children), including members left behind by a leader that died. A group
        that is not ours any more is left alone."""
        if self.running():
            terminate(lambda sig: os.killpg(self.pid, sig), lambda: not group_members(self.pid), timeout_s)


@dataclass
class StackState:
    """The state file: the processes of one local stack, in start order."""

    folder: Path
    processes: list[Managed] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def path(self) -> Path:
        return self.folder / STATE_FILE

    @classmethod
    def load(cls, folder: Path) -> "StackState | None":
        try:
            data = json.loads((folder / STATE_FILE).read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise ValueError(f"{folder / STATE_FILE} is unreadable ({exc}); delete it after checking that no "
                             "stack process is left running") from None
        return cls(folder, [Managed(**p) for p in data["processes"]], data.get("notes", []))

    def save(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"processes": [asdict(p) for p in self.processes], "notes": self.notes},
                                  indent=2))
        tmp.replace(self.path)

    def spawn(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None, url: str = "") -> Managed:
        """Start ``argv`` detached (own session, output to ``<folder>/logs/<name>.log``) and record it
        before returning, so a crash of ``up`` right after still leaves it findable by ``down``."""
        log_path = self.folder / "logs" / f"{name}.log"
        child = ChildProcess(name, argv, log_path=log_path, env=env, stdin=subprocess.DEVNULL).start()
        managed = Managed(name, child.pid, start_time(child.pid) or 0, list(argv), str(log_path), url)
        self.processes.append(managed)
        self.save()
        return managed

    def get(self, name: str) -> Managed | None:
        return next((p for p in self.processes if p.name == name), None)

    def stop_all(self) -> list[str]:
        """Stop every recorded process, last started first; returns the names that were still running."""
        stopped = []
        for managed in reversed(self.processes):
            if managed.running():
                managed.stop()
                stopped.append(managed.name)
        self.path.unlink(missing_ok=True)
        return stopped
