"""FAISS indexes: exact inner product, HNSW, IVF-PQ; moved to a GPU when faiss-gpu sees one.

Vectors are L2-normalised by the encoder, so inner product is cosine similarity.
"""

from __future__ import annotations

import math
from pathlib import Path

import faiss
import numpy as np

from rag.errors import ConfigurationError, IngestError
from rag.settings import IndexSettings

DENSE_FILE = "dense.faiss"


def auto_nlist(n: int) -> int:
    """About 4*sqrt(N) lists, but never fewer than 39 training points per list (FAISS's advice)."""
    return max(1, min(int(4 * math.sqrt(n)), n // 39))


def build_params(settings: IndexSettings, n: int, dim: int) -> dict:
    """The parameters an index of ``n`` vectors is built with, as recorded in the manifest."""
    if settings.kind == "flat":
        return {"kind": "flat", "metric": "inner_product"}
    if settings.kind == "hnsw":
        return {"kind": "hnsw", "metric": "inner_product", "M": settings.hnsw_m,
                "efConstruction": settings.hnsw_ef_construction}
    if dim % settings.pq_m:
        raise ConfigurationError(f"index.pq_m ({settings.pq_m}) must divide the embedding dimension ({dim})")
    nlist = settings.ivf_nlist or auto_nlist(n)
    if n < max(nlist, 2 ** settings.pq_nbits):
        raise IngestError(f"ivfpq needs at least max(nlist={nlist}, 2**pq_nbits={2 ** settings.pq_nbits}) "
                          f"vectors to train, the corpus has {n}; use index.kind=flat or hnsw, or lower "
                          f"index.pq_nbits / index.ivf_nlist")
    return {"kind": "ivfpq", "metric": "inner_product", "nlist": nlist, "m": settings.pq_m,
            "nbits": settings.pq_nbits}


def build_index(vectors: np.ndarray, params: dict) -> faiss.Index:
    """A FAISS index of ``vectors`` built with ``params`` (``build_params``)."""
    dim = vectors.shape[1]
    kind = params["kind"]
    if kind == "flat":
        index = faiss.IndexFlatIP(dim)
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, params["M"], faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = params["efConstruction"]
    elif kind == "ivfpq":
        quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFPQ(quantizer, dim, params["nlist"], params["m"], params["nbits"],
                                 faiss.METRIC_INNER_PRODUCT)
        index.train(vectors)
    else:  # pragma: no cover - validated by settings
        raise ConfigurationError(f"unknown index kind {kind!r}")
    index.add(vectors)
    return index


def stored_vectors(folder: Path) -> np.ndarray:
    """The vectors the generation ``folder``'s exact or HNSW index holds, in chunk-id order (an IVF-PQ index keeps
    only their codes)."""
    index = faiss.read_index(str(folder / DENSE_FILE))
    return index.reconstruct_n(0, index.ntotal)


def save_index(index: faiss.Index, folder: Path) -> None:
    """Write ``index`` into the generation ``folder``. Through a Python file, not ``faiss.write_index(path)``: faiss
    reports a failed close() (a full disk, a file-size limit) on stderr only, and the ingest would go on to publish a
    truncated index; Python raises ``OSError``."""
    data = faiss.serialize_index(index)
    with open(folder / DENSE_FILE, "wb") as fh:
        fh.write(memoryview(data))


def load_index(folder: Path, settings: IndexSettings) -> faiss.Index:
    """Read the index, apply search-time parameters, and move it to a GPU if asked and possible."""
    index = faiss.read_index(str(folder / DENSE_FILE))
    apply_search_params(index, settings)
    return to_device(index, settings.device)


def apply_search_params(index: faiss.Index, settings: IndexSettings) -> None:
    """Set the search-time parameters (efSearch, nprobe) from settings on a loaded index."""
    if isinstance(index, faiss.IndexHNSW):
        index.hnsw.efSearch = settings.hnsw_ef_search
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        ivf.nprobe = settings.ivf_nprobe


def gpu_count() -> int:
    """GPUs FAISS can use (0 with faiss-cpu)."""
    return faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0


def on_gpu(index: faiss.Index) -> bool:
    """Whether searches of ``index`` run on a GPU (faiss-gpu's ``GpuIndex*`` classes)."""
    return isinstance(index, getattr(faiss, "GpuIndex", ()))


def to_device(index: faiss.Index, device: str) -> faiss.Index:
    """``index`` on a GPU when ``device`` (``index.device``) allows it and FAISS sees one; HNSW stays on the CPU."""
    gpus = gpu_count()
    if device == "gpu" and gpus == 0:
        raise ConfigurationError("index.device=gpu but FAISS sees no GPU (install the 'gpu' extra, faiss-gpu, "
                                 "on a machine with CUDA)")
    if device == "cpu" or gpus == 0 or isinstance(index, faiss.IndexHNSW):
        # FAISS has no GPU HNSW; it stays on the CPU, which is where it is fastest for one query anyway.
        return index
    resources = faiss.StandardGpuResources()  # pragma: no cover - needs a GPU
    return faiss.index_cpu_to_gpu(resources, 0, index)  # pragma: no cover


def search_params(index: faiss.Index, effort: float) -> faiss.SearchParameters | None:
    """Per-call search parameters at ``effort`` (a share) of the index's configured efSearch (HNSW) or nprobe (IVF);
    None at full effort, and for an exact or GPU index (nothing to cut). Per call, not set on the index: requests at
    other levels search it at the same time."""
    if effort >= 1.0 or on_gpu(index):
        return None
    if isinstance(index, faiss.IndexHNSW):
        return faiss.SearchParametersHNSW(efSearch=max(1, round(index.hnsw.efSearch * effort)))
    if isinstance(index, faiss.IndexIVF):
        return faiss.SearchParametersIVF(nprobe=max(1, round(index.nprobe * effort)))
    return None


def search(index: faiss.Index, vector: np.ndarray, k: int,
           params: faiss.SearchParameters | None = None) -> tuple[np.ndarray, np.ndarray]:
    scores, ids = index.search(np.ascontiguousarray(vector.reshape(1, -1), dtype=np.float32), k, params=params)
    keep = ids[0] >= 0
    return ids[0][keep], scores[0][keep]
