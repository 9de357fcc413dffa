"""Step 3's figures as a user sees them: the service writing its answers through the model server.

The batch sweep (``loadgen.vllm_tuning``) measures the model server alone, on prompts of its own. What a service
with a model serves is the whole answer: retrieval, the model writing it from the passages, the support check. So
step 3 also serves the service with ``generation.generator`` openai against the model server, once at the limits
before the step and once at the limits it chose, each side with a model server of its own running for the whole
measurement (the rounds alternate, as every side-by-side measurement of the tuning does), and measures each at
concurrency 1 (the whole answer's and each stage's P50/P99: ``generate_prefill`` is the wait for the model's first
token) and under open-loop load at the sweep's rate. Each side's answers are counted by who wrote them: the model,
or the extractive answer the service fell back to (and why), so that a figure of answers the model did not write is
not read as the model's. When the step left the limits as they were, the one configuration is measured alone.
"""

from __future__ import annotations

import math
from contextlib import ExitStack
from pathlib import Path
from typing import Callable, ContextManager, Sequence

from rag.settings import GenerationSettings
from tuning import measure
from tuning.model_server_load import RunningModel
from tuning.placement_step import merge

# Of the model's context, what the prompt's fixed part takes (the instructions, the worked example, the question),
# with room for the passages' estimate: the passages get the rest less the answer, when the settings do not bound them.
PROMPT_RESERVED_TOKENS = 300
MIN_LOAD_REQUESTS = 20  # a step under load offers at least this many on average: a P99 of fewer says nothing


def written_sections(sections: dict, model: RunningModel, deadline_ms: float) -> dict:
    """The settings sections of a service writing its answers through ``model``: the openai generator against it,
    passages that fit its context (``PROMPT_RESERVED_TOKENS``), and an admission deadline a written answer can meet
    (the default deadline is retrieval's SLO, which a model writing on the same cores does not meet: every answer
    would be refused)."""
    generation = {"generator": "openai", "base_url": model.url, "model": model.name}
    given = sections.get("generation", {})
    if "prompt_budget_tokens" not in given and model.max_model_len:
        defaults = GenerationSettings()
        room = model.max_model_len - given.get("max_tokens", defaults.max_tokens) - PROMPT_RESERVED_TOKENS
        generation["prompt_budget_tokens"] = max(1, min(defaults.prompt_budget_tokens, room))
    deadline = {"deadline_ms": deadline_ms, "max_timeout_ms": math.ceil(deadline_ms)}
    return merge(sections, {"generation": generation, "admission": deadline})


def _limits(model: RunningModel) -> dict:
    return {"max_num_seqs": model.max_num_seqs, "max_model_len": model.max_model_len}


def measure_written(before: dict, after: dict, model_server: Callable[[dict], ContextManager[RunningModel]],
                    index: Path, texts: Sequence[str], *, rounds: int, rate: float, duration_s: float,
                    deadline_ms: float, out: Path, advance: Callable[[], None] | None = None) -> dict:
    """The service writing through the model server at the limits of ``before`` and of ``after`` (settings
    sections; ``model_server(sections)`` runs one at their limits): per side the limits, the concurrency-1 figures
    (``measure.Rounds.summary``, with the answers by writer) and the P99 at ``rate`` (steps of ``duration_s``, longer
    when that would offer fewer than ``MIN_LOAD_REQUESTS``). One side when the limits are the same."""
    with ExitStack() as stack:
        models = {"before": stack.enter_context(model_server(before))}
        chosen = after.get("generation", {})
        same = (chosen.get("vllm_max_num_seqs", models["before"].max_num_seqs) == models["before"].max_num_seqs
                and chosen.get("vllm_max_model_len", models["before"].max_model_len) == models["before"].max_model_len)
        if not same:
            models["after"] = stack.enter_context(model_server(after))
        files = {side: measure.write_settings(out / "configs" / f"written-{side}.json",
                                              written_sections(sections, models[side], deadline_ms))
                 for side, sections in (("before", before), ("after", after)) if side in models}
        figures = measure.compare(index, files, texts, rounds=rounds, log_dir=out / "logs" / "written",
                                  load_qps=rate, load_duration_s=max(duration_s, MIN_LOAD_REQUESTS / rate),
                                  advance=advance)
    return {"questions": len(texts), "rounds": rounds, "rate": rate, "deadline_ms": deadline_ms, "same": same,
            "sides": {side: {"limits": _limits(models[side]), **figures[side]} for side in models}}
