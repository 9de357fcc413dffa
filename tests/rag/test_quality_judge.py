"""The sampled judge's bookkeeping (rag/quality/judge.py) with a stand-in for the model's ``ask`` (the real model's
path: tests/vllm/test_sampled_judge.py): the sampling rate, the bounded queue that drops instead of waiting, each
outcome heard, a failing model counted and survived, and a close that does not wait for the queue."""

from __future__ import annotations

import threading
import time

import pytest

from rag.generation.llm import GeneratorUnavailable
from rag.quality.judge import THREAD_NAME, SampledJudge
from rag.stages import JUDGE_OUTCOMES
from rag.types import Chunk

PASSAGE = Chunk(0, "d", "Vitamin D", "Vitamin D deficiency is linked to bone loss.", 0, 44)


class Asker:
    """Replies in turn from ``replies`` (an exception instance is raised); ``gate`` holds every ask until set."""

    def __init__(self, *replies, gate: threading.Event | None = None) -> None:
        self.replies, self.gate, self.asked, self.threads = list(replies), gate, [], set()

    def ask(self, messages):
        self.threads.add(threading.current_thread().name)
        if self.gate is not None:
            self.gate.wait(10)
        self.asked.append(messages)
        reply = self.replies[(len(self.asked) - 1) % len(self.replies)]
        if isinstance(reply, Exception):
            raise reply
        return reply, None


def settle(judge: SampledJudge, total: int) -> dict[str, int]:
    deadline = time.monotonic() + 10
    while sum(judge.counts.values()) < total and time.monotonic() < deadline:
        time.sleep(0.01)
    return dict(judge.counts)


def test_every_outcome_is_heard_off_the_callers_thread():
    asker = Asker("Yes", "No", "Maybe later", GeneratorUnavailable("down", "unavailable"), ValueError("bug"))
    judge = SampledJudge(asker, 1.0, 8)
    heard = []
    judge.listeners.append(heard.append)
    for _ in range(5):
        judge.offer("does vitamin D matter for bones?", PASSAGE)
    counts = settle(judge, 5)
    judge.close()
    assert counts == {"relevant": 1, "not_relevant": 1, "unparsed": 1, "failed": 2, "dropped": 0}
    assert sorted(heard) == sorted(["relevant", "not_relevant", "unparsed", "failed", "failed"])
    assert set(counts) == set(JUDGE_OUTCOMES) and asker.threads == {THREAD_NAME}
    assert "does vitamin D matter for bones?" in asker.asked[0][-1]["content"]


def test_a_full_queue_drops_at_once_and_never_waits():
    gate = threading.Event()
    judge = SampledJudge(Asker("Yes", gate=gate), 1.0, 2)
    started = time.perf_counter()
    for _ in range(10):
        judge.offer("q", PASSAGE)
    assert time.perf_counter() - started < 0.5  # the model is stuck; offering never is
    dropped = judge.counts["dropped"]
    assert 7 <= dropped <= 8, judge.counts  # one being asked (perhaps), two queued, the rest dropped
    gate.set()
    counts = settle(judge, 10)
    judge.close()
    assert counts["relevant"] + counts["dropped"] == 10, counts


def test_the_rate_samples_a_share():
    judge = SampledJudge(Asker("No"), 0.25, 10_000, seed=7)
    for _ in range(2000):
        judge.offer("q", PASSAGE)
    seen, deadline = -1, time.monotonic() + 10
    while sum(judge.counts.values()) != seen and time.monotonic() < deadline:  # until every sampled pair is judged
        seen = sum(judge.counts.values())
        time.sleep(0.2)
    judge.close()
    assert 400 <= seen <= 600 and judge.counts["dropped"] == 0, judge.counts


def test_close_does_not_wait_for_queued_pairs():
    gate = threading.Event()
    judge = SampledJudge(Asker("Yes", gate=gate), 1.0, 100)
    for _ in range(50):
        judge.offer("q", PASSAGE)
    threading.Timer(0.2, gate.set).start()
    started = time.perf_counter()
    judge.close()
    assert time.perf_counter() - started < 5 and judge.counts["relevant"] <= 2


@pytest.mark.parametrize("rate, queue", [(1.5, 4), (-0.1, 4), (0.5, 0)])
def test_bad_settings_are_named(rate, queue):
    with pytest.raises(ValueError, match="rate in 0..1 and a queue of at least 1"):
        SampledJudge(Asker("Yes"), rate, queue)
