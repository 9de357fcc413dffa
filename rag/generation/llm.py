"""Written answers from a language model, streamed token by token: the ``openai`` generator.

It talks to any OpenAI-compatible server (vLLM's ``vllm.entrypoints.openai.api_server`` in the compose
stack) over HTTP with ``stream: true``. The prompt numbers the retrieved passages ``[1]..[n]`` and asks
for those markers after each sentence, so the answer cites the same numbers as the response's
``citations``. The generator only yields text pieces; the pipeline times them (TTFT, gaps between
tokens) and falls back to the extractive answer when ``GeneratorUnavailable`` is raised.

Bounded waiting: connecting gets ``connect_timeout_s``; every read (the first token, and each later one)
gets ``first_token_timeout_s``; the whole answer gets ``deadline_s``. A refused connection, an HTTP error,
a silent server or a slow one therefore ends in ``GeneratorUnavailable`` within
``connect_timeout_s + first_token_timeout_s`` before the first token (twice that when the model name must first
be asked of ``/models``), or ``deadline_s + first_token_timeout_s`` after it.
"""

from __future__ import annotations

import json
import time
from typing import Iterator, Sequence

import httpx

from rag.errors import RagheatError
from rag.types import Chunk

SYSTEM_PROMPT = ("Answer the question using only the numbered passages. After each sentence, cite the "
                 "passage it comes from as [n]. If the passages do not answer it, say so.")


class GeneratorUnavailable(RagheatError):
    """The language model could not answer (down, refusing, erroring); ``reason`` is the answer's
    ``degraded_reason`` (``rag.types.DEGRADED_REASONS``)."""

    reason = "unavailable"


class GeneratorTooSlow(GeneratorUnavailable):
    """The language model answered too slowly: no (next) token within ``first_token_timeout_s``, or not done
    within ``deadline_s``."""

    reason = "slow"


# One worked example before the real question: a 135M instruct model (SmolLM2) told only "cite as [n]" writes
# no marker at all; shown an answer that copies a passage's words and ends each sentence with [n], it mostly
# does the same. The example's second passage is off-topic and is not cited.
EXAMPLE_PASSAGES = (("Aspirin", "Aspirin irreversibly inhibits the enzyme COX-1, which lowers platelet aggregation. "
                                "Low doses are used to prevent heart attacks."),
                    ("Tides", "Tides are caused by the gravitational pull of the moon on the oceans."))
EXAMPLE_QUESTION = "How does aspirin prevent heart attacks?"
EXAMPLE_ANSWER = ("Aspirin inhibits the enzyme COX-1, which lowers platelet aggregation. [1] "
                  "Low doses prevent heart attacks. [1]")


# Constrained decoding (vLLM structured outputs): one to ``MAX_CITED_SENTENCES`` sentences, each ended by ". [n]"
# with n one of the passages given. The model still chooses every word and which passage it cites (the support
# check judges both); it cannot leave a sentence uncited. Inside a sentence "." is allowed only between
# digits (2.5), so a sentence cannot end unmarked; the length is left to max_tokens: a counted repetition
# ({8,240}) makes the grammar's compilation, once per request, cost more than the answer it constrains.
MAX_CITED_SENTENCES = 3


def citation_regex(passages: int) -> str:
    """The pattern every constrained answer matches, for ``passages`` numbered passages (1..passages)."""
    numbers = "|".join(str(n) for n in range(1, max(passages, 1) + 1))
    sentence = r"[A-Z0-9]([^\[\]\n.]|[0-9]\.[0-9])+"
    return rf"({sentence}\. \[({numbers})\] ?){{1,{MAX_CITED_SENTENCES}}}"


def _user_turn(query: str, passages: Sequence[tuple[str, str]]) -> str:
    context = "\n\n".join(f"[{n}] {title}\n{text}" for n, (title, text) in enumerate(passages, 1))
    return f"Passages:\n{context}\n\nQuestion: {query}"


def build_messages(query: str, passages: Sequence[Chunk]) -> list[dict]:
    """The chat messages asking for an answer from the numbered ``passages``, cited as ``[n]``: the
    instruction, one worked example, then the question."""
    return [{"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": _user_turn(EXAMPLE_QUESTION, EXAMPLE_PASSAGES)},
            {"role": "assistant", "content": EXAMPLE_ANSWER},
            {"role": "user", "content": _user_turn(query, [(p.title, p.text) for p in passages])}]


def completion_prompt(messages: Sequence[dict]) -> str:
    """The chat messages as one plain-text prompt, for completion APIs (no chat template)."""
    parts = [m["content"] + ("\n\nAnswer:" if m["role"] == "user" else "") for m in messages]
    return "\n\n".join(parts) + ("" if messages[-1]["role"] == "user" else "\n\nAnswer:")


class TokenStream:
    """Base of the ``rag.protocols.TokenStream`` implementations: text pieces of one answer as they arrive.
    ``output_tokens`` is the server's count once the stream ends (0 if it sent none); iterate to the end, or
    ``close()`` to stop early."""

    output_tokens: int = 0
    model: str = ""

    def __iter__(self) -> Iterator[str]:  # pragma: no cover - interface
        raise NotImplementedError

    def close(self) -> None:  # pragma: no cover - interface
        pass


class OpenAIStreamGenerator:
    """Streams an answer from an OpenAI-compatible ``/v1/chat/completions`` (or ``/v1/completions``).

    >>> generator = OpenAIStreamGenerator(settings.generation); generator.warm_up()
    >>> for piece in generator.stream("what causes tides?", passages): print(piece, end="")
    """

    name = "openai"
    metrics_dir = None  # the model runs elsewhere and serves its own metrics

    def __init__(self, settings) -> None:
        self.settings = settings
        self.base_url = settings.base_url.rstrip("/")
        self.model = settings.model or ""
        self.client: httpx.Client | None = None

    def warm_up(self) -> None:
        """Open the connection pool. The server may still be down: requests then degrade, the service starts."""
        s = self.settings
        self.client = httpx.Client(timeout=httpx.Timeout(s.first_token_timeout_s, connect=s.connect_timeout_s),
                                   limits=httpx.Limits(max_connections=256, max_keepalive_connections=64))
        if not self.model:
            try:
                self.model = self._served_model()
            except GeneratorUnavailable:
                pass  # asked again on the first request

    def _served_model(self) -> str:
        try:
            response = self.client.get(self.base_url + "/models")
            response.raise_for_status()
            return response.json()["data"][0]["id"]
        except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
            raise GeneratorUnavailable(f"cannot list models at {self.base_url}/models: {_why(exc)}") from exc

    def stream(self, query: str, passages: Sequence[Chunk]) -> TokenStream:
        """Starts nothing yet: the request is sent when iteration begins (inside the caller's timed stage)."""
        if self.client is None:
            raise RuntimeError("OpenAIStreamGenerator.warm_up() has not run")
        return _HttpTokenStream(self, build_messages(query, passages),
                                citation_regex(len(passages)) if self.settings.constrain_citations else None)

    def complete(self, messages: Sequence[dict], max_tokens: int, timeout_s: float, regex: str | None = None) -> str:
        """One whole completion of ``messages`` (not streamed), for HyDE and the judge: ``GeneratorTooSlow`` when it
        is not done within ``timeout_s``, ``GeneratorUnavailable`` when the server is down or errs. ``regex``
        constrains the text (vLLM's structured outputs, when ``constrain_citations`` says the server has them)."""
        if self.client is None:
            raise RuntimeError("OpenAIStreamGenerator.warm_up() has not run")
        s = self.settings
        deadline = time.monotonic() + timeout_s
        if not self.model:
            self.model = self._served_model()
        body = {"model": self.model, "max_tokens": max_tokens, "temperature": s.temperature}
        if regex and s.constrain_citations:
            body["structured_outputs"] = {"regex": regex}
        if s.api == "completions":
            path, body = "/completions", {**body, "prompt": completion_prompt(messages)}
        else:
            path, body = "/chat/completions", {**body, "messages": list(messages)}
        left = deadline - time.monotonic()
        if left <= 0:
            raise GeneratorTooSlow(f"no time left within {timeout_s:g} s to ask {self.base_url}{path}")
        try:
            response = self.client.post(self.base_url + path, json=body,
                                        timeout=httpx.Timeout(left, connect=min(s.connect_timeout_s, left)))
        except httpx.HTTPError as exc:
            slow = isinstance(exc, httpx.TimeoutException) and not isinstance(exc, httpx.ConnectTimeout)
            raise (GeneratorTooSlow if slow else GeneratorUnavailable)(f"{self.base_url}{path}: {_why(exc)}") from exc
        if response.status_code != 200:
            raise GeneratorUnavailable(f"{self.base_url}{path} answered HTTP {response.status_code}: "
                                       f"{response.text[:200]}")
        try:
            choice = response.json()["choices"][0]
            return (choice["message"]["content"] if "message" in choice else choice["text"]) or ""
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise GeneratorUnavailable(f"{self.base_url}{path} sent a malformed completion: {exc!r}") from exc

    def close(self) -> None:
        if self.client is not None:
            self.client.close()


class _HttpTokenStream(TokenStream):
    def __init__(self, generator: OpenAIStreamGenerator, messages: list[dict], regex: str | None = None) -> None:
        self.generator, self.messages, self.regex = generator, messages, regex
        self._response: httpx.Response | None = None

    def _request_body(self) -> tuple[str, dict]:
        s = self.generator.settings
        body = {"model": self.model, "max_tokens": s.max_tokens, "temperature": s.temperature, "stream": True,
                "stream_options": {"include_usage": True}}
        if self.regex:  # vLLM's structured outputs (other OpenAI-compatible servers: constrain_citations=false)
            body["structured_outputs"] = {"regex": self.regex}
        if s.api == "completions":
            prompt = completion_prompt(self.messages)
            return "/completions", {**body, "prompt": prompt}
        return "/chat/completions", {**body, "messages": self.messages}

    def __iter__(self) -> Iterator[str]:
        g = self.generator
        deadline = time.monotonic() + g.settings.deadline_s
        if not g.model:
            g.model = g._served_model()
        self.model = g.model
        path, body = self._request_body()
        try:
            with g.client.stream("POST", g.base_url + path, json=body) as response:
                self._response = response
                if response.status_code != 200:
                    response.read()
                    raise GeneratorUnavailable(f"{g.base_url}{path} answered HTTP {response.status_code}: "
                                               f"{response.text[:200]}")
                for line in response.iter_lines():
                    # Checked on every line, keep-alive comments included: a server that only sends those
                    # must not hold the request past the deadline.
                    if time.monotonic() > deadline:
                        raise GeneratorTooSlow(f"the answer took longer than generation.deadline_s "
                                                   f"({g.settings.deadline_s:g} s)")
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    piece = self._piece(json.loads(data))
                    if piece:
                        yield piece
        except httpx.HTTPError as exc:
            # A read that timed out is a slow model; a connection that could not be made is a down one.
            slow = isinstance(exc, httpx.TimeoutException) and not isinstance(exc, httpx.ConnectTimeout)
            raise (GeneratorTooSlow if slow else GeneratorUnavailable)(f"{g.base_url}{path}: {_why(exc)}") from exc
        except ValueError as exc:  # a line that is not JSON
            raise GeneratorUnavailable(f"{g.base_url}{path} sent a malformed stream: {exc}") from exc

    def _piece(self, chunk: dict) -> str:
        usage = chunk.get("usage")
        if usage:
            self.output_tokens = int(usage.get("completion_tokens") or 0)
        choices = chunk.get("choices") or []
        if not choices:
            return ""
        choice = choices[0]
        if "delta" in choice:
            return choice["delta"].get("content") or ""
        return choice.get("text") or ""

    def close(self) -> None:
        if self._response is not None:
            self._response.close()


def _why(exc: BaseException) -> str:
    if isinstance(exc, httpx.ConnectError):
        return "connection refused or unreachable"
    if isinstance(exc, httpx.TimeoutException):
        return f"timed out ({type(exc).__name__})"
    return f"{type(exc).__name__}: {exc}"
