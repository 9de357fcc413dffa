"""The whole SciFact corpus as the quality tests index it, and its passage vectors kept between runs.

Embedding SciFact's chunks is nearly all of its ingest's time; chunking, BM25 and FAISS are a small part. So the
vectors are kept between runs, each under its text, in a folder named by what they depend on: the
embedding code (``rag/embedding``), the model (its identity: weights' hash, precision, sequence length), the
embedding settings and every installed package with its version. The index itself is built in every run from those
vectors with this checkout's ingest code, so a change to the ingest, the chunker or the indexes is always what the
quality tests measure. What the ingest costs is measured elsewhere, by a real ingest (tests/rag/test_ingest_cost.py).
"""

from __future__ import annotations

import ast
import fcntl
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from rag.settings import RagheatSettings

REPO = Path(__file__).resolve().parents[1]


@dataclass
class FullIndex:
    path: Path
    manifest: dict
    settings: RagheatSettings  # what it was built with, and is served with


def measured_settings(settings: RagheatSettings) -> RagheatSettings:
    """The quality tests' ingest: what they measure (chunks, embeddings, FAISS, BM25) and nothing else: no token
    vectors for the reranker, no knowledge graph (their retrievers are dense, bm25 and hybrid, unreranked)."""
    return settings.model_copy(update={
        "rerank": settings.rerank.model_copy(update={"enabled": False, "store_tokens": False}),
        "graph": settings.graph.model_copy(update={"enabled": False})})


def cache_root(settings: RagheatSettings) -> Path | None:
    """Where the vectors are kept between runs: beside the ONNX conversions in the user's cache folder (which
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


def vectors_key(settings: RagheatSettings, embedder) -> str:
    digest = hashlib.sha256(code_digest(list((REPO / "rag" / "embedding").glob("*.py"))).encode())
    digest.update(json.dumps(embedder.identity(), sort_keys=True).encode())
    digest.update(settings.embedding.model_dump_json().encode())
    return digest.hexdigest()[:16]


class KeptVectors:
    """An embedder whose passage vectors come from ``folder`` when it holds them, and otherwise from the real
    embedder (and are added to it by ``save``); everything else is the real embedder's."""

    def __init__(self, embedder, folder: Path) -> None:
        self.embedder, self.folder = embedder, folder
        self.rows: dict[str, int] = {}
        self.vectors = np.zeros((0, embedder.dimension), dtype=np.float32)
        self.added = 0
        if (folder / "keys.json").is_file() and (folder / "vectors.npy").is_file():
            keys = json.loads((folder / "keys.json").read_text())
            vectors = np.load(folder / "vectors.npy")
            if len(keys) == len(vectors):  # otherwise a run died while writing: start over
                self.rows, self.vectors = {k: i for i, k in enumerate(keys)}, vectors

    def __getattr__(self, name: str):
        return getattr(self.embedder, name)

    def embed_many(self, texts: Sequence[str], progress: Callable[[int], None] | None = None,
                   on_tokens=None) -> np.ndarray:
        if on_tokens is not None:  # token states are not kept: the real embedder runs
            return self.embedder.embed_many(texts, progress=progress, on_tokens=on_tokens)
        keys = [hashlib.sha256(t.encode()).hexdigest()[:32] for t in texts]
        missing = {k: t for k, t in zip(keys, texts) if k not in self.rows}
        if missing:
            fresh = self.embedder.embed_many(list(missing.values()), progress=progress)
            self.rows.update({k: len(self.vectors) + i for i, k in enumerate(missing)})
            self.vectors = np.concatenate([self.vectors, fresh])
            self.added += len(missing)
        if progress is not None:
            progress(len(texts) - len(missing))
        return self.vectors[[self.rows[k] for k in keys]]

    def save(self) -> None:
        if not self.added:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        keys = sorted(self.rows, key=self.rows.get)
        # Written aside, then swapped in: a run that dies here leaves the old pair whole.
        np.save(self.folder / "vectors.tmp.npy", self.vectors)
        (self.folder / "keys.tmp.json").write_text(json.dumps(keys))
        os.replace(self.folder / "vectors.tmp.npy", self.folder / "vectors.npy")
        os.replace(self.folder / "keys.tmp.json", self.folder / "keys.json")


def build(corpus: Path, index: Path, settings: RagheatSettings, embedder) -> FullIndex:
    """Ingest ``corpus`` into ``index`` with the vectors kept between runs (one run at a time updates them)."""
    from rag.ingest.pipeline import ingest

    built_with = measured_settings(settings)
    root = cache_root(settings)
    if root is None:
        report = ingest(str(corpus), index, built_with, embedder=embedder)
        return FullIndex(index, report.manifest, built_with)
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        folder = root / f"vectors-{vectors_key(built_with, embedder)}"
        for stale in root.iterdir():  # vectors of another model or code, and indexes kept by earlier versions
            if stale.is_dir() and stale != folder:
                shutil.rmtree(stale, ignore_errors=True)
        kept = KeptVectors(embedder, folder)
        report = ingest(str(corpus), index, built_with, embedder=kept)
        kept.save()
    return FullIndex(index, report.manifest, built_with)
