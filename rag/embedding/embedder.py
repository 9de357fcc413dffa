"""Sentence embeddings with ONNX Runtime: the request path's ``Embedder``.

Nothing here imports torch. Three sessions serve the model: a single-thread session for queries while
other queries run (a second thread would fight them for the core), a session with the idle cores for a query that
finds the model to itself (the quiet case: a short query's run splits across cores), and a session with all cores for
bulk ingestion. The quiet session's threads do not spin between runs, so an idle one takes no core from the
request's other stages, and they are born named ``rh:embed``, so the probes charge their time to the stage. Waking
them costs time too, and on some machines (virtual CPUs above all) more than splitting a short query saves: by
default (``embedding.quiet_query_threads`` 0) the quiet session is timed against the single-thread one once per CPU,
each run after the idle gap a lone request leaves the model, and kept only where it wins clearly.

The query sessions may run the model at another precision than the passages' (``embedding.query_precision``): which of
fp32, int8 and int8-row (``rag.embedding.quantize``; int8-row only on CPUs where its integer product is exact) runs a
query fastest depends on the CPU (which integer kernels it has, and how fast), while each one's query vectors land
near the passages' (the quality each costs is measured side by side in docs/benchmarks.md), so ``fastest`` times them
once per CPU and keeps the fastest when it wins clearly over the passages' precision (the choice is kept beside the
conversions, keyed by the CPU and ONNX Runtime's version). Bulk ingestion always runs at the passages' precision,
which the index records. The graph also returns every token's last hidden state (``TOKEN_OUTPUT``):
``embed_query_tokens`` and ``embed_many(on_tokens=...)`` hand them to the late-interaction reranker (``rag.rerank``)
from the same run, so reranking never reads a text twice.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

from rag.cpu import cpu_identity, exact_u8s8
from rag.devicetime import DeviceTimer
from rag.embedding.model_store import SCHEMES, EncoderFiles, ensure_encoder
from rag.embedding.encoder_spec import SENTENCE_OUTPUT, TOKEN_OUTPUT
from rag.errors import ConfigurationError
from rag.settings import EmbeddingSettings
from rag.threadnames import get_name, set_name, stage_comm
from rag.types import EmbeddingResult

log = logging.getLogger(__name__)


def _session(path, threads: int, spinning: bool = True) -> ort.InferenceSession:
    options = ort.SessionOptions()
    if not spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(str(path), options, providers=_providers())


def _providers() -> list[str]:
    available = ort.get_available_providers()
    return [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available]


# The precisions ``query_precision`` fastest times: the passages' is always one of them.
QUERY_PRECISIONS = tuple(SCHEMES)
# Queries of typical lengths (a few to ~40 word pieces) that time the query encoders against each other.
TIMING_QUERIES = ("what causes tides?",
                  "Vitamin D deficiency raises the risk of multiple sclerosis.",
                  "Which enzyme links the citric acid cycle to the electron transport chain in mitochondria of "
                  "mammalian liver cells under fasting conditions?",
                  "Were the director of the 1994 film and the author of its source novel born in the same country?")
# Another precision (or the quiet session) serves queries only when it takes at most this share of the time of the
# passages' precision (or of the single-thread session): a narrower win is within the timing's noise.
CLEAR_WIN = 0.9
# How long the model idles between a lone request's runs (its other stages and the client's round trip): long enough
# for the quiet session's threads to sleep, so timing the sessions back to back would hide what waking them costs.
LONE_QUERY_GAP_S = 0.005


def time_query_runs(sessions: dict[str, ort.InferenceSession], feeds: list[dict], rounds: int = 7,
                    idle_s: float = 0.0) -> dict[str, float]:
    """Each session's fastest round over ``feeds`` (seconds, the runs alone), the rounds interleaved so that a burst
    of noise hits every session alike; after one untimed round each (first runs allocate). ``idle_s``: a pause before
    each run, as a request's other stages leave the model idle."""
    best = dict.fromkeys(sessions, float("inf"))
    for round_ in range(rounds + 1):
        for name, session in sessions.items():
            seconds = 0.0
            for feed in feeds:
                if idle_s:
                    time.sleep(idle_s)
                start = time.perf_counter()
                session.run([SENTENCE_OUTPUT], feed)
                seconds += time.perf_counter() - start
            if round_:
                best[name] = min(best[name], seconds)
    return best


def _kept_choice(path, key: dict):
    """The record kept at ``path`` when it was made for ``key``; None when none is (or it is unreadable)."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if record.get("key") == key else None


def _keep_choice(path, record: dict, what: str) -> None:
    try:
        scratch = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        scratch.write_text(json.dumps(record))
        os.replace(scratch, path)
    except OSError as exc:  # a read-only cache folder: time again at the next start
        log.warning("%s: could not keep the choice in %s: %s", what, path, exc)


def _choice_path(folder, prefix: str, key: dict):
    """Where the choice for ``key`` is kept: beside the conversions, named by the key's digest."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return folder / f"{prefix}-{digest}.json"


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
        self.query_files: EncoderFiles | None = None  # the query side's encoder (files: the passages')
        self._quiet_session: ort.InferenceSession | None = None  # None: every query on _query_session
        self._lone_threads = 1  # the quiet session's threads (query_threads without one)
        self._bulk_session: ort.InferenceSession | None = None
        self._runs_lock = threading.Lock()
        self._runs = 0  # query runs in flight
        self.quiet_runs = 0  # query runs that had the model, and the idle cores, to themselves
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
        self.query_files, self._query_session = self._query_encoder()
        if s.quiet_query_threads > s.query_threads:
            self._quiet_session = self._new_quiet_session(s.quiet_query_threads)
        elif s.quiet_query_threads == 0:
            self._quiet_session = self._quiet_session_if_faster()
        self._lone_threads = (s.quiet_query_threads or len(os.sched_getaffinity(0))) if self._quiet_session \
            else s.query_threads
        # CUDA events only when the session really runs on the GPU; otherwise two perf_counter calls.
        self.device_timer = DeviceTimer.for_device("CUDAExecutionProvider" in self._query_session.get_providers())
        for session in filter(None, (self._query_session, self._quiet_session)):
            session.run([SENTENCE_OUTPUT], self._feed([tokenizer.encode("warm up")]))

    def _query_encoder(self) -> tuple[EncoderFiles, ort.InferenceSession]:
        """The query side's encoder (``embedding.query_precision``) and its single-thread session."""
        s = self.settings
        wanted = s.precision if s.query_precision == "same" else s.query_precision
        exact = exact_u8s8(cpu_identity().get("isa", ()))
        if wanted == "int8-row" and not exact:
            raise ConfigurationError(
                "embedding.query_precision=int8-row: this CPU has no VNNI (or AMX), where ONNX Runtime's uint8 x int8 "
                "product saturates and would give wrong query vectors; use fastest, int8 or fp32")
        if wanted != "fastest":
            files = self.files if wanted == s.precision else ensure_encoder(s.model_dir, s.cache_dir, wanted)
            return files, _session(files.onnx_path, s.query_threads)
        candidates = {s.precision: self.files}
        for other in QUERY_PRECISIONS:
            if other == s.precision or (other == "int8-row" and not exact):
                continue
            try:
                candidates[other] = ensure_encoder(s.model_dir, s.cache_dir, other)
            except OSError as exc:  # a read-only cache without that conversion: the others are timed
                log.warning("query encoder: %s left out, it could not be converted into %s: %s", other,
                            s.cache_dir, exc)
        chosen, session = self._fastest(candidates)
        return candidates[chosen], session or _session(candidates[chosen].onnx_path, s.query_threads)

    def _fastest(self, candidates: dict[str, EncoderFiles]) -> tuple[str, ort.InferenceSession | None]:
        """The fastest precision on this CPU: the passages' unless another runs a query clearly faster (then the
        fastest of those); the choice kept for this CPU, or timed now and kept (then with the chosen session, already
        open)."""
        s = self.settings
        key = {"cpu": cpu_identity(), "onnxruntime": ort.__version__, "threads": s.query_threads,
               "candidates": {p: f.quantisation for p, f in candidates.items()}}
        kept = _choice_path(self.files.onnx_path.parent, "query-precision", key)
        record = _kept_choice(kept, key)
        if record is not None and record.get("chosen") in candidates:
            return record["chosen"], None
        sessions = {p: _session(f.onnx_path, s.query_threads) for p, f in candidates.items()}
        seconds = time_query_runs(sessions, self._timing_feeds())
        fastest = min(seconds, key=seconds.get)
        chosen = fastest if seconds[fastest] <= CLEAR_WIN * seconds[s.precision] else s.precision
        ms = {p: round(1e3 * t / len(TIMING_QUERIES), 3) for p, t in seconds.items()}
        log.info("query encoder: %s on this CPU (ms a query: %s)", chosen, ms)
        _keep_choice(kept, {"key": key, "chosen": chosen, "ms_per_query": ms}, "query encoder")
        return chosen, sessions[chosen]

    def _timing_feeds(self) -> list[dict]:
        return [self._feed([self._tokenizer.encode(t)]) for t in TIMING_QUERIES]

    def _new_quiet_session(self, threads: int) -> ort.InferenceSession:
        # A thread inherits its creator's kernel name: the session's pool threads are rh:embed for good.
        creator = get_name()
        set_name(stage_comm("embed"))
        try:
            return _session(self.query_files.onnx_path, threads, spinning=False)
        finally:
            set_name(creator)

    def _quiet_session_if_faster(self) -> ort.InferenceSession | None:
        """``quiet_query_threads`` 0: a session on the cores this process may use when it runs a lone query clearly
        faster than the single-thread session on this CPU, each run after a lone request's idle gap (the choice kept
        for the CPU, or timed now and kept); None otherwise."""
        s = self.settings
        cores = len(os.sched_getaffinity(0))
        if cores <= s.query_threads:
            return None
        key = {"cpu": cpu_identity(), "onnxruntime": ort.__version__, "threads": s.query_threads, "cores": cores,
               "encoder": self.query_files.quantisation, "idle_s": LONE_QUERY_GAP_S}
        kept = _choice_path(self.files.onnx_path.parent, "quiet-threads", key)
        record = _kept_choice(kept, key)
        if record is not None and record.get("chosen") in (cores, s.query_threads):
            return self._new_quiet_session(cores) if record["chosen"] == cores else None
        quiet = self._new_quiet_session(cores)
        seconds = time_query_runs({"single": self._query_session, "quiet": quiet}, self._timing_feeds(),
                                  idle_s=LONE_QUERY_GAP_S)
        chosen = cores if seconds["quiet"] <= CLEAR_WIN * seconds["single"] else s.query_threads
        ms = {str(n): round(1e3 * seconds[k] / len(TIMING_QUERIES), 3)
              for k, n in (("single", s.query_threads), ("quiet", cores))}
        log.info("query encoder: a lone query on %d thread(s) on this CPU (ms a query after an idle gap, by "
                 "threads: %s)", chosen, ms)
        _keep_choice(kept, {"key": key, "chosen": chosen, "ms_per_query": ms}, "query encoder")
        return quiet if chosen == cores else None

    @property
    def lone_query_threads(self) -> int:
        """The threads a query that finds the model to itself runs on."""
        self.warm_up()
        return self._lone_threads

    @property
    def query_precision(self) -> str:
        """The precision queries are embedded at (the passages' unless ``embedding.query_precision`` says otherwise)."""
        self.warm_up()
        return self.query_files.precision

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
        with self._query_run() as session:
            outputs, device = self.device_timer.call(session.run, [SENTENCE_OUTPUT], self._feed([encoding]))
        return EmbeddingResult(vector=outputs[0][0], tokens=len(encoding.ids), seconds=time.perf_counter() - start,
                               device=device)

    def embed_query_tokens(self, text: str) -> tuple[EmbeddingResult, np.ndarray]:
        """``embed_query`` plus the query's token states (tokens, hidden), [CLS] and [SEP] included, from the
        same single model run (the reranker's query side costs no second transformer run)."""
        self.warm_up()
        start = time.perf_counter()
        encoding = self._tokenizer.encode(text)
        with self._query_run() as session:
            outputs, device = self.device_timer.call(session.run, [SENTENCE_OUTPUT, TOKEN_OUTPUT],
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
        with self._query_run() as session:
            outputs, device = self.device_timer.call(session.run, names, self._feed(encodings))
        return outputs[0], (outputs[1] if tokens else None), device

    @contextmanager
    def _query_run(self) -> Iterator[ort.InferenceSession]:
        """The session for one query run: the quiet one when no other query run is in flight."""
        with self._runs_lock:
            self._runs += 1
            quiet = self._runs == 1 and self._quiet_session is not None
            self.quiet_runs += quiet
        try:
            yield self._quiet_session if quiet else self._query_session
        finally:
            with self._runs_lock:
                self._runs -= 1

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
