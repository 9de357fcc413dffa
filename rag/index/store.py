"""The on-disk index: generations swapped atomically behind a ``current`` symlink.

Layout of an index folder::

    DIR/current -> generations/<id>      # replaced with one rename(2): readers see old or new, never half
    DIR/generations/<id>/manifest.json   # corpus, model, chunking, index parameters, counts
    DIR/generations/<id>/chunks.jsonl    # one passage a line; the line number is the chunk id
    DIR/generations/<id>/dense.faiss, bm25/, idf.json
    DIR/generations/<id>/graph.rdb, graph_aliases.json   # the knowledge graph (rag/graph): the embedded store's
                                                         # file and the linker's aliases (Neo4j: aliases only)
    DIR/.lock                            # one writer at a time

A build writes ``generations/.tmp-<id>`` and renames it into place only when complete, then
swaps ``current``. A crash or Ctrl-C at any point leaves ``current`` on the previous generation;
the next build removes the leftovers.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import bm25s
import faiss

from rag.errors import IndexLoadError
from rag.index import dense, sparse
from rag.index.chunks import CHUNKS, DIGEST_KEY, ChunkTable, file_sha256, read_chunks
from rag.settings import IndexSettings

MANIFEST = "manifest.json"
CURRENT = "current"
GENERATIONS = "generations"
FORMAT_VERSION = 1
KEEP_PREVIOUS = 1  # generations kept besides the current one, for rollback


def resolve_generation(index_dir: Path) -> Path:
    """The folder holding a manifest: ``index_dir`` itself or what its ``current`` link points at."""
    index_dir = Path(index_dir)
    if (index_dir / MANIFEST).is_file():
        return index_dir
    current = index_dir / CURRENT
    if not index_dir.exists():
        raise IndexLoadError(index_dir, "the folder does not exist; build it with `ragheat ingest SOURCE --index "
                                        f"{index_dir}`")
    if not current.exists():
        raise IndexLoadError(index_dir, f"no {CURRENT!r} generation and no {MANIFEST}; it is not a ragheat index "
                                        "(or its first ingest never finished)")
    return current.resolve()


def read_manifest(index_dir: Path) -> dict:
    """The manifest of the generation ``index_dir`` points at; ``IndexLoadError`` naming the path if unreadable."""
    folder = resolve_generation(index_dir)
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise IndexLoadError(folder, f"{MANIFEST} is unreadable ({exc})") from exc
    if manifest.get("format_version") != FORMAT_VERSION:
        raise IndexLoadError(folder, f"format_version {manifest.get('format_version')!r} is not "
                                     f"{FORMAT_VERSION}; rebuild it with `ragheat ingest`")
    return manifest


@dataclass
class LoadedIndex:
    """Everything the query path needs from disk (the dense and BM25 indexes only when it searches them itself)."""

    folder: Path
    manifest: dict
    chunks: ChunkTable
    faiss_index: faiss.Index | None
    bm25: bm25s.BM25 | None
    idf: dict[str, float]


def load_index(index_dir: Path, settings: IndexSettings, searchable: bool = True) -> LoadedIndex:
    """Load and cross-check every part; any inconsistency is an ``IndexLoadError`` naming the path. ``searchable``
    False leaves the dense and BM25 indexes on disk (another engine searches them: ``vector_store.fallback`` none)."""
    manifest = read_manifest(index_dir)
    folder = resolve_generation(index_dir)
    expected = manifest["counts"]["chunks"]
    faiss_index = bm25 = None
    try:
        chunks = read_chunks(folder / CHUNKS, manifest.get(DIGEST_KEY), expected)
        if searchable:
            faiss_index = dense.load_index(folder, settings)
            bm25, idf = sparse.load_bm25(folder)
        else:
            idf = sparse.load_idf(folder)
    except IndexLoadError:
        raise
    except Exception as exc:  # FAISS and bm25s raise assorted types on damaged files
        raise IndexLoadError(folder, f"{type(exc).__name__}: {exc}") from exc
    missing = [name for name in (manifest.get("graph") or {}).get("files", ()) if not (folder / name).is_file()]
    if missing:
        raise IndexLoadError(folder, f"the manifest lists graph files that are missing: {', '.join(missing)}")
    counts = {"chunks.jsonl": len(chunks)}
    if searchable:
        counts.update({"dense.faiss": int(faiss_index.ntotal), "bm25": sparse.bm25_size(bm25)})
    wrong = {name: count for name, count in counts.items() if count != expected}
    if wrong:
        raise IndexLoadError(folder, f"manifest says {expected} chunks but found {wrong}")
    return LoadedIndex(folder, manifest, chunks, faiss_index, bm25, idf)


def link_files(source: Path, target: Path, skip: frozenset[str] | set[str] = frozenset()) -> None:
    """Hard-link every file under ``source`` into ``target`` (a copy where a link cannot be made, e.g. across
    filesystems), except the top-level names in ``skip`` and sockets."""
    for path in source.rglob("*"):
        relative = path.relative_to(source)
        if relative.parts[0] in skip or path.is_socket():
            continue
        destination = target / relative
        if path.is_dir():
            destination.mkdir(parents=True, exist_ok=True)
            continue
        destination.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, destination)
        except OSError:
            shutil.copy2(path, destination)


def _fsync_tree(folder: Path) -> None:
    for path in sorted(folder.rglob("*"), reverse=True):
        if path.is_file():
            with open(path, "rb") as fh:
                os.fsync(fh.fileno())
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class IndexWriter:
    """Builds one new generation aside and publishes it atomically.

    >>> with IndexWriter.open(Path("data/index")) as writer:
    ...     write_everything(writer.folder)
    ...     writer.publish(manifest)
    """

    def __init__(self, index_dir: Path, lock_fd: int) -> None:
        self.index_dir = index_dir
        now = time.time_ns()
        self.generation = (time.strftime("%Y%m%dT%H%M%S", time.localtime(now // 10**9)) + f".{now % 10**9:09d}-"
                           + uuid.uuid4().hex[:8])
        self.generations = index_dir / GENERATIONS
        self.folder = self.generations / f".tmp-{self.generation}"
        self._lock_fd = lock_fd
        self.published = False

    @classmethod
    @contextmanager
    def open(cls, index_dir: Path):
        index_dir = Path(index_dir)
        index_dir.mkdir(parents=True, exist_ok=True)
        lock_fd = os.open(index_dir / ".lock", os.O_CREAT | os.O_RDWR, 0o644)
        try:
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise IndexLoadError(index_dir, "another ingest is writing this index right now") from None
            writer = cls(index_dir, lock_fd)
            writer._remove_leftovers()
            try:
                writer.folder.mkdir(parents=True)
                yield writer
            finally:
                if not writer.published:
                    shutil.rmtree(writer.folder, ignore_errors=True)
        finally:
            os.close(lock_fd)  # closing releases the flock

    def _remove_leftovers(self) -> None:
        """Half-built generations of interrupted runs (we hold the lock, so none is in progress)."""
        if self.generations.is_dir():
            for stale in self.generations.glob(".tmp-*"):
                shutil.rmtree(stale, ignore_errors=True)
        for link in self.index_dir.glob(f".{CURRENT}.*"):  # a swap killed before its rename
            link.unlink(missing_ok=True)

    def publish(self, manifest: dict) -> Path:
        """Write the manifest (with the SHA-256 of the generation's chunks, which loading checks), make the generation
        durable, then swap ``current`` to it."""
        manifest = {"format_version": FORMAT_VERSION, "generation": self.generation, **manifest}
        if (self.folder / CHUNKS).is_file():
            manifest[DIGEST_KEY] = file_sha256(self.folder / CHUNKS)
        (self.folder / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
        _fsync_tree(self.folder)
        final = self.generations / self.generation
        os.rename(self.folder, final)
        link_tmp = self.index_dir / f".{CURRENT}.{self.generation}"
        os.symlink(Path(GENERATIONS) / self.generation, link_tmp)
        os.replace(link_tmp, self.index_dir / CURRENT)  # the atomic step
        self.published = True
        self._prune(keep=final.name)
        return final

    def _prune(self, keep: str) -> None:
        older = sorted(p for p in self.generations.iterdir() if not p.name.startswith(".") and p.name != keep)
        for old in older[: max(0, len(older) - KEEP_PREVIOUS)]:
            shutil.rmtree(old, ignore_errors=True)
