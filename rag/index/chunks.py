"""A generation's passages: ``chunks.jsonl``, one chunk a line, the line number its id; read where it lies.

The service reads a chunk only when a request cites it (a handful a query), so loading a generation reads the file
whole into one block of bytes (its own copy: a file changed on disk later cannot change what was checked) and finds
where each line starts, one scan of the bytes in numpy: no Python object per chunk. A large index holds millions of
chunks, and a loader that parsed every line would hold the interpreter's lock for seconds while the served
generation answers beside it (the hot swap), and leave millions of objects for every collection to walk.
The file is checked whole against the SHA-256 its generation's manifest recorded when it was published
(``IndexWriter.publish``); every line is parsed only for a generation without one, or to name the line a damaged
file breaks.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from rag.errors import IndexLoadError
from rag.types import Chunk

CHUNKS = "chunks.jsonl"
DIGEST_KEY = "chunks_sha256"
"""The manifest's key for the SHA-256 of the generation's ``chunks.jsonl``."""
_SCAN_BYTES = 64 << 20  # line ends are looked for this many bytes at a time (a bounded temporary array)


class ChunkTable(Sequence[Chunk]):
    """The chunks of one ``chunks.jsonl``, held as its bytes; ``table[i]`` parses line ``i`` into chunk ``i``.
    Iterating parses every line again: a caller that walks the whole table more than once makes a list of it."""

    __slots__ = ("path", "_data", "_starts")

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._data = self.path.read_bytes()  # one read, without the interpreter's lock
        self._starts = _line_starts(self._data)

    def __len__(self) -> int:
        return len(self._starts) - 1

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = range(len(self))[i]  # a negative index counts from the end; IndexError past either end
        return _parse(self._data[self._starts[i]:self._starts[i + 1]], i, self.path)

    @property
    def data(self) -> bytes:
        """The file's bytes, as read."""
        return self._data

    def check(self) -> None:
        """Parse every line: ``IndexLoadError`` naming the first that is not a chunk."""
        for i in range(len(self)):
            self[i]


def read_chunks(path: Path, sha256: str | None = None, count: int | None = None) -> ChunkTable:
    """The chunks of a ``chunks.jsonl`` file, in chunk-id order. With ``sha256`` (the manifest's) the bytes read are
    checked whole against it; without, every line is parsed. ``IndexLoadError`` naming the bad line, the number of
    chunks where it is not the manifest's ``count``, or the mismatch."""
    table = ChunkTable(path)
    if sha256 is None:
        table.check()
    elif hashlib.sha256(table.data).hexdigest() != sha256:
        table.check()  # names a line that is not a chunk, if one is the damage
        if count is not None and len(table) != count:
            raise IndexLoadError(path, f"the manifest says {count} chunks but it holds {len(table)}")
        raise IndexLoadError(path, "its contents changed after the generation was published (the SHA-256 in the "
                                   "manifest differs); re-run `ragheat ingest` on its source")
    return table


def write_chunks(path: Path, chunks: Iterable[Chunk]) -> None:
    """Write ``chunks`` to ``path`` as JSON lines."""
    with open(path, "w", encoding="utf-8") as fh:
        for c in chunks:
            fh.write(json.dumps({"doc_id": c.doc_id, "title": c.title, "text": c.text, "start": c.start,
                                 "end": c.end}, ensure_ascii=False) + "\n")


def file_sha256(path: Path) -> str:
    """The file's SHA-256, hex (hashlib reads it in blocks without holding the interpreter's lock)."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _line_starts(data: bytes) -> np.ndarray:
    """Where each line of ``data`` starts, and its end as the last entry (a last line without a newline counts)."""
    size = len(data)
    view = np.frombuffer(data, np.uint8)
    ends = [np.flatnonzero(view[at:at + _SCAN_BYTES] == ord("\n")) + (at + 1) for at in range(0, size, _SCAN_BYTES)]
    starts = np.concatenate([np.zeros(1, np.int64), *ends])
    if starts[-1] != size:  # the last line has no newline
        starts = np.append(starts, size)
    return starts


def _parse(line: bytes, chunk_id: int, path: Path) -> Chunk:
    try:
        row = json.loads(line)
        return Chunk(chunk_id, row["doc_id"], row["title"], row["text"], int(row["start"]), int(row["end"]))
    except (ValueError, KeyError, TypeError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise IndexLoadError(path, f"line {chunk_id + 1} is not a chunk ({exc})") from exc
