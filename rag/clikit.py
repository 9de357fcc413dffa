"""What every ``ragheat`` sub-command shares: the consoles, one-sentence failures, and the error guard.

A module of its own so that the sub-command packages (``dashboards``, ``probes``, ``stack``) and
``rag.cli``, which registers them, can all use it without importing each other.
"""

from __future__ import annotations

import functools

import typer
from rich.console import Console

console = Console(stderr=True, soft_wrap=True)  # messages and progress; an error stays one line
out = Console()  # results


def fail(message: str, code: int = 2):
    """Print one red sentence and exit with ``code`` (2: the user's input or environment; 1: a check failed)."""
    console.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


def guard(interrupted: str = "interrupted; nothing was changed"):
    """Turn ragheat's own errors into one red sentence and exit code 2, not a traceback; Ctrl-C exits 130
    with ``interrupted``, which says what state the command left behind."""

    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            from rag.errors import RagheatError

            try:
                return fn(*args, **kwargs)
            except RagheatError as exc:
                fail(str(exc))
            except KeyboardInterrupt:
                fail(interrupted, code=130)
        return wrapper

    return decorate
