"""What the framework hooks share: which Observer a call belongs to, stages opened and closed without ever raising
into the framework, and the mapping of a framework's class names onto stage labels."""

from __future__ import annotations

import logging

from telemetry import observe
from telemetry.stage_names import StageNames

log = logging.getLogger("ragheat.observe")


def observer_for(bound: observe.Observer | None) -> observe.Observer | None:
    """The Observer a call running now belongs to (``telemetry.observe.current_observer``)."""
    return observe.current_observer(bound)


def open_stage(observer: observe.Observer, label: str) -> observe.OpenStage | None:
    try:
        return observer.open_stage(label)
    except Exception:  # pragma: no cover - a hook must never fail the framework's call
        log.exception("ragheat could not open the %s stage", label)
        return None


def close_stage(stage: observe.OpenStage | None, error: BaseException | None = None) -> None:
    if stage is None:
        return
    try:
        stage.close(error)
    except Exception:  # pragma: no cover - a hook must never fail the framework's call
        log.exception("ragheat could not record the %s stage", stage.label)


def label_of(names: StageNames, *candidates: str | None) -> str | None:
    """The label of the first candidate name that maps onto one, or None: a class that says no stage (a prompt
    builder, a router, an agent) is the pipeline's structure. Not counted as unmapped: these are guesses from a
    framework's names, not names a caller chose."""
    for name in candidates:
        if name:
            label = names.label(name, count=False)
            if label != "other":
                return label
    return None


def retriever_label(names: StageNames, name: str | None, dense: bool = False) -> str:
    """A retriever's stage: its kind when its name says it (``BM25Retriever`` -> ``retrieve_bm25``), else
    ``retrieve_dense`` when the framework says it searches a vector store, else ``retrieve``."""
    label = names.label(name, count=False) if name else "other"
    if label.startswith("retrieve_"):
        return label
    return "retrieve_dense" if dense else "retrieve"
