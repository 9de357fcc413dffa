"""Find the service process behind a URL, and the TCP ports a process listens on, from /proc alone."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

from probes.environment import ProbesUnavailable

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's hex "st" column
_LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1", "0.0.0.0", "::", "[::1]"}


def listening_sockets(proc: Path = Path("/proc"), netns_of: int | None = None) -> dict[int, set[int]]:
    """Socket inode -> local ports, for TCP sockets in LISTEN state (IPv4 and IPv6)."""
    base = proc / str(netns_of) / "net" if netns_of else proc / "net"
    found: dict[int, set[int]] = {}
    for name in ("tcp", "tcp6"):
        try:
            lines = (base / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == _LISTEN:
                found.setdefault(int(fields[9]), set()).add(int(fields[1].rsplit(":", 1)[1], 16))
    return found


def socket_inodes(pid: int, proc: Path = Path("/proc")) -> set[int]:
    """Inodes of the sockets process ``pid`` holds open."""
    inodes = set()
    fd_dir = proc / str(pid) / "fd"
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return inodes
    for name in names:
        try:
            target = os.readlink(fd_dir / name)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def listening_ports(pid: int, proc: Path = Path("/proc")) -> list[int]:
    """TCP ports process ``pid`` listens on (its own network namespace)."""
    sockets = listening_sockets(proc, netns_of=pid)
    return sorted({port for inode in socket_inodes(pid, proc) for port in sockets.get(inode, ())})


def pids_for_url(url: str, proc: Path = Path("/proc")) -> tuple[list[int], int]:
    """(pids, port) of the local processes listening on ``url``'s port: one service, or the workers of one
    (``ragheat serve --workers N``: each binds the port, SO_REUSEPORT); a sentence when there is none."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise ProbesUnavailable(f"--service-url {url!r} has an invalid port") from None
    if not parts.hostname:
        raise ProbesUnavailable(f"--service-url {url!r} is not a URL like http://127.0.0.1:8000")
    if parts.hostname not in _LOCAL_HOSTS and parts.hostname != os.uname().nodename:
        raise ProbesUnavailable(f"--service-url must name this machine (127.0.0.1, localhost), not "
                                f"{parts.hostname!r}: eBPF sees only local processes; pass --pid instead")
    inodes = {inode for inode, ports in listening_sockets(proc).items() if port in ports}
    pids = set()
    if inodes:
        for entry in os.listdir(proc):
            if entry.isdigit() and socket_inodes(int(entry), proc) & inodes:
                pids.add(int(entry))
    if not pids:
        raise ProbesUnavailable(f"no process on this machine listens on port {port} (from --service-url {url}); "
                                "is the service running? (or pass --pid)")
    return sorted(pids), port
