"""``ragheat demo --generator vllm``: a vLLM server from ``.venv-vllm`` writes the demo's answers, and each answer is
printed as its tokens arrive, then as served (after the support check), with its TTFT and tokens/s.

The model is SmolLM2-135M-Instruct as ``scripts/install_vllm.sh`` converted it (``--vllm-model auto``), a folder of
the user's, or ``dummy``: a tiny random-weight Llama whose text is noise (said loudly), for exercising vLLM only.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import typer

if TYPE_CHECKING:
    import httpx
    from rich.console import Console

    from rag.settings import RagheatSettings

SERVED_NAME = "demo-llm"
DUMMY_WARNING = ("WARNING: --vllm-model dummy: vLLM serves a tiny Llama with RANDOM weights. Its text is noise: the "
                 "support check rejects it and every answer falls back to the extractive one.")


def resolve_model(vllm_model: str) -> tuple[Path, bool]:
    """The model folder for ``--vllm-model`` and whether it is the random-weight one; a sentence saying what to
    do when it is missing."""
    from stack.smollm import DEFAULT_MODEL_DIR, folder_problems, installed_model

    if vllm_model == "auto":
        folder = installed_model()
        if folder is None:
            raise typer.BadParameter(f"the real model is not installed at {DEFAULT_MODEL_DIR}: run `bash "
                                     f"scripts/install_vllm.sh` (or give --vllm-model DIR, or dummy for random "
                                     f"weights)", param_hint="--vllm-model")
        return folder, False
    if vllm_model == "dummy":
        from stack.tiny_llama import build_tiny_llama
        from stack.topology import REPO

        texts = [p.read_text(errors="replace") for p in sorted((REPO / "docs").glob("*.md"))]
        return build_tiny_llama(Path(tempfile.gettempdir()) / "ragheat-demo-tiny-llama", texts), True
    folder = Path(vllm_model)
    problems = [p for p in folder_problems(folder) if "architectures" not in p]  # any architecture vLLM knows
    if problems:
        raise typer.BadParameter(f"{folder} cannot be served: {'; '.join(problems)}", param_hint="--vllm-model")
    return folder, False


def default_llm_model(generator: str | None, environ=None) -> str | None:
    """``ragheat serve --llm-model``'s default: for the in-process ``vllm`` generator (flag or
    ``RAGHEAT_GENERATION__GENERATOR``) with no model named (flag or ``RAGHEAT_GENERATION__MODEL``), the real model's
    folder when ``scripts/install_vllm.sh`` converted it; otherwise None (the settings decide: ``openai`` asks the
    server for its first model, and ``vllm`` without a folder is refused with a sentence naming the setting)."""
    import os

    from stack.smollm import installed_model

    environ = os.environ if environ is None else environ
    if (generator or environ.get("RAGHEAT_GENERATION__GENERATOR", "")) != "vllm":
        return None
    if environ.get("RAGHEAT_GENERATION__MODEL"):
        return None
    folder = installed_model()
    return None if folder is None else str(folder)


@contextlib.contextmanager
def served_model(settings: RagheatSettings, vllm_model: str, console: Console) -> Iterator[RagheatSettings]:
    """Start vLLM's OpenAI server on the model; yields ``settings`` with the ``openai`` generator pointed at it."""
    from rag.childproc import free_port
    from stack.vllm import VllmServer

    folder, dummy = resolve_model(vllm_model)
    if dummy:
        console.print(f"[bold red]{DUMMY_WARNING}[/]")
    g = settings.generation
    console.print(f"starting vLLM on {folder} (CPU; loading takes tens of seconds) ...")
    started = time.perf_counter()
    server = VllmServer(folder, port=free_port(), python=g.vllm_python, served_name=SERVED_NAME, max_model_len=2048,
                        max_num_seqs=4, block_size=32, load_format="dummy" if dummy else "auto")
    with server as url:
        console.print(f"vLLM ready in {time.perf_counter() - started:.1f} s at {url} (log {server.log_path})")
        # Waits sized for two shared cores, where even a prompt of three passages is slow to prefill.
        generation = g.model_copy(update={"generator": "openai", "base_url": url, "model": SERVED_NAME,
                                          "passages": min(g.passages, 3),
                                          "first_token_timeout_s": max(g.first_token_timeout_s, 60.0),
                                          "deadline_s": max(g.deadline_s, 120.0)})
        # A deadline the model on two cores fits in: the default (the 420 ms SLO) would skip it for the budget.
        deadline_ms = generation.deadline_s * 1000
        admission = settings.admission.model_copy(update={"deadline_ms": deadline_ms,
                                                          "max_timeout_ms": max(settings.admission.max_timeout_ms,
                                                                                deadline_ms)})
        yield settings.model_copy(update={"generation": generation, "admission": admission})


def ask_streamed(client: httpx.Client, question: str, console: Console) -> dict:
    """Ask over ``/v1/query/stream``, printing tokens as they arrive, then the answer as served and its TTFT and
    tokens/s; returns the ``done`` event's fields with the ``sources`` as ``citations``."""
    sources, served, done, kind = [], [], {}, None
    console.print("[bold]writing:[/] ", end="")
    with client.stream("POST", "/v1/query/stream", json={"query": question, "top_k": 5}) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("event: "):
                kind = line[7:]
                continue
            if not line.startswith("data: "):
                continue
            data = json.loads(line[6:])
            if kind == "sources":
                sources = data
            elif kind == "token":
                console.print(data["text"], end="", markup=False, highlight=False, soft_wrap=True)
            elif kind == "degraded":
                console.print(f"\n[yellow]retracted ({data['reason']}: {data['detail']}); the extractive answer "
                              f"follows[/]", end="")
            elif kind == "answer":
                served.append(data["text"] + ("" if "[" in data["text"] else f" [{data.get('citation')}]"))
            elif kind == "done":
                done = data
    console.print()
    console.print(f"[bold]A:[/] {' '.join(served)}", highlight=False)
    g = done.get("generation")
    if g:
        tpot = g.get("time_per_output_token_ms")
        rate = f"{1000 / tpot:.1f} tokens/s" if tpot else "one token"
        console.print(f"[dim]{done['generator']}; TTFT {g['ttft_ms']:.0f} ms, {g['output_tokens']} tokens, {rate} "
                      f"(decode); {done['unsupported_sentences']} sentence(s) flagged unsupported[/]")
    return {**done, "citations": sources}
