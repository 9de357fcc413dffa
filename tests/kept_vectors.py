"""Encoder outputs kept between runs, for the test indexes whose building is nearly all encoder time.

A test index is built in every run by this checkout's ingest; only what the ONNX encoder returns for each passage
(its sentence vector and, for an ingest that stores the reranker's token vectors, its token states before the
reranker's head projects them) comes from a folder kept between runs, and otherwise from the real encoder, whose
outputs are then added to the folder. The folder is named by what those outputs depend on: the embedding code
(``rag/embedding``), the model (its identity: weights' hash, precision, sequence length), the embedding settings and
every installed package with its version. Chunking, the head's projection, FAISS, BM25 and the graph always run.

Tests that measure what an ingest costs, or that exercise the encoder itself, use the real embedder.
"""

from __future__ import annotations

import ast
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from rag.settings import EmbeddingSettings, RagheatSettings

REPO = Path(__file__).resolve().parents[1]
KEYS, VECTORS, TOKENS = "keys.json", "vectors.npy", "tokens.json"


def cache_root(settings: RagheatSettings) -> Path | None:
    """Where the outputs are kept between runs: beside the ONNX conversions in the user's cache folder (which
    outlives a fresh clone on the same machine, as CI's does), or RAGHEAT_TEST_INDEX_CACHE; ``off`` keeps none."""
    chosen = os.environ.get("RAGHEAT_TEST_INDEX_CACHE", "")
    if chosen == "off":
        return None
    return Path(chosen) if chosen else settings.embedding.cache_dir / "test-indexes"


def code_digest(files: Sequence[Path]) -> str:
    """The files' syntax trees without docstrings (a comment or a docstring changes nothing computed) and every
    installed package with its version (onnxruntime, tokenizers, numpy, ...)."""
    import sysconfig
    from importlib.metadata import distributions

    # The environment's own packages: sys.path (a script's folder, the tests' folder) must not change the key.
    installed = distributions(path=sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}))
    digest = hashlib.sha256()
    for path in sorted(files):
        tree = ast.parse(path.read_bytes())
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                    and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                    and isinstance(body[0].value.value, str)):
                node.body = body[1:] or [ast.Pass()]
        digest.update(f"{path.relative_to(REPO)}\0{ast.dump(tree)}\0".encode())
    digest.update("\n".join(sorted(f"{d.metadata['Name']}=={d.version}" for d in installed)).encode())
    return digest.hexdigest()


def kept_folder(root: Path, embedding: EmbeddingSettings, embedder) -> Path:
    """The folder of ``embedder``'s outputs under ``root``: named by the embedding code, the model and settings."""
    digest = hashlib.sha256(code_digest(list((REPO / "rag" / "embedding").glob("*.py"))).encode())
    digest.update(json.dumps(embedder.identity(), sort_keys=True).encode())
    digest.update(embedding.model_dump_json().encode())
    return root / f"vectors-{digest.hexdigest()[:16]}"


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` for the block: pytest-xdist's workers and concurrent runs share the folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def text_key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class KeptVectors:
    """An embedder whose passage vectors (and token states, when ``on_tokens`` asks for them) come from ``folder``
    when it holds them, and otherwise from the real embedder (and are added to it by ``save``); everything else is
    the real embedder's. Token states are kept in shards, one per ``save`` that added any, read memory-mapped."""

    def __init__(self, embedder, folder: Path) -> None:
        self.embedder, self.folder = embedder, folder
        self.rows, self.vectors = self._read_vectors()
        self.token_rows = self._read_tokens()
        # Mapped now: a run of another checkout (other embedding code) removes this folder as stale, and an open
        # mapping outlives that.
        self.shards: dict[str, np.ndarray] = {}
        for shard in sorted({where[0] for where in self.token_rows.values()}):
            try:
                self.shards[shard] = np.load(self.folder / shard, mmap_mode="r")
            except (OSError, ValueError):
                pass
        self.token_rows = {k: v for k, v in self.token_rows.items() if v[0] in self.shards}
        self.new_vectors: dict[str, np.ndarray] = {}
        self.new_states: dict[str, np.ndarray] = {}

    def _read_vectors(self) -> tuple[dict[str, int], np.ndarray]:
        empty = np.zeros((0, self.embedder.dimension), dtype=np.float32)
        try:
            keys = json.loads((self.folder / KEYS).read_text())
            vectors = np.load(self.folder / VECTORS)
        except (OSError, ValueError):
            return {}, empty
        if len(keys) != len(vectors):  # a run died while writing: start over
            return {}, empty
        return {k: i for i, k in enumerate(keys)}, vectors

    def _read_tokens(self) -> dict[str, list]:
        """text key -> [shard file, first row, rows]."""
        try:
            rows = json.loads((self.folder / TOKENS).read_text())
        except (OSError, ValueError):
            return {}
        return rows

    def __getattr__(self, name: str):
        return getattr(self.embedder, name)

    def _vector(self, key: str) -> np.ndarray | None:
        if key in self.new_vectors:
            return self.new_vectors[key]
        row = self.rows.get(key)
        return None if row is None else self.vectors[row]

    def _states(self, key: str) -> np.ndarray | None:
        if key in self.new_states:
            return self.new_states[key]
        where = self.token_rows.get(key)
        if where is None:
            return None
        shard, first, rows = where
        return np.asarray(self.shards[shard][first:first + rows])

    def embed_many(self, texts: Sequence[str], progress: Callable[[int], None] | None = None,
                   on_tokens: Callable[[int, np.ndarray], None] | None = None) -> np.ndarray:
        keys = [text_key(t) for t in texts]
        missing = {k: t for k, t in zip(keys, texts)
                   if self._vector(k) is None or (on_tokens is not None and self._states(k) is None)}
        if missing:
            order = list(missing)
            states: dict[str, np.ndarray] = {}

            def capture(i: int, s: np.ndarray) -> None:
                states[order[i]] = np.array(s, dtype=np.float32)  # a copy: the run's output is one batch array
            fresh = self.embedder.embed_many(list(missing.values()), progress=progress,
                                             on_tokens=None if on_tokens is None else capture)
            self.new_vectors.update((k, v) for k, v in zip(order, fresh) if self._vector(k) is None)
            self.new_states.update(states)
        if progress is not None:
            progress(len(texts) - len(missing))
        if on_tokens is not None:
            for i, key in enumerate(keys):
                on_tokens(i, self._states(key))
        if not keys:
            return np.zeros((0, self.embedder.dimension), dtype=np.float32)
        return np.stack([self._vector(k) for k in keys])

    def save(self) -> None:
        """Add this run's new outputs to the folder, merged with what concurrent runs added meanwhile."""
        if not self.new_vectors and not self.new_states:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        with locked(self.folder / "save.lock"):
            rows, vectors = self._read_vectors()
            added = [k for k in self.new_vectors if k not in rows]
            if added:
                keys = sorted(rows, key=rows.get) + added
                vectors = np.concatenate([vectors, np.stack([self.new_vectors[k] for k in added])])
                # Written aside, then swapped in: a run that dies here leaves the old pair whole.
                np.save(self.folder / "vectors.tmp.npy", vectors)
                (self.folder / "keys.tmp.json").write_text(json.dumps(keys))
                os.replace(self.folder / "vectors.tmp.npy", self.folder / VECTORS)
                os.replace(self.folder / "keys.tmp.json", self.folder / KEYS)
            token_rows = self._read_tokens()
            added = [k for k in self.new_states if k not in token_rows]
            if added:
                shard = f"states-{uuid.uuid4().hex[:12]}.npy"
                np.save(self.folder / shard, np.concatenate([self.new_states[k] for k in added]))
                first = 0
                for key in added:
                    token_rows[key] = [shard, first, len(self.new_states[key])]
                    first += len(self.new_states[key])
                (self.folder / "tokens.tmp.json").write_text(json.dumps(token_rows))
                os.replace(self.folder / "tokens.tmp.json", self.folder / TOKENS)


def kept_ingest(name: str, source: Path, index: Path, settings: RagheatSettings, embedder):
    """``ingest`` of ``source`` into ``index`` by this checkout's code, with the encoder's outputs kept between runs.
    One ingest called ``name`` runs at a time (pytest-xdist's workers each ask for the session's indexes: the
    second builds its own from what the first kept); returns the ingest's report."""
    from rag.ingest.pipeline import ingest

    root = cache_root(settings)
    if root is None:
        return ingest(str(source), index, settings, embedder=embedder)
    folder = kept_folder(root, settings.embedding, embedder)
    with locked(root / f"{name}.lock"):
        with locked(root / "build.lock"):
            for stale in root.iterdir():  # outputs of another model or code, and indexes kept by earlier versions
                if stale.is_dir() and stale != folder:
                    shutil.rmtree(stale, ignore_errors=True)
        kept = KeptVectors(embedder, folder)
        report = ingest(str(source), index, settings, embedder=kept)
        kept.save()
    return report


@contextlib.contextmanager
def kept_by_ingest(monkeypatch, settings: RagheatSettings) -> Iterator[None]:
    """For the block, the embedder that ``ingest`` builds when it is given none (a command's, run in this process)
    keeps the encoder's outputs between runs: for a test whose subject is a command around the ingest, not the
    encoder."""
    import rag.ingest.pipeline as pipeline

    root = cache_root(settings)
    if root is None:
        yield
        return
    real = pipeline.OnnxEmbedder
    made: list[KeptVectors] = []

    def kept(embedding: EmbeddingSettings) -> KeptVectors:
        embedder = real(embedding)
        made.append(KeptVectors(embedder, kept_folder(root, embedding, embedder)))
        return made[-1]

    monkeypatch.setattr(pipeline, "OnnxEmbedder", kept)
    try:
        yield
    finally:
        monkeypatch.setattr(pipeline, "OnnxEmbedder", real)
        for embedder in made:
            embedder.save()
