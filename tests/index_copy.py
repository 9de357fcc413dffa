"""A copy of a session's test index for a test that modifies it."""

from __future__ import annotations

import shutil
import stat
from pathlib import Path


def _sockets(folder: str, names: list[str]) -> list[str]:
    return [name for name in names if stat.S_ISSOCK((Path(folder) / name).lstat().st_mode)]


def copy_index(src: Path, dst: Path) -> Path:
    """``src`` copied to ``dst`` as it is (links as links), without the unix sockets of the graph stores that the
    session's pipelines serve from ``src`` meanwhile: a socket is not index content and cannot be read as a file."""
    return Path(shutil.copytree(src, dst, symlinks=True, ignore=_sockets))
