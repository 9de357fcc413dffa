"""Names: how a document title becomes the aliases that mention its entity, and the Aho-Corasick gazetteer that
finds those aliases in chunks (at ingest) and in queries (at query time).

Everything is matched on ``normalise``d text: case-folded, HTML entities decoded (titles contain ``&amp;``), accents
dropped, punctuation turned into spaces, letters of every script kept. Aliases of a title: the title itself; without
a parenthetical qualifier ("Black Book (film)" -> "black book"); without a leading article; and the part before a
comma only for short "Name, Qualifier" titles ("Davenport, Florida" -> "davenport"), never for sentence-like titles
("Loss, trauma, and human resilience: ..." must not become "loss": on SciFact, splitting every comma makes the graph
hurt retrieval where it is otherwise neutral).
"""

from __future__ import annotations

import html
import re
import unicodedata
from typing import Iterable

import ahocorasick

_NON_WORD = re.compile(r"[\W_]+")
_COMBINING = re.compile(r"[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f]")
_PAREN = re.compile(r"\s*\([^)]*\)\s*")
_ARTICLE = re.compile(r"^(the|a|an) ")
STOP_ALIASES = frozenset("""the a an of and in on at to for by with from is was are be this that it he she they his
her film song album band river city town county state book novel game series station university school""".split())
"""Aliases that are words, never names, whatever title they come from."""
COMMA_ALIAS_MAX_WORDS = 5
PRIOR_TITLE, PRIOR_NO_QUALIFIER, PRIOR_BEFORE_COMMA, ARTICLE_FACTOR = 1.0, 0.8, 0.6, 0.9
"""How surely each kind of alias names its entity (an ambiguous alias spreads this over its entities)."""


def normalise(text: str) -> str:
    """Case-folded words separated by single spaces ("Pokémon: The  Movie" -> "pokemon the movie")."""
    if "&" in text:
        text = html.unescape(text)
    if not text.isascii():
        text = _COMBINING.sub("", unicodedata.normalize("NFKD", text))
    return _NON_WORD.sub(" ", text.casefold()).strip()


def title_aliases(title: str, comma: str = "short") -> list[tuple[str, float]]:
    """(alias, prior) pairs of a title, most specific first. ``comma``: ``short`` cuts at the comma only for short
    "Name, Qualifier" titles (one comma, at most five words, no ``:?;``), ``all`` always, ``none`` never."""
    raw = html.unescape(title)
    found: dict[str, float] = {}

    def add(text: str, prior: float) -> None:
        alias = normalise(text)
        if alias and alias not in found:
            found[alias] = prior
        bare = _ARTICLE.sub("", alias)
        if bare and bare not in found:
            found[bare] = prior * ARTICLE_FACTOR

    add(raw, PRIOR_TITLE)
    base = _PAREN.sub(" ", raw).strip()
    if base != raw:
        add(base, PRIOR_NO_QUALIFIER)
    if "," in base and (comma == "all" or (comma == "short" and base.count(",") == 1
                                           and len(base.split()) <= COMMA_ALIAS_MAX_WORDS
                                           and not any(ch in base for ch in ":?;"))):
        add(base.split(",")[0], PRIOR_BEFORE_COMMA)
    return list(found.items())


def usable_alias(alias: str, min_chars: int = 3) -> bool:
    """Long enough, not a stop word, not a bare number."""
    return len(alias) >= min_chars and alias not in STOP_ALIASES and not alias.isdigit()


class Gazetteer:
    """Aho-Corasick automaton over aliases (``pyahocorasick``): every alias found in a normalised text on word
    boundaries, in one pass whatever the number of aliases; overlapping finds resolve to the longest."""

    def __init__(self, aliases: Iterable[str]) -> None:
        self.automaton = ahocorasick.Automaton()
        for alias in aliases:
            self.automaton.add_word(f" {alias} ", alias)  # padded: a match starts and ends on a word boundary
        self.empty = len(self.automaton) == 0
        if not self.empty:
            self.automaton.make_automaton()

    def find(self, normalised_text: str) -> list[str]:
        """The aliases in ``normalised_text``, longest first, never two overlapping."""
        if self.empty or not normalised_text:
            return []
        spans = []
        for end, alias in self.automaton.iter(f" {normalised_text} "):
            spans.append((end - len(alias), end, alias))  # [first char, last char] of the alias in the padded text
        if len(spans) == 1:
            return [spans[0][2]]
        spans.sort(key=lambda span: (span[0] - span[1], span[0]))
        taken: list[tuple[int, int]] = []
        found = []
        for start, end, alias in spans:
            if all(end < a or start > b for a, b in taken):
                taken.append((start, end))
                found.append(alias)
        return found
