"""Sentence embeddings with ONNX Runtime: the request path's ``Embedder``.

Nothing here imports torch. Two sessions share one graph: a single-thread session for queries
(one short query gains nothing from a second thread and would fight the other requests for the
core) and a session with all cores for bulk ingestion. The graph also returns every token's last hidden state
(``TOKEN_OUTPUT``): ``embed_query_tokens`` and ``embed_many(on_tokens=...)`` hand them to the late-interaction
reranker (``rag.rerank``) from the same run, so reranking never reads a text twice.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable, Sequence

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

from rag.devicetime import DeviceTimer
from rag.embedding.model_store import EncoderFiles, ensure_encoder
from rag.embedding.onnx_builder import SENTENCE_OUTPUT, TOKEN_OUTPUT
from rag.settings import EmbeddingSettings
from rag.types import EmbeddingResult


def _session(path, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(str(path), options, providers=_providers())


def _providers() -> list[str]:
    available = ort.get_available_providers()
    return [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available]


class OnnxEmbedder:
    """all-MiniLM-L6-v2 (or another BERT sentence encoder) on ONNX Runtime.

    >>> embedder = OnnxEmbedder(EmbeddingSettings()); embedder.warm_up()
    >>> embedder.embed_query("what causes tides?").vector.shape
    (384,)
    """

    def __init__(self, settings: EmbeddingSettings) -> None:
        self.settings = settings
        self.files: EncoderFiles | None = None
        self._query_session: ort.InferenceSession | None = None
        self._bulk_session: ort.InferenceSession | None = None
        self._tokenizer: Tokenizer | None = None
        self.device_timer: DeviceTimer | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def warm_up(self) -> None:
        """Convert (once, cached) and load the model; safe to call twice."""
        if self._query_session is not None:
            return
        s = self.settings
        self.files = ensure_encoder(s.model_dir, s.cache_dir, s.precision)
        tokenizer = Tokenizer.from_file(str(self.files.tokenizer_path))
        tokenizer.enable_truncation(max_length=s.max_seq_length)
        tokenizer.no_padding()
        self._tokenizer = tokenizer
        self._query_session = _session(self.files.onnx_path, s.query_threads)
        # CUDA events only when the session really runs on the GPU; otherwise two perf_counter calls.
        self.device_timer = DeviceTimer.for_device("CUDAExecutionProvider" in self._query_session.get_providers())
        self._query_session.run([SENTENCE_OUTPUT], self._feed([tokenizer.encode("warm up")]))

    @property
    def dimension(self) -> int:
        self.warm_up()
        return self._query_session.get_outputs()[0].shape[1]

    @property
    def tokenizer(self) -> Tokenizer:
        self.warm_up()
        return self._tokenizer

    def identity(self) -> dict:
        """What a manifest records so that an index is never queried with another model."""
        self.warm_up()
        return {"name": self.files.model_name, "precision": self.files.precision,
                "quantisation": self.files.quantisation, "weights_sha256": self.files.weights_sha256,
                "max_seq_length": self.settings.max_seq_length, "dimension": self.dimension}

    # -- embedding --------------------------------------------------------------------------
    @staticmethod
    def _feed(encodings) -> dict[str, np.ndarray]:
        width = max(len(e.ids) for e in encodings)
        ids = np.zeros((len(encodings), width), dtype=np.int64)
        mask = np.zeros((len(encodings), width), dtype=np.int64)
        for row, enc in enumerate(encodings):
            ids[row, : len(enc.ids)] = enc.ids
            mask[row, : len(enc.ids)] = 1
        return {"input_ids": ids, "attention_mask": mask}

    def embed_query(self, text: str) -> EmbeddingResult:
        """One query on the single-thread session; ``device`` times the model run alone."""
        self.warm_up()
        start = time.perf_counter()
        encoding = self._tokenizer.encode(text)
        outputs, device = self.device_timer.call(self._query_session.run, [SENTENCE_OUTPUT], self._feed([encoding]))
        return EmbeddingResult(vector=outputs[0][0], tokens=len(encoding.ids), seconds=time.perf_counter() - start,
                               device=device)

    def embed_query_tokens(self, text: str) -> tuple[EmbeddingResult, np.ndarray]:
        """``embed_query`` plus the query's token states (tokens, hidden), [CLS] and [SEP] included, from the
        same single model run (the reranker's query side costs no second transformer run)."""
        self.warm_up()
        start = time.perf_counter()
        encoding = self._tokenizer.encode(text)
        outputs, device = self.device_timer.call(self._query_session.run, [SENTENCE_OUTPUT, TOKEN_OUTPUT],
                                                 self._feed([encoding]))
        result = EmbeddingResult(vector=outputs[0][0], tokens=len(encoding.ids),
                                 seconds=time.perf_counter() - start, device=device)
        return result, outputs[1][0]

    def run_query_batch(self, encodings: Sequence, tokens: bool = False):
        """One run of the query session over ``encodings`` (padded to the longest): (sentence vectors (n, d), token
        states (n, width, hidden) or None, the run's ``DeviceTiming``). ``rag.embedding.batcher`` serves several
        requests' queries with one such run; a row's values do not depend on its neighbours (int8: quantize.py)."""
        self.warm_up()
        names = [SENTENCE_OUTPUT, TOKEN_OUTPUT] if tokens else [SENTENCE_OUTPUT]
        outputs, device = self.device_timer.call(self._query_session.run, names, self._feed(encodings))
        return outputs[0], (outputs[1] if tokens else None), device

    def embed_many(self, texts: Sequence[str], progress=None,
                   on_tokens: Callable[[int, np.ndarray], None] | None = None) -> np.ndarray:
        """Embed many texts on all cores; batches are formed from texts of similar length. ``on_tokens(i, states)``
        receives text ``i``'s token states (its own tokens, padding cut off) from the same run, in batch order."""
        self.warm_up()
        if self._bulk_session is None:
            self._bulk_session = _session(self.files.onnx_path, self.settings.bulk_threads)
        out = np.zeros((len(texts), self.dimension), dtype=np.float32)
        if not texts:
            return out
        encodings = self._tokenizer.encode_batch(list(texts))
        order = np.argsort([len(e.ids) for e in encodings], kind="stable")
        names = [SENTENCE_OUTPUT] if on_tokens is None else [SENTENCE_OUTPUT, TOKEN_OUTPUT]
        for batch in _token_budget_batches(order, encodings, self.settings.batch_tokens):
            outputs = self._bulk_session.run(names, self._feed([encodings[i] for i in batch]))
            out[batch] = outputs[0]
            if on_tokens is not None:
                for row, index in enumerate(batch):
                    on_tokens(index, outputs[1][row, : len(encodings[index].ids)])
            if progress is not None:
                progress(len(batch))
        return out

    def count_tokens(self, texts: Iterable[str]) -> list[int]:
        return [len(e.ids) for e in self.tokenizer.encode_batch(list(texts))]


def _token_budget_batches(order: np.ndarray, encodings, budget: int):
    """Group length-sorted texts so that each padded batch holds about ``budget`` tokens."""
    batch: list[int] = []
    for index in order:
        width = len(encodings[index].ids)
        if batch and width * (len(batch) + 1) > budget:
            yield batch
            batch = []
        batch.append(int(index))
    if batch:
        yield batch
