"""What a sweep sends and what counts as an answer, for any JSON HTTP API, ragheat's ``/v1/query`` included.

``HttpTarget`` holds the request (method, path, headers, a JSON body template with the query text placed at a field
path) and the success check (a 2xx status and, optionally, a non-empty value at a field path of the response). The
default is ragheat's own request: ``POST /v1/query`` with ``{"query": ..., "top_k": 5}``. ``HttpTarget.from_flags``
reads ``ragheat bench``'s flags and raises ``TargetError``, whose message names the flag, before any load is sent.

>>> target = HttpTarget.from_flags(path="/ask", body='{"question": "", "options": {"k": 5}}',
...                                query_field="question", expect_field="answer", headers=["Authorization: Bearer x"])
>>> target.body_for("Why is the sky blue?")
b'{"question": "Why is the sky blue?", "options": {"k": 5}}'

Field paths are dotted keys, with list indices as numbers: ``input.text``, ``messages.0.content``.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from multidict import CIMultiDict

METHODS = ("POST", "PUT", "PATCH")  # the query travels in the JSON body, so the method must carry one
RAGHEAT_PATH = "/v1/query"
RAGHEAT_QUERY_FIELD = "query"
RAGHEAT_TOP_K = 5
_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")  # an HTTP header name (RFC 9110 token)
NOT_JSON = object()  # what ``failure`` is given for a response body that does not parse


class TargetError(ValueError):
    """A flag that does not describe a request the sweep can send; the message names the flag."""


def ragheat_body(top_k: int = RAGHEAT_TOP_K) -> dict:
    """ragheat's ``/v1/query`` body, the query field first (the bytes match what ragheat's own clients send)."""
    return {RAGHEAT_QUERY_FIELD: "", "top_k": top_k}


def parse_field_path(text: str, flag: str) -> tuple[str, ...]:
    """``a.b.0.c`` -> ("a", "b", "0", "c"); a segment is a dict key or, inside a list, an index."""
    parts = tuple(text.split("."))
    if not text or any(not p for p in parts):
        raise TargetError(f"{flag} {text!r}: give a dotted field path, e.g. question, input.text or "
                          "messages.0.content")
    return parts


def _child(node: Any, key: str) -> tuple[bool, Any]:
    """(found, value) one segment down from ``node``."""
    if isinstance(node, dict):
        return (True, node[key]) if key in node else (False, None)
    if isinstance(node, list) and key.isdigit() and int(key) < len(node):
        return True, node[int(key)]
    return False, None


def lookup(document: Any, path: Sequence[str]) -> tuple[bool, Any]:
    """(found, value) at ``path`` in a parsed JSON document."""
    node = document
    for key in path:
        found, node = _child(node, key)
        if not found:
            return False, None
    return True, node


def _place(document: Any, path: Sequence[str], value: Any) -> None:
    """Set ``value`` at ``path``, which ``lookup`` has already found in ``document``."""
    _, parent = lookup(document, path[:-1])
    parent[int(path[-1]) if isinstance(parent, list) else path[-1]] = value


def dotted(path: Sequence[str]) -> str:
    return ".".join(path)


@dataclass(frozen=True)
class HttpTarget:
    """One request of a sweep and its success check; the default is ragheat's ``POST /v1/query``.

    ``body`` is the template: each query is a copy of it with the query text at ``query_field``. A response is an
    answer when its status is 2xx and, with ``expect_field``, its JSON holds a non-empty value there (not null,
    ``""``, ``[]`` or ``{}``). ``headers`` go with every request; ``Content-Type: application/json`` unless one of
    them sets it."""

    path: str = RAGHEAT_PATH
    method: str = "POST"
    body: Any = field(default_factory=ragheat_body)
    query_field: tuple[str, ...] = (RAGHEAT_QUERY_FIELD,)
    expect_field: tuple[str, ...] | None = None
    headers: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not lookup(self.body, self.query_field)[0] or not self.query_field:
            raise TargetError(f"--query-field {dotted(self.query_field)!r}: the --body template has no such field "
                              f"(its fields: {_fields(self.body)})")

    @classmethod
    def from_flags(cls, *, path: str = RAGHEAT_PATH, method: str = "POST", body: str | None = None,
                   query_field: str = RAGHEAT_QUERY_FIELD, expect_field: str | None = None,
                   headers: Sequence[str] = ()) -> "HttpTarget":
        """The target ``ragheat bench``'s flags describe; ``TargetError`` naming the flag when one is wrong.
        ``body``: JSON text, or ``@FILE`` holding it; None: ragheat's own body."""
        if not path.startswith("/"):
            raise TargetError(f"--path {path!r}: give the path on the --url server, starting with /, e.g. /v1/query")
        verb = method.upper()
        if verb not in METHODS:
            raise TargetError(f"--method {method!r}: the query travels in a JSON body, so give "
                              f"{', '.join(METHODS[:-1])} or {METHODS[-1]}")
        return cls(path=path, method=verb, body=ragheat_body() if body is None else parse_body(body),
                   query_field=parse_field_path(query_field, "--query-field"),
                   expect_field=parse_field_path(expect_field, "--expect-field") if expect_field else None,
                   headers=tuple(parse_header(h) for h in headers))

    def url(self, base: str) -> str:
        return base.rstrip("/") + self.path

    def body_for(self, query: str) -> bytes:
        document = copy.deepcopy(self.body)
        _place(document, self.query_field, query)
        return json.dumps(document).encode()

    def request_headers(self) -> CIMultiDict:
        out = CIMultiDict(self.headers)
        out.setdefault("Content-Type", "application/json")
        return out

    def failure(self, status: int, document: Any = NOT_JSON) -> str | None:
        """Why a response is not an answer (a short reason from a closed set, to count by), or None when it is one.
        ``document``: the parsed response body (``NOT_JSON`` when it did not parse; only read with
        ``expect_field``)."""
        if not 200 <= status < 300:
            return f"HTTP {status}"
        if self.expect_field is None:
            return None
        if document is NOT_JSON:
            return "response not JSON"
        found, value = lookup(document, self.expect_field)
        if not found:
            return f"no {dotted(self.expect_field)} in the response"
        if value is None or (isinstance(value, (str, list, dict)) and not value):
            return f"{dotted(self.expect_field)} empty"
        return None

    def describe(self) -> dict:
        """For results.json: the request without header values (they may hold credentials)."""
        return {"path": self.path, "method": self.method, "body": self.body, "query_field": dotted(self.query_field),
                "expect_field": dotted(self.expect_field) if self.expect_field else None,
                "headers": [name for name, _ in self.headers]}


def parse_body(text: str) -> Any:
    """``--body``: JSON text, or ``@FILE`` holding it; an object or a list (the query goes inside it)."""
    where = "--body"
    if text.startswith("@"):
        where = f"--body {text}"
        try:
            text = Path(text[1:]).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise TargetError(f"{where}: cannot read the file ({getattr(exc, 'strerror', None) or exc})") from None
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise TargetError(f"{where} is not JSON: {exc}") from None
    if not isinstance(document, (dict, list)):
        raise TargetError(f"{where}: give a JSON object (or list) for the query to go in, not "
                          f"{type(document).__name__}")
    return document


def parse_header(text: str) -> tuple[str, str]:
    """``--header 'Name: value'`` -> (name, value)."""
    name, colon, value = text.partition(":")
    name, value = name.strip(), value.strip()
    if not colon or not _TOKEN.match(name) or any(c in value for c in "\r\n\0"):
        raise TargetError(f"--header {text!r}: give 'Name: value', e.g. 'Authorization: Bearer TOKEN'")
    return name, value


def _fields(document: Any, limit: int = 8) -> str:
    """The template's leaf field paths, for an error message."""
    paths: list[str] = []

    def walk(node: Any, at: str) -> None:
        children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        empty = True
        for key, child in children:
            empty = False
            walk(child, f"{at}.{key}" if at else str(key))
        if empty and at:
            paths.append(at)

    walk(document, "")
    shown = ", ".join(paths[:limit]) + (", ..." if len(paths) > limit else "")
    return shown or "no fields"
