"""Retriever names as requests, settings and ``ragheat eval`` write them: ``dense``, ``bm25``, ``graph``, any
``+``-joined combination of them (fused by weighted RRF), ``hybrid`` for dense+bm25, or ``routed`` (alone: the router
picks per query). ``expand`` turns them into the retrievers to run, in one canonical order; ``route_label`` names a
set of retrievers as the closed ``retrieval_route`` label (``rag.stages.RETRIEVAL_ROUTES``)."""

from __future__ import annotations

from typing import Iterable

from rag.stages import RETRIEVAL_ROUTES, RETRIEVER_CHOICES, RETRIEVERS

ALIASES = {"hybrid": ("dense", "bm25")}
ROUTED = "routed"


def expand(names: Iterable[str] | str) -> tuple[str, ...]:
    """The retrievers ``names`` ask for, in the order of ``RETRIEVERS`` (or ``("routed",)``); ``ValueError`` with a
    sentence for an unknown, empty or mixed-with-routed name."""
    items = [names] if isinstance(names, str) else list(names)
    parts: list[str] = []
    for item in items:
        for part in str(item).split("+"):
            part = part.strip()
            if part in ALIASES:
                parts.extend(ALIASES[part])
            elif part in RETRIEVER_CHOICES:
                parts.append(part)
            else:
                raise ValueError(f"unknown retriever {part!r}: use {', '.join(RETRIEVER_CHOICES)}, hybrid "
                                 f"(= dense+bm25), or a +-joined combination such as hybrid+graph")
    if not parts:
        raise ValueError("name at least one retriever")
    if ROUTED in parts:
        if len(parts) > 1:
            raise ValueError("routed lets the router choose the retrievers, so it cannot be combined with others")
        return (ROUTED,)
    chosen = set(parts)
    return tuple(r for r in RETRIEVERS if r in chosen)


def route_label(retrievers: Iterable[str]) -> str:
    """``("dense", "bm25", "graph")`` -> ``"hybrid+graph"``: the ``retrieval_route`` label of a fixed set."""
    chosen = set(retrievers)
    names = ["hybrid"] if {"dense", "bm25"} <= chosen else [r for r in ("dense", "bm25") if r in chosen]
    if "graph" in chosen:
        names.append("graph")
    label = "+".join(names) or "none"
    if label not in RETRIEVAL_ROUTES:  # a new retriever must be given its labels in rag.stages first
        raise ValueError(f"no retrieval_route label for {sorted(chosen)}")
    return label


def parse_eval_names(spec: str) -> dict[str, tuple[str, ...]]:
    """``ragheat eval --retrievers dense,bm25,hybrid+graph,routed`` -> {name as written: retrievers}."""
    named: dict[str, tuple[str, ...]] = {}
    for name in (n.strip() for n in spec.split(",")):
        if not name:
            continue
        try:
            named[name] = expand(name)
        except ValueError as exc:
            raise ValueError(f"--retrievers {name!r}: {exc}") from None
    if not named:
        raise ValueError(f"--retrievers takes a comma list such as dense,bm25,graph,hybrid,hybrid+graph,routed; "
                         f"got {spec!r}")
    return named
