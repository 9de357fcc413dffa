"""``ragheat keys ...``: make API keys and the hashed lines of ``server.api_keys_file`` that accept them.

The service stores no key, only its SHA-256 digest (``rag.api.access``): a key is printed once, when it is made.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

import typer

from ragheat.clikit import console, fail as _fail, guard, out

app = typer.Typer(help="API keys for `ragheat serve` (server.api_keys_file).", no_args_is_help=True)
_guard = guard(interrupted="interrupted; no key was written")


@app.command("new")
@_guard
def new(
    name: str = typer.Argument("", help="a name for the key (one word), shown instead of the key's digest"),
    file: Optional[Path] = typer.Option(None, "--file", help="append the hashed line to this keys file (made "
                                                             "with mode 600 if missing)"),
    priority: str = typer.Option("normal", "--priority", help="its requests' priority under load: high, normal, "
                                                              "low (X-Request-Priority may only lower it)"),
) -> None:
    """Make a key: print it (once; store it with the client) and the line that accepts it."""
    from rag.api.access import key_line, new_key

    key = new_key()
    try:
        line = key_line(key, name, priority)
    except ValueError as exc:
        _fail(str(exc))
    if file is not None:
        fd = os.open(file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
        console.print(f"appended to {file}; a running service reads it on POST /admin/reload or its next start")
    else:
        console.print("add this line to server.api_keys_file:")
        console.print(line, highlight=False)
    out.print(key, highlight=False, soft_wrap=True)


@app.command("hash")
@_guard
def hash_(name: str = typer.Argument("", help="a name for the key (one word)")) -> None:
    """Read a key on standard input and print the keys-file line that accepts it."""
    from rag.api.access import MIN_API_KEY_CHARS, key_line

    key = sys.stdin.readline().strip()
    if len(key) < MIN_API_KEY_CHARS:
        _fail(f"a key has at least {MIN_API_KEY_CHARS} characters; `ragheat keys new` makes one")
    try:
        out.print(key_line(key, name), highlight=False, soft_wrap=True)
    except ValueError as exc:
        _fail(str(exc))
