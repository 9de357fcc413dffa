"""The ``vllm`` generator: vLLM's ``AsyncLLM`` engine in this process, for single-box deployments.

Needs the ``vllm`` package (run ragheat from ``.venv-vllm``, see docs/vllm.md). The engine runs on an event
loop of its own thread; the pipeline's thread reads pieces from a queue with the same bounded waits as the
``openai`` generator (first/next token within ``first_token_timeout_s``, the whole answer within
``deadline_s``), so a stuck engine degrades to the extractive answer instead of hanging a request.
ragheat's vLLM plugin (telemetry/vllm_plugin.py) records the engine's steps here too. ``AsyncLLM`` always
runs its engine core in a child process, so the plugin's ``ragheat_vllm_*`` values live there: the child writes
them to ``generation.vllm_metrics_dir`` (``metrics_dir``) for a ``prometheus_client.multiprocess.MultiProcessCollector``
to read. This module only reads the process environment: whoever wires the service (``ragheat.service``) creates
that folder and exports it as ``PROMETHEUS_MULTIPROC_DIR``, with spawned (not forked) workers, before
``warm_up`` starts the child.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import queue
import threading
import time
from pathlib import Path
from typing import Iterator, Sequence

from rag.errors import ConfigurationError
from rag.generation.llm import (GeneratorTooSlow, GeneratorUnavailable, TokenStream, build_messages, citation_regex,
                                completion_prompt)
from rag.types import Chunk

_END = object()


class InProcessVllmGenerator:
    """A ``StreamingGenerator`` on vLLM's ``AsyncLLM`` in this process (``generation.generator=vllm``)."""

    name = "vllm"

    def __init__(self, settings) -> None:
        self.settings = settings
        self.model = settings.model
        self._ids = itertools.count()
        self.engine = None
        self.chat_template, self._tokenizer = False, None
        self.metrics_dir: Path | None = settings.vllm_metrics_dir  # where the engine core writes (see above)

    def warm_up(self) -> None:
        try:
            from vllm import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError as exc:
            raise ConfigurationError(f"generation.generator=vllm needs the vllm package in this environment ({exc}); "
                                     "install it with scripts/install_vllm.sh and run ragheat from .venv-vllm, or "
                                     "serve vLLM separately and use generation.generator=openai") from exc

        s = self.settings
        exported = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if self.metrics_dir is not None and exported != str(self.metrics_dir):
            raise ConfigurationError(f"generation.vllm_metrics_dir is {self.metrics_dir}, but PROMETHEUS_MULTIPROC_DIR "
                                     f"is {exported or 'unset'}: the engine core would write its metrics elsewhere")
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="ragheat-vllm-engine", daemon=True).start()
        args = AsyncEngineArgs(model=s.model, max_model_len=s.vllm_max_model_len, max_num_seqs=s.vllm_max_num_seqs,
                               load_format=s.vllm_load_format, enforce_eager=True)

        async def build():
            return AsyncLLM.from_engine_args(args)

        try:
            self.engine = asyncio.run_coroutine_threadsafe(build(), self.loop).result()
        except Exception as exc:  # a bad model folder, too little memory: one sentence, not vLLM's traceback
            self.loop.call_soon_threadsafe(self.loop.stop)
            raise ConfigurationError(f"generation.model {s.model!r}: vLLM could not start its engine: "
                                     f"{type(exc).__name__}: {exc}") from exc
        # An instruct model is prompted through its own chat template (the worked example is a real assistant turn);
        # a folder without one (the tiny random-weight test model) gets the plain-text prompt.
        tokenizer = self.engine.get_tokenizer()
        self.chat_template = bool(getattr(tokenizer, "chat_template", None))
        self._tokenizer = tokenizer

    def stream(self, query: str, passages: Sequence[Chunk]) -> TokenStream:
        """The engine's answer, piece by piece; nothing is submitted until iteration begins."""
        if self.engine is None:
            raise RuntimeError("InProcessVllmGenerator.warm_up() has not run")
        messages = build_messages(query, passages)
        if self.chat_template:
            prompt = self._tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        else:
            prompt = completion_prompt(messages)
        return _EngineTokenStream(self, prompt, f"ragheat-{next(self._ids)}", citation_regex(len(passages)))

    def complete(self, messages: Sequence[dict], max_tokens: int, timeout_s: float, regex: str | None = None) -> str:
        """One whole completion of ``messages``, for HyDE and the judge: ``GeneratorTooSlow`` (the request aborted)
        when not done within ``timeout_s``, ``GeneratorUnavailable`` when the engine fails."""
        import concurrent.futures

        from vllm import SamplingParams

        if self.engine is None:
            raise RuntimeError("InProcessVllmGenerator.warm_up() has not run")
        s = self.settings
        if self.chat_template:
            prompt = self._tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
        else:
            prompt = completion_prompt(messages)
        constrained = {}
        if regex and s.constrain_citations:
            from vllm.sampling_params import StructuredOutputsParams

            constrained["structured_outputs"] = StructuredOutputsParams(regex=regex)
        params = SamplingParams(max_tokens=max_tokens, temperature=s.temperature, **constrained)
        request_id = f"ragheat-{next(self._ids)}"

        async def run() -> str:
            final = None
            async for output in self.engine.generate(prompt, params, request_id):
                final = output
            return final.outputs[0].text if final is not None else ""

        future = asyncio.run_coroutine_threadsafe(run(), self.loop)
        try:
            return future.result(timeout=timeout_s)
        except concurrent.futures.TimeoutError:
            asyncio.run_coroutine_threadsafe(self.engine.abort(request_id), self.loop)
            raise GeneratorTooSlow(f"the in-process vLLM engine did not finish within {timeout_s:g} s") from None
        except Exception as exc:
            raise GeneratorUnavailable(f"the in-process vLLM engine failed: {type(exc).__name__}: {exc}") from exc

    def close(self) -> None:
        """Stop the engine (its core process included) and its event loop; idempotent."""
        if self.engine is not None:
            self.engine.shutdown()
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.engine = None


class _EngineTokenStream(TokenStream):
    def __init__(self, generator: InProcessVllmGenerator, prompt: str, request_id: str, regex: str) -> None:
        self.generator, self.prompt, self.request_id, self.regex = generator, prompt, request_id, regex
        self.model = generator.model
        self.pieces: queue.Queue = queue.Queue()
        self._future = None

    async def _produce(self) -> None:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        s = self.generator.settings
        constrained = {}
        if s.constrain_citations:
            from vllm.sampling_params import StructuredOutputsParams

            constrained["structured_outputs"] = StructuredOutputsParams(regex=self.regex)
        params = SamplingParams(max_tokens=s.max_tokens, temperature=s.temperature, output_kind=RequestOutputKind.DELTA,
                                **constrained)
        try:
            async for output in self.generator.engine.generate(self.prompt, params, self.request_id):
                completion = output.outputs[0]
                self.output_tokens += len(completion.token_ids)
                if completion.text:
                    self.pieces.put(completion.text)
            self.pieces.put(_END)
        except Exception as exc:  # handed to the reading thread
            self.pieces.put(exc)

    def __iter__(self) -> Iterator[str]:
        s = self.generator.settings
        deadline = time.monotonic() + s.deadline_s
        self._future = asyncio.run_coroutine_threadsafe(self._produce(), self.generator.loop)
        while True:
            try:
                item = self.pieces.get(timeout=s.first_token_timeout_s)
            except queue.Empty:
                raise GeneratorTooSlow(f"the in-process vLLM engine sent no token within "
                                           f"generation.first_token_timeout_s ({s.first_token_timeout_s:g} s)") from None
            if item is _END:
                return
            if isinstance(item, Exception):
                raise GeneratorUnavailable(f"the in-process vLLM engine failed: {type(item).__name__}: {item}")
            yield item
            if time.monotonic() > deadline:
                raise GeneratorTooSlow(f"the answer took longer than generation.deadline_s ({s.deadline_s:g} s)")

    def close(self) -> None:
        if self._future is not None and not self._future.done():
            asyncio.run_coroutine_threadsafe(self.generator.engine.abort(self.request_id), self.generator.loop)
