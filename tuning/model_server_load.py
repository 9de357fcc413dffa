"""The model server beside the measured service in step 4: ``ModelServerLoad`` keeps completions in flight against it
while the knobs are measured (the load a service's written answers put on it, so that a knob is measured where the
two compete for the cores), ``RunningModel`` says where it answers, and ``pin_tree`` moves its every thread (the API
process's and, where vLLM runs one, its engine core's) onto a core set."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import httpx

from telemetry.host import descendants, read_processes


@dataclass(frozen=True)
class RunningModel:
    """A model server that answers: its ``/v1`` URL, the pid of its process tree's root, the model's served name and
    the limits it runs with."""

    url: str
    pid: int
    name: str
    max_model_len: int | None = None
    max_num_seqs: int | None = None


@dataclass
class LoadTally:
    requests: int = 0
    errors: int = 0
    tokens: int = 0
    error_reasons: dict[str, int] = field(default_factory=dict)


class ModelServerLoad:
    """``with ModelServerLoad(model, texts, in_flight=2):`` ``in_flight`` completions at a time against ``model``
    (each a question of ``texts`` and up to ``max_tokens`` tokens), one after another, until the block ends;
    ``tally`` counts them. A failing request is counted by reason and followed by the next one: the load is what the
    model server can take, not an assertion on it."""

    def __init__(self, model: RunningModel, texts: Sequence[str], *, in_flight: int = 2, max_tokens: int = 64,
                 timeout_s: float = 120.0) -> None:
        if not texts:
            raise ValueError("ModelServerLoad needs at least one question")
        self.model, self.texts, self.max_tokens, self.timeout_s = model, list(texts), max_tokens, timeout_s
        self.tally = LoadTally()
        self._lock, self._stop = threading.Lock(), threading.Event()
        self._threads = [threading.Thread(target=self._loop, args=(i,), name=f"model-load-{i}", daemon=True)
                         for i in range(in_flight)]

    def _loop(self, offset: int) -> None:
        with httpx.Client(timeout=self.timeout_s) as client:
            i = offset
            while not self._stop.is_set():
                text = self.texts[i % len(self.texts)]
                i += len(self._threads)
                try:
                    response = client.post(self.model.url + "/completions", json={
                        "model": self.model.name, "prompt": f"Question: {text}\nAnswer:",
                        "max_tokens": self.max_tokens, "temperature": 0.0})
                    response.raise_for_status()
                    tokens, reason = int((response.json().get("usage") or {}).get("completion_tokens") or 0), None
                except Exception as exc:  # counted by kind: the load goes on, the report says what failed
                    tokens, reason = 0, type(exc).__name__
                with self._lock:
                    self.tally.requests += 1
                    self.tally.tokens += tokens
                    if reason:
                        self.tally.errors += 1
                        self.tally.error_reasons[reason] = self.tally.error_reasons.get(reason, 0) + 1

    def __enter__(self) -> "ModelServerLoad":
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(self.timeout_s)

    def summary(self, seconds: float) -> dict:
        """The load over ``seconds``: requests, errors (by reason) and output tokens per second."""
        with self._lock:
            t = self.tally
            return {"in_flight": len(self._threads), "max_tokens": self.max_tokens,
                    "limits": {"max_model_len": self.model.max_model_len, "max_num_seqs": self.model.max_num_seqs},
                    "requests": t.requests,
                    "errors": t.errors, "error_reasons": dict(t.error_reasons),
                    "tokens_per_s": round(t.tokens / seconds, 2) if seconds > 0 else None}


def pin_tree(pid: int, cpus: Iterable[int]) -> int:
    """Every thread of ``pid`` and of the processes under it onto ``cpus``; returns how many threads were moved (one
    that ends meanwhile is passed over)."""
    cpus, moved = frozenset(cpus), 0
    for process in descendants(read_processes() or {}, [pid]):
        for task in Path(f"/proc/{process}/task").glob("*"):
            try:
                os.sched_setaffinity(int(task.name), cpus)
                moved += 1
            except (ProcessLookupError, FileNotFoundError):
                pass
    return moved
