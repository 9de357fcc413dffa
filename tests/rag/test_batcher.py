"""Micro-batched query embedding (rag/embedding/batcher.py): the same vectors as unbatched runs, a lone request never
delayed, waits reported as the request's queue stage, failures reaching every caller of a run."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from rag.embedding.batcher import MicroBatchEmbedder, _groups
from rag.embedding.embedder import OnnxEmbedder
from rag.settings import EmbeddingSettings, RagheatSettings
from rag.types import EmbeddingResult

TEXTS = ["what causes tides?", "0-dimensional biomaterials show inductive properties.",
         "ALDH1 expression is associated with poorer prognosis for breast cancer primary tumors.",
         "β-sheet opening", "A deficiency of vitamin B12 increases blood levels of homocysteine.",
         "Exposure to fine particulate air pollution is associated with an increased risk of cardiovascular events "
         "and death among older adults living in urban areas of the United States.",
         "gene", "Microglia are an innate immune cell type of the central nervous system."]


class _Gate:
    """Wraps an embedder's ``run_query_batch`` so that the first run waits until ``expected`` queries are queued
    behind it: a deterministic micro-batch without relying on timing."""

    def __init__(self, inner, batcher_ref: list, expected: int) -> None:
        self.inner, self.batcher_ref, self.expected = inner, batcher_ref, expected
        self.batches: list[int] = []
        self.first = True

    def run_query_batch(self, encodings, tokens=False):
        if self.first:
            self.first = False
            deadline = time.monotonic() + 30
            while len(self.batcher_ref[0]._pending) < self.expected:
                assert time.monotonic() < deadline, "the queries never queued behind the first run"
                time.sleep(0.001)
        self.batches.append(len(encodings))
        return self.inner.run_query_batch(encodings, tokens)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _batched(inner, texts, tokens: bool, max_batch: int = 16):
    """Embed ``texts`` from one thread each, the first holding the model until the rest queued; (results, gate)."""
    ref: list = []
    gate = _Gate(inner, ref, expected=len(texts) - 1)
    batcher = MicroBatchEmbedder(gate, max_batch=max_batch)
    ref.append(batcher)
    out: dict[int, object] = {}
    first_started = threading.Event()

    def work(i: int) -> None:
        if i:
            first_started.wait(10)
        else:
            first_started.set()
        out[i] = batcher.embed_query_tokens(texts[i]) if tokens else batcher.embed_query(texts[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(texts))]
    threads[0].start()
    first_started.wait(10)
    time.sleep(0.01)  # let the first call become the runner before the others queue
    for t in threads[1:]:
        t.start()
    for t in threads:
        t.join(60)
    assert len(out) == len(texts), "a batched call never returned"
    return [out[i] for i in range(len(texts))], gate, batcher


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.fixture(scope="module", params=["int8", "fp32"])
def real_embedder(request):
    embedder = OnnxEmbedder(EmbeddingSettings(precision=request.param))
    embedder.warm_up()
    return embedder


def test_batched_vectors_equal_unbatched(real_embedder):
    alone = [real_embedder.embed_query(t).vector for t in TEXTS]
    results, gate, batcher = _batched(real_embedder, TEXTS, tokens=False)
    assert gate.batches[0] == 1 and len(gate.batches) < len(TEXTS), f"no batch was formed: runs {gate.batches}"
    assert max(gate.batches) > 1
    assert batcher.served == len(TEXTS) and batcher.runs == len(gate.batches)
    for text, single, batched in zip(TEXTS, alone, results):
        assert _cos(single, batched.vector) >= 0.999, text
        assert batched.tokens == len(real_embedder.tokenizer.encode(text).ids)


def test_batched_token_states_equal_unbatched(real_embedder):
    alone = [real_embedder.embed_query_tokens(t) for t in TEXTS]
    results, gate, _ = _batched(real_embedder, TEXTS, tokens=True)
    assert max(gate.batches) > 1, f"no batch was formed: runs {gate.batches}"
    for text, (single, single_states), (batched, states) in zip(TEXTS, alone, results):
        assert states.shape == single_states.shape, text  # own tokens only: the padding is cut off
        assert _cos(single.vector, batched.vector) >= 0.999, text
        assert min(_cos(a, b) for a, b in zip(single_states, states)) >= 0.999, text


def test_queued_requests_report_their_wait_apart_from_the_run(real_embedder):
    results, gate, _ = _batched(real_embedder, TEXTS[:4], tokens=False)
    first, rest = results[0], results[1:]
    assert all(r.queued > 0 for r in rest)  # queued behind the first run while it held the model
    assert all(r.seconds > 0 and r.device is not None for r in results)
    assert first.queued < min(r.queued for r in rest)


def test_a_lone_request_runs_at_once_even_with_a_long_wait(real_embedder):
    batcher = MicroBatchEmbedder(real_embedder, max_batch=8, max_wait_s=2.0)
    for text in TEXTS[:3]:
        start = time.perf_counter()
        result = batcher.embed_query(text)
        elapsed = time.perf_counter() - start
        assert elapsed < 1.0, f"a lone request waited {elapsed:.3f} s for a batch"
        assert result.queued < elapsed and result.queued < 0.5
    assert batcher.runs == 3 and batcher.served == 3


def test_a_promoted_runner_waits_for_the_window_then_runs_what_came(real_embedder):
    """Under load (a query queued behind a run) the next runner waits up to max_wait for more: a query that arrives
    only after that runner was promoted still shares its run. A full batch ends the wait, so the window can be far
    longer than any busy machine's delay without making the test wait for it."""
    wait = 10.0
    ref: list = []
    gate = _Gate(real_embedder, ref, expected=1)
    batcher = MicroBatchEmbedder(gate, max_batch=2, max_wait_s=wait)
    ref.append(batcher)
    results: dict = {}
    first = threading.Thread(target=lambda: results.setdefault("first", batcher.embed_query(TEXTS[0])))
    second = threading.Thread(target=lambda: results.setdefault("second", batcher.embed_query(TEXTS[1])))
    first.start()
    time.sleep(0.02)
    second.start()
    # The second queues behind the first run, then is promoted when it ends: the queue is empty again.
    deadline = time.monotonic() + 30
    while not (gate.batches == [1] and not batcher._pending and "first" in results) and time.monotonic() < deadline:
        time.sleep(0.001)
    time.sleep(0.05)  # the promoted runner is inside its window now
    started = time.perf_counter()
    late = batcher.embed_query(TEXTS[1])  # the same length as the second's: one run
    for t in (first, second):
        t.join(30)
    assert gate.batches == [1, 2], f"the late query should share the promoted runner's run: {gate.batches}"
    assert late.queued < wait / 2 and time.perf_counter() - started < wait / 2  # the full batch ended the wait


class _Failing:
    def __init__(self, inner) -> None:
        self.inner, self.fail = inner, True

    def run_query_batch(self, encodings, tokens=False):
        if self.fail:
            raise RuntimeError("model run failed")
        return self.inner.run_query_batch(encodings, tokens)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_failed_run_reaches_its_caller_and_the_batcher_recovers(real_embedder):
    failing = _Failing(real_embedder)
    batcher = MicroBatchEmbedder(failing, max_batch=4)
    with pytest.raises(RuntimeError, match="model run failed"):
        batcher.embed_query(TEXTS[0])
    failing.fail = False
    assert _cos(batcher.embed_query(TEXTS[0]).vector, real_embedder.embed_query(TEXTS[0]).vector) >= 0.999


def test_groups_bound_the_padding():
    class _Enc:
        def __init__(self, n: int) -> None:
            self.ids = [0] * n

    class _Req:
        def __init__(self, n: int) -> None:
            self.encoding = _Enc(n)

    lengths = [10, 46, 12, 11, 30, 31, 9]
    groups = _groups([_Req(n) for n in lengths])
    assert sorted(len(r.encoding.ids) for g in groups for r in g) == sorted(lengths)
    for group in groups:
        widths = [len(r.encoding.ids) for r in group]
        assert max(widths) * len(widths) <= 1.25 * sum(widths) or len(widths) == 1
    assert len(groups) < len(lengths)  # similar lengths still share a run


def test_with_two_runs_a_second_query_does_not_wait_for_the_first(real_embedder):
    """max_runs=2: the second query runs beside the first (which is held until the second's run has started)."""
    second_started = threading.Event()

    class _Held:
        def __init__(self) -> None:
            self.calls = 0

        def run_query_batch(self, encodings, tokens=False):
            self.calls += 1
            if self.calls == 1:
                assert second_started.wait(10), "the second query waited for the first run: runs were serialised"
            else:
                second_started.set()
            return real_embedder.run_query_batch(encodings, tokens)

        def __getattr__(self, name):
            return getattr(real_embedder, name)

    batcher = MicroBatchEmbedder(_Held(), max_batch=8, max_runs=2)
    out: dict = {}
    first = threading.Thread(target=lambda: out.setdefault(0, batcher.embed_query(TEXTS[0])))
    first.start()
    time.sleep(0.02)
    out[1] = batcher.embed_query(TEXTS[1])
    first.join(30)
    assert set(out) == {0, 1} and batcher.runs == 2
    assert out[1].queued < 0.5


def test_invalid_settings_are_refused(real_embedder):
    with pytest.raises(ValueError, match="max_batch"):
        MicroBatchEmbedder(real_embedder, max_batch=0)
    with pytest.raises(ValueError, match="max_wait_s"):
        MicroBatchEmbedder(real_embedder, max_wait_s=-1)
    with pytest.raises(ValueError, match="max_runs"):
        MicroBatchEmbedder(real_embedder, max_runs=0)
    with pytest.raises(ValueError, match="embedding.query_batch_max is 1"):
        RagheatSettings(embedding={"query_batch_wait_ms": 2.0})
    assert RagheatSettings(embedding={"query_batch_max": 8, "query_batch_wait_ms": 2.0}).embedding.query_batch_max == 8


class _Queued:
    """An embedder whose every query waited ``queued`` seconds for its run."""

    def __init__(self, queued: float) -> None:
        self.queued = queued

    def embed_query(self, text):
        time.sleep(self.queued)  # the wait, inside the call as in the batcher
        return EmbeddingResult(np.zeros(4, np.float32), 3, 0.001, None, queued=self.queued)


def test_pipeline_reports_the_batch_wait_as_queue_not_embed():
    from rag.pipeline import RagPipeline

    from rag.query_context import QueryContext

    pipeline = RagPipeline(RagheatSettings(), Path("unused"))
    pipeline.embedder = _Queued(0.05)
    context = QueryContext("q", 3, ("dense",))
    pipeline._embedding(context)
    stages = context.stages
    names = [s.name for s in stages]
    assert names == ["queue", "embed"], names
    queue, embed = stages
    assert queue.seconds == pytest.approx(0.05)
    assert embed.seconds < 0.05  # the wait is not counted twice


def test_the_settings_choose_the_request_paths_embedder(no_graph_settings, subset_index):
    """query_batch_max > 1 puts the batcher on the request path, with the settings' batch, wait and runs; 1 (the
    default) leaves the plain embedder; a query answers the same either way."""
    from rag import protocols
    from rag.pipeline import RagPipeline

    settings = no_graph_settings
    assert RagheatSettings().embedding.query_batch_max == 1
    embedding = settings.embedding.model_copy(update={"query_batch_max": 4, "query_batch_wait_ms": 2.0,
                                                      "query_batch_runs": 3})
    batched = RagPipeline(settings.model_copy(update={"embedding": embedding}), subset_index)
    plain = RagPipeline(settings, subset_index)
    batched.warm_up()
    plain.warm_up()
    try:
        assert isinstance(batched.embedder, MicroBatchEmbedder) and isinstance(plain.embedder, OnnxEmbedder)
        assert isinstance(batched.embedder, protocols.Embedder)
        assert (batched.embedder.max_batch, batched.embedder.max_wait_s, batched.embedder.max_runs) == (4, 0.002, 3)
        text = "ALDH1 expression is associated with poorer prognosis for breast cancer primary tumors."
        one, two = batched.query(text, 5), plain.query(text, 5)
        assert [s.chunk.chunk_id for s in one.sources] == [s.chunk.chunk_id for s in two.sources]
        assert [s.name for s in one.stages if s.name == "embed"] == ["embed"]
    finally:
        batched.close()
        plain.close()
