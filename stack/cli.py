"""``ragheat stack ...``: the compose topology without Docker."""

from __future__ import annotations

import typer

app = typer.Typer(help="Start or stop the whole stack locally (the compose topology without Docker).",
                  no_args_is_help=True)
