"""Document token vectors in the index generation: computed once at ingest, projected by the head, stored as fp16,
int8 (one scale per token) or product-quantised codes, read memory-mapped when serving.

Files (beside the dense and BM25 indexes, so a generation swap swaps them too)::

    rerank_tokens.npy    (tokens, dim) float16, or int8 with rerank_scales.npy (tokens,) float32,
                         or (tokens, M) uint8 product codes with rerank_codebook.npy (M, 256, dim / M) float32
                         and rerank_rotation.npy (dim, dim) float32
    rerank_offsets.npy   (chunks + 1,) int64: chunk i owns rows offsets[i]:offsets[i+1]

Product quantisation (``pq64``, ``pq32``, ``pq16``: bytes per token, as PLAID and ColBERTv2 compress their token
vectors) cuts the vector into M pieces and keeps, for each, the byte naming its nearest of 256 centroids learnt from
the corpus's own tokens: int8's 132 bytes a token (codes and scale) become M. The vectors are first turned by a
learnt rotation (OPQ) that spreads their variance evenly over the pieces; a rotation keeps dot products, so MaxSim
turns the query the same way and scores in the rotated space. It is what lets a corpus of millions
of chunks keep its token vectors in memory; its nDCG@10 cost against int8 is measured in
``benchmarks/bench_token_codes.py`` (docs/benchmarks.md).

The manifest's ``rerank`` block records dtype, dim, token count, bytes and the head's projection hash; a reranker
whose head was trained with another projection is refused (``IndexLoadError``: re-ingest).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Literal, Sequence

import numpy as np

from rag.errors import IndexLoadError, IngestError
from rag.rerank.head import RerankHead

TOKENS, OFFSETS, SCALES = "rerank_tokens.npy", "rerank_offsets.npy", "rerank_scales.npy"
CODEBOOK, ROTATION = "rerank_codebook.npy", "rerank_rotation.npy"
SPILL_CODES, SPILL_SCALES = ".rerank_tokens.spill", ".rerank_scales.spill"  # written while the ingest embeds
TokenDtype = Literal["fp16", "int8", "pq64", "pq32", "pq16"]
TOKEN_DTYPES = ("fp16", "int8", "pq64", "pq32", "pq16")
CENTROIDS = 256  # one byte per piece
# Tokens sampled to learn the codebooks: faiss asks for at least 39 per centroid; more buys little but time.
PQ_TRAINING_TOKENS = 65_536


def product_bytes(dtype: str) -> int | None:
    """Bytes per token of a product-quantised dtype (``pq32`` -> 32), None for fp16 and int8."""
    return int(dtype[2:]) if dtype.startswith("pq") else None


def quantize_int8(vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 per row: (codes, scales) with vectors ≈ codes * scales[:, None]."""
    scales = np.abs(vectors).max(axis=1) / 127.0
    scales[scales == 0] = 1.0
    return np.clip(np.rint(vectors / scales[:, None]), -127, 127).astype(np.int8), scales.astype(np.float32)


class ProductCodes:
    """A product quantiser over ``dim``-dimensional token vectors turned by ``rotation`` (orthogonal, dim x dim): M
    pieces of ``dim / M`` values, each coded by the byte of its nearest centroid in that piece's codebook. faiss learns
    the rotation (OPQ) and the codebooks and codes; decoding gives vectors in the rotated space (``rotate`` a query
    into it to score against them)."""

    def __init__(self, codebook: np.ndarray, rotation: np.ndarray) -> None:
        import faiss

        pieces, centroids, width = codebook.shape
        if centroids != CENTROIDS:
            raise ValueError(f"a product codebook holds {CENTROIDS} centroids per piece, this one {centroids}")
        if rotation.shape != (pieces * width, pieces * width):
            raise ValueError(f"a rotation of {pieces * width} dimensions is {pieces * width} x {pieces * width}, "
                             f"this one {rotation.shape}")
        self.codebook = np.ascontiguousarray(codebook, np.float32)
        self.rotation = np.ascontiguousarray(rotation, np.float32)
        self._pq = faiss.ProductQuantizer(pieces * width, pieces, 8)
        faiss.copy_array_to_vector(self.codebook.ravel(), self._pq.centroids)
        # Decoding is one take of rows from the codebooks stacked as (pieces * 256, width): each code plus its
        # piece's offset names one row (faster than faiss' decode on the rerank stage's few thousand tokens).
        self._rows = self.codebook.reshape(pieces * CENTROIDS, width)
        self._piece_offsets = (np.arange(pieces, dtype=np.int32) * CENTROIDS)
        # The same rows as int8 with one scale for the whole codebook, as offset bytes (``Int8MaxSim``'s input):
        # decoded so, the rerank stage scores on the integer product as it does over int8 vectors.
        self.byte_scale = float(max(np.abs(self.codebook).max(), 1e-12) / 127.0)
        self._byte_rows = (np.rint(self._rows / self.byte_scale) + 128).astype(np.uint8)

    @property
    def pieces(self) -> int:
        return self.codebook.shape[0]

    @classmethod
    def train(cls, vectors: np.ndarray, pieces: int, seed: int = 0) -> "ProductCodes":
        """Learn the rotation and the codebooks from ``vectors`` (tokens, dim) float32."""
        import faiss

        dim = vectors.shape[1]
        if dim % pieces:
            raise ValueError(f"{pieces} pieces do not divide token vectors of {dim} dimensions")
        if len(vectors) < CENTROIDS:
            raise ValueError(f"product codes need at least {CENTROIDS} token vectors to learn from, got {len(vectors)}")
        vectors = np.ascontiguousarray(vectors, np.float32)
        opq = faiss.OPQMatrix(dim, pieces)
        opq.verbose = False
        opq.train(vectors)
        rotation = faiss.vector_to_array(opq.A).reshape(dim, dim)
        pq = faiss.ProductQuantizer(dim, pieces, 8)
        pq.cp.seed = seed
        pq.verbose = False
        pq.train(np.ascontiguousarray(vectors @ rotation.T))
        return cls(faiss.vector_to_array(pq.centroids).reshape(pieces, CENTROIDS, dim // pieces), rotation)

    def rotate(self, vectors: np.ndarray) -> np.ndarray:
        """``vectors`` (n, dim) turned into the codes' space."""
        return np.asarray(vectors, np.float32) @ self.rotation.T

    def encode(self, vectors: np.ndarray) -> np.ndarray:
        return self._pq.compute_codes(np.ascontiguousarray(self.rotate(vectors)))

    def encode_int8(self, codes: np.ndarray, scales: np.ndarray, block: int = 1 << 20) -> np.ndarray:
        """int8 token vectors (``codes * scales[:, None]``) coded, ``block`` rows at a time (bounded extra memory)."""
        out = np.empty((len(codes), self.pieces), np.uint8)
        for begin in range(0, len(codes), block):
            end = begin + block
            out[begin:end] = self.encode(np.asarray(codes[begin:end], np.float32) * scales[begin:end, None])
        return out

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """The coded vectors, in the rotated space."""
        return np.take(self._rows, self._row_numbers(codes), axis=0).reshape(len(codes), -1)

    def decode_bytes(self, codes: np.ndarray) -> np.ndarray:
        """The coded vectors in the rotated space as int8 offset bytes (uint8, int8 + 128) of scale ``byte_scale``."""
        return np.take(self._byte_rows, self._row_numbers(codes), axis=0).reshape(len(codes), -1)

    def _row_numbers(self, codes: np.ndarray) -> np.ndarray:
        return (codes.astype(np.int32) + self._piece_offsets).ravel()


def training_sample(tokens: int, seed: int = 0) -> np.ndarray:
    """The rows (in chunk order, sorted) whose vectors the codebooks are learnt from: ``PQ_TRAINING_TOKENS`` of them,
    drawn with ``seed``, so the same corpus learns the same codes however its chunks were batched."""
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(tokens, min(tokens, PQ_TRAINING_TOKENS), replace=False))


def learn_product(codes: np.ndarray, scales: np.ndarray, pieces: int, seed: int = 0) -> ProductCodes:
    """Product codes learnt from the ``training_sample`` of the int8 token vectors ``codes * scales[:, None]``
    (in chunk order)."""
    sample = training_sample(len(codes), seed)
    return ProductCodes.train(codes[sample].astype(np.float32) * scales[sample, None], pieces, seed)


def product_quantize(codes: np.ndarray, scales: np.ndarray, pieces: int, seed: int = 0,
                     block: int = 1 << 20) -> tuple[np.ndarray, ProductCodes]:
    """int8 token vectors as product codes (``learn_product``), every token coded ``block`` tokens at a time."""
    product = learn_product(codes, scales, pieces, seed)
    return product.encode_int8(codes, scales, block), product


class TokenVectorWriter:
    """Collects each chunk's projected token vectors during the ingest's embedding run (``add`` is the
    ``on_tokens`` callback of ``OnnxEmbedder.embed_many``), then writes them into the generation folder in chunk
    order. They arrive in batch order and are appended to spill files as they come (``spill_into``: the generation
    being built, removed with it if the build fails; a temporary folder otherwise), so the ingest's memory does not
    grow with the corpus; ``write`` reads them back a block at a time."""

    def __init__(self, head: RerankHead, dtype: TokenDtype) -> None:
        if dtype not in TOKEN_DTYPES:
            raise ValueError(f"rerank token dtype must be one of {TOKEN_DTYPES}, got {dtype!r}")
        pieces = product_bytes(dtype)
        if pieces is not None and head.dim % pieces:
            raise ValueError(f"rerank token dtype {dtype}: {pieces} pieces do not divide the head's {head.dim} "
                             f"dimensions")
        self.head, self.dtype, self.pieces = head, dtype, pieces
        self._spilled = np.float16 if dtype == "fp16" else np.int8  # product codes are learnt from int8 vectors
        self._folder: Path | None = None
        self._temporary: Path | None = None
        self._codes = self._scales = None  # the spill files, open for appending
        self._where: dict[int, tuple[int, int]] = {}  # chunk -> (its first row in the spill, its rows)
        self._rows = 0

    def spill_into(self, folder: Path) -> None:
        """Append the token vectors to files in ``folder`` (before the first ``add``)."""
        if self._codes is not None:
            raise RuntimeError("the token vectors already spill elsewhere")
        self._folder = Path(folder)
        try:
            self._codes = open(self._folder / SPILL_CODES, "wb")
            self._scales = open(self._folder / SPILL_SCALES, "wb")
        except OSError:
            self.discard()
            raise

    def add(self, index: int, states: np.ndarray) -> None:
        if self._codes is None:
            import tempfile

            self._temporary = Path(tempfile.mkdtemp(prefix="ragheat-tokens-"))
            self.spill_into(self._temporary)
        vectors = self.head.project(states)
        if self.dtype == "fp16":
            codes, scales = vectors.astype(np.float16), np.ones(len(vectors), np.float32)
        else:
            codes, scales = quantize_int8(vectors)
        self._codes.write(codes.tobytes())
        self._scales.write(scales.tobytes())
        self._where[index] = (self._rows, len(codes))
        self._rows += len(codes)

    def write(self, folder: Path, chunks: int, block_rows: int = 1 << 20) -> dict:
        """Write the files for chunks ``0..chunks-1``; returns the manifest's ``rerank`` block. The spill is discarded
        whatever happens."""
        folder = Path(folder)
        try:
            missing = [i for i in range(chunks) if i not in self._where]
            if missing:
                raise ValueError(f"rerank token vectors are missing for {len(missing)} chunks (first: {missing[0]})")
            for fh in (self._codes, self._scales):
                if fh is not None:
                    fh.close()
            spilled, spilled_scales = self._read_spill()
            lengths = np.array([self._where[i][1] for i in range(chunks)], np.int64)
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
            total = int(offsets[-1])
            files = [TOKENS, OFFSETS]
            if self.pieces is not None and total < CENTROIDS:
                raise IngestError(f"rerank.token_dtype {self.dtype} learns its codebooks from the corpus's own token "
                                  f"vectors and needs at least {CENTROIDS} of them; this corpus has {total}: store "
                                  f"them as int8 (the default) instead")
            if total == 0:  # nothing to map: empty files of the right shapes
                np.save(folder / TOKENS, np.zeros((0, self.head.dim), self._spilled))
                if self.dtype == "int8":
                    np.save(folder / SCALES, np.zeros(0, np.float32))
                    files.append(SCALES)
            elif self.pieces is not None:
                # The training sample's rows in chunk order, found in the spill (which is in batch order).
                sample = training_sample(total)
                chunk = np.searchsorted(offsets, sample, side="right") - 1
                first = np.array([self._where[i][0] for i in range(chunks)], np.int64)
                rows = first[chunk] + (sample - offsets[chunk])
                product = ProductCodes.train(spilled[rows].astype(np.float32) * spilled_scales[rows, None],
                                             self.pieces)
                np.save(folder / CODEBOOK, product.codebook)
                np.save(folder / ROTATION, product.rotation)
                files += [CODEBOOK, ROTATION]
                out = np.lib.format.open_memmap(folder / TOKENS, "w+", np.uint8, (total, self.pieces))
                for at, codes, scales in self._in_chunk_order(spilled, spilled_scales, chunks, block_rows):
                    out[at:at + len(codes)] = product.encode_int8(codes, scales)
            else:
                out = np.lib.format.open_memmap(folder / TOKENS, "w+", self._spilled, (total, self.head.dim))
                kept_scales = (np.lib.format.open_memmap(folder / SCALES, "w+", np.float32, (total,))
                               if self.dtype == "int8" else None)
                for at, codes, scales in self._in_chunk_order(spilled, spilled_scales, chunks, block_rows):
                    out[at:at + len(codes)] = codes
                    if kept_scales is not None:
                        kept_scales[at:at + len(codes)] = scales
                if kept_scales is not None:
                    kept_scales.flush()
                    files.append(SCALES)
            if total:
                out.flush()
                del out
            np.save(folder / OFFSETS, offsets)
        finally:
            self.discard()
        return {"dtype": self.dtype, "dim": self.head.dim, "tokens": total, "chunks": chunks,
                "bytes": sum((folder / f).stat().st_size for f in files), "files": files,
                "projection_sha256": self.head.projection_sha256}

    def _read_spill(self) -> tuple[np.ndarray, np.ndarray]:
        if self._rows == 0:
            return np.zeros((0, self.head.dim), self._spilled), np.zeros(0, np.float32)
        return (np.memmap(self._folder / SPILL_CODES, self._spilled, "r", shape=(self._rows, self.head.dim)),
                np.memmap(self._folder / SPILL_SCALES, np.float32, "r", shape=(self._rows,)))

    def _in_chunk_order(self, spilled: np.ndarray, scales: np.ndarray, chunks: int, block_rows: int):
        """(first row in chunk order, codes, scales) for consecutive runs of about ``block_rows`` rows."""
        at, parts, rows = 0, [], 0
        for i in range(chunks):
            start, n = self._where[i]
            parts.append((start, n))
            rows += n
            if rows >= block_rows or i == chunks - 1:
                codes = np.concatenate([spilled[s:s + n] for s, n in parts])
                yield at, codes, np.concatenate([scales[s:s + n] for s, n in parts])
                at, parts, rows = at + rows, [], 0

    def discard(self) -> None:
        """Close and remove the spill (what ``add`` collected and ``write`` has not written)."""
        for fh in (self._codes, self._scales):
            if fh is not None and not fh.closed:
                fh.close()
        if self._folder is not None:
            for name in (SPILL_CODES, SPILL_SCALES):
                (self._folder / name).unlink(missing_ok=True)
        if self._temporary is not None:
            shutil.rmtree(self._temporary, ignore_errors=True)
        self._codes = self._scales = self._folder = self._temporary = None
        self._where.clear()
        self._rows = 0


class TokenVectors:
    """A generation's stored token vectors, memory-mapped. ``gather(ids)`` returns the listed chunks' vectors as
    one float32 matrix and where each chunk starts in it (the input of ``rag.rerank.maxsim.maxsim``)."""

    def __init__(self, codes: np.ndarray, offsets: np.ndarray, scales: np.ndarray | None,
                 product: ProductCodes | None = None) -> None:
        self.codes, self.offsets, self.scales, self.product = codes, offsets, scales, product
        # A plain ndarray over the same mapping: indexing a numpy.memmap builds a memmap object per result (its
        # __array_finalize__ would run on every gather the rerank stage makes).
        self._array = np.asarray(codes)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def move_to_huge_pages(self) -> None:
        """The codes copied out of the file's mapping into anonymous memory advised for transparent huge pages
        (rag/placement.py): this process's own copy, no longer the page cache's shared pages."""
        from rag.placement import huge_page_copy

        self._array = huge_page_copy(self._array)
        self.codes = self._array

    def prefault(self, chunk_bytes: int = 16 << 20, available_bytes: int | None = None) -> int:
        """Read every page of the memory-mapped vectors once, so that no query pays a page fault for them: each
        query reads its candidates' chunks scattered over the whole file, and on a cold page cache the first reranks
        wait on the disk so long that the deadline skips reranking until its estimate ages out (rag/deadline.py).
        The pages are the page cache's, shared by every worker mapping the file. Vectors larger than half the memory
        available (``available_bytes``, default: the kernel's MemAvailable) are left to fault in as queries read
        them: they would not stay in. Returns the bytes touched (0 when left)."""
        flat = self._array.reshape(-1).view(np.uint8)
        available = _available_memory() if available_bytes is None else available_bytes
        if available is not None and flat.nbytes > available // 2:
            return 0
        for begin in range(0, len(flat), chunk_bytes):
            int(flat[begin:begin + chunk_bytes:4096].sum())  # one byte per 4 KiB page brings the page in
        return int(flat.nbytes)

    def _spans(self, ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Where each listed chunk's rows begin in the store, how many there are, and where each chunk starts once
        they are gathered in order."""
        ids = np.asarray(ids, np.int64)
        begin = self.offsets[ids]
        lengths = self.offsets[ids + 1] - begin
        starts = np.zeros(len(ids), np.int64)
        np.cumsum(lengths[:-1], out=starts[1:])
        return begin, lengths, starts

    def query_space(self, query: np.ndarray) -> np.ndarray:
        """The query's projected token vectors in the space ``gather`` returns: turned by the product codes'
        rotation, as they are; dot products are the same in both."""
        return query if self.product is None else self.product.rotate(query)

    def gather(self, ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        begin, lengths, starts = self._spans(ids)
        if self.product is not None:  # one gather of the rows' bytes, decoded in one call
            return self.product.decode(self._array[self._rows(begin, lengths, starts)]), starts
        # Contiguous slices copied straight into one float32 matrix: cheaper than a fancy index of every row and
        # a conversion of the copy.
        matrix = np.empty((int(lengths.sum()), self._array.shape[1]), np.float32)
        for at, b, n in zip(starts.tolist(), begin.tolist(), lengths.tolist()):
            matrix[at:at + n] = self._array[b:b + n]
            if self.scales is not None:
                matrix[at:at + n] *= self.scales[b:b + n, None]
        return matrix, starts

    @staticmethod
    def _rows(begin: np.ndarray, lengths: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """The store's row numbers of the spans, in order."""
        return np.arange(int(lengths.sum()), dtype=np.int64) + np.repeat(begin - starts, lengths)

    @property
    def integer(self) -> bool:
        """Whether ``gather_codes`` can serve these vectors (int8, or product codes decoded to int8)."""
        return self.scales is not None or self.product is not None

    def gather_codes(self, ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """int8 vectors and product codes: the listed chunks' vectors as int8 offset bytes (int8 + 128, uint8:
        ``Int8MaxSim``'s input; product codes decoded so, in the rotated space), their per-token scales and where each
        chunk starts; one gather of the rows, no float matrix."""
        if not self.integer:
            raise ValueError("gather_codes needs int8 token vectors or product codes; these are fp16 (use gather)")
        begin, lengths, starts = self._spans(ids)
        if self.product is not None:
            rows = self._rows(begin, lengths, starts)
            return (self.product.decode_bytes(self._array[rows]), np.full(len(rows), self.product.byte_scale, np.float32),
                    starts)
        if len(ids) == 0:
            return np.empty((0, self._array.shape[1]), np.uint8), self.scales[:0].copy(), starts
        # Each chunk's rows are one contiguous slice: the slices joined by one copy, cheaper than a fancy index of
        # every row, and in few numpy calls (each call gives the GIL back, and under load getting it back waits).
        stored = self._array.view(np.uint8)
        spans = list(zip(begin.tolist(), (begin + lengths).tolist()))
        codes = np.concatenate([stored[b:e] for b, e in spans])
        np.bitwise_xor(codes, 0x80, out=codes)  # flip the sign bit
        scales = np.concatenate([self.scales[b:e] for b, e in spans])
        return codes, scales, starts


def _available_memory() -> int | None:
    """MemAvailable from /proc/meminfo, in bytes; None where there is none (not Linux)."""
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def load_token_vectors(folder: Path, block: dict | None, head: RerankHead, chunks: int) -> TokenVectors:
    """The token vectors of the generation in ``folder``; ``IndexLoadError`` naming it when there are none, they
    are damaged, or they were projected by another head."""
    folder = Path(folder)
    if not block:
        raise IndexLoadError(folder, "it has no rerank token vectors (it was ingested without them, e.g. with "
                                     "rerank.store_tokens off); re-run `ragheat ingest` on its source to add them, or "
                                     "serve it without reranking (RAGHEAT_RERANK__ENABLED=false)")
    if block.get("projection_sha256") != head.projection_sha256:
        raise IndexLoadError(folder, "its rerank token vectors were projected by another rerank head "
                                     f"({str(block.get('projection_sha256'))[:12]}…, the configured head is "
                                     f"{head.projection_sha256[:12]}…); re-run `ragheat ingest` with this head")
    try:
        codes = np.load(folder / TOKENS, mmap_mode="r")
        offsets = np.load(folder / OFFSETS)
        scales = np.load(folder / SCALES) if block["dtype"] == "int8" else None
        product = (ProductCodes(np.load(folder / CODEBOOK), np.load(folder / ROTATION))
                   if product_bytes(block["dtype"]) else None)
    except (OSError, ValueError) as exc:
        raise IndexLoadError(folder, f"rerank token vectors cannot be read ({type(exc).__name__}: {exc})") from exc
    width = (product.pieces,) if product is not None else (head.dim,)
    if len(offsets) != chunks + 1 or offsets[-1] != len(codes) or codes.shape[1:] != width or (
            scales is not None and len(scales) != len(codes)) or (
            product is not None and product.codebook.shape[0] * product.codebook.shape[2] != head.dim):
        raise IndexLoadError(folder, f"rerank token vectors do not match the index: {len(offsets) - 1} chunks, "
                                     f"{len(codes)} tokens of shape {codes.shape[1:]}, expected {chunks} chunks of "
                                     f"{head.dim} dimensions ({block['dtype']})")
    return TokenVectors(codes, offsets, scales, product)
