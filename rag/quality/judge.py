"""The sampled judge: off the request path, the language model is asked whether a share of the answers' first passage
is relevant to the question (``quality.judge_rate``), and each outcome is heard by whoever exports it.

A request only flips a coin and, on heads, puts (question, passage) on a bounded queue (``quality.judge_queue``); a
full queue drops the pair (counted ``dropped``), so a slow model never slows an answer. One daemon thread asks the
model with the judge's prompt (``rag.eval.judge``: held to Yes or No where the server has structured outputs) and
reads the reply: ``relevant``, ``not_relevant``, ``unparsed`` (neither word), ``failed`` (the model unavailable).

Whether the outcome means anything depends on the model: ``ragheat judge`` measures its agreement with human labels
(docs/benchmarks.md, "Relevance labels by an LLM judge"), and the judge is a quality signal only where that agreement
earns it, so it is off by default.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
from typing import Callable

from rag.eval.judge import build_messages, parse_label
from rag.generation.llm import GeneratorUnavailable
from rag.stages import JUDGE_OUTCOMES
from rag.tally import Tally
from rag.types import Chunk

log = logging.getLogger(__name__)
THREAD_NAME = "ragheat-judge"


class SampledJudge:
    """Judges a ``rate`` share of the pairs offered, on a thread of its own. ``asker``: ``ask(messages) -> (reply,
    margin)`` (``rag.eval.judge.CompleterAsker`` over the pipeline's language model); ``listeners`` hear each
    outcome."""

    def __init__(self, asker, rate: float, max_pending: int, *, seed: int | None = None,
                 prepare: Callable[[str, Chunk], Chunk] | None = None) -> None:
        """``prepare``: what the judge's thread does to a passage before asking (the pipeline's prompt budget, which
        the model's context was sized for)."""
        if not 0.0 <= rate <= 1.0 or max_pending < 1:
            raise ValueError(f"the sampled judge needs a rate in 0..1 and a queue of at least 1, got {rate} and "
                             f"{max_pending}")
        self.asker, self.rate, self.prepare = asker, rate, prepare
        self.outcomes = Tally(JUDGE_OUTCOMES, "judge outcome (JUDGE_OUTCOMES)")
        self.counts, self.listeners = self.outcomes.counts, self.outcomes.listeners
        self.last_error: str | None = None  # why the latest failed pair failed
        self._random = random.Random(seed)
        self._pending: queue.Queue = queue.Queue(max_pending)
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._thread.start()

    def offer(self, query: str, passage: Chunk) -> None:
        """On the request's thread: sample the pair, queue it, or count it dropped; returns at once."""
        if self._random.random() >= self.rate:
            return
        try:
            self._pending.put_nowait((query, passage))
        except queue.Full:
            self.outcomes.count("dropped")

    def _run(self) -> None:
        while True:
            item = self._pending.get()
            if item is None:
                return
            query, passage = item
            try:
                if self.prepare is not None:
                    passage = self.prepare(query, passage)
                reply, _ = self.asker.ask(build_messages(query, passage.title, passage.text))
            except GeneratorUnavailable as exc:
                log.debug("the sampled judge's model is unavailable: %s", exc)
                self.last_error = str(exc)
                self.outcomes.count("failed")
                continue
            except Exception as exc:  # a judge never takes the service down with it
                log.exception("the sampled judge failed on a pair")
                self.last_error = repr(exc)
                self.outcomes.count("failed")
                continue
            label = parse_label(reply)
            self.outcomes.count("unparsed" if label is None else "relevant" if label else "not_relevant")

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the thread once the pair it is judging is done (pairs still queued are let go). Idempotent."""
        while True:
            try:
                self._pending.get_nowait()
            except queue.Empty:
                break
        try:
            self._pending.put_nowait(None)
        except queue.Full:
            pass
        self._thread.join(timeout_s)
