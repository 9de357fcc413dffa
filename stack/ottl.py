"""A shape check of OTTL (the OpenTelemetry Transformation Language) statements and conditions, for the collector
config that cannot run here (stack/collector.py).

It parses the subset of OTTL's grammar (pkg/ottl/LANGUAGE.md in opentelemetry-collector-contrib) the stack's config
uses: an editor call such as ``set(target, value)`` with an optional ``where`` condition, and conditions made of
comparisons joined by ``and``/``or``/``not`` and parentheses, over paths (``span.attributes["rag.stage"]``), string,
number and boolean literals, ``nil``, enums (``STATUS_CODE_ERROR``) and converter calls (``IsMatch(...)``). It does
not know OTTL's functions or each context's paths: the collector itself checks those when it starts. What it
catches is what breaks a statement before that: unbalanced brackets, an unterminated string, a missing operand,
a path without the context prefix that the transform processor's flat statement lists need to infer a context.
"""

from __future__ import annotations

import re

TRACE_CONTEXTS = ("resource", "scope", "span", "spanevent")
"""Path prefixes ``trace_statements`` may use (the transform processor infers the context from them)."""
EDITORS = frozenset({"set", "delete_key", "delete_matching_keys", "keep_keys", "keep_matching_keys", "limit",
                     "merge_maps", "replace_pattern", "replace_all_patterns", "truncate_all"})
"""The OTTL editors this check accepts as a statement's function."""

_TOKEN = re.compile(r'\s*(?:(?P<string>"(?:[^"\\]|\\.)*")|(?P<number>-?\d+(?:\.\d+)?)|(?P<op>==|!=|<=|>=|<|>)'
                    r'|(?P<punct>[()\[\],.])|(?P<ident>[A-Za-z_][A-Za-z0-9_]*))')
_KEYWORDS = frozenset({"and", "or", "not", "where", "nil", "true", "false"})
_ENUM = re.compile(r"[A-Z][A-Z0-9_]*\Z")


class OttlShapeError(ValueError):
    """A statement or condition that is not well-formed OTTL; the message says where."""


def _tokens(text: str) -> list[tuple[str, str]]:
    tokens, at = [], 0
    while at < len(text):
        if text[at:].strip() == "":
            break
        match = _TOKEN.match(text, at)
        if match is None:
            rest = text[at:].strip()
            if rest.startswith('"'):
                raise OttlShapeError(f"unterminated string {rest[:16]!r}")
            raise OttlShapeError(f"unexpected {rest[:12]!r} at character {at}")
        kind = match.lastgroup
        value = match.group(kind)
        tokens.append(("keyword" if kind == "ident" and value in _KEYWORDS else kind, value))
        at = match.end()
    return tokens


class _Parser:
    def __init__(self, text: str, contexts: tuple[str, ...] | None) -> None:
        self.tokens, self.at, self.contexts = _tokens(text), 0, contexts

    def peek(self, offset: int = 0) -> tuple[str, str]:
        index = self.at + offset
        return self.tokens[index] if index < len(self.tokens) else ("end", "")

    def take(self, kind: str, value: str | None = None) -> str:
        got_kind, got = self.peek()
        if got_kind != kind or (value is not None and got != value):
            wanted = value or kind
            raise OttlShapeError(f"expected {wanted!r}, found {got or 'the end'!r} (token {self.at + 1})")
        self.at += 1
        return got

    def done(self) -> None:
        if self.peek()[0] != "end":
            raise OttlShapeError(f"unexpected {self.peek()[1]!r} after a complete expression (token {self.at + 1})")

    def statement(self) -> str:
        editor = self.take("ident")
        if editor not in EDITORS:
            raise OttlShapeError(f"{editor!r} is not an OTTL editor this check knows ({', '.join(sorted(EDITORS))})")
        self.arguments()
        if self.peek() == ("keyword", "where"):
            self.at += 1
            self.condition()
        self.done()
        return editor

    def arguments(self) -> list[str]:
        self.take("punct", "(")
        kinds = []
        if self.peek() != ("punct", ")"):
            kinds.append(self.value())
            while self.peek() == ("punct", ","):
                self.at += 1
                kinds.append(self.value())
        self.take("punct", ")")
        return kinds

    def condition(self) -> None:
        self.conjunction()
        while self.peek() == ("keyword", "or"):
            self.at += 1
            self.conjunction()

    def conjunction(self) -> None:
        self.negation()
        while self.peek() == ("keyword", "and"):
            self.at += 1
            self.negation()

    def negation(self) -> None:
        if self.peek() == ("keyword", "not"):
            self.at += 1
            self.negation()
        elif self.peek() == ("punct", "("):
            self.at += 1
            self.condition()
            self.take("punct", ")")
        else:
            left = self.value()
            if self.peek()[0] == "op":
                self.at += 1
                self.value()
            elif left not in ("bool", "call", "path"):  # a lone value must be able to be a boolean
                raise OttlShapeError(f"a {left} is not a condition (token {self.at})")

    def value(self) -> str:
        kind, token = self.peek()
        if kind in ("string", "number"):
            self.at += 1
            return kind
        if kind == "keyword" and token in ("nil", "true", "false"):
            self.at += 1
            return "bool" if token != "nil" else "nil"
        if kind == "punct" and token == "[":  # a list literal
            self.at += 1
            if self.peek() != ("punct", "]"):
                self.value()
                while self.peek() == ("punct", ","):
                    self.at += 1
                    self.value()
            self.take("punct", "]")
            return "list"
        if kind == "ident":
            if self.peek(1) == ("punct", "("):  # a converter: Concat(...), IsMatch(...)
                self.at += 1
                self.arguments()
                return "call"
            if _ENUM.match(token) and self.peek(1) not in (("punct", "."), ("punct", "[")):
                self.at += 1
                return "enum"
            return self.path()
        raise OttlShapeError(f"expected a value, found {token or 'the end'!r} (token {self.at + 1})")

    def path(self) -> str:
        start = self.at
        parts = [self.take("ident")]
        while self.peek() == ("punct", "."):
            self.at += 1
            parts.append(self.take("ident"))
        while self.peek() == ("punct", "["):
            self.at += 1
            self.take("string")
            self.take("punct", "]")
        if self.contexts is not None and (len(parts) < 2 or parts[0] not in self.contexts):
            raise OttlShapeError(f"the path {'.'.join(parts)!r} (token {start + 1}) lacks a context prefix "
                                 f"({', '.join(self.contexts)}), which a flat statement list needs")
        return "path"


def statement_problem(text: str, contexts: tuple[str, ...] | None = TRACE_CONTEXTS) -> str | None:
    """Why ``text`` is not a well-formed OTTL statement (``contexts``: the prefixes its paths must start with,
    None when the context is given, as in a ``context:`` group); None when it is."""
    try:
        _Parser(text, contexts).statement()
    except OttlShapeError as exc:
        return str(exc)
    return None


def condition_problem(text: str, contexts: tuple[str, ...] | None = None) -> str | None:
    """Why ``text`` is not a well-formed OTTL condition (as the filter processor takes them); None when it is."""
    try:
        parser = _Parser(text, contexts)
        parser.condition()
        parser.done()
    except OttlShapeError as exc:
        return str(exc)
    return None
